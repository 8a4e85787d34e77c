"""LocalLauncher against real `llmrl` commands and small stand-in scripts."""

from __future__ import annotations

import logging
import os
import re
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flows.launchers import (
    LocalLauncher,
    StageConfigError,
    StageFailedError,
    StageResult,
    TransientStageError,
    stage_arguments,
)
from llmrl.stages.result_file import read_result, write_result
from tests.support.signals import send_ctrl_c


def _script(body: str) -> list[str]:
    """A launcher command that runs ``body`` instead of llmrl (it gets the stage arguments)."""
    return [sys.executable, "-c", textwrap.dedent(body)]


def test_stage_arguments_put_overrides_after_the_config() -> None:
    assert stage_arguments("sft", "configs/sft.yaml", ["steps=2", "optimizer.lr=1e-5"]) == [
        "sft",
        "--config",
        "configs/sft.yaml",
        "--no-progress",
        "--set",
        "steps=2",
        "--set",
        "optimizer.lr=1e-5",
    ]
    with pytest.raises(ValueError, match="unknown stage 'train'"):
        stage_arguments("train", None, [])


def test_a_result_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "results" / "eval.json"
    write_result({"accuracy": 0.5, "checkpoint": tmp_path}, path)
    assert read_result(path) == {"accuracy": 0.5, "checkpoint": str(tmp_path)}
    assert [p.name for p in path.parent.iterdir()] == ["eval.json"]  # no temporary left
    write_result({"accuracy": 0.75}, path)  # replaced, never appended to
    assert read_result(path) == {"accuracy": 0.75}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_prepare_runs_and_returns_the_dataset_directory(tmp_path: Path) -> None:
    # Outside a Prefect run the launcher logs to `flows.launchers`.
    handler, logger = _Lines(), logging.getLogger("flows.launchers")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        result = _prepare(tmp_path)
    finally:
        logger.removeHandler(handler)
    assert isinstance(result, StageResult)
    dataset = Path(result.summary["path"])
    assert dataset.parent == tmp_path
    assert (dataset / "manifest.json").is_file()
    assert result.seconds > 0
    assert str(dataset) in result.stdout_tail  # printed too, for people
    # Both streams reached the logger as the child wrote them.
    logged = "\n".join(handler.lines)
    assert "[prepare] task: arithmetic" in logged  # stdout: the resolved config
    assert "12 train, 4 eval rows" in logged  # stderr: the stage's report


def _prepare(tmp_path: Path) -> StageResult:
    return LocalLauncher().run(
        "prepare",
        "configs/prepare.yaml",
        ["generate.train_size=12", "generate.eval_size=4", f"output_dir={tmp_path}"],
        env={},
    )


def test_a_bad_config_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(StageConfigError) as caught:
        LocalLauncher().run(
            "prepare",
            "configs/prepare.yaml",
            ["generate.train_size=0", f"output_dir={tmp_path}"],
            env={},
        )
    message = str(caught.value)
    assert caught.value.stage == "prepare"
    assert "exit code 2" in message
    assert "generate.train_size" in message
    assert "greater than or equal to 1" in message


def test_a_crashing_stage_is_a_stage_failure_with_its_stderr() -> None:
    launcher = LocalLauncher(
        _script(
            """
            import sys
            print("seed: 0")
            print("Traceback: RuntimeError: boom", file=sys.stderr)
            sys.exit(3)
            """
        )
    )
    with pytest.raises(StageFailedError, match="exit code 3") as caught:
        launcher.run("sft", None, [], env={}, name="sft")
    assert "RuntimeError: boom" in str(caught.value)
    assert not isinstance(caught.value, StageConfigError)


def test_an_unreachable_service_is_transient() -> None:
    launcher = LocalLauncher(
        _script(
            """
            import sys
            print("requests.exceptions.ConnectionError: Connection refused", file=sys.stderr)
            sys.exit(1)
            """
        )
    )
    with pytest.raises(TransientStageError, match="unreachable"):
        launcher.run("eval", None, [], env={})


def test_env_and_arguments_reach_the_child() -> None:
    launcher = LocalLauncher(
        _script(
            """
            import json, os, sys
            summary = {"argv": sys.argv[1:], "parent": os.environ["MLFLOW_PARENT_RUN_ID"]}
            with open(os.environ["LLMRL_RESULT_FILE"], "w") as out:
                json.dump(summary, out)
            """
        )
    )
    result = launcher.run("eval", "c.yaml", ["label=base"], env={"MLFLOW_PARENT_RUN_ID": "abc"})
    assert result.summary == {
        "argv": ["eval", "--config", "c.yaml", "--no-progress", "--set", "label=base"],
        "parent": "abc",
    }


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("print('{\"step\": 2}')", "does not exist"),  # a summary line is not a result
        ("open(os.environ['LLMRL_RESULT_FILE'], 'w').write('{\"step\": 2')", "is not JSON"),
        ("open(os.environ['LLMRL_RESULT_FILE'], 'w').write('[2]')", "holds a list"),
    ],
)
def test_success_without_a_usable_result_file_is_a_failure_naming_it(
    body: str, problem: str
) -> None:
    launcher = LocalLauncher(_script(f"import os\nprint('seed: 0')\n{body}"))
    with pytest.raises(StageFailedError) as caught:
        launcher.run("grpo", None, [], env={"LLMRL_RESULT_FILE": "/not/this/one.json"})
    message = str(caught.value)
    assert re.search(rf"result file /\S*llmrl-result-\S*/result\.json {problem}", message)
    assert "LLMRL_RESULT_FILE" in message


def test_cancellation_terminates_the_whole_process_group(tmp_path: Path, default_sigint) -> None:
    pids = tmp_path / "pids"
    launcher = LocalLauncher(
        _script(
            f"""
            import os, subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
            print("started", flush=True)
            time.sleep(60)
            """
        ),
        terminate_timeout_s=5,
    )

    def interrupt_when_started() -> None:
        deadline = time.monotonic() + 30
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        send_ctrl_c()  # what Ctrl-C (or Prefect's cancellation signal) does

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        launcher.run("sft", None, [], env={})
    assert time.monotonic() - start < 30
    for pid in map(int, pids.read_text().split()):
        assert not _alive(pid), f"process {pid} survived the cancellation"


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        try:  # reap it if it is our zombie child
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return True
