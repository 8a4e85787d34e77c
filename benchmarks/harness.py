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
    save_results("rollout", [figure(...), ...], {c.name: summarize(c, results[c.name]) ...})

Memory: ``serve`` adds to the setup report and to every result the worker's peak resident memory
so far, ``peak_rss_mb`` (the worker process alone: its ``VmHWM`` on Linux, the peak
``getrusage(RUSAGE_SELF).ru_maxrss`` reports without the driver's peak that Linux carries into
it through ``exec``), and ``peak_rss_children_mb`` (``getrusage(RUSAGE_CHILDREN)``: the largest
single descendant process the worker has waited for, e.g. the Ray processes a runtime request
stops at its end; 0 when it spawned none). The two are kept apart, not summed: the children's
figure is one process's peak (an upper bound: it includes the worker's own peak at the time the
child was spawned), not the peak of the process tree, and processes still running (or not reaped
by the worker) are not in it. A script's ``peak RSS`` is the maximum over repetitions (the value
only grows).

Results: ``save_results`` writes ``results/<name>.json`` (machine facts, each contender's info,
medians and peak memory, the figures with their targets and verdicts); ``report.py`` turns every
results file into the "Latest figures" table of ``README.md``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULT_PREFIX = "@@result "
WORK_DIR = HERE / ".work"  # the exported model both sides load; gitignored
RESULTS_DIR = HERE / "results"  # one JSON file per benchmark, committed; report.py reads them
# packages whose versions a worker reports when it has imported them
REPORTED_PACKAGES = ("torch", "transformers", "trl", "torchrl", "tensordict", "ray", "llmrl")


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


def max_of(results: list[dict[str, Any]], key: str = "peak_rss_mb") -> float | None:
    """The maximum of ``key`` over repetitions (None when no result has it): peak memory."""
    values = [float(r[key]) for r in results if r.get(key) is not None]
    return max(values) if values else None


def summarize(contender: Contender, runs: list[dict[str, Any]], **medians: float) -> dict[str, Any]:
    """One contender's entry of a results file: its worker's info, the number of repetitions,
    the medians of ``seconds`` and ``cpu_seconds`` plus ``medians`` (what the script's table
    shows), and its peak memory (maximum over repetitions, MiB)."""
    return {
        "info": contender.info,
        "reps": len(runs),
        "medians": {
            "seconds": median_of(runs, "seconds") if runs else None,
            "cpu_seconds": median_of(runs, "cpu_seconds") if runs else None,
            **medians,
        },
        "peak_rss_mb": max_of([contender.info, *runs], "peak_rss_mb"),
        "peak_rss_children_mb": max_of([contender.info, *runs], "peak_rss_children_mb"),
    }


def measure(value: float | None, unit: str, text: str | None = None) -> dict[str, Any]:
    """A figure's value: the number, its unit and how the table shows it."""
    shown = text if text is not None else (f"{value:.4g} {unit}" if value is not None else "")
    return {"value": value, "unit": unit, "text": shown}


def figure(
    what: str,
    llmrl: dict[str, Any],
    ratio: float,
    target: float | None,
    higher_is_better: bool,
    peer: tuple[str, dict[str, Any]] | None = None,
    **display: str,
) -> dict[str, Any]:
    """One compared figure as a results file keeps it: ``llmrl`` and ``peer`` (name, measure)
    values, the ratio the script prints, its target and the verdict (``met``; ``gap``: how far
    the ratio misses the target, 0 when met). ``target=None``: a ratio printed without a target.
    ``display`` (``ratio_text``, ``target_text``, ``note``) overrides how report.py shows it."""
    met = None if target is None else (ratio >= target if higher_is_better else ratio <= target)
    return {
        "what": what,
        "llmrl": llmrl,
        "peer": None if peer is None else {"name": peer[0], **peer[1]},
        "ratio": ratio,
        "target": target,
        "higher_is_better": higher_is_better,
        "met": met,
        "gap": None if target is None else (0.0 if met else abs(ratio - target)),
        "verdict": None if target is None else verdict(ratio, target, higher_is_better),
        **display,
    }


