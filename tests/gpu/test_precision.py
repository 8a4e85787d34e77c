"""Mixed precision on CUDA (llmrl/train/precision.py): one AdamW step of a bfloat16
mixed-precision trainer (float32 masters, bfloat16 autocast) moves the weights as far as the
float32 step; pure bfloat16 rounds most of it away. The CUDA twin of tests/train/test_precision.py
(whose comments derive the bounds)."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.common import LoraSettings, ModelConfig
from llmrl.models import tiny_model
from llmrl.train.precision import TrainingPrecision
from llmrl.train.trainable_model import make_trainable
from tests.gpu.conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]

LR = 1e-6  # the GRPO stage's default learning rate


def _moves(tokenizer, model_config: ModelConfig) -> tuple[float, float]:
    """(fraction of weight elements changed, L2 distance moved) by one AdamW step from the same
    start on CUDA, trained as ``model_config`` says (activation checkpointing on: the CUDA
    default)."""
    model = make_trainable(tiny_model(tokenizer, seed=3), model_config, LoraSettings()).cuda()
    before = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    tokens = torch.randint(0, 2000, (4, 24), generator=torch.Generator().manual_seed(0)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    with TrainingPrecision.of(model_config).autocast(model):
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    optimizer.step()
    after = {name: p.detach().float() for name, p in model.named_parameters()}
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    total = sum(t.numel() for t in before.values())
    distance = sum(float(((after[n] - before[n]) ** 2).sum()) for n in before) ** 0.5
    return changed / total, distance


def test_mixed_bfloat16_step_moves_the_weights_like_float32_on_cuda(tokenizer):
    fp32 = _moves(tokenizer, ModelConfig(dtype="float32", device="cuda"))
    mixed = _moves(tokenizer, ModelConfig(dtype="bfloat16", device="cuda"))
    pure = _moves(tokenizer, ModelConfig(dtype="bfloat16", device="cuda", precision="pure"))

    # AdamW's first step moves an element with gradient g by lr * |g| / (|g| + eps): lr, to
    # within eps / |g|, whatever bf16 compute did to g's size; so the masters move lr wherever
    # both runs have a gradient (the same elements), and the distance is lr * sqrt(count)
    # The bounds of tests/train/test_precision.py (elements with a gradient in only one run,
    # and |g| < 1000 eps), doubled for CUDA's bf16 kernels (not measured here: no CUDA)
    assert fp32[0] > 0.5
    assert mixed[0] == pytest.approx(fp32[0], abs=2e-3)
    assert mixed[1] == pytest.approx(fp32[1], rel=2e-3)
    # bf16 weights ~N(0, 0.02) are spaced ~|w| * 2^-8 apart: an update of 1e-6 survives only
    # where |w| < ~5e-4 (a few %), moving w by at most one spacing (< 2 lr)
    assert pure[0] < 0.05
    assert pure[1] <= 2 * (pure[0] / fp32[0]) ** 0.5 * fp32[1]
