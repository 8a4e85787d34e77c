"""The pipeline's summary: stage times, evaluation before/after, where to look in MLflow and
Prefect; and its markdown rendering for the flow run's artifact."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.stages import RUN_ORDER, SPECS, TITLES
from llmrl.tracking.pipeline_run import accuracy_key

if TYPE_CHECKING:
    from flows.pipeline import PipelineParams
    from llmrl.tracking import PipelineRun


def build_summary(
    params: PipelineParams, tracking: PipelineRun, records: Mapping[str, dict], run_name: str
) -> dict[str, Any]:
    """The pipeline's result: stages, evaluation rows, parent-run metrics, where to look."""
    stages = [
        {
            "name": name,
            "status": record.get("status", "ran"),
            "seconds": round(float(record.get("seconds") or 0.0), 1),
            "summary": record.get("summary", {}),
            "mlflow_run_id": record.get("mlflow_run_id"),
            "mlflow_link": tracking.link(record.get("mlflow_run_id")),
        }
        for name in RUN_ORDER
        if (record := records.get(name))
    ]
    evaluation = []
    for name in RUN_ORDER:
        model, record = SPECS[name].evaluates, records.get(name)
        if not model or not record:
            continue
        result = record["summary"]
        row = {
            "model": model,
            "accuracy": result.get("accuracy"),
            "num_problems": result.get("num_problems"),
        }
        row.update({f"pass@{k}": v for k, v in (result.get("pass_at") or {}).items()})
        row["mlflow_run_id"] = record.get("mlflow_run_id")
        evaluation.append(row)
    metrics = {accuracy_key(row["model"]): row["accuracy"] for row in evaluation}
    metrics.update({f"seconds_{s['name']}": s["seconds"] for s in stages if s["status"] == "ran"})
    return {
        "flow_run": run_name,
        "work_dir": str(Path(params.work_dir).resolve()),
        "mlflow": {
            "tracking_uri": tracking.uri,
            "experiment": tracking.experiment,
            "experiment_id": tracking.experiment_id,
            "parent_run_id": tracking.run_id,
            "parent_link": tracking.link(tracking.run_id),
        },
        "stages": stages,
        "evaluation": evaluation,
        "metrics": {k: float(v) for k, v in metrics.items() if v is not None},
    }


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The summary artifact's markdown."""
    mlflow = summary["mlflow"]
    lines = [
        f"# llmrl pipeline `{summary['flow_run']}`",
        "",
        f"MLflow parent run [{mlflow['parent_run_id']}]({mlflow['parent_link']}) in experiment "
        f"`{mlflow['experiment']}` (`{mlflow['tracking_uri']}`).",
        f"Work dir: `{summary['work_dir']}`.",
        "",
        "## Held-out accuracy",
        "",
        "| model | accuracy | problems |",
        "| --- | --- | --- |",
    ]
    for row in summary["evaluation"]:
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.3f}"
        lines.append(f"| {TITLES[row['model']]} | {accuracy} | {row['num_problems']} |")
    lines += ["", "## Stages", "", "| stage | status | seconds | result | MLflow run |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for stage in summary["stages"]:
        link = (
            f"[{stage['mlflow_run_id'][:8]}]({stage['mlflow_link']})"
            if stage["mlflow_link"]
            else "-"
        )
        status = {"skipped": "skipped (finished in a previous run)"}.get(
            stage["status"], stage["status"]
        )
        lines.append(
            f"| {stage['name']} | {status} | {stage['seconds']:.1f} | "
            f"{_describe(stage['summary'])} | {link} |"
        )
    return "\n".join(lines) + "\n"


def _describe(result: Mapping[str, Any]) -> str:
    """A stage's summary in a table cell: its numbers, then its output path."""
    numbers = [
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in result.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "seconds"
    ]
    path = result.get("final_checkpoint") or result.get("path")
    return ", ".join([*numbers, *([f"`{path}`"] if path else [])]) or "-"
