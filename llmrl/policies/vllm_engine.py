"""`VLLMEngine`: one ``vllm.LLM`` behind methods that take and return plain Python data.

Because every method speaks lists, floats and bools (never vLLM objects), the same class runs
in-process or as a Ray actor: :func:`create_ray_engines` starts ``ray.remote(VLLMEngine)`` actors,
each on its own placement group of GPUs, and :class:`~llmrl.policies.vllm_wrapper.vLLMWrapper`
drives either kind.

Log-probs are the model's raw ones (vLLM's default ``logprobs_mode="raw_logprobs"``: before
temperature, top-k/top-p or penalties), the same quantity the transformers backend reports.

Example:
    engine = VLLMEngine("smollm2-135m-instruct", gpu_memory_utilization=0.3)
    [[(tokens, log_probs, finished)]] = engine.generate(
        [[1, 9690, 198]], {"max_tokens": 8, "n": 1, "temperature": 1.0}, True
    )
    engine.prompt_log_probs([[1, 9690, 198]])  # [[0.0, lp(9690 | 1), lp(198 | 1 9690)]]
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from llmrl.core.errors import MissingExtraError
from llmrl.core.weights_checksum import combine_entries, verify_checksum
from llmrl.data.sources import sha256_file
from llmrl.policies import vllm_file_transfer
from llmrl.policies.vllm_worker_extension import WORKER_EXTENSION

if TYPE_CHECKING:
    import ray.actor
    import vllm

logger = logging.getLogger(__name__)

Sample = tuple[list[int], list[float] | None, bool]
"""One sampled response as plain data: token ids, their log-probs, whether it ended itself."""

CPU_KV_CACHE_VARIABLE = "VLLM_CPU_KVCACHE_SPACE"
"""vLLM's CPU build sizes its KV cache from this variable (whole GiB: ``int()`` of it), else
from ``kv_cache_memory_bytes``; with neither it takes most of the machine (20 of 24 GiB here),
and the first weight update is OOM-killed."""


class VLLMEngine:
    """One vLLM engine (``vllm.LLM``) in this process, with a plain-data API.

    Args:
        model: a model spec (a known llmrl name, a local model directory, a GGUF file or a hub
            id); known names and GGUF files are converted to a safetensors directory first.
        tensor_parallel_size: GPUs the model is split over; above 1 the workers are Ray actors
            (``distributed_executor_backend="ray"``).
        gpu_memory_utilization: share of each GPU vLLM may take (weights + KV cache).
        dtype: ``"auto"`` (from the checkpoint), ``"bfloat16"``, ``"float32"``...
        seed: the engine's base seed.
        enable_prefix_caching: reuse the KV cache of shared prompt prefixes (GRPO groups).
        max_model_len: longest prompt + response; None takes the model's own limit.
        enforce_eager: run without torch.compile and CUDA graphs; None: eager on vLLM's CPU
            build (starts in about 40 s instead of 80 s on 2 cores), compiled on GPUs.
        cpu_kv_cache_gb: KV cache of an engine on vLLM's CPU build, in GiB, fractions too
            (vLLM's ``kv_cache_memory_bytes``; ``VLLM_CPU_KVCACHE_SPACE``, when set, wins);
            ignored on GPUs.
        **engine_kwargs: any other ``vllm.LLM`` argument (they override the ones above).

    Raises:
        MissingExtraError: vLLM is not installed (``pip install 'llmrl[gpu]'``).

    Example:
        engine = VLLMEngine("smollm2-135m-instruct", dtype="float32")
        engine.load_weights(trainer_model.state_dict().items(), version=1)
        engine.weight_version()
        # -> '1'
    """

    def __init__(
        self,
        model: str | Path,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        dtype: str = "auto",
        seed: int = 0,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        cpu_kv_cache_gb: float = 1.0,
        **engine_kwargs: Any,
    ) -> None:
        vllm = import_vllm()
        vllm_file_transfer.register()
        self.on_cpu = vllm_on_cpu()
        if enforce_eager is None:
            enforce_eager = self.on_cpu
        options: dict[str, Any] = {
            "model": _model_location(model),
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "dtype": dtype,
            "seed": seed,
            "enable_prefix_caching": enable_prefix_caching,
            "max_model_len": max_model_len,
            "enforce_eager": enforce_eager,
            "worker_extension_cls": WORKER_EXTENSION,
            # weight updates through vLLM's weight-transfer API (llmrl/policies/vllm_file_transfer)
            "weight_transfer_config": {"backend": vllm_file_transfer.BACKEND},
        }
        if self.on_cpu and not os.environ.get(CPU_KV_CACHE_VARIABLE):
            # bytes, not the variable: vLLM reads it as whole GiB (int("0.5") fails), and a
            # variable set by one engine would size every later engine of this process
            options["kv_cache_memory_bytes"] = int(cpu_kv_cache_gb * 2**30)
        if tensor_parallel_size > 1:
            options["distributed_executor_backend"] = "ray"
        options.update(engine_kwargs)
        if options.get("distributed_executor_backend") == "ray" and _inside_ray_actor():
            # Ray hides every GPU from an actor that asked for none (CUDA_VISIBLE_DEVICES="");
            # vLLM's Ray executor places its own workers on the placement group's GPUs.
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        self.model = str(options["model"])
        self.llm: vllm.LLM = vllm.LLM(**options)
        self.weight_folder: str | None = None
        self._broadcast_entries: list[tuple[str, str, tuple[int, ...], int]] = []
        self.broadcast_version: int | None = None

    @classmethod
    def from_llm(cls, llm: vllm.LLM) -> VLLMEngine:
        """Wrap an existing ``vllm.LLM``.

        Generation and scoring work with any ``LLM``; :meth:`load_weights` needs it built with
        ``weight_transfer_config={"backend": vllm_file_transfer.BACKEND}``, the NCCL methods
        with ``worker_extension_cls=WORKER_EXTENSION``.
        """
        engine = cls.__new__(cls)
        engine.llm = llm
        engine.on_cpu = vllm_on_cpu()
        engine.weight_folder = None
        engine._broadcast_entries, engine.broadcast_version = [], None
        config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        engine.model = str(getattr(config, "model", "vllm.LLM"))
        return engine

    # ------------------------------------------------------------------ inference
    def generate(
        self,
        prompts: list[list[int]],
        sampling: dict[str, Any],
        return_log_probs: bool = True,
        seeds: list[int] | None = None,
    ) -> list[list[Sample]]:
        """Sample ``sampling["n"]`` responses for each prompt of token ids.

        Args:
            prompts: token ids of each prompt.
            sampling: ``vllm.SamplingParams`` keyword arguments (``GenerationKwargs.to_vllm()``).
            return_log_probs: also return each sampled token's log-prob.
            seeds: one seed per prompt (overrides ``sampling["seed"]``), so repeated prompts
                draw different samples.

        Returns:
            Per prompt, its samples in order: ``(token ids, log-probs or None, finished)``;
            ``finished`` is True when vLLM stopped on an end-of-sequence token or a stop
            sequence (``finish_reason == "stop"``), False when it hit ``max_tokens``.
        """
        if not prompts:
            return []
        from vllm import SamplingParams

        # logprobs=0: only the sampled token's log-prob, not a top-k list.
        base = {**sampling, "logprobs": 0 if return_log_probs else None}
        params: Any = SamplingParams(**base)
        if seeds is not None:
            params = [SamplingParams(**{**base, "seed": seed}) for seed in seeds]
        outputs = self.llm.generate(_token_prompts(prompts), params, use_tqdm=False)
        results = []
        for request in outputs:
            samples = []
            for completion in sorted(request.outputs, key=lambda c: c.index):
                tokens = [int(t) for t in completion.token_ids]
                log_probs = (
                    _sampled_log_probs(tokens, completion.logprobs) if return_log_probs else None
                )
                samples.append((tokens, log_probs, completion.finish_reason == "stop"))
            results.append(samples)
        return results

    def prompt_log_probs(self, sequences: list[list[int]]) -> list[list[float]]:
        """Log-prob of every token of each sequence given the tokens before it.

        One prefill per sequence (vLLM's ``prompt_logprobs``); position 0 has no context and
        holds 0.0. Inference only: no gradient flows back (train on the transformers backend).
        """
        kept = [i for i, sequence in enumerate(sequences) if sequence]
        results: list[list[float]] = [[] for _ in sequences]
        if not kept:
            return results
        from vllm import SamplingParams

        # temperature 1: prompt log-probs are the raw distribution whatever vLLM's version does
        # with sampling transforms; the one token sampled is thrown away.
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        outputs = self.llm.generate(
            _token_prompts([sequences[i] for i in kept]), params, use_tqdm=False
        )
        for index, request in zip(kept, outputs, strict=True):
            results[index] = _prompt_log_probs(sequences[index], request.prompt_logprobs)
        return results

    # ------------------------------------------------------------------ weights
    def load_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        checksum: str | None = None,
    ) -> int:
        """Load ``(name, tensor)`` pairs (Hugging Face names, any subset of the model) through
        vLLM's weight-transfer API, then drop the prefix cache (its KV entries were computed
        with the old weights); the bytes written.

        With ``checksum`` (the sender's :func:`~llmrl.core.weights_checksum.weights_checksum`)
        the tensors are checked first and refused on a mismatch
        (:class:`~llmrl.core.weights_checksum.WeightChecksumError`, the model untouched). They
        go into a safetensors file on this node (``/dev/shm`` when there is one) that every
        worker reads onto its device and checks against its SHA-256; ``version`` becomes the
        engine's :meth:`weight_version`.
        """
        named_tensors = list(named_tensors)
        if checksum is not None:
            verify_checksum(dict(named_tensors), checksum, f"vLLM engine {self.model!r}")
        path = vllm_file_transfer.write_weights(named_tensors, self.weight_folder)
        try:
            update = {"path": str(path), "sha256": sha256_file(path)}
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": update})
            self.llm.finish_weight_update(
                weight_version=None if version is None else str(int(version))
            )
            return path.stat().st_size
        finally:
            path.unlink(missing_ok=True)
            self.reset_prefix_cache()

    def weight_version(self) -> str | None:
        """The version given to the last :meth:`load_weights` (None before any)."""
        return self.llm.get_weight_version()

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (needed after a weight update: a resumed reply's
        prompt + prefix would otherwise read KV computed with the old weights).

        Raises:
            RuntimeError: vLLM kept its cache (it refuses while requests hold blocks).
        """
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError(
                f"vLLM engine {self.model!r} could not drop its prefix cache (requests still "
                "running?): its cached KV predates the weights now loaded"
            )

    def init_weight_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int
    ) -> None:
        """Have every worker join the trainer's NCCL group (see the worker extension).

        Returns once every member has joined, the trainer included: call it on a Ray actor
        (``engine.init_weight_update_group.remote(...)``) or from another thread, then join the
        group in the trainer.
        """
        self.llm.collective_rpc(
            "init_weight_update_group", args=(master_address, master_port, rank_offset, world_size)
        )

    def update_weight_from_broadcast(
        self, name: str, dtype_name: str, shape: list[int], fingerprint: int | None = None
    ) -> None:
        """Have every worker receive one tensor broadcast by the trainer, check it against
        ``fingerprint`` (:func:`~llmrl.core.weights_checksum.tensor_fingerprint`; a mismatch
        is refused) and load it (returns after the trainer's matching ``broadcast``, so call it
        like :meth:`init_weight_update_group`)."""
        self.llm.collective_rpc(
            "update_weight_from_broadcast", args=(name, dtype_name, list(shape), fingerprint)
        )
        if fingerprint is not None:
            self._broadcast_entries.append((name, dtype_name, tuple(shape), int(fingerprint)))

    def finish_broadcast_update(self, version: int | None = None) -> str:
        """End a broadcast update: drop the prefix cache and return the checksum of the
        tensors received since the last one, as their fingerprints were checked
        (:func:`~llmrl.core.weights_checksum.combine_entries`)."""
        entries, self._broadcast_entries = self._broadcast_entries, []
        self.reset_prefix_cache()
        self.broadcast_version = version
        return combine_entries(entries)

    def close(self) -> None:
        """Stop the engine's processes (its engine core and workers); the engine is unusable
        afterwards."""
        self.llm.llm_engine.engine_core.shutdown()

    def __repr__(self) -> str:
        return f"VLLMEngine({self.model!r})"


def create_ray_engines(
    model: str | Path,
    num_engines: int,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.5,
    placement_timeout: float = 120.0,
    **engine_kwargs: Any,
) -> list[ray.actor.ActorHandle]:
    """Start ``num_engines`` :class:`VLLMEngine` Ray actors, each on its own GPUs.

    Each engine gets a placement group of ``tensor_parallel_size`` bundles of one GPU and one
    CPU (``PACK``: on one node when possible). With one GPU the actor holds that GPU itself;
    with more, the actor holds none and vLLM's Ray executor puts one worker on each bundle.
    Ray is started (``ray.init()``) when it is not running yet.

    Raises:
        RuntimeError: the cluster cannot place an engine within ``placement_timeout`` seconds
            (the message says how many GPUs were asked for and how many the cluster has).
        MissingExtraError: Ray is not installed.

    Example:
        engines = create_ray_engines("smollm2-135m-instruct", num_engines=2)
        policy = vLLMWrapper(engines, tokenizer)
    """
    if num_engines < 1 or tensor_parallel_size < 1:
        raise ValueError(
            f"num_engines and tensor_parallel_size must be >= 1, got {num_engines} and "
            f"{tensor_parallel_size}"
        )
    try:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    except ImportError as error:
        raise MissingExtraError("ray", "local", "Running vLLM engines as Ray actors") from error
    if not ray.is_initialized():
        ray.init()

    actor_class = ray.remote(VLLMEngine)
    groups, engines = [], []
    for index in range(num_engines):
        group = placement_group([{"GPU": 1, "CPU": 1}] * tensor_parallel_size, strategy="PACK")
        groups.append(group)
        ready, _ = ray.wait([group.ready()], timeout=placement_timeout)
        if not ready:
            for created in groups:
                remove_placement_group(created)
            total = ray.cluster_resources().get("GPU", 0)
            free = ray.available_resources().get("GPU", 0)
            raise RuntimeError(
                f"could not place vLLM engine {index + 1}/{num_engines} within "
                f"{placement_timeout:.0f} s: it needs {tensor_parallel_size} GPU(s) "
                f"({num_engines * tensor_parallel_size} GPU(s) for all {num_engines} engines), "
                f"the Ray cluster has {total:g} GPU(s), {free:g} free"
            )
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=group,
            placement_group_bundle_index=0,
            placement_group_capture_child_tasks=True,
        )
        engines.append(
            actor_class.options(
                num_cpus=1,
                num_gpus=1 if tensor_parallel_size == 1 else 0,
                scheduling_strategy=strategy,
            ).remote(
                model,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                **engine_kwargs,
            )
        )
    return engines


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is its CPU build (``vllm-cpu``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def import_vllm() -> Any:
    """The ``vllm`` module, or :class:`MissingExtraError` naming the ``gpu`` extra."""
    try:
        import vllm
    except ImportError as error:
        raise MissingExtraError("vllm", "gpu", "The vLLM backend") from error
    return vllm


def _model_location(model: str | Path) -> str:
    """What vLLM should load for a model spec: a directory or a hub id (GGUF converted)."""
    from llmrl.models import ensure_converted, resolve_spec

    source = resolve_spec(model)
    if source.kind == "gguf":
        return str(ensure_converted(source.location))
    return source.location


def _token_prompts(prompts: Sequence[Sequence[int]]) -> list[dict[str, list[int]]]:
    # vllm.inputs.TokensPrompt is a TypedDict: a plain dict is the same thing.
    return [{"prompt_token_ids": [int(t) for t in prompt]} for prompt in prompts]


def _sampled_log_probs(tokens: list[int], step_log_probs: Any) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-step ``{token id: Logprob}``."""
    if step_log_probs is None or len(step_log_probs) != len(tokens):
        got = None if step_log_probs is None else len(step_log_probs)
        raise RuntimeError(f"vLLM returned {got} log-prob steps for {len(tokens)} sampled tokens")
    return [float(step_log_probs[i][token].logprob) for i, token in enumerate(tokens)]


def _prompt_log_probs(sequence: list[int], prompt_log_probs: Any) -> list[float]:
    """``[0.0, lp(t1 | t0), ...]`` from vLLM's ``prompt_logprobs`` (its first entry is None)."""
    if prompt_log_probs is None or len(prompt_log_probs) != len(sequence):
        got = None if prompt_log_probs is None else len(prompt_log_probs)
        raise RuntimeError(f"vLLM returned {got} prompt log-probs for {len(sequence)} tokens")
    return [0.0] + [
        float(prompt_log_probs[i][token].logprob) for i, token in enumerate(sequence) if i > 0
    ]


def _inside_ray_actor() -> bool:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None
