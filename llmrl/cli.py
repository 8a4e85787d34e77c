"""The ``llmrl`` command: the entry point a pod or a local process runs.

Subcommands so far:

- ``llmrl convert-model [SPEC]``: resolve a model spec and, for GGUF models, convert it once into
  the safetensors cache; prints the directory that ``load_model`` will read. Images run it at
  build time so pods start with the default model ready.
- ``llmrl prepare [--config YAML] [--set KEY=VALUE ...]``: prepare a task's train/eval dataset
  (see :mod:`llmrl.data.prepare`); prints the resolved config, then the dataset directory as the
  last line of stdout.
- ``llmrl sft|grpo|eval --config YAML [--set KEY=VALUE ...]``: the training stages
  (:mod:`llmrl.train`); each prints the resolved config first and a one-line JSON summary of its
  result (final checkpoint, metrics; ``tracking_spool``: spool files left for an MLflow server
  that stayed away) as the last line of stdout.

When ``$LLMRL_RESULT_FILE`` is set, a stage that succeeds also writes its result there
(``prepare``: ``{"path": <dataset directory>}``), atomically: launchers read that file
(:mod:`llmrl.stages.result_file`), never the output.

Every failure ends in one line on stderr, ``llmrl COMMAND: error: ...``, naming the field, file
or row; user text in it is cut to :data:`MAX_WORD_CHARS` and control characters are escaped
(``\x1b``), so nothing a config or data file holds reaches the terminal raw. Exit codes: 2 for
a mistake to fix in the config, data or model (and argparse's own errors), 1 for anything else,
130 for Ctrl-C; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import traceback
import unicodedata
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from llmrl.config import ConfigError
from llmrl.core.errors import MissingExtraError
from llmrl.models import DEFAULT_MODEL, ModelSpecError

if TYPE_CHECKING:
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import PreparedDataset

T = TypeVar("T")

MAX_WORD_CHARS = 200  # a longer run of text without spaces (a key, a value, a path) is cut
MAX_LINE_CHARS = 2000
OUTPUT_FIELDS = ("output_dir", "checkpoint.dir", "cache_dir")
"""The config fields naming folders a command writes: checked before it runs."""


def _convert_model(args: argparse.Namespace) -> int:
    from llmrl.models import ensure_converted, resolve_spec

    source = resolve_spec(args.spec)
    if source.kind == "gguf":
        print(ensure_converted(source.location))
    elif source.kind == "directory":
        print(source.location)
    else:
        print(f"{source.location} is a hub id; nothing to convert", file=sys.stderr)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from llmrl.config import PrepareConfig, dump_config
    from llmrl.data.prepare import prepare_dataset

    config = _load_config(PrepareConfig, args, args.overrides)
    _run_configured(args, args.overrides, lambda: _check_output_folders(config))
    print(dump_config(config), end="", flush=True)
    prepared = _run_configured(
        args, args.overrides, lambda: prepare_dataset(config, progress=not args.no_progress)
    )
    rows, skipped = prepared.manifest["rows"], prepared.manifest["skipped"]
    skipped_text = ", ".join(f"{reason}: {n}" for reason, n in skipped.items()) or "none"
    state = "reused" if prepared.reused else "prepared"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        _track_prepare(config, prepared)
    print(
        f"llmrl prepare: {state} {config.task}: {rows['train']} train, {rows['eval']} eval rows; "
        f"skipped: {skipped_text}",
        file=sys.stderr,
    )
    print(prepared.path)
    _write_result({"path": str(prepared.path)})
    return 0


def _track_prepare(config: PrepareConfig, prepared: PreparedDataset) -> None:
    """The prepare stage's MLflow run (when ``$MLFLOW_TRACKING_URI`` is set, as a pipeline
    sets it): the config as params, the rows per split, the prepared splits as its dataset
    inputs; in ``$MLFLOW_EXPERIMENT_NAME`` (default ``llmrl``), nested under
    ``$MLFLOW_PARENT_RUN_ID`` when set."""
    from llmrl.stages.common import log_prepared_data
    from llmrl.tracking import Tracker

    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "llmrl"
    with Tracker("prepare", experiment=experiment, log_system_metrics=False) as tracker:
        tracker.log_params(config.model_dump(mode="json"))
        tracker.set_tags({"llmrl.dataset": str(prepared.path), "llmrl.reused": prepared.reused})
        rows = prepared.manifest["rows"]
        tracker.log_metrics({f"rows_{split}": n for split, n in rows.items()}, step=0)
        log_prepared_data(tracker, prepared.path, prepared.manifest)


def _run_stage(args: argparse.Namespace) -> int:
    from llmrl.config import dump_config
    from llmrl.stages.registry import STAGES

    config_cls, run = STAGES[args.command]
    overrides = [*args.overrides, *(["progress=false"] if args.no_progress else [])]
    config = _load_config(config_cls, args, overrides)
    _run_configured(args, overrides, lambda: _check_output_folders(config))
    print(dump_config(config), end="", flush=True)
    from llmrl.tracking import left_spools

    spools_before = len(left_spools())
    result = _run_configured(args, overrides, lambda: run(config))
    spools = left_spools()[spools_before:]  # the stage's own
    summary = stage_summary(result, spools)
    print(json.dumps(summary, default=str))
    _write_result(summary)
    return 0


def _write_result(summary: dict) -> None:
    """Write ``summary`` to the result file ``$LLMRL_RESULT_FILE`` names, if it names one."""
    from llmrl.stages.result_file import result_path_from_env, write_result

    path = result_path_from_env()
    if path is not None:
        write_result(summary, path)


def stage_summary(result: object, spools: list[Path]) -> dict:
    """The stage's one-line JSON summary: its result, and ``tracking_spool``: the spool files
    holding what the MLflow server was not there to take (empty when everything was sent)."""
    return {**dataclasses.asdict(result), "tracking_spool": [str(p) for p in spools]}


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    """``--log-level``: a logging level name, any case."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown level {text!r}; use one of {', '.join(LOG_LEVELS)}"
        )
    return text.upper()


