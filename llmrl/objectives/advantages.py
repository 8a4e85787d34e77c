"""`MCAdvantage`: group-relative Monte-Carlo advantages (GRPO, Dr. GRPO).

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
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from llmrl.objectives.grouping import GroupBuffer, concat, rewards

SCALES: tuple[str, ...] = ("group", "batch", "none")


class MCAdvantage:
    """Writes ``advantage`` (``[N]`` float) on complete groups of ``num_samples`` trajectories.

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
        scale: ``group``, ``batch`` or ``none`` (see the module docstring).
        eps: added to the std before dividing.
        drop_zero_std: drop groups whose rewards are all equal (counted in
            ``stats["dropped_zero_std_groups"]``); otherwise they get advantage 0.
        group_key, reward_key: where to read the group id and the reward (``[N]`` or ``[N, 1]``).
        max_pending_groups: bound on the incomplete groups kept in memory.
        advantage_key: where to write the advantage.
        trajectory_key, done_key: the trajectory id of each row and the flag of its last row
            (``[N]`` or ``[N, 1]``); ``trajectory_key=None``: every row is a trajectory.

    Example:
        >>> advantage = MCAdvantage(num_samples=4)
        >>> batch = advantage(collector_batch)  # None until a group is complete
        >>> batch["advantage"].shape
        torch.Size([8])
    """

    def __init__(
        self,
        num_samples: int,
        scale: str = "group",
        eps: float = 1e-6,
        drop_zero_std: bool = False,
        group_key: str = "group_id",
        reward_key: str = "reward",
        max_pending_groups: int = 10_000,
        advantage_key: str = "advantage",
        trajectory_key: str | None = "traj_id",
        done_key: str = "done",
    ) -> None:
        if scale not in SCALES:
            raise ValueError(f"unknown scale {scale!r}; options: {list(SCALES)}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.num_samples = num_samples
        self.scale = scale
        self.eps = eps
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
        for group in self._groups.add(td):
            episodes = self._groups.episodes(group)
            reward = rewards(group, self.reward_key)[episodes.last]  # [G]: final rewards
            if self.drop_zero_std and _all_equal(reward):
                self.stats["dropped_zero_std_groups"] += 1
                continue
            groups.append((group, reward, episodes.index))
        if not groups:
            return None
        batch_std = torch.cat([reward for _, reward, _ in groups]).std(correction=0)
        for group, reward, index in groups:
            group.set(self.advantage_key, self._advantage(reward, batch_std)[index])
        return concat([group for group, _, _ in groups], "the completed groups")

    def _advantage(self, reward: torch.Tensor, batch_std: torch.Tensor) -> torch.Tensor:
        if _all_equal(reward):
            return torch.zeros_like(reward)
        centred = reward - reward.mean()
        if self.scale == "none":
            return centred
        std = reward.std(correction=0) if self.scale == "group" else batch_std
        return centred / (std + self.eps)

    def __repr__(self) -> str:
        return (
            f"MCAdvantage(num_samples={self.num_samples}, scale={self.scale!r}, "
            f"drop_zero_std={self.drop_zero_std}, pending_groups={self.pending_groups})"
        )


def _all_equal(values: torch.Tensor) -> bool:
    """True when every value equals the first (exactly): a group with no reward signal."""
    return bool((values == values[0]).all())
