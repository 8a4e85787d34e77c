"""Render conversations with a chat template and tokenize them with an exact assistant mask.

The assistant mask marks, for every assistant message, the tokens of its content **and its
end-of-turn token** (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3), and never the role
header (``<|im_start|>assistant\\n``) nor the separator after the end-of-turn. Training on the
end-of-turn token is what teaches a model to stop; training on headers would teach it to write
the template's scaffolding, which the template already supplies. An incomplete assistant message
(cut off before its end-of-turn) contributes its content only.

How the mask is found, for any template (including ones without ``{% generation %}`` markers):
the template renders the conversation up to each assistant message with a generation prompt and
then with that message; the difference is the assistant's span of text. The text is cut at span
boundaries and each piece is tokenized on its own, so no token straddles a boundary. The result
is exactly the token sequence that generation produces (the prompt, then the sampled tokens),
which can differ from tokenizing the whole string at once only at those boundaries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import LazyStackedTensorDict, TensorClass, lazy_stack

from llmrl.data.chat_formats import ChatFormat, detect_chat_format, get_chat_format
from llmrl.data.padding import pad_sequences, unpad_sequences

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]


class ChatTemplateError(ValueError):
    """A chat template that cannot give exact assistant spans for a conversation."""


class ChatTokens(TensorClass["nocast"]):
    """Token ids of rendered conversations with their attention and assistant masks.

    Ragged (a lazy stack of 1-D rows) unless built with ``padded=True``, in which case rows are
    right-padded with the tokenizer's pad id and ``attention_mask`` marks the real tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    assistant_mask: torch.Tensor

    def as_list(self, field: str) -> list[torch.Tensor]:
        """The real tokens of each row of ``field``, as 1-D tensors (ragged or padded)."""
        if isinstance(self._tensordict, LazyStackedTensorDict):
            return self._tensordict.get(field, as_list=True)
        return unpad_sequences(getattr(self, field), self.attention_mask)


class _Renderer:
    """Renders message lists with either a built-in :class:`ChatFormat` or a tokenizer's own
    Jinja template, and names the end-of-turn marker to look for."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, chat_template: str | ChatFormat | None
    ) -> None:
        self.tokenizer = tokenizer
        if isinstance(chat_template, str):
            chat_template = get_chat_format(chat_template)
        self.format = chat_template
        if self.format is not None:
            self.end_of_turn = self.format.end_of_turn
        else:
            if not getattr(tokenizer, "chat_template", None):
                raise ChatTemplateError(
                    "the tokenizer has no chat template; pass chat_template='chatml' or 'llama3'"
                )
            detected = detect_chat_format(tokenizer.chat_template)
            self.end_of_turn = detected.end_of_turn if detected else tokenizer.eos_token

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        final_incomplete = bool(messages) and not messages[-1].get("is_complete", True)
        if self.format is not None:
            return self.format.render(messages, add_generation_prompt, final_incomplete)
        plain = [{k: v for k, v in m.items() if k != "is_complete"} for m in messages]
        return self.tokenizer.apply_chat_template(
            plain,
            tokenize=False,
            add_generation_prompt=add_generation_prompt and not final_incomplete,
            continue_final_message=final_incomplete,
        )


def render_chats(
    chats: list[list[Message]],
    tokenizer: PreTrainedTokenizerBase,
    chat_template: str | ChatFormat | None = None,
    add_generation_prompt: bool = False,
) -> list[str]:
    """Render each conversation to text."""
    renderer = _Renderer(tokenizer, chat_template)
    return [renderer.render(chat, add_generation_prompt) for chat in chats]


def assistant_spans(chat: list[Message], renderer: _Renderer, text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of each assistant message's content + end-of-turn."""
    spans = []
    for index, message in enumerate(chat):
        if message["role"] != "assistant":
            continue
        before = renderer.render(chat[:index], add_generation_prompt=True)
        through = renderer.render(chat[: index + 1], add_generation_prompt=False)
        if not (through.startswith(before) and text.startswith(through)):
            raise ChatTemplateError(
                f"the chat template does not render message {index} (assistant) as an append-only "
                "extension of the conversation before it, so its tokens cannot be masked exactly; "
                "use chat_template='chatml' or 'llama3'"
            )
        span_text = through[len(before) :]
        if message.get("is_complete", True):
            end_of_turn = span_text.rfind(renderer.end_of_turn)
            if end_of_turn < 0:
                raise ChatTemplateError(
                    f"assistant message {index}: end-of-turn {renderer.end_of_turn!r} not found "
                    f"in its rendered text {span_text!r}"
                )
            end = len(before) + end_of_turn + len(renderer.end_of_turn)
        else:
            end = len(through)
        spans.append((len(before), end))
    return spans


def tokenize_chats(
    chats: list[list[Message]],
    tokenizer: PreTrainedTokenizerBase,
    chat_template: str | ChatFormat | None = None,
    add_generation_prompt: bool = False,
    padded: bool = False,
) -> ChatTokens:
    """Tokenize conversations into a :class:`ChatTokens` batch ``[B]``."""
    renderer = _Renderer(tokenizer, chat_template)
    rows = []
    for chat in chats:
        text = renderer.render(chat, add_generation_prompt)
        ids, mask = _tokenize_pieces(tokenizer, text, assistant_spans(chat, renderer, text))
        rows.append((ids, mask))
    if padded:
        input_ids, attention = pad_sequences([ids for ids, _ in rows], "right", _pad_id(tokenizer))
        assistant, _ = pad_sequences([mask for _, mask in rows], "right", False)
        return ChatTokens(
            input_ids=input_ids,
            attention_mask=attention,
            assistant_mask=assistant,
            batch_size=[len(rows)],
        )
    return lazy_stack(
        [
            ChatTokens(
                input_ids=ids,
                attention_mask=torch.ones_like(ids, dtype=torch.bool),
                assistant_mask=mask,
                batch_size=[],
            )
            for ids, mask in rows
        ]
    )


def _tokenize_pieces(
    tokenizer: PreTrainedTokenizerBase, text: str, spans: list[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize ``text`` piece by piece, cutting at span edges; mask the pieces inside spans."""
    ids: list[int] = []
    mask: list[bool] = []
    cursor = 0
    for start, end in [*spans, (len(text), len(text))]:
        for piece, inside in ((text[cursor:start], False), (text[start:end], True)):
            if piece:
                piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
                ids.extend(piece_ids)
                mask.extend([inside] * len(piece_ids))
        cursor = end
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)


def _pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id
