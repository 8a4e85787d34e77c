"""`Problem`: one row of a prepared dataset (prompt, reference answer, worked solution)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One dataset row of a task.

    ``answer`` is the normalized reference (``"42"``, or a JSON spec for countdown and ifeval);
    ``sft_target`` is a worked solution ending in the required answer format, when one exists.
    ``fields`` are the row's other columns (JSON values), kept for the reward: a user's reward
    function gets them as keyword arguments. ``messages``, when set, is the prompt as a chat
    (``{"role", "content"}`` dicts, no assistant reply last): the env starts the conversation
    from it instead of ``prompt`` (which then holds its text, for logs and the split hash).

    Example:
        >>> Problem(id="arithmetic-train-0-0", prompt="What is 2 + 3?", answer="5").answer
        '5'
    """

    id: str
    prompt: str
    answer: str
    sft_target: str | None = None
    meta: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)
    messages: list[dict] | None = None
