"""GSPO, CISPO and Dr. GRPO: loss values and gradients w.r.t. the current log-probs, checked
against the papers' formulas evaluated by hand (plain Python floats, not the library's code),
then the loss classes on a tiny model's rollout.

The hand-made batch (N=3, L=4, ragged masks); per valid token the log-ratio
``d = log pi - log pi_old`` and the current log-prob ``log pi``::

    row 0: mask [T, T, T, F]  d = [0.3, -0.1, 0.1]   log pi = [-1.0, -2.0, -0.5]   A = +1
    row 1: mask [F, F, T, T]  d = [-0.5, 0.1]        log pi = [-1.5, -0.3]         A = -2
    row 2: mask [T, F, F, F]  d = [0.05]             log pi = [-0.7]               A = +0.5

Padded positions hold 1e4 (exp overflows to inf): any leak makes a result inf or nan.

Tolerance: float32 has eps = 1.19e-7. The inputs are built as ``old = log pi - d`` and the loss
recomputes ``d = log pi - old`` (one rounding of a value <= 2.1 in magnitude), then takes an
exp, a clip, a product or two and a sum of <= 6 terms of magnitude <= 2.6: about 10 roundings
of values <= 3, so |error| <= 10 * 3 * eps = 3.6e-6; ``TOL = 32 * eps`` (3.8e-6) bounds it.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.data import LogProbs
from llmrl.objectives import (
    CISPOLoss,
    GRPOLoss,
    GSPOLoss,
    MCAdvantage,
    cispo_term,
    clipped_token_term,
    grpo_objective,
    gspo_term,
)
from llmrl.objectives.token_level import scatter_rows
from tests.objectives.rows import batch as reward_batch

EPS32 = torch.finfo(torch.float32).eps
TOL = 32 * EPS32
PAD = 1e4
L = 4
ROWS = [  # (valid positions, d, log pi, A)
    ([0, 1, 2], [0.3, -0.1, 0.1], [-1.0, -2.0, -0.5], 1.0),
    ([2, 3], [-0.5, 0.1], [-1.5, -0.3], -2.0),
    ([0], [0.05], [-0.7], 0.5),
]
MAX_LEN = 8.0  # Dr. GRPO's constant (the generation budget)


def _tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_probs with grad, old_log_probs, advantage [N], mask)."""
    mask = torch.zeros(len(ROWS), L, dtype=torch.bool)
    log_probs = torch.full((len(ROWS), L), PAD)
    old = torch.full((len(ROWS), L), 7.0)
    for i, (positions, d, lp, _) in enumerate(ROWS):
        for j, position in enumerate(positions):
            mask[i, position] = True
            log_probs[i, position] = lp[j]
            old[i, position] = lp[j] - d[j]
    advantage = torch.tensor([a for *_, a in ROWS])
    return log_probs.requires_grad_(), old, advantage, mask


def _clip(value: float, low: float, high: float) -> float:
    return min(max(value, 1 - low), 1 + high)


# --- the papers' formulas, per token: (loss_t, d loss_t / d log pi_t) -----------------------
def _grpo_tokens(d: list[float], lp: list[float], a: float, low: float, high: float):
    """PPO/GRPO: -min(r A, clip(r) A); no gradient where the clipped branch is taken."""
    out = []
    for dt in d:
        r = math.exp(dt)
        clipped = (a > 0 and r > 1 + high) or (a < 0 and r < 1 - low)
        out.append((-min(r * a, _clip(r, low, high) * a), 0.0 if clipped else -a * r))
    return out


def _gspo_tokens(d: list[float], lp: list[float], a: float, low: float, high: float):
    """GSPO: s = exp(mean d) per sequence; every token: -min(s A, clip(s) A), gradient -A s
    unless the sequence is clipped (GSPO-token: d s_t / d log pi_t = s)."""
    s = math.exp(sum(d) / len(d))
    clipped = (a > 0 and s > 1 + high) or (a < 0 and s < 1 - low)
    return [(-min(s * a, _clip(s, low, high) * a), 0.0 if clipped else -a * s) for _ in d]


def _cispo_tokens(d: list[float], lp: list[float], a: float, low: float, high: float):
    """CISPO: -sg(clip(r)) A log pi; gradient -clip(r) A, never cut."""
    out = []
    for dt, lpt in zip(d, lp, strict=True):
        weight = _clip(math.exp(dt), low, high)
        out.append((-weight * a * lpt, -weight * a))
    return out


