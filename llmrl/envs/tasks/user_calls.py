"""Calling the user's scoring code as a fault domain of its own.

A reward function or a task class comes from the user's package; it may raise, hang, return NaN
or something that is not a reward. None of that may crash a run or pass as a silent 0:
:class:`GuardedCall` runs the call, with a deadline when one is set, checks what came back, and
turns every fault into a :class:`Outcome` with ``failed=True`` and the configured fallback
reward. The first fault of each function is logged once, with its traceback and the function's
name; the env worker counts the flagged rows per step (``<name>/failures`` in MLflow).

Deadlines: a plain function runs on a daemon thread that is waited on for ``timeout_s``; a call
that overstays is abandoned there (Python cannot stop a thread), its row gets the fallback and
the next call starts on a new thread, so a hung function costs one idle thread, never the run.
An ``async def`` function's coroutines of one batch run together on one event loop, each under
``asyncio.wait_for``.

Example (a function that raises, and one that returns NaN):
    >>> def broken(response, **fields):
    ...     raise KeyError("answer")
    >>> GuardedCall("broken", fallback_reward=-1.0)(broken, "4").reward
    -1.0
    >>> GuardedCall("nan", fallback_reward=0.0)(lambda response: float("nan"), "4").failure
    'nan'
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmrl.envs.tasks.base import Score

logger = logging.getLogger(__name__)

FAILURES = ("raised", "timeout", "nan", "wrong_type", "wrong_length")
"""Why a call's result was replaced by the fallback."""


@dataclass(frozen=True)
class Outcome:
    """One row's score from user code: ``score`` (the fallback's when ``failed``), and
    ``failure``: one of :data:`FAILURES`, None when the call succeeded."""

    score: Score
    failure: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the row got the fallback reward."""
        return self.failure is not None

    @property
    def reward(self) -> float:
        """The row's reward (the fallback when the call failed)."""
        return self.score.reward


def as_score(value: Any, correct_at: float = 1.0) -> Score | str:
    """``value`` as a :class:`Score`, or the failure reason (``nan``, ``wrong_type``).

    A number (bools count as 0/1) becomes ``Score(reward, correct=reward >= correct_at)``.

    Example:
        >>> as_score(1), as_score("1")
        (Score(reward=1.0, correct=True, formatted=True, parsed=None), 'wrong_type')
    """
    if isinstance(value, Score):
        reward = value.reward
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            return "wrong_type"
        return value if math.isfinite(reward) else "nan"
    if isinstance(value, numbers.Real):
        reward = float(value)
        return Score(reward, correct=reward >= correct_at) if math.isfinite(reward) else "nan"
    return "wrong_type"


