"""MLflow tracking: the only llmrl package that imports ``mlflow``, and the one place that talks

Layer 1 (data, models, topology, tracking): imports only llmrl.core.
to it, for the stages and for the flow that orchestrates them.

- :class:`Tracker` (:mod:`~llmrl.tracking.tracker`): a stage's run; never stops training
  (spools through outages: :mod:`~llmrl.tracking.connection`, :mod:`~llmrl.tracking.spool`).
- :class:`PipelineRun` (:mod:`~llmrl.tracking.pipeline_run`): a pipeline's parent run.
- :mod:`~llmrl.tracking.client`: the one client policy (timeouts, retries, health probe).
- :mod:`~llmrl.tracking.experiments`, :mod:`~llmrl.tracking.datasets`,
  :mod:`~llmrl.tracking.models`, :mod:`~llmrl.tracking.links`: the experiment (artifact
  location, kind), dataset inputs, registered final models, UI addresses.
- :mod:`~llmrl.tracking.comparison` and :mod:`~llmrl.tracking.plots`: pictures of runs.

``mlflow`` is imported lazily inside the functions, so ``import llmrl.tracking`` stays cheap and
works without it; a :class:`Tracker` with ``enabled=False`` never touches it.

Example::

    from llmrl.tracking import Tracker

    with Tracker("sft", tracking_uri="http://mlflow:5000") as tracker:
        tracker.log_params(cfg.model_dump())
        tracker.log_metrics({"loss": 1.2}, step=0)
"""

from __future__ import annotations

from llmrl.tracking.client import TrackingUnavailableError
from llmrl.tracking.connection import left_spools
from llmrl.tracking.datasets import DatasetRef, prepared_inputs
from llmrl.tracking.models import registered_name
from llmrl.tracking.pipeline_run import PipelineRun
from llmrl.tracking.spool import flush_spool
from llmrl.tracking.tracker import Tracker, default_tracking_uri, flatten_params

__all__ = [
    "DatasetRef",
    "PipelineRun",
    "Tracker",
    "TrackingUnavailableError",
    "default_tracking_uri",
    "flatten_params",
    "flush_spool",
    "left_spools",
    "prepared_inputs",
    "registered_name",
]
