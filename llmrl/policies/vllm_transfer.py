"""The pieces of vLLM's weight-transfer API that llmrl plugs in (imports vLLM).

vLLM 0.32 splits a weight push in two engines of one backend: a ``TrainerWeightTransferEngine``
in the trainer, built by ``WeightTransferTrainerFactory.trainer_init(init_info, client=...,
source=...)``, and a ``WeightTransferEngine`` in every engine worker. The trainer engine's
``send_weights()`` drives the whole round trip through a *client* with four calls,
``init_weight_transfer_engine`` (once), ``start_weight_update``, ``update_weights`` (once or per
chunk, concurrently with the NCCL broadcast) and ``finish_weight_update``, and moves the bytes
its own way (NCCL broadcast, CUDA IPC handles, or llmrl's file). llmrl supplies:

- :class:`StateSource`: the ``WeightSource`` of one push's state dict (tied copies sent once);
- :class:`EngineClient`: the client over :class:`~llmrl.policies.vllm_engine.VLLMEngine` Ray
  actors, each call fanned out to every engine within the push's deadline, NCCL ranks offset
  per engine;
- :func:`trainer_engine`: the trainer engine of a backend (``nccl``, ``ipc``, ``llmrl_file``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from llmrl.policies import vllm_file_transfer

Wait = Callable[[list[Any], str, str], list[Any]]
"""``wait(refs, call, phase)``: the results of one Ray call per engine, within the deadline."""


class StateSource(WeightSource):
    """A state dict as vLLM's ``WeightSource``, in its order, each storage sent once (the
    output head tied to the embedding is not sent again: vLLM ties it itself)."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self.state = without_tied_copies(state)

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.state.items()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.state.items()


def without_tied_copies(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the later names of a storage already listed (tied weights)."""
    seen: set[tuple[str, int, int]] = set()
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = (str(tensor.device), tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        kept[name] = tensor.detach()
    return kept


class EngineClient:
    """vLLM's ``VLLMWeightSyncClient`` over ``VLLMEngine`` actors: every call goes to every
    engine and returns once all have answered (``wait`` bounds it).

    For NCCL the trainer engine asks every worker to join at ``rank_offset`` 1; engine ``i``'s
    workers are sent ``1 + i * ranks_per_engine`` instead, so that separate engines take
    separate ranks of the one group.
    """

    def __init__(self, engines: Sequence[Any], ranks_per_engine: int, wait: Wait) -> None:
        self.engines, self.ranks_per_engine, self.wait = list(engines), ranks_per_engine, wait

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        refs = [
            engine.init_weight_transfer_engine.remote(self._engine_init(init_info, index))
            for index, engine in enumerate(self.engines)
        ]
        self.wait(refs, "init_weight_transfer_engine", "joining")

    def start_weight_update(self) -> None:
        refs = [engine.start_weight_update.remote() for engine in self.engines]
        self.wait(refs, "start_weight_update", "starting")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        refs = [engine.update_weights.remote(update_info) for engine in self.engines]
        self.wait(refs, "update_weights", "loading")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        # vLLM's trainer engines pass no version; the updater sets it once every engine has
        # returned the checksum of what it loaded (VLLMEngine.set_weight_version)
        refs = [engine.finish_weight_update.remote() for engine in self.engines]
        self.wait(refs, "finish_weight_update", "finishing")

    def _engine_init(self, init_info: dict[str, Any], index: int) -> dict[str, Any]:
        if "rank_offset" not in init_info:
            return init_info
        return {
            **init_info,
            "rank_offset": init_info["rank_offset"] + index * self.ranks_per_engine,
        }


def trainer_engine(
    backend: str,
    client: Any,
    source: WeightSource,
    *,
    rank: int = 0,
    world_size: int = 2,
    master_address: str = "127.0.0.1",
    master_port: int = 0,
    folder: str | None = None,
) -> Any:
    """The trainer side of ``backend``, joined with the engines behind ``client``.

    ``world_size`` (NCCL) is the trainer plus every engine worker; ``rank`` is this trainer
    rank (rank 0 sends; the others only join the trainer's gathers, as vLLM's engines expect).
    """
    if backend == vllm_file_transfer.BACKEND:
        vllm_file_transfer.register()
        from llmrl.policies.vllm_file_engine import FileTrainerInitInfo

        info: Any = FileTrainerInitInfo(folder=folder, rank=rank)
    elif backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(
            master_address=master_address,
            master_port=master_port,
            world_size=world_size,
            rank=rank,
        )
    elif backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(rank=rank)
    else:
        raise ValueError(f"unknown vLLM weight-transfer backend {backend!r}")
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
