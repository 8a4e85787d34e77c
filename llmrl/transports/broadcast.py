"""Weights broadcast in fixed-size buckets over a torch.distributed process group of their own.

The group (:class:`WeightBroadcastGroup`) has the sender as rank 0 and every receiver (an
inference engine) after it; it is made from a TCP store at the sender's address, apart from
torch.distributed's default group, so a trainer rank that already trains in one (DDP, FSDP)
joins this one too. ``gloo`` on CPU, ``nccl`` on GPUs: the backend is the only difference, the
protocol below is the same code.

One push (:meth:`BroadcastSender.send`, :meth:`BroadcastReceiver.receive`):

1. **Layout.** Tensors are taken in name order (so the bytes sent do not depend on the order of
   the state dict) and laid end to end in one byte stream, each starting at a multiple of
   :data:`ALIGN` bytes (a tensor held under two names, a tied embedding, once). The stream is
   cut into buckets of ``bucket_bytes`` (the last one
   shorter): a tensor larger than a bucket spans several, many small ones share one.
2. **Header.** Its length, then the header itself (JSON bytes): the version, the checksum of the
   weights (:func:`~llmrl.core.weights_checksum.weights_checksum`), the bucket size, the
   stream's length and each tensor's name, dtype, shape, offset and byte count.
3. **Buckets**, in stream order. The sender fills one bucket buffer at a time from its tensors;
   each receiver receives straight into its slice of a stream buffer of its own.
4. **Rebuild and verify.** Each receiver views its stream as the named tensors and checks their
   checksum against the header's before anything is loaded; a mismatch raises
   :class:`~llmrl.core.weights_checksum.WeightChecksumError` and leaves the model as it was.

:class:`BroadcastWeightUpdater` is the weight transport on top: the trainer (rank 0) sends, and
Ray inference actors (:class:`~llmrl.collectors.ray_actors.InferenceActor`) receive, load
and report the checksum of what they then hold.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from llmrl.core.deadlines import CallTimeout, Hung, naming_timeouts, wait_for
from llmrl.core.ray_helpers import free_port, import_ray
from llmrl.core.weights_checksum import dtype_name, verify_checksum, weights_checksum
from llmrl.transports.weights import Delivery, StateDict, Weights, WeightUpdater, as_state_dict

logger = logging.getLogger(__name__)

ALIGN = 16
"""Every tensor starts at a multiple of this many bytes in the stream (any dtype views it)."""

DEFAULT_BUCKET_BYTES = 64 * 1024 * 1024
"""Bytes per bucket unless told otherwise."""

COLLECTIVE_SETTING = "runtime.collective_timeout_s"
"""The config field that bounds joining the group and each broadcast."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lies in the stream."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BroadcastHeader:
    """What precedes the buckets of one push."""

    version: int
    checksum: str
    bucket_bytes: int
    total_bytes: int
    slots: tuple[TensorSlot, ...]

    @property
    def buckets(self) -> int:
        """How many buckets follow."""
        return math.ceil(self.total_bytes / self.bucket_bytes) if self.total_bytes else 0

    def encode(self) -> bytes:
        """JSON bytes."""
        slots = [[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in self.slots]
        return json.dumps(
            {
                "version": self.version,
                "checksum": self.checksum,
                "bucket_bytes": self.bucket_bytes,
                "total_bytes": self.total_bytes,
                "slots": slots,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> BroadcastHeader:
        """The header :meth:`encode` wrote."""
        raw = json.loads(data.decode())
        slots = tuple(
            TensorSlot(name, dtype, tuple(shape), offset, nbytes)
            for name, dtype, shape, offset, nbytes in raw["slots"]
        )
        return cls(raw["version"], raw["checksum"], raw["bucket_bytes"], raw["total_bytes"], slots)


def layout(state: Mapping[str, torch.Tensor]) -> tuple[tuple[TensorSlot, ...], int]:
    """Each tensor's slot in the stream, in name order, and the stream's length. Names that
    hold the same tensor (a tied embedding and output head) share one slot's bytes."""
    slots, offset = [], 0
    placed: dict[tuple, int] = {}
    for name in sorted(state):
        tensor = state[name]
        nbytes = tensor.numel() * tensor.element_size()
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        start = placed.get(key) if nbytes else None
        if start is None:
            start = placed[key] = offset
            offset += math.ceil(nbytes / ALIGN) * ALIGN
        slots.append(TensorSlot(name, dtype_name(tensor.dtype), tuple(tensor.shape), start, nbytes))
    return tuple(slots), offset


@dataclass(frozen=True)
class GroupMembership:
    """One member's ticket to a :class:`WeightBroadcastGroup` (picklable: the sender sends one
    to each receiver)."""

    address: str
    port: int
    rank: int
    world_size: int
    backend: str = "gloo"
    timeout_s: float = 300.0

    def join(self) -> WeightBroadcastGroup:
        """Join the group (returns once every member has)."""
        return WeightBroadcastGroup(
            self.address,
            self.port,
            self.rank,
            self.world_size,
            self.backend,
            timeout_s=self.timeout_s,
        )


class WeightBroadcastGroup:
    """A process group for weight broadcasts: rank 0 sends to every other rank.

    Every member constructs one at the same time (each blocks until all have joined). The
    group is independent of torch.distributed's default group.

    Args:
        address, port: the TCP store, hosted by rank 0.
        rank, world_size: this member and the group's size.
        backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors).
        device: where this member's buffers live (default: CPU for gloo, the current CUDA
            device for nccl).
        timeout_s: how long a member waits for the others (joining, each broadcast).
    """

    def __init__(
        self,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        device: torch.device | str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if world_size < 2 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world size {world_size}: need 0 <= rank < size >= 2")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.timeout_s = timeout_s
        if device is None:
            device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
        self.device = torch.device(device)
        # a member that never comes: rank 0 waits for every member's key, the others for the
        # store's server and the group's keys; each wait ends after timeout_s
        with naming_timeouts(self.hung("joining"), timeout_s):
            self._store = dist.TCPStore(
                address, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False
            )
            self._store.set(f"joined/{rank}", str(rank))
            if rank == 0:
                self._await_members(timeout)
            store = dist.PrefixStore("llmrl-weights/", self._store)
            if backend == "nccl":
                torch.cuda.set_device(self.device)
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self._group: Any = dist.ProcessGroupNCCL(store, rank, world_size, options)
            else:
                self._group = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def _await_members(self, timeout: datetime.timedelta) -> None:
        """Rank 0: wait until every member has reached the store; past ``timeout``, a
        :class:`~llmrl.core.deadlines.CallTimeout` naming the ranks that did not."""
        keys = [f"joined/{rank}" for rank in range(1, self.world_size)]
        try:
            self._store.wait(keys, timeout)
        except Exception as error:
            missing = [k.split("/")[1] for k in keys if not self._store.check([k])]
            note = f"rank(s) {', '.join(missing)} did not join"
            raise CallTimeout(self.hung("joining"), timeout.total_seconds(), note) from error

    def hung(self, phase: str, version: int | None = None) -> Hung:
        """What this member waits for in ``phase`` (for :class:`~llmrl.core.deadlines.
        CallTimeout`): the group's broadcast, seen from this rank."""
        return Hung(
            role="weight broadcast",
            call="broadcast" if phase != "joining" else "joining the group",
            phase=phase,
            version=version,
            ranks=f"this rank {self.rank} of {self.world_size} (rank 0 sends)",
            setting=COLLECTIVE_SETTING,
        )

    def broadcast(self, tensor: torch.Tensor, phase: str = "", version: int | None = None) -> None:
        """Broadcast ``tensor`` (contiguous, on :attr:`device`) from rank 0, in place; a peer
        missing past the group's timeout raises :class:`~llmrl.core.deadlines.CallTimeout`
        naming ``phase`` and ``version``."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        with naming_timeouts(self.hung(phase or "broadcast", version), self.timeout_s):
            self._group.broadcast([tensor], options).wait()

    def close(self) -> None:
        """Leave the group (its members must make a new one to go on)."""
        shutdown = getattr(self._group, "shutdown", None)
        if callable(shutdown):
            shutdown()
        self._group = None


class BroadcastSender:
    """Rank 0 of a :class:`WeightBroadcastGroup`: sends state dicts (module docstring).

    Args:
        group: the group, with this process as rank 0.
        bucket_bytes: bytes per bucket (a multiple of :data:`ALIGN`).
    """

    def __init__(
        self, group: WeightBroadcastGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> None:
        if group.rank != 0:
            raise ValueError(f"the sender is rank 0 of its group, not rank {group.rank}")
        if bucket_bytes < ALIGN or bucket_bytes % ALIGN:
            raise ValueError(f"bucket_bytes must be a positive multiple of {ALIGN}")
        self.group, self.bucket_bytes = group, bucket_bytes

    def send(self, state: Mapping[str, torch.Tensor], version: int) -> BroadcastHeader:
        """Broadcast ``state`` as ``version``; the header sent (with its checksum)."""
        device = self.group.device
        tensors = {name: t.detach().to(device).contiguous() for name, t in state.items()}
        slots, total = layout(tensors)
        header = BroadcastHeader(
            int(version), weights_checksum(tensors), self.bucket_bytes, total, slots
        )
        encoded, version = header.encode(), header.version
        length = torch.tensor([len(encoded)], dtype=torch.int64, device=device)
        self.group.broadcast(length, "sending the header's length", version)
        encoded_tensor = torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(device)
        self.group.broadcast(encoded_tensor, "sending the header", version)
        raw = {name: _bytes_of(tensor) for name, tensor in tensors.items()}
        bucket = torch.empty(self.bucket_bytes, dtype=torch.uint8, device=device)
        for index in range(header.buckets):
            start = index * self.bucket_bytes
            size = min(self.bucket_bytes, total - start)
            self._fill(index, bucket[:size], start, slots, raw)
            phase = f"sending bucket {index + 1}/{header.buckets}"
            self.group.broadcast(bucket[:size], phase, version)
        return header

    def _fill(
        self,
        index: int,
        bucket: torch.Tensor,
        start: int,
        slots: tuple[TensorSlot, ...],
        raw: dict[str, torch.Tensor],
    ) -> None:
        """Copy the stream's bytes ``[start, start + len(bucket))`` into ``bucket`` (bucket
        number ``index``; padding between tensors is zeros)."""
        bucket.zero_()
        stop = start + bucket.numel()
        for slot in slots:
            low, high = max(slot.offset, start), min(slot.offset + slot.nbytes, stop)
            if low < high:
                source = raw[slot.name][low - slot.offset : high - slot.offset]
                bucket[low - start : high - start].copy_(source)


@dataclass
class ReceivedWeights:
    """One push as a receiver rebuilt and verified it."""

    version: int
    checksum: str
    state: StateDict
    bytes: int


class BroadcastReceiver:
    """A rank > 0 of a :class:`WeightBroadcastGroup`: receives state dicts (module docstring).

    Args:
        group: the group, with this process as a rank > 0.
        where: how refusals name this receiver.
    """

    def __init__(self, group: WeightBroadcastGroup, where: str = "") -> None:
        if group.rank == 0:
            raise ValueError("a receiver is not rank 0 (the sender) of its group")
        self.group = group
        self.where = where or f"weight broadcast rank {group.rank}"

    def receive(self) -> ReceivedWeights:
        """The next push, rebuilt and verified; raises
        :class:`~llmrl.core.weights_checksum.WeightChecksumError` when its checksum does not
        match the header's (after receiving every bucket, so the group stays in step)."""
        device = self.group.device
        length = torch.zeros(1, dtype=torch.int64, device=device)
        self.group.broadcast(length, "receiving the header's length")
        encoded = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
        self.group.broadcast(encoded, "receiving the header")
        header = BroadcastHeader.decode(bytes(encoded.cpu().numpy()))
        stream = torch.empty(header.total_bytes, dtype=torch.uint8, device=device)
        for index in range(header.buckets):
            start = index * header.bucket_bytes
            bucket = stream[start : min(start + header.bucket_bytes, len(stream))]
            phase = f"receiving bucket {index + 1}/{header.buckets}"
            self.group.broadcast(bucket, phase, header.version)
        state = {
            slot.name: stream[slot.offset : slot.offset + slot.nbytes]
            .view(_dtype(slot.dtype))
            .view(slot.shape)
            for slot in header.slots
        }
        verify_checksum(state, header.checksum, f"{self.where}, version {header.version}")
        return ReceivedWeights(header.version, header.checksum, state, header.total_bytes)


class BroadcastWeightUpdater(WeightUpdater):
    """Weights from this process (rank 0) to Ray inference actors over a bucketed broadcast.

    Args:
        inference_actors: actor handles with ``join_weight_group(membership)`` (a
            :class:`GroupMembership`) and ``receive_weights() -> checksum`` (an
            :class:`~llmrl.collectors.ray_actors.InferenceActor`).
        address: this process's address as the actors see it.
        backend: ``"gloo"`` or ``"nccl"``; None: nccl when CUDA is available here, else gloo.
        bucket_bytes: bytes per bucket.
        timeout_s: how long a member waits for the others.
        source: the trainer model pushed by default.

    The group is made on the first push (every actor asked to join, then this process).
    Bytes count the stream sent once (a broadcast reaches every actor). A rebuilt actor is not
    in the group: :meth:`restore` cannot load weights into it (it returns False).
    """

    def __init__(
        self,
        inference_actors: list[Any],
        address: str = "127.0.0.1",
        backend: str | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = 300.0,
        source: Weights | None = None,
    ) -> None:
        super().__init__(source)
        if not inference_actors:
            raise ValueError("BroadcastWeightUpdater needs at least one inference actor")
        self.inference_actors = list(inference_actors)
        self.address = address
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.bucket_bytes, self.timeout_s = bucket_bytes, timeout_s
        self._sender: BroadcastSender | None = None

    def init_group(self, version: int | None = None) -> None:
        """Make the group with every actor (idempotent; ``version``: the push it is made for,
        named by a timeout). An actor that does not join within ``timeout_s`` raises
        :class:`~llmrl.core.deadlines.CallTimeout` naming the engines that did not."""
        if self._sender is not None:
            return
        import_ray("Broadcasting weights to Ray actors")
        port, world = free_port(), 1 + len(self.inference_actors)
        members = [
            GroupMembership(self.address, port, rank, world, self.backend, self.timeout_s)
            for rank in range(world)
        ]
        joins = [
            actor.join_weight_group.remote(member)
            for actor, member in zip(self.inference_actors, members[1:], strict=True)
        ]
        try:
            group = members[0].join()
        except CallTimeout as error:
            note = "rank r of the group is inference engine r - 1"
            raise error.with_details(note, version=version) from error
        joining = Hung("inference engine", "join_weight_group", phase="joining", version=version)
        joining = dataclasses.replace(joining, setting=COLLECTIVE_SETTING)
        wait_for(joins, self.timeout_s, joining.each(range(len(joins))))
        self._sender = BroadcastSender(group, self.bucket_bytes)
        logger.info(
            "weight broadcast group ready: %s, %d actor(s), %s:%d",
            self.backend,
            len(self.inference_actors),
            self.address,
            port,
        )

    def _push(self, weights: Weights, version: int) -> Delivery:
        self.init_group(version)
        assert self._sender is not None
        receives = [actor.receive_weights.remote() for actor in self.inference_actors]
        header = self._sender.send(as_state_dict(weights), version)
        held = self._await(receives, version, "receive_weights", "loading")
        return Delivery(header.total_bytes, header.checksum, tuple(held))

    def close(self) -> None:
        """Leave the group (the next push makes a new one)."""
        if self._sender is not None:
            self._sender.group.close()
            self._sender = None


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.uint8)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name")
    return dtype
