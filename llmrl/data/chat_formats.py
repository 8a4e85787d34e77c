"""Built-in chat formats: render messages to text and parse rendered text back into messages.

A :class:`ChatFormat` knows the markers of one family of chat templates. llmrl uses it in two
ways: to render and parse text exactly (``History.from_text``, ``chat_template="chatml"``), and to
name the end-of-turn marker when it computes assistant-token masks from a tokenizer's own Jinja
template.

Rendering here is deliberately literal: content is never trimmed or rewritten, so
render -> parse gives back exactly the messages that went in. (Meta's Llama 3 template trims
message content; a tokenizer's own template still applies its own rules when you use it.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]


class ChatFormatError(ValueError):
    """Text that does not follow the chat format it is parsed with."""


@dataclass(frozen=True)
class ChatFormat:
    """The markers of a chat format.

    A message renders as ``turn_start + header(role) + content + end_of_turn + turn_sep``.
    A generation prompt is ``turn_start + header("assistant")``. An incomplete last message (a
    response cut off before its end-of-turn) renders without ``end_of_turn + turn_sep``.
    """

    name: str
    begin: str
    """Text once at the start of every conversation (e.g. a BOS marker); may be empty."""
    turn_start: str
    header_open: str
    header_close: str
    end_of_turn: str
    turn_sep: str

    def header(self, role: str) -> str:
        return f"{self.turn_start}{self.header_open}{role}{self.header_close}"

    def render(
        self,
        messages: list[Message],
        add_generation_prompt: bool = False,
        final_incomplete: bool = False,
    ) -> str:
        """Render messages to text; ``final_incomplete`` leaves the last turn open."""
        parts = [self.begin]
        for index, message in enumerate(messages):
            parts.append(self.header(message["role"]) + message["content"])
            if not (final_incomplete and index == len(messages) - 1):
                parts.append(self.end_of_turn + self.turn_sep)
        if add_generation_prompt:
            parts.append(self.header("assistant"))
        return "".join(parts)

    def parse(self, text: str) -> list[Message]:
        """Parse rendered text back into ``{"role", "content", "is_complete"}`` messages.

        A last turn without its end-of-turn marker is returned with ``is_complete=False``; a
        trailing generation prompt therefore parses as an empty, incomplete assistant message.

        Raises:
            ChatFormatError: naming the character offset where the text stops following the
                format.
        """
        if not text.startswith(self.begin):
            raise ChatFormatError(
                f"{self.name}: text must start with {self.begin!r}, got {text[:30]!r}"
            )
        header = re.compile(
            re.escape(self.turn_start + self.header_open)
            + r"([^\s<>|]+)"
            + re.escape(self.header_close)
        )
        messages: list[Message] = []
        position = len(self.begin)
        while position < len(text):
            match = header.match(text, position)
            if match is None:
                raise ChatFormatError(
                    f"{self.name}: expected a turn header {self.header('<role>')!r} at offset "
                    f"{position}, found {text[position : position + 30]!r}"
                )
            body_start = match.end()
            end = text.find(self.end_of_turn, body_start)
            if end < 0:
                messages.append(_message(match.group(1), text[body_start:], complete=False))
                break
            messages.append(_message(match.group(1), text[body_start:end], complete=True))
            position = end + len(self.end_of_turn)
            if text.startswith(self.turn_sep, position):
                position += len(self.turn_sep)
            elif position < len(text):
                raise ChatFormatError(
                    f"{self.name}: expected {self.turn_sep!r} after end-of-turn at offset "
                    f"{position}, found {text[position : position + 30]!r}"
                )
        return messages


def _message(role: str, content: str, complete: bool) -> Message:
    return {"role": role, "content": content, "is_complete": complete}


CHATML = ChatFormat(
    name="chatml",
    begin="",
    turn_start="<|im_start|>",
    header_open="",
    header_close="\n",
    end_of_turn="<|im_end|>",
    turn_sep="\n",
)

LLAMA3 = ChatFormat(
    name="llama3",
    begin="<|begin_of_text|>",
    turn_start="",
    header_open="<|start_header_id|>",
    header_close="<|end_header_id|>\n\n",
    end_of_turn="<|eot_id|>",
    turn_sep="",
)

CHAT_FORMATS: dict[str, ChatFormat] = {fmt.name: fmt for fmt in (CHATML, LLAMA3)}


def get_chat_format(name: str) -> ChatFormat:
    """Look up a built-in format by name (``chatml``, ``llama3``)."""
    try:
        return CHAT_FORMATS[name]
    except KeyError:
        raise ChatFormatError(
            f"unknown chat format {name!r}; built-in formats are {sorted(CHAT_FORMATS)}"
        ) from None


def detect_chat_format(jinja_template: str | None) -> ChatFormat | None:
    """Guess which built-in format a tokenizer's Jinja template produces (None if unknown)."""
    if not jinja_template:
        return None
    for fmt in CHAT_FORMATS.values():
        if fmt.end_of_turn in jinja_template and (fmt.turn_start or fmt.header_open) in (
            jinja_template
        ):
            return fmt
    return None
