"""Every training-stage test runs isolated: in its own working directory, spool and MLflow
environment (``isolated_stage``). The stages' shared fixtures (the tiny model folder, the
arithmetic data, the MLflow store and server) are in ``tests/conftest.py``, their helpers in
:mod:`tests.support`."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated(isolated_stage: None) -> None:
    """Each test in its own working directory, spool and MLflow environment."""