def _by_hand(tokens, aggregation: str, clip: tuple[float, float], advantages=None):
    """(loss, [N, L] gradient) of the per-token formula under ``aggregation``."""
    per_row = [
        tokens(d, lp, a if advantages is None else advantages[i], *clip)
        for i, (_, d, lp, a) in enumerate(ROWS)
    ]
    total_tokens = sum(len(row) for row in per_row)
    grad = torch.zeros(len(ROWS), L)
    loss = 0.0
    for i, ((positions, *_), row) in enumerate(zip(ROWS, per_row, strict=True)):
        if aggregation == "token_mean":
            weight = 1 / total_tokens
        elif aggregation == "prompt_mean":
            weight = 1 / (len(row) * len(ROWS))
        else:  # sum_norm (Dr. GRPO): each sequence's sum / MAX_LEN, mean over sequences
            weight = 1 / (MAX_LEN * len(ROWS))
        for position, (value, gradient) in zip(positions, row, strict=True):
            loss += weight * value
            grad[i, position] = weight * gradient
    return loss, grad


def _check(term, tokens, aggregation: str, clip: tuple[float, float]):
    log_probs, old, advantage, mask = _tensors()
    norm = MAX_LEN if aggregation == "sum_norm" else None
    out = grpo_objective(
        log_probs,
        old,
        advantage,
        mask,
        clip_epsilon=clip,
        aggregation=aggregation,
        max_length_norm=norm,
        policy_gradient=term,
    )
    out.loss_objective.backward()
    loss, grad = _by_hand(tokens, aggregation, clip)
    assert torch.isfinite(out.loss_objective)
    assert out.loss_objective.item() == pytest.approx(loss, abs=TOL)
    assert torch.isfinite(log_probs.grad).all()
    assert torch.allclose(log_probs.grad, grad, atol=TOL, rtol=0)
    assert (log_probs.grad[~mask] == 0).all()
    return out, log_probs.grad


# ----------------------------------------------------------------- GSPO
AGGREGATIONS = ["token_mean", "prompt_mean", "sum_norm"]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_with_a_clipped_sequence(aggregation):
    # s = exp(mean d): row 0 exp(0.1) = 1.10517 > 1.1 with A > 0: clipped (loss -1.1, no
    # gradient); row 1 exp(-0.2) = 0.81873 > 0.8: kept (loss 2 * 0.81873, gradient 2 s per
    # token); row 2 exp(0.05) = 1.05127: kept (loss -0.5 s, gradient -0.5 s)
    out, grad = _check(gspo_term, _gspo_tokens, aggregation, (0.2, 0.1))
    assert (grad[0] == 0).all() and (grad[1:][_tensors()[3][1:]] != 0).all()
    assert out.clip_fraction.item() == pytest.approx(3 / 6, abs=TOL)  # row 0's 3 tokens


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_within_the_clip_range(aggregation):
    out, _ = _check(gspo_term, _gspo_tokens, aggregation, (0.5, 0.5))
    assert out.clip_fraction.item() == 0.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_gspo_token_form_equals_the_sequence_form(aggregation):
    """GSPO's sequence form, written here with autograd through the mean log-ratio, has the
    value and the gradient of the GSPO-token form the library uses (module docstring of
    ``llmrl.objectives.gspo``), whatever the aggregation."""
    clip = (0.2, 0.1)
    log_probs, old, advantage, mask = _tensors()
    tokens = mask.sum(1)
    d = torch.where(mask, log_probs - old, torch.zeros_like(old))
    s = (d.sum(1) / tokens).exp()
    per_sequence = -torch.minimum(s * advantage, s.clamp(1 - clip[0], 1 + clip[1]) * advantage)
    if aggregation == "token_mean":  # each sequence's loss counts once per token
        expected = (per_sequence * tokens).sum() / tokens.sum()
    elif aggregation == "prompt_mean":
        expected = per_sequence.mean()
    else:
        expected = (per_sequence * tokens / MAX_LEN).mean()
    expected.backward()
    want = log_probs.grad.clone()
    out, got = _check(gspo_term, _gspo_tokens, aggregation, clip)
    assert out.loss_objective.item() == pytest.approx(expected.item(), abs=TOL)
    assert torch.allclose(got, want, atol=TOL, rtol=0)


