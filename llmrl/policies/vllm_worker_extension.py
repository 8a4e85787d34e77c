"""`WeightSyncWorkerExtension`: weight-loading methods that vLLM mixes into its GPU workers.

vLLM builds its worker class at run time from ``worker_extension_cls`` (a dotted name, so the
class is importable in every worker process, Ray or multiprocessing). Its methods run inside
each worker, called from the engine through ``LLM.collective_rpc(method_name, args=...)``; there
``self`` is the vLLM worker, with ``self.model_runner.model`` (the model, sharded for tensor
parallelism) and ``self.device`` (the worker's GPU).

Two ways in for new weights:

- :meth:`WeightSyncWorkerExtension.load_weights_from_tensors`: the tensors travel with the call
  (from CPU memory; simplest, fine for small models and tests);
- :meth:`WeightSyncWorkerExtension.init_weight_update_group` then
  :meth:`WeightSyncWorkerExtension.update_weight_from_broadcast` per tensor: a trainer process
  (rank 0) broadcasts each tensor over NCCL to every worker of every engine.

``vLLM``'s engine-core process decodes call arguments with msgpack, which turns a tensor nested in
a list into raw fields; :func:`pack_named_tensors` therefore sends each tensor as
``(name, dtype, shape, bytes)``, plain data that survives every transport (msgpack, pickle, Ray),
and the worker rebuilds it with :func:`unpack_named_tensor`.

Example (what :class:`~llmrl.policies.vllm_engine.VLLMEngine` does):
    >>> llm = LLM(model, worker_extension_cls=WORKER_EXTENSION)
    >>> llm.collective_rpc("load_weights_from_tensors", args=(pack_named_tensors(weights),))
    >>> llm.collective_rpc("checksum_weights")
    [12345.6]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

WORKER_EXTENSION = "llmrl.policies.vllm_worker_extension.WeightSyncWorkerExtension"
"""The dotted name to pass to vLLM as ``worker_extension_cls``."""

PackedTensor = tuple[str, str, list[int], bytes]
"""``(name, dtype name, shape, raw bytes)``: one tensor as plain data."""


def pack_named_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[PackedTensor]:
    """Turn ``(name, tensor)`` pairs into plain ``(name, dtype, shape, bytes)`` tuples.

    Works for every dtype (bfloat16 included): the bytes are the tensor's own, read as uint8.
    """
    packed = []
    for name, tensor in named_tensors:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        dtype = str(tensor.dtype).removeprefix("torch.")
        packed.append((name, dtype, list(tensor.shape), data))
    return packed


def unpack_named_tensor(entry: Sequence[Any]) -> tuple[str, torch.Tensor]:
    """One ``(name, tensor)`` pair from a packed entry, or from a ``(name, tensor)`` pair."""
    if len(entry) == 2 and isinstance(entry[1], torch.Tensor):
        return str(entry[0]), entry[1]
    if len(entry) != 4:
        raise ValueError(
            "expected (name, tensor) or (name, dtype, shape, bytes) entries, got "
            f"{len(entry)} fields"
        )
    name, dtype_name, shape, data = entry
    dtype = _dtype(dtype_name)
    if not data:
        return str(name), torch.empty(list(shape), dtype=dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return str(name), raw.view(dtype).reshape(list(shape))


class WeightSyncWorkerExtension:
    """Methods added to every vLLM worker so a trainer can push new weights.

    Pass ``worker_extension_cls=WORKER_EXTENSION`` when building ``vllm.LLM`` (the
    :class:`~llmrl.policies.vllm_engine.VLLMEngine` does) and call the methods through
    ``LLM.collective_rpc``; each worker of the engine runs them on its own shard.

    Example (NCCL, one engine with 1 worker, a trainer as rank 0 of a group of 2):
        >>> engine.init_weight_update_group(address, port, rank_offset=1, world_size=2)
        >>> # trainer: comm = PyNcclCommunicator(StatelessProcessGroup.create(..., rank=0), dev)
        >>> for name, p in model.named_parameters():
        ...     handle = engine_actor.update_weight_from_broadcast.remote(
        ...         name, str(p.dtype).removeprefix("torch."), list(p.shape))
        ...     comm.broadcast(p, src=0, stream=torch.cuda.current_stream())
        ...     ray.get(handle)
    """

    # Set by vLLM's worker, listed here for readers and type checkers.
    model_runner: Any
    device: torch.device

    def load_weights_from_tensors(self, named_tensors: Sequence[Sequence[Any]]) -> None:
        """Load ``(name, tensor)`` pairs (or :func:`pack_named_tensors` entries) into the model.

        Names are the Hugging Face checkpoint names (``model.layers.0.self_attn.q_proj.weight``);
        the model's own ``load_weights`` maps them onto vLLM's fused and sharded parameters.
        Tensors are moved to the worker's GPU one at a time.
        """
        device = self.device

        def on_device() -> Iterator[tuple[str, torch.Tensor]]:
            for entry in named_tensors:
                name, tensor = unpack_named_tensor(entry)
                yield name, tensor.to(device, non_blocking=True)

        self.model_runner.model.load_weights(weights=on_device())
        torch.cuda.synchronize(device)

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
        self, name: str, dtype_name: str, shape: Sequence[int]
    ) -> None:
        """Receive one tensor broadcast by rank 0 of the weight-update group and load it.

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
        self.model_runner.model.load_weights(weights=[(name, weight)])
        del weight

    def checksum_weights(self) -> float:
        """Sum of every parameter of this worker's shard, in float64 (tests check loads with it)."""
        total = 0.0
        for _, parameter in self.model_runner.model.named_parameters():
            total += torch.sum(parameter.detach(), dtype=torch.float64).item()
        return total


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name")
    return dtype
