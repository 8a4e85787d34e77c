"""`vLLMWrapper`: the llmrl policy API over one or more vLLM engines.

A batch is split into contiguous chunks, one per engine, in order; Ray engines work on their
chunks in parallel and the answers are put back in the batch's order, so ``out[b]`` is always
the group of samples of prompt ``b`` whatever engine served it. Engines can be
:class:`~llmrl.policies.vllm_engine.VLLMEngine` objects in this process, Ray actors of it
(``ray.remote(VLLMEngine)``, as the GRPO runtime starts them) or any object with the same plain-data
``generate`` / ``prompt_log_probs`` methods.

Sampling log-probs are the model's raw ones (before temperature or top-k/top-p), like the
transformers backend's. Scoring (``generate=False``) runs vLLM's ``prompt_logprobs``: inference
only, without autograd, so use it for reference or behaviour log-probs and compute the training
loss with :class:`~llmrl.policies.TransformersWrapper`. vLLM handles end-of-sequence and stop
sequences itself; a response is ``finished`` when vLLM's ``finish_reason`` is ``"stop"``.

Example:
    policy = vLLMWrapper("smollm2-135m-instruct", tokenizer, num_samples=4,
                         generate_kwargs={"max_new_tokens": 64})
    out = policy(history_batch)  # [B, 4]
    policy.load_weights(trainer_model.state_dict().items())  # after an optimizer step
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from llmrl.policies.base import GeneratedSample, LLMWrapperBase, ScoreResult
from llmrl.policies.generation_kwargs import GenerationKwargs
from llmrl.policies.remote_vllm import URL_SCHEMES, RemoteVLLMEngine
from llmrl.policies.vllm_engine import VLLMEngine

if TYPE_CHECKING:
    import vllm
    from transformers import PreTrainedTokenizerBase

EngineLike = Any
"""A :class:`VLLMEngine`, a Ray actor handle of one, or an object with the same methods."""

_ENGINE_METHODS = ("generate", "prompt_log_probs")


class vLLMWrapper(LLMWrapperBase):
    """A policy over vLLM engines (see :class:`LLMWrapperBase` for the keyword arguments).

    Args:
        engines: a model spec (one :class:`VLLMEngine` is built in this process), the URL of
            a ``vllm serve`` process (``http://host:port``: a
            :class:`~llmrl.policies.remote_vllm.RemoteVLLMEngine`), a
            :class:`VLLMEngine`, a ``vllm.LLM``, a Ray actor handle of :class:`VLLMEngine`, any
            object with ``generate`` and ``prompt_log_probs`` methods like
            :class:`VLLMEngine`'s, or a list of these (the batch is split over them).
        tokenizer: the model's tokenizer (prompts are tokenized here, vLLM gets token ids).
        **kwargs: :class:`LLMWrapperBase` settings. ``return_logits=True`` and
            ``return_entropy=True`` are refused when scoring: vLLM returns neither.

    Raises:
        MissingExtraError: a model spec was given and vLLM is not installed.

    Example:
        engines = [ray.remote(VLLMEngine).options(num_gpus=1).remote("smollm2-135m-instruct")]
        policy = vLLMWrapper(engines, tokenizer, generate_kwargs={"max_new_tokens": 64})
        ref_policy = policy.get_new_version(generate=False)  # reference log-probs
    """

    def __init__(
        self,
        engines: str | Path | EngineLike | Sequence[EngineLike],
        tokenizer: PreTrainedTokenizerBase,
        **kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, **kwargs)
        self._engines = _as_engines(engines)

    @classmethod
    def from_llm(
        cls, llm: vllm.LLM, tokenizer: PreTrainedTokenizerBase, **kwargs: Any
    ) -> vLLMWrapper:
        """A policy over an existing ``vllm.LLM`` (same as passing it as ``engines``)."""
        return cls(VLLMEngine.from_llm(llm), tokenizer, **kwargs)

    @property
    def engines(self) -> list[EngineLike]:
        """The engines the batches are split over, in order."""
        return list(self._engines)

    # ------------------------------------------------------------------ backend primitives
    def _generate(
        self, prompts: list[torch.Tensor], config: GenerationKwargs
    ) -> list[GeneratedSample]:
        group = config.num_return_sequences
        # With a seed, each prompt gets its own (seed + position): vLLM seeds requests one by
        # one, and GRPO batches repeat prompts, which must not all draw the same samples.
        seeds = None if config.seed is None else [config.seed + i for i in range(len(prompts))]
        per_prompt = self._split_call(
            "generate",
            [p.tolist() for p in prompts],
            config.to_vllm(),
            self.return_log_probs,
            seeds=seeds,
        )
        samples = []
        for index, prompt_samples in enumerate(per_prompt):
            if len(prompt_samples) != group:
                raise RuntimeError(
                    f"engine returned {len(prompt_samples)} samples for prompt {index}, "
                    f"expected {group}"
                )
            for tokens, log_probs, finished in prompt_samples:
                samples.append(
                    GeneratedSample(
                        tokens=torch.tensor(tokens, dtype=torch.long),
                        log_probs=(
                            None
                            if log_probs is None
                            else torch.tensor(log_probs, dtype=torch.float32)
                        ),
                        finished=bool(finished),
                    )
                )
        return samples

    def _score(
        self,
        sequences: list[torch.Tensor],
        return_logits: bool = False,
        prompt_lengths: list[int] | None = None,
        return_entropy: bool = False,
    ) -> ScoreResult:
        """Prompt log-probs from the engines (all positions: ``prompt_lengths`` saves nothing
        there)."""
        for name, asked in (("logits", return_logits), ("entropy", return_entropy)):
            if asked:
                raise ValueError(
                    f"vLLM does not return {name}; score with return_{name}=False, or use "
                    f"TransformersWrapper to get {name} (and gradients)"
                )
        rows = self._split_call("prompt_log_probs", [s.tolist() for s in sequences])
        width = max((len(s) for s in sequences), default=0)
        log_probs = torch.zeros(len(sequences), width, dtype=torch.float32)
        for index, (row, sequence) in enumerate(zip(rows, sequences, strict=True)):
            if len(row) != len(sequence):
                raise RuntimeError(
                    f"engine returned {len(row)} log-probs for sequence {index} of "
                    f"{len(sequence)} tokens"
                )
            log_probs[index, : len(row)] = torch.tensor(row, dtype=torch.float32)
        return ScoreResult(log_probs=log_probs)

    # ------------------------------------------------------------------ weights
    def load_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        checksum: str | None = None,
    ) -> None:
        """Push ``(name, tensor)`` pairs (Hugging Face names) into every engine, as ``version``.

        Each engine checks the tensors against ``checksum`` when given (the sender's
        :func:`~llmrl.core.weights_checksum.weights_checksum`; a mismatch is refused), loads
        them into all its workers (vLLM's weight-transfer API) and drops its prefix cache. Ray
        engines share one CPU copy put in the object store once.
        """
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        shared = None
        if any(_is_ray_actor(engine) for engine in self._engines):
            import ray

            shared = ray.put([(name, tensor.cpu()) for name, tensor in weights])
        extra = () if checksum is None else (checksum,)
        self._call_each(
            [
                (
                    engine,
                    "load_weights",
                    (shared if _is_ray_actor(engine) else weights, version, *extra),
                )
                for engine in self._engines
            ]
        )

    def reset_prefix_cache(self) -> None:
        """Drop every engine's prefix cache."""
        self._call_each([(engine, "reset_prefix_cache", ()) for engine in self._engines])

    # ------------------------------------------------------------------ internals
    def _split_call(
        self, method: str, items: list[Any], *extra: Any, seeds: list[int] | None = None
    ) -> list[Any]:
        """``engine.method(chunk, *extra)`` over contiguous chunks of ``items``, one per engine
        (in parallel for Ray engines), concatenated back in order. ``seeds`` (one per item) is
        split the same way and passed on as ``seeds=``."""
        calls = [
            (
                engine,
                method,
                (items[start:stop], *extra, *(() if seeds is None else (seeds[start:stop],))),
            )
            for engine, (start, stop) in zip(
                self._engines, split_evenly(len(items), len(self._engines)), strict=True
            )
            if stop > start
        ]
        results = []
        for (_, _, (chunk, *_)), answer in zip(calls, self._call_each(calls), strict=True):
            if len(answer) != len(chunk):
                raise RuntimeError(f"engine {method} returned {len(answer)} rows for {len(chunk)}")
            results.extend(answer)
        return results

    def _call_each(self, calls: list[tuple[EngineLike, str, tuple]]) -> list[Any]:
        """Run ``engine.method(*args)`` for each call: Ray ones submitted first, so they run
        while the local ones do, then gathered."""
        refs = {
            index: getattr(engine, method).remote(*args)
            for index, (engine, method, args) in enumerate(calls)
            if _is_ray_actor(engine)
        }
        results: list[Any] = [None] * len(calls)
        for index, (engine, method, args) in enumerate(calls):
            if index not in refs:
                results[index] = getattr(engine, method)(*args)
        if refs:
            import ray

            for index, value in zip(refs, ray.get(list(refs.values())), strict=True):
                results[index] = value
        return results


def split_evenly(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``(start, stop)`` ranges covering ``range(count)``, sizes differing
    by at most one (the first ones are the larger)."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for part in range(parts):
        stop = start + base + (1 if part < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _as_engines(engines: Any) -> list[EngineLike]:
    items = list(engines) if isinstance(engines, (list, tuple)) else [engines]
    if not items:
        raise ValueError("vLLMWrapper needs at least one engine")
    return [_as_engine(engine) for engine in items]


def _as_engine(engine: Any) -> EngineLike:
    if isinstance(engine, str) and engine.startswith(URL_SCHEMES):
        return RemoteVLLMEngine(engine)
    if isinstance(engine, (str, Path)):
        return VLLMEngine(engine)
    if _is_ray_actor(engine):
        return engine
    vllm = sys.modules.get("vllm")
    if vllm is not None and isinstance(engine, vllm.LLM):
        return VLLMEngine.from_llm(engine)
    if all(callable(getattr(engine, name, None)) for name in _ENGINE_METHODS):
        return engine
    raise TypeError(
        "vLLMWrapper engines must be a model spec, a server URL, a VLLMEngine, a vllm.LLM, a "
        "Ray actor of "
        f"VLLMEngine or an object with {' and '.join(_ENGINE_METHODS)} methods; got "
        f"{type(engine).__name__}"
    )


def _is_ray_actor(engine: Any) -> bool:
    # A Ray actor handle can only exist once ray is imported: no import needed to check.
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(engine, ray.actor.ActorHandle)
