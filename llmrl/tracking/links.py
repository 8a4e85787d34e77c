"""Addresses in the MLflow UI: of a run, an artifact, a registered model version.

The UI's base address is, in order: the one given (the pipeline's ``mlflow_ui_url``),
``$LLMRL_MLFLOW_UI_URL`` (:data:`UI_URL_ENV`; a cluster's external MLflow address, when the
tracking URI is an in-cluster service name), the tracking URI when it is an http(s) server, else
``mlflow ui``'s default address (:data:`LOCAL_UI_URL`) for a local SQLite store.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from llmrl.tracking.client import is_remote

UI_URL_ENV = "LLMRL_MLFLOW_UI_URL"
LOCAL_UI_URL = "http://127.0.0.1:5000"


def ui_base(tracking_uri: str, ui_url: str | None = None) -> str:
    """The MLflow UI's base address (see the module docstring), without a trailing slash."""
    base = ui_url or os.environ.get(UI_URL_ENV)
    if not base:
        base = tracking_uri if is_remote(tracking_uri) else LOCAL_UI_URL
    return base.rstrip("/")


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """A run's page: ``<base>/#/experiments/<experiment id>/runs/<run id>``."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def artifact_url(base: str, run_id: str, path: str) -> str:
    """A run artifact's file, as the MLflow server serves it (an image's ``src``)."""
    return f"{base}/get-artifact?path={quote(path)}&run_uuid={run_id}"


def model_version_url(base: str, name: str, version: str | int) -> str:
    """A registered model version's page."""
    return f"{base}/#/models/{quote(name)}/versions/{version}"
