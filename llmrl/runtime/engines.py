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
(disaggregated) or the trainer's bundles (colocated: engines and trainer ranks share devices),
with the resources of the placement's engine role spec (:mod:`llmrl.topology.roles`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from llmrl.topology import Placement


@dataclass(frozen=True, kw_only=True)
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
        partial_rollouts: serve replies in parts (:mod:`llmrl.policies.segments`): calls carry
            the replies carried over besides a step's rows.
        segment_tokens: partial rollouts' cap on new tokens per row and call (None: none).
        lora: the trainer's LoRA shape (``LoraSettings.adapter_config()``) when pushes carry
            the adapter alone: the model is wrapped in LoRA layers of that shape, whose
            tensors each push replaces (None: pushes carry whole models).
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
    partial_rollouts: bool = False
    segment_tokens: int | None = None
    lora: dict[str, Any] | None = None

    def __call__(self) -> Any:
        from llmrl.models import load_model, load_tokenizer
        from llmrl.policies import TransformersWrapper

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.seed is not None:
            torch.manual_seed(self.seed)
        model = load_model(self.model, dtype=self.dtype, device=self.device, **self.load_options)
        if self.lora is not None:
            from llmrl.models.adapters import with_lora_adapter

            model = with_lora_adapter(model, self.lora)
        model.requires_grad_(False).eval()
        trust = self.load_options.get("trust_remote_code", False)
        return TransformersWrapper(
            model,
            load_tokenizer(self.model, trust_remote_code=trust),
            generate_kwargs=self.generate_kwargs,
            compile_decode=False if self.lora is not None else self.compile_decode,  # peft
            **batching(self.batch_rows, self.batching_timeout_s, self.partial_rollouts),
            segment_tokens=self.segment_tokens,
        )


@dataclass(frozen=True, kw_only=True)
class VLLMFrontend:
    """Builds a :class:`~llmrl.policies.vLLMWrapper` over a ``VLLMEngine`` actor (picklable)."""

    engine: Any
    tokenizer: str
    generate_kwargs: dict[str, Any]
    batch_rows: int
    batching_timeout_s: float = 0.5
    partial_rollouts: bool = False
    segment_tokens: int | None = None

    def __call__(self) -> Any:
        from llmrl.models import load_tokenizer
        from llmrl.policies import vLLMWrapper

        return vLLMWrapper(
            self.engine,
            load_tokenizer(self.tokenizer),
            generate_kwargs=self.generate_kwargs,
            **batching(self.batch_rows, self.batching_timeout_s, self.partial_rollouts),
            segment_tokens=self.segment_tokens,
        )


def batching(batch_rows: int, timeout_s: float, partial_rollouts: bool) -> dict[str, Any]:
    """An engine's request batching: one model call for a step's ``batch_rows`` rows. With
    partial rollouts each env worker keeps ``POOL_RESETS`` resets' rows in flight and tops up
    below that, so a call holds up to ``POOL_RESETS + 1`` times as many."""
    from llmrl.collectors.partial_rollouts import POOL_RESETS

    return {
        "min_batch_size": batch_rows,
        "max_batch_size": (POOL_RESETS + 1) * batch_rows if partial_rollouts else batch_rows,
        "batching_timeout": timeout_s,
    }


@dataclass(kw_only=True)
class EngineSet:
    """The policy factory of each inference actor, and the vLLM engine actors behind them (the
    targets of NCCL weight broadcasts; empty for the transformers backend)."""

    factories: list[Any]
    vllm_engines: list[Any] = field(default_factory=list)


