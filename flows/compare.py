"""``python -m flows compare``: the reward and accuracy curves of several runs in one picture.

A small Prefect flow, ``llmrl-compare``, around :mod:`llmrl.tracking.comparison`: one task draws
the GRPO ``reward_mean`` per step and the held-out accuracies (base, after SFT, after GRPO) of the
runs given (pipeline or GRPO run ids, or experiment names) into ``<out_dir>/comparison.png`` and
logs it on a new MLflow run ``compare-<n>-runs`` in the first run's experiment; the flow run gets
an image artifact (the picture, as the MLflow server serves it) and a markdown artifact (the
picture, a table of what each run contributed, a link to the comparison run).

Example::

    python -m flows compare llmrl                       # the newest pipeline runs of `llmrl`
    python -m flows compare 3f2a... 9be1... --out runs/compare/lr
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.stages import EVALUATED, TITLES
from llmrl.tracking.comparison import PICTURE, Comparison, compare_runs
from llmrl.tracking.links import artifact_url, run_url, ui_base


@task(name="compare-runs", cache_policy=NO_CACHE)
def draw_and_log(
    tracking_uri: str, specs: Sequence[str], out_dir: str, max_runs: int
) -> Comparison:
    """Draw the runs into a picture and log it on a comparison run."""
    return compare_runs(tracking_uri, specs, out_dir, models=EVALUATED, max_runs=max_runs)


@flow(name="llmrl-compare", flow_run_name="compare-{specs[0]}", log_prints=True)
def compare(
    specs: list[str],
    tracking_uri: str,
    out_dir: str | None = None,
    mlflow_ui_url: str | None = None,
    max_runs: int = 10,
) -> dict[str, Any]:
    """Compare the runs ``specs`` names; return where the picture is and what it shows."""
    out_dir = out_dir or f"runs/compare/{datetime.now():%Y%m%d-%H%M%S}"
    comparison = draw_and_log(tracking_uri, specs, out_dir, max_runs)
    base = ui_base(tracking_uri, mlflow_ui_url)
    image = artifact_url(base, comparison.run_id, PICTURE)
    link = run_url(base, comparison.experiment_id, comparison.run_id)
    create_image_artifact(image, key="llmrl-comparison", description="reward and accuracy")
    create_markdown_artifact(
        render_markdown(comparison, image, link),
        key="llmrl-comparison-summary",
        description="what each compared run contributed",
    )
    return {
        "picture": str(comparison.picture),
        "mlflow_run_id": comparison.run_id,
        "mlflow_link": link,
        "runs": [
            {
                "run_id": r.run_id,
                "label": r.label,
                "reward_steps": len(r.reward),
                "accuracy": r.accuracy,
                "missing": r.missing,
            }
            for r in comparison.runs
        ],
    }


def render_markdown(comparison: Comparison, image: str, link: str) -> str:
    """The markdown artifact: the picture, one row per run, the comparison run."""
    lines = [
        f"# Comparison of {len(comparison.runs)} runs",
        "",
        f"![reward and accuracy]({image})",
        "",
        f"MLflow comparison run [{comparison.run_id[:8]}]({link}); picture: "
        f"`{comparison.picture}`.",
        "",
        "| run | GRPO steps | last reward | " + " | ".join(TITLES.values()) + " | missing |",
        "| --- | --- | --- | " + " | ".join("---" for _ in TITLES) + " | --- |",
    ]
    for run in comparison.runs:
        last = f"{run.reward[-1][1]:.3f}" if run.reward else "-"
        accuracy = [f"{run.accuracy[m]:.3f}" if m in run.accuracy else "-" for m in EVALUATED]
        missing = ", ".join(run.missing) or "-"
        lines.append(
            f"| {run.label} | {len(run.reward)} | {last} | {' | '.join(accuracy)} | {missing} |"
        )
    return "\n".join(lines) + "\n"
