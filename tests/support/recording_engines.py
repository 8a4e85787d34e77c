"""Recording stand-ins of colocated vLLM engines (Ray actors), for the colocation tests.

A :class:`RecordingEngine` has ``VLLMEngine``'s sleep-mode methods (``sleep``, ``wake_up``,
``is_sleeping``) and keeps vLLM's rules about them: it refuses to sample while any of its memory
sleeps and to load weights while its weights sleep. Every call it serves lands in one
:class:`Journal` shared with the test's trainer and collector, in the order the calls happened
(each call writes before it returns). This module imports nothing heavy: Ray's workers import
it to run the actors.
"""

from __future__ import annotations

import time

TAGS = ("weights", "kv_cache")
"""vLLM's memory tags of a sleeping engine."""


class Journal:
    """Every recorded call, in order: ``(engine index or None for the driver's, event)``."""

    def __init__(self) -> None:
        self.entries: list[tuple[int | None, str]] = []

    def write(self, who: int | None, event: str) -> None:
        self.entries.append((who, event))

    def read(self) -> list[tuple[int | None, str]]:
        return list(self.entries)


class RecordingEngine:
    """Engine ``index``: records its calls in ``journal`` (a :class:`Journal` actor); its
    ``sleep`` hangs for ``hang_s`` seconds when set (a hung engine)."""

    def __init__(self, index: int, journal: object, hang_s: float | None = None) -> None:
        self.index, self.journal, self.hang_s = index, journal, hang_s
        self.asleep: set[str] = set()
        self.version = 0  # the weights it holds: the model spec's until a push

    def _write(self, event: str) -> None:
        import ray

        ray.get(self.journal.write.remote(self.index, event))

    def sleep(self, level: int = 1) -> None:
        if self.hang_s is not None:
            time.sleep(self.hang_s)
        if self.asleep:
            raise RuntimeError(f"engine {self.index}: sleep while {sorted(self.asleep)} sleep")
        self.asleep = set(TAGS) if level == 1 else set()
        self._write(f"sleep level {level}")

    def wake_up(self, tags: list[str] | None = None) -> None:
        for tag in tags or TAGS:
            if tag not in self.asleep:
                raise RuntimeError(f"engine {self.index}: wake_up({tag!r}), which is awake")
            self.asleep.discard(tag)
            self._write(f"wake {tag}")

    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def load(self, version: int) -> str:
        """A push's arrival: the weights of ``version``; their checksum."""
        if "weights" in self.asleep:
            raise RuntimeError(f"engine {self.index}: weights pushed into sleeping weights")
        self.version = version
        self._write(f"push v{version}")
        return f"checksum-{version}"

    def generate(self, rows: int) -> list[list[int]]:
        """``rows`` replies of the weights it holds (their tokens say the version)."""
        if self.asleep:
            raise RuntimeError(f"engine {self.index}: sampling while {sorted(self.asleep)} sleep")
        self._write(f"sample v{self.version}")
        return [[100 + self.version, 7 + row] for row in range(rows)]


def calls_in_order(entries: list[tuple[int | None, str]], engines: int) -> list[str]:
    """The journal as one event per call: a call to every engine (a fan-out, ``engines``
    entries of one event, in any engine order) becomes one; a driver's entry stays one.

    Raises:
        AssertionError: a fan-out overlaps another call, or an engine is missing from it.
    """
    calls: list[str] = []
    fan_out: tuple[str, set[int]] | None = None
    for who, event in entries:
        if fan_out is not None and (who is None or event != fan_out[0] or who in fan_out[1]):
            raise AssertionError(f"{event!r} of {who} inside the fan-out {fan_out}: {entries}")
        if who is None:
            calls.append(event)
            continue
        fan_out = fan_out or (event, set())
        fan_out[1].add(who)
        if len(fan_out[1]) == engines:
            calls.append(event)
            fan_out = None
    if fan_out is not None:
        raise AssertionError(f"an unfinished fan-out {fan_out}: {entries}")
    return calls