def start_engines(
    *,
    placement: Placement,
    model: str,
    dtype: str,
    generate_kwargs: dict[str, Any],
    batch_rows: int,
    batching_timeout_s: float = 0.5,
    threads: int | None = None,
    runtime_env: dict[str, Any] | None = None,
    seed: int | None = None,
    compile_decode: bool | None = None,
    load_options: dict[str, bool] | None = None,
    partial_rollouts: bool = False,
    segment_tokens: int | None = None,
    weight_backend: str = "llmrl_file",
    lora: dict[str, Any] | None = None,
) -> EngineSet:
    """The engines of ``placement.specs.inference``: factories for the inference actors and,
    with vLLM, the ``VLLMEngine`` actors themselves, started on the engines' bundles. Engine
    ``i`` samples with seed ``seed + i`` (None: unseeded); transformers engines use the
    compiled decode when ``compile_decode`` (None: the engines on a GPU do); with
    ``partial_rollouts`` they serve replies in parts, at most ``segment_tokens`` at a time;
    vLLM engines take weights through vLLM's ``weight_backend``
    (:func:`~llmrl.transports.selection.engine_weight_backend`); with ``lora`` (the trainer's
    LoRA shape, ``lora.sync: adapter``) every engine serves the base with a LoRA adapter that
    pushes replace."""
    engines = placement.specs.inference

    def engine_seed(index: int) -> int | None:
        return None if seed is None else seed + index

    if engines.backend == "transformers":
        factories = [
            TransformersEngine(
                model=model,
                dtype=dtype,
                device=engines.device,
                generate_kwargs=generate_kwargs,
                batch_rows=batch_rows,
                batching_timeout_s=batching_timeout_s,
                threads=threads,
                seed=engine_seed(index),
                compile_decode=compile_decode,
                load_options=dict(load_options or {}),
                partial_rollouts=partial_rollouts,
                segment_tokens=segment_tokens,
                lora=lora,
            )
            for index in range(engines.count)
        ]
        return EngineSet(factories=factories)
    servers = [
        _start_vllm_engine(
            placement,
            index,
            model=model,
            dtype=dtype,
            seed=engine_seed(index),
            runtime_env=runtime_env,
            load_options=load_options,
            weight_backend=weight_backend,
            lora=lora,
        )
        for index in range(engines.count)
    ]
    factories = [
        VLLMFrontend(
            engine=server,
            tokenizer=model,
            generate_kwargs=generate_kwargs,
            batch_rows=batch_rows,
            batching_timeout_s=batching_timeout_s,
            partial_rollouts=partial_rollouts,
            segment_tokens=segment_tokens,
        )
        for server in servers
    ]
    return EngineSet(factories=factories, vllm_engines=servers)


def _start_vllm_engine(
    placement: Placement,
    index: int,
    *,
    model: str,
    dtype: str,
    seed: int | None,
    runtime_env: dict[str, Any] | None,
    load_options: dict[str, bool] | None,
    weight_backend: str = "llmrl_file",
    lora: dict[str, Any] | None = None,
) -> Any:
    """The ``VLLMEngine`` actor of engine ``index`` on its first bundle (tensor parallel:
    vLLM's Ray executor puts one worker on each bundle of the engine's group); colocated, with
    vLLM's sleep mode (:mod:`llmrl.runtime.colocation`); with ``lora``, serving LoRA adapters
    of that shape."""
    import ray

    from llmrl.policies.vllm_engine import VLLMEngine
    from llmrl.policies.vllm_lora import lora_engine_options

    engines, inference = placement.specs.inference, placement.topology.inference
    options: dict[str, Any] = {
        "num_cpus": 0,
        "num_gpus": engines.server_gpus,
        "scheduling_strategy": placement.inference[index].scheduling_strategy(0),
    }
    if runtime_env:
        options["runtime_env"] = runtime_env
    return (
        ray.remote(VLLMEngine)
        .options(**options)
        .remote(
            model,
            tensor_parallel_size=engines.tensor_parallel_size,
            gpu_memory_utilization=inference.gpu_memory_utilization,
            dtype=dtype,
            seed=seed or 0,
            enforce_eager=inference.enforce_eager,
            cpu_kv_cache_gb=inference.cpu_kv_cache_gb,
            weight_backend=weight_backend,
            enable_sleep_mode=placement.topology.colocated,  # asleep while the ranks train
            **load_options_for_vllm(load_options),
            **({} if lora is None else lora_engine_options(lora["r"], lora["target_modules"])),
        )
    )


def load_options_for_vllm(load_options: dict[str, bool] | None) -> dict[str, Any]:
    """vLLM's ``trust_remote_code`` from llmrl's load options (vLLM reads safetensors only, so
    ``allow_pickled_weights`` has nothing to switch)."""
    return {"trust_remote_code": bool((load_options or {}).get("trust_remote_code", False))}


def inference_actor_options(placement: Placement) -> list[dict[str, Any]]:
    """Ray options of each inference (front) actor: its engine's first bundle, with the
    resources its role spec gives it (:class:`~llmrl.topology.roles.EngineRole`: that bundle's
    CPU, and GPU for a transformers engine on a GPU; colocated, half of a trainer rank's share)."""
    engines = placement.specs.inference
    return [engines.actor_options(role.scheduling_strategy(0)) for role in placement.inference]
