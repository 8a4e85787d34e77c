"""The weight transport's contract: ``push(weights, version) -> WeightSyncStats``.

One abstraction, :class:`WeightUpdater`, whatever carries the tensors (the implementations are
listed in :mod:`llmrl.transports`). ``weights`` is a model, a state dict or ``(name, tensor)``
pairs (Hugging Face names); with none given, the updater's ``source`` (the trainer model it was
built with) is pushed. Every push

- is **versioned**: ``version`` (default: the last one plus one) travels with the weights, every
  engine records it, and :attr:`WeightUpdater.version` is *the* policy version of the run: the
  collectors, the rollouts and the runtime read it from here and keep no count of their own;
- is **checksummed**: the sender computes :func:`~llmrl.core.weights_checksum.weights_checksum`
  of what it sends; every receiver computes it of what it received before loading and refuses
  a mismatch (:class:`~llmrl.core.weights_checksum.WeightChecksumError`, its weights untouched);
  after loading, each engine reports the checksum of the weights it now holds. Both land in the
  :class:`WeightSyncStats` (``checksum``, ``engine_checksums``), and each push is kept in
  ``updater.history``.

Example:
    updater = InProcessWeightUpdater(inference_policy, source=trainer_model)
    stats = updater.push()         # after an optimizer step
    stats.version, stats.checksum == stats.engine_checksums[0]
    # -> (1, True)
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from llmrl.core.deadlines import Deadline, Hung, wait_for

logger = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]
PUSH_SETTING = "runtime.timeouts.weight_push_s"
"""The config field that bounds a push (:attr:`WeightUpdater.push_timeout_s`)."""
Weights = torch.nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class WeightSyncStats:
    """One push: how long it took, how many bytes were transferred, the version it made, the
    checksum of the weights sent and, one per engine, the checksum of the weights each engine
    holds after loading them (equal to ``checksum`` when the push arrived intact)."""

    seconds: float
    bytes: int
    version: int
    checksum: str = ""
    engine_checksums: tuple[str, ...] = ()
    merged_bytes: int = 0
    """What a push of the whole merged model would have carried (LoRA adapter pushes; 0 for a
    push of the whole model)."""


@dataclass(frozen=True)
class Delivery:
    """What an implementation's ``_push`` reports: bytes transferred, the sent weights'
    checksum, each engine's checksum of the weights it holds afterwards, and (adapter pushes)
    the merged model's bytes."""

    bytes: int
    checksum: str = ""
    engine_checksums: tuple[str, ...] = ()
    merged_bytes: int = 0


class WeightUpdater(ABC):
    """Pushes weights to inference engines and records each push (see the module docstring).

    Args:
        source: what :meth:`push` sends when called without weights (the trainer's model).

    Attributes:
        version: the version of the weights the engines hold: 0 before any push, then the
            version of the last one. The one place a run keeps its policy version.
        history: every push's :class:`WeightSyncStats`.
    """

    needs_weights = True
    """False for updaters whose weights live elsewhere (trainer ranks send their own)."""
    push_timeout_s: float = 600.0
    """How long one push (and one :meth:`restore`) may wait for the engines before it raises
    :class:`~llmrl.core.deadlines.CallTimeout` naming the engine, the version and the phase
    (``runtime.timeouts.weight_push_s`` in the GRPO runtime)."""

    def __init__(self, source: Weights | None = None) -> None:
        self.source = source
        self.version = 0
        self.history: list[WeightSyncStats] = []

    def push(self, weights: Weights | None = None, version: int | None = None) -> WeightSyncStats:
        """Send ``weights`` (default: ``source``) to the engines as ``version`` (default: the
        last one plus one); once every engine has loaded them, ``version`` is the version."""
        weights = self.source if weights is None else weights
        if weights is None and self.needs_weights:
            raise ValueError(f"{type(self).__name__}.push needs weights (or a source= model)")
        version = self.version + 1 if version is None else int(version)
        start = time.perf_counter()
        self._deadline: Deadline | None = Deadline(self.push_timeout_s)
        try:
            delivery = self._push(weights, version)
        finally:
            self._deadline = None  # a restore between pushes gets a deadline of its own
        stats = WeightSyncStats(
            time.perf_counter() - start,
            int(delivery.bytes),
            version,
            delivery.checksum,
            tuple(delivery.engine_checksums),
            delivery.merged_bytes,
        )
        self.version = version
        self.history.append(stats)
        logger.debug(
            "%s pushed version %d: %d bytes, checksum %s",
            type(self).__name__,
            version,
            stats.bytes,
            stats.checksum[:12],
        )
        return stats

    @abstractmethod
    def _push(self, weights: Weights, version: int) -> Delivery:
        """Deliver the weights; what was delivered."""

    def restore(self, old: Any, new: Any) -> bool:
        """Put the inference actor ``new`` in the place of ``old`` (a dead one) with the last
        pushed weights; False when this updater has no way to (the default), True when done."""
        return False

    def _await(
        self, refs: list[Any], version: int, call: str, phase: str, role: str = "inference engine"
    ) -> list[Any]:
        """The results of ``refs`` (one call per engine, in engine order) within what is left
        of this push's deadline (outside a push: :attr:`push_timeout_s` from now);
        :class:`~llmrl.core.deadlines.CallTimeout` naming the first engine still busy
        otherwise."""
        hung = Hung(role=role, call=call, phase=phase, version=version, setting=PUSH_SETTING)
        deadline = getattr(self, "_deadline", None) or Deadline(self.push_timeout_s)
        return wait_for(refs, deadline, hung.each(range(len(refs))))


class VersionOnlyUpdater(WeightUpdater):
    """For a policy that shares the trainer's model: nothing to send, only the version moves.

    What a collector holds when it is given no weight updater, so that the version still has
    one owner. Pushing weights through it is an error.
    """

    needs_weights = False

    def _push(self, weights: Weights | None, version: int) -> Delivery:
        if weights is not None:
            raise ValueError(
                "weights were given but the collector has no weight_updater (its policy shares "
                "the trainer's model: give it one, e.g. InProcessWeightUpdater)"
            )
        return Delivery(0)


def as_state_dict(weights: Weights) -> StateDict:
    """A ``{name: tensor}`` dict from a model, a state dict or ``(name, tensor)`` pairs."""
    if isinstance(weights, torch.nn.Module):
        return dict(weights.state_dict())
    return dict(weights)


def state_dict_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of every tensor of a state dict (tied tensors count once per name)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())


def held_weights(model: torch.nn.Module, names: Iterable[str]) -> StateDict:
    """The tensors ``model`` holds under ``names`` (its state dict's, in its own dtype): what
    an engine checksums after loading a push of those names."""
    state = model.state_dict()
    return {name: state[name] for name in names}
