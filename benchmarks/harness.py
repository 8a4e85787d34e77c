"""Side-by-side measurement: contenders in their own processes, run in alternation.

Every contender is a worker process (``benchmarks/workers/<name>.py``) started with the Python of
its own virtual environment (the project's ``.venv`` for llmrl and raw Hugging Face, the peers'
venv for TRL and TorchRL). A worker loads its model once, then answers one JSON line per request
on stdout. The driver sends ``{"seed": s}`` to each contender in turn, so while one runs the
others wait on stdin and use no CPU: every repetition of every contender sees the same machine.

Worker side::

    serve(setup)   # setup(options) -> run(seed) -> {"tokens": ..., "phases": {...}}

Driver side::

    with Contender("llmrl", python, "llmrl_side.py", {"kind": "rollout", ...}) as a, ...:
        results = alternate([a, b], reps=5)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULT_PREFIX = "@@result "
WORK_DIR = HERE / ".work"  # the exported model both sides load; gitignored


class Contender:
    """One worker process: ``run(seed)`` times one repetition inside the worker."""

    def __init__(self, name: str, python: str | Path, script: str, options: dict[str, Any]):
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(HERE), "TOKENIZERS_PARALLELISM": "false"}
        # options can be large (a whole training set): handed over in a file, not argv
        WORK_DIR.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", suffix=".json", prefix="options-", dir=WORK_DIR, delete=False
        ) as handle:
            json.dump(options, handle)
        self.options_file = Path(handle.name)
        self.process = subprocess.Popen(
            [str(python), str(HERE / "workers" / script), str(self.options_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            self.info = self._read()  # the worker's setup report (versions, threads, load time)
        except BaseException:
            self.close()
            raise

    def run(self, seed: int) -> dict[str, Any]:
        """One timed repetition with ``seed``; returns the worker's result (``seconds``, ...)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"seed": seed}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(RESULT_PREFIX):
                reply = json.loads(line[len(RESULT_PREFIX) :])
                if "error" in reply:
                    raise RuntimeError(f"{self.name} worker failed:\n{reply['error']}")
                return reply
            sys.stdout.write(f"  [{self.name}] {line}")
        raise RuntimeError(f"{self.name} worker exited with code {self.process.wait()}")

    def close(self) -> None:
        self.options_file.unlink(missing_ok=True)
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def __enter__(self) -> Contender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def alternate(
    contenders: Sequence[Contender], reps: int, warmup: int = 1
) -> dict[str, list[dict[str, Any]]]:
    """``warmup`` untimed runs each, then ``reps`` rounds of one run per contender (seed = the
    round), in alternation. Returns every contender's list of results."""
    for rep in range(warmup):
        for contender in contenders:
            contender.run(seed=10_000 + rep)
        print(f"warm-up {rep + 1}/{warmup} done", flush=True)
    results: dict[str, list[dict[str, Any]]] = {c.name: [] for c in contenders}
    for rep in range(reps):
        for contender in contenders:
            results[contender.name].append(contender.run(seed=rep))
        line = ", ".join(f"{n} {r[-1]['seconds']:.2f}s" for n, r in results.items())
        print(f"rep {rep + 1}/{reps}: {line}", flush=True)
    return results


def median_of(results: list[dict[str, Any]], key: str) -> float:
    """The median of ``key`` (``"seconds"`` or ``"phases.<name>"``) over repetitions."""
    values = []
    for result in results:
        value: Any = result
        for part in key.split("."):
            value = value.get(part, 0.0)
        values.append(float(value))
    return statistics.median(values)


def print_table(rows: list[list[str]], header: list[str]) -> None:
    """A plain fixed-width table on stdout."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(
            "  ".join(
                str(c).rjust(w) if i else str(c).ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def verdict(ratio: float, target: float, higher_is_better: bool) -> str:
    """``"meets target"`` or how far the ratio misses it."""
    met = ratio >= target if higher_is_better else ratio <= target
    if met:
        return f"meets target ({'>=' if higher_is_better else '<='} {target})"
    return (
        f"MISSES target {'>=' if higher_is_better else '<='} {target} by {abs(ratio - target):.3f}"
    )


def serve(setup: Callable[[dict[str, Any]], tuple[dict[str, Any], Callable[[int], dict]]]) -> None:
    """Worker main loop: ``setup(options)`` once, then one result line per ``{"seed": s}``.

    ``setup`` returns (an info dict, ``run(seed) -> result``); ``serve`` adds ``seconds`` (wall)
    and ``cpu_seconds`` to each result. Anything else the worker prints goes to stderr.
    """
    reply = sys.stdout
    sys.stdout = sys.stderr  # library prints must not interleave with the protocol
    try:
        started = time.perf_counter()
        info, run = setup(json.loads(Path(sys.argv[1]).read_text()))
        info["setup_seconds"] = time.perf_counter() - started
        _send(reply, info)
        for line in sys.stdin:
            seed = json.loads(line)["seed"]
            wall, cpu = time.perf_counter(), time.process_time()
            result = run(seed)
            result["seconds"] = time.perf_counter() - wall
            result["cpu_seconds"] = time.process_time() - cpu
            _send(reply, result)
    except Exception:  # reported to the driver, which raises it with the worker's traceback
        import traceback

        _send(reply, {"error": traceback.format_exc()})


def _send(stream: Any, payload: dict[str, Any]) -> None:
    stream.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    stream.flush()
