"""The bucketed weight broadcast's protocol over gloo between three real processes (one sender,
two receivers): a tensor larger than a bucket and many small ones arrive intact, the bytes sent
do not depend on the state dict's order, the version arrives, and a corrupted bucket is refused
with the receiver's model unchanged (the group stays in step for the next push). NCCL runs the
same code; only the backend differs."""

from __future__ import annotations

import socket
import traceback
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from llmrl.core.weights_checksum import WeightChecksumError, weights_checksum
from llmrl.transports.broadcast import (
    ALIGN,
    BroadcastReceiver,
    BroadcastSender,
    WeightBroadcastGroup,
    layout,
)

WORLD = 3
BUCKET = 256  # bytes: the large tensor spans many buckets, small ones share them


def sent_state() -> dict[str, torch.Tensor]:
    """A large tensor (4000 bytes) also held under a second name (tied), many small ones,
    several dtypes, a 0-dim and an empty one."""
    g = torch.Generator().manual_seed(0)
    state = {"large.weight": torch.randn(40, 25, generator=g)}
    state["large.tied"] = state["large.weight"]
    for index in range(30):
        state[f"small.{index:02d}"] = torch.randn(3, generator=g)
    state["half"] = torch.randn(5, 3, generator=g).to(torch.bfloat16)
    state["counts"] = torch.arange(7, dtype=torch.int64)
    state["mask"] = torch.tensor([True, False, True])
    state["scale"] = torch.tensor(2.5)
    state["empty"] = torch.zeros(0, 4)
    return state


def model_state(seed: int) -> dict[str, torch.Tensor]:
    """What the receivers' model holds (same names and shapes as :func:`sent_state`)."""
    torch.manual_seed(seed)
    return {name: torch.rand_like(t.float()).to(t.dtype) for name, t in sent_state().items()}


class RecordingSender(BroadcastSender):
    """Keeps a copy of every bucket it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buckets: list[bytes] = []

    def _fill(self, index, bucket, start, slots, raw):
        super()._fill(index, bucket, start, slots, raw)
        self.buckets.append(bytes(bucket.numpy()))


class CorruptingSender(BroadcastSender):
    """Flips one byte of bucket 3 after the checksum was computed (a transfer fault)."""

    def _fill(self, index, bucket, start, slots, raw):
        super()._fill(index, bucket, start, slots, raw)
        if index == 3:
            bucket[5] ^= 0x10


def _member(rank: int, port: int, results: Any, read: Any) -> None:
    try:
        results.put((rank, _scenarios(rank, port)))
    except BaseException:
        results.put((rank, {"error": traceback.format_exc()}))
    read.wait(120)  # tensors travel as shared memory: stay until the parent has them


def _scenarios(rank: int, port: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    group = WeightBroadcastGroup("127.0.0.1", port, rank, WORLD, "gloo", timeout_s=60)
    state = sent_state()
    out: dict[str, Any] = {}
    if rank == 0:
        sender = RecordingSender(group, bucket_bytes=BUCKET)
        header = sender.send(state, version=7)  # 1: name order
        out["checksum"], out["sorted_buckets"] = header.checksum, list(sender.buckets)
        sender.buckets = []
        reversed_order = dict(reversed(list(state.items())))
        out["reversed_checksum"] = sender.send(reversed_order, version=8).checksum  # 2
        out["reversed_buckets"] = list(sender.buckets)
        CorruptingSender(group, bucket_bytes=BUCKET).send(state, version=9)  # 3: corrupted
        out["after_checksum"] = sender.send(state, version=10).checksum  # 4: intact again
        return out
    receiver = BroadcastReceiver(group)
    first = receiver.receive()
    out["first"] = (first.version, first.checksum, {n: t.clone() for n, t in first.state.items()})
    second = receiver.receive()
    out["second"] = (second.version, second.checksum, list(second.state))
    model = model_state(seed=rank)  # the receiver's model, loaded from what it accepts
    before = {name: tensor.clone() for name, tensor in model.items()}
    try:
        receiver.receive()
        out["refused"] = None
    except WeightChecksumError as error:
        out["refused"] = str(error)
    out["unchanged"] = all(torch.equal(model[n], before[n]) for n in before)
    last = receiver.receive()
    for name, tensor in last.state.items():
        model[name].copy_(tensor)
    out["last"] = (last.version, weights_checksum(model))
    return out


@pytest.fixture(scope="module")
def runs() -> dict[int, dict[str, Any]]:
    """Every member's results of the four pushes (one spawn for the whole module)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    results, read = context.Queue(), context.Event()
    processes = [
        context.Process(target=_member, args=(r, port, results, read)) for r in range(WORLD)
    ]
    for process in processes:
        process.start()
    try:
        collected = dict(results.get(timeout=240) for _ in range(WORLD))
    finally:
        read.set()
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    for rank, result in collected.items():
        assert "error" not in result, f"rank {rank}:\n{result['error']}"
    return collected


def test_layout_puts_tensors_in_name_order_at_aligned_offsets():
    state = sent_state()
    slots, total = layout(dict(reversed(list(state.items()))))
    assert [slot.name for slot in slots] == sorted(state)
    assert all(slot.offset % ALIGN == 0 for slot in slots)
    by_name = {slot.name: slot for slot in slots}
    large = by_name["large.weight"]
    assert large.nbytes == 4000 > BUCKET, "spans buckets"
    assert by_name["large.tied"].offset == large.offset, "a tied tensor is sent once"
    assert total < sum(slot.nbytes for slot in slots)


def test_large_and_small_tensors_arrive_intact_with_the_version(runs):
    sent = sent_state()
    for rank in (1, 2):
        version, checksum, state = runs[rank]["first"]
        assert version == 7
        assert checksum == runs[0]["checksum"] == weights_checksum(sent)
        assert list(state) == sorted(sent)
        for name, tensor in sent.items():
            assert state[name].dtype == tensor.dtype and state[name].shape == tensor.shape
            assert torch.equal(state[name], tensor), name
    assert len(runs[0]["sorted_buckets"]) > 16, "the large tensor spans many buckets"


def test_bytes_sent_do_not_depend_on_the_state_dicts_order(runs):
    assert runs[0]["reversed_buckets"] == runs[0]["sorted_buckets"]
    assert runs[0]["reversed_checksum"] == runs[0]["checksum"]
    for rank in (1, 2):
        version, checksum, names = runs[rank]["second"]
        assert version == 8 and checksum == runs[0]["checksum"] and names == sorted(sent_state())


def test_a_corrupted_bucket_is_refused_and_the_model_is_unchanged(runs):
    for rank in (1, 2):
        assert runs[rank]["refused"] is not None
        assert "version 9" in runs[rank]["refused"]
        assert "does not match the sender's" in runs[rank]["refused"]
        assert runs[rank]["unchanged"]


def test_the_group_stays_in_step_after_a_refusal(runs):
    for rank in (1, 2):
        assert runs[rank]["last"] == (10, runs[0]["after_checksum"])
