"""`LLMWrapperBase`: one TensorDict-in, TensorDict-out API over any LLM backend.

A backend implements two primitives on token ids and nothing else:

- :meth:`LLMWrapperBase._generate`: sample responses for prompts, with the log-prob of every
  sampled token under the model (temperature 1, before any sampling transform);
- :meth:`LLMWrapperBase._score`: log-probs of given sequences (one forward pass).

Everything else lives here, so every backend behaves the same: reading prompts in ``history``,
``text`` or ``tokens`` mode, chat templating, ``num_samples`` groups, the output containers and
their padding, request batching, and ``get_new_version``.

Output keys (configurable): ``history`` (:class:`ChatHistory`, history mode), ``text``
(:class:`Text`), ``tokens`` (:class:`Tokens`), ``masks`` (:class:`Masks`), ``log_probs``
(:class:`LogProbs`). With ``num_samples=G`` a batch ``[B]`` becomes ``[B, G]``: ``out[b]`` is
the group of G responses to prompt ``b``, and every input entry is repeated along the new dim.
Scoring writes ``logits`` and ``entropy`` too when asked (``return_logits``, ``return_entropy``).
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from llmrl.data import ChatFormat
from llmrl.data.non_tensor import as_list
from llmrl.policies.batching import RequestBatcher
from llmrl.policies.generation_kwargs import GenerationKwargs, GenerationKwargsError
from llmrl.policies.io_spec import (
    INPUT_MODES,
    GeneratedSample,
    InputMode,
    PolicyIOSpec,
    ScoreResult,
    check_input_mode,
    default_input_key,
    tokenizer_eos_ids,
    tokenizer_pad_id,
)
from llmrl.policies.policy_inputs import read_inputs
from llmrl.policies.policy_outputs import write_outputs
from llmrl.policies.segments import (
    EMPTY,
    PARTIAL_KEY,
    REQUEST_KEYS,
    align_prefixes,
    continuation_prompts,
    early_return,
    join_segments,
    read_prefixes,
    segment_config,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["INPUT_MODES", "GeneratedSample", "InputMode", "LLMWrapperBase", "ScoreResult"]


class LLMWrapperBase(ABC):
    """Common API of llmrl policies (see the module docstring).

    Args:
        tokenizer: the model's tokenizer.
        input_mode: ``history`` (chat :class:`History`), ``text`` (strings) or ``tokens``.
        input_key: where to read the input; default ``(<mode key>, "prompt")`` when generating
            and ``(<mode key>, "full")`` when scoring.
        generate: True samples a response; False scores the given full sequence.
        generate_kwargs: generation settings (see :class:`GenerationKwargs`).
        return_log_probs: write :class:`LogProbs` into the output.
        return_logits: when scoring, also write the ``logits`` (large: ``[L, vocab]`` a row).
        return_entropy: when scoring, also write ``entropy``: per token, the entropy of the
            distribution it was drawn from, laid out like ``log_probs`` (the same container
            type and fields; 0 at each row's first token, and at prompt tokens when only
            responses are scored). Cheaper than ``return_logits`` for an entropy bonus: a
            backend may compute it without materialising the logits.
        score_responses_only: when scoring rows whose prompt is known (``prompt`` next to
            ``full``), compute log-probs of the response tokens only; prompt positions hold 0.
            A backend may then skip the output layer over prompt tokens (losses that train on
            responses only need nothing else). Ignored with ``return_logits``.
        pad_output: padded ``[.., L]`` containers with :class:`Masks` instead of ragged rows.
        num_samples: responses per prompt (G); default ``generate_kwargs["n"]`` or 1.
        chat_template: None (the tokenizer's template) or a built-in format name.
        min_batch_size, max_batch_size, batching_timeout: when a batch size is given, calls from
            many threads are served together in batches of that many rows (a call of a batch
            ``[B]`` counts B; see :class:`RequestBatcher`).
        segment_tokens: decode at most this many new tokens per row and call; a row whose
            reply goes on comes back ``partial`` and is resumed from its prefix by the next
            call that attaches it (:mod:`llmrl.policies.segments`). None: whole replies.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        input_mode: InputMode = "history",
        input_key: str | tuple[str, ...] | None = None,
        generate: bool = True,
        generate_kwargs: dict[str, Any] | None = None,
        return_log_probs: bool = True,
        return_logits: bool = False,
        return_entropy: bool = False,
        score_responses_only: bool = False,
        pad_output: bool = False,
        num_samples: int | None = None,
        chat_template: str | ChatFormat | None = None,
        history_key: str = "history",
        text_key: str = "text",
        tokens_key: str = "tokens",
        masks_key: str = "masks",
        log_probs_key: str = "log_probs",
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        batching_timeout: float = 0.05,
        segment_tokens: int | None = None,
    ) -> None:
        check_input_mode(input_mode)
        if segment_tokens is not None and segment_tokens < 1:
            raise ValueError(f"segment_tokens must be >= 1 or None, got {segment_tokens}")
        # Kept as given, so get_new_version can rebuild the settings with some changed.
        self._settings = {
            name: value for name, value in locals().items() if name not in ("self", "tokenizer")
        }
        self.tokenizer = tokenizer
        self.input_mode = input_mode
        self.generate = generate
        self.return_log_probs = return_log_probs
        self.return_logits = return_logits
        self.return_entropy = return_entropy
        self.score_responses_only = score_responses_only
        self.pad_output = pad_output
        self.chat_template = chat_template
        self.segment_tokens = segment_tokens
        self.keys = {
            "history": history_key,
            "text": text_key,
            "tokens": tokens_key,
            "masks": masks_key,
            "log_probs": log_probs_key,
        }
        self.input_key = input_key or default_input_key(self.keys, input_mode, generate)
        self.generate_kwargs = _merge_num_samples(generate_kwargs, num_samples)
        self.batching = {
            "min_batch_size": min_batch_size or 1,
            "max_batch_size": max_batch_size or max(min_batch_size or 1, 32),
            "timeout": batching_timeout,
        }
        self._batcher: RequestBatcher | None = None
        if min_batch_size is not None or max_batch_size is not None:
            self._batcher = RequestBatcher(self._forward_many, **self.batching, size=_request_rows)

    @property
    def num_samples(self) -> int:
        """Responses sampled per prompt (G)."""
        return self.generate_kwargs.num_return_sequences

    @property
    def pad_token_id(self) -> int:
        """Id used to pad token outputs (the tokenizer's pad, else its EOS)."""
        return tokenizer_pad_id(self.tokenizer)

    @property
    def eos_token_ids(self) -> set[int]:
        """Token ids that end a response."""
        return tokenizer_eos_ids(self.tokenizer)

    @property
    def io_spec(self) -> PolicyIOSpec:
        """The settings this policy's inputs are read and outputs written with: each field is
        the policy's attribute of that name, but ``skip_special_tokens`` (a generation setting).

        Built anew on each access (a few attribute reads), so it follows settings changed
        after construction, such as a tokenizer swapped in by ``SFTLoss``."""
        settings = {
            spec_field.name: getattr(self, spec_field.name)
            for spec_field in dataclasses.fields(PolicyIOSpec)
            if spec_field.name != "skip_special_tokens"
        }
        return PolicyIOSpec(
            **settings, skip_special_tokens=self.generate_kwargs.skip_special_tokens
        )

    def decode_response(self, sample: GeneratedSample, content_only: bool = False) -> str:
        """Text of a sampled response; ``content_only`` drops a final end-of-sequence token
        (the message content of a chat reply)."""
        return self.io_spec.decode_response(sample, content_only=content_only)

    # ------------------------------------------------------------------ backend primitives
    @abstractmethod
    def _generate(
        self, prompts: list[torch.Tensor], config: GenerationKwargs
    ) -> list[GeneratedSample]:
        """Sample ``config.num_return_sequences`` responses per prompt, grouped by prompt
        (prompt 0's samples first)."""

    @abstractmethod
    def _score(
        self,
        sequences: list[torch.Tensor],
        return_logits: bool = False,
        prompt_lengths: list[int] | None = None,
        return_entropy: bool = False,
    ) -> ScoreResult:
        """Log-probs of each sequence, right-padded ``[N, L]`` (position 0 holds 0), and the
        logits or per-token entropies when asked.

        With ``prompt_lengths``, only positions from each row's prompt length on are needed;
        a backend may leave the others 0."""

    # ------------------------------------------------------------------ public API
    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        """Run the policy on a batch ``[B]`` (or a single row ``[]``)."""
        if self._batcher is not None:
            return self._batcher(td)
        return self.forward(td)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Run the policy now, bypassing request batching."""
        single = td.batch_dims == 0
        batch = td.unsqueeze(0) if single else td
        if batch.batch_dims != 1:
            raise ValueError(f"policies take a batch [B] or a row []; got {list(td.batch_size)}")
        spec = self.io_spec
        inputs = read_inputs(spec, batch)
        if spec.generate:
            samples, partial = self._sample_replies(inputs.prompt_tokens, batch)
            out = write_outputs(spec, batch, inputs, samples=samples)
            if partial is not None:
                out = out.exclude(*REQUEST_KEYS).set(PARTIAL_KEY, torch.tensor(partial))
        else:
            responses_only = (
                self.score_responses_only
                and not self.return_logits
                and inputs.prompt_tokens is not None
            )
            scores = self._score(
                inputs.full_tokens,
                return_logits=self.return_logits,
                prompt_lengths=[len(p) for p in inputs.prompt_tokens] if responses_only else None,
                return_entropy=self.return_entropy,
            )
            out = write_outputs(spec, batch, inputs, scores=scores)
        return out[0] if single else out

    supports_early_return = False
    """Whether :meth:`_generate` takes ``stop`` (a backend that can return between decode
    steps; :mod:`llmrl.policies.segments`)."""

    def _sample_replies(
        self, prompts: list[torch.Tensor], batch: TensorDictBase
    ) -> tuple[list[GeneratedSample], list[bool] | None]:
        """Whole replies; or, segmented (``segment_tokens`` set, or prefixes attached to
        ``batch``), the next segment of each row's reply joined to its prefix, and which rows
        go on."""
        config, prefixes = self.generate_kwargs, read_prefixes(batch)
        if self.segment_tokens is None and prefixes is None:
            return self._generate(prompts, config), None
        prefixes = prefixes or [EMPTY] * len(prompts)
        segment = segment_config(config, prefixes, self.segment_tokens or config.max_new_tokens)
        continued = continuation_prompts(prompts, prefixes)
        stop = early_return(batch) if self.supports_early_return else None
        if stop is not None:
            samples = self._generate(continued, segment, stop=stop)
        else:
            samples = self._generate(continued, segment)
        return join_segments(prefixes, samples, config.max_new_tokens)

    def get_new_version(self, **changes: Any) -> LLMWrapperBase:
        """The same model under other settings, without reloading weights.

        Example: a scoring twin of a sampling policy, ``policy.get_new_version(generate=False)``
        (its input key follows: ``("history", "full")`` instead of ``("history", "prompt")``).
        """
        unknown = set(changes) - set(self._settings)
        if unknown:
            raise TypeError(
                f"get_new_version got unknown settings {sorted(unknown)}; "
                f"known: {sorted(self._settings)}"
            )
        twin = copy.copy(self)  # shares the model and the backend's state
        LLMWrapperBase.__init__(twin, self.tokenizer, **{**self._settings, **changes})
        return twin

    def close(self) -> None:
        """Stop the request batcher, if any."""
        if self._batcher is not None:
            self._batcher.close()

    # ------------------------------------------------------------------ internals
    def _forward_many(self, requests: list[TensorDictBase]) -> list[TensorDictBase]:
        """Serve several callers' batches with one backend call (used by the batcher).

        When every request carries ``prompt_id`` (task envs do), they are served in the order
        of their ids, not of their arrival: a seeded engine then gives each prompt the same
        draws whichever env worker's request came first."""
        order = _served_order(requests)
        requests = align_prefixes(requests)
        served = [requests[i] for i in order]
        sizes = [1 if r.batch_dims == 0 else r.batch_size[0] for r in served]
        rows = [r.unsqueeze(0) if r.batch_dims == 0 else r for r in served]
        merged = torch.cat(rows, dim=0) if len(rows) > 1 else rows[0]
        out = self.forward(merged)
        results: list[Any] = [None] * len(requests)
        start = 0
        for index, request, size in zip(order, served, sizes, strict=True):
            part = out[start : start + size]
            results[index] = part[0] if request.batch_dims == 0 else part
            start += size
        return results


