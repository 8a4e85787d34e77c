"""Compare runs: the GRPO reward curves and held-out accuracies of several runs in one picture,
logged to MLflow on a run of its own.

What is compared is given as run ids or experiment names (:func:`resolve_runs`):

- a pipeline's parent run (tag ``llmrl.stage = pipeline``): its GRPO stage's per-step
  ``reward_mean`` (the run the tag ``llmrl.run.grpo`` names, else its child run named ``grpo``)
  and its ``accuracy_<model>`` metrics (base, after SFT, after GRPO);
- any other run (a GRPO stage run, standalone or nested): its own ``reward_mean`` history, and
  the accuracies of its parent run when it has one;
- an experiment name: its pipeline runs, newest first (its GRPO stage runs when it has no
  pipeline run).

A run with none of these metrics is an error that names it; a run with only some of them is
drawn with what it has, and :attr:`RunCurves.missing` says what it lacks.

**Where it is logged.** On a new run of the first compared run's experiment, named
``compare-<n>-runs`` and tagged ``llmrl.stage = compare`` and ``llmrl.compared_runs`` (the ids):
the picture (``comparison.png``) and the numbers drawn (``comparison.json``), both also
written to the output folder. Finished runs are
never changed, and a comparison can be found (and repeated) from its run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmrl.tracking.client import mlflow_client
from llmrl.tracking.pipeline_run import (
    ACCURACY_PREFIX,
    PIPELINE_STAGE,
    STAGE_TAG,
    stage_run_tag,
)
from llmrl.tracking.plots import Panel, render_panels

REWARD_METRIC = "reward_mean"
"""The GRPO stage's per-step mean reward."""
COMPARE_STAGE = "compare"
PICTURE = "comparison.png"
NUMBERS = "comparison.json"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class CompareError(ValueError):
    """What was asked cannot be compared; the message names the run or experiment and why."""


@dataclass
class RunCurves:
    """What one compared run contributes: its reward curve and its accuracies per model."""

    run_id: str
    label: str
    experiment_id: str
    reward: list[tuple[int, float]] = field(default_factory=list)
    accuracy: dict[str, float] = field(default_factory=dict)
    reward_run_id: str | None = None
    missing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Comparison:
    """A logged comparison: its MLflow run, the picture and the curves drawn."""

    run_id: str
    experiment_id: str
    picture: Path
    runs: list[RunCurves]


def resolve_runs(client: Any, specs: Sequence[str], max_runs: int = 10) -> list[Any]:
    """The runs ``specs`` name (run ids or experiment names), in order, without repeats.

    Raises:
        CompareError: a spec that is neither a run id nor an experiment, or an experiment
            with no pipeline or GRPO run.
    """
    from mlflow.exceptions import MlflowException

    runs: dict[str, Any] = {}
    for spec in specs:
        if _RUN_ID.match(spec):
            try:
                run = client.get_run(spec)
            except MlflowException as error:
                if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            else:
                runs.setdefault(run.info.run_id, run)
                continue
        experiment = client.get_experiment_by_name(spec)
        if experiment is None:
            raise CompareError(f"{spec!r} is neither a run id nor an experiment name")
        for run in _experiment_runs(client, experiment, max_runs):
            runs.setdefault(run.info.run_id, run)
    if not runs:
        raise CompareError("nothing to compare: give run ids or an experiment name")
    return list(runs.values())


def _experiment_runs(client: Any, experiment: Any, max_runs: int) -> list[Any]:
    for stage in (PIPELINE_STAGE, "grpo"):
        runs = client.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`{STAGE_TAG}` = '{stage}'",
            order_by=["attributes.start_time DESC"],
            max_results=max_runs,
        )
        if runs:
            return list(runs)
    raise CompareError(f"experiment {experiment.name!r} has no pipeline or GRPO runs to compare")


