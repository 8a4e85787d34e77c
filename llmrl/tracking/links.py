"""Addresses in the MLflow UI: of a run, an experiment's runs table, an artifact, a registered
model version.

The UI's base address is, in order: the one given (the pipeline's ``mlflow_ui_url``),
``$LLMRL_MLFLOW_UI_URL`` (:data:`UI_URL_ENV`; a cluster's external MLflow address, when the
tracking URI is an in-cluster service name), the tracking URI when it is an http(s) server, else
``mlflow ui``'s default address (:data:`LOCAL_UI_URL`) for a local SQLite store.

**The model-training view.** MLflow 3.17's UI shows every experiment in one of two views, and
the experiment's ``mlflow.experimentKind`` tag does not choose it: the URL parameter
``workflowType`` (``genai`` or ``machine_learning``) does, else the browser's stored choice
(localStorage ``mlflow.workflowType_v1``, written by the sidebar's "GenAI" / "Model training"
switch), else ``genai``. A new browser therefore opens an experiment on its GenAI pages
(Overview, Traces, Evaluation runs). Every UI address built here carries
``?workflowType=machine_learning`` (:data:`MODEL_TRAINING_QUERY`), so it opens on the training
view's Runs, Models and Traces in any browser; the parameter does not change the stored choice.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from llmrl.tracking.client import is_remote

UI_URL_ENV = "LLMRL_MLFLOW_UI_URL"
LOCAL_UI_URL = "http://127.0.0.1:5000"
WORKFLOW_TYPE_PARAM = "workflowType"
MODEL_TRAINING_WORKFLOW = "machine_learning"
"""The ``workflowType`` of the UI's model-training view (``genai`` is the other)."""
MODEL_TRAINING_QUERY = f"?{WORKFLOW_TYPE_PARAM}={MODEL_TRAINING_WORKFLOW}"


def ui_base(tracking_uri: str, ui_url: str | None = None) -> str:
    """The MLflow UI's base address (see the module docstring), without a trailing slash."""
    base = ui_url or os.environ.get(UI_URL_ENV)
    if not base:
        base = tracking_uri if is_remote(tracking_uri) else LOCAL_UI_URL
    return base.rstrip("/")


def runs_url(base: str, experiment_id: str) -> str:
    """An experiment's runs table in the model-training view:
    ``<base>/#/experiments/<experiment id>/runs?workflowType=machine_learning``."""
    return f"{base}/#/experiments/{experiment_id}/runs{MODEL_TRAINING_QUERY}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page in the model-training view:
    ``<base>/#/experiments/<experiment id>/runs/<run id>?workflowType=machine_learning``."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}{MODEL_TRAINING_QUERY}"


def artifact_url(base: str, run_id: str, path: str) -> str:
    """A run artifact's file, as the MLflow server serves it (an image's ``src``)."""
    return f"{base}/get-artifact?path={quote(path)}&run_uuid={run_id}"


def model_version_url(base: str, name: str, version: str | int) -> str:
    """A registered model version's page, with the model-training view's sidebar."""
    return f"{base}/#/models/{quote(name)}/versions/{version}{MODEL_TRAINING_QUERY}"
