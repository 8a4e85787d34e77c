"""Session-wide fixtures: an isolated llmrl cache, SmolLM2's tokenizer and a tiny random model.

The default model is converted from its GGUF once per test session into a temporary cache, so
the suite never reads or writes the user's ``~/.cache/llmrl``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

_SESSION_CACHE = Path(tempfile.mkdtemp(prefix="llmrl-test-cache-"))
os.environ["LLMRL_CACHE"] = str(_SESSION_CACHE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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


def send_ctrl_c() -> None:
    """A real SIGINT to the main thread: unlike ``_thread.interrupt_main()`` it also breaks a
    blocking read (a pipe, a watch stream) the main thread is waiting in."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
