"""The MLflow experiment every llmrl run goes into: where its artifacts live and how the UI
shows it.

- **Artifacts beside a SQLite store**: an experiment created on ``sqlite:///<dir>/mlflow.db``
  keeps its artifacts in ``<dir>/mlruns/<experiment>`` (MLflow would use ``./mlruns`` of whatever
  directory the creating process ran in); other stores use the server's default.
- **Experiment kind**: the experiment tag ``mlflow.experimentKind`` (:data:`EXPERIMENT_KIND_TAG`)
  records what an experiment holds: ``genai_development`` (traces) or
  ``custom_model_development`` (:data:`EXPERIMENT_KIND`: runs, metrics and models, what a training
  experiment holds). The tag is set when the experiment is created, and on an existing experiment
  that has none (by whichever of several processes starting together gets there first); a kind
  someone chose is kept. MLflow 3.17's UI does not pick its view from this
  tag but from the ``workflowType`` URL parameter, which every link llmrl prints carries
  (:mod:`llmrl.tracking.links`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""The model-training kind of MLflow 3's experiment-kind selector."""


def artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: ``<db folder>/mlruns/<experiment>`` for a
    SQLite store, None (the server's default) for others."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    return str(Path(tracking_uri.removeprefix(prefix)).resolve().parent / "mlruns" / experiment)


def get_or_create_experiment(client: Any, name: str) -> str:
    """The id of experiment ``name``, created (or restored from deleted) when needed, with the
    model-training kind tag."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        location = artifact_location(client.tracking_uri, name)
        tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        try:
            return client.create_experiment(name, artifact_location=location, tags=tags)
        except MlflowException as error:  # created concurrently by another process
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    experiment_id = experiment.experiment_id
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        try:
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except MlflowException:
            # Stage processes starting together on an untagged experiment all set the tag: on
            # PostgreSQL all but one insert fail on the tag's key (BAD_REQUEST). Lost to another
            # writer is fine; any other failure (the server away) is the caller's.
            if EXPERIMENT_KIND_TAG not in client.get_experiment(experiment_id).tags:
                raise
    return experiment_id
