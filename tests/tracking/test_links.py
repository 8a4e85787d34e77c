"""Addresses in the MLflow UI open the model-training view in any browser, and the installed
MLflow UI still reads what they carry.

MLflow 3.17's UI picks an experiment's view (GenAI or model training) from the ``workflowType``
URL parameter, else from the browser's localStorage (``genai`` in a new browser); the
``mlflow.experimentKind`` tag does not choose it. The second half of this module reads the UI's
JavaScript bundle installed with mlflow, so an MLflow upgrade that moves these routes or the
parameter fails here instead of sending users to the GenAI pages.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmrl.tracking.links import (
    MODEL_TRAINING_QUERY,
    MODEL_TRAINING_WORKFLOW,
    WORKFLOW_TYPE_PARAM,
    model_version_url,
    run_url,
    runs_url,
)

BASE = "http://127.0.0.1:5000"


def test_links_carry_the_model_training_workflow() -> None:
    assert MODEL_TRAINING_QUERY == "?workflowType=machine_learning"
    assert runs_url(BASE, "7") == f"{BASE}/#/experiments/7/runs?workflowType=machine_learning"
    assert run_url(BASE, "7", "abc") == (
        f"{BASE}/#/experiments/7/runs/abc?workflowType=machine_learning"
    )
    assert model_version_url(BASE, "llmrl grpo", 2) == (
        f"{BASE}/#/models/llmrl%20grpo/versions/2?workflowType=machine_learning"
    )


def _ui_bundle() -> str:
    """The installed MLflow UI's main JavaScript bundle."""
    import mlflow

    folder = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    bundles = sorted(folder.glob("main.*.js"))
    if not bundles:
        pytest.skip("this mlflow install has no UI bundle (mlflow-skinny)")
    return bundles[0].read_text(encoding="utf-8")


def test_the_installed_ui_reads_the_workflow_type_from_the_url() -> None:
    bundle = _ui_bundle()
    # the two views, by the values of the parameter
    assert re.search(rf'GENAI="genai",\w+\.MACHINE_LEARNING="{MODEL_TRAINING_WORKFLOW}"', bundle)
    # the URL parameter wins over the stored choice, which starts as GenAI in a new browser
    assert re.search(
        rf'\.get\("{WORKFLOW_TYPE_PARAM}"\);return \w+===\w+\.GENAI\|\|\w+===\w+\.MACHINE_LEARNING'
        r"\?\w+:\w+",
        bundle,
    )
    assert re.search(r'key:"mlflow\.workflowType",version:1,initialValue:\w+', bundle)
    assert re.search(r"const \w+=\w+\.GENAI,\w+=\(0,\w+\.createContext\)\(\{workflowType:", bundle)
    # and the routes the links open: the runs table, a run, a model version
    for route in [
        "/experiments/:experimentId/runs",
        "/experiments/:experimentId/runs/:runUuid",
        "/models/:modelName/versions/:version",
    ]:
        assert f'("{route}")' in bundle, route
