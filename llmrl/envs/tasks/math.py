"""MATH competition problems: answers in ``\\boxed{}``, checked for mathematical equivalence.

Data: rows in the MATH dataset's shape, ``problem`` plus a worked ``solution`` whose final answer
is the **last** ``\\boxed{...}`` (or ``\\boxed 5``, or ``\\fbox{...}``) in it, or ``problem``
plus an ``answer`` (a LaTeX string, e.g. ``\\frac{1}{2}``); an ``answer`` wins over the
solution's box. Optional ``level`` (``"Level 3"``, or an int: ``3`` reads as ``"Level 3"``) and
``type`` (``"Algebra"``) are kept in the problem's ``meta`` and give the eval its per-level and
per-type accuracy (:meth:`MathTask.kinds`). The SFT target is the solution, or
``The answer is $\\boxed{<answer>}$.`` for a row without one.

Reward: the model's answer is the last ``\\boxed{}`` of its response (looked for in its last
:data:`~llmrl.envs.tasks.base.ANSWER_WINDOW_CHARS` characters, in linear time). 1.0 when it is
equivalent to the reference according to ``math-verify`` (LaTeX parsed to sympy: ``\\frac{1}{2}`` =
``0.5`` = ``1/2``, ``\\dfrac``, ``\\left( \\right)``, intervals, sets, ``x = 3`` vs ``3``, unit
text), ``format_reward`` when a boxed answer is not equivalent, 0.0 without a boxed answer.

Verification runs in worker subprocesses (a small pool, one per concurrent caller) with a wall
clock bound of ``timeout_seconds``: a hostile expression (``9^{9^{9^{9}}}``) cannot hang the
caller, and scoring works from any thread (math-verify's own timeout uses ``SIGALRM``, which only
works in the main thread). A worker that runs out of time is killed and replaced; its answer
counts as wrong (``format_reward``) and a warning is logged.

Example:
    >>> last_boxed(r"so $x = \\boxed{\\frac{1}{2}}$, not \\fbox{3}; finally \\boxed 7$")
    '7'
    >>> last_boxed("no box here") is None
    True
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import logging
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from llmrl.data.problem import Problem
from llmrl.envs.tasks.base import ANSWER_WINDOW_CHARS, Score, check_format_reward

logger = logging.getLogger(__name__)

MATH_INSTRUCTIONS = (
    "Solve the problem step by step, then give the final answer in simplest form inside "
    "\\boxed{}, e.g. \\boxed{\\frac{3}{4}}."
)
STARTUP_SECONDS = 120.0
"""How long a verification worker may take to start (import math-verify) before it is an error."""

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_SPACE = re.compile(r"\s*")
_TOKEN = re.compile(r"[^\s$]+")


def _closing_braces(text: str) -> dict[int, int]:
    """Each balanced ``{``'s index -> the index of its ``}``, in one pass over ``text``.

    Escaped characters (``\\{``, ``\\}``, ``\\\\``) are skipped, as LaTeX does not count them;
    an unclosed ``{`` has no entry.
    """
    closing: dict[int, int] = {}
    open_at: list[int] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            open_at.append(index)
        elif char == "}" and open_at:
            closing[open_at.pop()] = index
        index += 1
    return closing


def _box_content(text: str, end: int, closing: dict[int, int]) -> str | None:
    """The argument of a ``\\boxed`` / ``\\fbox`` command name ending at ``text[end]``."""
    start = _SPACE.match(text, end).end()
    if text.startswith("{", start):
        close = closing.get(start)
        return None if close is None else text[start + 1 : close]
    # \boxed 5: up to a space or the closing $, without a sentence's final punctuation
    token = _TOKEN.match(text, start)
    return token.group().rstrip(".,;") if token else None


def last_boxed(text: str, window: int = ANSWER_WINDOW_CHARS) -> str | None:
    """The content of the last complete ``\\boxed{}`` / ``\\boxed x`` / ``\\fbox{}`` of ``text``.

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); an unclosed
    box (a truncated response) is skipped; a blank box gives None. Only the last ``window``
    characters are read (:data:`ANSWER_WINDOW_CHARS`), in time linear in them: one pass pairs
    the braces, one finds the boxes.

    Example:
        >>> last_boxed(r"\\boxed{1} then \\boxed{\\{1, 2\\}}")
        '\\\\{1, 2\\\\}'
    """
    text = text[-window:]
    boxes = [match.end() for match in _BOX.finditer(text)]
    if not boxes:
        return None
    closing = _closing_braces(text)
    for end in reversed(boxes):
        content = _box_content(text, end, closing)
        if content is not None:
            content = content.strip()
            return content or None
    return None


def reference_answer(row: dict[str, Any]) -> str:
    """The reference answer of a row: its ``answer``, else the last box of its ``solution``.

    Raises ``ValueError`` naming the field when there is neither.

    Example:
        >>> reference_answer({"solution": r"Half: $\\boxed{\\frac12}$."})
        '\\\\frac12'
        >>> reference_answer({"answer": "$5$"})
        '5'
    """
    answer = row.get("answer")
    if answer is not None:
        text = str(answer).strip()
        if len(text) >= 2 and text[0] == text[-1] == "$":
            text = text[1:-1].strip()
        if _BOX.match(text):
            text = last_boxed(text) or ""
        if not text:
            raise ValueError("field 'answer': empty answer")
        return text
    solution = row.get("solution")
    if solution is None:
        raise ValueError("field 'solution': missing, and the row has no answer field either")
    boxed = last_boxed(solution)
    if boxed is None:
        raise ValueError("field 'solution': no \\boxed{...} final answer (and no answer field)")
    return boxed


def sft_target(row: dict[str, Any], answer: str) -> str:
    """The solution when it has a boxed answer, else ``The answer is $\\boxed{<answer>}$.``."""
    closing = f"The answer is $\\boxed{{{answer}}}$."
    solution = (row.get("solution") or "").strip()
    if not solution:
        return closing
    return solution if last_boxed(solution) is not None else f"{solution}\n\n{closing}"


def _level(value: Any, index: int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"Level {value}"
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"MATH row {index}, field 'level': expected a string or an int")
    return value.strip()


def problem_from_row(row: dict[str, Any], index: int, split: str) -> Problem:
    """One MATH row as a :class:`Problem` with id ``math-<split>-<i>``.

    ``row`` has ``problem`` and ``solution`` and/or ``answer``; ``level`` and ``type`` (both
    optional) go to ``meta``. Raises ``ValueError`` naming the row and the field.

    Example:
        >>> row = {"problem": "1/2 + 0?", "solution": r"$\\boxed{\\frac{1}{2}}$", "level": 1}
        >>> problem = problem_from_row(row, 7, "eval")
        >>> problem.id, problem.answer, problem.meta["level"]
        ('math-eval-00007', '\\\\frac{1}{2}', 'Level 1')
    """
    if "problem" not in row:
        raise ValueError(f"MATH row {index} has no 'problem' field")
    for name in ("problem", "solution", "type"):
        value = row.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"MATH row {index}, field {name!r}: must be a non-empty string")
    answer_value = row.get("answer")
    if answer_value is not None and (
        isinstance(answer_value, bool) or not isinstance(answer_value, (str, int, float))
    ):
        raise ValueError(f"MATH row {index}, field 'answer': must be a string or a number")
    try:
        answer = reference_answer(row)
    except ValueError as error:
        raise ValueError(f"MATH row {index}, {error}") from None
    meta: dict[str, Any] = {"split": split, "index": index}
    if row.get("level") is not None:
        meta["level"] = _level(row["level"], index)
    if row.get("type") is not None:
        meta["type"] = row["type"].strip()
    return Problem(
        id=f"math-{split}-{index:05d}",
        prompt=row["problem"].strip(),
        answer=answer,
        sft_target=sft_target(row, answer),
        meta=meta,
    )


# ----------------------------------------------------------------- verification subprocesses

# The worker: reads [gold, predicted] JSON lines, answers true/false lines. It imports no llmrl
# (llmrl.envs pulls in torch) and drops the working directory from sys.path. It must not outlive
# its parent (killed while the worker is busy: no EOF on stdin then): on Linux the kernel kills it
# (PR_SET_PDEATHSIG, which also fires when the thread that started it ends: the pool then starts
# another); elsewhere a thread watches the parent, which only helps while the GIL is released.
_WORKER_CODE = r"""
import sys
sys.path = [p for p in sys.path if p not in ("", ".")]
import json, logging, os, signal, threading, time
parent = int(sys.argv[1])
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
def _orphaned():
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)
threading.Thread(target=_orphaned, daemon=True).start()
logging.getLogger("math_verify").setLevel(logging.ERROR)
from math_verify import parse, verify
def same(gold, predicted):
    gold = parse("\\boxed{" + gold + "}", parsing_timeout=None)
    predicted = parse("\\boxed{" + predicted + "}", parsing_timeout=None)
    return bool(gold) and bool(predicted) and verify(gold, predicted, timeout_seconds=None)
