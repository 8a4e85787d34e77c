"""`DynamicSampler` (dynamic sampling): rounds are collected until a step holds exactly the wanted
number of groups with a reward signal, the extra rounds are counted, and the bound on them is
respected (with a warning) when no prompt has a signal."""

from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict

from llmrl.collectors import DynamicSampler
from llmrl.objectives import MCAdvantage

G = 2  # responses per prompt
PROMPTS = 4  # prompts per round


class FixedRewardRounds:
    """Each call draws the next ``PROMPTS`` prompts (ids 0, 1, 2...) x ``G`` responses; prompt
    ``p`` has rewards ``[0, 1]`` when ``informative(p)``, else ``[1, 1]`` (no signal)."""

    def __init__(self, informative) -> None:
        self.informative, self.calls, self.next_prompt = informative, [], 0

    def __call__(self, round_index: int) -> TensorDict:
        self.calls.append(round_index)
        prompts = list(range(self.next_prompt, self.next_prompt + PROMPTS))
        self.next_prompt += PROMPTS
        rewards = [[0.0, 1.0] if self.informative(p) else [1.0, 1.0] for p in prompts]
        return TensorDict(
            {
                "group_id": torch.tensor(prompts).repeat_interleave(G),
                "reward": torch.tensor(rewards).reshape(-1),
            },
            batch_size=[PROMPTS * G],
        )


def _sampler(drop: bool = True, rounds: int = 5, groups: int = PROMPTS) -> DynamicSampler:
    return DynamicSampler(MCAdvantage(G, drop_zero_std=drop), groups, rounds)


def test_rounds_are_collected_until_the_step_holds_the_wanted_informative_groups():
    # prompts 0, 3, 6, 9 have a signal: round 0 (0-3) finds 2, round 1 (4-7) 1, round 2 (8-11) 1
    collect = FixedRewardRounds(lambda p: p % 3 == 0)
    step = _sampler().sample(collect)
    assert collect.calls == [0, 1, 2]
    assert step.trained["group_id"].tolist() == [0, 0, 3, 3, 6, 6, 9, 9]
    # +-0.5 / (std 0.5 + eps 1e-6) = +-(1 - 2e-6): abs=1e-5 covers eps, not a wrong group
    assert step.trained["advantage"].tolist() == pytest.approx([-1.0, 1.0] * 4, abs=1e-5)
    assert step.batch.batch_size[0] == 3 * PROMPTS * G  # every row sampled, all rounds
    assert not step.underfilled
    assert step.metrics == {
        "sampling_rounds": 3.0,
        "resampled_groups": 8.0,  # the 2 extra rounds' groups
        "zero_std_groups": 8.0,
        "informative_group_fraction": 4 / 12,
        "trained_groups": 4.0,
        "surplus_groups": 0.0,
    }


def test_informative_groups_beyond_the_wanted_number_are_surplus():
    # even prompts have a signal: round 0 finds 0, 2; round 1 finds 4, 6 -> 4 found, 3 wanted
    step = _sampler(groups=3).sample(FixedRewardRounds(lambda p: p % 2 == 0))
    assert step.trained["group_id"].tolist() == [0, 0, 2, 2, 4, 4]
    assert step.metrics["sampling_rounds"] == 2.0
    assert step.metrics["trained_groups"] == 3.0 and step.metrics["surplus_groups"] == 1.0
    assert step.metrics["informative_group_fraction"] == 0.5


def test_the_bound_ends_a_step_without_signal_with_a_warning(caplog):
    collect = FixedRewardRounds(lambda p: False)
    with caplog.at_level(logging.WARNING, logger="llmrl.collectors.dynamic_sampling"):
        step = _sampler(rounds=2).sample(collect)
    assert collect.calls == [0, 1, 2]  # the first round and max_resample_rounds=2 more
    assert step.trained is None and step.underfilled
    assert step.metrics["sampling_rounds"] == 3.0
    assert step.metrics["zero_std_groups"] == 12.0
    assert step.metrics["informative_group_fraction"] == 0.0
    assert step.metrics["trained_groups"] == 0.0
    assert "0 of the 4 wanted groups had a reward signal after 3 round(s)" in caplog.text
    assert "advantage.max_resample_rounds=2" in caplog.text
    assert "nothing to train on this step" in caplog.text


