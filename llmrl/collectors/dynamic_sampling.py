"""`DynamicSampler`: fill a step's batch with groups that carry a learning signal (DAPO's
dynamic sampling).

A group whose ``num_samples`` rewards are all equal has advantage 0 everywhere: it adds nothing
to the policy gradient, only shrinks the batch. With ``MCAdvantage(drop_zero_std=True)`` such
groups are dropped, and the sampler replaces them: it collects more rounds until the step holds
``groups`` informative groups, then trains on exactly that many::

    round 0:   batch = collect(0)  ->  advantage(batch)  ->  informative groups so far
    round r:   fewer than `groups`?  collect(r) again  (at most `max_resample_rounds` times)
    trained:   the first `groups` informative groups (whole groups, in completion order)

**A round is a whole step's batch.** ``collect`` returns what one step of the collector
returns (every env worker draws its equal share of ``prompts_per_step`` prompts again), not
just the missing number of prompts: the workers' shares stay equal, the engines keep serving
full, evenly batched requests, no group is left half-sampled in a worker, and in async mode a
batch the sampler already drew ahead is used as it is. The price is surplus: informative groups
beyond ``groups`` are not trained on (``surplus_groups``; carrying them to the next step would
make them older than ``max_staleness`` allows).

**The bound.** After ``max_resample_rounds`` extra rounds (or when the data runs out) the step
trains on the informative groups found so far, fewer than ``groups``, and a warning says so;
with none, nothing is trained on that step. ``max_resample_rounds=0`` only drops.

Without ``drop_zero_std`` a step is one round and every completed group is trained on (groups
without signal with advantage 0), as before.

Metrics of each :meth:`DynamicSampler.sample` (:attr:`SampledStep.metrics`):

- ``sampling_rounds``: batches collected for the step (1 + resample rounds);
- ``resampled_groups``: groups completed in the resample rounds;
- ``zero_std_groups``: groups without reward signal among the step's (dropped with
  ``drop_zero_std``);
- ``informative_group_fraction``: groups with signal / groups completed, over every round;
- ``trained_groups``: groups in the trained batch; ``surplus_groups``: informative groups
  collected beyond ``groups`` and not trained on.

A group has signal when some row's advantage is not 0: the group estimators (``MCAdvantage``,
``RLOOAdvantage``) give a group whose rewards are all equal exactly 0; REINFORCE++'s batch
baseline does not, so with ``drop_zero_std`` every estimator drops the groups whose rewards are
all equal (:class:`~llmrl.objectives.GroupAdvantage`). Groups are told apart by their
``group_id`` (the estimators return each group's rows together), so a group may hold any number
of rows (multi-turn episodes: one row per turn).

Example:
    sampler = DynamicSampler(MCAdvantage(4, drop_zero_std=True), groups=8,
                             max_resample_rounds=3)
    step = sampler.sample(lambda round_index: next(batches))
    step.trained.batch_size, step.metrics["sampling_rounds"]
    # -> (torch.Size([32]), 2.0)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tensordict import TensorDictBase

from llmrl.objectives.grouping import concat, group_slices

if TYPE_CHECKING:
    from llmrl.objectives import GroupAdvantage

logger = logging.getLogger(__name__)


@dataclass
class SampledStep:
    """What one step sampled: every collected row, and the groups to train on."""

    batch: TensorDictBase
    """Every row collected for the step, all rounds in order (rollout statistics, samples)."""
    trained: TensorDictBase | None
    """The groups to train on, ``advantage`` set; None when no group qualified."""
    underfilled: bool = False
    """Whether the bound stopped the sampling short of the wanted groups."""
    metrics: dict[str, float] = field(default_factory=dict)
    """See the module docstring."""


class DynamicSampler:
    """Collects rounds until ``groups`` informative groups are found (see the module docstring).

    Args:
        advantage: the step's advantage estimator (a
            :class:`~llmrl.objectives.GroupAdvantage`); with ``drop_zero_std`` the sampler
            resamples, without it a step is one round.
        groups: informative groups a step trains on (``prompts_per_step``).
        max_resample_rounds: extra rounds a step may collect (``advantage.max_resample_rounds``).
    """

    def __init__(self, advantage: GroupAdvantage, groups: int, max_resample_rounds: int) -> None:
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        if max_resample_rounds < 0:
            raise ValueError(f"max_resample_rounds must be >= 0, got {max_resample_rounds}")
        self.advantage = advantage
        self.groups = groups
        self.max_resample_rounds = max_resample_rounds if advantage.drop_zero_std else 0

    def sample(self, collect: Callable[[int], TensorDictBase]) -> SampledStep:
        """Call ``collect(round_index)`` (0 first) for batches until the step is full or the
        bound is hit. ``StopIteration`` from the first call propagates (no data at all); from a
        later one it ends the step with what was found."""
        batches: list[TensorDictBase] = []
        scored: list[TensorDictBase] = []
        found = completed = informative = resampled = 0
        while not batches or self._wants_more(found, len(batches)):
            try:
                batch = collect(len(batches))
            except StopIteration:
                if not batches:
                    raise
                logger.warning("dynamic sampling: the data ran out after %d round(s)", len(batches))
                break
            dropped = self._dropped()
            out = self.advantage(batch)
            returned = 0 if out is None else len(group_slices(out))
            groups = returned + self._dropped() - dropped
            if out is not None:
                scored.append(out)
                informative += _groups_with_signal(out, self.advantage.advantage_key)
            resampled += groups if batches else 0
            batches.append(batch)
            completed += groups
            found += returned
        trained = concat(scored, "the step's groups") if scored else None
        kept = found
        if self.advantage.drop_zero_std and found > self.groups:
            assert trained is not None
            trained, kept = trained[: group_slices(trained)[self.groups - 1].stop], self.groups
        underfilled = self.advantage.drop_zero_std and found < self.groups
        # with max_resample_rounds=0 (drop only) a short step is what was asked for: it trains
        # on the groups with signal and skips the forward and backward passes of the others
        if underfilled and (self.max_resample_rounds or not found):
            self._warn(found, len(batches))
        metrics = {
            "sampling_rounds": float(len(batches)),
            "resampled_groups": float(resampled),
            "zero_std_groups": float(completed - informative),
            "informative_group_fraction": informative / completed if completed else 0.0,
            "trained_groups": float(kept),
            "surplus_groups": float(found - kept),
        }
        return SampledStep(concat(batches, "the step's batches"), trained, underfilled, metrics)

    def _wants_more(self, found: int, rounds: int) -> bool:
        """Whether another round is due: dropping, short of groups, and within the bound."""
        return (
            self.advantage.drop_zero_std
            and found < self.groups
            and rounds <= self.max_resample_rounds
        )

    def _dropped(self) -> int:
        return int(self.advantage.stats.get("dropped_zero_std_groups", 0))

    def _warn(self, found: int, rounds: int) -> None:
        logger.warning(
            "dynamic sampling: %d of the %d wanted groups had a reward signal after %d "
            "round(s) (advantage.max_resample_rounds=%d); %s. Raise "
            "advantage.max_resample_rounds, or check that the rewards can differ within a "
            "group (all responses right, or all wrong, give no signal)",
            found,
            self.groups,
            rounds,
            self.max_resample_rounds,
            "training on those" if found else "nothing to train on this step",
        )


def _groups_with_signal(batch: TensorDictBase, advantage_key: str) -> int:
    """Groups (runs of one ``group_id``: G rows, or every turn of G multi-turn episodes) with a
    non-zero advantage somewhere."""
    advantage = batch.get(advantage_key).reshape(-1)
    return sum(bool((advantage[rows] != 0).any()) for rows in group_slices(batch))