same("\\frac{1}{2}", "0.5") and same("(1, 2]", "\\left(1,2\\right]")  # sympy's lazy setup
sys.stdout.write("ready\n")
sys.stdout.flush()
for line in sys.stdin:
    try:
        answer = same(*json.loads(line))
    except Exception:
        answer = False
    sys.stdout.write(json.dumps(bool(answer)) + "\n")
    sys.stdout.flush()
"""


class _WorkerGone(Exception):
    """The worker exited before answering."""


class _Worker:
    """One verification subprocess, used by one thread at a time."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        assert self.process.stdout is not None
        self._selector.register(self.process.stdout, selectors.EVENT_READ)

    def _line(self, seconds: float) -> bytes:
        deadline = time.monotonic() + seconds
        stdout = self.process.stdout
        assert stdout is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                raise TimeoutError
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:  # end of output: the worker is exiting
                try:
                    code: int | None = self.process.wait(1.0)
                except subprocess.TimeoutExpired:
                    code = None
                raise _WorkerGone(f"exited with {code}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def start(self) -> None:
        """Wait for the worker's ``ready`` line; RuntimeError when it does not come."""
        try:
            line = self._line(STARTUP_SECONDS)
        except (TimeoutError, _WorkerGone) as error:
            self.close()
            raise RuntimeError(
                "the math-verify worker did not start "
                f"({type(error).__name__}: {error}); is math-verify installed for "
                f"{sys.executable}?"
            ) from None
        if line != b"ready":
            self.close()
            raise RuntimeError(f"the math-verify worker said {line[:200]!r} instead of ready")

    def ask(self, gold: str, predicted: str, seconds: float) -> bool:
        """Whether ``predicted`` is equivalent to ``gold``; TimeoutError, _WorkerGone."""
        stdin = self.process.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps([gold, predicted]).encode() + b"\n")
            stdin.flush()
        except (BrokenPipeError, OSError) as error:
            raise _WorkerGone(str(error)) from None
        return bool(json.loads(self._line(seconds)))

    def close(self) -> None:
        """Kill the worker and reap it."""
        self._selector.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class _Pool:
    """Idle verification workers, shared by all threads of a process; grows with concurrency."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pid = os.getpid()

    def _take(self) -> _Worker:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's workers are not ours
                self._idle, self._pid = [], os.getpid()
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    return worker
                worker.close()  # died while idle (killed from outside)
        worker = _Worker()
        worker.start()
        return worker

    def equivalent(self, gold: str, predicted: str, seconds: float) -> bool | None:
        """Whether ``predicted`` equals ``gold``; None when it was not decided within ``seconds``
        (or the worker died on it): that worker is killed, the next call starts a new one."""
        for attempt in range(2):  # a worker that died on its own gets one successor
            worker = self._take()
            try:
                same = worker.ask(gold, predicted, seconds)
                break
            except TimeoutError:
                worker.close()
                return None
            except _WorkerGone:
                worker.close()
                if attempt:
                    return None
            except BaseException:
                worker.close()
                raise
        with self._lock:
            if self._pid == os.getpid():
                self._idle.append(worker)
                return same
        worker.close()
        return same

    def close(self) -> None:
        """Stop the idle workers (at interpreter exit)."""
        with self._lock:
            idle, self._idle = self._idle, []
            ours = self._pid == os.getpid()
        for worker in idle if ours else []:
            worker.close()


_POOL = _Pool()
atexit.register(_POOL.close)


def _compact(latex: str) -> str:
    return "".join(latex.split())


def equivalent(gold: str, predicted: str, timeout_seconds: float = 5.0) -> bool | None:
    """Whether the LaTeX answer ``predicted`` is mathematically equal to ``gold`` (math-verify).

    Returns None when math-verify did not decide within ``timeout_seconds`` of wall time. Safe
    to call from any thread.

    Example:
        >>> equivalent(r"\\frac{1}{2}", "0.5")
        True
    """
    if _compact(gold) == _compact(predicted):
        return True
    return _POOL.equivalent(gold, predicted, timeout_seconds)


@dataclass(frozen=True)
class MathTask:
    """MATH problems scored by math-verify equivalence of the last ``\\boxed{}`` answer.

    Reward: 1.0 right, ``format_reward`` for a boxed answer that is wrong (or that could not be
    checked within ``timeout_seconds``), 0.0 without a boxed answer.
    """

    format_reward: float = 0.1
    timeout_seconds: float = 5.0

    name = "math"
    instructions = MATH_INSTRUCTIONS

    def __post_init__(self) -> None:
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))
        seconds = self.timeout_seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ValueError(f"timeout_seconds must be a positive number, got {seconds!r}")
        if importlib.util.find_spec("math_verify") is None:
            raise ImportError(
                "the math task needs the math-verify package: "
                "pip install 'math-verify[antlr4_13_2]'"
            )

    def score(self, response: str, problem_answer: str) -> Score:
        """Equivalence of the response's last boxed answer with the reference answer."""
        parsed = last_boxed(response)
        if parsed is None:
            return Score(reward=0.0, correct=False, formatted=False, parsed=None)
        correct = equivalent(problem_answer, parsed, self.timeout_seconds)
        if correct is None:
            logger.warning(
                "math-verify gave no verdict within %.1f s on %.200r (reference %.200r); "
                "scored as wrong",
                self.timeout_seconds,
                parsed,
                problem_answer,
            )
            correct = False
        reward = 1.0 if correct else self.format_reward
        return Score(reward=reward, correct=correct, formatted=True, parsed=parsed)

    def kinds(self, problem: Problem) -> list[str]:
        """The groupings of ``problem`` for per-kind accuracy: ``["level:Level 3", "type:Algebra"]``
        (each only when the row had it)."""
        return [f"{key}:{problem.meta[key]}" for key in ("level", "type") if problem.meta.get(key)]
