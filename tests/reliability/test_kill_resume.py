"""Kill and resume: the GRPO stage SIGKILLed at seeded random points, then re-run with
``checkpoint.resume: auto`` until it succeeds, ends exactly where an uninterrupted run ends.

Ten trials (seeds 0-9) against a real ``mlflow server``. Trial ``seed`` kills the first attempt
with :mod:`llmrl.core.faults` in phase ``KINDS[seed % 5]`` (``generate``, ``backward``,
``checkpoint_write``, ``log_metrics``) at a step (and hit) drawn from ``random.Random(seed)``,
or, for the kind ``time``, from outside at a random delay after the stage has loaded its model.
A kill in the ``backward`` or ``checkpoint_write`` phase strikes the trainer rank (a Ray actor of
the GRPO runtime): the stage then exits 1 naming the dead rank; the other kinds kill the stage
process itself. Then the same command runs again until it exits 0. Every trial checks that the
stage ends at exactly ``STEPS``, the final checkpoint loads into the tiny model, the one MLflow
run of the trial has every step's metrics exactly once, and no partial checkpoint is left.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.core.faults import FAULT_ENV, KILL_MESSAGE, PHASES
from llmrl.stages.common import RUN_ID_FILE, recorded_run_id
from llmrl.train.checkpoint import list_checkpoints, load_checkpoint
from tests.support.cli import start_cli, wait_until
from tests.support.mlflow_runs import metric_steps, metric_values
from tests.support.stages import trainer_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 4
EVERY = 2  # checkpoints at steps 2 and 4: a kill in step 1 or 2 resumes with no checkpoint
TRIALS = 10
RANK_PHASES = {"backward": "train", "checkpoint_write": "save"}
"""Fault phases reached in the trainer rank's actor, not in the stage process (the driver), and
the rank's call they interrupt (the actor's own last words may not reach the driver's log)."""
KINDS = (*PHASES, "time")
MAX_ATTEMPTS = 3
ALWAYS_LOGGED = ("reward_mean", "response_tokens", "generation_seconds", "policy_version")
# one thread per stage process (two trials run at a time); no system metrics in the runs; a
# slow answer of the busy server is not an outage here (an outage spools the step's metrics and
# skips the log_metrics fault point, so a kill planned there would never come)
_QUIET = {
    "OMP_NUM_THREADS": "1",
    "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING": "false",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
}
_LOADED = re.compile(r"starting from scratch|resuming GRPO from step")


@dataclass(frozen=True)
class Kill:
    """Where trial ``seed`` kills its first attempt."""

    kind: str  # a fault phase, or "time"
    step: int = 0
    hit: int = 1
    delay_s: float = 0.0

    def __str__(self) -> str:
        return f"{self.kind}+{self.delay_s:.2f}s" if self.kind == "time" else self.fault

    @property
    def fault(self) -> str:
        return f"{self.kind}:{self.step}:{self.hit}"

    def resumes_from(self) -> int:
        """The newest checkpoint complete when a phase kill strikes (the step's own is not)."""
        return (self.step - 1) // EVERY * EVERY


def plan(seed: int) -> Kill:
    """The kill of trial ``seed``: its kind cycles through :data:`KINDS`, the rest is drawn."""
    rng = random.Random(f"kill-{seed}")
    kind = KINDS[seed % len(KINDS)]
    if kind == "time":
        return Kill(kind, delay_s=rng.uniform(0.0, 2.5))
    if kind == "checkpoint_write":  # only checkpoint steps write; hit 1: no marker, 2: no rename
        hit = 1 + seed // len(KINDS) % 2
        return Kill(kind, rng.choice(range(EVERY, STEPS + 1, EVERY)), hit)
    return Kill(kind, rng.randint(1, STEPS))


def test_the_trials_cover_every_phase() -> None:
    kinds = [plan(seed).kind for seed in range(TRIALS)]
    assert sorted(set(kinds)) == sorted(KINDS)
    assert all(kinds.count(kind) == 2 for kind in KINDS)
    writes = [plan(seed).hit for seed in range(TRIALS) if plan(seed).kind == "checkpoint_write"]
    assert sorted(writes) == [1, 2]


def _args(data: Path, model: Path, seed: int) -> list[str]:
    sets = [
        f"data.path={data}",
        f"model.name={model}",
        f"steps={STEPS}",
        "prompts_per_step=2",
        "num_samples=2",
        "generation.max_new_tokens=8",
        f"checkpoint.every={EVERY}",
        "checkpoint.resume=auto",
        "output_dir=grpo",
        f"tracking.experiment=kill-resume-{seed}",
        "tracking.log_checkpoint_files=false",
    ]
    return ["grpo", "--no-progress", *(a for s in sets for a in ("--set", s))]


def _attempt(args: list[str], tmp_path: Path, uri: str, number: int, kill: Kill | None) -> int:
    """One run of the command, killed as ``kill`` says; returns its exit code."""
    log = tmp_path / f"attempt-{number}.log"
    fault = {FAULT_ENV: kill.fault} if kill and kill.kind != "time" else {}
    process = start_cli(args, tmp_path, log, uri, env={**fault, **_QUIET})
    try:
        if kill and kill.kind == "time":  # from outside, once the model is loaded
            wait_until(process, lambda: _LOADED.search(log.read_text()) is not None, log)
            time.sleep(kill.delay_s)
            process.kill()
        return process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"attempt {number} hangs:\n{log.read_text()[-4000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)


def _entries(checkpoints: Path) -> set[str]:
    return {p.name for p in checkpoints.iterdir()}


