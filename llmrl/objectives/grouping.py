"""`GroupBuffer`: gathers the rows of each sample group until the group is complete.

GRPO-style estimators need all ``num_samples`` responses to a prompt at once, but a group's rows
may arrive split across collector calls or workers, interleaved with other groups. Rows carry an
explicit group id (``group_id``, written by ``DataLoadingPrimer``); the buffer keeps incomplete
groups, bounded by ``max_pending_groups`` (the oldest incomplete group is evicted first), and
hands back each group once, when its last row arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch
from tensordict import TensorDictBase

from llmrl.data.non_tensor import as_list
from llmrl.policies.policy_inputs import get_input


class GroupBuffer:
    """Buffers rows by group id and returns the groups that are complete.

    :meth:`add` returns the groups completed by this call, in the order they completed, each a
    batch ``[num_samples]`` holding its rows in arrival order. A group id is closed once its group
    is returned: later rows with that id (remembered for the last ``max_pending_groups``
    completed ids) raise, as do more than ``num_samples`` rows for one id, so no row is ever
    returned twice. ``required_keys`` are checked on every batch; the buffer is unchanged when
    :meth:`add` raises.

    ``stats["evicted_incomplete_groups"]`` counts incomplete groups dropped to keep at most
    ``max_pending_groups`` pending; rows arriving later for an evicted id start a new group.

    Entries may be ragged (lazy stacks of rows). Padded entries are concatenated, so the rows of
    one group must come in batches padded to the same widths: keep collector outputs ragged until
    after grouping.

    Example:
        >>> buffer = GroupBuffer(num_samples=2)
        >>> buffer.add(TensorDict({"group_id": torch.tensor([0, 1, 0])}, [3]))[0]["group_id"]
        tensor([0, 0])
        >>> buffer.pending_groups
        1
    """

    def __init__(
        self,
        num_samples: int,
        group_key: str = "group_id",
        max_pending_groups: int = 10_000,
        required_keys: tuple[str, ...] = (),
    ) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if max_pending_groups < 1:
            raise ValueError(f"max_pending_groups must be >= 1, got {max_pending_groups}")
        self.num_samples = num_samples
        self.group_key = group_key
        self.max_pending_groups = max_pending_groups
        self.required_keys = required_keys
        self.stats: dict[str, int] = {"evicted_incomplete_groups": 0}
        self._pending: OrderedDict[Hashable, list[TensorDictBase]] = OrderedDict()
        self._counts: dict[Hashable, int] = {}
        self._closed: OrderedDict[Hashable, None] = OrderedDict()

    @property
    def pending_groups(self) -> int:
        """Number of incomplete groups held."""
        return len(self._pending)

    def add(self, td: TensorDictBase) -> list[TensorDictBase]:
        """Buffer the rows of a batch ``[N]``; return the groups it completes."""
        if td.batch_dims != 1:
            raise ValueError(f"expected a batch [N], got {list(td.batch_size)} (use .reshape(-1))")
        for key in self.required_keys:
            get_input(td, key)
        rows_by_group: dict[Hashable, list[int]] = {}
        for row, group in enumerate(self._group_ids(td)):
            rows_by_group.setdefault(group, []).append(row)
        self._check(rows_by_group)
        completed: list[tuple[int, Hashable]] = []
        for group, rows in rows_by_group.items():
            self._pending.setdefault(group, []).append(td[torch.tensor(rows)])
            self._counts[group] = self._counts.get(group, 0) + len(rows)
            if self._counts[group] == self.num_samples:
                completed.append((rows[-1], group))
        groups = [self._pop(group) for _, group in sorted(completed, key=lambda item: item[0])]
        while len(self._pending) > self.max_pending_groups:
            oldest, _ = self._pending.popitem(last=False)
            del self._counts[oldest]
            self.stats["evicted_incomplete_groups"] += 1
        return groups

    def _group_ids(self, td: TensorDictBase) -> list[Hashable]:
        ids = get_input(td, self.group_key)
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 2 and ids.shape[1] == 1:
                ids = ids.squeeze(1)
            if ids.dim() != 1:
                raise ValueError(f"{self.group_key!r} must be [N], got {list(ids.shape)}")
        return as_list(ids)

    def _check(self, rows_by_group: dict[Hashable, list[int]]) -> None:
        for group, rows in rows_by_group.items():
            if group in self._closed:
                raise ValueError(
                    f"group {group!r} got {len(rows)} more row(s) after its {self.num_samples} "
                    "rows were complete and handed out"
                )
            total = self._counts.get(group, 0) + len(rows)
            if total > self.num_samples:
                raise ValueError(
                    f"group {group!r} has {total} rows, more than num_samples={self.num_samples}"
                )

    def _pop(self, group: Hashable) -> TensorDictBase:
        pieces = self._pending.pop(group)
        del self._counts[group]
        self._closed[group] = None
        if len(self._closed) > self.max_pending_groups:
            self._closed.popitem(last=False)
        return concat(pieces, f"group {group!r}")


def concat(pieces: list[TensorDictBase], what: str) -> TensorDictBase:
    """``torch.cat`` of batches ``[n_i]``, with a clear error when padded widths differ."""
    if len(pieces) == 1:
        return pieces[0]
    try:
        return torch.cat(pieces, dim=0)
    except RuntimeError as error:
        raise ValueError(
            f"cannot join the rows of {what}: they came in batches whose entries have different "
            f"shapes (padded to other widths?); keep collector outputs ragged until after "
            f"grouping. ({error})"
        ) from error


def rewards(group: TensorDictBase, reward_key: str) -> torch.Tensor:
    """The ``[G]`` float rewards of a group (``[G]`` or ``[G, 1]`` in the batch)."""
    reward = get_input(group, reward_key)
    if reward.dim() == 2 and reward.shape[1] == 1:
        reward = reward.squeeze(1)
    if reward.dim() != 1:
        raise ValueError(f"{reward_key!r} must be [N] or [N, 1], got {list(reward.shape)}")
    return reward if reward.is_floating_point() else reward.float()
