"""`TransformersWrapper`: the llmrl policy API over a Hugging Face causal LM.

Sampling runs llmrl's decode loop (:mod:`llmrl.policies.decode_loop`) on left-padded prompts,
or ``model.generate`` for the compiled static-KV decode (the default on CUDA) and for settings
the loop does not implement; both draw with llmrl's inverse-CDF sampler, and a seeded call from
a ``torch.Generator`` of its own (the global CPU and CUDA generators are left alone). The
log-prob of each sampled token is taken from the raw logits of that step (the model's own
distribution, before temperature or top-k/top-p), which is what ``generate=False`` recomputes
with one forward pass. Where the pad token is the end-of-sequence token (SmolLM2, Qwen), a
response's length comes from the first end-of-sequence it emitted (or the stop sequence it
completed); that token is kept with its log-prob, and only the positions after it are padding.

Example:
    policy = TransformersWrapper(model, tokenizer, generate_kwargs={"max_new_tokens": 32})
    out = policy(TensorDict({"history": ChatHistory(prompt=history, batch_size=[2])}, [2]))
    out["log_probs"].as_list("response")[0].shape
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from llmrl.data import pad_sequences
from llmrl.models.activation_checkpointing import uses_activation_checkpointing
from llmrl.policies import decode_loop
from llmrl.policies.base import GeneratedSample, LLMWrapperBase, ScoreResult
from llmrl.policies.chunked_log_probs import (
    DEFAULT_LOG_PROB_CHUNK_SIZE,
    forward_log_probs,
    log_probs_from_logits,
)
from llmrl.policies.generation_kwargs import GenerationKwargs
from llmrl.policies.packing import packing_problem, score_packed
from llmrl.policies.prompt_cache import shared_prompt_cache
from llmrl.policies.response_scoring import score_responses, token_log_probs
from llmrl.policies.static_decode import (
    decode_compile_config,
    resolve_compile_decode,
    static_cache_length,
    static_decode_cache,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class TransformersWrapper(LLMWrapperBase):
    """A policy over a ``transformers`` model (see :class:`LLMWrapperBase` for the arguments).

    The model is used as given: its train/eval mode and device are the caller's choice
    (trainers keep it in eval mode so sampling and training log-probs see no dropout).

    ``compile_decode=True`` samples with a static KV cache and a ``torch.compile``d decode step
    (:mod:`llmrl.policies.static_decode`): the same tokens and log-probs, faster once the
    first call has paid for compiling (logged once and kept in ``compile_seconds``).
    ``None`` (the default) turns it on for a model on CUDA, where it is several times faster,
    and off elsewhere, where the decode loop is faster.

    Scoring (``generate=False``) runs the output layer over ``log_prob_chunk_size`` positions
    at a time (:mod:`llmrl.policies.chunked_log_probs`): the fp32 ``[rows, positions, vocab]``
    logits never exist at once, in forward or backward, for one extra output-layer matmul per
    chunk in backward. ``None`` computes full logits (as ``return_logits=True`` always does).

    ``share_prompt_prefix=True`` prefills the token prefix that all prompts of a call share
    once, not once per prompt (:func:`~llmrl.policies.prompt_cache.common_prefix_cache`): for
    batches of many different prompts with one system prompt, as evaluations are (the decode
    loop's; the compiled decode and ``generate`` prefill each distinct prompt once). Off by
    default: the prefix's keys and values, computed on one row instead of N, differ in the last
    bits, so seeded samples would differ from those of earlier runs, and a GRPO step's 8
    distinct prompts (each prefilled once already) would save little.

    ``packing=True`` (the default) scores packed sequences instead of padded rows
    (:mod:`llmrl.policies.packing`): the same values to float rounding, without computing the
    padding. A model whose attention cannot pack is scored padded, with the reason logged once
    (:func:`~llmrl.policies.packing.packing_problem`); ``return_logits=True`` is always padded.
    """

    supports_early_return = True  # the decode loop; the compiled decode and generate ignore it

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        compile_decode: bool | None = None,
        log_prob_chunk_size: int | None = DEFAULT_LOG_PROB_CHUNK_SIZE,
        share_prompt_prefix: bool = False,
        packing: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, **kwargs)
        self.model = model
        self.compile_decode = compile_decode
        self.share_prompt_prefix = share_prompt_prefix
        self.packing = packing
        if log_prob_chunk_size is not None and log_prob_chunk_size < 1:
            raise ValueError(f"log_prob_chunk_size must be >= 1 or None, got {log_prob_chunk_size}")
        self.log_prob_chunk_size = log_prob_chunk_size
        self.compile_seconds: float | None = None  # the first compiled call's time, compile incl.

    def get_new_version(self, **changes: Any) -> TransformersWrapper:
        """See :meth:`LLMWrapperBase.get_new_version`; ``compile_decode``,
        ``log_prob_chunk_size``, ``share_prompt_prefix`` and ``packing`` may change too."""
        packing = changes.pop("packing", self.packing)
        compile_decode = changes.pop("compile_decode", self.compile_decode)
        chunk_size = changes.pop("log_prob_chunk_size", self.log_prob_chunk_size)
        share_prefix = changes.pop("share_prompt_prefix", self.share_prompt_prefix)
        twin = super().get_new_version(**changes)
        twin.compile_decode = compile_decode
        twin.log_prob_chunk_size = chunk_size
        twin.share_prompt_prefix = share_prefix
        twin.packing = packing
        return twin

    @property
    def eos_token_ids(self) -> set[int]:
        ids = set(super().eos_token_ids)
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if configured is not None:
            ids |= set(configured) if isinstance(configured, list) else {configured}
        return ids

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @functools.cached_property
    def _compile_config(self) -> Any:
        # one instance: generate recompiles the step whenever it is handed an unequal config
        return decode_compile_config(self.device)

    @torch.no_grad()
    def _generate(
        self,
        prompts: list[torch.Tensor],
        config: GenerationKwargs,
        stop: Callable[[torch.Tensor], bool] | None = None,
    ) -> list[GeneratedSample]:
        input_ids, attention_mask = pad_sequences(prompts, "left", self.pad_token_id)
        # A seed makes this call reproducible (same batch, same device) from a generator of its
        # own: the caller's global CPU and CUDA generators are neither reseeded nor advanced.
        generator = None
        if config.seed is not None:
            generator = torch.Generator(self.device).manual_seed(config.seed)
        return self._sample(input_ids, attention_mask, config, generator, stop)

    def _sample(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        config: GenerationKwargs,
        generator: torch.Generator | None,
        stop: Callable[[torch.Tensor], bool] | None = None,
    ) -> list[GeneratedSample]:
        # G samples per prompt as G rows (the order generate would use), so that every
        # distinct prompt is prefilled once and its KV cache shared by its rows.
        samples = config.num_return_sequences
        input_ids = input_ids.repeat_interleave(samples, 0).to(self.device)
        attention_mask = attention_mask.long().repeat_interleave(samples, 0).to(self.device)
        compiled = resolve_compile_decode(self.compile_decode, self.device)
        if compiled or not decode_loop.supports(config):
            generated, log_probs = self._generate_with_transformers(
                input_ids, attention_mask, config, generator, compiled
            )
        else:
            generated, log_probs = decode_loop.decode(
                self.model,
                input_ids,
                attention_mask,
                config,
                self.eos_token_ids,
                self.pad_token_id,
                generator,
                share_prefix=self.share_prompt_prefix,
                stop=stop,
            )
        lengths, finished = self._response_lengths(generated, config)
        return [
            GeneratedSample(
                tokens=generated[row, :length].cpu(),
                log_probs=log_probs[row, :length].cpu(),
                finished=done,
            )
            for row, (length, done) in enumerate(zip(lengths, finished, strict=True))
        ]

    def _generate_with_transformers(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        config: GenerationKwargs,
        generator: torch.Generator | None,
        compiled: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``model.generate`` on rows already repeated G times: ``[N, T]`` ids and log-probs
        (the static-KV compiled decode, and settings the decode loop does not implement).

        ``generate`` takes no generator, so it runs greedy and samples through
        :class:`~llmrl.policies.decode_loop.InverseCDFDraw`, its last logits processor (after
        ``repetition_penalty``): our draw, from ``generator``, as in the decode loop."""
        kwargs = config.replace(do_sample=False, temperature=None).to_transformers()
        kwargs.pop("num_return_sequences", None)
        if config.do_sample:
            kwargs["logits_processor"] = [decode_loop.InverseCDFDraw(config, generator)]
        if config.stop_sequences:
            kwargs["tokenizer"] = self.tokenizer
        cache = shared_prompt_cache(self.model, input_ids, attention_mask)
        if compiled:
            length = static_cache_length(input_ids.shape[1], config.max_new_tokens)
            cache = static_decode_cache(self.model, length, prefix=cache)
            kwargs["compile_config"] = self._compile_config
        if cache is not None:
            kwargs["past_key_values"] = cache
        tick = time.perf_counter()
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            pad_token_id=self.pad_token_id,
            eos_token_id=sorted(self.eos_token_ids),
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
        if compiled and self.compile_seconds is None:
            self.compile_seconds = time.perf_counter() - tick
            logger.info(
                "compiled decode: first call took %.1f s, compiling the decode step included",
                self.compile_seconds,
            )
        generated = out.sequences[:, input_ids.shape[1] :]
        return generated, _step_log_probs(out.logits, generated)

    def _score(
        self,
        sequences: list[torch.Tensor],
        return_logits: bool = False,
        prompt_lengths: list[int] | None = None,
        return_entropy: bool = False,
    ) -> ScoreResult:
        if (
            prompt_lengths is not None
            and not return_logits
            and min(prompt_lengths, default=0) > 0
            and any(len(s) > n for s, n in zip(sequences, prompt_lengths, strict=True))
        ):
            return score_responses(
                self.model,
                sequences,
                prompt_lengths,
                self.pad_token_id,
                self.device,
                log_prob_chunk_size=self.log_prob_chunk_size,
                with_entropy=return_entropy,
                # a pass that writes the shared KV cache cannot be recomputed in backward
                share_prompts=not uses_activation_checkpointing(self.model),
                packing=self._packs(),
            )
        if not return_logits and self._packs() and min(map(len, sequences), default=0) > 0:
            return score_packed(  # every token but the first: its prediction
                self.model,
                sequences,
                [1] * len(sequences),
                self.pad_token_id,
                self.device,
                log_prob_chunk_size=self.log_prob_chunk_size,
                with_entropy=return_entropy,
            )
        input_ids, mask = pad_sequences(sequences, "right", self.pad_token_id)
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": mask.long(),
            "position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0),
            "use_cache": False,  # nothing reuses it; activation checkpointing can recompute
        }
        # position t predicts token t + 1; the last position's target is a placeholder
        targets = F.pad(input_ids[:, 1:], (0, 1), value=self.pad_token_id)
        logits = None
        if return_logits:  # asked for: materialised whatever the chunk size
            logits = self.model(**inputs).logits.float()
            log_probs, entropy = log_probs_from_logits(logits, targets, return_entropy)
        else:
            log_probs, entropy = forward_log_probs(
                self.model,
                targets,
                chunk_size=self.log_prob_chunk_size,
                with_entropy=return_entropy,
                **inputs,
            )

        def per_token(values: torch.Tensor) -> torch.Tensor:  # token t's value sits at t
            values = torch.cat([values.new_zeros(len(sequences), 1), values[:, :-1]], dim=1)
            return values.masked_fill(~mask, 0.0)

        return ScoreResult(
            log_probs=per_token(log_probs),
            logits=logits,
            entropy=per_token(entropy) if entropy is not None else None,
        )

    def _packs(self) -> bool:
        """Whether scoring packs sequences: asked for, and the model can."""
        return self.packing and packing_problem(self.model) is None

    def _response_lengths(
        self, generated: torch.Tensor, config: GenerationKwargs
    ) -> tuple[list[int], list[bool]]:
        """Length of each response (through its end token) and whether it ended on its own."""
        is_eos = torch.zeros_like(generated, dtype=torch.bool)
        for token in self.eos_token_ids:
            is_eos |= generated == token
        width = generated.shape[1]
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, width).tolist()
        lengths, finished = [], []
        for row, eos_length in enumerate(first_eos):
            stop_length = self._stop_length(generated[row, :eos_length], config.stop_sequences)
            length = min(eos_length, stop_length or width)
            lengths.append(length)
            finished.append(length < width or bool(is_eos[row, length - 1]) or bool(stop_length))
        return lengths, finished

    def _stop_length(self, tokens: torch.Tensor, stop_sequences: tuple[str, ...]) -> int | None:
        """Number of tokens up to the one that completes the first stop sequence, if any."""
        if not stop_sequences:
            return None
        text = self.tokenizer.decode(tokens)
        if not any(stop in text for stop in stop_sequences):
            return None
        for length in range(1, len(tokens) + 1):
            prefix = self.tokenizer.decode(tokens[:length])
            if any(stop in prefix for stop in stop_sequences):
                return length
        return None


def _step_log_probs(step_logits: tuple[torch.Tensor, ...], generated: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` log-prob of each generated token under that step's raw logits."""
    return torch.stack(
        [token_log_probs(logits, generated[:, step]) for step, logits in enumerate(step_logits)],
        dim=1,
    )
