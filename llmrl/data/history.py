"""`History`: chat messages as a tensordict TensorClass.

A single message has batch size ``[]``, one conversation ``[T]`` (T messages) and a batch of
conversations ``[B, T]``. Conversations in a batch may have different lengths: the batch is then a
lazy stack whose second dimension is ragged (``batch_size == [B, -1]``). Build and read histories
through :meth:`History.from_chats` / :meth:`History.to_chats`; they work whatever tensordict's
process-global ``list_to_stack`` setting is, so nothing has to be switched on first.

Example:
    >>> chats = [
    ...     [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    ...     [{"role": "user", "content": "Hi"}],
    ... ]
    >>> history = History.from_chats(chats)
    >>> history.batch_size
    torch.Size([2, -1])
    >>> history.to_chats()[1][0]["content"]
    'Hi'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from tensordict import NonTensorStack, TensorClass, lazy_stack

from llmrl.data.chat_formats import ChatFormat, get_chat_format

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llmrl.data.chat_tokens import ChatTokens

Message = dict[str, Any]
_MESSAGE_KEYS = {"role", "content", "is_complete", "tool_calls"}


class History(TensorClass["nocast"]):
    """Chat messages: ``role``, ``content``, ``is_complete`` and optional ``tool_calls``.

    ``is_complete`` is False for a message that was cut off before its end-of-turn (a response
    that hit the token limit); such a message renders without an end-of-turn marker.
    ``tool_calls`` holds, per message, a list of ``{"name": ..., "arguments": ...}`` dicts or
    None.
    """

    role: str
    content: str
    is_complete: torch.Tensor
    tool_calls: Any = None

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_messages(cls, messages: list[Message], chat_index: int | None = None) -> History:
        """One conversation (batch ``[T]``) from message dicts."""
        where = "" if chat_index is None else f"chat {chat_index}, "
        if not isinstance(messages, (list, tuple)):
            raise TypeError(f"{where}expected a list of message dicts, got {type(messages)}")
        if not messages:
            raise ValueError(f"{where}a conversation needs at least one message")
        checked = [_check_message(m, f"{where}message {i}") for i, m in enumerate(messages)]
        return cls(
            role=NonTensorStack(*(m["role"] for m in checked)),
            content=NonTensorStack(*(m["content"] for m in checked)),
            is_complete=torch.tensor([m.get("is_complete", True) for m in checked]),
            tool_calls=NonTensorStack(*(m.get("tool_calls") for m in checked)),
            batch_size=[len(checked)],
        )

    @classmethod
    def from_chats(cls, chats: list[list[Message]] | list[Message]) -> History:
        """A batch ``[B, T]`` from a list of conversations, or ``[T]`` from one conversation."""
        if chats and isinstance(chats[0], dict):
            return cls.from_messages(chats)  # type: ignore[arg-type]
        if not chats:
            raise ValueError("from_chats needs at least one conversation")
        return lazy_stack([cls.from_messages(chat, i) for i, chat in enumerate(chats)])

    @classmethod
    def message(
        cls,
        role: str,
        content: str,
        is_complete: bool = True,
        tool_calls: list[dict] | None = None,
    ) -> History:
        """A single message (batch ``[]``)."""
        message = _check_message(
            {"role": role, "content": content, "is_complete": is_complete}, "message"
        )
        return cls(
            role=message["role"],
            content=message["content"],
            is_complete=torch.tensor(is_complete),
            tool_calls=tool_calls,
            batch_size=[],
        )

    @classmethod
    def from_text(cls, text: str | list[str], chat_format: str | ChatFormat = "chatml") -> History:
        """Parse rendered chat text (one string or a batch) back into a History.

        ``chat_format`` is a built-in format name (``chatml`` for SmolLM2 and Qwen, ``llama3``)
        or a :class:`ChatFormat`. A last turn without its end-of-turn marker becomes an
        incomplete message.
        """
        fmt = get_chat_format(chat_format) if isinstance(chat_format, str) else chat_format
        if isinstance(text, str):
            return cls.from_messages(fmt.parse(text))
        return cls.from_chats([fmt.parse(t) for t in text])

    # ----------------------------------------------------------------- reading
    def to_chats(self) -> list[list[Message]] | list[Message] | Message:
        """Back to plain dicts: a list of chats for ``[B, T]``, one chat for ``[T]``."""
        if self.batch_dims == 0:
            return _as_dict(self.role, self.content, self.is_complete, self.tool_calls)
        if self.batch_dims == 1:
            return [
                _as_dict(role, content, complete, calls)
                for role, content, complete, calls in zip(
                    _as_list(self.role),
                    _as_list(self.content),
                    self.is_complete.tolist(),
                    _as_list(self.tool_calls, len(self)),
                    strict=True,
                )
            ]
        if self.batch_dims == 2:
            return [self[b].to_chats() for b in range(self.batch_size[0])]
        raise ValueError(f"History has batch size {self.batch_size}; expected at most 2 dims")

    # ----------------------------------------------------------------- editing
    def append(self, message: History) -> History:
        """A new History with one more message per conversation.

        ``[T] + []`` gives ``[T + 1]``; ``[B, T] + [B]`` appends message ``b`` to conversation
        ``b``.
        """
        if self.batch_dims == 1:
            _expect_dims(message, 0, "append to one conversation takes a single message")
            return History.from_messages([*self.to_chats(), message.to_chats()])
        _expect_dims(self, 2, "append works on a conversation [T] or a batch [B, T]")
        _expect_dims(message, 1, "append to a batch [B, T] takes messages of batch size [B]")
        _expect_same_batch(self, message)
        return History.from_chats(
            [[*chat, new] for chat, new in zip(self.to_chats(), message.to_chats(), strict=True)]
        )

    def extend(self, messages: History) -> History:
        """A new History with several messages added per conversation.

        ``[T] + [K]`` gives ``[T + K]``; ``[B, T] + [B, K]`` extends conversation ``b`` with
        row ``b`` of ``messages`` (rows may have different K).
        """
        if self.batch_dims == 1:
            _expect_dims(messages, 1, "extend one conversation [T] with messages [K]")
            return History.from_messages([*self.to_chats(), *messages.to_chats()])
        _expect_dims(self, 2, "extend works on a conversation [T] or a batch [B, T]")
        _expect_dims(messages, 2, "extend a batch [B, T] with messages [B, K]")
        _expect_same_batch(self, messages)
        return History.from_chats(
            [[*chat, *new] for chat, new in zip(self.to_chats(), messages.to_chats(), strict=True)]
        )

    # ----------------------------------------------------------------- templating
    def apply_chat_template(
        self,
        tokenizer: PreTrainedTokenizerBase,
        add_generation_prompt: bool = False,
        chat_template: str | ChatFormat | None = None,
        tokenize: bool = True,
        padded: bool = False,
    ) -> ChatTokens | str | list[str]:
        """Render with a chat template and, by default, tokenize with an assistant-token mask.

        See :func:`llmrl.data.chat_tokens.tokenize_chats` for the mask's exact definition.
        ``chat_template`` is None (the tokenizer's own template), a built-in format name, or a
        :class:`ChatFormat`. With ``tokenize=False`` returns the rendered text.
        """
        from llmrl.data.chat_tokens import render_chats, tokenize_chats

        chats = self.to_chats()
        single = self.batch_dims == 1
        batch = [chats] if single else chats
        if not tokenize:
            texts = render_chats(batch, tokenizer, chat_template, add_generation_prompt)
            return texts[0] if single else texts
        tokens = tokenize_chats(batch, tokenizer, chat_template, add_generation_prompt, padded)
        return tokens[0] if single else tokens


def _check_message(message: Any, where: str) -> Message:
    if not isinstance(message, dict):
        raise TypeError(f"{where}: expected a dict with 'role' and 'content', got {message!r}")
    unknown = set(message) - _MESSAGE_KEYS
    if unknown:
        raise ValueError(
            f"{where}: unknown keys {sorted(unknown)}; allowed {sorted(_MESSAGE_KEYS)}"
        )
    for field in ("role", "content"):
        if field not in message:
            raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(message[field], str):
            raise TypeError(
                f"{where}: field {field!r} must be a string, got {type(message[field]).__name__}"
            )
    if not message["role"]:
        raise ValueError(f"{where}: field 'role' is empty")
    if not isinstance(message.get("is_complete", True), bool):
        raise TypeError(f"{where}: field 'is_complete' must be a bool")
    return message


def _as_dict(role: str, content: str, complete: Any, tool_calls: Any) -> Message:
    message: Message = {"role": role, "content": content, "is_complete": bool(complete)}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return message


def _as_list(values: Any, length: int | None = None) -> list:
    if values is None:  # a field left unset on every message
        return [None] * (length or 0)
    return list(values)


def _expect_dims(history: History, dims: int, what: str) -> None:
    if history.batch_dims != dims:
        raise ValueError(f"{what}; got batch size {list(history.batch_size)}")


def _expect_same_batch(left: History, right: History) -> None:
    if left.batch_size[0] != right.batch_size[0]:
        raise ValueError(
            f"batch sizes differ: {left.batch_size[0]} conversations but "
            f"{right.batch_size[0]} rows of new messages"
        )
