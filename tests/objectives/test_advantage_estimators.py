"""RLOO and REINFORCE++ advantages against the formulas evaluated by hand (plain Python floats),
ties, single-sample groups, multi-turn trajectories, REINFORCE++'s KL in the reward, and
dynamic sampling (``drop_zero_std``) with every estimator.

Tolerance: the estimators do a sum, a mean, a std and a division on float32 rewards of
magnitude <= 4 (eps = 1.19e-7): a handful of roundings of values <= 4, so ``TOL = 32 * eps``
(3.8e-6) bounds the error; ties are checked for exact zeros.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from llmrl.collectors import DynamicSampler
from llmrl.data import LogProbs
from llmrl.objectives import MCAdvantage, ReinforcePlusPlusAdvantage, RLOOAdvantage
from tests.objectives.rows import batch, turns

TOL = 32 * torch.finfo(torch.float32).eps


def _population(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


# ----------------------------------------------------------------- RLOO
def test_rloo_leave_one_out_baseline():
    # group [1, 2, 4]: baselines (2 + 4) / 2 = 3, (1 + 4) / 2 = 2.5, (1 + 2) / 2 = 1.5
    # -> [-2, -0.5, 2.5] (= G / (G - 1) * (r - 7/3)); group [0, 1]: [-1, 1]
    out = RLOOAdvantage(num_samples=3)(batch([0, 0, 0], [1.0, 2.0, 4.0]))
    assert out["advantage"].tolist() == pytest.approx([-2.0, -0.5, 2.5], abs=TOL)
    rewards = [1.0, 2.0, 4.0]
    scaled = [3 / 2 * (r - sum(rewards) / 3) for r in rewards]
    assert out["advantage"].tolist() == pytest.approx(scaled, abs=TOL)
    out = RLOOAdvantage(num_samples=2)(batch([5, 7, 5, 7], [0.0, 3.0, 1.0, 3.0]))
    assert out["group_id"].tolist() == [5, 5, 7, 7]
    assert out["advantage"].tolist() == [-1.0, 1.0, 0.0, 0.0]


def test_rloo_ties_are_exactly_zero_or_dropped():
    out = RLOOAdvantage(num_samples=3)(batch([0, 0, 0], [0.1, 0.1, 0.1]))
    assert out["advantage"].tolist() == [0.0, 0.0, 0.0]  # exactly: no rounding noise
    estimator = RLOOAdvantage(num_samples=3, drop_zero_std=True)
    assert estimator(batch([0, 0, 0], [0.1, 0.1, 0.1])) is None
    assert estimator.stats["dropped_zero_std_groups"] == 1


def test_rloo_refuses_a_single_sample_group():
    with pytest.raises(ValueError) as error:
        RLOOAdvantage(num_samples=1)
    message = str(error.value)
    assert "num_samples=1" in message and "set num_samples >= 2" in message
    assert "reinforce_pp" in message


def test_rloo_groups_split_across_calls_and_multi_turn_trajectories():
    estimator = RLOOAdvantage(num_samples=2)
    assert estimator(batch([0], [3.0])) is None and estimator.pending_groups == 1
    out = estimator(batch([0], [1.0], first_row=1))
    assert out["advantage"].tolist() == [2.0, -2.0] and estimator.pending_groups == 0
    # two 2-turn trajectories: final rewards 1 (traj 10) and 4 (traj 11) -> -3 and 3, on
    # every turn (the first turns' rewards are ignored)
    rows = [(0, 10, False, 9.0), (0, 11, False, 9.0), (0, 10, True, 1.0), (0, 11, True, 4.0)]
    out = RLOOAdvantage(num_samples=2)(turns(rows))
    assert out["advantage"].tolist() == [-3.0, 3.0, -3.0, 3.0]


# ----------------------------------------------------------------- REINFORCE++
def test_reinforce_pp_normalises_over_the_whole_batch():
    # groups [1, 0] and [1, 1]: batch mean 0.75, population std sqrt(0.1875); the tied group
    # still gets non-zero advantages (its baseline is the batch, not the group)
    rewards = [1.0, 0.0, 1.0, 1.0]
    out = ReinforcePlusPlusAdvantage(num_samples=2, eps=0.0)(batch([0, 0, 1, 1], rewards))
    mean, std = _population(rewards)
    assert out["advantage"].tolist() == pytest.approx([(r - mean) / std for r in rewards], abs=TOL)
    assert out["advantage"][2].item() == pytest.approx(0.25 / math.sqrt(0.1875), abs=TOL)
    eps = ReinforcePlusPlusAdvantage(num_samples=2, eps=0.1)(batch([0, 0, 1, 1], rewards))
    expected = [(r - mean) / (std + 0.1) for r in rewards]
    assert eps["advantage"].tolist() == pytest.approx(expected, abs=TOL)


def test_reinforce_pp_takes_one_sample_per_prompt():
    rewards = [0.0, 1.0, 2.0, 3.0]
    out = ReinforcePlusPlusAdvantage(num_samples=1, eps=0.0)(batch([0, 1, 2, 3], rewards))
    mean, std = _population(rewards)  # 1.5, sqrt(1.25)
    assert out["advantage"].tolist() == pytest.approx([(r - mean) / std for r in rewards], abs=TOL)


def test_reinforce_pp_ties_over_the_batch_are_exactly_zero():
    out = ReinforcePlusPlusAdvantage(num_samples=2)(batch([0, 0, 1, 1], [0.3] * 4))
    assert out["advantage"].tolist() == [0.0] * 4
    estimator = ReinforcePlusPlusAdvantage(num_samples=2, eps=0.0, drop_zero_std=True)
    out = estimator(batch([0, 0, 1, 1], [0.3, 0.3, 0.0, 1.0]))
    assert out["group_id"].tolist() == [1, 1] and out["advantage"].tolist() == [-1.0, 1.0]
    assert estimator.stats["dropped_zero_std_groups"] == 1


# rows: (sampling log-probs, reference log-probs) of the response tokens
KL_ROWS = [
    ([-1.0, -2.0], [-1.5, -1.0]),  # KL = 0.5 - 1.0 = -0.5
    ([-0.5], [-1.0]),  # KL = 0.5
    ([-0.2, -0.3, -0.1], [-0.2, -0.5, -0.2]),  # KL = 0 + 0.2 + 0.1 = 0.3
]


def _kl_batch(rewards: list[float], with_reference: bool = True, rows=KL_ROWS) -> TensorDict:
    td = batch([0] * len(rewards), rewards)
    td["log_probs"] = LogProbs.from_sequences(response=[torch.tensor(lp) for lp, _ in rows])
    if with_reference:
        td["ref_log_probs"] = LogProbs.from_sequences(
            response=[torch.tensor(ref) for _, ref in rows]
        )
    return td


def _kl_by_hand(rewards: list[float], beta: float) -> list[float]:
    kl = [sum(o - r for o, r in zip(old, ref, strict=True)) for old, ref in KL_ROWS]
    returns = [r - beta * k for r, k in zip(rewards, kl, strict=True)]
    mean, std = _population(returns)
    return [(r - mean) / std for r in returns]


def test_reinforce_pp_kl_in_the_reward():
    # R = r - 0.5 * KL = [1.25, -0.25, -0.15]: mean 0.28333, std 0.68475
    # -> A = [1.41170, -0.77887, -0.63283] (without the KL: [1.41421, -0.70711, -0.70711])
    rewards = [1.0, 0.0, 0.0]
    estimator = ReinforcePlusPlusAdvantage(num_samples=3, kl_coeff=0.5, eps=0.0)
    out = estimator(_kl_batch(rewards))
    expected = _kl_by_hand(rewards, 0.5)
    # the literals are rounded to 7 decimals (<= 5e-8 off)
    assert expected == pytest.approx([1.4116979, -0.7788678, -0.6328301], abs=1e-6)
    assert out["advantage"].tolist() == pytest.approx(expected, abs=TOL)


def test_reinforce_pp_kl_ties_are_exactly_zero():
    # dyadic log-probs (exact in float32): KL = [-0.5, 0.5, 0.5] and rewards 1 + KL, so
    # R = r - KL = 1 for every row: advantages exactly 0, not 0 / eps rounding noise
    rows = [([-1.0, -2.0], [-1.5, -1.0]), ([-0.5], [-1.0]), ([-0.25, -0.5], [-0.5, -0.75])]
    td = _kl_batch([0.5, 1.5, 1.5], rows=rows)
    out = ReinforcePlusPlusAdvantage(num_samples=3, kl_coeff=1.0)(td)
    assert out["advantage"].tolist() == [0.0, 0.0, 0.0]


def test_reinforce_pp_kl_sums_every_turn_of_a_trajectory():
    # trajectory 10: rows 0 and 2 (KL -0.5 and 0.3: -0.2), trajectory 11: row 1 (KL 0.5);
    # final rewards 1 and 0; R = [1 + 0.2, 0 - 0.5] = [1.2, -0.5] -> A = [1, -1]
    td = turns([(0, 10, False, 7.0), (0, 11, True, 0.0), (0, 10, True, 1.0)])
    td["log_probs"] = LogProbs.from_sequences(response=[torch.tensor(lp) for lp, _ in KL_ROWS])
    td["ref_log_probs"] = LogProbs.from_sequences(
        response=[torch.tensor(ref) for _, ref in KL_ROWS]
    )
    out = ReinforcePlusPlusAdvantage(num_samples=2, kl_coeff=1.0, eps=0.0)(td)
    assert out["advantage"].tolist() == pytest.approx([1.0, -1.0, 1.0], abs=TOL)
    # with 0.1 instead: R = [1.02, -0.05], two values: still +-1; the rows follow their trajectory
    out = ReinforcePlusPlusAdvantage(num_samples=2, kl_coeff=0.1, eps=0.0)(td.clone())
    assert out["advantage"].tolist() == pytest.approx([1.0, -1.0, 1.0], abs=TOL)


def test_reinforce_pp_kl_without_reference_names_the_field():
    estimator = ReinforcePlusPlusAdvantage(num_samples=3, kl_coeff=0.1)
    with pytest.raises(ValueError) as error:
        estimator(_kl_batch([1.0, 0.0, 0.0], with_reference=False))
    message = str(error.value)
    assert "advantage.kl_in_reward_coeff" in message and "'ref_log_probs'" in message
    assert estimator.pending_groups == 0  # refused before buffering: nothing half-kept
    # off: no reference needed
    out = ReinforcePlusPlusAdvantage(num_samples=3)(_kl_batch([1.0, 0.0, 0.0], False))
    assert out is not None


def test_reinforce_pp_scores_with_its_reference_once_per_call():
    calls = []

    def reference(td):
        calls.append(td.batch_size[0])
        td = td.clone(False)
        td["ref_log_probs"] = LogProbs.from_sequences(
            response=[torch.tensor(ref) for _, ref in KL_ROWS]
        )
        return td

    rewards = [1.0, 0.0, 0.0]
    estimator = ReinforcePlusPlusAdvantage(
        num_samples=3, kl_coeff=0.5, eps=0.0, reference=reference
    )
    out = estimator(_kl_batch(rewards, with_reference=False))
    assert calls == [3]
    assert out["advantage"].tolist() == pytest.approx(_kl_by_hand(rewards, 0.5), abs=TOL)


def test_estimator_options_are_checked():
    with pytest.raises(ValueError, match="kl_coeff must be >= 0"):
        ReinforcePlusPlusAdvantage(num_samples=2, kl_coeff=-1.0)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        ReinforcePlusPlusAdvantage(num_samples=2, eps=-1.0)
    assert repr(RLOOAdvantage(num_samples=2)) == (
        "RLOOAdvantage(num_samples=2, drop_zero_std=False, pending_groups=0)"
    )
    assert repr(ReinforcePlusPlusAdvantage(num_samples=2, kl_coeff=0.1)).startswith(
        "ReinforcePlusPlusAdvantage(num_samples=2, kl_coeff=0.1, drop_zero_std=False"
    )


# ----------------------------------------------------------------- dynamic sampling
ESTIMATORS = [MCAdvantage, RLOOAdvantage, ReinforcePlusPlusAdvantage]


def _rounds(informative: list[bool]):
    """``collect(round)``: 2 prompts x 2 responses per round; rewards [0, 1] or [1, 1]."""
    state = {"prompt": 0}

    def collect(round_index: int) -> TensorDict:
        ids, rewards = [], []
        for _ in range(2):
            prompt = state["prompt"]
            state["prompt"] += 1
            ids += [prompt, prompt]
            rewards += [0.0, 1.0] if informative[prompt % len(informative)] else [1.0, 1.0]
        return batch(ids, rewards, first_row=4 * round_index)

    return collect


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_dynamic_sampling_works_with_every_estimator(estimator):
    # prompts 0..3: only 0 and 3 have a signal: round 0 finds 1, round 1 finds 1 more
    sampler = DynamicSampler(estimator(2, drop_zero_std=True), groups=2, max_resample_rounds=3)
    step = sampler.sample(_rounds([True, False, False, True]))
    assert step.trained["group_id"].tolist() == [0, 0, 3, 3]
    assert step.metrics["sampling_rounds"] == 2.0 and step.metrics["trained_groups"] == 2.0
    assert step.metrics["zero_std_groups"] == 2.0 and not step.underfilled
    assert sampler.advantage.stats["dropped_zero_std_groups"] == 2
    assert sampler.advantage.pending_groups == 0
    advantage = step.trained["advantage"].tolist()
    assert advantage[0] < 0 < advantage[1] and advantage[2] < 0 < advantage[3]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_nothing_to_train_on_when_every_group_is_dropped(estimator):
    sampler = DynamicSampler(estimator(2, drop_zero_std=True), groups=2, max_resample_rounds=1)
    step = sampler.sample(_rounds([False]))
    assert step.trained is None and step.underfilled
    assert step.metrics["sampling_rounds"] == 2.0
