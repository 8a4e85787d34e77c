"""`GroupBuffer`: gathers the rows of each sample group until the group is complete.

GRPO-style estimators need all ``num_samples`` responses to a prompt at once, but a group's rows
may arrive split across collector calls or workers, interleaved with other groups. Rows carry an
explicit group id (``group_id``, written by ``DataLoadingPrimer``); the buffer keeps incomplete
groups, bounded by ``max_pending_groups`` (the oldest incomplete group is evicted first), and
hands back each group once, when its last row arrives.

A group is ``num_samples`` *trajectories*. With a ``trajectory_key`` (the collectors'
``traj_id``) the rows sharing a trajectory id are one episode, one row per assistant turn, and
the episode is complete once its ``done`` row arrived; without one (or when a batch has no such
column) every row is an episode of its own, complete on arrival (single-turn data).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
from tensordict import TensorDictBase

from llmrl.data.non_tensor import as_list
from llmrl.policies.policy_inputs import get_input


@dataclass(frozen=True)
class Episodes:
    """How a group's rows ``[n]`` make its ``G`` trajectories.

    ``index[r]``: the trajectory of row ``r`` (0..G-1, in the order the trajectories first
    appear); ``last[k]``: the row that ended trajectory ``k`` (its ``done`` row).

    Example:
        episodes.index.tolist(), episodes.last.tolist()   # rows: a0 b0 a1 (a done at a1)
        # -> ([0, 1, 0], [2, 1])
    """

    index: torch.Tensor
    last: torch.Tensor


@dataclass
class _Pending:
    """An incomplete group: its row batches, and which of its trajectories are still open."""

    pieces: list[TensorDictBase] = field(default_factory=list)
    trajectories: int = 0
    open: set[Hashable] = field(default_factory=set)
    ended: set[Hashable] = field(default_factory=set)


class GroupBuffer:
    """Buffers rows by group id and returns the groups that are complete.

    :meth:`add` returns the groups completed by this call, in the order they completed, each a
    batch holding its rows in arrival order (``num_samples`` rows, or with trajectories, every
    turn of its ``num_samples`` trajectories). A group id is closed once its group is returned:
    later rows with that id (remembered for the last ``max_pending_groups`` completed ids)
    raise, as do more than ``num_samples`` trajectories for one id and a row of a trajectory
    after its ``done`` row, so no row is ever returned twice. ``required_keys`` are checked on
    every batch; the buffer is unchanged when :meth:`add` raises.

    ``stats["evicted_incomplete_groups"]`` counts incomplete groups dropped to keep at most
    ``max_pending_groups`` pending; rows arriving later for an evicted id start a new group.

    Entries may be ragged (lazy stacks of rows). Padded entries are concatenated, so the rows of
    one group must come in batches padded to the same widths: keep collector outputs ragged until
    after grouping.

    Args:
        num_samples: trajectories per group (G).
        group_key: the group id column.
        max_pending_groups: bound on the incomplete groups kept.
        required_keys: columns every batch must have.
        trajectory_key: the trajectory id column (``traj_id``); None: one row per trajectory.
        done_key: the column (bool ``[N]`` or ``[N, 1]``) marking a trajectory's last row; read
            when the batch has ``trajectory_key``.

    Example:
        >>> from tensordict import TensorDict
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
        trajectory_key: str | None = None,
        done_key: str = "done",
    ) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if max_pending_groups < 1:
            raise ValueError(f"max_pending_groups must be >= 1, got {max_pending_groups}")
        self.num_samples = num_samples
        self.group_key = group_key
        self.max_pending_groups = max_pending_groups
        self.required_keys = required_keys
        self.trajectory_key = trajectory_key
        self.done_key = done_key
        self.stats: dict[str, int] = {"evicted_incomplete_groups": 0}
        self._pending: OrderedDict[Hashable, _Pending] = OrderedDict()
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
        for row, group in enumerate(self._column(td, self.group_key)):
            rows_by_group.setdefault(group, []).append(row)
        ends = self._trajectory_ends(td)
        updated = {
            group: self._advanced(group, [ends[row] for row in rows])
            for group, rows in rows_by_group.items()
        }
        completed: list[tuple[int, Hashable]] = []
        for group, rows in rows_by_group.items():
            state = updated[group]
            state.pieces.append(td[torch.tensor(rows)])
            self._pending[group] = state
            if state.trajectories == self.num_samples and not state.open:
                completed.append((rows[-1], group))
        groups = [self._pop(group) for _, group in sorted(completed, key=lambda item: item[0])]
        while len(self._pending) > self.max_pending_groups:
            self._pending.popitem(last=False)
            self.stats["evicted_incomplete_groups"] += 1
        return groups

    def episodes(self, group: TensorDictBase) -> Episodes:
        """The trajectories of a group :meth:`add` returned (see :class:`Episodes`)."""
        rows = group.batch_size[0]
        ends = self._trajectory_ends(group)
        if all(traj is None for traj, _ in ends):
            every = torch.arange(rows)
            return Episodes(index=every, last=every)
        order: dict[Hashable, int] = {}
        last: dict[int, int] = {}
        for row, (traj, done) in enumerate(ends):
            position = order.setdefault(traj, len(order))
            if done:
                last[position] = row
        return Episodes(
            index=torch.tensor([order[traj] for traj, _ in ends]),
            last=torch.tensor([last[position] for position in range(len(order))]),
        )

    def _trajectory_ends(self, td: TensorDictBase) -> list[tuple[Hashable | None, bool]]:
        """``(trajectory id, done)`` per row; ``(None, True)`` when rows are trajectories."""
        rows = td.batch_size[0]
        if self.trajectory_key is None or get_input(td, self.trajectory_key, False) is None:
            return [(None, True)] * rows
        ids = self._column(td, self.trajectory_key)
        done = get_input(td, self.done_key)
        done = done.reshape(-1) if isinstance(done, torch.Tensor) else done
        if len(done) != rows:
            raise ValueError(f"{self.done_key!r} must be [N] or [N, 1], got {list(done.shape)}")
        return list(zip(ids, (bool(d) for d in done), strict=True))

    def _advanced(self, group: Hashable, ends: list[tuple[Hashable | None, bool]]) -> _Pending:
        """The group's state after ``ends`` (a new object: the buffer is unchanged if this
        raises)."""
        unit = "rows" if all(traj is None for traj, _ in ends) else "trajectories"
        if group in self._closed:
            raise ValueError(
                f"group {group!r} got {len(ends)} more row(s) after its {self.num_samples} "
                f"{unit} were complete and handed out"
            )
        old = self._pending.get(group, _Pending())
        state = _Pending(list(old.pieces), old.trajectories, set(old.open), set(old.ended))
        for traj, done in ends:
            if traj is None:
                state.trajectories += 1
                continue
            if traj in state.ended:
                raise ValueError(
                    f"group {group!r}: trajectory {traj!r} got a row after its {self.done_key!r} "
                    "row"
                )
            if traj not in state.open:
                state.trajectories += 1
                state.open.add(traj)
            if done:
                state.open.discard(traj)
                state.ended.add(traj)
        if state.trajectories > self.num_samples:
            raise ValueError(
                f"group {group!r} has {state.trajectories} {unit}, more than "
                f"num_samples={self.num_samples}"
            )
        return state

    def _column(self, td: TensorDictBase, key: str) -> list[Hashable]:
        ids = get_input(td, key)
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 2 and ids.shape[1] == 1:
                ids = ids.squeeze(1)
            if ids.dim() != 1:
                raise ValueError(f"{key!r} must be [N], got {list(ids.shape)}")
        return as_list(ids)

    def _pop(self, group: Hashable) -> TensorDictBase:
        pieces = self._pending.pop(group).pieces
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


def group_slices(batch: TensorDictBase, group_key: str = "group_id") -> list[slice]:
    """The row ranges of the groups of ``batch``, whose rows come grouped (as
    :class:`GroupBuffer` and ``MCAdvantage`` return them): one slice per run of equal
    ``group_key`` ids. Groups of multi-turn episodes have different numbers of rows.

    Example:
        >>> from tensordict import TensorDict
        >>> group_slices(TensorDict({"group_id": torch.tensor([4, 4, 4, 9, 9])}, [5]))
        [slice(0, 3, None), slice(3, 5, None)]
    """
    ids = as_list(get_input(batch, group_key).reshape(-1))
    starts = [row for row, group in enumerate(ids) if row == 0 or group != ids[row - 1]]
    return [slice(start, end) for start, end in zip(starts, [*starts[1:], len(ids)], strict=True)]
