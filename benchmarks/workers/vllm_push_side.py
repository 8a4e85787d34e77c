"""Benchmark worker in the stage environment (`.venv-stage`, vLLM's CPU build): one LoRA
trainer (a peft model in this process) pushing its weights into one ``VLLMEngine`` after each
simulated optimizer step (``python benchmarks/weight_push.py --lora``).

Kinds (``options["kind"]``):

* ``merged``: the engine serves plain weights; a push is the merged state dict
  (``llmrl.train.lora.inference_state_dict``: ``W + scale * B @ A`` per adapted layer), sent
  through ``VLLMEngine.load_weights`` (the ``llmrl_file`` backend: a safetensors file on
  ``/dev/shm`` every vLLM worker checks and loads);
* ``adapter``: the engine is built with ``lora_engine_options`` and loads the base once; a push
  is the adapter alone (``peft.get_peft_model_state_dict``) through ``VLLMEngine.load_adapter``.

A repetition moves every adapter weight (seeded noise, as an optimizer step; peft's B starts at
zero, so the adapter matters from the first push on), then times the push: ``prepare`` (build
the state dict and its checksum, the trainer's side) and ``engine`` (the engine call, until it
serves the new weights). Untimed afterwards, ``probe_gap``: the largest difference between the
engine's prompt log-probs of a fixed sequence and the trainer's own (a push that did not arrive
would show tenths of a nat).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from harness import serve

os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")

PROBE = [1, 9690, 198, 504, 3458, 28, 253, 9516, 30, 216, 33, 34, 2, 198, 1, 520, 9531]


def setup(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    from llmrl.config.common import LoraSettings
    from llmrl.models import load_model
    from llmrl.policies.vllm_engine import VLLMEngine
    from llmrl.policies.vllm_lora import lora_engine_options
    from llmrl.train.lora import apply_lora

    kind = options["kind"]
    if kind not in ("merged", "adapter"):
        raise ValueError(f"vllm_push_side.py has no kind {kind!r}")
    settings = LoraSettings(
        enabled=True, r=options["r"], alpha=options["alpha"], target_modules=options["targets"]
    )
    trainer = apply_lora(load_model(options["model"], dtype=torch.float32), settings).eval()
    engine_options = lora_engine_options(settings.r, settings.target_modules)
    started = time.perf_counter()
    engine = VLLMEngine(
        options["model"],
        dtype="float32",
        max_model_len=1024,
        seed=0,
        **(engine_options if kind == "adapter" else {}),
    )
    info: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "engine_start_seconds": time.perf_counter() - started,
        "vllm_reserved_cpus": os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"],
    }
    lora_config = {
        "r": settings.r,
        "lora_alpha": settings.alpha,
        "target_modules": list(settings.target_modules),
        "lora_dropout": settings.dropout,
    }
    if kind == "merged":
        push = _merged_push(trainer, engine)
    else:
        push = _adapter_push(trainer, engine, lora_config)

    def run(seed: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, parameter in trainer.named_parameters():
                if ".lora_" in name:
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.01)
        result = push(version=seed + 1)
        served = torch.tensor(engine.prompt_log_probs([PROBE])[0])
        result["probe_gap"] = (served - _log_probs(trainer, PROBE)).abs().max().item()
        return result

    return info, run


def _merged_push(trainer: Any, engine: Any) -> Any:
    from llmrl.core.weights_checksum import weights_checksum
    from llmrl.train.lora import inference_state_dict

    def push(version: int) -> dict[str, Any]:
        tick = time.perf_counter()
        state = inference_state_dict(trainer)
        checksum = weights_checksum(state)
        prepared = time.perf_counter()
        sent = engine.load_weights(state.items(), version=version, checksum=checksum)
        done = time.perf_counter()
        return _timed(sent, tick, prepared, done)

    return push


def _adapter_push(trainer: Any, engine: Any, lora_config: dict[str, Any]) -> Any:
    from peft import get_peft_model_state_dict

    from llmrl.core.weights_checksum import weights_checksum

    def push(version: int) -> dict[str, Any]:
        tick = time.perf_counter()
        state = {n: t.detach().cpu() for n, t in get_peft_model_state_dict(trainer).items()}
        checksum = weights_checksum(state)
        prepared = time.perf_counter()
        engine.load_adapter(list(state.items()), lora_config, version, checksum)
        done = time.perf_counter()
        sent = sum(t.numel() * t.element_size() for t in state.values())
        return _timed(sent, tick, prepared, done)

    return push


def _timed(sent: int, tick: float, prepared: float, done: float) -> dict[str, Any]:
    """A push's result: bytes sent and seconds (``push_seconds``: both phases; the worker's
    ``seconds`` also count the simulated step and the probe)."""
    phases = {"prepare": prepared - tick, "engine": done - prepared}
    return {"bytes": sent, "push_seconds": done - tick, "phases": phases}


def _log_probs(model: Any, sequence: list[int]) -> torch.Tensor:
    """``[0, lp(t1 | t0), ...]`` of ``sequence`` under the trainer's model."""
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0, :-1].float()
    picked = logits.log_softmax(-1).gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), picked])


if __name__ == "__main__":
    serve(setup)
