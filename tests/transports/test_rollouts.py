"""The rollout transport: batches arrive in the order sent with every sample's policy version;
a sample without one is refused at both ends. In process and through the Ray inbox."""

from __future__ import annotations

import threading

import pytest
import torch
from tensordict import TensorDict

from llmrl.transports.rollouts import (
    MissingPolicyVersion,
    RolloutBatch,
    in_process_rollouts,
    ray_rollouts,
)


def row(traj: int, turn: int, version: int | None) -> TensorDict:
    data = {"traj_id": torch.tensor(traj), "turn": torch.tensor(turn)}
    if version is not None:
        data["policy_version"] = torch.tensor(version)
    return TensorDict(data, batch_size=[])


def batch(source: int, versions: list[list[int]]) -> RolloutBatch:
    """One trajectory per list of versions (one row per turn)."""
    trajectories = [
        [row(10 * source + t, turn, v) for turn, v in enumerate(turns)]
        for t, turns in enumerate(versions)
    ]
    return RolloutBatch(trajectories, source=source, info={"turns": sum(map(len, versions))})


def check_round_trip(sender, receiver) -> None:
    sent = [batch(0, [[3, 3, 4], [4]]), batch(1, [[5]]), batch(0, [[6, 6]])]
    for item in sent:
        sender.send(item)
    first = receiver.receive(timeout=30)
    assert first.versions() == [3, 3, 4, 4] and first.source == 0 and len(first) == 4
    assert [int(r["turn"]) for r in first.trajectories[0]] == [0, 1, 2], "turn order kept"
    rest = receiver.receive_ready()
    assert [(b.source, b.versions()) for b in rest] == [(1, [5]), (0, [6, 6])], "send order"
    assert receiver.receive_ready() == []


def check_refusals(sender, receiver) -> None:
    with pytest.raises(MissingPolicyVersion, match=r"sender 2: trajectory 1, turn 0 has no"):
        sender.send(RolloutBatch([[row(0, 0, 1)], [row(1, 0, None)]], source=2))
    assert receiver.receive_ready() == [], "nothing was delivered"


def test_in_process_round_trip_keeps_versions_and_order():
    check_round_trip(*in_process_rollouts())


def test_a_sample_without_a_version_is_refused_at_both_ends():
    sender, receiver = in_process_rollouts()
    check_refusals(sender, receiver)
    sender._send(RolloutBatch([[row(0, 0, None)]], source=3))  # a sender that skipped the check
    with pytest.raises(MissingPolicyVersion, match="sender 3"):
        receiver.receive(timeout=1)


def test_receive_waits_for_a_batch_and_times_out():
    sender, receiver = in_process_rollouts()
    threading.Timer(0.2, lambda: sender.send(batch(4, [[1]]))).start()
    assert receiver.receive(timeout=30).versions() == [1]
    with pytest.raises(TimeoutError):
        receiver.receive(timeout=0.05)


@pytest.mark.integration
def test_through_a_ray_inbox(local_ray):
    ray = local_ray
    sender, receiver = ray_rollouts()
    try:
        check_round_trip(sender, receiver)
        check_refusals(sender, receiver)

        @ray.remote(num_cpus=0)
        def worker(sender, source: int) -> None:  # an env worker's side, in another process
            sender.send(batch(source, [[7, 8]]))

        ray.get(worker.remote(sender, 5))
        (arrived,) = receiver.receive_ready()
        assert (arrived.source, arrived.versions()) == (5, [7, 8])
    finally:
        ray.kill(receiver.inbox)
