"""`TopKRewardSelector`: keeps the best responses of each complete group (rejection sampling /
expert iteration data for SFT)."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from llmrl.objectives.grouping import GroupBuffer, concat, rewards


class TopKRewardSelector:
    """Per complete group of ``num_samples`` responses, the at most ``top_k`` responses whose
    reward is strictly above the group's median.

    Rows are buffered by ``group_key`` id like :class:`MCAdvantage` does (groups may arrive
    split across calls; each row is returned at most once, ever). The median is the usual one
    (the mean of the two middle rewards for an even group size), so a group whose rewards are
    all equal keeps nothing. Kept rows come by decreasing reward (ties in arrival order), groups
    in the order they completed. ``__call__`` returns ``None`` when nothing is kept.

    Example:
        select = TopKRewardSelector(num_samples=4, top_k=1)
        best = select(batch)  # rewards [0, 1, 0, 0.5] in one group -> the row with 1
    """

    def __init__(
        self,
        num_samples: int,
        top_k: int,
        group_key: str = "group_id",
        reward_key: str = "reward",
        max_pending_groups: int = 10_000,
    ) -> None:
        if not 1 <= top_k <= num_samples:
            raise ValueError(f"top_k must be in [1, num_samples={num_samples}], got {top_k}")
        self.num_samples = num_samples
        self.top_k = top_k
        self.reward_key = reward_key
        self._groups = GroupBuffer(
            num_samples, group_key, max_pending_groups, required_keys=(reward_key,)
        )
        self.stats = self._groups.stats

    @property
    def pending_groups(self) -> int:
        """Number of incomplete groups waiting for more rows."""
        return self._groups.pending_groups

    def __call__(self, td: TensorDictBase) -> TensorDictBase | None:
        """Buffer ``td`` (``[N]``) and return the rows kept from the groups it completes."""
        kept = []
        for group in self._groups.add(td):
            reward = rewards(group, self.reward_key)
            above = (reward > reward.quantile(0.5)).nonzero().squeeze(1)
            order = torch.sort(reward[above], descending=True, stable=True).indices
            best = above[order[: self.top_k]]
            if len(best):
                kept.append(group[best])
        return concat(kept, "the kept rows") if kept else None

    def __repr__(self) -> str:
        return f"TopKRewardSelector(num_samples={self.num_samples}, top_k={self.top_k})"
