"""Advantage estimators beside GRPO's group normalisation (:class:`MCAdvantage`), chosen by
``advantage.estimator`` in a GRPO stage config.

Each is a :class:`~llmrl.objectives.advantages.GroupAdvantage`: it gathers sample groups (so
dynamic sampling and ``drop_zero_std`` work the same for every estimator) and overrides
``advantages``; ``r_i`` below is trajectory ``i``'s final reward::

    RLOO:         A_i = r_i - mean_{j != i} r_j   (within the group; = G / (G - 1) (r_i - mean_g))
    REINFORCE++:  R_i = r_i - beta * KL_i,   A_i = (R_i - mean_b R) / (std_b R + eps)

REINFORCE++'s baseline and scale are the whole batch's (every trajectory of the groups the call
completed; population std), not the group's. ``KL_i`` (``kl_coeff = beta > 0`` only) is the k1
estimate of ``KL(pi_old || pi_ref)`` summed over the trajectory's response tokens,
``sum_t (log pi_old_t - log pi_ref_t)``, from the sampling ``log_probs`` and the reference's
``ref_log_probs``. A batch (RLOO: a group) whose values are all equal gets advantages exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.objectives.advantages import CompletedGroup, GroupAdvantage, all_equal, check_eps
from llmrl.objectives.grouping import concat
from llmrl.objectives.token_level import field_rows

ReferenceScorer = Callable[[TensorDictBase], TensorDictBase]
"""Scores a batch with the reference model: returns it with ``ref_log_probs`` written."""


class RLOOAdvantage(GroupAdvantage):
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024): each response's
    baseline is the mean reward of the *other* responses of its group, with no std scaling.

    Args:
        num_samples: responses per group (G), at least 2: a group of one has no other response.
        drop_zero_std, **kwargs: see :class:`~llmrl.objectives.advantages.GroupAdvantage`.

    Example:
        advantage = RLOOAdvantage(num_samples=4)
        batch = advantage(collector_batch)  # None until a group is complete
    """

    def __init__(self, num_samples: int, drop_zero_std: bool = False, **kwargs: Any) -> None:
        if num_samples < 2:
            raise ValueError(
                f"num_samples={num_samples}: RLOO's baseline is the mean reward of the other "
                "responses to the same prompt, and a group of one has none; set num_samples "
                ">= 2 (or use REINFORCE++, whose baseline is the batch: estimator "
                "'reinforce_pp')"
            )
        super().__init__(num_samples, drop_zero_std, **kwargs)

    def advantages(self, returns: list[torch.Tensor]) -> list[torch.Tensor]:
        """``r_i - mean_{j != i} r_j`` within each group."""
        return [_leave_one_out(reward) for reward in returns]


def _leave_one_out(reward: torch.Tensor) -> torch.Tensor:
    if all_equal(reward):
        return torch.zeros_like(reward)
    others = (reward.sum() - reward) / (reward.shape[0] - 1)
    return reward - others


