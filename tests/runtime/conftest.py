"""Every runtime test runs isolated, as the training stages do (``isolated_stage``); the tiny
model folder, the data, the MLflow store and the local Ray are in ``tests/conftest.py``."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(isolated_stage: None) -> None:
    """Each test in its own working directory, spool and MLflow environment."""