def machine_facts() -> dict[str, Any]:
    """The driver's machine: CPU model, logical CPUs, memory, OS, Python, torch (version and
    thread count of this process) and transformers versions, GPU if torch sees one."""
    facts: dict[str, Any] = {
        "cpu_model": _proc_field("/proc/cpuinfo", ("model name", "Hardware", "Processor")),
        "logical_cpus": os.cpu_count(),
        "memory_total_gib": None,
        "os": platform.system(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": None,
        "torch_threads": None,
        "transformers": _distribution("transformers"),
        "gpu": None,
    }
    memory = _proc_field("/proc/meminfo", ("MemTotal",))
    if memory is not None:  # "24682416 kB"
        facts["memory_total_gib"] = round(int(memory.split()[0]) / 2**20, 1)
    try:
        import torch
    except ImportError:
        return facts
    facts["torch"] = torch.__version__
    facts["torch_threads"] = torch.get_num_threads()
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available():
        facts["gpu"] = cuda.get_device_name(0)
    return facts


def _proc_field(path: str, keys: Sequence[str]) -> str | None:
    """The first ``key: value`` line of a /proc file whose key is one of ``keys``."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in keys and value.strip():
            return value.strip()
    return None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def _json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it (paths and other objects as strings)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def save_results(
    name: str,
    figures: Sequence[dict[str, Any]],
    contenders: Mapping[str, dict[str, Any]],
    extra: dict[str, Any] | None = None,
    results_dir: Path | None = None,
    args: Any = None,
    script: str | None = None,
) -> Path:
    """Write ``results/<name>.json``: the benchmark, when, the command line, the machine, each
    contender's entry (``summarize``) and the ``figures`` (``figure``), plus ``extra``: the
    script's parsed ``args`` (the workload's settings) and any further facts it passes.
    ``script``: the script that wrote it, when its name is not ``<name>.py``. Overwrites the
    previous file of that benchmark; returns its path."""
    if args is not None:
        extra = {**{k: _json_safe(v) for k, v in vars(args).items()}, **(extra or {})}
    directory = RESULTS_DIR if results_dir is None else Path(results_dir)
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "script": script or f"{name}.py",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
        "git_commit": _git_commit(),
        "machine": machine_facts(),
        "contenders": dict(contenders),
        "figures": list(figures),
        "extra": extra or {},
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"results written to {path}")
    return path


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident memory in MiB of this process, or (``children``) of its largest waited-for
    descendant.

    Own peak: ``VmHWM`` of ``/proc/self/status`` where there is one (Linux), else
    ``getrusage(RUSAGE_SELF).ru_maxrss``. The two agree except that Linux carries the spawning
    process's peak through ``exec`` into ``ru_maxrss`` (a worker would start at its driver's
    peak), while ``VmHWM`` belongs to the process's own memory. Children: ``getrusage(
    RUSAGE_CHILDREN).ru_maxrss`` (KiB on Linux, bytes on macOS), which has that carry-over: a
    child's figure is at least its parent's peak when it was spawned, an upper bound."""
    if not children:
        try:
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmHWM:"):  # "VmHWM:	   17028 kB"
                        return int(line.split()[1]) / 2**10
        except (OSError, ValueError, IndexError):
            pass
    usage = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF)
    return usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)


def _memory(payload: dict[str, Any]) -> dict[str, Any]:
    payload["peak_rss_mb"] = peak_rss_mb()
    payload["peak_rss_children_mb"] = peak_rss_mb(children=True)
    return payload


def _versions() -> dict[str, str]:
    """Versions of the reported packages this process has imported."""
    found = {}
    for name in REPORTED_PACKAGES:
        module = sys.modules.get(name)
        if module is not None:
            found[name] = str(getattr(module, "__version__", None) or _distribution(name))
    return found


def _distribution(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def serve(setup: Callable[[dict[str, Any]], tuple[dict[str, Any], Callable[[int], dict]]]) -> None:
    """Worker main loop: ``setup(options)`` once, then one result line per ``{"seed": s}``.

    ``setup`` returns (an info dict, ``run(seed) -> result``); ``serve`` adds to the info the
    Python and package versions and ``setup_seconds``, and to each result ``seconds`` (wall),
    ``cpu_seconds``; both get ``peak_rss_mb`` and ``peak_rss_children_mb`` (MiB so far; see the
    module docstring). Anything else the worker prints goes to stderr.
    """
    reply = sys.stdout
    sys.stdout = sys.stderr  # library prints must not interleave with the protocol
    try:
        started = time.perf_counter()
        info, run = setup(json.loads(Path(sys.argv[1]).read_text()))
        info["setup_seconds"] = time.perf_counter() - started
        info.setdefault("python", platform.python_version())
        info.setdefault("versions", _versions())
        _send(reply, _memory(info))
        for line in sys.stdin:
            seed = json.loads(line)["seed"]
            wall, cpu = time.perf_counter(), time.process_time()
            result = run(seed)
            result["seconds"] = time.perf_counter() - wall
            result["cpu_seconds"] = time.process_time() - cpu
            _send(reply, _memory(result))
    except Exception:  # reported to the driver, which raises it with the worker's traceback
        import traceback

        _send(reply, {"error": traceback.format_exc()})


def _send(stream: Any, payload: dict[str, Any]) -> None:
    stream.write(RESULT_PREFIX + json.dumps(payload) + "\n")
    stream.flush()