class ReinforcePlusPlusAdvantage(GroupAdvantage):
    """REINFORCE++ (Hu 2025): returns normalised over the whole batch, no group baseline; with
    ``kl_coeff > 0`` the KL to the reference is taken out of each return (see the module
    docstring). Works with one sample per prompt.

    Args:
        num_samples: responses per group (G); 1 is fine.
        kl_coeff: ``beta``, the weight of the KL in the return (0: off).
        eps: added to the batch std before dividing.
        reference: scores a batch with the reference model when it has no ``ref_log_probs``
            (one call per ``__call__``, on the kept groups); without it the batch must hold
            them when ``kl_coeff > 0``.
        log_probs_key, ref_log_probs_key: the sampling and the reference log-probs
            (:class:`~llmrl.data.LogProbs` with a ``response`` part).
        drop_zero_std, **kwargs: see :class:`~llmrl.objectives.advantages.GroupAdvantage`;
            ``drop_zero_std`` looks at the task rewards (before the KL).

    Example:
        advantage = ReinforcePlusPlusAdvantage(num_samples=1, kl_coeff=0.01)
        batch = advantage(scored_batch)  # scored_batch holds ref_log_probs
    """

    def __init__(
        self,
        num_samples: int,
        kl_coeff: float = 0.0,
        eps: float = 1e-6,
        drop_zero_std: bool = False,
        reference: ReferenceScorer | None = None,
        log_probs_key: str = "log_probs",
        ref_log_probs_key: str = "ref_log_probs",
        **kwargs: Any,
    ) -> None:
        if kl_coeff < 0:
            raise ValueError(f"kl_coeff must be >= 0, got {kl_coeff}")
        check_eps(eps)
        super().__init__(num_samples, drop_zero_std, **kwargs)
        self.kl_coeff = kl_coeff
        self.eps = eps
        self.reference = reference
        self.log_probs_key = log_probs_key
        self.ref_log_probs_key = ref_log_probs_key

    def __call__(self, td: TensorDictBase) -> TensorDictBase | None:
        """As :class:`~llmrl.objectives.advantages.GroupAdvantage`'s; with ``kl_coeff > 0``
        and no ``reference``, a batch without ``ref_log_probs`` is refused before it is
        buffered."""
        unscored = td.get(self.ref_log_probs_key, None) is None
        if self.kl_coeff > 0 and self.reference is None and unscored:
            raise ValueError(_needs_reference(self.kl_coeff, self.ref_log_probs_key))
        return super().__call__(td)

    def returns(self, groups: list[CompletedGroup]) -> list[torch.Tensor]:
        """``r_i - kl_coeff * KL_i`` per trajectory (the final rewards when ``kl_coeff`` is 0)."""
        if self.kl_coeff == 0:
            return super().returns(groups)
        batch = concat([group.rows for group in groups], "the completed groups")
        if batch.get(self.ref_log_probs_key, None) is None and self.reference is not None:
            batch = self.reference(batch)
        row_kl = response_kl(batch, self.log_probs_key, self.ref_log_probs_key, self.kl_coeff)
        returns, start = [], 0
        for group in groups:
            rows = group.rows.batch_size[0]
            kl = torch.zeros_like(group.reward).index_add_(
                0, group.episodes.index, row_kl[start : start + rows].to(group.reward)
            )
            returns.append(group.reward - self.kl_coeff * kl)
            start += rows
        return returns

    def advantages(self, returns: list[torch.Tensor]) -> list[torch.Tensor]:
        """``(R - mean_b) / (std_b + eps)`` over every return of the call."""
        every = torch.cat(returns)
        if all_equal(every):
            return [torch.zeros_like(ret) for ret in returns]
        mean, std = every.mean(), every.std(correction=0)
        return [(ret - mean) / (std + self.eps) for ret in returns]

    def _options(self) -> str:
        return f"kl_coeff={self.kl_coeff}"


def response_kl(
    batch: TensorDictBase, log_probs_key: str, ref_log_probs_key: str, kl_coeff: float
) -> torch.Tensor:
    """``[N]`` per row: ``sum_t (log_probs_t - ref_log_probs_t)`` over the response tokens."""
    reference = batch.get(ref_log_probs_key, None)
    if reference is None:
        raise ValueError(_needs_reference(kl_coeff, ref_log_probs_key))
    masks = batch.get("masks", None)
    sampled = field_rows(batch.get(log_probs_key), "response", masks)
    scored = field_rows(reference, "response", masks)
    if sampled is None or scored is None:
        missing = log_probs_key if sampled is None else ref_log_probs_key
        raise ValueError(f"{missing!r} has no response log-probs: the KL needs them")
    sums = []
    for row, (old, ref) in enumerate(zip(sampled, scored, strict=True)):
        if old.shape != ref.shape:
            raise ValueError(
                f"row {row}: {log_probs_key!r} has {old.shape[0]} response log-probs and "
                f"{ref_log_probs_key!r} {ref.shape[0]}; they must score the same tokens"
            )
        sums.append((old.detach() - ref.detach().to(old)).sum())
    return torch.stack(sums)


def _needs_reference(kl_coeff: float, ref_log_probs_key: str) -> str:
    return (
        f"kl_coeff={kl_coeff} (REINFORCE++'s KL in the reward; advantage.kl_in_reward_coeff in "
        f"a GRPO config) needs the reference model's log-probs {ref_log_probs_key!r} in the "
        "batch: score it with the reference first (RetrieveLogProb, or the estimator's "
        "`reference`), or set kl_coeff to 0"
    )
