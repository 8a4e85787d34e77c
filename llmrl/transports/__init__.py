"""Transports: how rollouts reach the trainer and how weights reach the engines.

Layer 3 (collectors, transports, per-rank training): imports layers 0-2 only (never collectors,
train or runtime).

Two contracts, as prime-rl keeps them:

- **weights** (trainer -> engines): ``WeightUpdater.push(weights, version) -> WeightSyncStats``
  (seconds, bytes, version, ``checksum`` of what was sent, ``engine_checksums`` of what each
  engine holds afterwards). Every push is versioned and checksummed; an engine refuses weights
  whose checksum does not match. The updater's ``version`` is the run's one policy version.
  Behind it: :class:`InProcessWeightUpdater` (a policy in this process),
  :class:`RayObjectStoreWeightUpdater` (one ``ray.put``, every actor loads it),
  :class:`BroadcastWeightUpdater` (buckets over a process group: gloo on CPU, NCCL on GPUs),
  and :class:`VLLMWeightUpdater` (straight into vLLM engines through vLLM's own weight-transfer
  engines, ``nccl`` or ``ipc``, or llmrl's ``llmrl_file`` on its CPU build), chosen by
  ``topology.weight_transport`` (:func:`~llmrl.transports.selection.make_weight_updater`).
- **rollouts** (env workers -> trainer): ``RolloutSender.send(batch)`` and
  ``RolloutReceiver.receive() -> batch``, a :class:`RolloutBatch` of finished trajectories in
  which every sample carries its ``policy_version`` (a sample without one is refused).
  In process (:func:`in_process_rollouts`) or through a Ray inbox actor
  (:func:`ray_rollouts`, what the GRPO stage's env workers send through).

Importing this package does not import Ray or vLLM.
"""

from llmrl.core.weights_checksum import WeightChecksumError, weights_checksum
from llmrl.transports.broadcast import (
    BroadcastReceiver,
    BroadcastSender,
    BroadcastWeightUpdater,
    WeightBroadcastGroup,
)
from llmrl.transports.in_process import InProcessWeightUpdater
from llmrl.transports.object_store import RayObjectStoreWeightUpdater
from llmrl.transports.packed_weights import PackedStateDict
from llmrl.transports.rollouts import (
    MissingPolicyVersion,
    RolloutBatch,
    RolloutReceiver,
    RolloutSender,
    in_process_rollouts,
    ray_rollouts,
)
from llmrl.transports.vllm import VLLMWeightUpdater
from llmrl.transports.weights import (
    VersionOnlyUpdater,
    WeightSyncStats,
    WeightUpdater,
)

__all__ = [
    "BroadcastReceiver",
    "BroadcastSender",
    "BroadcastWeightUpdater",
    "InProcessWeightUpdater",
    "MissingPolicyVersion",
    "PackedStateDict",
    "RayObjectStoreWeightUpdater",
    "RolloutBatch",
    "RolloutReceiver",
    "RolloutSender",
    "VLLMWeightUpdater",
    "VersionOnlyUpdater",
    "WeightBroadcastGroup",
    "WeightChecksumError",
    "WeightSyncStats",
    "WeightUpdater",
    "in_process_rollouts",
    "ray_rollouts",
    "weights_checksum",
]
