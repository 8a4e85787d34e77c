"""Deadlines for waits on other processes, and the error that names what hung.

Every wait of the GRPO runtime on a Ray actor or a process group goes through here, with a
timeout from the config (``runtime.timeouts``, :mod:`llmrl.config.runtime_settings`):

- :func:`wait_for` is ``ray.get`` with a deadline: one ``ray.wait`` whose timeout is the
  deadline (no polling: it returns when the results are in or the deadline has passed), then
  :class:`CallTimeout` naming the first call still pending (:func:`settle`: the wait alone);
- :func:`naming_timeouts` turns a timeout raised inside a block (torch.distributed's store and
  gloo raise ``RuntimeError`` "Timed out ...") into a :class:`CallTimeout`;
- :class:`Deadline` spreads one deadline over several waits.

A :class:`CallTimeout` is a ``TimeoutError``; its :class:`Hung` says who hung (role and
index), doing what (call and phase), on which version, step or round, and which setting bounds
it, so the message alone tells an operator where to look. It survives pickling, so a trainer
rank's raises in the driver as it was raised.

Example:
    >>> hung = Hung(role="inference engine", index=1, call="load_state_dict",
    ...             phase="loading", version=3, setting="runtime.timeouts.weight_push_s")
    >>> print(CallTimeout(hung, 5.0))  # doctest: +NORMALIZE_WHITESPACE
    inference engine 1 hung: load_state_dict did not return within 5 s (phase loading,
    version 3; bounded by runtime.timeouts.weight_push_s)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from llmrl.core.ray_helpers import import_ray


@dataclass(frozen=True)
class Hung:
    """What a deadline guards: who is waited for, doing what, at which point of the run.

    Args:
        role: ``"inference engine"``, ``"env worker"``, ``"reference"``, ``"trainer rank"``,
            ``"weight broadcast"``...
        call: the call or operation waited for (``"collect"``, ``"load_state_dict"``...).
        index: which one of the role (engine 1, env worker 0; None: the only one).
        phase: the step of the operation it was in (a push: ``sending``, ``loading``,
            ``verifying``; a broadcast: ``joining``, ``header``, ``bucket 3/8``...).
        version: the policy version being pushed or sampled with.
        step: the training step (the runtime fills it in when the error reaches the step).
        round: the collector's collect round.
        ranks: the process-group ranks involved (a broadcast).
        setting: the config field whose value was the deadline.
    """

    role: str
    call: str
    index: int | None = None
    phase: str = ""
    version: int | None = None
    step: int | None = None
    round: int | None = None
    ranks: str = ""
    setting: str = ""

    def each(self, indices: Iterable[int]) -> list[Hung]:
        """This description for each of ``indices`` (one per call of a fan-out)."""
        return [dataclasses.replace(self, index=index) for index in indices]

    def who(self) -> str:
        """``"<role> <index>"`` (just the role without an index)."""
        return self.role if self.index is None else f"{self.role} {self.index}"

    def context(self) -> str:
        """The phase, version, step, round and ranks that are known, comma-separated."""
        parts = [f"phase {self.phase}"] if self.phase else []
        for name in ("version", "step", "round"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name} {value}")
        if self.ranks:
            parts.append(f"ranks {self.ranks}")
        return ", ".join(parts)


class CallTimeout(TimeoutError):
    """A call or wait ran past its deadline; the message names what hung (:class:`Hung`).

    Attributes:
        hung: who hung, doing what, where.
        timeout_s: the deadline it ran past.
        note: what the runtime did about it (or why it could not rebuild).
    """

    def __init__(self, hung: Hung, timeout_s: float, note: str = "") -> None:
        self.hung, self.timeout_s, self.note = hung, float(timeout_s), note
        context = hung.context()
        bound = f"bounded by {hung.setting}" if hung.setting else ""
        details = "; ".join(part for part in (context, bound) if part)
        super().__init__(
            f"{hung.who()} hung: {hung.call} did not return within {self.timeout_s:g} s"
            + (f" ({details})" if details else "")
            + (f"; {note}" if note else "")
        )

    def __reduce__(self) -> tuple:
        # Rebuild from the constructor's arguments, so the error survives pickling (Ray).
        return (type(self), (self.hung, self.timeout_s, self.note))

    def with_details(self, note: str = "", **fields: Any) -> CallTimeout:
        """The same timeout with ``fields`` of :class:`Hung` set where still unknown (None or
        empty) and ``note`` appended."""
        known = {k: v for k, v in fields.items() if getattr(self.hung, k) in (None, "")}
        hung = dataclasses.replace(self.hung, **known)
        notes = "; ".join(part for part in (self.note, note) if part)
        return type(self)(hung, self.timeout_s, notes)


def cause_of(error: BaseException) -> BaseException:
    """The error a Ray task raised (``RayTaskError.cause``), else ``error`` itself."""
    return getattr(error, "cause", None) or error


class Deadline:
    """One deadline over several waits: ``timeout_s`` from now."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self._end = time.monotonic() + self.timeout_s

    def left(self) -> float:
        """Seconds until the deadline (0 once past)."""
        return max(0.0, self._end - time.monotonic())