class GuardedCall:
    """Runs user scoring calls for the function called ``name`` (see the module docstring).

    Args:
        name: the function's name, in logs and metrics.
        fallback_reward: the reward of a row whose call failed.
        timeout_s: seconds one call may take (None: no deadline, the call runs inline).
        correct_at: a plain number counts as correct when it is at least this.
    """

    def __init__(
        self,
        name: str,
        fallback_reward: float = 0.0,
        timeout_s: float | None = None,
        correct_at: float = 1.0,
    ) -> None:
        self.name = name
        self.fallback = Score(fallback_reward, correct=False, formatted=False)
        self.timeout_s = timeout_s
        self.correct_at = correct_at
        self.logged = False
        self._runner: _ThreadRunner | None = None

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
        """One call whose result is one row's score."""
        value, failure = self._run(function, args, kwargs)
        return self.outcome(value) if failure is None else self.failed(failure)

    def many(
        self, function: Callable[..., Any], rows: int, *args: Any, **kwargs: Any
    ) -> list[Outcome]:
        """One call whose result is a list of ``rows`` scores (a batch or a group)."""
        value, failure = self._run(function, args, kwargs)
        if failure is None and (isinstance(value, (str, bytes)) or not _is_sequence(value)):
            failure = self._log("wrong_type", f"returned {type(value).__name__}, not a list")
        elif failure is None and len(value) != rows:
            failure = self._log("wrong_length", f"returned {len(value)} scores for {rows} replies")
        if failure is not None:
            return [self.failed(failure)] * rows
        return [self.outcome(item) for item in value]

    def each(self, calls: Sequence[tuple[Callable[..., Any], tuple, dict]]) -> list[Outcome]:
        """Several single-row calls; ``async`` functions' calls run concurrently."""
        if calls and inspect.iscoroutinefunction(calls[0][0]):
            results = _run_coroutines([f(*a, **k) for f, a, k in calls], self.timeout_s)
            outcomes = []
            for value, error in results:
                if error is None:
                    outcomes.append(self.outcome(value))
                else:
                    outcomes.append(self.failed(self._fault(error)))
            return outcomes
        return [self(function, *args, **kwargs) for function, args, kwargs in calls]

    def outcome(self, value: Any) -> Outcome:
        """The outcome of a value the user's code returned for one row."""
        score = as_score(value, self.correct_at)
        if isinstance(score, Score):
            return Outcome(score)
        return self.failed(self._log(score, f"returned {_describe(value)}"))

    def failed(self, failure: str) -> Outcome:
        """A row that gets the fallback reward for ``failure``."""
        return Outcome(self.fallback, failure)

    def _run(
        self, function: Callable[..., Any], args: tuple, kwargs: dict
    ) -> tuple[Any, str | None]:
        try:
            if inspect.iscoroutinefunction(function):
                [(value, error)] = _run_coroutines([function(*args, **kwargs)], self.timeout_s)
                if error is not None:
                    return None, self._fault(error)
                return value, None
            if self.timeout_s is None:
                return function(*args, **kwargs), None
            if self._runner is None:
                self._runner = _ThreadRunner()
            value, error = self._runner.call(function, args, kwargs, self.timeout_s)
        except Exception as raised:
            return None, self._fault(raised)
        if error is not None:
            if isinstance(error, TimeoutError):
                self._runner = None  # the old thread is stuck in the call: use a new one
            return None, self._fault(error)
        return value, None

    def _fault(self, error: BaseException) -> str:
        if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
            return self._log("timeout", f"took longer than timeout_s={self.timeout_s}")
        detail = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return self._log("raised", f"raised {type(error).__name__}: {error}\n{detail}")

    def _log(self, failure: str, detail: str) -> str:
        if not self.logged:
            self.logged = True
            logger.warning(
                "reward function %r failed (%s): %s; its rows get the fallback reward %g and "
                "count in %s/failures (this is logged once per function and process)",
                self.name,
                failure,
                detail,
                self.fallback.reward,
                self.name,
            )
        return failure

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_runner": None, "logged": False}


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) or hasattr(value, "tolist")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}"


def _run_coroutines(
    coroutines: list[Any], timeout_s: float | None
) -> list[tuple[Any, BaseException | None]]:
    """Run ``coroutines`` together, each under ``timeout_s``; ``(value, error)`` per coroutine.

    On a fresh event loop in this thread, or on a helper thread when this thread already runs
    one (an async actor)."""

    async def gather() -> list[Any]:
        async def one(coroutine: Any) -> tuple[Any, BaseException | None]:
            try:
                return await asyncio.wait_for(coroutine, timeout_s), None
            except Exception as error:
                return None, error

        return await asyncio.gather(*(one(c) for c in coroutines))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.extend(asyncio.run(gather())), daemon=True)
    thread.start()
    thread.join()
    return result


class _ThreadRunner:
    """A daemon thread that runs calls one at a time; the caller waits at most a deadline."""

    def __init__(self) -> None:
        self._calls: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, daemon=True, name="llmrl-user-reward").start()

    def _serve(self) -> None:
        while True:
            function, args, kwargs, answer = self._calls.get()
            try:
                answer.put((function(*args, **kwargs), None))
            except BaseException as error:
                answer.put((None, error))

    def call(
        self, function: Callable[..., Any], args: tuple, kwargs: dict, timeout_s: float
    ) -> tuple[Any, BaseException | None]:
        answer: queue.Queue = queue.Queue(maxsize=1)
        self._calls.put((function, args, kwargs, answer))
        try:
            return answer.get(timeout=timeout_s)
        except queue.Empty:
            return None, TimeoutError(f"no answer in {timeout_s} s")