def _run_configured(args: argparse.Namespace, overrides: list[str], run: Callable[[], T]) -> T:
    """``run()``; a config problem it finds names where its field was set (file or ``--set``)."""
    try:
        return run()
    except ConfigError as error:
        raise error.located(args.config, overrides) from None


def _load_config(config_cls: type[T], args: argparse.Namespace, overrides: list[str]) -> T:
    """``load_config``; a config it cannot even parse (nested too deep, a number too long for
    Python) is a :class:`ConfigError` naming where it came from."""
    from llmrl.config import load_config

    try:
        return load_config(config_cls, args.config, overrides)
    except ConfigError:
        raise
    except (RecursionError, ValueError, TypeError, OverflowError, MemoryError) as error:
        origin = ", ".join([*([args.config] if args.config else []), *overrides]) or "defaults"
        raise ConfigError([f"{origin}: cannot be read ({_failure(error)[1]})"]) from error


def _check_output_folders(config: object) -> None:
    """Refuse, before anything runs, an output folder (:data:`OUTPUT_FIELDS`) that cannot be
    one: it, or a folder above it, is a file, or the nearest existing folder is read-only."""
    problems = []
    for dotted in OUTPUT_FIELDS:
        value = config
        for part in dotted.split("."):
            value = getattr(value, part, None)
        if value is not None:
            problem = _not_a_folder(Path(value))
            if problem:
                problems.append(f"{dotted}: {problem}")
    if problems:
        raise ConfigError(problems)


def _not_a_folder(path: Path) -> str | None:
    for existing in (path, *path.parents):
        if existing.is_dir():
            if not os.access(existing, os.W_OK | os.X_OK):
                return f"{path} cannot be written ({existing} is read-only)"
            return None
        if existing.exists() or existing.is_symlink():
            kind = "a file" if existing.is_file() else "not a folder"
            where = "" if existing == path else f" (in the way of {path})"
            return f"{existing} is {kind}{where}; name a folder"
    return None


