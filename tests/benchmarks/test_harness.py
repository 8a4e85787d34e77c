"""The benchmark harness: contenders in their own processes, run in strict alternation, with
worker failures surfaced to the driver (the scripts in ``benchmarks/`` rely on all three)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from harness import Contender, alternate, median_of, verdict  # noqa: E402

WORKER = """
import json, sys
from harness import serve

def setup(options):
    log = open(options["log"], "a")
    print("library noise on stdout")  # must not break the protocol

    def run(seed):
        if seed == options.get("fail_at"):
            raise ValueError(f"bad seed {seed}")
        log.write(f"{options['name']} {seed}\\n")
        log.flush()
        return {"tokens": seed * 10 + 1, "phases": {"generation": 0.5}}

    return {"who": options["name"]}, run

serve(setup)
"""


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    script = tmp_path / "fake_worker.py"
    script.write_text(WORKER)
    return script


def _contender(name: str, worker: Path, log: Path, **options) -> Contender:
    return Contender(name, sys.executable, str(worker), {"name": name, "log": str(log), **options})


def test_contenders_alternate_after_warmup(worker: Path, tmp_path: Path) -> None:
    log = tmp_path / "order.log"
    with _contender("a", worker, log) as a, _contender("b", worker, log) as b:
        assert a.info["who"] == "a" and a.info["setup_seconds"] >= 0
        results = alternate([a, b], reps=3, warmup=1)
    assert log.read_text().split("\n")[:-1] == [
        "a 10000",
        "b 10000",
        "a 0",
        "b 0",
        "a 1",
        "b 1",
        "a 2",
        "b 2",
    ]
    assert [r["tokens"] for r in results["a"]] == [1, 11, 21]
    assert median_of(results["b"], "tokens") == 11
    assert median_of(results["b"], "phases.generation") == 0.5
    assert median_of(results["b"], "phases.backward") == 0.0  # a phase a contender lacks
    assert all(r["seconds"] >= 0 and "cpu_seconds" in r for r in results["a"])


def test_worker_error_reaches_the_driver_with_its_traceback(worker: Path, tmp_path: Path) -> None:
    with _contender("c", worker, tmp_path / "log", fail_at=1) as c:
        c.run(seed=0)
        with pytest.raises(RuntimeError, match=r"c worker failed:(.|\n)*ValueError: bad seed 1"):
            c.run(seed=1)


def test_worker_that_dies_in_setup_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="crash worker exited with code 3"):
        Contender("crash", sys.executable, str(script), {})


@pytest.mark.parametrize(
    ("ratio", "target", "higher", "expected"),
    [
        (1.02, 0.97, True, "meets target (>= 0.97)"),
        (0.90, 0.97, True, "MISSES target >= 0.97 by 0.070"),
        (0.55, 0.6, False, "meets target (<= 0.6)"),
        (0.95, 0.6, False, "MISSES target <= 0.6 by 0.350"),
    ],
)
def test_verdict(ratio: float, target: float, higher: bool, expected: str) -> None:
    assert verdict(ratio, target, higher) == expected


def test_the_learning_curve_is_a_trailing_moving_average():
    from learning import moving_average

    # each point: the mean of itself and the (window - 1) before it, fewer at the start
    assert moving_average([1.0, 2.0, 3.0, 4.0, 8.0], 3) == [1.0, 1.5, 2.0, 3.0, 5.0]
    assert moving_average([0.5], 5) == [0.5]
    assert moving_average([], 5) == []
