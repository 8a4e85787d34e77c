"""Benchmark results kept: each worker's peak memory, the results files ``save_results`` writes,
and ``report.py`` turning them into the README's "Latest figures" table."""

from __future__ import annotations

import datetime
import importlib.util
import json
import platform
import sys
import types
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from harness import (  # noqa: E402
    Contender,
    alternate,
    figure,
    max_of,
    measure,
    save_results,
    summarize,
    verdict,
)

_spec = importlib.util.spec_from_file_location("benchmarks_report", BENCHMARKS / "report.py")
assert _spec is not None and _spec.loader is not None
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

MIB = 2**20

# seed 1 keeps ~50 MiB alive (bytes of one repeated byte are written, so the pages are resident);
# seed 2 runs a child process that holds 150 MiB (more than the worker's own peak) and exits
WORKER = """
import subprocess, sys
from harness import serve

def setup(options):
    kept = []

    def run(seed):
        if seed == 1:
            kept.append(b"\\x01" * (50 * 2**20))
        if seed == 2:
            subprocess.run([sys.executable, "-c", "b = b'x' * (150 * 2**20)"], check=True)
        return {"tokens": 7}

    return {"who": "memory"}, run

serve(setup)
"""


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    script = tmp_path / "memory_worker.py"
    script.write_text(WORKER)
    return script


def test_serve_reports_peak_rss_that_grows_with_allocation(worker: Path) -> None:
    with Contender("memory", sys.executable, str(worker), {}) as contender:
        assert contender.info["peak_rss_mb"] > 5  # a Python interpreter is at least that
        assert contender.info["peak_rss_children_mb"] == 0  # nothing spawned yet
        assert contender.info["python"] == platform.python_version()
        assert isinstance(contender.info["versions"], dict)
        before = contender.run(seed=0)
        grown = contender.run(seed=1)
        spawned = contender.run(seed=2)
    assert before["peak_rss_mb"] >= contender.info["peak_rss_mb"]
    # 50 MiB written and kept: the peak grows by at least 45 MiB (hand-checked lower bound)
    assert grown["peak_rss_mb"] - before["peak_rss_mb"] >= 45
    assert grown["peak_rss_children_mb"] == 0
    # the child's 150 MiB is reported apart, not added to the worker's own peak
    assert spawned["peak_rss_children_mb"] >= 150
    assert spawned["peak_rss_mb"] - grown["peak_rss_mb"] < 20
    assert max_of([before, grown, spawned]) == spawned["peak_rss_mb"]
    assert max_of([{"seconds": 1.0}]) is None


def test_worker_peak_is_its_own_not_the_drivers(worker: Path) -> None:
    """Linux carries a process's peak through exec into the new program's ru_maxrss: a worker
    spawned by a driver holding 200 MiB must still report only its own (a bare interpreter with
    the harness: ~17 MiB)."""
    held = b"\x02" * (200 * MIB)
    with Contender("memory", sys.executable, str(worker), {}) as contender:
        assert 5 < contender.info["peak_rss_mb"] < 100
    del held


@pytest.mark.parametrize(
    ("ratio", "target", "higher", "met", "gap"),
    [
        (1.02, 0.97, True, True, 0.0),
        (1.176, 1.2, True, False, 0.024),
        (0.55, 0.6, False, True, 0.0),
        (0.642, 0.6, False, False, 0.042),
    ],
)
def test_figure_verdict_matches_the_printed_one(
    ratio: float, target: float, higher: bool, met: bool, gap: float
) -> None:
    made = figure("w", measure(1.0, "s"), ratio, target, higher)
    assert made["met"] is met
    assert made["gap"] == pytest.approx(gap)  # a float64 difference: 1 ulp, within rel=1e-6
    assert made["verdict"] == verdict(ratio, target, higher)


