"""`PipelineRun`: the MLflow parent run of one pipeline run, as the orchestrating flow sees it.

Every stage of a pipeline logs its own run through a :class:`~llmrl.tracking.Tracker`, nested
under this parent (:meth:`PipelineRun.stage_env` is what a stage process needs for that). The
flow itself only opens the parent, tags it, finds the stages' runs, stores the pipeline's summary
on it (:meth:`PipelineRun.log_text`, :meth:`PipelineRun.log_dict`) and closes it.

Unlike a stage's tracker, which spools through an outage, every method here raises when MLflow
does not answer (:class:`~llmrl.tracking.client.TrackingUnavailableError` within
:data:`~llmrl.tracking.client.REQUEST_TIMEOUT_S` for a dead server): the flow decides whether to
retry (Prefect task retries) or to go on. A ``PipelineRun`` is a plain value (ids and
addresses, no open connection), so it can be passed between tasks.

Example::

    parent = PipelineRun.open("http://mlflow:5000", "llmrl", run_name="pipeline-x", tags={})
    env = parent.stage_env(spool_dir="runs/pipeline/mlflow-spool")  # for each stage process
    parent.close("FINISHED", {"accuracy_grpo": 0.4})
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmrl.tracking.client import mlflow_client
from llmrl.tracking.datasets import DatasetRef, send_inputs
from llmrl.tracking.experiments import get_or_create_experiment
from llmrl.tracking.links import run_url, runs_url, ui_base
from llmrl.tracking.spool import send_metrics, send_params, send_tags
from llmrl.tracking.tracker import PARENT_RUN_ENV, SPOOL_DIR_ENV, flatten_params

STAGE_TAG = "llmrl.stage"
PIPELINE_STAGE = "pipeline"
"""The ``llmrl.stage`` tag value of a parent run (stage runs carry their stage's name)."""
STAGE_RUN_TAG_PREFIX = "llmrl.run."
"""Parent-run tags ``llmrl.run.<stage>`` = the run id of the stage's result (the run that
produced it, also when a later pipeline run reused it)."""
ACCURACY_PREFIX = "accuracy_"
"""Parent-run metrics ``accuracy_<model>``: held-out accuracy of the base model, after SFT..."""
GAIN_PREFIX = "gain/"
"""Parent-run metrics ``gain/<after>_over_<before>``: accuracy gains on the same problems."""


def accuracy_key(model: str) -> str:
    """The parent-run metric of ``model``'s held-out accuracy: ``accuracy_<model>``."""
    return f"{ACCURACY_PREFIX}{model}"


def gain_key(after: str, before: str) -> str:
    """The parent-run metric of ``after``'s accuracy gain over ``before``:
    ``gain/<after>_over_<before>``; its interval and McNemar p-value add ``_ci_low``,
    ``_ci_high`` and ``_p_mcnemar``."""
    return f"{GAIN_PREFIX}{after}_over_{before}"


def stage_run_tag(name: str) -> str:
    """The parent-run tag naming stage ``name``'s run: ``llmrl.run.<name>``."""
    return f"{STAGE_RUN_TAG_PREFIX}{name}"


@dataclass(frozen=True)
class PipelineRun:
    """A pipeline's parent run: where it lives (``uri``, ``experiment_id``, ``run_id``) and the
    base address of the MLflow UI its links use (``ui_url``)."""

    uri: str
    experiment: str
    experiment_id: str
    run_id: str
    ui_url: str

    @classmethod
    def open(
        cls,
        uri: str,
        experiment: str,
        *,
        run_name: str,
        tags: Mapping[str, str],
        params: Any = None,
        ui_url: str | None = None,
    ) -> PipelineRun:
        """Create the parent run (and the experiment when needed) with ``tags`` and the
        flattened ``params``."""
        from llmrl.tracking.spool import create_run

        client = mlflow_client(uri)
        all_tags = {STAGE_TAG: PIPELINE_STAGE, **tags}
        run_id = create_run(
            client, experiment=experiment, run_name=run_name, tags=all_tags, parent_run_id=None
        )
        if params is not None:
            send_params(client, run_id, flatten_params(params))
        experiment_id = get_or_create_experiment(client, experiment)
        return cls(uri, experiment, experiment_id, run_id, ui_base(uri, ui_url))

    def link(self, run_id: str | None) -> str | None:
        """The UI address of run ``run_id`` of this experiment (None for None)."""
        return run_url(self.ui_url, self.experiment_id, run_id) if run_id else None

    def runs_link(self) -> str:
        """The UI address of this experiment's runs table, in the model-training view (the
        parent run on top, newest first, its stage runs nested under it)."""
        return runs_url(self.ui_url, self.experiment_id)

    def stage_env(self, spool_dir: str | Path) -> dict[str, str]:
        """The environment a stage process needs to nest its run under this one."""
        return {
            "MLFLOW_TRACKING_URI": self.uri,
            "MLFLOW_EXPERIMENT_NAME": self.experiment,
            PARENT_RUN_ENV: self.run_id,
            SPOOL_DIR_ENV: str(Path(spool_dir).resolve()),
        }

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the parent run."""
        send_tags(mlflow_client(self.uri), self.run_id, {k: str(v) for k, v in tags.items()})

    def log_inputs(self, refs: list[DatasetRef]) -> None:
        """Log datasets as the parent run's inputs."""
        send_inputs(mlflow_client(self.uri), self.run_id, refs)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Store ``text`` as the parent run's artifact ``artifact_file`` (e.g. a markdown file)."""
        mlflow_client(self.uri).log_text(self.run_id, text, artifact_file)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        """Store ``data`` as the parent run's JSON artifact ``artifact_file``."""
        mlflow_client(self.uri).log_dict(self.run_id, dict(data), artifact_file)

    def find_child(self, name: str) -> str | None:
        """The id of the newest run named ``name`` nested under the parent, if there is one."""
        runs = mlflow_client(self.uri).search_runs(
            [self.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{self.run_id}'",
            order_by=["attributes.start_time DESC"],
        )
        return next((run.info.run_id for run in runs if run.info.run_name == name), None)

    def close(self, status: str, metrics: Mapping[str, float] | None = None) -> None:
        """Log the pipeline's ``metrics`` (step 0) and end the parent run with ``status``."""
        client = mlflow_client(self.uri)
        if metrics:
            now = int(time.time() * 1000)
            records = [
                {"key": k, "value": float(v), "step": 0, "timestamp": now}
                for k, v in metrics.items()
            ]
            send_metrics(client, self.run_id, records)
        client.set_terminated(self.run_id, status)
