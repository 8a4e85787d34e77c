"""Collector-like rows for the advantage tests: token rows with rewards in groups, and turns of
multi-turn trajectories."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from llmrl.data import Tokens


def batch(group_ids: list, rewards: list[float], first_row: int = 0) -> TensorDict:
    """Collector-like rows: ragged tokens (row i has i + 1 response tokens), a row id."""
    size = len(group_ids)
    rows = range(first_row, first_row + size)
    tokens = Tokens.from_sequences(
        prompt=[torch.tensor([7, row]) for row in rows],
        response=[torch.full((row + 1,), row) for row in rows],
    )
    return TensorDict(
        {
            "tokens": tokens,
            "group_id": torch.tensor(group_ids),
            "reward": torch.tensor(rewards),
            "row_id": torch.tensor(list(rows)),
        },
        batch_size=[size],
    )


def turns(rows: list[tuple[int, int, bool, float]]) -> TensorDict:
    """Collector-like rows ``(group_id, traj_id, done, reward)``, with a row id."""
    groups, trajs, done, reward = zip(*rows, strict=True)
    return TensorDict(
        {
            "group_id": torch.tensor(groups),
            "traj_id": torch.tensor(trajs),
            "done": torch.tensor(done),
            "reward": torch.tensor(reward),
            "row_id": torch.arange(len(rows)),
        },
        batch_size=[len(rows)],
    )
