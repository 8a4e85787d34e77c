"""Read a policy's input TensorDict into token lists, whatever the input mode.

Every mode ends in the same :class:`PolicyInputs`: ragged token ids for the prompts (to sample
from) or for the full sequences (to score), with the assistant mask over them when it is known.
Prompt and response are always tokenized separately and concatenated, as generation produces
them, so a sequence scored with ``generate=False`` lines up token for token with what
``generate=True`` sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.data import History, Masks, Tokens, unpad_sequences
from llmrl.data.non_tensor import as_list
from llmrl.policies.io_spec import PolicyIOSpec


class InputKeyError(KeyError):
    """A key the policy reads is missing from its input; the message lists the keys present."""

    def __str__(self) -> str:  # KeyError would show the repr of the message
        return str(self.args[0])


@dataclass
class PolicyInputs:
    """What a backend needs, plus what the outputs need to be written back."""

    prompt_tokens: list[torch.Tensor] | None = None
    full_tokens: list[torch.Tensor] | None = None
    assistant_masks: list[torch.Tensor] | None = None
    """Over the prompt when generating, over the full sequence when scoring (None: unknown)."""
    prompt_text: list[str] | None = None
    full_text: list[str] | None = None
    prompt_history: History | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def read_inputs(spec: PolicyIOSpec, td: TensorDictBase) -> PolicyInputs:
    """Extract the inputs from a batch ``[B]``: the mode, key, tokenizer and chat template
    are ``spec``'s (a policy passes its ``io_spec``)."""
    reader = {"history": _read_history, "text": _read_text, "tokens": _read_tokens}
    return reader[spec.input_mode](spec, td)


def get_input(td: TensorDictBase, key: str | tuple[str, ...], required: bool = True) -> Any:
    """``td[key]`` where ``key`` may go through a container (``("history", "prompt")``).

    Raises a KeyError naming the key and the keys present when ``required``.
    """
    parts = (key,) if isinstance(key, str) else tuple(key)
    value: Any = td
    for depth, part in enumerate(parts):
        if isinstance(value, TensorDictBase):
            value = value.get(part, None)
        else:
            value = getattr(value, part, None)
        if value is None:
            if not required:
                return None
            present = sorted(
                k if isinstance(k, str) else ".".join(k) for k in td.keys(include_nested=True)
            )
            where = "the input" if depth == 0 else f"{parts[:depth]}"
            raise InputKeyError(
                f"input key {key!r} not found: {where} has no {part!r}; keys present: {present}"
            )
    return value


def _read_history(spec: PolicyIOSpec, td: TensorDictBase) -> PolicyInputs:
    history = _expect(get_input(td, spec.input_key), History, spec.input_key)
    tokenizer, template = spec.tokenizer, spec.chat_template
    if spec.generate:
        tokens = history.apply_chat_template(
            tokenizer, add_generation_prompt=True, chat_template=template
        )
        return PolicyInputs(
            prompt_tokens=tokens.as_list("input_ids"),
            assistant_masks=tokens.as_list("assistant_mask"),
            prompt_text=history.apply_chat_template(
                tokenizer, add_generation_prompt=True, chat_template=template, tokenize=False
            ),
            prompt_history=history,
        )
    tokens = history.apply_chat_template(tokenizer, chat_template=template)
    full_tokens = tokens.as_list("input_ids")
    inputs = PolicyInputs(
        full_tokens=full_tokens,
        assistant_masks=tokens.as_list("assistant_mask"),
        full_text=history.apply_chat_template(tokenizer, chat_template=template, tokenize=False),
    )
    prompt = get_input(td, (spec.keys["history"], "prompt"), required=False)
    if isinstance(prompt, History) and prompt is not history:
        prompt_tokens = prompt.apply_chat_template(
            tokenizer, add_generation_prompt=True, chat_template=template
        ).as_list("input_ids")
        _check_prefixes(prompt_tokens, full_tokens, "history")
        inputs.prompt_tokens = prompt_tokens
    return inputs


