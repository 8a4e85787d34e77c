"""grpo_objective: the GRPO loss's math against hand-computed values on written-out tensors.

The hand-made batch (N=2, L=4): per-token ratios ``r = exp(log_probs - old)`` and advantages

    row 0: mask [T, T, T, F]  r = [1.5, 0.7, 1.0, pad]   A = +1
    row 1: mask [F, F, T, T]  r = [pad, pad, 1.1, 0.5]   A = -2

Padded positions hold 1e4 (exp overflows to inf): any leak makes the result inf or nan.
With eps = 0.2 the clip range is [0.8, 1.2], and -min(r A, clip(r) A) per token is

    row 0: -min(1.5, 1.2) = -1.2 (clipped)   -min(0.7, 0.8) = -0.7   -1.0
    row 1: -min(-2.2, -2.2) = 2.2            -min(-1.0, -1.6) = 1.6 (clipped)
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.objectives import GRPOLossOutput, grpo_objective

PAD = 1e4
MASK = torch.tensor([[True, True, True, False], [False, False, True, True]])
RATIOS = [[1.5, 0.7, 1.0, 1.0], [1.0, 1.0, 1.1, 0.5]]
OLD = torch.tensor([[-1.0, -2.0, -0.5, 7.0], [3.0, -9.0, -1.5, -0.3]])
ADVANTAGE = torch.tensor([1.0, -2.0])
VALID_RATIOS = [1.5, 0.7, 1.0, 1.1, 0.5]
# Hand-computed values: r = exp((old + log r) - old) carries fp32 rounding of eps * |old|
# (|old| <= 9: 1.1e-6 of r), times |A| <= 2 and a few adds: <= ~3e-6 (measured 6e-8); a wrong
# clip, mask or aggregation moves a result by O(0.1).
ATOL = 1e-5


def k3(d: float) -> float:
    return math.exp(d) - 1 - d


def _log_probs() -> torch.Tensor:
    """Current log-probs: old + log r at valid positions, PAD elsewhere."""
    log_probs = OLD + torch.tensor(RATIOS).log()
    return torch.where(MASK, log_probs, torch.full_like(log_probs, PAD))


def _objective(**kwargs) -> GRPOLossOutput:
    return grpo_objective(_log_probs(), OLD, ADVANTAGE, MASK, **kwargs)


def _close(value: torch.Tensor, expected: float) -> None:
    assert torch.isfinite(value).all()
    assert value.item() == pytest.approx(expected, abs=ATOL)


# ----------------------------------------------------------------- aggregations
def test_token_mean():
    # (-1.2 - 0.7 - 1.0 + 2.2 + 1.6) / 5 = 0.9 / 5
    _close(_objective(aggregation="token_mean").loss_objective, 0.18)


def test_prompt_mean():
    # row means: -2.9 / 3 and 3.8 / 2 = 1.9; their mean
    _close(_objective(aggregation="prompt_mean").loss_objective, (-2.9 / 3 + 1.9) / 2)


def test_prompt_mean_skips_rows_without_tokens():
    mask = MASK.clone()
    mask[1] = False  # row 1 has no valid token: the mean is over row 0 only
    out = grpo_objective(_log_probs(), OLD, ADVANTAGE, mask, aggregation="prompt_mean")
    _close(out.loss_objective, -2.9 / 3)


def test_sum_norm():
    # Dr. GRPO: row sums -2.9 and 3.8, each / 4, then the mean over the 2 rows
    out = _objective(aggregation="sum_norm", max_length_norm=4)
    _close(out.loss_objective, (-2.9 / 4 + 3.8 / 4) / 2)


def test_none_gives_per_token_losses_zero_at_padding():
    out = _objective(aggregation="none")
    expected = torch.tensor([[-1.2, -0.7, -1.0, 0.0], [0.0, 0.0, 2.2, 1.6]])
    assert out.loss_objective.shape == (2, 4)
    assert torch.allclose(out.loss_objective, expected, atol=ATOL)
    assert torch.allclose(out.total(), expected, atol=ATOL)


def test_empty_mask_gives_zero_not_nan():
    empty = torch.zeros_like(MASK)
    for aggregation, norm in (("token_mean", None), ("prompt_mean", None), ("sum_norm", 4)):
        out = grpo_objective(
            _log_probs(), OLD, ADVANTAGE, empty, aggregation=aggregation, max_length_norm=norm
        )
        assert out.loss_objective.item() == 0.0
        assert out.clip_fraction.item() == 0.0 and out.ESS.item() == 0.0


# ----------------------------------------------------------------- clipping
def test_asymmetric_clip():
    # clip range [0.8, 1.6]: r = 1.5 (A > 0) is no longer clipped: -1.5 instead of -1.2;
    # (-1.5 - 0.7 - 1.0 + 2.2 + 1.6) / 5 = 0.6 / 5; only r = 0.5 (A < 0) is clipped
    out = _objective(clip_epsilon=(0.2, 0.6))
    _close(out.loss_objective, 0.12)
    _close(out.clip_fraction, 1 / 5)
    # clip range [0.4, 1.2]: r = 0.5 with A = -2 is inside: loss 1.0 instead of 1.6
    out = _objective(clip_epsilon=(0.6, 0.2))
    _close(out.loss_objective, (-1.2 - 0.7 - 1.0 + 2.2 + 1.0) / 5)
    _close(out.clip_fraction, 1 / 5)


def test_clip_fraction_counts_only_the_side_that_matters():
    # symmetric: r = 1.5 with A > 0 and r = 0.5 with A < 0 are clipped: 2 of 5 valid tokens
    _close(_objective().clip_fraction, 2 / 5)
    # flipping the advantages: r = 1.5 with A < 0 and r = 0.7 with A > 0 keep the unclipped
    # branch (the min picks r A), so they do not count; r = 0.7 with A < 0 is clipped (0.7 < 0.8)
    out = grpo_objective(_log_probs(), OLD, -ADVANTAGE, MASK)
    _close(out.clip_fraction, 1 / 5)  # row 0 (A = -1): r = 0.7; row 1 (A = +2): none above 1.2
    zero_adv = grpo_objective(_log_probs(), OLD, torch.zeros(2), MASK)
    _close(zero_adv.clip_fraction, 0.0)


# ----------------------------------------------------------------- diagnostics
def test_kl_approx_ess_are_over_valid_tokens():
    # kl_approx = mean over valid tokens of (r - 1) - log r
    expected_kl = sum((r - 1) - math.log(r) for r in VALID_RATIOS) / 5  # = 0.0698094
    # ESS = (sum r)^2 / (n sum r^2) = 4.8^2 / (5 * 5.2) = 23.04 / 26
    out = _objective()
    _close(out.kl_approx, expected_kl)
    _close(out.ESS, 23.04 / 26)
    assert not out.clip_fraction.requires_grad and not out.kl_approx.requires_grad
    assert not out.ESS.requires_grad
    assert out.entropy is None and out.kl_to_ref is None


def test_unchanged_policy_diagnostics():
    out = grpo_objective(OLD.clone(), OLD, ADVANTAGE, MASK)
    _close(out.clip_fraction, 0.0)
    _close(out.kl_approx, 0.0)
    _close(out.ESS, 1.0)


# ----------------------------------------------------------------- extra terms
DELTA = [[0.1, -0.2, 0.0, 0.0], [0.0, 0.0, 0.3, -0.1]]  # ref - current at valid positions


def _ref() -> torch.Tensor:
    ref = _log_probs() + torch.tensor(DELTA)
    return torch.where(MASK, ref, torch.full_like(ref, -PAD))


def test_kl_to_ref_k3():
    # k3(d) = e^d - 1 - d for d = ref - current:
    # 0.0051709, 0.0187308, 0, 0.0498588, 0.0048374 -> sum 0.0785979
    row0 = [k3(0.1), k3(-0.2), k3(0.0)]
    row1 = [k3(0.3), k3(-0.1)]
    out = _objective(ref_log_probs=_ref(), kl_to_ref_coeff=0.5)
    _close(out.kl_to_ref, sum(row0 + row1) / 5)
    _close(out.loss_kl_to_ref, 0.5 * sum(row0 + row1) / 5)
    prompt_mean = _objective(ref_log_probs=_ref(), kl_to_ref_coeff=0.5, aggregation="prompt_mean")
    _close(prompt_mean.loss_kl_to_ref, 0.5 * (sum(row0) / 3 + sum(row1) / 2) / 2)
    _close(prompt_mean.kl_to_ref, sum(row0 + row1) / 5)  # the diagnostic is a token mean
    # the total adds the terms
    _close(out.total(), out.loss_objective.item() + out.loss_kl_to_ref.item())


def test_kl_to_inference_k3():
    # d = old - current = -log r: k3 = 1/r - 1 + log r
    # 0.0721318, 0.0718965, 0, 0.0044011, 0.3068528 -> mean 0.0910564
    expected = sum(k3(-math.log(r)) for r in VALID_RATIOS) / 5
    out = _objective(kl_to_inference_coeff=0.1)
    _close(out.loss_kl_to_inference, 0.1 * expected)
    # with separate inference log-probs the KL is taken to them, not to the ratio's anchor
    inference = OLD - 0.2
    out = _objective(kl_to_inference_coeff=1.0, inference_log_probs=inference)
    _close(out.loss_kl_to_inference, sum(k3(-math.log(r) - 0.2) for r in VALID_RATIOS) / 5)


ENTROPY = torch.tensor([[0.5, 1.0, 1.5, PAD], [PAD, PAD, 2.0, 3.0]])


def test_entropy_term_and_diagnostic():
    out = _objective(entropy=ENTROPY, entropy_coeff=0.01)
    _close(out.entropy, (0.5 + 1.0 + 1.5 + 2.0 + 3.0) / 5)  # 1.6
    _close(out.loss_entropy, -0.01 * 1.6)  # maximising entropy lowers the loss
    none = _objective(entropy=ENTROPY, entropy_coeff=0.01, aggregation="none")
    assert none.loss_entropy[~MASK].eq(0).all()
    _close(none.loss_entropy[1, 3], -0.03)


def test_truncated_importance_sampling():
    # old - inference = [ln 3, ln 0.5, 0 | ln 1.5, 0] -> w = min(., 2) = [2, 0.5, 1 | 1.5, 1]
    gap = torch.tensor([[math.log(3), math.log(0.5), 0.0, 0.0], [0.0, 0.0, math.log(1.5), 0.0]])
    inference = (OLD - gap).requires_grad_()
    out = _objective(inference_log_probs=inference, tis_cap=2.0)
    # (-1.2 * 2 - 0.7 * 0.5 - 1.0 * 1 + 2.2 * 1.5 + 1.6 * 1) / 5 = 1.15 / 5
    _close(out.loss_objective, 0.23)
    assert not out.loss_objective.requires_grad  # the weights are detached
    # off by default: separate inference log-probs leave the objective alone
    _close(_objective(inference_log_probs=inference).loss_objective, 0.18)


# ----------------------------------------------------------------- gradients
@pytest.mark.parametrize(
    ("aggregation", "norm"), [("token_mean", None), ("prompt_mean", None), ("sum_norm", 4.0)]
)
def test_gradients_are_zero_at_padding(aggregation, norm):
    log_probs = _log_probs().requires_grad_()
    entropy = ENTROPY.clone().requires_grad_()
    out = grpo_objective(
        log_probs,
        OLD,
        ADVANTAGE,
        MASK,
        aggregation=aggregation,
        max_length_norm=norm,
        ref_log_probs=_ref(),
        entropy=entropy,
        kl_to_ref_coeff=0.5,
        kl_to_inference_coeff=0.1,
        entropy_coeff=0.01,
        tis_cap=2.0,
        inference_log_probs=OLD - 0.1,
    )
    out.total().backward()
    assert torch.isfinite(log_probs.grad).all() and torch.isfinite(entropy.grad).all()
    assert (log_probs.grad[~MASK] == 0).all()
    assert (entropy.grad[~MASK] == 0).all()
    assert (log_probs.grad[MASK] != 0).any()


def test_objective_gradient_by_hand():
    # token mean: d loss / d log_probs = -(1/5) r A where unclipped, 0 where clipped
    log_probs = _log_probs().requires_grad_()
    grpo_objective(log_probs, OLD, ADVANTAGE, MASK).loss_objective.backward()
    expected = torch.tensor([[0.0, -0.7 / 5, -1.0 / 5, 0.0], [0.0, 0.0, 2 * 1.1 / 5, 0.0]])
    assert torch.allclose(log_probs.grad, expected, atol=ATOL)


# ----------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_epsilon": -0.1}, "clip_epsilon must be >= 0"),
        ({"clip_epsilon": (0.2, -0.1)}, "eps_high=-0.1"),
        ({"aggregation": "mean"}, "options: ['token_mean', 'prompt_mean', 'sum_norm', 'none']"),
        ({"aggregation": "sum_norm"}, "needs max_length_norm"),
        ({"max_length_norm": 10}, "only used by aggregation='sum_norm'"),
        ({"kl_to_ref_coeff": -1.0}, "kl_to_ref_coeff must be >= 0"),
        ({"kl_to_ref_coeff": 0.1}, "needs ref_log_probs"),
        ({"entropy_coeff": 0.1}, "needs the token entropy"),
        ({"tis_cap": 0.0}, "tis_cap must be > 0"),
    ],
)
def test_objective_validation(kwargs, message):
    with pytest.raises(ValueError) as error:
        _objective(**kwargs)
    assert message in str(error.value)


def test_advantage_shape_is_checked():
    with pytest.raises(ValueError, match="advantage"):
        grpo_objective(_log_probs(), OLD, torch.zeros(3), MASK)
    out = grpo_objective(_log_probs(), OLD, ADVANTAGE.unsqueeze(1), MASK)  # [N, 1] is fine
    _close(out.loss_objective, 0.18)