# ----------------------------------------------------------------- CISPO
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_cispo_weights_every_token_and_cuts_no_gradient(aggregation):
    # clip [0.8, 1.28]: r = exp(0.3) = 1.34986 -> weight 1.28 and r = exp(-0.5) = 0.60653 ->
    # weight 0.8; e.g. row 0 token 0: loss -1.28 * 1 * (-1.0) = 1.28, gradient -1.28
    clip = (0.2, 0.28)
    out, grad = _check(cispo_term, _cispo_tokens, aggregation, clip)
    assert (grad[_tensors()[3]] != 0).all()  # the clipped tokens keep their gradient...
    _, ppo_grad = _check(clipped_token_term, _grpo_tokens, aggregation, clip)
    assert ppo_grad[0, 0] == 0 and ppo_grad[1, 2] == 0  # ...which PPO's clip zeroes
    assert out.clip_fraction.item() == pytest.approx(2 / 6, abs=TOL)  # weights 1.28 and 0.8


def test_cispo_upper_bound_only():
    # eps_low = 1: the weight is only bounded from above (the paper's setting)
    _, grad = _check(cispo_term, _cispo_tokens, "token_mean", (1.0, 0.28))
    assert grad[1, 2].item() == pytest.approx(2 * math.exp(-0.5) / 6, abs=TOL)


# ----------------------------------------------------------------- Dr. GRPO
def test_dr_grpo_is_sum_norm_with_unscaled_advantages():
    """Dr. GRPO (Liu et al. 2025): A = r - mean(r) (no std division) and each sequence's token
    sum divided by a constant (no length normalisation), averaged over the sequences: exactly
    ``advantage.scale: none`` + ``loss.aggregation: sum_norm`` with
    ``max_length_norm = generation.max_new_tokens``."""
    rewards = [1.0, 0.0, 0.5]
    mean = sum(rewards) / 3
    by_hand_advantages = [r - mean for r in rewards]  # [0.5, -0.5, 0.0]
    estimated = MCAdvantage(num_samples=3, scale="none")(reward_batch([0, 0, 0], rewards))
    assert estimated["advantage"].tolist() == by_hand_advantages  # exact: no division at all
    log_probs, old, _, mask = _tensors()
    out = grpo_objective(
        log_probs,
        old,
        estimated["advantage"],
        mask,
        aggregation="sum_norm",
        max_length_norm=MAX_LEN,
    )
    out.loss_objective.backward()
    loss, grad = _by_hand(_grpo_tokens, "sum_norm", (0.2, 0.2), by_hand_advantages)
    # row 0: -(1.2 * 0.5) (clipped) - 0.5 e^-0.1 - 0.5 e^0.1; row 1: 0.4 (clipped) + 0.5 e^0.1
    # (both sides fp64 Python floats: approx's default rel=1e-6 is ~1e10 ulp of rounding)
    assert loss == pytest.approx(
        (-0.6 - 0.5 * math.exp(-0.1) - 0.5 * math.exp(0.1) + 0.4 + 0.5 * math.exp(0.1)) / 24
    )
    assert out.loss_objective.item() == pytest.approx(loss, abs=TOL)
    assert torch.allclose(log_probs.grad, grad, atol=TOL, rtol=0)


# ----------------------------------------------------------------- shared behaviour
@pytest.mark.parametrize("term", [gspo_term, cispo_term])
def test_variants_give_zero_not_nan_without_tokens(term):
    log_probs, old, advantage, mask = _tensors()
    empty = torch.zeros_like(mask)
    out = grpo_objective(log_probs, old, advantage, empty, policy_gradient=term)
    out.loss_objective.backward()
    assert out.loss_objective.item() == 0.0 and out.clip_fraction.item() == 0.0
    assert (log_probs.grad == 0).all()


@pytest.mark.parametrize("term", [gspo_term, cispo_term])
def test_variants_take_the_tis_weight_and_extra_terms(term):
    # the truncated importance weight multiplies each token's term, whatever the variant
    log_probs, old, advantage, mask = _tensors()
    plain = grpo_objective(
        log_probs, old, advantage, mask, policy_gradient=term, aggregation="none"
    )
    weighted = grpo_objective(
        log_probs,
        old,
        advantage,
        mask,
        policy_gradient=term,
        aggregation="none",
        inference_log_probs=old - math.log(3.0),
        tis_cap=2.0,
    )
    # w = min(exp(old - inference), 2) = min(3, 2) = 2 on every token
    assert torch.allclose(weighted.loss_objective, 2 * plain.loss_objective, atol=TOL, rtol=0)


