"""Kill and resume through the Prefect flow: ``python -m flows`` SIGKILLed while its GRPO stage
runs, then started again with the same arguments, skips the stages that had finished, resumes
GRPO from its checkpoint in the same MLflow run, and completes.

The pipeline runs prepare (20/10 rows), SFT (1 step) and GRPO (3 steps, a checkpoint every step)
on the tiny random model, without the evaluations, against a real ``mlflow server`` and
Prefect's ephemeral API under a temporary ``PREFECT_HOME``. The kill comes once GRPO's first
checkpoint is complete; the GRPO subprocess, in its own session, must die with the flow.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.support.cli import cli_env, wait_until
from tests.support.mlflow_runs import metric_steps
from tests.support.paths import REPO
from tests.support.stages import run_id_of, trainer_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXPERIMENT = "flow-kill-resume"
GRPO_STEPS = 3
_STATUS_ROW = re.compile(r"^  (prepare|sft|grpo) +(ran|skipped) ", re.MULTILINE)


def _flow_args(work: Path, uri: str, model: Path) -> list[str]:
    sets = {
        "prepare": ["generate.train_size=20", "generate.eval_size=10"],
        "sft": [f"model.name={model}", "steps=1", "batch_size=2", "data.max_eval_rows=2"],
        "grpo": [
            f"model.name={model}",
            f"steps={GRPO_STEPS}",
            "prompts_per_step=2",
            "num_samples=2",
            "generation.max_new_tokens=8",
            "checkpoint.every=1",
        ],
    }
    overrides = [
        a for stage, items in sets.items() for i in items for a in ("--set", f"{stage}.{i}")
    ]
    return [
        *("--config-dir", str(REPO / "configs"), "--work-dir", str(work)),
        *("--mlflow-tracking-uri", uri, "--experiment", EXPERIMENT, "--skip", "eval"),
        *overrides,
    ]


def _start_flow(args: list[str], root: Path, log: Path) -> subprocess.Popen:
    """``python -m flows ARGS`` in its own process group (its Prefect API server with it)."""
    env = {
        **cli_env(root),
        "PREFECT_HOME": str(root / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
    }
    env.pop("PREFECT_API_URL", None)  # the ephemeral API of that process, not a test harness's
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "flows", *args],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie nobody reaped does not)."""
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def _stage_pids(work: Path) -> list[int]:
    """Live ``llmrl.cli grpo`` processes writing under ``work``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone
            continue
        ours = any(str(work).encode() in part for part in cmdline)
        if b"llmrl.cli" in cmdline and b"grpo" in cmdline and ours and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _wait_dead(pids: list[int], timeout: float) -> list[int]:
    """The processes of ``pids`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group ``process`` leads, and reap ``process``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)


@pytest.fixture
def flow_root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for pid in _stage_pids(tmp_path / "work"):  # only if the test failed to see them die
        os.kill(pid, signal.SIGKILL)


# A launcher in a process of its own, running a stage that writes its pid and sleeps silently
# (nothing it writes could fail on the dead parent's pipes and end it by accident).
_LAUNCHER = """
import sys
from flows.launchers.local import LocalLauncher
sleeper = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
LocalLauncher([sys.executable, "-c", sleeper, sys.argv[1]]).run("prepare", None, [], {})
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG, /proc")
def test_a_killed_launcher_takes_its_stage_with_it(tmp_path: Path) -> None:
    pid_file, log = tmp_path / "stage.pid", tmp_path / "launcher.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(pid_file)],
            env=cli_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    stage = 0
    try:
        wait_until(launcher, lambda: pid_file.is_file() and pid_file.read_text(), log, 120)
        stage = int(pid_file.read_text())
        assert _alive(stage)
        launcher.kill()
        launcher.wait(timeout=60)
        assert _wait_dead([stage], 10) == [], "the stage outlived its killed launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if stage and _alive(stage):
            os.kill(stage, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG, /proc")
def test_killed_flow_reruns_skipping_finished_stages_and_resuming_grpo(
    flow_root: Path,
    tiny_model_dir,
    mlflow_server,
) -> None:
    work, uri = flow_root / "work", mlflow_server.uri
    args = _flow_args(work, uri, tiny_model_dir)

    killed_log = flow_root / "killed.log"
    flow = _start_flow(args, flow_root, killed_log)
    try:
        wait_until(
            flow, lambda: any(work.glob("grpo-*/checkpoints/step-000001/COMPLETE")), killed_log, 600
        )
        stages = _stage_pids(work)
        assert len(stages) == 1, killed_log.read_text()[-4000:]
        os.kill(flow.pid, signal.SIGKILL)  # the flow process only; its stage must follow
        assert _wait_dead(stages, 30) == [], "the GRPO stage outlived the killed flow"
    finally:
        _kill_group(flow)  # the flow's Prefect API server, if still there
    assert flow.returncode == -9
    (grpo_dir,) = work.glob("grpo-*")
    checkpoints = grpo_dir / "checkpoints"
    grpo_run = run_id_of(checkpoints / "step-000001")
    assert not (checkpoints / f"step-{GRPO_STEPS:06d}").exists()
    stored = sorted(p.name.split("-")[0] for p in (work / "stages").glob("*.json"))
    assert stored == ["prepare", "sft"]
    sft_record_before = sorted((work / "stages").glob("sft-*.json"))[0].read_text()

    rerun_log = flow_root / "rerun.log"
    rerun = _start_flow(args, flow_root, rerun_log)
    try:
        code = rerun.wait(timeout=600)
    finally:
        _kill_group(rerun)
    output = rerun_log.read_text()
    assert code == 0, output[-6000:]

    # The finished stages were skipped, GRPO resumed from a checkpoint of the killed run.
    assert "skipping prepare: finished in a previous run" in output
    assert "skipping sft: finished in a previous run" in output
    assert "resuming GRPO from step" in output
    statuses = dict(_STATUS_ROW.findall(output))  # the report's "Wall time per stage" table
    assert statuses == {"prepare": "skipped", "sft": "skipped", "grpo": "ran"}
    assert sorted((work / "stages").glob("sft-*.json"))[0].read_text() == sft_record_before
    (grpo_record,) = (work / "stages").glob("grpo-*.json")
    assert json.loads(grpo_record.read_text())["mlflow_run_id"] == grpo_run
    final = checkpoints / f"step-{GRPO_STEPS:06d}"
    assert trainer_state(final)["step"] == GRPO_STEPS
    assert run_id_of(final) == grpo_run
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]

    # MLflow: one prepare, one SFT and one GRPO run (continued, every step once), two pipeline runs.
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    names = sorted(run.info.run_name for run in runs)
    pipelines = sorted(n for n in names if n.startswith("pipeline-"))
    assert names == ["grpo", *pipelines, "prepare", "sft"]  # prepare ran once: reused on re-run
    parents = [run for run in runs if run.info.run_name.startswith("pipeline-")]
    assert len(parents) == 2
    (grpo,) = [run for run in runs if run.info.run_name == "grpo"]
    assert grpo.info.run_id == grpo_run and grpo.info.status == "FINISHED"
    for key in ("reward_mean", "policy_version", "generation_seconds"):
        assert metric_steps(uri, grpo_run, key) == list(range(1, GRPO_STEPS + 1)), key
    finished = [p for p in parents if p.info.status == "FINISHED"]
    assert len(finished) == 1  # the re-run's parent; the killed one never ended
    (killed_parent,) = [p for p in parents if p is not finished[0]]
    assert grpo.data.tags["mlflow.parentRunId"] == finished[0].info.run_id
    assert grpo.data.tags["llmrl.previous_parent_run_id"] == killed_parent.info.run_id
    (sft,) = [run for run in runs if run.info.run_name == "sft"]
    assert sft.data.tags["mlflow.parentRunId"] == killed_parent.info.run_id
    assert metric_steps(uri, sft.info.run_id, "loss") == [1]
