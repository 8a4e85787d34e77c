"""Run a stage as a local subprocess: ``python -m llmrl.cli <stage> --config ... --set ...``.

The child writes its result to a file in a private temporary folder (``$LLMRL_RESULT_FILE``,
see :mod:`flows.launchers.base`): exit code 0 and that file are the stage's result; its output is
only shown.

The child's stdout and stderr lines go to the Prefect task's logger as they come, so the
Prefect UI shows a stage's progress live. The child runs in its own process group: when the
task is cancelled (Ctrl-C, Prefect cancellation, any exception reaching the launcher) the
whole group is terminated, then killed if it does not exit within ``terminate_timeout_s``.
When this process dies without a chance to do that (SIGKILL, out of memory), Linux kills the
child too (``PR_SET_PDEATHSIG``), so a re-run never finds the killed run's stage still writing
the checkpoints it resumes from.

The user's code (the pipeline's ``runtime_env``, :mod:`flows.launchers.runtime_env`): its
``py_modules`` folders and ``working_dir`` go on the child's ``PYTHONPATH``, its ``env_vars``
into the child's environment (never over llmrl's own), and the whole runtime_env into
``$LLMRL_RAY_RUNTIME_ENV``, which the Ray a stage starts is given.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from flows.launchers.base import (
    CONFIG_ERROR_EXIT_CODE,
    StageConfigError,
    StageFailedError,
    StageResult,
    TransientStageError,
    read_stage_result,
    result_file_env,
    stage_arguments,
    stage_logger,
    tail_text,
)
from flows.launchers.runtime_env import RayRuntimeEnv, job_code, local_runtime_env, merged_env
from llmrl.core.ray_helpers import RUNTIME_ENV_VARIABLE

TRANSIENT_PATTERNS = re.compile(
    r"requests\.exceptions\.ConnectionError|MaxRetryError|Connection refused|"
    r"Temporary failure in name resolution|Name or service not known|"
    r"API request to .* failed with exception"
)
"""stderr text of a failure caused by an unreachable service (MLflow server), not the stage."""


class LocalLauncher:
    """Runs stages as subprocesses of this Python interpreter.

    ``command`` replaces ``[python, "-m", "llmrl.cli"]`` (tests use a ``python -c`` script);
    ``cwd`` is the child's working directory (default: this process's); ``runtime_env`` the
    user's code and variables (see the module docstring; relative paths are from ``cwd``).

    Raises:
        StageConfigError: ``runtime_env`` asks for what a local run cannot give (``pip``, a
            wheel, a remote URI) or names a folder that does not exist.

    Example::

        result = LocalLauncher().run(
            "prepare", "configs/prepare.yaml", ["generate.train_size=50"], env={}
        )
        print(result.summary["path"], result.seconds)
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        *,
        cwd: str | Path | None = None,
        tail_lines: int = 200,
        terminate_timeout_s: float = 10.0,
        runtime_env: RayRuntimeEnv | None = None,
    ) -> None:
        self.command = list(command) if command else [sys.executable, "-m", "llmrl.cli"]
        self.cwd = cwd
        self.tail_lines = tail_lines
        self.terminate_timeout_s = terminate_timeout_s
        try:
            self.runtime_env = local_runtime_env(runtime_env or RayRuntimeEnv(), cwd)
        except ValueError as error:
            raise StageConfigError("local", str(error)) from None

    def run(
        self,
        stage: str,
        config_path: str | Path | None,
        overrides: Sequence[str],
        env: Mapping[str, str],
        *,
        name: str | None = None,
    ) -> StageResult:
        """Run the stage to completion; see :meth:`flows.launchers.base.Launcher.run`."""
        name = name or stage
        argv = [*self.command, *stage_arguments(stage, config_path, overrides)]
        with tempfile.TemporaryDirectory(prefix="llmrl-result-") as folder:
            result_file = Path(folder) / "result.json"
            own = {**env, **result_file_env(result_file)}
            try:
                child_env = {**os.environ, **self.user_env(own)}
            except ValueError as error:
                raise StageConfigError(name, str(error)) from None
            return self._run(name, argv, {**child_env, "PYTHONUNBUFFERED": "1"}, result_file)

    def user_env(self, own: Mapping[str, str]) -> dict[str, str]:
        """llmrl's variables ``own`` with the runtime_env's: its ``env_vars``, its folders in
        front of ``PYTHONPATH``, and itself in ``$LLMRL_RAY_RUNTIME_ENV``.

        Raises:
            ValueError: an ``env_vars`` variable is one of ``own`` (named).
        """
        runtime_env = self.runtime_env
        if runtime_env.is_empty:
            return dict(own)
        merged = merged_env(runtime_env.env_vars, own)
        _, paths = job_code(runtime_env)
        inherited = os.environ.get("PYTHONPATH")
        if paths:
            merged["PYTHONPATH"] = os.pathsep.join([*paths, *([inherited] if inherited else [])])
        merged[RUNTIME_ENV_VARIABLE] = json.dumps(runtime_env.to_ray(), sort_keys=True)
        return merged

    def _run(
        self, name: str, argv: list[str], child_env: dict[str, str], result_file: Path
    ) -> StageResult:
        """Run ``argv`` to completion, streaming its output; its result from ``result_file``."""
        logger = stage_logger()
        logger.info("%s: running %s", name, " ".join(argv))
        stdout: deque[str] = deque(maxlen=self.tail_lines)
        stderr: deque[str] = deque(maxlen=self.tail_lines)
        start = time.monotonic()
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            env=child_env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group: cancellation ends all of it
            preexec_fn=die_with_parent(),  # this thread waits for the child, see the hook
        )
        readers = [
            _start_reader(process.stdout, stdout, logger, name),
            _start_reader(process.stderr, stderr, logger, name),
        ]
        try:
            code = _wait(process)
            for reader in readers:
                reader.join()
        except BaseException:
            logger.warning("%s: cancelled; terminating its process group", name)
            self._terminate(process)
            raise
        seconds = time.monotonic() - start
        if code != 0:
            raise _failure(name, code, list(stderr))
        summary = read_stage_result(name, result_file)
        logger.info("%s: finished in %.1f s", name, seconds)
        return StageResult(summary=summary, stdout_tail=tail_text(stdout), seconds=seconds)

    def _terminate(self, process: subprocess.Popen[str]) -> None:
        """SIGTERM the child's process group, then SIGKILL it if it is still there."""
        for sig, timeout in ((signal.SIGTERM, self.terminate_timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=timeout)
                return
            except subprocess.TimeoutExpired:
                continue


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the child gets SIGKILL when this process dies, or None
    where the kernel has no such thing (not Linux).

    Linux's ``PR_SET_PDEATHSIG`` fires when the *thread* that started the child ends, so the
    thread must wait for the child (:meth:`LocalLauncher.run` does). ``prctl`` is looked up
    here, before the fork: the child only calls it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, kill = os.getpid(), int(signal.SIGKILL)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, kill)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), kill)

    return arm