def collect_curves(client: Any, run: Any, reward_metric: str = REWARD_METRIC) -> RunCurves:
    """The curves of one run (see the module docstring).

    Raises:
        CompareError: the run has neither ``reward_metric`` nor accuracies.
    """
    info, tags = run.info, run.data.tags
    curves = RunCurves(info.run_id, f"{info.run_name} ({info.run_id[:8]})", info.experiment_id)
    if tags.get(STAGE_TAG) == PIPELINE_STAGE:
        curves.reward_run_id = tags.get(stage_run_tag("grpo")) or _child(client, run, "grpo")
        accuracy_run = run
    else:
        curves.reward_run_id = info.run_id
        parent = tags.get("mlflow.parentRunId")
        accuracy_run = client.get_run(parent) if parent else None
    if curves.reward_run_id:
        history = client.get_metric_history(curves.reward_run_id, reward_metric)
        curves.reward = sorted((int(m.step), float(m.value)) for m in history)
    if accuracy_run is not None:
        curves.accuracy = {
            key.removeprefix(ACCURACY_PREFIX): float(value)
            for key, value in accuracy_run.data.metrics.items()
            if key.startswith(ACCURACY_PREFIX)
        }
    if not curves.reward:
        curves.missing.append(reward_metric)
    if not curves.accuracy:
        curves.missing.append(f"{ACCURACY_PREFIX}<model>")
    if not curves.reward and not curves.accuracy:
        raise CompareError(
            f"run {info.run_id} ({info.run_name}) has none of the metrics to compare: no "
            f"{reward_metric!r} history (GRPO steps) and no {ACCURACY_PREFIX}<model> metrics "
            "(held-out accuracies of a pipeline run)"
        )
    return curves


def _child(client: Any, parent: Any, name: str) -> str | None:
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        order_by=["attributes.start_time DESC"],
    )
    return next((r.info.run_id for r in runs if r.info.run_name == name), None)


def comparison_panels(
    runs: Sequence[RunCurves], models: Sequence[str], reward_metric: str = REWARD_METRIC
) -> list[Panel]:
    """The two panels: reward per GRPO step, and accuracy per model (``models`` first, in
    their order, then any other model a run has)."""
    order = list(models) + sorted({m for r in runs for m in r.accuracy} - set(models))
    reward = Panel(
        f"GRPO {reward_metric} per step",
        {r.label: [(float(s), v) for s, v in r.reward] for r in runs if r.reward},
        ylabel=reward_metric,
    )
    accuracy = Panel(
        "held-out accuracy",
        {
            r.label: [(float(order.index(m)), v) for m, v in r.accuracy.items()]
            for r in runs
            if r.accuracy
        },
        xlabel="model",
        ylabel="accuracy",
        categories=tuple(order),
    )
    return [reward, accuracy]


def compare_runs(
    tracking_uri: str,
    specs: Sequence[str],
    out_dir: str | Path,
    *,
    models: Sequence[str] = (),
    reward_metric: str = REWARD_METRIC,
    max_runs: int = 10,
) -> Comparison:
    """Draw the runs ``specs`` names into ``<out_dir>/comparison.png`` (the numbers into
    ``comparison.json``) and log both on a new comparison run (see the module docstring).

    Raises:
        CompareError: unknown run or experiment, no runs, a run without the metrics.
        TrackingUnavailableError: the MLflow server does not answer.
    """
    client = mlflow_client(tracking_uri)
    runs = [collect_curves(client, run, reward_metric) for run in resolve_runs(client, specs)]
    picture = render_panels(comparison_panels(runs, models, reward_metric), Path(out_dir) / PICTURE)
    run_id, experiment_id = _log(tracking_uri, client, runs, picture)
    return Comparison(run_id, experiment_id, picture, runs)


def _log(tracking_uri: str, client: Any, runs: list[RunCurves], picture: Path) -> tuple[str, str]:
    """Log the picture and the numbers on a new run of the first run's experiment."""
    from llmrl.tracking.tracker import Tracker

    experiment = client.get_experiment(runs[0].experiment_id).name
    ids = [r.run_id for r in runs]
    tracker = Tracker(
        COMPARE_STAGE,
        experiment=experiment,
        tracking_uri=tracking_uri,
        run_name=f"compare-{len(runs)}-runs",
        parent_run_id="",
        tags={"llmrl.compared_runs": ",".join(ids)},
        log_system_metrics=False,
    )
    numbers = picture.with_name(NUMBERS)
    numbers.write_text(json.dumps([asdict(r) for r in runs], indent=1), encoding="utf-8")
    with tracker:
        tracker.log_params({"runs": ",".join(ids), "count": len(runs)})
        tracker.log_artifact(picture)
        tracker.log_artifact(numbers)
    return str(tracker.run_id), runs[0].experiment_id
