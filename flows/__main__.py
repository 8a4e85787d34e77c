"""``python -m flows``: the whole pipeline on this machine, then a before/after table;
``python -m flows compare``: the reward and accuracy curves of several runs in one picture.

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
    python -m flows --py-module ../my_project/my_pkg  # your task's package, for every stage
    python -m flows compare llmrl                    # the newest pipeline runs of `llmrl`
    python -m flows compare RUN_ID RUN_ID --out runs/compare/lr
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flows.stages import COMMANDS

COMPARE = "compare"
"""The first argument that selects the comparison command instead of a pipeline run."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m flows``."""
    parser = argparse.ArgumentParser(
        prog="python -m flows",
        description="Run the llmrl pipeline locally (Prefect + MLflow).",
        epilog="`python -m flows compare --help`: compare the curves of several runs.",
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
    parser.add_argument("--mlflow-ui-url", help="MLflow UI address for links (see README)")
    parser.add_argument(
        "--py-module",
        dest="py_modules",
        action="append",
        default=[],
        metavar="FOLDER",
        help="a folder of your own Python package (tasks, reward functions), importable in "
        "every stage and shipped to the Ray workers (runtime_env py_modules; repeatable)",
    )
    parser.add_argument(
        "--runtime-env",
        metavar="FILE_OR_JSON",
        help="Ray's runtime_env for every stage (py_modules, working_dir, env_vars): a YAML "
        "or JSON file, or an inline JSON object",
    )
    return parser


def build_compare_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m flows compare``."""
    parser = argparse.ArgumentParser(
        prog="python -m flows compare",
        description="Draw the GRPO reward and held-out accuracy curves of several runs into one "
        "picture, log it to MLflow (a new comparison run) and to Prefect (artifacts).",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_ID_OR_EXPERIMENT",
        help="pipeline or GRPO run ids, or experiment names (their newest pipeline runs)",
    )
    parser.add_argument(
        "--mlflow-tracking-uri",
        help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this folder",
    )
    parser.add_argument("--mlflow-ui-url", help="MLflow UI address for links")
    parser.add_argument("--out", help="folder of the picture (default: runs/compare/<time>)")
    parser.add_argument(
        "--max-runs", type=int, default=10, help="runs per experiment (newest; default 10)"
    )
    return parser


def params_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~flows.pipeline.PipelineParams` the command line describes."""
    from flows.params import PipelineParams

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
    runtime_env = read_runtime_env(args.runtime_env)
    runtime_env["py_modules"] = [*runtime_env.get("py_modules", []), *args.py_modules]
    return PipelineParams(
        **{f"{command}_config": str(config_dir / f"{command}.yaml") for command in COMMANDS},
        overrides=overrides,
        skip=args.skip,
        work_dir=args.work_dir,
        mlflow_tracking_uri=args.mlflow_tracking_uri,
        mlflow_ui_url=args.mlflow_ui_url,
        experiment=args.experiment,
        runtime_env={key: value for key, value in runtime_env.items() if value},
    )


def read_runtime_env(text: str | None) -> dict[str, Any]:
    """The ``--runtime-env`` mapping: an inline JSON object, or a YAML/JSON file's."""
    import yaml

    if not text:
        return {}
    try:
        inline = text.lstrip().startswith("{")
        data = yaml.safe_load(text if inline else Path(text).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        message = f"--runtime-env {text}: not a readable YAML/JSON mapping: {error}"
        raise SystemExit(message) from None
    if not isinstance(data, dict):
        raise SystemExit(f"--runtime-env {text}: expected a mapping (a file or a JSON object)")
    return data


def format_report(summary: Mapping[str, Any], flow_run_id: str | None) -> str:
    """The held-out table (gains with their paired 95% intervals, accuracy per problem kind),
    the stage times, and where to look at the run."""
    from flows.summary import evaluation_lines

    lines = ["", *evaluation_lines(summary)]
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

    from flows.pipeline import flow_run_url

    settings = get_current_settings()
    mlflow = summary["mlflow"]
    lines = ["Look at the run:"]
    if mlflow["tracking_uri"].startswith(("http://", "https://")):
        lines.append(f"  MLflow:  {mlflow['runs_link']}")
    else:
        lines.append(f"  MLflow:  mlflow ui --backend-store-uri {mlflow['tracking_uri']}")
        lines.append(f"           then {mlflow['runs_link']}")
    lines.append(f"           pipeline run: {mlflow['parent_link']}")
    url = flow_run_url(flow_run_id) or "the flow run"
    if settings.ui_url:
        lines.append(f"  Prefect: {url}")
    else:
        lines.append(f"  Prefect: PREFECT_HOME={settings.home} prefect server start")
        lines.append(f"           then {url}")
    lines.append(f"  Outputs: {summary['work_dir']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pipeline (or ``compare``); 0 on success, 2 for a bad config, 1 for another
    failure."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # A busy 2-core machine can take longer than the default 20 s to start the ephemeral API.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [COMPARE]:
        return compare_main(argv[1:])
    args = build_parser().parse_args(argv)
    from pydantic import ValidationError

    try:
        params = params_from_args(args)
    except ValidationError as error:
        print(f"bad pipeline parameters: {error}", file=sys.stderr)
        return 2

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


def compare_main(argv: Sequence[str]) -> int:
    """``python -m flows compare``: 0 on success, 2 when the runs cannot be compared."""
    args = build_compare_parser().parse_args(argv)
    from flows.compare import compare
    from flows.params import PipelineParams
    from llmrl.tracking.comparison import CompareError

    uri = PipelineParams(mlflow_tracking_uri=args.mlflow_tracking_uri).tracking_uri()
    state = compare(args.runs, uri, args.out, args.mlflow_ui_url, args.max_runs, return_state=True)
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        print(f"compare failed: {error}", file=sys.stderr)
        return 2 if isinstance(error, CompareError) else 1
    result = state.result()
    print(f"picture: {result['picture']}\nMLflow:  {result['mlflow_link']}")
    for run in result["runs"]:
        missing = f" (missing: {', '.join(run['missing'])})" if run["missing"] else ""
        print(f"  {run['label']}: {run['reward_steps']} GRPO steps{missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
