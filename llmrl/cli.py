"""The ``llmrl`` command: the entry point a pod or a local process runs.

Subcommands so far:

- ``llmrl convert-model [SPEC]``: resolve a model spec and, for GGUF models, convert it once into
  the safetensors cache; prints the directory that ``load_model`` will read. Images run it at
  build time so pods start with the default model ready.
- ``llmrl prepare [--config YAML] [--set KEY=VALUE ...]``: prepare a task's train/eval dataset
  (see :mod:`llmrl.data.prepare`); prints the resolved config, then the dataset directory as the
  last line of stdout, so a pipeline can read it with ``tail -n 1``.
- ``llmrl sft|grpo|eval --config YAML [--set KEY=VALUE ...]``: the training stages
  (:mod:`llmrl.train`); each prints the resolved config first and a one-line JSON summary of its
  result (final checkpoint, metrics; ``tracking_spool``: spool files left for an MLflow server
  that stayed away) as the last line of stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from llmrl.config import ConfigError
from llmrl.models import DEFAULT_MODEL, MissingExtraError, ModelSpecError

if TYPE_CHECKING:
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import PreparedDataset

T = TypeVar("T")


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
    from llmrl.config import PrepareConfig, dump_config, load_config
    from llmrl.data.prepare import prepare_dataset

    config = load_config(PrepareConfig, args.config, args.overrides)
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
    return 0


def _track_prepare(config: PrepareConfig, prepared: PreparedDataset) -> None:
    """The prepare stage's MLflow run (when ``$MLFLOW_TRACKING_URI`` is set, as a pipeline
    sets it): the config as params, the rows per split, the prepared splits as its dataset
    inputs; in ``$MLFLOW_EXPERIMENT_NAME`` (default ``llmrl``), nested under
    ``$MLFLOW_PARENT_RUN_ID`` when set."""
    from llmrl.tracking import Tracker
    from llmrl.train.stage import log_prepared_data

    experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "llmrl"
    with Tracker("prepare", experiment=experiment, log_system_metrics=False) as tracker:
        tracker.log_params(config.model_dump(mode="json"))
        tracker.set_tags({"llmrl.dataset": str(prepared.path), "llmrl.reused": prepared.reused})
        rows = prepared.manifest["rows"]
        tracker.log_metrics({f"rows_{split}": n for split, n in rows.items()}, step=0)
        log_prepared_data(tracker, prepared.path, prepared.manifest)


def _run_stage(args: argparse.Namespace) -> int:
    from llmrl.config import dump_config, load_config
    from llmrl.train.stages import STAGES

    config_cls, run = STAGES[args.command]
    overrides = [*args.overrides, *(["progress=false"] if args.no_progress else [])]
    config = load_config(config_cls, args.config, overrides)
    print(dump_config(config), end="", flush=True)
    from llmrl.tracking import left_spools

    spools_before = len(left_spools())
    result = _run_configured(args, overrides, lambda: run(config))
    spools = left_spools()[spools_before:]  # the stage's own
    print(json.dumps(stage_summary(result, spools), default=str))
    return 0


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


def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser = argparse.ArgumentParser(prog="llmrl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"llmrl {version('llmrl')}")
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
    datasets = sys.modules.get("llmrl.data.datasets")
    if datasets is not None:
        errors += [datasets.DatasetError, datasets.MissingDatasetsError]
    return tuple(errors)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.handler(args)
    except _user_errors() as error:
        message = str(error)
        if "\n" in message:  # several problems (a config): one per line
            message = "".join(f"\n  {line}" for line in message.splitlines())
        else:
            message = f" {message}"
        print(f"llmrl {args.command}: error:{message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
