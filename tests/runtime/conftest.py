"""Fixtures of the runtime tests: the training stages' tiny model, data and MLflow store, and
one local Ray (2 CPUs) per module."""

from __future__ import annotations

from tests.collectors.ray_local import local_ray  # noqa: F401
from tests.train.conftest import (  # noqa: F401
    _isolated,
    arithmetic_data,
    mlflow_uri,
    tiny_model_dir,
)
