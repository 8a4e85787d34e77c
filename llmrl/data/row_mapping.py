"""A row of the user's dataset as a :class:`Problem`, in the user's own shape.

For a task that is not one of llmrl's own (the user's class or reward functions), ``llmrl
prepare`` maps each source row by roles (``columns`` maps a role to the column holding it; a
role's default column has its own name):

- the prompt: the ``prompt`` column's text, a ``prompt_template`` over several columns
  (``"Convert {value} {unit} to metres."``), or a chat ``messages`` column (role/content
  dicts): the conversation up to its final assistant turn is the prompt, that turn the SFT
  target;
- ``answer``: the reference answer (any JSON scalar, kept as text; empty when the dataset has
  none: the reward may need other fields);
- ``completion``: the SFT target (else the final assistant turn of ``messages``);
- every other column is kept in ``Problem.fields`` under its own name, for the reward.

A row that cannot be mapped raises a :class:`DatasetError` naming the file, the row and the
column, as every prepare error does.

Example:
    >>> mapping = RowMapping("demo", prompt_template="{a} + {b}?")
    >>> problem = mapping.problem({"a": 2, "b": 3, "answer": 5, "unit": "m"}, 7, "train", "f")
    >>> problem.prompt, problem.answer, problem.fields
    ('2 + 3?', '5', {'a': 2, 'b': 3, 'unit': 'm'})
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from typing import Any

from llmrl.data.dataset_error import DatasetError
from llmrl.data.problem import Problem

CHAT_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class RowMapping:
    """How one task's source rows become problems (see the module docstring)."""

    task_name: str
    columns: dict[str, str] = field(default_factory=dict)
    prompt_template: str | None = None
    max_chars: int = 100_000

    def column(self, role: str) -> str:
        """The source column that holds ``role``."""
        return self.columns.get(role, role)

    def prompt_text(self, row: dict[str, Any], file: str, number: int) -> str:
        """The prompt's text (the split hash's key): the template filled, the prompt column,
        or the chat's user turns."""
        return self._prompt(row, file, number)[0]

    def problem(self, row: dict[str, Any], number: int, split: str, file: str) -> Problem:
        """Row ``number`` of ``file`` as a problem of ``split``."""
        prompt, messages, target, used = self._prompt(row, file, number)
        answer_column = self.column("answer")
        answer = row.get(answer_column)
        if answer is None and "answer" in self.columns:
            raise self._error("missing: `columns.answer` names it", file, number, answer_column)
        completion_column = self.column("completion")
        completion = row.get(completion_column)
        if completion is not None:
            target = self._text(completion, file, number, completion_column)
            used.add(completion_column)
        used.add(answer_column)
        fields = {name: value for name, value in row.items() if name not in used}
        for name, value in fields.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as error:
                raise self._error(
                    f"not a JSON value ({error}); convert the column", file, number, name
                ) from None
            if isinstance(value, str) and len(value) > self.max_chars:
                raise self._error(f"longer than {self.max_chars} characters", file, number, name)
        return Problem(
            id=f"{self.task_name}-{split}-{number:05d}",
            prompt=prompt,
            answer="" if answer is None else _scalar_text(answer, file, number, answer_column),
            sft_target=target,
            meta={"split": split, "row": number},
            fields=fields,
            messages=messages,
        )

    def _prompt(
        self, row: dict[str, Any], file: str, number: int
    ) -> tuple[str, list[dict] | None, str | None, set[str]]:
        if self.prompt_template is not None:
            names = [n for _, n, _, _ in string.Formatter().parse(self.prompt_template) if n]
            for name in names:
                if row.get(name) is None:
                    raise self._error(
                        f"missing: prompt_template uses {{{name}}}; the row has "
                        f"{', '.join(sorted(row)) or 'no fields'}",
                        file,
                        number,
                        name,
                    )
            text = self.prompt_template.format_map(row)
            return self._text(text, file, number, "prompt_template"), None, None, set()
        messages_column = self.column("messages")
        prompt_column = self.column("prompt")
        use_messages = "messages" in self.columns or (
            prompt_column not in row and messages_column in row
        )
        if use_messages:
            chat = self._chat(row.get(messages_column), file, number, messages_column)
            target = None
            if chat[-1]["role"] == "assistant":
                target, chat = chat[-1]["content"], chat[:-1]
            if not chat or all(m["role"] == "system" for m in chat):
                raise self._error(
                    "holds no user turn before its answer", file, number, messages_column
                )
            text = "\n\n".join(m["content"] for m in chat if m["role"] == "user")
            return text, chat, target, {messages_column}
        if prompt_column not in row:
            raise self._error(
                f"missing: the prompt column; the row has {', '.join(sorted(row)) or 'no fields'}"
                " (map it with `columns.prompt`, a `prompt_template` or `columns.messages`)",
                file,
                number,
                prompt_column,
            )
        text = self._text(row[prompt_column], file, number, prompt_column)
        return text, None, None, {prompt_column}

    def _chat(self, value: Any, file: str, number: int, column: str) -> list[dict[str, str]]:
        if not isinstance(value, list) or not value:
            raise self._error(
                "not a chat: expected a list of {role, content}", file, number, column
            )
        chat = []
        for turn, message in enumerate(value):
            role = message.get("role") if isinstance(message, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            if role not in CHAT_ROLES or not isinstance(content, str):
                raise self._error(
                    f"message {turn} is not {{role: {'|'.join(CHAT_ROLES)}, content: text}}",
                    file,
                    number,
                    column,
                )
            chat.append({"role": role, "content": self._text(content, file, number, column)})
        return chat

    def _text(self, value: Any, file: str, number: int, column: str) -> str:
        if not isinstance(value, str):
            raise self._error(f"expected text, got {type(value).__name__}", file, number, column)
        if not value.strip():
            raise self._error("empty", file, number, column)
        if len(value) > self.max_chars:
            raise self._error(f"longer than {self.max_chars} characters", file, number, column)
        return value

    @staticmethod
    def _error(problem: str, file: str, number: int, column: str) -> DatasetError:
        return DatasetError(problem, file=file, row=number, field=column, reason="unmappable")


def _scalar_text(value: Any, file: str, number: int, column: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise DatasetError(
        f"expected a text or number answer, got {type(value).__name__}",
        file=file,
        row=number,
        field=column,
        reason="unmappable",
    )