def _served_order(requests: list[TensorDictBase]) -> list[int]:
    """Indices of ``requests`` sorted by their ``prompt_id`` values, or in arrival order when
    one of them has none."""
    if len(requests) < 2 or not all("prompt_id" in r.keys() for r in requests):  # noqa: SIM118
        return list(range(len(requests)))
    keys = [tuple(map(str, as_list(r.get("prompt_id")))) for r in requests]
    return sorted(range(len(requests)), key=lambda i: keys[i])


def _merge_num_samples(
    generate_kwargs: dict[str, Any] | GenerationKwargs | None, num_samples: int | None
) -> GenerationKwargs:
    if isinstance(generate_kwargs, GenerationKwargs):
        config = generate_kwargs
    else:
        config = GenerationKwargs.from_kwargs(generate_kwargs or {})
    if num_samples is None:
        return config
    given = dict(generate_kwargs or {}) if not isinstance(generate_kwargs, GenerationKwargs) else {}
    requested = given.get("num_return_sequences", given.get("n"))
    if requested is not None and requested != num_samples:
        raise GenerationKwargsError(
            f"num_samples={num_samples} contradicts generate_kwargs num_return_sequences="
            f"{requested}; set one of them"
        )
    return config.replace(num_return_sequences=num_samples)


def _request_rows(td: TensorDictBase) -> int:
    """The rows one policy call asks for: B for a batch ``[B]``, 1 for a single row."""
    return 1 if td.batch_dims == 0 else int(td.batch_size[0])
