"""`AsyncRollouts`: sampling never more than `max_staleness` policy versions ahead of training,
recorded for every sample, and collector errors reaching the trainer."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from tensordict import TensorDict

from llmrl.collectors import AsyncRollouts


class _VersionedCollector:
    """Yields 3-row batches stamped with the current policy version; counts what it made."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.policy_version, self.produced, self.fail_at = 0, 0, fail_at

    def __iter__(self):
        while True:
            if self.produced == self.fail_at:
                raise RuntimeError("collector broke")
            self.produced += 1
            yield TensorDict({"policy_version": torch.full((3,), self.policy_version)}, [3])

    def update_policy_weights_(self, weights=None) -> None:
        self.policy_version += 1

    def metrics(self) -> dict:
        return {}


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
def test_every_trained_sample_is_at_most_max_staleness_versions_old(max_staleness):
    collector = _VersionedCollector()
    rollouts = AsyncRollouts(collector, max_staleness=max_staleness)
    gaps: list[int] = []  # trainer version - sample version, for every sample trained on
    for step, batch in enumerate(rollouts, start=1):
        trainer_version = rollouts.policy_version
        assert trainer_version == step - 1
        gaps += [trainer_version - int(v) for v in batch["policy_version"]]
        # "training": the sampler gets ahead meanwhile, as far as it is allowed
        deadline = time.monotonic() + 10
        while collector.produced < step + max_staleness and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.01)  # a sampler that ignored the bound would overshoot now
        assert collector.produced == step + max_staleness
        rollouts.update_policy_weights_()
        if step == 10:
            break
    rollouts.shutdown()
    assert len(gaps) == 30
    assert max(gaps) == max_staleness and min(gaps) == 0, gaps
    # after the first max_staleness steps, every batch is exactly max_staleness versions old
    assert gaps[3 * max_staleness :] == [max_staleness] * (30 - 3 * max_staleness)


def test_zero_staleness_waits_for_every_update():
    collector = _VersionedCollector()
    rollouts = AsyncRollouts(collector, max_staleness=0)
    iterator = iter(rollouts)
    next(iterator)
    time.sleep(0.2)  # without an update the sampler must not start the next batch
    assert collector.produced == 1
    rollouts.update_policy_weights_()
    batch = next(iterator)
    assert batch["policy_version"].tolist() == [1, 1, 1]
    rollouts.shutdown()


def test_an_extra_batch_is_drawn_at_the_same_version_without_an_update():
    collector = _VersionedCollector()
    rollouts = AsyncRollouts(collector, max_staleness=0)
    iterator = iter(rollouts)
    next(iterator)
    rollouts.allow_extra_batch()  # a resample round of the same step
    assert next(iterator)["policy_version"].tolist() == [0, 0, 0]
    time.sleep(0.2)  # one extra batch allowed, not two
    assert collector.produced == 2
    rollouts.update_policy_weights_()
    assert next(iterator)["policy_version"].tolist() == [1, 1, 1]
    rollouts.shutdown()


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_steps_taking_extra_batches_keep_the_staleness_bound(max_staleness):
    collector = _VersionedCollector()
    rollouts = AsyncRollouts(collector, max_staleness=max_staleness)
    iterator = iter(rollouts)
    gaps: list[int] = []
    for step in range(8):
        for round_index in range(1 + step % 3):  # 0, 1 or 2 resample rounds
            if round_index > 0:
                rollouts.allow_extra_batch()
            batch = next(iterator)
            gaps += [rollouts.policy_version - int(v) for v in batch["policy_version"]]
        time.sleep(0.02)  # "training": the sampler gets ahead as far as it may
        rollouts.update_policy_weights_()
    rollouts.shutdown()
    assert len(gaps) == 3 * (1 + 2 + 3 + 1 + 2 + 3 + 1 + 2)  # no step waited forever
    assert min(gaps) >= 0 and max(gaps) <= max_staleness, gaps


def test_a_collector_error_reaches_the_trainer_and_the_thread_ends():
    rollouts = AsyncRollouts(_VersionedCollector(fail_at=2), max_staleness=1)
    with pytest.raises(RuntimeError, match="collector broke"):
        for _ in rollouts:
            rollouts.update_policy_weights_()
    rollouts.shutdown()
    assert not [t for t in threading.enumerate() if t.name == "llmrl-rollouts"]


def test_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="max_staleness must be >= 0, got -1"):
        AsyncRollouts(_VersionedCollector(), max_staleness=-1)
