"""`WeightSyncWorkerExtension`: weight-loading methods that vLLM mixes into its GPU workers.

vLLM builds its worker class at run time from ``worker_extension_cls`` (a dotted name, so the
class is importable in every worker process, Ray or multiprocessing). Its methods run inside
each worker, called from the engine through ``LLM.collective_rpc(method_name, args=...)``; there
``self`` is the vLLM worker, with ``self.model_runner.model`` (the model, sharded for tensor
parallelism) and ``self.device`` (the worker's GPU).

What it adds: the NCCL path for GPU engines on other nodes than the trainer.
:meth:`WeightSyncWorkerExtension.init_weight_update_group` then
:meth:`WeightSyncWorkerExtension.update_weight_from_broadcast` per tensor: a trainer process
(rank 0) broadcasts each tensor over NCCL to every worker of every engine. Engines on the
trainer's node (and every engine of vLLM's CPU build) take weights through vLLM's
weight-transfer API instead (:mod:`llmrl.policies.vllm_file_transfer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llmrl.core.weights_checksum import WeightChecksumError, tensor_fingerprint

WORKER_EXTENSION = "llmrl.policies.vllm_worker_extension.WeightSyncWorkerExtension"
"""The dotted name to pass to vLLM as ``worker_extension_cls``."""


class WeightSyncWorkerExtension:
    """Methods added to every vLLM worker so a trainer can push new weights.

    Pass ``worker_extension_cls=WORKER_EXTENSION`` when building ``vllm.LLM`` (the
    :class:`~llmrl.policies.vllm_engine.VLLMEngine` does) and call the methods through
    ``LLM.collective_rpc``; each worker of the engine runs them on its own shard.

    Example (NCCL, one engine with 1 worker, a trainer as rank 0 of a group of 2):
        engine.init_weight_update_group(address, port, rank_offset=1, world_size=2)
        # trainer: comm = PyNcclCommunicator(StatelessProcessGroup.create(..., rank=0), dev)
        for name, p in model.named_parameters():
            handle = engine_actor.update_weight_from_broadcast.remote(
                name, str(p.dtype).removeprefix("torch."), list(p.shape))
            comm.broadcast(p, src=0, stream=torch.cuda.current_stream())
            ray.get(handle)
    """

    # Set by vLLM's worker, listed here for readers and type checkers.
    model_runner: Any
    device: torch.device

    def init_weight_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int
    ) -> None:
        """Join an NCCL group in which the trainer (rank 0) broadcasts new weights.

        This worker's rank is its rank inside the engine plus ``rank_offset`` (1 for the first
        engine when the trainer is rank 0; engine ``i`` with TP workers each: ``1 + i * TP``).
        Every member, the trainer included, must call in; the call returns once all have.
        """
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.parallel_state import get_world_group
        from vllm.distributed.utils import StatelessProcessGroup

        rank = get_world_group().rank + rank_offset
        group = StatelessProcessGroup.create(
            host=master_address, port=int(master_port), rank=rank, world_size=world_size
        )
        self._weight_update_comm = PyNcclCommunicator(group, device=self.device)

    def update_weight_from_broadcast(
        self, name: str, dtype_name: str, shape: Sequence[int], fingerprint: int | None = None
    ) -> None:
        """Receive one tensor broadcast by rank 0 of the weight-update group and load it,
        once its :func:`~llmrl.core.weights_checksum.tensor_fingerprint` matches
        ``fingerprint`` (when given; a mismatch raises and the tensor is not loaded).

        ``dtype_name`` is a torch dtype name (``"bfloat16"`` or ``"torch.bfloat16"``).
        """
        comm = getattr(self, "_weight_update_comm", None)
        if comm is None:
            raise RuntimeError(
                "update_weight_from_broadcast needs a weight-update group: call "
                "init_weight_update_group on every worker (and in the trainer) first"
            )
        weight = torch.empty(list(shape), dtype=_dtype(dtype_name), device=self.device)
        comm.broadcast(weight, src=0, stream=torch.cuda.current_stream())
        if fingerprint is not None and tensor_fingerprint(weight) != int(fingerprint):
            raise WeightChecksumError(
                f"vLLM worker: tensor {name!r} arrived with another fingerprint than the "
                "trainer sent; refused (not loaded)"
            )
        self.model_runner.model.load_weights(weights=[(name, weight)])
        del weight


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name")
    return dtype
