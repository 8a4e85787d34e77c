"""Fixtures of the vLLM tests (vLLM's CPU build, run in the stage environment `.venv-stage`).

Every module starts at most one engine (about 40 s on 2 cores, eager): the engine fixtures are
module-scoped, never per test.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

# fp32 log-probs of the same tokens from vLLM's CPU kernels and transformers' differ by
# rounding only: each logit is a chain of ~30 layers of fp32 dot products (hidden 576, MLP 1536)
# summed in another order by oneDNN than by torch's GEMM, ~1e-6 relative per layer, on logits
# of magnitude ~20. Measured: 3.8e-5 at most (prompt log-probs), 6.6e-6 (sampled). A stale or
# missing weight moves them by tenths of a nat (a stale tied head: 0.92).
ATOL = 2e-4


@pytest.fixture(scope="session")
def model_dir() -> str:
    """SmolLM2-135M-Instruct as a safetensors folder (converted once per session)."""
    from llmrl.models import ensure_converted, resolve_spec

    return str(ensure_converted(resolve_spec("smollm2-135m-instruct").location))


@pytest.fixture(scope="session")
def vocab_size(model_dir) -> int:
    return json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]


@pytest.fixture(scope="session")
def vllm_tiny_dir(tmp_path_factory, tokenizer) -> Path:
    """A tiny random Llama vLLM's CPU attention accepts (head size 64; the suite's usual tiny
    model has 16, which vLLM's CPU kernels refuse), with SmolLM2's tokenizer."""
    from llmrl.models import tiny_model

    folder = tmp_path_factory.mktemp("vllm-tiny")
    tiny_model(tokenizer, hidden_size=128, num_heads=2, num_kv_heads=1, seed=3).save_pretrained(
        folder
    )
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_model(model_dir):
    """The same model in transformers, fp32, in eval mode (the trainer's side)."""
    from llmrl.models import load_model

    return load_model(model_dir, dtype=torch.float32).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tiny_hf(vllm_tiny_dir):
    """The tiny model of ``vllm_tiny_dir`` in transformers, fp32 (the trainer's side)."""
    from llmrl.models import load_model

    return load_model(vllm_tiny_dir, dtype=torch.float32).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tiny_engine(vllm_tiny_dir):
    """A ``VLLMEngine`` of the tiny model (fp32, eager), one per module that asks."""
    from llmrl.policies.vllm_engine import VLLMEngine

    engine = VLLMEngine(vllm_tiny_dir, dtype="float32", max_model_len=512, seed=0)
    yield engine
    engine.close()


def hf_log_probs(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """``[0, lp(t1 | t0), ...]`` of one token sequence under a transformers model."""
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0, :-1].float()
    picked = logits.log_softmax(-1).gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), picked])


def engine_log_probs(engine, sequence: list[int]) -> torch.Tensor:
    """``[0, lp(t1 | t0), ...]`` of one token sequence as a ``VLLMEngine`` scores it."""
    return torch.tensor(engine.prompt_log_probs([sequence])[0])


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A copy of ``model`` with Gaussian noise added to every weight (a trainer's step)."""
    changed = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return changed


def assert_trainer_reproduces_sampled_log_probs(model: torch.nn.Module, flat) -> None:
    """The trainer's own forward gives the sampler's log-probs for the sampled tokens of every
    row of ``flat`` (a sampled batch ``[N]``)."""
    sampled = flat["log_probs"].as_list("response")
    assert all(len(lp) and (lp <= 0).all() for lp in sampled)
    full = flat["tokens"].as_list("full")
    trainer = [
        hf_log_probs(model, sequence.tolist())[-len(lp) :]
        for sequence, lp in zip(full, sampled, strict=True)
    ]
    assert_close_rows(trainer, sampled)


def assert_close_rows(expected, actual, atol: float = ATOL) -> None:
    """Rows of log-probs agree within ``atol`` (same lengths, row named on failure)."""
    assert [len(e) for e in expected] == [len(a) for a in actual]
    for row, (e, a) in enumerate(zip(expected, actual, strict=True)):
        e, a = torch.as_tensor(e).float().cpu(), torch.as_tensor(a).float().cpu()
        gap = (e - a).abs().max().item() if len(e) else 0.0
        assert gap <= atol, f"row {row}: log-probs differ by {gap:.3g} (> {atol})"
