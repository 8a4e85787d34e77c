"""A weight broadcast over gloo whose peer never comes ends within the group's timeout (in the
runtime ``runtime.collective_timeout_s``) plus :data:`MARGIN_S`, with a
:class:`~llmrl.core.deadlines.CallTimeout` naming the broadcast: the phase (joining, the
header, bucket k of n), the version and the ranks. Between real processes (this one and a
spawned peer that joins, then sleeps), as in ``test_broadcast.py``.

The margin, from what the code does: rank 0 waits once for every member's key in the store,
and every broadcast is one gloo operation whose own deadline is the group's timeout (nothing
polls, nothing retries); what remains is raising the error on a loaded 2-core machine.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from llmrl.core.deadlines import CallTimeout
from llmrl.core.ray_helpers import free_port
from llmrl.transports.broadcast import BroadcastReceiver, BroadcastSender, WeightBroadcastGroup

TIMEOUT_S = 2.0
MARGIN_S = 1.0
SLEEP_S = 30.0  # the peer outlives every wait of a test, and is stopped after it


def _silent_peer(rank: int, port: int, joining: Any) -> None:
    """Join the group as ``rank``, then never broadcast."""
    joining.set()  # the other member may start joining: this one is about to
    group = WeightBroadcastGroup("127.0.0.1", port, rank, 2, timeout_s=SLEEP_S)
    time.sleep(SLEEP_S)  # holding the group: dropped, it would close the connections
    group.close()


@pytest.fixture
def silent_peer():
    """Starts a peer process as ``rank`` of a 2-member group at a fresh port; returns the port
    once the peer is about to join (its interpreter and torch loaded); stops it after."""
    context = mp.get_context("spawn")
    started = []

    def start(rank: int) -> int:
        port, joining = free_port(), context.Event()
        process = context.Process(target=_silent_peer, args=(rank, port, joining), daemon=True)
        process.start()
        started.append(process)
        assert joining.wait(120), "the peer process did not start"
        return port

    yield start
    for process in started:
        process.kill()
        process.join(10)


def timed_error(call: Any) -> tuple[CallTimeout, float]:
    start = time.monotonic()
    with pytest.raises(CallTimeout) as caught:
        call()
    return caught.value, time.monotonic() - start


def test_a_peer_that_never_joins_ends_rank_0s_join_naming_the_missing_rank():
    port = free_port()
    error, seconds = timed_error(
        lambda: WeightBroadcastGroup("127.0.0.1", port, 0, 2, timeout_s=TIMEOUT_S)
    )
    assert TIMEOUT_S <= seconds <= TIMEOUT_S + MARGIN_S
    assert str(error) == (
        "weight broadcast hung: joining the group did not return within 2 s (phase joining, "
        "ranks this rank 0 of 2 (rank 0 sends); bounded by runtime.collective_timeout_s); "
        "rank(s) 1 did not join"
    )
    assert isinstance(error, TimeoutError) and error.hung.role == "weight broadcast"


def test_a_sender_whose_receiver_never_receives_names_the_phase_and_the_version(silent_peer):
    port = silent_peer(rank=1)
    group = WeightBroadcastGroup("127.0.0.1", port, 0, 2, timeout_s=TIMEOUT_S)
    sender = BroadcastSender(group, bucket_bytes=256)
    state = {"weight": torch.ones(100)}

    error, seconds = timed_error(lambda: sender.send(state, version=7))

    assert TIMEOUT_S <= seconds <= TIMEOUT_S + MARGIN_S
    assert str(error).startswith(
        "weight broadcast hung: broadcast did not return within 2 s (phase sending the "
        "header's length, version 7, ranks this rank 0 of 2 (rank 0 sends); bounded by "
        "runtime.collective_timeout_s); "
    )
    assert "Timed out" in error.note  # gloo's own words follow


def test_a_receiver_whose_sender_never_sends_ends_naming_its_rank(silent_peer):
    port = silent_peer(rank=0)
    group = WeightBroadcastGroup("127.0.0.1", port, 1, 2, timeout_s=TIMEOUT_S)
    receiver = BroadcastReceiver(group)

    error, seconds = timed_error(receiver.receive)

    assert TIMEOUT_S <= seconds <= TIMEOUT_S + MARGIN_S
    assert str(error).startswith(
        "weight broadcast hung: broadcast did not return within 2 s (phase receiving the "
        "header's length, ranks this rank 1 of 2 (rank 0 sends); bounded by "
        "runtime.collective_timeout_s); "
    )
