"""The rollout transport's contract: ``RolloutSender.send(batch)``, ``RolloutReceiver.receive()``.

Env workers send what they finished, the trainer's side receives it, in the order it was sent
(per sender). A :class:`RolloutBatch` holds whole trajectories (each a list of transition rows
in turn order) and the sender's notes (``source``, ``info``). Every sample (transition row)
must carry its ``policy_version``, the version of the weights that produced it: both ends check
it, and a sample without one is refused (:class:`MissingPolicyVersion`, naming it).

Two implementations:

- :func:`in_process_rollouts`: a queue between two threads (or the same one) of this process;
- :func:`ray_rollouts`: a small Ray actor (an inbox) that env worker actors send to and the
  driver receives from; the GRPO stage's env workers send through it
  (:class:`~llmrl.collectors.RayLLMCollector`).

Example:
    sender, receiver = in_process_rollouts()
    sender.send(RolloutBatch([trajectory], source=0))
    receiver.receive().versions()
    # -> [3, 3]
"""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDictBase

from llmrl.core.ray_helpers import import_ray

VERSION_KEY = "policy_version"
"""Where every sample carries the version of the weights that produced it."""


class MissingPolicyVersion(ValueError):
    """A rollout sample without its ``policy_version``."""


@dataclass
class RolloutBatch:
    """Finished trajectories from one sender, in the order they finished.

    Attributes:
        trajectories: each a list of transition rows (``[]`` tensordicts) in turn order.
        source: the sender (an env worker's index).
        info: the sender's notes (counts, its state after producing them).
    """

    trajectories: list[list[TensorDictBase]]
    source: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        """Transition rows in the batch."""
        return sum(len(trajectory) for trajectory in self.trajectories)

    def versions(self, key: str = VERSION_KEY) -> list[int]:
        """Every row's policy version, trajectory by trajectory, turn by turn."""
        check_versions(self, key)
        return [int(row.get(key)) for trajectory in self.trajectories for row in trajectory]


def check_versions(batch: RolloutBatch, key: str = VERSION_KEY) -> None:
    """Raise :class:`MissingPolicyVersion` for the first row of ``batch`` without ``key``."""
    for t, trajectory in enumerate(batch.trajectories):
        for turn, row in enumerate(trajectory):
            if key not in row.keys():  # noqa: SIM118 (tensordicts' `in` is not a key test)
                raise MissingPolicyVersion(
                    f"rollout from sender {batch.source}: trajectory {t}, turn {turn} has no "
                    f"{key!r}; every sample must say which weights produced it"
                )


class RolloutSender(ABC):
    """Sends :class:`RolloutBatch` es to a receiver (see the module docstring)."""

    def __init__(self, version_key: str = VERSION_KEY) -> None:
        self.version_key = version_key

    def send(self, batch: RolloutBatch) -> None:
        """Check every sample has its version, then deliver the batch."""
        check_versions(batch, self.version_key)
        self._send(batch)

    @abstractmethod
    def _send(self, batch: RolloutBatch) -> None:
        """Deliver ``batch``."""


class RolloutReceiver(ABC):
    """Receives :class:`RolloutBatch` es, in the order each sender sent them."""

    def __init__(self, version_key: str = VERSION_KEY) -> None:
        self.version_key = version_key

    def receive(self, timeout: float | None = None) -> RolloutBatch:
        """The next batch (waiting up to ``timeout`` seconds; None: for ever).

        Raises:
            TimeoutError: nothing arrived in time.
            MissingPolicyVersion: a sample without its version.
        """
        batch = self._receive(timeout)
        if batch is None:
            raise TimeoutError(f"no rollouts arrived within {timeout} s")
        check_versions(batch, self.version_key)
        return batch

    def receive_ready(self) -> list[RolloutBatch]:
        """Every batch that has arrived, without waiting (possibly none)."""
        batches = self._receive_ready()
        for batch in batches:
            check_versions(batch, self.version_key)
        return batches

    @abstractmethod
    def _receive(self, timeout: float | None) -> RolloutBatch | None:
        """The next batch, or None after ``timeout``."""

    @abstractmethod
    def _receive_ready(self) -> list[RolloutBatch]:
        """What has arrived."""


