"""`MCAdvantage`: group-relative Monte-Carlo advantages (GRPO, Dr. GRPO), and
`GroupAdvantage`, the base of every advantage estimator that works on sample groups
(:mod:`llmrl.objectives.advantage_estimators`: RLOO, REINFORCE++).

Each prompt is answered ``num_samples`` times; a response's advantage is its reward relative to
the other responses of its group::

    scale="group":  A = (r - mean_g) / (std_g + eps)     (GRPO)
    scale="batch":  A = (r - mean_g) / (std_b + eps)     std_b: all rewards returned by the call
    scale="none":   A = r - mean_g                       (Dr. GRPO)

``std`` is the **population** standard deviation (``correction=0``, divide by ``G``): with
``scale="group"`` a group's advantages then have mean 0 and mean square 1 (up to ``eps``)
whatever its size. TRL and verl use the Bessel-corrected ``torch.std`` (divide by ``G - 1``);
for equal group sizes the two differ by the constant factor ``sqrt((G - 1) / G)``, i.e. only by
a rescaled learning rate.

A group whose rewards are all equal (exactly) has no signal: its advantages are exactly 0 (not
``0 / eps`` rounding noise), and ``drop_zero_std=True`` drops it. A one-sample group
(``num_samples=1``) is always such a group: advantage 0 (there is no baseline to compare with).

**Multi-turn episodes.** A "response" is a whole trajectory: a collector writes one row per
assistant turn, each with its ``traj_id`` and ``done``. The group is its ``num_samples``
trajectories (complete once each has its ``done`` row); ``r`` is the trajectory's **final
reward**, the ``reward`` of its ``done`` row (the task's score of the last reply, the answer
after any tool calls; earlier turns' rewards are not added, so replies that only call a tool
earn nothing by themselves); and the trajectory's advantage is written on every one of its
rows. ``std`` and ``mean`` are over the ``G`` trajectories, whatever their number of turns.
Rows without a ``traj_id`` column are each a trajectory of one turn (the single-turn case).

**Estimators.** :class:`GroupAdvantage` gathers the groups, drops the ones without signal
(``drop_zero_std``: all final rewards of the group equal) and writes each trajectory's
advantage on its rows; an estimator overrides :meth:`GroupAdvantage.advantages`, which maps the
final rewards of every group completed by a call to their advantages (and, for a reward that
depends on more than the task's score, :meth:`GroupAdvantage.returns`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.objectives.grouping import Episodes, GroupBuffer, concat, rewards

SCALES: tuple[str, ...] = ("group", "batch", "none")


@dataclass(frozen=True)
class CompletedGroup:
    """A group :class:`GroupAdvantage` completed and kept: its rows, how they make its ``G``
    trajectories, and their ``[G]`` final rewards."""

    rows: TensorDictBase
    episodes: Episodes
    reward: torch.Tensor


class GroupAdvantage(ABC):
    """Writes ``advantage`` (``[N]`` float) on complete groups of ``num_samples`` trajectories;
    subclasses say how (:meth:`advantages`).

    Rows are grouped by their explicit ``group_key`` id (never by prompt text), and within a
    group by ``trajectory_key`` (see the module docstring). Groups may arrive split across calls
    or workers: ``__call__`` buffers rows until their group is complete, then returns every
    group completed by the call (each group's rows together, in arrival order; groups in the
    order they completed), or ``None`` when no group was completed (or all were dropped). At
    most ``max_pending_groups`` incomplete groups are kept; the oldest is evicted first (counted
    in ``stats["evicted_incomplete_groups"]``). More than ``num_samples`` trajectories for one
    id raise a ``ValueError`` naming the group.

    Args:
        num_samples: trajectories (responses) per group (G).
        drop_zero_std: drop groups whose final rewards are all equal (counted in
            ``stats["dropped_zero_std_groups"]``).
        group_key, reward_key: where to read the group id and the reward (``[N]`` or ``[N, 1]``).
        max_pending_groups: bound on the incomplete groups kept in memory.
        advantage_key: where to write the advantage.
        trajectory_key, done_key: the trajectory id of each row and the flag of its last row
            (``[N]`` or ``[N, 1]``); ``trajectory_key=None``: every row is a trajectory.
    """

    def __init__(
        self,
        num_samples: int,
        drop_zero_std: bool = False,
        group_key: str = "group_id",
        reward_key: str = "reward",
        max_pending_groups: int = 10_000,
        advantage_key: str = "advantage",
        trajectory_key: str | None = "traj_id",
        done_key: str = "done",
    ) -> None:
        self.num_samples = num_samples
        self.drop_zero_std = drop_zero_std
        self.reward_key = reward_key
        self.advantage_key = advantage_key
        self._groups = GroupBuffer(
            num_samples,
            group_key,
            max_pending_groups,
            required_keys=(reward_key,),
            trajectory_key=trajectory_key,
            done_key=done_key,
        )
        self.stats = self._groups.stats
        self.stats["dropped_zero_std_groups"] = 0

    @property
    def pending_groups(self) -> int:
        """Number of incomplete groups waiting for more rows."""
        return self._groups.pending_groups

    def __call__(self, td: TensorDictBase) -> TensorDictBase | None:
        """Buffer ``td`` (``[N]``) and return the completed groups with ``advantage`` set."""
        groups = []
        for rows in self._groups.add(td):
            episodes = self._groups.episodes(rows)
            reward = rewards(rows, self.reward_key)[episodes.last]  # [G]: final rewards
            if self.drop_zero_std and all_equal(reward):
                self.stats["dropped_zero_std_groups"] += 1
                continue
            groups.append(CompletedGroup(rows, episodes, reward))
        if not groups:
            return None
        for group, advantage in zip(groups, self.advantages(self.returns(groups)), strict=True):
            group.rows.set(self.advantage_key, advantage[group.episodes.index])
        return concat([group.rows for group in groups], "the completed groups")

    def returns(self, groups: list[CompletedGroup]) -> list[torch.Tensor]:
        """Each group's ``[G]`` returns, what :meth:`advantages` reads: the final rewards
        (override to add to the task's reward, e.g. a KL penalty)."""
        return [group.reward for group in groups]

    @abstractmethod
    def advantages(self, returns: list[torch.Tensor]) -> list[torch.Tensor]:
        """The ``[G]`` advantages of each group completed by a call, from their ``[G]``
        returns (every group of the call at once: an estimator may use the whole batch).
        Each estimator (``MCAdvantage``, ``RLOOAdvantage``, ``ReinforcePlusPlusAdvantage``)
        implements it."""

    def _options(self) -> str:
        """The estimator's own options, for ``repr``."""
        return ""

    def __repr__(self) -> str:
        options = self._options()
        return (
            f"{type(self).__name__}(num_samples={self.num_samples}, {options}"
            f"{', ' if options else ''}drop_zero_std={self.drop_zero_std}, "
            f"pending_groups={self.pending_groups})"
        )


class MCAdvantage(GroupAdvantage):
    """GRPO's group-normalised advantages (see the module docstring for ``scale``); a group
    whose rewards are all equal gets exactly 0 (or is dropped with ``drop_zero_std``).

    Args:
        num_samples: trajectories (responses) per group (G).
        scale: ``group``, ``batch`` or ``none`` (see the module docstring).
        eps: added to the std before dividing.
        drop_zero_std, **kwargs: see :class:`GroupAdvantage`.

    Example:
        advantage = MCAdvantage(num_samples=4)
        batch = advantage(collector_batch)  # None until a group is complete
        batch["advantage"].shape
        # -> torch.Size([8])
    """

    def __init__(
        self,
        num_samples: int,
        scale: str = "group",
        eps: float = 1e-6,
        drop_zero_std: bool = False,
        **kwargs: Any,
    ) -> None:
        if scale not in SCALES:
            raise ValueError(f"unknown scale {scale!r}; options: {list(SCALES)}")
        check_eps(eps)
        super().__init__(num_samples, drop_zero_std, **kwargs)
        self.scale = scale
        self.eps = eps

    def advantages(self, returns: list[torch.Tensor]) -> list[torch.Tensor]:
        """``(r - mean_g) / (std + eps)`` per group (``std``: ``scale``'s)."""
        batch_std = torch.cat(returns).std(correction=0)
        return [self._group_advantage(reward, batch_std) for reward in returns]

    def _group_advantage(self, reward: torch.Tensor, batch_std: torch.Tensor) -> torch.Tensor:
        if all_equal(reward):
            return torch.zeros_like(reward)
        centred = reward - reward.mean()
        if self.scale == "none":
            return centred
        std = reward.std(correction=0) if self.scale == "group" else batch_std
        return centred / (std + self.eps)

    def _options(self) -> str:
        return f"scale={self.scale!r}"


def check_eps(eps: float) -> None:
    """Reject a negative ``eps`` (the std's offset)."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def all_equal(values: torch.Tensor) -> bool:
    """True when every value equals the first (exactly): a group with no reward signal."""
    return bool((values == values[0]).all())
