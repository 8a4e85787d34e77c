"""A training stage's final model in MLflow: a logged model of its run, registered in the model
registry (one version per run).

**How the model gets there.** The final checkpoint's ``model/`` folder (a Hugging Face model
directory: ``config.json``, ``model.safetensors``, tokenizer files) is uploaded straight from
the checkpoint into a MLflow 3 *logged model* (``create_logged_model`` +
``log_model_artifacts``), with a small ``MLmodel`` file beside it, and that logged model is
registered (the logged model's artifacts as the version's source, the stage's run as its run).
One copy per run, read from the checkpoint as it is.

Measured on the default SmolLM2-135M fp32 directory (517 MB, 2 cores, SQLite store, warm page
cache), the three ways considered:

- this module (upload the directory into a logged model, register it): 0.3 s; 517 MB
  written (the store); 0.24 GB of memory;
- ``mlflow.transformers.log_model(<directory>, task=...)``: fails with transformers 5 (MLflow
  3.17 reads a pipeline class attribute transformers 5 no longer has);
- ``mlflow.transformers.log_model(<pipeline>)``: 11 s (loading the model 9 s, logging 1.5 s);
  1034 MB written (a temporary copy, then the store); 1.15 GB of memory.

An *external* logged model (``create_external_model``: only a pointer to the checkpoint) would
copy nothing, but a registered version must stay loadable after the run's work directory is
cleaned up and from machines that do not mount it, so the weights are uploaded once. The
``MLmodel`` file has no flavor: a version is a Hugging Face model directory. Download it (with
``mlflow.set_tracking_uri(...)`` done, since ``models:/`` URIs resolve in the global registry)
and load the folder with ``transformers`` or ``llmrl.models.load_model``::

    folder = mlflow.artifacts.download_artifacts("models:/llmrl-grpo/3")
    model = AutoModelForCausalLM.from_pretrained(folder)

**Names.** The registered model is ``<experiment>-<stage>`` (:func:`registered_name`):
``llmrl-sft``, ``llmrl-grpo``; each run that finishes adds one version. A stage resumed in the
same run does not add a second one (:func:`find_version`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

MODEL_FORMAT = "huggingface-transformers"
CHECKPOINT_TAG = "llmrl.checkpoint"


def registered_name(experiment: str, stage: str) -> str:
    """The registered model of a stage's final models: ``<experiment>-<stage>``."""
    return f"{experiment}-{stage}"


def find_version(client: Any, name: str, run_id: str) -> Any | None:
    """The version of registered model ``name`` that run ``run_id`` created, if any."""
    versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    return versions[0] if versions else None


def log_model_dir(
    client: Any, run_id: str, model_dir: str | Path, name: str, registered: str
) -> Any:
    """Upload ``model_dir`` as run ``run_id``'s logged model ``name`` and register it as a
    version of ``registered``; return the ``ModelVersion`` (the existing one when this run
    already registered one)."""
    from mlflow.entities import LoggedModelOutput
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    existing = find_version(client, registered, run_id)
    if existing is not None:
        return existing
    model_dir = Path(model_dir).resolve()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a model directory (no config.json)")
    run = client.get_run(run_id)
    tags = {CHECKPOINT_TAG: str(model_dir), "llmrl.format": MODEL_FORMAT}
    model = client.create_logged_model(
        run.info.experiment_id, name=name, source_run_id=run_id, tags=tags, model_type="llm"
    )
    try:
        client.log_model_artifacts(model.model_id, str(model_dir))
        with tempfile.TemporaryDirectory(prefix="llmrl-mlmodel-") as tmp:
            description = Model(
                artifact_path=model.artifact_location,
                run_id=run_id,
                model_id=model.model_id,
                metadata={"format": MODEL_FORMAT, "checkpoint": str(model_dir)},
            )
            description.save(Path(tmp) / "MLmodel")
            client.log_model_artifact(model.model_id, str(Path(tmp) / "MLmodel"))
    except BaseException:
        client.finalize_logged_model(model.model_id, "FAILED")
        raise
    client.finalize_logged_model(model.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    try:
        client.create_registered_model(registered)
    except MlflowException as error:
        if error.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    return client.create_model_version(  # a "models:/" source resolves in the global store
        registered, source=model.artifact_location, run_id=run_id, model_id=model.model_id
    )
