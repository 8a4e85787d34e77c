"""Weight synchronisation: get the trainer's new weights into the inference policies.

One abstraction, :class:`WeightUpdater`: ``push(weights) -> WeightSyncStats`` (seconds, bytes,
version), every push recorded in ``updater.history``. ``weights`` is a model, a state dict or
``(name, tensor)`` pairs (Hugging Face names); with none given, the updater's ``source`` (the
trainer model it was built with) is pushed. Three ways:

- :class:`InProcessWeightUpdater`: the policy lives in this process. When it *is* the trainer's
  model nothing is copied (bytes 0, only the version moves); otherwise the state dict is copied
  into it (``load_state_dict``, or ``load_weights`` for a vLLM policy).
- :class:`RayObjectStoreWeightUpdater`: Ray inference actors. The CPU state dict is put in the
  object store once and every actor loads it (an
  :class:`~llmrl.collectors.ray_collector.InferenceActor` into its policy, a
  :class:`~llmrl.policies.vllm_engine.VLLMEngine` actor with ``load_weights``).
- :class:`VLLMNCCLWeightUpdater`: vLLM engine actors on GPUs. The trainer joins an NCCL group
  with every engine worker as rank 0 and broadcasts each tensor straight from its GPU.

Example:
    >>> updater = InProcessWeightUpdater(inference_policy, source=trainer_model)
    >>> stats = updater.push()         # after an optimizer step
    >>> stats.bytes, stats.seconds, stats.version
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from llmrl.collectors.packed_weights import PackedStateDict
from llmrl.core.errors import MissingExtraError
from llmrl.core.ray_helpers import free_port, import_ray

logger = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]
Weights = torch.nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class WeightSyncStats:
    """One push: how long it took, how many bytes were transferred, the version it made."""

    seconds: float
    bytes: int
    version: int


class WeightUpdater(ABC):
    """Pushes weights to inference policies and records each push (see the module docstring).

    Args:
        source: what :meth:`push` sends when called without weights (the trainer's model).
    """

    needs_weights = True
    """False for updaters whose weights live elsewhere (trainer ranks send their own)."""

    def __init__(self, source: Weights | None = None) -> None:
        self.source = source
        self.version = 0
        self.history: list[WeightSyncStats] = []

    def push(self, weights: Weights | None = None, version: int | None = None) -> WeightSyncStats:
        """Send ``weights`` (default: ``source``) to the targets; ``version`` defaults to the
        last one plus one."""
        weights = self.source if weights is None else weights
        if weights is None and self.needs_weights:
            raise ValueError(f"{type(self).__name__}.push needs weights (or a source= model)")
        version = self.version + 1 if version is None else int(version)
        start = time.perf_counter()
        nbytes = self._push(weights, version)
        stats = WeightSyncStats(time.perf_counter() - start, int(nbytes), version)
        self.version = version
        self.history.append(stats)
        logger.debug("%s pushed version %d: %d bytes", type(self).__name__, version, nbytes)
        return stats

    @abstractmethod
    def _push(self, weights: Weights, version: int) -> int:
        """Deliver the weights; returns the number of bytes transferred."""

    def restore(self, old: Any, new: Any) -> bool:
        """Put the inference actor ``new`` in the place of ``old`` (a dead one) with the last
        pushed weights; False when this updater has no way to (the default), True when done."""
        return False


class InProcessWeightUpdater(WeightUpdater):
    """Weights into a policy (or model) in this process.

    Args:
        target: a :class:`~llmrl.policies.TransformersWrapper` (its ``model``), a ``vLLMWrapper``
            (``load_weights``: the engines get the tensors) or a ``torch.nn.Module``.
        source: the trainer model pushed by default.

    Pushing the target's own model object costs nothing (bytes 0): the policy already sees the
    trainer's weights, only the version moves.
    """

    def __init__(self, target: Any, source: Weights | None = None) -> None:
        super().__init__(source)
        self.target = target

    def _push(self, weights: Weights, version: int) -> int:
        model = self.target
        if not isinstance(model, torch.nn.Module):
            model = getattr(self.target, "model", None)  # a policy's model (vLLM: a name)
        if isinstance(weights, torch.nn.Module) and weights is model:
            return 0
        state = as_state_dict(weights)
        if isinstance(model, torch.nn.Module):
            with torch.no_grad():
                model.load_state_dict(state)
        elif callable(getattr(self.target, "load_weights", None)):
            self.target.load_weights(state.items(), version=version)
        else:
            raise TypeError(
                f"cannot load weights into {type(self.target).__name__}: expected a module, a "
                "policy with a `model`, or one with `load_weights`"
            )
        return state_dict_bytes(state)


class RayObjectStoreWeightUpdater(WeightUpdater):
    """Weights to Ray inference actors through the object store (one ``ray.put``).

    Args:
        inference_actors: actor handles of :class:`~llmrl.collectors.ray_collector.
            InferenceActor` (``load_state_dict``, which also records the version) or of
            :class:`~llmrl.policies.vllm_engine.VLLMEngine` (``load_weights``, which resets the
            prefix cache).
        source: the trainer model pushed by default.

    InferenceActors get a :class:`~llmrl.collectors.packed_weights.PackedStateDict` (numpy
    arrays, read without a copy; tied tensors once). Bytes count what is put in the object
    store (once, whatever the actor count). The last pushed state dict stays there
    (``latest``, an object reference) so that :meth:`restore` can load it into an actor
    rebuilt after a crash.
    """

    def __init__(self, inference_actors: list[Any], source: Weights | None = None) -> None:
        super().__init__(source)
        if not inference_actors:
            raise ValueError("RayObjectStoreWeightUpdater needs at least one inference actor")
        self.inference_actors = list(inference_actors)
        self.latest: Any = None

    def restore(self, old: Any, new: Any) -> bool:
        """Put the actor ``new`` in the place of ``old`` (a dead one) and load the last pushed
        weights and version into it (an InferenceActor; nothing to load before a push).
        Handles are compared by actor id: ``old`` may be a copy received from another
        process."""
        ray = import_ray("Pushing weights to Ray actors")
        self.inference_actors = [new if actor == old else actor for actor in self.inference_actors]
        if self.latest is not None:
            ray.get(new.load_state_dict.remote(self.latest, self.version))
        return True

    def _push(self, weights: Weights, version: int) -> int:
        ray = import_ray("Pushing weights to Ray actors")
        state = {name: tensor.detach().cpu() for name, tensor in as_state_dict(weights).items()}
        packed, as_pairs = None, None
        calls = []
        nbytes = 0
        for actor in self.inference_actors:
            if hasattr(actor, "load_state_dict"):  # an InferenceActor: numpy, zero-copy reads
                if packed is None:
                    packed = PackedStateDict.pack(state)
                    nbytes += packed.nbytes
                    self.latest = ray.put(packed)
                calls.append(actor.load_state_dict.remote(self.latest, version))
            else:  # a VLLMEngine actor
                if as_pairs is None:
                    as_pairs = ray.put(list(state.items()))
                    nbytes += state_dict_bytes(state)
                calls.append(actor.load_weights.remote(as_pairs, version))
        ray.get(calls)
        return nbytes


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
    engines are told its name, dtype and shape (they allocate and wait in ``broadcast``), the
    trainer broadcasts it from rank 0 and waits for them to load it. Finally every engine drops
    its prefix cache, whose KV entries came from the old weights.

    Args:
        engines: the engine actors.
        master_address: address of this process as the engines see it.
        master_port: rendezvous port; None picks a free one.
        ranks_per_engine: workers per engine (tensor parallel size).
        device: the trainer's GPU (default: the current CUDA device).
        source: the trainer model pushed by default.
    """

    def __init__(
        self,
        engines: list[Any],
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        ranks_per_engine: int = 1,
        device: torch.device | str | None = None,
        source: Weights | None = None,
    ) -> None:
        super().__init__(source)
        if not engines:
            raise ValueError("VLLMNCCLWeightUpdater needs at least one engine")
        if ranks_per_engine < 1:
            raise ValueError(f"ranks_per_engine must be >= 1, got {ranks_per_engine}")
        self.engines = list(engines)
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

    def _push(self, weights: Weights, version: int) -> int:
        self.init_group()
        ray = import_ray("Broadcasting weights to vLLM engine actors")
        nbytes = 0
        stream = torch.cuda.current_stream(self.device)
        for name, tensor in as_state_dict(weights).items():
            tensor = tensor.detach().to(self.device).contiguous()
            dtype_name = str(tensor.dtype).removeprefix("torch.")
            receives = [
                engine.update_weight_from_broadcast.remote(name, dtype_name, list(tensor.shape))
                for engine in self.engines
            ]
            self._comm.broadcast(tensor, src=0, stream=stream)
            ray.get(receives)
            nbytes += tensor.numel() * tensor.element_size()
        torch.cuda.synchronize(self.device)
        ray.get([engine.reset_prefix_cache.remote() for engine in self.engines])
        return nbytes

    def close(self) -> None:
        """Forget the NCCL communicator (the next push makes a new group)."""
        self._comm = None


def as_state_dict(weights: Weights) -> StateDict:
    """A ``{name: tensor}`` dict from a model, a state dict or ``(name, tensor)`` pairs."""
    if isinstance(weights, torch.nn.Module):
        return dict(weights.state_dict())
    return dict(weights)


def state_dict_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of every tensor of a state dict (tied tensors count once per name)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in state.values())