# ----------------------------------------------------------------- the loss classes
def _anchored(loss: GRPOLoss, td, shift) -> tuple:
    """``td`` with ``old_log_probs``: the loss's own log-probs now, minus ``shift(j)`` at full
    position ``j``; and the scored current log-probs and masks."""
    current = loss.anchor_log_probs(td)
    anchored = td.clone(False)
    anchored["old_log_probs"] = LogProbs.from_sequences(
        full=[
            row - torch.tensor([shift(j) for j in range(row.shape[0])])
            for row in current.as_list("full")
        ]
    )
    return anchored, current


def _response_positions(td) -> list[tuple[int, int]]:
    """(prompt length, response length) per row."""
    prompts = td["tokens"].as_list("prompt")
    responses = td["tokens"].as_list("response")
    return [(len(p), len(r)) for p, r in zip(prompts, responses, strict=True)]


def test_gspo_loss_uses_the_sequence_ratio(sampler, rollout):
    def shift(j: int) -> float:
        return 0.05 * ((j % 3) - 1)  # d = -0.05, 0, 0.05, ... along each row

    loss = GSPOLoss(
        sampler, aggregation="none", clip_epsilon=(1.0, 10.0), old_log_probs_key="old_log_probs"
    )
    anchored, _ = _anchored(loss, rollout, shift)
    per_token = loss(anchored).loss_objective.detach()
    ppo = GRPOLoss(
        sampler, aggregation="none", clip_epsilon=(1.0, 10.0), old_log_probs_key="old_log_probs"
    )
    token_level = ppo(anchored).loss_objective.detach()
    advantage = rollout["advantage"].tolist()
    expected_rows, ppo_rows = [], []
    for (prompt, length), a in zip(_response_positions(rollout), advantage, strict=True):
        d = [shift(j) for j in range(prompt, prompt + length)]
        s = math.exp(sum(d) / length)
        expected_rows.append(torch.full((length,), -a * s))
        ppo_rows.append(torch.tensor([-a * math.exp(dt) for dt in d]))
    masks = loss.actor(rollout)["masks"]
    response = per_token[:, masks.prompt.shape[1] :]
    # log-probs near -10 lose ulp(10) = 9.5e-7 in (current - shift) - current: d is exact to
    # ~1e-6, times |A| <= 2 and s ~ 1
    tol = 8 * 10 * EPS32 * 2
    assert torch.allclose(response, scatter_rows(expected_rows, masks.response), atol=tol, rtol=0)
    ppo_response = token_level[:, masks.prompt.shape[1] :]
    assert torch.allclose(ppo_response, scatter_rows(ppo_rows, masks.response), atol=tol, rtol=0)
    # the variants differ: by |A| |e^d - e^(mean d)| ~ 0.05 |A| >= 0.025 where d = +-0.05
    assert not torch.allclose(response, ppo_response, atol=1e-3)


def test_cispo_loss_is_reinforce_with_the_weight(sampler, rollout, tiny):
    loss = CISPOLoss(sampler, aggregation="none", old_log_probs_key="old_log_probs")
    anchored, current = _anchored(loss, rollout, lambda j: 0.0)  # r = 1: weight 1
    out = loss(anchored)
    per_token = out.loss_objective.detach()
    masks = loss.actor(rollout)["masks"]
    expected = []
    for row, ((prompt, length), a) in enumerate(
        zip(_response_positions(rollout), rollout["advantage"].tolist(), strict=True)
    ):
        expected.append(-a * current.as_list("full")[row][prompt : prompt + length])
    response = per_token[:, masks.prompt.shape[1] :]
    # the same scoring twice (deterministic on CPU): log pi is the same number, times A
    assert torch.allclose(response, scatter_rows(expected, masks.response), atol=TOL, rtol=0)
    out.loss_objective.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tiny.parameters())


def test_variant_classes_override_one_method():
    for cls in (GSPOLoss, CISPOLoss):
        own = {name for name in vars(cls) if not name.startswith("__")}
        assert own == {"policy_gradient"}, cls
