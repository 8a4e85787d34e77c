"""Inference engines of the GRPO runtime: what each inference actor serves, and where it runs.

Every engine is fronted by an :class:`~llmrl.collectors.InferenceActor` (request batching over
the env workers' calls, ``policy_version`` stamps, weight loading between calls); only what it
serves depends on ``topology.inference.backend``:

- ``transformers``: :class:`TransformersEngine` builds a
  :class:`~llmrl.policies.TransformersWrapper` over its own copy of the model, in the actor, on
  CPU or on the engine's GPU;
- ``vllm``: a :class:`~llmrl.policies.vllm_engine.VLLMEngine` actor holds the GPUs (tensor
  parallel per topology) and :class:`VLLMFrontend` builds a
  :class:`~llmrl.policies.vLLMWrapper` over it in the front actor.

:func:`inference_actor_options` says where each front actor goes: its own placement group
(disaggregated) or the trainer's bundles (colocated: engines and trainer ranks share devices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmrl.topology import Placement, Topology


@dataclass(frozen=True)
class TransformersEngine:
    """Builds a transformers sampling policy in an inference actor (picklable).

    Args:
        model: the model spec (name, directory or GGUF file) the trainer starts from.
        dtype, device: where the engine's copy lives (``cuda`` for a GPU engine).
        generate_kwargs: the stage's sampling settings.
        batch_rows: rows the actor waits for before one model call (the step's rows for this
            engine), served together from every env worker.
        batching_timeout_s: how long the first request waits for the others.
        threads: torch CPU threads of the actor (None: leave torch's choice).
        seed: seeds the actor's torch RNG once, before the model loads, so that a rerun with
            the same config draws the same samples (None: unseeded). Every sampling call of
            the actor draws from that one stream, so steps stay independent draws.
        compile_decode: sample with the compiled static-KV decode
            (:mod:`llmrl.policies.static_decode`); None: on for a CUDA engine, off on a CPU.
        load_options: ``trust_remote_code`` / ``allow_pickled_weights`` (``ModelConfig``).
    """

    model: str
    dtype: str
    device: str
    generate_kwargs: dict[str, Any]
    batch_rows: int
    batching_timeout_s: float = 0.5
    threads: int | None = None
    seed: int | None = None
    compile_decode: bool | None = None
    load_options: dict[str, bool] = field(default_factory=dict)

    def __call__(self) -> Any:
        from llmrl.models import load_model, load_tokenizer
        from llmrl.policies import TransformersWrapper

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.seed is not None:
            torch.manual_seed(self.seed)
        model = load_model(self.model, dtype=self.dtype, device=self.device, **self.load_options)
        model.requires_grad_(False).eval()
        trust = self.load_options.get("trust_remote_code", False)
        return TransformersWrapper(
            model,
            load_tokenizer(self.model, trust_remote_code=trust),
            generate_kwargs=self.generate_kwargs,
            min_batch_size=self.batch_rows,
            max_batch_size=self.batch_rows,
            batching_timeout=self.batching_timeout_s,
            compile_decode=self.compile_decode,
        )


@dataclass(frozen=True)
class VLLMFrontend:
    """Builds a :class:`~llmrl.policies.vLLMWrapper` over a ``VLLMEngine`` actor (picklable)."""

    engine: Any
    tokenizer: str
    generate_kwargs: dict[str, Any]
    batch_rows: int
    batching_timeout_s: float = 0.5

    def __call__(self) -> Any:
        from llmrl.models import load_tokenizer
        from llmrl.policies import vLLMWrapper

        return vLLMWrapper(
            self.engine,
            load_tokenizer(self.tokenizer),
            generate_kwargs=self.generate_kwargs,
            min_batch_size=self.batch_rows,
            max_batch_size=self.batch_rows,
            batching_timeout=self.batching_timeout_s,
        )


@dataclass
class EngineSet:
    """The policy factory of each inference actor, and the vLLM engine actors behind them (the
    targets of NCCL weight broadcasts; empty for the transformers backend)."""

    factories: list[Any]
    vllm_engines: list[Any] = field(default_factory=list)


def start_engines(
    topology: Topology,
    placement: Placement,
    model: str,
    dtype: str,
    generate_kwargs: dict[str, Any],
    batch_rows: int,
    batching_timeout_s: float,
    threads: int | None,
    runtime_env: dict[str, Any] | None,
    seed: int | None = None,
    compile_decode: bool | None = None,
    load_options: dict[str, bool] | None = None,
) -> EngineSet:
    """The engines of ``topology``: factories for the inference actors and, with vLLM, the
    ``VLLMEngine`` actors themselves, started on the engines' bundles. Engine ``i`` samples
    with seed ``seed + i`` (None: unseeded); transformers engines use the compiled decode when
    ``compile_decode`` (None: the engines on a GPU do)."""
    inference = topology.inference

    def engine_seed(index: int) -> int | None:
        return None if seed is None else seed + index

    if inference.backend == "transformers":
        device = "cuda" if inference.engine_gpus else "cpu"
        return EngineSet(
            [
                TransformersEngine(
                    model,
                    dtype,
                    device,
                    generate_kwargs,
                    batch_rows,
                    batching_timeout_s,
                    threads,
                    engine_seed(index),
                    compile_decode,
                    dict(load_options or {}),
                )
                for index in range(inference.engines)
            ]
        )
    import ray

    from llmrl.policies.vllm_engine import VLLMEngine

    engines = []
    tp = inference.tensor_parallel_size
    for index in range(inference.engines):
        options: dict[str, Any] = {
            "num_cpus": 0,
            # tensor parallel: vLLM's Ray executor puts one worker on each bundle of the group
            "num_gpus": _engine_gpu_share(topology) if tp == 1 else 0,
            "scheduling_strategy": placement.inference[index].scheduling_strategy(0),
        }
        if runtime_env:
            options["runtime_env"] = runtime_env
        engines.append(
            ray.remote(VLLMEngine)
            .options(**options)
            .remote(
                model,
                tensor_parallel_size=tp,
                gpu_memory_utilization=inference.gpu_memory_utilization,
                dtype=dtype,
                seed=engine_seed(index) or 0,
                enforce_eager=inference.enforce_eager,
                cpu_kv_cache_gb=inference.cpu_kv_cache_gb,
                **load_options_for_vllm(load_options),
            )
        )
    factories = [
        VLLMFrontend(engine, model, generate_kwargs, batch_rows, batching_timeout_s)
        for engine in engines
    ]
    return EngineSet(factories, engines)


def load_options_for_vllm(load_options: dict[str, bool] | None) -> dict[str, Any]:
    """vLLM's ``trust_remote_code`` from llmrl's load options (vLLM reads safetensors only, so
    ``allow_pickled_weights`` has nothing to switch)."""
    return {"trust_remote_code": bool((load_options or {}).get("trust_remote_code", False))}


def inference_actor_options(topology: Topology, placement: Placement) -> list[dict[str, Any]]:
    """Ray options of each inference (front) actor: its engine's first bundle, with that
    bundle's CPU (and GPU for a transformers engine on a GPU). Colocated engines share the
    trainer's bundles, so they take half of each (the trainer rank takes the other half)."""
    inference = topology.inference
    options = []
    for index in range(inference.engines):
        role = placement.inference[index]
        cpus = inference.cpus_per_engine
        gpus = 0.0
        if inference.backend == "transformers":
            gpus = float(inference.engine_gpus)
        if topology.colocated:
            cpus = topology.trainer.cpus / topology.trainer.world_size / 2
            gpus = gpus / 2
        elif inference.backend == "vllm":
            cpus = 0.0  # the VLLMEngine actor beside it holds the bundle
        options.append(
            {
                "num_cpus": _floor(cpus),
                "num_gpus": gpus,
                "scheduling_strategy": role.scheduling_strategy(0),
            }
        )
    return options


def _engine_gpu_share(topology: Topology) -> float:
    """The GPU share of a single-GPU vLLM engine: all of it, half when colocated, none for
    vLLM's CPU build."""
    if not topology.inference.engine_gpus:
        return 0.0
    return 0.5 if topology.colocated else 1.0


def _floor(amount: float) -> float:
    return int(amount * 10_000) / 10_000
