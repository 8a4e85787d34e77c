"""Which weight transport a run uses: ``topology.weight_transport``, resolved here.

======================  =============================================================
``weight_transport``    the trainer's updater
======================  =============================================================
``auto``                ``vllm`` when the trainer has CUDA and the engines are vLLM; the
                        Ray object store otherwise (the inference actors load it, whatever
                        their backend)
``object_store``        :class:`~llmrl.transports.RayObjectStoreWeightUpdater`
``broadcast``           :class:`~llmrl.transports.BroadcastWeightUpdater` (gloo on CPU,
                        NCCL on GPUs) to the inference actors
``vllm``                :class:`~llmrl.transports.vllm.VLLMWeightUpdater`: straight into the
                        vLLM engines through vLLM's weight-transfer engine :func:`vllm_backend`
                        picks (``ipc`` colocated, ``nccl`` on other GPUs, ``llmrl_file`` on CPU)
======================  =============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

import torch

from llmrl.topology.spec import WeightTransport
from llmrl.transports.broadcast import BroadcastWeightUpdater
from llmrl.transports.object_store import RayObjectStoreWeightUpdater
from llmrl.transports.vllm import VLLMWeightUpdater
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
    colocated: bool = False,
    rank: int = 0,
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
        colocated: the engines share the trainer's GPUs (``topology.colocated``).
        rank: the trainer rank building it (every rank pushes through ``ipc``; only rank 0
            through the others).

    Raises:
        ValueError: an unknown transport, or ``vllm`` without vLLM engines.
    """
    if transport not in WEIGHT_TRANSPORTS:
        raise ValueError(
            f"weight_transport: must be one of {', '.join(WEIGHT_TRANSPORTS)}; got {transport!r}"
        )
    cuda = torch.cuda.is_available() if cuda is None else cuda
    transport = resolved_transport(transport, bool(vllm_engines), cuda)
    if transport == "vllm":
        if not vllm_engines:
            raise ValueError(
                "weight_transport: 'vllm' needs vLLM engines (inference.backend 'vllm')"
            )
        updater: WeightUpdater = VLLMWeightUpdater(
            vllm_engines,
            backend=vllm_backend(colocated, cuda),
            fronts=inference_actors,
            ranks_per_engine=ranks_per_engine,
            rank=rank,
            master_address=address,
        )
    else:
        updater = _updater(transport, inference_actors, address, cuda)
    updater.push_timeout_s = push_timeout_s
    if isinstance(updater, BroadcastWeightUpdater):
        updater.timeout_s = collective_timeout_s
    return updater


def resolved_transport(transport: str, vllm_engines: bool, cuda: bool) -> str:
    """``transport`` with ``auto`` decided: ``vllm`` for vLLM engines and a trainer with CUDA,
    else ``object_store``."""
    if transport != "auto":
        return transport
    return "vllm" if vllm_engines and cuda else "object_store"


def engine_weight_backend(transport: str, colocated: bool, cuda: bool) -> str:
    """The weight-transfer backend to build vLLM engines with, so that they take what the
    trainer's updater of ``transport`` sends: the ``vllm`` transport's backend
    (:func:`vllm_backend`), else ``llmrl_file`` (the inference actors then load the weights
    into their engine themselves, :meth:`~llmrl.policies.vllm_engine.VLLMEngine.load_weights`)."""
    vllm = resolved_transport(transport, True, cuda) == "vllm"
    return vllm_backend(colocated, cuda) if vllm else "llmrl_file"


def vllm_backend(colocated: bool, cuda: bool) -> str:
    """vLLM's weight-transfer engine for the ``vllm`` transport: ``ipc`` when the engines are
    on the trainer's GPUs (colocated), ``nccl`` when the trainer has a GPU, else llmrl's
    ``llmrl_file`` (vLLM's CPU build; vLLM's own engines need CUDA)."""
    if colocated:
        return "ipc"
    return "nccl" if cuda else "llmrl_file"


def _updater(
    transport: str, inference_actors: list[Any], address: str, cuda: bool
) -> WeightUpdater:
    """The updater of a transport to the inference actors, before its deadlines are set."""
    if transport == "object_store":
        return RayObjectStoreWeightUpdater(inference_actors)
    return BroadcastWeightUpdater(
        inference_actors, address=address, backend="nccl" if cuda else "gloo"
    )