def test_the_bound_trains_on_the_groups_found_so_far():
    step = _sampler(rounds=1).sample(FixedRewardRounds(lambda p: p == 5))
    assert step.trained["group_id"].tolist() == [5, 5]
    assert step.underfilled and step.metrics["trained_groups"] == 1.0


def test_zero_resample_rounds_only_drops_and_warns_only_when_nothing_is_left(caplog):
    collect = FixedRewardRounds(lambda p: p % 2 == 0)
    with caplog.at_level(logging.WARNING, logger="llmrl.collectors.dynamic_sampling"):
        step = _sampler(rounds=0).sample(collect)
    assert collect.calls == [0]
    assert step.trained["group_id"].tolist() == [0, 0, 2, 2]
    assert step.underfilled and step.metrics["trained_groups"] == 2.0
    assert caplog.text == ""  # drop only was asked for: a short step is expected
    with caplog.at_level(logging.WARNING, logger="llmrl.collectors.dynamic_sampling"):
        step = _sampler(rounds=0).sample(FixedRewardRounds(lambda p: False))
    assert step.trained is None
    assert "nothing to train on this step" in caplog.text


def test_without_drop_zero_std_a_step_is_one_round_of_every_group():
    collect = FixedRewardRounds(lambda p: p % 2 == 0)
    step = _sampler(drop=False).sample(collect)
    assert collect.calls == [0]
    assert step.trained["group_id"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert step.trained["advantage"][2:4].tolist() == [0.0, 0.0]
    assert step.metrics["informative_group_fraction"] == 0.5
    assert step.metrics["zero_std_groups"] == 2.0 and step.metrics["trained_groups"] == 4.0


def test_data_running_out_ends_the_step_and_only_the_first_round_must_succeed():
    collect = FixedRewardRounds(lambda p: p == 1)

    def two_rounds(round_index: int) -> TensorDict:
        if round_index >= 2:
            raise StopIteration
        return collect(round_index)

    step = _sampler().sample(two_rounds)
    assert step.metrics["sampling_rounds"] == 2.0 and step.underfilled

    def none(round_index: int) -> TensorDict:
        raise StopIteration

    with pytest.raises(StopIteration):
        _sampler().sample(none)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="groups must be >= 1"):
        _sampler(groups=0)
    with pytest.raises(ValueError, match="max_resample_rounds must be >= 0"):
        _sampler(rounds=-1)


def test_multi_turn_groups_are_counted_and_kept_whole():
    """Groups of 2 two-turn episodes (4 rows each): the surplus cut keeps whole groups."""
    next_prompt = 0

    def collect(round_index: int) -> TensorDict:
        nonlocal next_prompt
        prompts = list(range(next_prompt, next_prompt + PROMPTS))
        next_prompt += PROMPTS
        group, traj, done, reward = [], [], [], []
        for p in prompts:
            for sample in range(G):
                for turn in range(2):
                    group.append(p)
                    traj.append(10 * p + sample)
                    done.append(turn == 1)
                    reward.append(float(sample) if p % 2 == 0 and turn == 1 else 0.0)
        return TensorDict(
            {
                "group_id": torch.tensor(group),
                "traj_id": torch.tensor(traj),
                "done": torch.tensor(done),
                "reward": torch.tensor(reward),
            },
            batch_size=[len(group)],
        )

    step = _sampler(groups=3).sample(collect)
    assert step.metrics["sampling_rounds"] == 2.0 and step.metrics["surplus_groups"] == 1.0
    assert step.trained["group_id"].tolist() == [0] * 4 + [2] * 4 + [4] * 4
    assert step.metrics["zero_std_groups"] == 4.0