def wait_for(
    refs: Any, timeout_s: float | Deadline, what: Hung | Sequence[Hung], note: str = ""
) -> Any:
    """``ray.get(refs)`` (one object ref or a list), or :class:`CallTimeout` once
    ``timeout_s`` (seconds, or what is left of a :class:`Deadline`) has passed.

    ``what`` describes the call (one :class:`Hung`), or each ref (one per ref: the timeout
    names the first still pending, and ``note`` lists the others). An error a call raised in
    time is raised as ``ray.get`` raises it."""
    ray = import_ray("Waiting on Ray actors")
    single = not isinstance(refs, (list, tuple))
    pending = [refs] if single else list(refs)
    settle(pending, timeout_s, what, note)
    results = ray.get(pending)
    return results[0] if single else results


def settle(
    refs: Sequence[Any], timeout_s: float | Deadline, what: Hung | Sequence[Hung], note: str = ""
) -> None:
    """Wait until every ref of ``refs`` is done (a result or an error, not fetched), or raise
    :class:`CallTimeout` as :func:`wait_for` does."""
    ray = import_ray("Waiting on Ray actors")
    refs = list(refs)
    whats = [what] * len(refs) if isinstance(what, Hung) else list(what)
    if len(whats) != len(refs):
        raise ValueError(f"{len(whats)} descriptions for {len(refs)} refs")
    deadline = timeout_s if isinstance(timeout_s, Deadline) else Deadline(timeout_s)
    if not refs:
        return
    late = refs
    while late:  # ray.wait may return a little early (its clock is not this one): wait again
        _, late = ray.wait(late, num_returns=len(late), timeout=deadline.left())
        if deadline.left() <= 0:
            break
    if late:
        first = refs.index(late[0])
        others = [whats[refs.index(ref)].who() for ref in late[1:]]
        also = f"also pending: {', '.join(others)}" if others else ""
        notes = "; ".join(part for part in (also, note) if part)
        raise CallTimeout(whats[first], deadline.timeout_s, notes)


def is_timeout(error: BaseException) -> bool:
    """Whether ``error`` reports a timeout: a ``TimeoutError``, or torch.distributed's store
    and gloo errors (``RuntimeError``: "Timed out after ...", "Timed out waiting ...", and
    "Application timeout caused pair closure" for every later operation of that group)."""
    text = str(error).lower()
    return isinstance(error, TimeoutError) or "timed out" in text or "timeout" in text


@contextmanager
def naming_timeouts(what: Hung, timeout_s: float, note: str = "") -> Iterator[None]:
    """Run the block; a timeout it raises (:func:`is_timeout`) becomes :class:`CallTimeout`
    naming ``what`` (``from`` the original). Other errors pass unchanged."""
    try:
        yield
    except CallTimeout:
        raise
    except Exception as error:
        if not is_timeout(error):
            raise
        raise CallTimeout(what, timeout_s, note or _first_line(error)) from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