def _read_text(spec: PolicyIOSpec, td: TensorDictBase) -> PolicyInputs:
    texts = [str(t) for t in as_list(get_input(td, spec.input_key))]
    if spec.generate:
        prompt_tokens = [_encode(spec, text) for text in texts]
        return PolicyInputs(
            prompt_tokens=prompt_tokens,
            assistant_masks=[torch.zeros_like(t, dtype=torch.bool) for t in prompt_tokens],
            prompt_text=texts,
        )
    prompts = get_input(td, (spec.keys["text"], "prompt"), required=False)
    if prompts is None:
        return PolicyInputs(full_tokens=[_encode(spec, text) for text in texts], full_text=texts)
    prompt_tokens, full_tokens, masks = [], [], []
    for row, (prompt, full) in enumerate(zip(as_list(prompts), texts, strict=True)):
        if not full.startswith(prompt):
            raise ValueError(f"text row {row}: the full text does not start with its prompt")
        prompt_ids, response_ids = _encode(spec, prompt), _encode(spec, full[len(prompt) :])
        prompt_tokens.append(prompt_ids)
        full_tokens.append(torch.cat([prompt_ids, response_ids]))
        masks.append(torch.arange(len(full_tokens[-1])) >= len(prompt_ids))
    return PolicyInputs(
        prompt_tokens=prompt_tokens, full_tokens=full_tokens, assistant_masks=masks, full_text=texts
    )


def _read_tokens(spec: PolicyIOSpec, td: TensorDictBase) -> PolicyInputs:
    key = spec.input_key
    if isinstance(key, str) or len(key) != 2:
        raise ValueError(
            f"tokens mode reads (container, field) keys like ('tokens', 'prompt'); got {key!r}"
        )
    container = _expect(get_input(td, key[0]), Tokens, key[0])
    rows = _token_rows(td, spec, container, key[1])
    if rows is None:
        raise InputKeyError(f"input key {key!r} not found: the Tokens container has no {key[1]!r}")
    if spec.generate:
        return PolicyInputs(
            prompt_tokens=rows,
            assistant_masks=[torch.zeros_like(r, dtype=torch.bool) for r in rows],
        )
    inputs = PolicyInputs(full_tokens=rows)
    prompt_rows = _token_rows(td, spec, container, "prompt") if key[1] != "prompt" else None
    if prompt_rows is not None:
        _check_prefixes(prompt_rows, rows, "tokens")
        inputs.prompt_tokens = prompt_rows
    inputs.assistant_masks = _input_assistant_masks(td, spec, rows)
    if inputs.assistant_masks is None and prompt_rows is not None:
        inputs.assistant_masks = [
            torch.arange(len(full)) >= len(prompt)
            for prompt, full in zip(prompt_rows, rows, strict=True)
        ]
    return inputs


def _input_assistant_masks(
    td: TensorDictBase, spec: PolicyIOSpec, rows: list[torch.Tensor]
) -> list[torch.Tensor] | None:
    """Assistant masks over ``full`` carried by the input (e.g. from the sampling policy), which
    also mark earlier assistant turns of a multi-turn prompt."""
    masks = get_input(td, spec.keys["masks"], required=False)
    if not isinstance(masks, Masks) or not masks.has("assistant"):
        return None
    if not masks.is_padded:
        return masks.as_list("assistant")
    return [row[valid] for row, valid in zip(masks.assistant, masks.full, strict=True)]


def _token_rows(
    td: TensorDictBase, spec: PolicyIOSpec, container: Tokens, name: str
) -> list[torch.Tensor] | None:
    if not container.has(name):
        return None
    if not container.is_padded:
        return container.as_list(name)
    masks = get_input(td, (spec.keys["masks"], name), required=False)
    if masks is None:
        raise InputKeyError(
            f"padded tokens need their masks: ({spec.keys['masks']!r}, {name!r}) is missing"
        )
    return unpad_sequences(getattr(container, name), masks)


def _encode(spec: PolicyIOSpec, text: str) -> torch.Tensor:
    ids = spec.tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def _check_prefixes(prompts: list[torch.Tensor], fulls: list[torch.Tensor], mode: str) -> None:
    for row, (prompt, full) in enumerate(zip(prompts, fulls, strict=True)):
        if len(prompt) > len(full) or not torch.equal(full[: len(prompt)], prompt):
            raise ValueError(
                f"{mode} row {row}: the prompt tokens are not a prefix of the full tokens"
            )


def _expect(value: Any, kind: type, key: Any) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"input key {key!r} holds {type(value).__name__}, expected {kind.__name__}")
    return value