def test_figure_without_target() -> None:
    made = figure("w", measure(2.0, "s"), 0.5, None, False, peer=("p", measure(4.0, "s")))
    assert (made["met"], made["gap"], made["verdict"], made["target"]) == (None, None, None, None)
    assert made["peer"] == {"name": "p", "value": 4.0, "unit": "s", "text": "4 s"}


def test_save_results_writes_the_json(
    worker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch = types.SimpleNamespace(
        __version__="9.9.9",
        get_num_threads=lambda: 3,
        cuda=types.SimpleNamespace(is_available=lambda: False),
    )
    monkeypatch.setitem(sys.modules, "torch", fake_torch)  # the driver's torch, without importing
    monkeypatch.setattr(sys, "argv", ["grpo_step.py", "--reps", "2"])
    with (
        Contender("llmrl", sys.executable, str(worker), {}) as a,
        Contender("TRL", sys.executable, str(worker), {}) as b,
    ):
        results = alternate([a, b], reps=2, warmup=0)
    figures = [
        figure(
            "one GRPO iteration",
            measure(36.86, "s", "36.9 s"),
            0.642,
            0.6,
            higher_is_better=False,
            peer=("TRL `GRPOTrainer`", measure(57.37, "s", "57.4 s")),
        )
    ]
    contenders = {c.name: summarize(c, results[c.name], tokens=7.0) for c in (a, b)}
    path = save_results("grpo_step", figures, contenders, {"prompts": 8}, results_dir=tmp_path)

    assert path == tmp_path / "grpo_step.json"
    saved = json.loads(path.read_text())
    assert saved["benchmark"] == "grpo_step"
    when = datetime.datetime.fromisoformat(saved["date"])
    assert when.tzinfo is not None
    assert abs((datetime.datetime.now().astimezone() - when).total_seconds()) < 60
    assert saved["command"] == "python grpo_step.py --reps 2"
    assert saved["extra"] == {"prompts": 8}

    machine = saved["machine"]
    assert isinstance(machine["cpu_model"], str) and machine["cpu_model"]
    assert isinstance(machine["logical_cpus"], int) and machine["logical_cpus"] >= 1
    assert isinstance(machine["memory_total_gib"], float) and machine["memory_total_gib"] > 0
    assert isinstance(machine["os"], str) and isinstance(machine["kernel"], str)
    assert machine["python"] == platform.python_version()
    assert (machine["torch"], machine["torch_threads"], machine["gpu"]) == ("9.9.9", 3, None)
    assert machine["transformers"] is None or isinstance(machine["transformers"], str)

    assert set(saved["contenders"]) == {"llmrl", "TRL"}
    for name, entry in saved["contenders"].items():
        assert entry["info"]["who"] == "memory"  # the worker's own info dict, as reported
        assert entry["info"]["python"] == platform.python_version()
        assert isinstance(entry["info"]["versions"], dict)
        assert entry["reps"] == 2
        assert isinstance(entry["medians"]["seconds"], float)
        assert isinstance(entry["medians"]["cpu_seconds"], float)
        assert entry["medians"]["tokens"] == 7.0
        assert entry["peak_rss_mb"] == max(r["peak_rss_mb"] for r in results[name])
        assert isinstance(entry["peak_rss_mb"], float) and entry["peak_rss_mb"] > 5
        assert isinstance(entry["peak_rss_children_mb"], float)

    [saved_figure] = saved["figures"]
    assert saved_figure == {
        "what": "one GRPO iteration",
        "llmrl": {"value": 36.86, "unit": "s", "text": "36.9 s"},
        "peer": {"name": "TRL `GRPOTrainer`", "value": 57.37, "unit": "s", "text": "57.4 s"},
        "ratio": 0.642,
        "target": 0.6,
        "higher_is_better": False,
        "met": False,
        "gap": pytest.approx(0.042),  # 0.642 - 0.6 in float64: 1 ulp off
        "verdict": "MISSES target <= 0.6 by 0.042",
    }


def _result(name: str, date: str, machine: dict[str, Any], **rest: Any) -> dict[str, Any]:
    return {
        "benchmark": name,
        "date": date,
        "command": f"python {name}.py",
        "machine": machine,
        **rest,
    }


MACHINE = {
    "cpu_model": "AMD EPYC",
    "logical_cpus": 2,
    "memory_total_gib": 23.5,
    "os": "Linux",
    "kernel": "6.8.0",
    "python": "3.12.3",
    "torch": "2.13.0",
    "torch_threads": 2,
    "transformers": "5.23.0",
    "gpu": None,
}
TPS = "tokens/s, 8 chats x 4 samples"
RESULTS = {
    # written alphabetically first, listed second: rows follow the benchmark order of make bench
    "grpo_step": _result(
        "grpo_step",
        "2026-12-01T10:22:05+00:00",
        MACHINE,
        contenders={
            "llmrl": {"info": {"torch_threads": 2, "versions": {"torch": "2.13.0"}}},
            "TRL": {"info": {"torch_threads": 2, "versions": {"trl": "1.16.0"}}},
        },
        figures=[
            figure(
                "one GRPO iteration",
                measure(36.86, "s", "36.9 s"),
                0.642,
                0.6,
                False,
                peer=("TRL `GRPOTrainer`", measure(57.37, "s", "57.4 s")),
            ),
            figure(
                "step / plain",
                measure(36.86, "s", "36.9 s"),
                0.835,
                None,
                False,
                note="one seed",
            ),
        ],
    ),
    "rollout": _result(
        "rollout",
        "2026-11-21",
        {"logical_cpus": 2, "memory_total_gib": 24, "torch": "2.13.0"},
        source="transcribed from the 2026-11-21 run",
        contenders={"TorchRL": {"info": {"versions": {"torchrl": "0.14.1"}}}},
        figures=[
            figure(
                TPS,
                measure(128.0, "tok/s", "128.0 tok/s"),
                1.015,
                0.97,
                True,
                peer=("raw HF", measure(126.1, "tok/s", "126.1 tok/s")),
            ),
            figure(
                TPS,
                measure(128.0, "tok/s", "128.0 tok/s"),
                1.176,
                1.2,
                True,
                peer=("Torch|RL", measure(108.8, "tok/s", "108.8 tok/s")),
                ratio_text="1.176x",
                target_text=">= 1.2x",
            ),
        ],
    ),
}
EXPECTED_BLOCK = [
    "| benchmark | what | llmrl | peer | ratio | target | verdict |",
    "|---|---|---|---|---|---|---|",
    "| `rollout.py` | tokens/s, 8 chats x 4 samples | 128.0 tok/s | raw HF 126.1 tok/s "
    "| **1.015** | >= 0.97 | met |",
    "| `rollout.py` | same | 128.0 tok/s | Torch\\|RL 108.8 tok/s | **1.176x** | >= 1.2x "
    "| **missed by 0.024** |",
    "| `grpo_step.py` | one GRPO iteration | 36.9 s | TRL `GRPOTrainer` 57.4 s | **0.642** "
    "| <= 0.6 | **missed by 0.042** |",
    "| `grpo_step.py` | step / plain | 36.9 s |  | **0.835** | none | no target (one seed) |",
    "",
    "Results files (`benchmarks/results/`, written by each script; dates, machines):",
    "",
    "- `rollout.py`, 2026-11-21, transcribed from the 2026-11-21 run: CPU not recorded, "
    "2 logical CPUs, 24 GiB; torch 2.13.0; contenders: TorchRL (torchrl 0.14.1); "
    "command `python rollout.py`",
    "- `grpo_step.py`, 2026-12-01 10:22: AMD EPYC, 2 logical CPUs, 23.5 GiB, no GPU, "
    "Linux 6.8.0; Python 3.12.3, torch 2.13.0 (2 threads), transformers 5.23.0; "
    "contenders: llmrl (2 threads), TRL (trl 1.16.0, 2 threads); command `python grpo_step.py`",
]
HEAD = "# Benchmarks\n\nProse before the table.\n\n## Latest figures\n\nMeasured on a day.\n\n"
TAIL = "\n\nWhere the time goes: prose after | with a pipe.\n"


def _write_results(directory: Path) -> Path:
    directory.mkdir()
    for name, result in RESULTS.items():
        (directory / f"{name}.json").write_text(json.dumps(result))
    return directory


def test_report_regenerates_the_table_between_the_markers(tmp_path: Path) -> None:
    results = _write_results(tmp_path / "results")
    readme = tmp_path / "README.md"
    readme.write_text(f"{HEAD}{report.BEGIN}\n| old | table |\n{report.END}{TAIL}")

    report.main(["--results", str(results), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith(HEAD + report.BEGIN + "\n")
    assert text.endswith("\n" + report.END + TAIL)
    block = text[len(HEAD + report.BEGIN + "\n") : -len("\n" + report.END + TAIL)]
    assert block.split("\n") == EXPECTED_BLOCK

    report.main(["--results", str(results), "--readme", str(readme)])  # idempotent
    assert readme.read_text() == text


def test_report_names_the_readme_when_a_marker_is_missing(tmp_path: Path) -> None:
    results = _write_results(tmp_path / "results")
    readme = tmp_path / "README.md"
    original = f"{HEAD}{report.BEGIN}\n| old | table |\n{TAIL}"
    readme.write_text(original)
    with pytest.raises(SystemExit) as exited:
        report.main(["--results", str(results), "--readme", str(readme)])
    assert str(readme) in str(exited.value)
    assert report.END in str(exited.value) and "not found" in str(exited.value)
    assert readme.read_text() == original  # left as it was
    readme.write_text(f"{HEAD}{TAIL}")
    with pytest.raises(report.ReportError, match=f"{readme}: marker {report.BEGIN} not found"):
        report.update_readme(readme, results)


def test_committed_results_files_render() -> None:
    """The results in the repository (transcribed or measured) carry what the table needs."""
    results = report.load_results(BENCHMARKS / "results")
    assert {r["benchmark"] for r in results} >= {"rollout", "grpo_step", "overhead"}
    keys = {"what", "llmrl", "peer", "ratio", "target", "higher_is_better", "met", "gap"}
    for result in results:
        assert {"benchmark", "date", "command", "machine", "contenders", "figures"} <= set(result)
        for item in result["figures"]:
            assert keys <= set(item), result["benchmark"]
    block = report.render(results)
    assert block.count("\n| `") == sum(len(r["figures"]) for r in results)


def test_save_results_records_the_scripts_arguments(tmp_path):
    import argparse

    args = argparse.Namespace(model=Path("models/m"), reps=2, lr=5e-6)
    path = save_results("rollout", [], {}, {"same_tokens": True}, results_dir=tmp_path, args=args)
    assert json.loads(path.read_text())["extra"] == {
        "model": "models/m",  # a path, as a string
        "reps": 2,
        "lr": 5e-6,
        "same_tokens": True,
    }


def test_a_results_file_names_the_script_that_wrote_it(tmp_path):
    save_results("grpo_step_packing", [], {}, results_dir=tmp_path, script="grpo_step.py")
    save_results("rollout", [], {}, results_dir=tmp_path)
    scripts = {r["benchmark"]: r["script"] for r in report.load_results(tmp_path)}
    assert scripts == {"grpo_step_packing": "grpo_step.py", "rollout": "rollout.py"}
    lines = report.render(report.load_results(tmp_path)).splitlines()
    assert any(line.startswith("- `grpo_step.py`, ") for line in lines)
    old = {"benchmark": "overhead", "figures": []}  # written before `script` was recorded
    assert report._script(old) == "overhead.py"
