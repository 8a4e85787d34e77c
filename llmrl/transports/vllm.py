"""The vLLM path: weights straight into :class:`~llmrl.policies.vllm_engine.VLLMEngine` actors.

- :class:`VLLMFileWeightUpdater` (vLLM's CPU build, engines on the trainer's node): the state
  dict goes into the object store once; every engine checks its checksum, writes it to a
  safetensors file in ``/dev/shm`` and loads it through vLLM's weight-transfer API, whose
  workers check the file's SHA-256 before touching the model
  (:mod:`llmrl.policies.vllm_file_transfer`).
- :class:`VLLMNCCLWeightUpdater` (engines on GPUs): the trainer joins an NCCL group with every
  engine worker as rank 0 and broadcasts each tensor from its GPU, with its fingerprint; each
  worker checks a tensor's fingerprint before loading it.

An engine reports, as the checksum of what it holds, the checksum it *verified* (of the
tensors it wrote to the file, or of the fingerprints it checked tensor by tensor): vLLM fuses
and repacks parameters (q/k/v, gate/up, oneDNN buffers) so its own state dict cannot be
fingerprinted under the trainer's names. Both updaters also record the version in the
inference actors that front the engines (``fronts``), which stamp it on their samples.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from llmrl.core.errors import MissingExtraError
from llmrl.core.ray_helpers import free_port, import_ray
from llmrl.core.weights_checksum import checksum_entry, combine_entries, weights_checksum
from llmrl.transports.weights import Delivery, Weights, WeightUpdater, as_state_dict

logger = logging.getLogger(__name__)


class VLLMFileWeightUpdater(WeightUpdater):
    """Weights to vLLM engine actors through the object store and a checked file each.

    Args:
        engines: Ray actor handles of :class:`~llmrl.policies.vllm_engine.VLLMEngine`.
        fronts: the inference actors in front of them (their version is set after a push).
        source: the trainer model pushed by default.
    """

    def __init__(
        self, engines: list[Any], fronts: Sequence[Any] = (), source: Weights | None = None
    ) -> None:
        super().__init__(source)
        if not engines:
            raise ValueError("VLLMFileWeightUpdater needs at least one engine")
        self.engines, self.fronts = list(engines), list(fronts)

    def _push(self, weights: Weights, version: int) -> Delivery:
        ray = import_ray("Pushing weights to vLLM engine actors")
        state = {name: tensor.detach().cpu() for name, tensor in as_state_dict(weights).items()}
        checksum = weights_checksum(state)
        pairs = ray.put(list(state.items()))
        loads = [engine.load_weights.remote(pairs, version, checksum) for engine in self.engines]
        self._await(loads, version, "load_weights (file)", "loading")
        stamps = [front.set_version.remote(version) for front in self.fronts]
        self._await(stamps, version, "set_version", "stamping the version")
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        return Delivery(nbytes, checksum, (checksum,) * len(self.engines))


class VLLMNCCLWeightUpdater(WeightUpdater):
    """Broadcast weights over NCCL from the trainer's GPU to vLLM engine actors.

    Assumes: CUDA and vLLM in this (trainer) process; ``engines`` are Ray actor handles of
    :class:`~llmrl.policies.vllm_engine.VLLMEngine` built with the llmrl worker extension
    (the default), each with ``ranks_per_engine`` workers (its tensor-parallel size); every
    engine worker can reach ``master_address:master_port`` (TCP rendezvous) and the trainer's
    GPU over NCCL. The group has ``1 + len(engines) * ranks_per_engine`` members: the trainer is
    rank 0, engine ``i``'s workers are ranks ``1 + i * ranks_per_engine`` onwards.

    The group is made on the first push (or :meth:`init_group`): every engine is asked to join
    (a Ray call that returns once all members have), then this process joins. Per tensor, the
    engines are told its name, dtype, shape and fingerprint (they allocate and wait in
    ``broadcast``), the trainer broadcasts it from rank 0 and waits for them to check and load
    it. Finally every engine returns the checksum of the fingerprints it checked and drops its
    prefix cache, whose KV entries came from the old weights. A tensor whose fingerprint does
    not match is refused; the tensors before it are already loaded (no staging copy on the
    GPU), and the push raises.

    Args:
        engines: the engine actors.
        master_address: address of this process as the engines see it.
        master_port: rendezvous port; None picks a free one.
        ranks_per_engine: workers per engine (tensor parallel size).
        device: the trainer's GPU (default: the current CUDA device).
        source: the trainer model pushed by default.
        fronts: the inference actors in front of the engines (their version is set).
    """

    def __init__(
        self,
        engines: list[Any],
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        ranks_per_engine: int = 1,
        device: torch.device | str | None = None,
        source: Weights | None = None,
        fronts: Sequence[Any] = (),
    ) -> None:
        super().__init__(source)
        if not engines:
            raise ValueError("VLLMNCCLWeightUpdater needs at least one engine")
        if ranks_per_engine < 1:
            raise ValueError(f"ranks_per_engine must be >= 1, got {ranks_per_engine}")
        self.engines, self.fronts = list(engines), list(fronts)
        self.master_address = master_address
        self.master_port = master_port
        self.ranks_per_engine = ranks_per_engine
        self.device = device
        self._comm: Any = None

    @property
    def world_size(self) -> int:
        """The trainer plus every engine worker."""
        return 1 + len(self.engines) * self.ranks_per_engine

    def init_group(self) -> None:
        """Make the NCCL group with every engine (idempotent)."""
        if self._comm is not None:
            return
        ray = import_ray("Broadcasting weights to vLLM engine actors")
        if any(not isinstance(engine, ray.actor.ActorHandle) for engine in self.engines):
            raise TypeError("VLLMNCCLWeightUpdater engines must be Ray actors of VLLMEngine")
        if not torch.cuda.is_available():
            raise RuntimeError("VLLMNCCLWeightUpdater needs a CUDA GPU in the trainer process")
        try:
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup
        except ImportError as error:
            raise MissingExtraError("vllm", "gpu", "NCCL weight updates") from error
        device = torch.device(self.device or f"cuda:{torch.cuda.current_device()}")
        self.device = device
        port = self.master_port or free_port()
        self.master_port = port
        joins = [
            engine.init_weight_update_group.remote(
                self.master_address, port, 1 + index * self.ranks_per_engine, self.world_size
            )
            for index, engine in enumerate(self.engines)
        ]
        group = StatelessProcessGroup.create(
            host=self.master_address, port=port, rank=0, world_size=self.world_size
        )
        self._comm = PyNcclCommunicator(group, device=device)
        ray.get(joins)
        logger.info(
            "NCCL weight-update group ready: %d engine(s), world size %d, %s:%d",
            len(self.engines),
            self.world_size,
            self.master_address,
            port,
        )

    def _push(self, weights: Weights, version: int) -> Delivery:
        self.init_group()
        import_ray("Broadcasting weights to vLLM engine actors")
        nbytes = 0
        stream = torch.cuda.current_stream(self.device)
        entries = []
        for name, tensor in as_state_dict(weights).items():
            tensor = tensor.detach().to(self.device).contiguous()
            entry = checksum_entry(name, tensor)  # on the GPU
            entries.append(entry)
            _, dtype_name, shape, fingerprint = entry
            receives = [
                engine.update_weight_from_broadcast.remote(
                    name, dtype_name, list(shape), fingerprint
                )
                for engine in self.engines
            ]
            self._comm.broadcast(tensor, src=0, stream=stream)
            self._await(receives, version, f"update_weight_from_broadcast {name}", "loading")
            nbytes += tensor.numel() * tensor.element_size()
        torch.cuda.synchronize(self.device)
        finish = [engine.finish_broadcast_update.remote(version) for engine in self.engines]
        held = self._await(finish, version, "finish_broadcast_update", "verifying")
        stamps = [front.set_version.remote(version) for front in self.fronts]
        self._await(stamps, version, "set_version", "stamping the version")
        return Delivery(nbytes, combine_entries(entries), tuple(held))

    def close(self) -> None:
        """Forget the NCCL communicator (the next push makes a new group)."""
        self._comm = None