class _QueueSender(RolloutSender):
    def __init__(self, channel: queue.Queue, version_key: str) -> None:
        super().__init__(version_key)
        self._channel = channel

    def _send(self, batch: RolloutBatch) -> None:
        self._channel.put(batch)


class _QueueReceiver(RolloutReceiver):
    def __init__(self, channel: queue.Queue, version_key: str) -> None:
        super().__init__(version_key)
        self._channel = channel

    def _receive(self, timeout: float | None) -> RolloutBatch | None:
        try:
            return self._channel.get(timeout=timeout)
        except queue.Empty:
            return None

    def _receive_ready(self) -> list[RolloutBatch]:
        batches = []
        while True:
            try:
                batches.append(self._channel.get_nowait())
            except queue.Empty:
                return batches


def in_process_rollouts(
    version_key: str = VERSION_KEY,
) -> tuple[RolloutSender, RolloutReceiver]:
    """A sender and its receiver over a queue in this process."""
    channel: queue.Queue = queue.Queue()
    return _QueueSender(channel, version_key), _QueueReceiver(channel, version_key)


class RolloutInbox:
    """The Ray actor between env workers and the driver: keeps what was sent, in order."""

    def __init__(self) -> None:
        self._batches: deque[RolloutBatch] = deque()
        self._arrived = threading.Condition()

    def put(self, batch: RolloutBatch) -> None:
        """Keep ``batch``."""
        with self._arrived:
            self._batches.append(batch)
            self._arrived.notify_all()

    def take(self, timeout: float | None = None) -> RolloutBatch | None:
        """The oldest batch, waiting up to ``timeout`` seconds for one; None if none came."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: bool(self._batches), timeout=timeout):
                return None
            return self._batches.popleft()

    def take_all(self) -> list[RolloutBatch]:
        """Every batch kept, oldest first."""
        with self._arrived:
            batches = list(self._batches)
            self._batches.clear()
            return batches


class RayRolloutSender(RolloutSender):
    """Sends to a :class:`RolloutInbox` actor; returns once it is there (picklable: give it to
    env worker actors)."""

    def __init__(self, inbox: Any, version_key: str = VERSION_KEY) -> None:
        super().__init__(version_key)
        self.inbox = inbox

    def _send(self, batch: RolloutBatch) -> None:
        ray = import_ray("Sending rollouts")
        ray.get(self.inbox.put.remote(batch))


class RayRolloutReceiver(RolloutReceiver):
    """Receives from a :class:`RolloutInbox` actor."""

    def __init__(self, inbox: Any, version_key: str = VERSION_KEY) -> None:
        super().__init__(version_key)
        self.inbox = inbox

    def _receive(self, timeout: float | None) -> RolloutBatch | None:
        ray = import_ray("Receiving rollouts")
        return ray.get(self.inbox.take.remote(timeout))

    def _receive_ready(self) -> list[RolloutBatch]:
        ray = import_ray("Receiving rollouts")
        return ray.get(self.inbox.take_all.remote())


def ray_rollouts(
    version_key: str = VERSION_KEY, actor_options: dict[str, Any] | None = None
) -> tuple[RayRolloutSender, RayRolloutReceiver]:
    """A sender and its receiver over a new :class:`RolloutInbox` actor (no CPU of its own
    unless ``actor_options`` say so; ``max_concurrency`` 4, so a waiting ``take`` does not
    block ``put``). Kill ``receiver.inbox`` when done."""
    ray = import_ray("Rollouts over Ray")
    options = {"num_cpus": 0, "max_concurrency": 4, **(actor_options or {})}
    inbox = ray.remote(RolloutInbox).options(**options).remote()
    return RayRolloutSender(inbox, version_key), RayRolloutReceiver(inbox, version_key)
