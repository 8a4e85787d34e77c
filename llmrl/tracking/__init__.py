"""MLflow tracking for the pipeline stages: the only llmrl package that imports ``mlflow``.

``mlflow`` is imported lazily inside the functions, so ``import llmrl.tracking`` stays cheap and
works without it; a :class:`Tracker` with ``enabled=False`` never touches it.

Example::

    from llmrl.tracking import Tracker

    with Tracker("sft", tracking_uri="http://mlflow:5000") as tracker:
        tracker.log_params(cfg.model_dump())
        tracker.log_metrics({"loss": 1.2}, step=0)
"""

from __future__ import annotations

from llmrl.tracking.connection import left_spools
from llmrl.tracking.spool import flush_spool
from llmrl.tracking.tracker import Tracker, default_tracking_uri, flatten_params

__all__ = ["Tracker", "default_tracking_uri", "flatten_params", "flush_spool", "left_spools"]
