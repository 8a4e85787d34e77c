"""The learning-rate schedule (by hand) and the AdamW setup.

Tolerance: the factors are float64 arithmetic (a few ops and a cos, ~1e-16 relative), so
approx's default ``rel=1e-6`` is ample; an off-by-one interval moves a factor by >= 0.01.
"""

from __future__ import annotations

import math

import pytest
import torch

from llmrl.config.common import OptimizerConfig
from llmrl.train.optim import build_optimizer, lr_factor


def _config(schedule: str, warmup: int = 2, floor: float = 0.1) -> OptimizerConfig:
    return OptimizerConfig(lr=1.0, warmup_steps=warmup, schedule=schedule, min_lr_ratio=floor)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_linear_warmup_reaches_the_peak_on_its_last_step(schedule):
    config = _config(schedule, warmup=4)
    assert [lr_factor(step, config, 20) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, config, 20) == 1.0  # decay starts at the peak


def test_constant_stays_at_the_peak():
    config = _config("constant")
    assert [lr_factor(step, config, 10) for step in range(2, 15)] == [1.0] * 13


def test_linear_decays_to_the_floor_on_the_last_step():
    # 12 steps, 2 of warmup: the decay spans steps 2..11 (9 intervals)
    config = _config("linear")
    assert lr_factor(2, config, 12) == pytest.approx(1.0)
    assert lr_factor(5, config, 12) == pytest.approx(1 - 0.9 * 3 / 9)  # 0.7
    assert lr_factor(8, config, 12) == pytest.approx(1 - 0.9 * 6 / 9)  # 0.4
    assert lr_factor(11, config, 12) == pytest.approx(0.1)
    assert lr_factor(30, config, 12) == pytest.approx(0.1)  # past the end: the floor


def test_cosine_by_hand():
    # 11 steps, 2 of warmup: the decay spans steps 2..10 (8 intervals)
    config = _config("cosine")
    assert lr_factor(2, config, 11) == pytest.approx(1.0)
    assert lr_factor(4, config, 11) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert lr_factor(6, config, 11) == pytest.approx(0.55)  # halfway: the mean of peak, floor
    assert lr_factor(10, config, 11) == pytest.approx(0.1)
    assert lr_factor(50, config, 11) == pytest.approx(0.1)
    zero_floor = _config("cosine", warmup=0, floor=0.0)
    assert [lr_factor(s, zero_floor, 5) for s in range(5)] == pytest.approx(
        [1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2, 0.0]
    )


def test_no_warmup_and_single_step():
    for schedule in ("constant", "linear", "cosine"):
        config = _config(schedule, warmup=0)
        assert lr_factor(0, config, 10) == 1.0
        assert lr_factor(0, config, 1) == 1.0  # a one-step run trains at the peak


def test_the_scheduler_follows_lr_factor_and_only_trainable_params_are_optimised():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    model[0].requires_grad_(False)
    config = OptimizerConfig(lr=0.5, warmup_steps=2, schedule="linear", min_lr_ratio=0.2)
    optimizer, scheduler = build_optimizer(model, config, total_steps=6)
    assert isinstance(optimizer, torch.optim.AdamW)
    (group,) = optimizer.param_groups
    assert {id(p) for p in group["params"]} == {id(p) for p in model[1].parameters()}
    assert group["betas"] == (0.9, 0.999) and group["weight_decay"] == 0.0
    used = []
    for _ in range(6):
        used.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert used == pytest.approx([0.25, 0.5, 0.5, 0.5 * (1 - 0.8 / 3), 0.5 * (1 - 1.6 / 3), 0.1])


def test_a_model_without_trainable_params_is_an_error():
    model = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, OptimizerConfig(), total_steps=3)
