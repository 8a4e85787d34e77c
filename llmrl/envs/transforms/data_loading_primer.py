"""`DataLoadingPrimer`: feeds ``ChatEnv.reset()`` with batches of dataset rows.

Rows are anything with ``id``, ``prompt`` and ``answer`` (a task ``Problem`` or a dict), and
optionally ``fields`` (the user's columns, a dict: the ``fields`` column of the batch, which
rewards read) and ``messages`` (a chat prompt: the conversation starts from it). Each
reset takes the next ``batch_size`` rows of a shuffled pass over the dataset (a new order every
epoch, reproducible from ``seed``) and repeats each row ``repeats`` times in a row, so GRPO
groups form: the G copies of a prompt share its ``prompt_id`` and a ``group_id`` unique to that
draw, and ``sample_index`` counts 0..G-1 within the group. The reference ``answer``, the row's
``fields`` and its id travel with every copy through the episode.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from llmrl.data import ChatHistory, History
from llmrl.envs.transforms.base import EnvTransform


class DataLoadingPrimer(EnvTransform):
    """Supplies reset batches from a dataset (see the module docstring).

    Example:
        primer = DataLoadingPrimer(problems, batch_size=8, repeats=4)
        env = ChatEnv(transforms=[primer])
        env.reset().batch_size
        # -> torch.Size([32])
    """

    def __init__(
        self,
        rows: Sequence[Any],
        batch_size: int,
        repeats: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        epochs: int | None = None,
        group_id_start: int = 0,
        group_id_step: int = 1,
    ) -> None:
        if batch_size < 1 or repeats < 1:
            raise ValueError(f"batch_size and repeats must be >= 1, got {batch_size}, {repeats}")
        if not rows:
            raise ValueError("DataLoadingPrimer needs at least one row")
        self.rows = [_as_row(row, index) for index, row in enumerate(rows)]
        self.chat_prompts = any(row["messages"] is not None for row in self.rows)
        self.batch_size = batch_size
        self.repeats = repeats
        self.shuffle = shuffle
        self.seed = seed
        self.epochs = epochs
        self.epoch = 0
        self._order: list[int] = self._epoch_order()
        self._position = 0
        self._next_group = 0  # groups drawn so far
        # group k is `group_id_start + k * group_id_step`: workers i of n use (i, n), no clashes
        self.group_id_start, self.group_id_step = group_id_start, group_id_step

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next_batch(self) -> TensorDictBase:
        """The next ``batch_size`` rows, each repeated ``repeats`` times."""
        picked = []
        while len(picked) < self.batch_size:
            if self._position == len(self._order):
                if self.epochs is not None and self.epoch + 1 >= self.epochs:
                    if picked:
                        break
                    raise StopIteration(f"dataset exhausted after {self.epochs} epoch(s)")
                self.epoch += 1
                self._order, self._position = self._epoch_order(), 0
            picked.append(self.rows[self._order[self._position]])
            self._position += 1
        drawn = torch.arange(self._next_group, self._next_group + len(picked))
        groups = self.group_id_start + drawn * self.group_id_step
        self._next_group += len(picked)
        repeated = [row for row in picked for _ in range(self.repeats)]
        batch = TensorDict(
            {
                "query": NonTensorStack(*(row["prompt"] for row in repeated)),
                "answer": NonTensorStack(*(row["answer"] for row in repeated)),
                "fields": NonTensorStack(*(row["fields"] for row in repeated)),
                "prompt_id": NonTensorStack(*(row["id"] for row in repeated)),
                "group_id": groups.repeat_interleave(self.repeats),
                "sample_index": torch.arange(self.repeats).repeat(len(picked)),
            },
            batch_size=[len(repeated)],
        )
        if self.chat_prompts:  # rows with a chat prompt start from it (ChatEnv.reset)
            chats = [
                row["messages"] or [{"role": "user", "content": row["prompt"]}] for row in repeated
            ]
            prompt = History.from_chats(chats)
            batch.set("history", ChatHistory(prompt=prompt, batch_size=[len(repeated)]))
        return batch

    def state_dict(self) -> dict[str, int]:
        """Where the primer is in the dataset, for checkpoints."""
        return {"epoch": self.epoch, "position": self._position, "next_group": self._next_group}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict`: the same rows come next."""
        self.epoch = state["epoch"]
        self._order = self._epoch_order()
        self._position = state["position"]
        self._next_group = state["next_group"]

    def __repr__(self) -> str:
        return (
            f"DataLoadingPrimer(rows={len(self.rows)}, batch_size={self.batch_size}, "
            f"repeats={self.repeats})"
        )


def _as_row(row: Any, index: int) -> dict[str, Any]:
    get = row.get if isinstance(row, dict) else lambda name: getattr(row, name, None)
    values: dict[str, Any] = {name: get(name) for name in ("id", "prompt", "answer")}
    missing = [name for name, value in values.items() if not isinstance(value, str)]
    if missing:
        raise ValueError(f"dataset row {index}: field(s) {missing} missing or not strings")
    fields, messages = get("fields") or {}, get("messages")
    if not isinstance(fields, dict):
        raise ValueError(f"dataset row {index}: 'fields' must be a dict, got {type(fields)}")
    if messages is not None and not (
        isinstance(messages, list) and all(isinstance(m, dict) for m in messages) and messages
    ):
        raise ValueError(f"dataset row {index}: 'messages' must be a non-empty list of dicts")
    return {**values, "fields": fields, "messages": messages}
