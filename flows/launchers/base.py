"""What every launcher shares: the :class:`Launcher` protocol, :class:`StageResult`, the stage
errors a flow reacts to, a stage's command line, and how its result comes back.

A stage is the ``llmrl`` command (``llmrl prepare|sft|grpo|eval --config YAML --set K=V``). A
launcher runs that command somewhere (a local subprocess, a Kubernetes pod) with
``$LLMRL_RESULT_FILE`` naming a file the launcher can read (:func:`result_file_env`); the
command writes its result there when it succeeds (:mod:`llmrl.stages.result_file`): the
prepared dataset's directory for ``prepare`` (``{"path": ...}``), its JSON summary for the
others. Whether the stage succeeded is the launcher's to tell (an exit code, a Job's or a
RayJob's status), and its output is only shown, never parsed. A launcher hands back the result
(:func:`read_stage_result`), or raises one of three errors whose class tells the flow whether a
retry can help:

- :class:`StageConfigError`: exit code 2, the config or the data is wrong. Never retried.
- :class:`TransientStageError`: the launcher's API or the tracking server did not answer.
  Retried with backoff.
- :class:`StageFailedError`: anything else (a crash, an OOM kill, an image that cannot be
  pulled, a stage that succeeded without writing its result). Not retried: the same inputs fail
  the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from flows.stages import COMMANDS
from llmrl.stages.result_file import RESULT_FILE_ENV, ResultFileError, read_result

STAGE_COMMANDS: tuple[str, ...] = COMMANDS
"""The ``llmrl`` subcommands a launcher runs (from the stage table, :mod:`flows.stages`)."""

CONFIG_ERROR_EXIT_CODE = 2
"""The exit code of ``llmrl`` for a user error (bad config or data); the message is on stderr."""


@dataclass(frozen=True)
class StageResult:
    """What a finished stage reported.

    ``summary`` is the result the stage wrote (its result file): the JSON summary of ``sft``/
    ``grpo``/``eval``, or ``{"path": <dataset directory>}`` for ``prepare``. ``stdout_tail`` holds
    the last lines of its output, ``seconds`` the wall time the launcher measured.
    """

    summary: dict[str, Any]
    stdout_tail: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


class StageError(RuntimeError):
    """A stage that did not produce a result; ``stage`` names it, the message says why."""

    def __init__(self, stage: str, message: str) -> None:
        self.stage = stage
        self.message = message
        super().__init__(f"{stage}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stage, self.message))


class StageConfigError(StageError):
    """The stage rejected its config or data (exit code 2): fix the input, retrying cannot help."""


class StageFailedError(StageError):
    """The stage ran and failed (crash, OOM kill, unpullable image, ...); not retried."""


class TransientStageError(StageError):
    """A failure outside the stage's own inputs (launcher API, tracking server): retry it."""


@runtime_checkable
class Launcher(Protocol):
    """Runs one stage command to completion.

    Example::

        launcher = LocalLauncher()
        result = launcher.run("prepare", "configs/prepare.yaml", ["generate.train_size=50"], {})
        result.summary["path"]  # the prepared dataset directory
    """

    def run(
        self,
        stage: str,
        config_path: str | Path | None,
        overrides: Sequence[str],
        env: Mapping[str, str],
        *,
        name: str | None = None,
    ) -> StageResult:
        """Run ``llmrl <stage> --config <config_path> --set <override> ...`` with ``env`` added
        to its environment; ``name`` (default: ``stage``) labels its logs and resources.

        Raises:
            StageConfigError: exit code 2 (bad config or data).
            TransientStageError: the infrastructure failed; a retry may succeed.
            StageFailedError: any other failure.
        """
        ...


def stage_arguments(
    stage: str, config_path: str | Path | None, overrides: Sequence[str]
) -> list[str]:
    """The ``llmrl`` arguments of a stage: ``<stage> [--config PATH] --no-progress --set ...``."""
    if stage not in STAGE_COMMANDS:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGE_COMMANDS)}")
    arguments = [stage]
    if config_path is not None:
        arguments += ["--config", str(config_path)]
    arguments.append("--no-progress")
    for override in overrides:
        arguments += ["--set", override]
    return arguments


def result_file_env(path: str | Path) -> dict[str, str]:
    """The environment entry that tells a stage where to write its result."""
    return {RESULT_FILE_ENV: str(path)}


def read_stage_result(label: str, path: str | Path) -> dict[str, Any]:
    """The result a succeeded stage wrote to ``path``.

    Raises:
        StageFailedError: the file is missing or not one JSON object (the stage succeeded
            without reporting a result); the message names the file.
    """
    try:
        return read_result(path)
    except ResultFileError as error:
        raise StageFailedError(
            label, f"succeeded without a usable result: {error} (set by ${RESULT_FILE_ENV})"
        ) from None


def tail_text(lines: Iterable[str], count: int = 20) -> str:
    """The last ``count`` lines, joined."""
    return "\n".join(list(lines)[-count:])


def stage_logger(name: str = "flows.launchers") -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger inside a flow or task run (lines show in the UI), else a plain
    :mod:`logging` logger, so launchers also work outside Prefect (tests, scripts)."""
    try:
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError
    except ImportError:  # pragma: no cover - prefect is a dependency of flows/
        return logging.getLogger(name)
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(name)
