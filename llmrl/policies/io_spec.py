"""What reading a policy's inputs and writing its outputs needs, and nothing more.

:class:`PolicyIOSpec` is a frozen record of the settings that :mod:`llmrl.policies.policy_inputs`
and :mod:`llmrl.policies.policy_outputs` read: the tokenizer and chat template, the input mode
and key, the output keys, the sample count, and the output layout. A policy builds one on each
call (its ``io_spec``); a test or a script may build one by hand, with no policy and no model:

    >>> from llmrl.models import load_tokenizer
    >>> tokenizer = load_tokenizer("smollm2-135m-instruct")
    >>> spec = PolicyIOSpec(tokenizer=tokenizer, input_mode="text", generate=False)
    >>> spec.input_key, spec.keys["log_probs"], spec.pad_token_id == tokenizer.eos_token_id
    (('text', 'full'), 'log_probs', True)

The backends' results, :class:`GeneratedSample` and :class:`ScoreResult`, live here too: the
outputs are written from them, and the backends (``base.py`` and its subclasses) produce them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llmrl.data import ChatFormat

InputMode = Literal["history", "text", "tokens"]
INPUT_MODES: tuple[str, ...] = ("history", "text", "tokens")
OUTPUT_KEYS: Mapping[str, str] = MappingProxyType(
    {name: name for name in ("history", "text", "tokens", "masks", "log_probs")}
)
"""The default key of each output container, by container name."""


@dataclass
class GeneratedSample:
    """One sampled response: token ids, their sampling log-probs, and how it ended.

    ``tokens`` include the end-of-sequence token when the model emitted one; ``finished`` is
    False when the response hit ``max_new_tokens`` instead.
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor | None
    finished: bool


@dataclass
class ScoreResult:
    """Right-padded log-probs ``[N, L]`` of scored sequences (and entropies, logits when asked).

    ``entropy[i, t]`` is the entropy of the distribution token ``t`` was drawn from, laid out
    like ``log_probs`` (0 where they hold 0)."""

    log_probs: torch.Tensor
    logits: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


def check_input_mode(input_mode: str) -> None:
    """Raise a ValueError unless ``input_mode`` is one of :data:`INPUT_MODES`."""
    if input_mode not in INPUT_MODES:
        raise ValueError(f"input_mode must be one of {list(INPUT_MODES)}, got {input_mode!r}")


def default_input_key(keys: Mapping[str, str], input_mode: str, generate: bool) -> tuple[str, str]:
    """``(<mode's container key>, "prompt")`` when generating, ``(..., "full")`` when scoring."""
    return (keys[input_mode], "prompt" if generate else "full")


def tokenizer_pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The tokenizer's pad id, else its end-of-sequence id."""
    pad = tokenizer.pad_token_id
    return pad if pad is not None else tokenizer.eos_token_id


def tokenizer_eos_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The tokenizer's end-of-sequence id(s) as a set."""
    eos = tokenizer.eos_token_id
    return set(eos) if isinstance(eos, list) else {eos}


@dataclass(frozen=True)
class PolicyIOSpec:
    """The settings a policy's inputs are read and its outputs written with.

    Args:
        tokenizer: tokenizes text and history inputs, decodes sampled responses.
        input_mode: ``history``, ``text`` or ``tokens``.
        generate: True reads prompts to sample from; False reads full sequences to score.
        input_key: where the input is read; None: :func:`default_input_key`.
        keys: the output key of each container (``history``, ``text``, ``tokens``, ``masks``,
            ``log_probs``); names left out keep :data:`OUTPUT_KEYS`.
        chat_template: None (the tokenizer's template) or a built-in format name.
        num_samples: responses per prompt (G): the output of a batch ``[B]`` is ``[B, G]``.
        return_log_probs: write the log-probs into the output.
        pad_output: padded containers with masks instead of ragged rows.
        skip_special_tokens: drop special tokens when decoding a response.
        pad_token_id: pads token outputs; None: the tokenizer's pad, else its end-of-sequence.
        eos_token_ids: the tokens that end a response (dropped from a chat reply's content);
            None: the tokenizer's end-of-sequence id(s).
    """

    tokenizer: PreTrainedTokenizerBase
    input_mode: InputMode = "history"
    generate: bool = True
    input_key: str | tuple[str, ...] | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    chat_template: str | ChatFormat | None = None
    num_samples: int = 1
    return_log_probs: bool = True
    pad_output: bool = False
    skip_special_tokens: bool = True
    pad_token_id: int | None = None
    eos_token_ids: frozenset[int] | None = None

    def __post_init__(self) -> None:
        check_input_mode(self.input_mode)
        unknown = set(self.keys) - set(OUTPUT_KEYS)
        if unknown:
            raise ValueError(f"unknown output keys {sorted(unknown)}; known: {list(OUTPUT_KEYS)}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
        keys = MappingProxyType({**OUTPUT_KEYS, **self.keys})
        resolved: dict[str, Any] = {
            "keys": keys,
            "input_key": self.input_key or default_input_key(keys, self.input_mode, self.generate),
            "pad_token_id": (
                tokenizer_pad_id(self.tokenizer) if self.pad_token_id is None else self.pad_token_id
            ),
            "eos_token_ids": frozenset(
                tokenizer_eos_ids(self.tokenizer)
                if self.eos_token_ids is None
                else self.eos_token_ids
            ),
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def decode_response(self, sample: GeneratedSample, content_only: bool = False) -> str:
        """Text of a sampled response; ``content_only`` drops a final end-of-sequence token
        (the message content of a chat reply)."""
        tokens = sample.tokens
        if content_only and len(tokens) and int(tokens[-1]) in self.eos_token_ids:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special_tokens)
