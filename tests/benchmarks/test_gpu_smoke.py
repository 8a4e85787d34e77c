"""``benchmarks/gpu.py --smoke``: the GPU benchmark's whole path on a tiny model (CPU here),
writing a results file with every figure positive. Its numbers check the script, not llmrl."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HAS_TRL = importlib.util.find_spec("trl") is not None


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("gpu-smoke")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}  # CPU
    command = [sys.executable, "benchmarks/gpu.py", "--smoke", "--results-dir", str(out)]
    if not HAS_TRL:
        command.append("--no-trl")
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "gpu.json").read_text())


def test_smoke_run_reports_decode_and_the_llmrl_grpo_step(results):
    assert results["benchmark"] == "gpu" and results["extra"]["device"] == "cpu"
    for name in ("llmrl decode", "raw generate"):
        medians = results["contenders"][name]["medians"]
        assert medians["tokens_per_second"] > 0 and medians["tokens"] > 0
    step = results["contenders"]["llmrl GRPO step"]["medians"]
    assert step["seconds"] > 0 and step["peak_memory_mb"] > 0
    phases = ("generation", "training", "weight sync")
    assert set(step["phases"]) == {*phases, "resident MiB", *(f"{p} peak MiB" for p in phases)}
    # the step's peak is its worst phase's (each phase measured on its own; on CPU: peak RSS)
    assert step["peak_memory_mb"] >= max(step["phases"][f"{p} peak MiB"] for p in phases) > 0
    (decode,) = [f for f in results["figures"] if f["what"].startswith("decode tokens/s")]
    assert decode["ratio"] > 0 and decode["peer"]["value"] > 0


def test_smoke_run_reports_packed_and_padded_training(results):
    sides = [results["contenders"][f"llmrl {n} training"]["medians"] for n in ("packed", "padded")]
    for side in sides:
        assert side["seconds"] > 0 and side["peak_memory_mb"] > 0
        assert 0 <= side["padding_share"] < 1 and side["computed_positions"] > 0
    # the packed side never computes more positions than the padded one
    assert sides[0]["computed_positions"] <= sides[1]["computed_positions"]
    (packing,) = [f for f in results["figures"] if f["what"].startswith("packed vs padded")]
    assert packing["ratio"] == pytest.approx(sides[0]["seconds"] / sides[1]["seconds"])


@pytest.mark.skipif(
    not HAS_TRL,
    reason="trl is not importable in this venv (it lives in the "
    "peers' venv, benchmarks/peers.py): TRL's half of the smoke run is skipped",
)
def test_smoke_run_reports_the_trl_grpo_step(results):
    trl = results["contenders"]["TRL GRPO step"]["medians"]
    assert trl["seconds"] > 0 and trl["peak_memory_mb"] > 0
    ratios = [f["ratio"] for f in results["figures"] if "GRPO step" in f["what"]]
    assert ratios and all(r > 0 for r in ratios)
