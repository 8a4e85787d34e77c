"""Which weight transport a run uses: ``topology.weight_transport``, resolved here.

======================  =============================================================
``weight_transport``    the trainer's updater
======================  =============================================================
``auto``                NCCL into vLLM engines when the trainer has CUDA and the engines
                        are vLLM; the Ray object store otherwise (the inference actors
                        load it, whatever their backend)
``object_store``        :class:`~llmrl.transports.RayObjectStoreWeightUpdater`
``broadcast``           :class:`~llmrl.transports.BroadcastWeightUpdater` (gloo on CPU,
                        NCCL on GPUs) to the inference actors
``vllm``                straight into the vLLM engines: NCCL when the trainer has CUDA,
                        else a checked file per engine (vLLM's CPU build)
======================  =============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

import torch

from llmrl.topology.spec import WeightTransport
from llmrl.transports.broadcast import BroadcastWeightUpdater
from llmrl.transports.object_store import RayObjectStoreWeightUpdater
from llmrl.transports.vllm import VLLMFileWeightUpdater, VLLMNCCLWeightUpdater
from llmrl.transports.weights import WeightUpdater

WEIGHT_TRANSPORTS: tuple[str, ...] = get_args(WeightTransport)


def make_weight_updater(
    transport: WeightTransport | str,
    inference_actors: list[Any],
    vllm_engines: Sequence[Any] = (),
    ranks_per_engine: int = 1,
    address: str = "127.0.0.1",
    cuda: bool | None = None,
    push_timeout_s: float = WeightUpdater.push_timeout_s,
    collective_timeout_s: float = 600.0,
) -> WeightUpdater:
    """The trainer's weight updater for ``transport`` (see the module docstring).

    Args:
        transport: ``topology.weight_transport``.
        inference_actors: the inference (front) actors the env workers call.
        vllm_engines: the ``VLLMEngine`` actors behind them (empty for transformers).
        ranks_per_engine: workers per vLLM engine (tensor-parallel size).
        address: the trainer's address as the engines see it (broadcast, NCCL rendezvous).
        cuda: whether the trainer has a GPU (None: ``torch.cuda.is_available()``).
        push_timeout_s: how long a push waits for the engines
            (``runtime.timeouts.weight_push_s``).
        collective_timeout_s: the broadcast group's timeout, joining and per broadcast
            (``runtime.collective_timeout_s``).

    Raises:
        ValueError: an unknown transport, or ``vllm`` without vLLM engines.
    """
    if transport not in WEIGHT_TRANSPORTS:
        raise ValueError(
            f"weight_transport: must be one of {', '.join(WEIGHT_TRANSPORTS)}; got {transport!r}"
        )
    updater = _updater(transport, inference_actors, vllm_engines, ranks_per_engine, address, cuda)
    updater.push_timeout_s = push_timeout_s
    if isinstance(updater, BroadcastWeightUpdater):
        updater.timeout_s = collective_timeout_s
    return updater


def _updater(
    transport: str,
    inference_actors: list[Any],
    vllm_engines: Sequence[Any],
    ranks_per_engine: int,
    address: str,
    cuda: bool | None,
) -> WeightUpdater:
    """The updater of ``transport`` (checked), before its deadlines are set."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if transport == "auto":
        transport = "vllm" if vllm_engines and cuda else "object_store"
    if transport == "object_store":
        return RayObjectStoreWeightUpdater(inference_actors)
    if transport == "broadcast":
        return BroadcastWeightUpdater(
            inference_actors, address=address, backend="nccl" if cuda else "gloo"
        )
    if not vllm_engines:
        raise ValueError("weight_transport: 'vllm' needs vLLM engines (inference.backend 'vllm')")
    if cuda:
        return VLLMNCCLWeightUpdater(
            vllm_engines,
            master_address=address,
            ranks_per_engine=ranks_per_engine,
            fronts=inference_actors,
        )
    return VLLMFileWeightUpdater(vllm_engines, fronts=inference_actors)
