"""Benchmark worker in the stage environment (`.venv-stage`, vLLM's CPU build): llmrl's
``vLLMWrapper`` over a ``VLLMEngine`` in this process.

Kinds (``options["kind"]``):

* ``rollout``: sample ``samples`` responses per chat with sampling log-probs, exactly as
  ``llmrl_side.py``'s ``rollout`` does with the transformers engine (same chats, token budget,
  seeds per repetition). Setup starts the engine (eager, fp32, a 1 GiB KV cache): its time is
  the worker's ``setup_seconds``, reported apart from the per-call times. The engine's work runs
  in its engine-core process, so this worker's ``cpu_seconds`` miss it; its memory is in
  ``peak_rss_children_mb``.

vLLM's CPU build keeps one core for its front end by default (``VLLM_CPU_NUM_OF_RESERVED_CPU``:
on 2 cores its model runs on 1 thread, 0.63x llmrl's tokens/s on 2026-11-26); here it gets every
core, as the other contenders do (their torch threads).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from harness import serve
from tensordict import TensorDict
from workload import rollout_runner

os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


def setup(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    from llmrl.data import ChatHistory, History
    from llmrl.models import load_tokenizer
    from llmrl.policies import vLLMWrapper
    from llmrl.policies.vllm_engine import VLLMEngine

    if options["kind"] != "rollout":
        raise ValueError(f"vllm_side.py has no kind {options['kind']!r}")
    torch.set_grad_enabled(False)
    info: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "vllm_reserved_cpus": os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"],
    }
    started = time.perf_counter()
    engine = VLLMEngine(options["model"], dtype="float32", max_model_len=2048, seed=0)
    info["engine_start_seconds"] = time.perf_counter() - started
    tokenizer = load_tokenizer(options["model"])
    batch, samples, new_tokens = options["batch"], options["samples"], options["new_tokens"]
    history = History.from_chats(options["chats"])
    td = TensorDict({"history": ChatHistory(prompt=history, batch_size=[batch])}, [batch])
    policy = vLLMWrapper(
        engine, tokenizer, num_samples=samples, generate_kwargs={"max_new_tokens": new_tokens}
    )
    run = rollout_runner(policy, td, new_tokens)

    started = time.perf_counter()
    run(seed=99_999)
    info["first_call_seconds"] = time.perf_counter() - started
    return info, run


if __name__ == "__main__":
    serve(setup)
