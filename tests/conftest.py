"""Fixtures every test folder may use: an isolated llmrl cache, SmolLM2's tokenizer and a tiny
random model (saved as a model folder too), a prepared arithmetic dataset, a SQLite MLflow store
and a real MLflow server, a stage's isolated working directory, a local Ray, Prefect's test
harness and the Helm chart.

The default model is converted from its GGUF once per test session into a temporary cache, so
the suite never reads or writes the user's ``~/.cache/llmrl``. Nothing heavy is imported here at
import time (the GPU machine and the vLLM environment load this file too): each fixture imports
what it needs. Plain helpers live in :mod:`tests.support`; a folder's own fixtures in its
conftest.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mlflow_server import MlflowServer
from tests.support.ray_local import started_local_ray

_SESSION_CACHE = Path(tempfile.mkdtemp(prefix="llmrl-test-cache-"))
os.environ["LLMRL_CACHE"] = str(_SESSION_CACHE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

COSTS_FILE = Path(__file__).with_name("tier_costs.json")


def _module_costs() -> dict[str, dict[str, float]]:
    """Each module's measured seconds per tier, as the last ``make test-all`` wrote them
    (``scripts/tier_costs.py``); empty when the file is missing."""
    return json.loads(COSTS_FILE.read_text()) if COSTS_FILE.is_file() else {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The most expensive modules first, by their measured cost in this tier
    (``tests/tier_costs.json``), the rest in collection order: with ``-n 2 --dist loadfile`` the
    long modules start at once and the short ones fill in beside them, instead of a 6-minute
    module starting last and running alone. A module's own tests keep their order; a module
    measured in neither tier (a new one) counts as the most expensive, so it cannot end a run
    alone."""
    measured = _module_costs()
    cost: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        tier = "slow" if item.get_closest_marker("slow") else "fast"
        seconds = measured.get(module, {}).get(tier, float("inf"))
        cost[module] = max(cost.get(module, 0.0), seconds)
    items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def session_cache() -> Path:
    """The cache folder this test session uses (``LLMRL_CACHE``)."""
    return _SESSION_CACHE


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M-Instruct's real tokenizer (pad == eos == ``<|im_end|>``)."""
    from llmrl.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny(tokenizer):
    """A 2-layer random Llama over SmolLM2's vocabulary, built once per session."""
    from llmrl.models import tiny_model

    return tiny_model(tokenizer)


@pytest.fixture(scope="session")
def eos_model(tokenizer):
    """Tiny random Llama whose output layer favours EOS (~6% a step): ragged responses,
    most of them ending with EOS (which is also the pad token)."""
    import torch

    from llmrl.models import tiny_model

    model = tiny_model(tokenizer, seed=1)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = 8.0
    model.lm_head = head
    return model.eval()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Prefect's test harness (a temporary API and database), PREFECT_HOME in a temp folder."""
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    updates = {PREFECT_HOME: str(home), PREFECT_SERVER_ANALYTICS_ENABLED: False}
    with temporary_settings(updates=updates), prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own Ctrl-C handler for the test, whatever an earlier test left installed."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------------------ training stages


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer, tiny) -> Path:
    """The session's tiny random Llama saved with SmolLM2's tokenizer (a ``model.name``)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """A tiny random one-label ``LlamaForSequenceClassification`` (a reward model) saved with
    SmolLM2's tokenizer; vLLM's CPU build accepts it (head size 64)."""
    from tests.support.reward_models import save_classifier

    return save_classifier(tmp_path_factory.mktemp("tiny-classifier"), tokenizer)


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared arithmetic dataset: 40 train and 10 eval problems (the ``data.path``)."""
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    config = PrepareConfig(
        generate={"train_size": 40, "eval_size": 10},
        output_dir=tmp_path_factory.mktemp("prepared"),
    )
    return prepare_dataset(config, progress=False).path


@pytest.fixture
def isolated_stage(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The test in its own working directory (so ``runs/``, ``mlflow.db`` and the tracking spool
    never land in the repository), with its own spool and MLflow's system-metrics sampling off.
    ``tests/train`` and ``tests/runtime`` use it for every test; a module elsewhere asks with
    ``pytest.mark.usefixtures("isolated_stage")``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLMRL_MLFLOW_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_PARENT_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------------ services


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite MLflow store for the module (creating its tables takes about a second), with
    the ``llmrl`` experiment's artifacts in a temporary folder: a module may count the runs it
    logged, whatever modules ran before it on the same worker."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("llmrl", artifact_location=(root / "artifacts").as_uri())
    return uri


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real ``mlflow server`` for the module; ``.uri`` to log to, ``.restart()`` for outages."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def local_ray(session_cache: Path) -> Iterator[Any]:
    """A local Ray with 2 CPUs, no dashboard and no auth token, shut down after the module
    (``session_cache``: started after the session's cache, which its actors read)."""
    with started_local_ray() as ray:
        yield ray


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    """The helm/llmrl chart loaded by the real Helm engine (helm-python-sdk), for the module."""
    from tests.support.chart import CHART

    helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders it")
    with helm.Chart.load(CHART) as loaded:
        yield loaded
