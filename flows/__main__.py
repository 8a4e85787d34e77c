"""``python -m flows``: the whole pipeline on this machine, then a before/after table.

Prefect runs the flow with its ephemeral API (no server to start): flow runs, task runs, logs
and artifacts land in the database under ``$PREFECT_HOME`` (default ``~/.prefect``). MLflow
writes to ``$MLFLOW_TRACKING_URI`` (default ``sqlite:///mlflow.db`` here). ``make run`` sets
``PREFECT_HOME=<repo>/.prefect`` and ``MLFLOW_TRACKING_URI=sqlite:///<repo>/mlflow.db``, so
afterwards, from the repository root::

    PREFECT_HOME=$PWD/.prefect .venv/bin/prefect server start   # http://127.0.0.1:4200
    .venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db  # http://127.0.0.1:5000

show the flow run (with its artifacts) and the MLflow parent run with one nested run per stage.

Examples::

    python -m flows                                  # configs/*.yaml
    python -m flows --steps-sft 5 --steps-grpo 2 --set eval.data.max_eval_rows=10
    python -m flows --skip grpo --set sft.optimizer.lr=1e-5
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_STAGE_LABELS = {"base": "base model", "sft": "after SFT", "grpo": "after GRPO"}


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m flows``."""
    parser = argparse.ArgumentParser(
        prog="python -m flows", description="Run the llmrl pipeline locally (Prefect + MLflow)."
    )
    parser.add_argument(
        "--config-dir",
        default="configs",
        help="folder with prepare.yaml, sft.yaml, grpo.yaml, eval.yaml (default: configs)",
    )
    parser.add_argument("--steps-sft", type=int, metavar="N", help="SFT optimizer steps")
    parser.add_argument("--steps-grpo", type=int, metavar="N", help="GRPO steps")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="STAGE.KEY=VALUE",
        help="override a stage's config value, e.g. --set sft.optimizer.lr=1e-5 "
        "(stages: prepare, sft, grpo, eval; repeatable)",
    )
    parser.add_argument(
        "--skip", action="append", default=[], metavar="STAGE", help="do not run this stage"
    )
    parser.add_argument("--work-dir", default="runs/pipeline", help="default: runs/pipeline")
    parser.add_argument(
        "--mlflow-tracking-uri",
        help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this folder",
    )
    parser.add_argument("--experiment", default="llmrl", help="MLflow experiment (llmrl)")
    return parser


def params_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~flows.pipeline.PipelineParams` the command line describes."""
    from flows.pipeline import PipelineParams

    overrides: dict[str, list[str]] = {}
    for item in args.overrides:
        stage, dot, rest = item.partition(".")
        if not dot or "=" not in rest:
            raise SystemExit(f"--set {item}: expected STAGE.KEY=VALUE, e.g. sft.steps=5")
        overrides.setdefault(stage, []).append(rest)
    if args.steps_sft is not None:
        overrides.setdefault("sft", []).append(f"steps={args.steps_sft}")
    if args.steps_grpo is not None:
        overrides.setdefault("grpo", []).append(f"steps={args.steps_grpo}")
    config_dir = Path(args.config_dir)
    return PipelineParams(
        prepare_config=str(config_dir / "prepare.yaml"),
        sft_config=str(config_dir / "sft.yaml"),
        grpo_config=str(config_dir / "grpo.yaml"),
        eval_config=str(config_dir / "eval.yaml"),
        overrides=overrides,
        skip=args.skip,
        work_dir=args.work_dir,
        mlflow_tracking_uri=args.mlflow_tracking_uri,
        experiment=args.experiment,
    )


def format_report(summary: Mapping[str, Any], flow_run_id: str | None) -> str:
    """The before/after table, the stage times, and where to look at the run."""
    lines = ["", "Held-out accuracy"]
    lines.append(f"  {'model':<12} {'accuracy':>9} {'problems':>9}")
    for row in summary["evaluation"]:
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.3f}"
        label = _STAGE_LABELS.get(row["model"], row["model"])
        lines.append(f"  {label:<12} {accuracy:>9} {row['num_problems'] or '-':>9}")
    lines += ["", "Wall time per stage", f"  {'stage':<10} {'status':<8} {'seconds':>8}"]
    total = 0.0
    for stage in summary["stages"]:
        seconds = stage["seconds"] if stage["status"] == "ran" else 0.0
        total += seconds
        lines.append(f"  {stage['name']:<10} {stage['status']:<8} {stage['seconds']:>8.1f}")
    lines.append(f"  {'total':<10} {'':<8} {total:>8.1f}  (stages run now)")
    lines += ["", *where_to_look(summary, flow_run_id)]
    return "\n".join(lines)


def where_to_look(summary: Mapping[str, Any], flow_run_id: str | None) -> list[str]:
    """How to open the MLflow and Prefect UIs on this run."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    mlflow = summary["mlflow"]
    lines = ["Look at the run:"]
    if mlflow["tracking_uri"].startswith(("http://", "https://")):
        lines.append(f"  MLflow:  {mlflow['parent_link']}")
    else:
        lines.append(f"  MLflow:  mlflow ui --backend-store-uri {mlflow['tracking_uri']}")
        lines.append(f"           then {mlflow['parent_link']}")
    api_url = settings.api.url
    run_path = f"/runs/flow-run/{flow_run_id}" if flow_run_id else ""
    if api_url:
        lines.append(f"  Prefect: {api_url.removesuffix('/api')}{run_path}")
    else:
        lines.append(f"  Prefect: PREFECT_HOME={settings.home} prefect server start")
        lines.append(f"           then http://127.0.0.1:4200{run_path}")
    lines.append(f"  Outputs: {summary['work_dir']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pipeline; 0 on success, 2 for a bad config, 1 for another failure."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # A busy 2-core machine can take longer than the default 20 s to start the ephemeral API.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    args = build_parser().parse_args(argv)
    params = params_from_args(args)

    from flows.launchers import StageConfigError
    from flows.pipeline import pipeline

    state = pipeline(params, return_state=True)
    flow_run_id = str(state.state_details.flow_run_id or "") or None
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        print(f"\npipeline failed: {error}", file=sys.stderr)
        return 2 if isinstance(error, StageConfigError) else 1
    print(format_report(state.result(), flow_run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