def one_line(text: str) -> str:
    """``text`` fit for one terminal line: its lines joined with ``; ``, control characters
    escaped (``\x1b``, ``\u202e``), runs of over :data:`MAX_WORD_CHARS` non-space characters
    and the whole over :data:`MAX_LINE_CHARS` cut."""
    joined = "; ".join(line.strip() for line in text.split("\n") if line.strip())
    escaped = _escaped(joined)

    def cut(word: re.Match) -> str:
        return f"{word.group()[:MAX_WORD_CHARS]}...[{len(word.group()) - MAX_WORD_CHARS} more]"

    line = re.sub(rf"\S{{{MAX_WORD_CHARS + 1},}}", cut, escaped)
    if len(line) > MAX_LINE_CHARS:
        line = f"{line[:MAX_LINE_CHARS]}...[{len(line) - MAX_LINE_CHARS} more characters]"
    return line


def _escaped(text: str) -> str:
    """``text`` with its control (and other non-printing) characters as ``repr`` escapes."""
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch)[0] == "C" else ch for ch in text)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one escaped line (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def _add_debug_argument(parser: argparse.ArgumentParser, default: object) -> None:
    """``--debug``, before or after the command (a subcommand's default leaves it alone)."""
    parser.add_argument(
        "--debug", action="store_true", default=default, help="print a failure's traceback"
    )


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    _add_debug_argument(parser, default=argparse.SUPPRESS)
    parser.add_argument("--config", metavar="YAML", help="the stage config (YAML)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optimizer.lr=1e-5 (repeatable; YAML values)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``llmrl`` command."""
    parser = _Parser(prog="llmrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"llmrl {version('llmrl')}")
    _add_debug_argument(parser, default=False)
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=_log_level,
        help=f"logging level: {', '.join(LOG_LEVELS)} (default: INFO)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    convert = commands.add_parser(
        "convert-model", help="convert a GGUF model into llmrl's safetensors cache"
    )
    convert.add_argument(
        "spec", nargs="?", default=DEFAULT_MODEL, help=f"model spec (default: {DEFAULT_MODEL})"
    )
    _add_debug_argument(convert, default=argparse.SUPPRESS)
    convert.set_defaults(handler=_convert_model)
    prepare = commands.add_parser(
        "prepare", help="prepare a task's train/eval dataset; prints its directory last"
    )
    _add_config_arguments(prepare)
    prepare.set_defaults(handler=_prepare)
    for name, text in (
        ("sft", "supervised fine-tuning on a prepared dataset"),
        ("grpo", "GRPO reinforcement learning on a prepared dataset's task reward"),
        ("eval", "held-out accuracy and pass@k of a model or checkpoint"),
    ):
        stage = commands.add_parser(name, help=text)
        _add_config_arguments(stage)
        stage.set_defaults(handler=_run_stage)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix: reported in one message, exit code 2, no traceback."""
    errors: list[type[Exception]] = [ModelSpecError, MissingExtraError, ConfigError]
    # The data readers pull in torch via llmrl.data; their errors exist only once they are loaded.
    dataset_errors = sys.modules.get("llmrl.data.dataset_error")
    if dataset_errors is not None:
        errors += [dataset_errors.DatasetError, dataset_errors.MissingDatasetsError]
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code (see the module docstring)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.handler(args)
    except BaseException as error:
        if isinstance(error, SystemExit):
            raise
        code, message = _failure(error)
        if args.debug:
            for line in traceback.format_exc().splitlines():
                print(_escaped(line), file=sys.stderr)
        elif code == 1:
            message += " (run with --debug for the traceback)"
        print(f"llmrl {args.command}: error: {one_line(message)}", file=sys.stderr)
        return code


def _failure(error: BaseException) -> tuple[int, str]:
    """The exit code and message of a failed command."""
    if isinstance(error, _user_errors()):
        return 2, str(error)
    if isinstance(error, KeyboardInterrupt):
        return 130, "interrupted"
    if isinstance(error, OSError) and error.filename is not None:
        return 1, f"{error.strerror or type(error).__name__}: {error.filename}"
    text = str(error)
    return 1, f"{type(error).__name__}: {text}" if text else type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
