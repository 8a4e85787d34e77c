"""DDP and FSDP2 over NCCL at world size 1 (llmrl/train/distributed.py) train a mixed-precision
step on CUDA like a single process, and a checkpoint round trip (llmrl/train/checkpoint.py)
restores the float32 masters exactly."""

from __future__ import annotations

import socket

import pytest
import torch

from llmrl.config.common import LoraSettings, ModelConfig
from llmrl.models import tiny_model
from llmrl.train import distributed
from llmrl.train.precision import TrainingPrecision
from llmrl.train.trainable_model import make_trainable
from tests.gpu.conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]

LR = 1e-5
MIXED = ModelConfig(dtype="bfloat16", device="cuda")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def nccl_group():
    backend = distributed.init_group(0, 1, "127.0.0.1", _free_port(), timeout_s=120)
    assert backend == "nccl"
    yield
    distributed.leave_group()


def _trainable(tokenizer) -> torch.nn.Module:
    return make_trainable(tiny_model(tokenizer, seed=4), MIXED, LoraSettings()).cuda()


def _step(model: torch.nn.Module) -> float:
    """One AdamW step of the LM loss on fixed tokens; returns the loss."""
    tokens = torch.randint(0, 2000, (4, 32), generator=torch.Generator().manual_seed(0)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    with TrainingPrecision.of(MIXED).autocast(model):  # a no-op under FSDP2 (its policy casts)
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Float32 copies of the parameters (FSDP2's DTensors gathered)."""
    model = distributed.unwrap(model)
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().clone()
        for name, p in model.named_parameters()
    }


def _distance(after: dict, before: dict) -> float:
    return sum(float(((after[n] - before[n]) ** 2).sum()) for n in before) ** 0.5


@pytest.fixture(scope="module")
def single_step(tokenizer):
    """The single-process mixed-precision step: (start, after, loss)."""
    model = _trainable(tokenizer)
    start = _full(model)
    loss = _step(model)
    return start, _full(model), loss


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_wrapped_model_trains_a_step_like_a_single_process(
    tokenizer, nccl_group, single_step, strategy
):
    start, single_after, single_loss = single_step
    model = _trainable(tokenizer)
    policy = TrainingPrecision.of(MIXED).fsdp_policy() if strategy == "fsdp" else None
    wrapped = distributed.wrap_model(model, strategy, policy)
    loss = _step(wrapped)
    after = _full(wrapped)
    assert all(p.dtype == torch.float32 for p in distributed.unwrap(wrapped).parameters())
    # bf16 compute either way, cast in different places (autocast vs FSDP2's policy): logits
    # rounded to 2^-8 of their size a few times over, a mean NLL within ~1% of itself
    assert loss == pytest.approx(single_loss, rel=1e-2)
    # AdamW's first step moves every element with a gradient by ~lr (a uniform scale such as
    # clipping cancels in g / |g|): the same distance but for elements whose gradient is within
    # bf16 rounding of 0 in one run; 5e-3 is an engineering bound, not measured here (no CUDA)
    assert _distance(after, start) == pytest.approx(_distance(single_after, start), rel=5e-3)
    if strategy == "ddp":  # one rank: DDP's averaged gradient is the process's own
        for name in start:
            assert float((after[name] - single_after[name]).abs().max()) <= LR


def test_checkpoint_round_trip_restores_the_masters_exactly(tokenizer, tmp_path):
    from safetensors.torch import load_file

    from llmrl.train.checkpoint import CheckpointPayload, CheckpointWriter, load_checkpoint

    model = _trainable(tokenizer)
    _step(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model_state, masters = TrainingPrecision.of(MIXED).checkpoint_weights(model)
    assert masters is not None
    writer = CheckpointWriter(tmp_path / "checkpoints")
    writer.recover()
    payload = CheckpointPayload(
        step=1,
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        model_state=model_state,
        master_weights=masters,
    )
    path = writer.save(payload)
    saved = {}
    for file in (path / "model").glob("*.safetensors"):
        saved.update(load_file(file))
    assert {t.dtype for t in saved.values() if t.is_floating_point()} == {torch.bfloat16}

    fresh = make_trainable(tiny_model(tokenizer, seed=9), MIXED, LoraSettings()).cuda()
    load_checkpoint(path, model=fresh, restore_rng=False)
    restored = dict(fresh.named_parameters())
    for name, parameter in model.named_parameters():
        assert restored[name].dtype == torch.float32 and restored[name].is_cuda
        assert torch.equal(restored[name], parameter), name