def _wait(process: subprocess.Popen[str]) -> int:
    """Wait for the child in short slices, so a signal to this process is handled promptly."""
    while True:
        try:
            return process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue


def _start_reader(
    pipe: IO[str] | None, tail: deque[str], logger: Any, name: str
) -> threading.Thread:
    """A thread that logs each line of ``pipe`` and keeps the last ones in ``tail``."""

    def read() -> None:
        assert pipe is not None
        with pipe:
            for raw in pipe:
                line = raw.rstrip("\r\n")
                tail.append(line)
                if line.strip():
                    logger.info("[%s] %s", name, line)

    thread = threading.Thread(target=read, name=f"{name}-output", daemon=True)
    thread.start()
    return thread


def _failure(name: str, code: int, stderr: list[str]) -> Exception:
    """The error for a non-zero exit: config error, transient failure, or plain failure."""
    tail = tail_text(stderr) or "(nothing on stderr)"
    if code == CONFIG_ERROR_EXIT_CODE:
        return StageConfigError(name, f"bad config or data (exit code 2):\n{tail}")
    if code < 0:
        try:
            what: object = signal.Signals(-code).name
        except ValueError:
            what = -code
        hint = " (out of memory?)" if code == -signal.SIGKILL else ""
        return StageFailedError(name, f"killed by signal {what}{hint}:\n{tail}")
    if TRANSIENT_PATTERNS.search(tail):
        return TransientStageError(name, f"exit code {code}, a service was unreachable:\n{tail}")
    return StageFailedError(name, f"failed with exit code {code}:\n{tail}")
