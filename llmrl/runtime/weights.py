"""The driver's side of weight sync: ask the trainer ranks to send their weights.

The collector calls ``weight_updater.push()`` after every optimizer step, as with any
:class:`~llmrl.transports.WeightUpdater`; here the weights are not in the driver's process, so
the push asks the trainer ranks, and rank 0 sends them straight to the engines with its own
updater (:meth:`~llmrl.runtime.trainer_rank.TrainerRank.push_weights`). A rebuilt inference
actor gets the last pushed weights from rank 0 too.
"""

from __future__ import annotations

from typing import Any

from llmrl.runtime.trainer_group import TrainerGroup
from llmrl.transports.weights import Delivery, Weights, WeightUpdater


class TrainerRanksWeightUpdater(WeightUpdater):
    """Pushes by asking ``ranks`` to send their weights to the engines."""

    needs_weights = False

    def __init__(self, *, ranks: TrainerGroup) -> None:
        super().__init__()
        self.ranks = ranks

    def _push(self, weights: Weights | None, version: int) -> Delivery:
        if weights is not None:
            raise ValueError("the trainer ranks send their own weights; push() takes none")
        stats = self.ranks.push_weights(version)
        return Delivery(stats.bytes, stats.checksum, stats.engine_checksums, stats.merged_bytes)

    def restore(self, old: Any, new: Any) -> bool:
        return self.ranks.restore_engine(old, new)