@dataclass
class Trial:
    """What one trial saw: after the kill, and at the end of the attempt that succeeded."""

    seed: int
    kill: Kill
    root: Path
    killed_code: int
    killed_log: str
    complete_after_kill: list[int]
    entries_after_kill: set[str]
    run_after_kill: str | None
    final_code: int = -1
    final_log: str = ""

    @property
    def checkpoints(self) -> Path:
        return self.root / "grpo" / "checkpoints"


def run_trial(seed: int, root: Path, data: Path, model: Path, uri: str) -> Trial:
    """Kill the first attempt as :func:`plan` says, then re-run until an attempt exits 0."""
    kill, args = plan(seed), _args(data, model, seed)
    code = _attempt(args, root, uri, 1, kill)
    checkpoints = root / "grpo" / "checkpoints"
    trial = Trial(
        seed,
        kill,
        root,
        killed_code=code,
        killed_log=(root / "attempt-1.log").read_text(),
        complete_after_kill=[int(p.name[5:]) for p in list_checkpoints(checkpoints)],
        entries_after_kill=_entries(checkpoints) if checkpoints.is_dir() else set(),
        run_after_kill=recorded_run_id(checkpoints / RUN_ID_FILE),
    )
    for number in range(2, MAX_ATTEMPTS + 1):
        trial.final_code = _attempt(args, root, uri, number, None)
        trial.final_log = (root / f"attempt-{number}.log").read_text()
        if trial.final_code == 0:
            break
    return trial


@pytest.fixture(scope="module")
def trials(
    arithmetic_data,
    tiny_model_dir,
    mlflow_server,
    tmp_path_factory,
) -> dict[int, Trial]:
    """All trials, two at a time (each stage process uses one thread)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            seed: pool.submit(
                run_trial,
                seed,
                tmp_path_factory.mktemp(f"trial-{seed}"),
                arithmetic_data,
                tiny_model_dir,
                mlflow_server.uri,
            )
            for seed in range(TRIALS)
        }
        return {seed: future.result() for seed, future in futures.items()}


@pytest.mark.parametrize("seed", range(TRIALS), ids=lambda seed: f"{seed}-{plan(seed)}")
def test_killed_grpo_resumes_to_the_exact_end(
    seed,
    trials,
    mlflow_server,
    tokenizer,
) -> None:
    from llmrl.models import tiny_model

    trial, uri = trials[seed], mlflow_server.uri
    kill, checkpoints = trial.kill, trial.checkpoints
    if kill.kind == "time" and trial.killed_code == 0:
        pytest.fail(f"the kill after {kill.delay_s:.2f} s came too late:\n{trial.killed_log}")
    if kill.kind in RANK_PHASES:  # the trainer rank died; the stage stopped and named it
        call = RANK_PHASES[kill.kind]
        assert trial.killed_code == 1, trial.killed_log[-4000:]
        assert f"trainer rank 0 died during {call}" in trial.killed_log, trial.killed_log[-4000:]
    else:  # the stage process itself
        assert trial.killed_code == -9, trial.killed_log[-4000:]
        if kill.kind != "time":
            assert f"{KILL_MESSAGE} {kill.fault}" in trial.killed_log
    if kill.kind != "time":
        assert trial.complete_after_kill == list(range(EVERY, kill.resumes_from() + 1, EVERY))
        assert trial.run_after_kill is not None  # recorded before the first step
    if kill.kind == "checkpoint_write":  # the half-written checkpoint was really there
        partial = f".step-{kill.step:06d}.tmp-"
        assert any(name.startswith(partial) for name in trial.entries_after_kill)

    assert trial.final_code == 0, trial.final_log[-4000:]
    if kill.kind != "time":
        expected = kill.resumes_from()
        resumed = f"resuming GRPO from step {expected}" if expected else "starting from scratch"
        assert resumed in trial.final_log
    assert trial.final_log.strip().splitlines()[-1].startswith(f'{{"step": {STEPS}, ')

    # Exactly the configured end, nothing half-written left, and the final checkpoint loads.
    final = checkpoints / f"step-{STEPS:06d}"
    kept = {f"step-{s:06d}" for s in (STEPS - EVERY, STEPS)}
    assert _entries(checkpoints) == kept | {RUN_ID_FILE}
    state = trainer_state(final)
    assert state["step"] == STEPS
    assert [step for step, _ in state["extra"]["reward_history"]] == list(range(1, STEPS + 1))
    assert state["extra"]["collector"]["policy_version"] == STEPS
    loaded = load_checkpoint(final, model=tiny_model(tokenizer))
    assert loaded.step == STEPS

    # One MLflow run for the trial, finished, each step once.
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(f"kill-resume-{seed}")
    runs = client.search_runs([experiment.experiment_id])
    assert [run.info.run_id for run in runs] == [state["extra"]["mlflow_run_id"]]
    (run,) = runs
    if trial.run_after_kill is not None:
        assert run.info.run_id == trial.run_after_kill
    assert run.info.status == "FINISHED"
    for key in run.data.metrics:
        steps = metric_steps(uri, run.info.run_id, key)
        assert steps == sorted(set(steps)) and set(steps) <= set(range(1, STEPS + 1)), key
    for key in ALWAYS_LOGGED:
        assert metric_steps(uri, run.info.run_id, key) == list(range(1, STEPS + 1)), key
    assert metric_values(uri, run.info.run_id, "policy_version") == [1.0, 2.0, 3.0, 4.0]
