"""Output containers that policies, envs and losses pass around: ``Text``, ``Tokens``, ``Masks``,
``LogProbs`` and ``ChatHistory``, each with ``prompt`` / ``response`` / ``full`` fields.

Token-aligned containers (``Tokens``, ``LogProbs``) come in two representations:

- **ragged**: a lazy stack of rows, each row a 1-D tensor of its own length (build with
  :meth:`from_sequences`, read rows with :meth:`as_list`);
- **padded**: dense ``[B, L]`` tensors, prompts left-padded, responses right-padded, and
  ``full == cat(prompt, response)`` column-wise (see :mod:`llmrl.data.padding`). The validity of
  each position lives in a :class:`Masks`, which :meth:`pad` returns and :meth:`unpad` needs.

Example:
    >>> tokens = Tokens.from_sequences(
    ...     prompt=[torch.tensor([5, 6]), torch.tensor([7])],
    ...     response=[torch.tensor([8]), torch.tensor([9, 2])],
    ... )
    >>> padded, masks = tokens.pad(padding_value=0)
    >>> padded.full.tolist()
    [[5, 6, 8, 0], [0, 7, 9, 2]]
    >>> [row.tolist() for row in padded.unpad(masks).as_list("response")]
    [[8], [9, 2]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, NonTensorStack, TensorClass, lazy_stack

from llmrl.data.history import History
from llmrl.data.padding import pad_sequences, unpad_sequences

_FIELDS = ("prompt", "response", "full")


def _given_fields(owner: str, prompt: Sequence, response: Sequence, full: Sequence) -> dict:
    """The fields passed as per-row sequences, checked to share one batch size."""
    given = {
        name: list(rows)
        for name, rows in zip(_FIELDS, (prompt, response, full), strict=True)
        if rows is not None
    }
    if not given:
        raise ValueError(f"{owner} needs at least one of {_FIELDS}")
    sizes = {name: len(rows) for name, rows in given.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"{owner}: fields have different batch sizes {sizes}")
    return given


class _RowsAccess:
    """Reading fields of a container that may be ragged (a lazy stack of rows) or padded."""

    def has(self, field: str) -> bool:
        """Whether ``field`` (``prompt``, ``response`` or ``full``) is set."""
        return field in self._tensordict.keys()  # noqa: SIM118 (no `in` on tensordicts)

    @property
    def is_padded(self) -> bool:
        """True for dense ``[B, L]`` fields, False for a ragged lazy stack of rows."""
        return not isinstance(self._tensordict, LazyStackedTensorDict)

    def as_list(self, field: str) -> list[torch.Tensor]:
        """The rows of a ragged field as a list of 1-D tensors."""
        if self.is_padded:
            raise ValueError(f"{type(self).__name__} is padded; call .unpad(masks) first")
        return self._tensordict.get(field, as_list=True)


class Masks(_RowsAccess, TensorClass["nocast"]):
    """Boolean masks aligned with padded ``Tokens``/``LogProbs``.

    ``prompt``, ``response`` and ``full`` mark real (non-padding) positions of the matching
    fields; ``assistant`` marks, within ``full``, the tokens a loss trains on (assistant content
    and end-of-turn, see :mod:`llmrl.data.chat_tokens`).
    """

    prompt: torch.Tensor | None = None
    response: torch.Tensor | None = None
    full: torch.Tensor | None = None
    assistant: torch.Tensor | None = None


class _TokenAligned(_RowsAccess):
    """Ragged/padded conversions shared by :class:`Tokens` and :class:`LogProbs`."""

    @classmethod
    def from_sequences(
        cls,
        prompt: Sequence[torch.Tensor] | None = None,
        response: Sequence[torch.Tensor] | None = None,
        full: Sequence[torch.Tensor] | None = None,
    ) -> Any:
        """A ragged batch from per-row 1-D tensors; ``full`` defaults to prompt + response."""
        given = _given_fields(f"{cls.__name__}.from_sequences", prompt, response, full)
        batch = len(next(iter(given.values())))
        if full is None and prompt is not None and response is not None:
            given["full"] = [torch.cat([p, r]) for p, r in zip(prompt, response, strict=True)]
        rows = [cls(**{name: seqs[i] for name, seqs in given.items()}) for i in range(batch)]
        return lazy_stack(rows)

    def pad(self, padding_value: float | int) -> tuple[Any, Masks]:
        """Dense copy (prompt left-, response right-padded) and the masks to undo it."""
        fields: dict[str, torch.Tensor] = {}
        masks: dict[str, torch.Tensor] = {}
        present = [name for name in _FIELDS if self.has(name)]
        for name, side in (("prompt", "left"), ("response", "right")):
            if name in present:
                fields[name], masks[name] = pad_sequences(self.as_list(name), side, padding_value)
        if "full" in present:
            if "prompt" in fields and "response" in fields:
                fields["full"] = torch.cat([fields["prompt"], fields["response"]], dim=1)
                masks["full"] = torch.cat([masks["prompt"], masks["response"]], dim=1)
            else:
                fields["full"], masks["full"] = pad_sequences(
                    self.as_list("full"), "right", padding_value
                )
        batch = [self.batch_size[0]]
        return type(self)(**fields, batch_size=batch), Masks(**masks, batch_size=batch)

    def unpad(self, masks: Masks) -> Any:
        """Ragged copy of a padded container, keeping exactly the positions ``masks`` marks."""
        if not self.is_padded:
            raise ValueError(f"{type(self).__name__} is already ragged")
        rows = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            mask = getattr(masks, name)
            if mask is None:
                raise ValueError(f"masks.{name} is missing; it is needed to unpad {name!r}")
            rows[name] = unpad_sequences(value, mask)
        return type(self).from_sequences(**rows)


class Tokens(_TokenAligned, TensorClass["nocast"]):
    """Token ids: ``prompt``, ``response`` and ``full`` (prompt followed by response)."""

    prompt: torch.Tensor | None = None
    response: torch.Tensor | None = None
    full: torch.Tensor | None = None


class LogProbs(_TokenAligned, TensorClass["nocast"]):
    """Per-token log-probabilities aligned with :class:`Tokens`.

    ``response[i]`` is the log-probability of ``Tokens.response[i]`` given everything before it.
    In ``full``, the first token of a sequence has no prediction and holds 0.
    """

    prompt: torch.Tensor | None = None
    response: torch.Tensor | None = None
    full: torch.Tensor | None = None


class Text(TensorClass["nocast"]):
    """Strings: ``prompt``, ``response`` and ``full`` (prompt followed by response)."""

    prompt: str | None = None
    response: str | None = None
    full: str | None = None

    @classmethod
    def from_strings(
        cls,
        prompt: Sequence[str] | None = None,
        response: Sequence[str] | None = None,
        full: Sequence[str] | None = None,
    ) -> Text:
        """A batch ``[B]``; ``full`` defaults to ``prompt + response``."""
        given = _given_fields("Text.from_strings", prompt, response, full)
        if full is None and prompt is not None and response is not None:
            given["full"] = [p + r for p, r in zip(given["prompt"], given["response"], strict=True)]
        return cls(
            **{name: NonTensorStack(*values) for name, values in given.items()},
            batch_size=[len(next(iter(given.values())))],
        )


class ChatHistory(TensorClass["nocast"]):
    """Conversations: the ``prompt`` history, the ``response`` messages and the ``full`` chat."""

    prompt: History | None = None
    response: History | None = None
    full: History | None = None

    @classmethod
    def from_histories(cls, prompt: History, response: History | None = None) -> ChatHistory:
        """Batch ``[B]``: ``full`` is ``prompt`` extended with ``response``.

        ``response`` holds one message per row (batch ``[B]``) or several (``[B, K]``).
        """
        full = None
        if response is not None:
            full = prompt.append(response) if response.batch_dims == 1 else prompt.extend(response)
        return cls(prompt=prompt, response=response, full=full, batch_size=[prompt.batch_size[0]])
