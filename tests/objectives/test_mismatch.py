"""Train/inference mismatch correction: token and sequence importance weights, truncated or
masked, checked against values computed by hand, and wired through the loss and the config."""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.config import ConfigError, load_config
from llmrl.config.grpo import GRPOConfig
from llmrl.objectives import grpo_objective
from llmrl.objectives.mismatch import MismatchCorrection

# float32: each weight is one exp of a difference of two float32 numbers: a few ulps, ~1e-6
# of weights <= 4 (allclose adds its default rtol=1e-5). Fractions k / n are one fp32
# division: 6e-8 relative, within approx's default rel=1e-6.
TOL = 1e-6

# two sequences, ragged: row 0 trains 3 tokens, row 1 trains 2 (position 2 is padding)
MASK = torch.tensor([[True, True, True], [True, True, False]])
LOG_2 = math.log(2.0)
# old - inference per token: row 0: [ln 2, 0, -ln 4]; row 1: [ln 3, ln 1.5]
OLD = torch.tensor([[LOG_2, 0.0, -2 * LOG_2], [math.log(3.0), math.log(1.5), 123.0]])
INFERENCE = torch.zeros(2, 3)


def test_token_truncate_caps_each_ratio():
    weights = MismatchCorrection("token", "truncate", 2.5).weights(OLD, INFERENCE, MASK)
    expected = torch.tensor([[2.0, 1.0, 0.25], [2.5, 1.5, 0.0]])  # 3 capped at 2.5; pad 0
    assert torch.allclose(weights.weight, expected, atol=TOL)
    assert weights.fraction.item() == pytest.approx(1 / 5)  # one token of five


def test_token_mask_drops_ratios_outside_the_band():
    weights = MismatchCorrection("token", "mask", 2.5).weights(OLD, INFERENCE, MASK)
    # band [0.4, 2.5]: 0.25 (below) and 3 (above) are dropped
    expected = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.5, 0.0]])
    assert torch.allclose(weights.weight, expected, atol=TOL)
    assert weights.fraction.item() == pytest.approx(2 / 5)


def test_sequence_level_uses_the_product_of_the_token_ratios():
    # row 0: 2 * 1 * 0.25 = 0.5; row 1: 3 * 1.5 = 4.5 (padding not included)
    truncated = MismatchCorrection("sequence", "truncate", 4.0).weights(OLD, INFERENCE, MASK)
    expected = torch.tensor([[0.5, 0.5, 0.5], [4.0, 4.0, 0.0]])
    assert torch.allclose(truncated.weight, expected, atol=TOL)
    assert truncated.fraction.item() == pytest.approx(1 / 2)
    masked = MismatchCorrection("sequence", "mask", 4.0).weights(OLD, INFERENCE, MASK)
    expected = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])  # 4.5 > 4: row 1 dropped
    assert torch.allclose(masked.weight, expected, atol=TOL)
    assert masked.fraction.item() == pytest.approx(1 / 2)


def test_no_trained_token_gives_a_zero_fraction_not_nan():
    none = torch.zeros_like(MASK)
    weights = MismatchCorrection("sequence", "mask", 2.0).weights(OLD, INFERENCE, none)
    assert weights.fraction.item() == 0.0 and not weights.weight.any()


@pytest.mark.parametrize(
    ("level", "mode", "threshold", "message"),
    [
        ("tokens", "truncate", 2.0, "mismatch level must be one of"),
        ("token", "drop", 2.0, "mismatch mode must be one of"),
        ("token", "mask", 1.0, r"threshold must be a finite number > 1 for mode 'mask'"),
        ("token", "truncate", math.inf, r"threshold must be a finite number > 0"),
    ],
)
def test_bad_settings_are_refused(level, mode, threshold, message):
    with pytest.raises(ValueError, match=message):
        MismatchCorrection(level, mode, threshold)


def test_the_loss_weights_each_token_and_reports_the_fraction():
    # old == current: the clipped term is -A per token; the correction multiplies it by w
    current = OLD.clone().requires_grad_(True)
    advantage = torch.tensor([1.0, -2.0])
    out = grpo_objective(
        current,
        OLD,
        advantage,
        MASK,
        aggregation="token_mean",
        inference_log_probs=INFERENCE,
        mismatch=MismatchCorrection("token", "mask", 2.5),
    )
    # per token: -A * w = row 0: [-2, -1, 0]; row 1: [0, 3, -]; mean over the 5 trained tokens
    assert out.loss_objective.item() == pytest.approx((-2 - 1 + 0 + 0 + 3) / 5, abs=TOL)
    assert out.mismatch_fraction.item() == pytest.approx(2 / 5)
    out.loss_objective.backward()
    # d/d current of -A * w * exp(current - old) at current == old: -A * w / 5
    expected = torch.tensor([[-2.0, -1.0, 0.0], [0.0, 3.0, 0.0]]) / 5
    assert torch.allclose(current.grad, expected, atol=TOL)


def test_tis_cap_is_the_token_truncate_correction():
    current = OLD.clone().requires_grad_(True)
    common = {"aggregation": "token_mean", "inference_log_probs": INFERENCE}
    by_cap = grpo_objective(current, OLD, torch.tensor([1.0, 1.0]), MASK, tis_cap=2.5, **common)
    by_name = grpo_objective(
        current,
        OLD,
        torch.tensor([1.0, 1.0]),
        MASK,
        mismatch=MismatchCorrection("token", "truncate", 2.5),
        **common,
    )
    assert by_cap.loss_objective.item() == by_name.loss_objective.item()
    assert by_cap.mismatch_fraction.item() == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="tis_cap and mismatch both set"):
        grpo_objective(
            current, OLD, torch.tensor([1.0, 1.0]), MASK, tis_cap=2.0,
            mismatch=MismatchCorrection(), **common,
        )  # fmt: skip


def test_the_config_selects_the_correction_and_names_its_fields():
    config = load_config(
        GRPOConfig,
        None,
        ["data.path=x", "loss.mismatch.level=sequence", "loss.mismatch.mode=mask"],
    )
    assert config.loss.mismatch.threshold == 2.0 and config.loss.mismatch.level == "sequence"
    with pytest.raises(ConfigError, match=r"loss\.mismatch.*threshold must be > 1"):
        load_config(
            GRPOConfig,
            None,
            ["data.path=x", "loss.mismatch.mode=mask", "loss.mismatch.threshold=1"],
        )
    with pytest.raises(ConfigError, match=r"loss.*tis_cap is already set"):
        load_config(
            GRPOConfig, None, ["data.path=x", "loss.tis_cap=2", "loss.mismatch.level=token"]
        )


def test_the_stage_builds_its_loss_with_the_configured_correction(tiny, tokenizer):
    from llmrl.objectives.from_config import build_grpo_loss
    from llmrl.policies import TransformersWrapper

    config = load_config(
        GRPOConfig, None, ["data.path=x", "loss.mismatch.level=sequence", "loss.variant=cispo"]
    )
    loss = build_grpo_loss(TransformersWrapper(tiny, tokenizer), config)
    assert loss.mismatch == MismatchCorrection("sequence", "truncate", 2.0)
    assert "mismatch=MismatchCorrection(level='sequence'" in repr(loss)
