"""`Tracker`: one MLflow run per pipeline stage, which never stops or slows down training.

Every stage (prepare, SFT, GRPO, eval) logs through a ``Tracker``. It talks to MLflow through an
``MlflowClient`` with explicit run ids (never the fluent "active run"), so a flow's parent run
(:class:`~llmrl.tracking.PipelineRun`) and a stage's tracker can live in one process. Its promises:

- **Outages** (:mod:`llmrl.tracking.connection`, policy in :mod:`llmrl.tracking.client`): a
  call that fails with a connection error marks the server down and the data goes to a local
  spool (:mod:`llmrl.tracking.spool`); while down, calls only append to the spool and a retry
  happens at most every ``retry_interval_s`` (doubling up to 60 s while it keeps failing), so a
  dead server costs no per-step timeouts.
  Each call first replays the spool when a retry is due; :meth:`Tracker.finish` replays it
  (``finish_attempts`` tries) and, if the server is still away, leaves it on disk for
  :func:`~llmrl.tracking.flush_spool`. Tracking-server errors never raise. For http(s) URIs
  MLflow's client retries are turned off and its timeout set to 5 s
  (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``, ``MLFLOW_HTTP_REQUEST_TIMEOUT=5``: process-wide
  defaults, values already in the environment win).
- **Resume**: ``Tracker(stage, run_id=...)`` continues a run. The largest step already logged per
  metric key is read back, and steps at or below it are skipped, so a job restarted from a
  checkpoint logs each step once; params already logged with the same value are skipped, changed
  ones are kept as they were and listed in the tag ``params_changed_on_resume``.
- **Hygiene**: params are flattened to dotted keys, stringified and truncated to MLflow's limits;
  non-finite metric values are skipped and counted (``stats``).
- **What a stage read and made**: :meth:`Tracker.log_inputs` records the datasets it read
  (:mod:`llmrl.tracking.datasets`), :meth:`Tracker.log_model` uploads its final model once and
  registers it (:mod:`llmrl.tracking.models`). Neither is spooled: while the server is away they
  are skipped with a warning (the checkpoint stays on disk).
"""

from __future__ import annotations

import logging
import math
import os
import posixpath
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from llmrl.core.faults import fault_point
from llmrl.tracking.connection import RunLink
from llmrl.tracking.datasets import DatasetRef, send_inputs
from llmrl.tracking.models import log_model_dir
from llmrl.tracking.plots import render_reward_curve
from llmrl.tracking.spool import (
    MAX_PARAM_VAL_LENGTH,
    MAX_TAG_VAL_LENGTH,
    PARAMS_CHANGED_TAG,
    send_metrics,
    send_params,
    send_tags,
)

logger = logging.getLogger("llmrl.tracking")

PARENT_RUN_ENV = "MLFLOW_PARENT_RUN_ID"
SPOOL_DIR_ENV = "LLMRL_MLFLOW_SPOOL"
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")
_MAX_KEY_LENGTH = 250


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else a SQLite file ``mlflow.db`` in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def default_spool_dir() -> Path:
    """``$LLMRL_MLFLOW_SPOOL``, else ``.mlflow-spool`` in the working directory."""
    return Path(os.environ.get(SPOOL_DIR_ENV) or Path.cwd() / ".mlflow-spool")


def sanitize_key(key: Any) -> str:
    """A valid MLflow param/metric/tag key: odd characters become ``_``, at most 250 chars."""
    return _BAD_KEY_CHARS.sub("_", str(key))[:_MAX_KEY_LENGTH]


def storable_value(value: Any, limit: int) -> str:
    """``value`` as text every MLflow store keeps: NUL characters written as ``\\x00``
    (PostgreSQL's text columns refuse them, and MLflow then rejects the whole batch), cut at
    ``limit`` characters (``MAX_PARAM_VAL_LENGTH``, ``MAX_TAG_VAL_LENGTH``)."""
    return str(value).replace("\x00", "\\x00")[:limit]


def _as_mapping(obj: Any) -> Mapping | None:
    if isinstance(obj, Mapping):
        return obj
    if callable(getattr(obj, "model_dump", None)):  # pydantic models (the llmrl configs)
        return obj.model_dump()
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return None


def flatten_params(params: Any, prefix: str = "") -> dict[str, str]:
    """Nested mappings (dicts, pydantic models, dataclasses) -> ``{"a.b": "value"}``.

    Values are stringified (:func:`storable_value`: NUL as ``\\x00``) and truncated to
    MLflow's 6000-character limit; an empty mapping
    becomes ``"{}"``. ``{"loss": {"clip_epsilon": 0.2}}`` -> ``{"loss.clip_epsilon": "0.2"}``.
    """
    mapping = _as_mapping(params)
    if mapping is None:
        raise TypeError(f"params must be a mapping, got {type(params).__name__}")
    out: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        nested = _as_mapping(value)
        if nested:
            out.update(flatten_params(nested, name))
        else:
            out[sanitize_key(name)] = storable_value(value, MAX_PARAM_VAL_LENGTH)
    return out


def _table_columns(rows: list[dict]) -> dict[str, list]:
    """Rows -> columns (keys in first-seen order, missing cells None, odd values as str)."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(map(str, row)))
    plain = (str, int, float, bool, type(None))
    return {k: [v if isinstance(v := row.get(k), plain) else str(v) for row in rows] for k in keys}


class Tracker:
    """One MLflow run for one pipeline stage (see the module docstring for the guarantees).

    Example::

        with Tracker("grpo", tracking_uri="http://mlflow:5000", tags={"model": "smollm2"}) as t:
            t.log_params(config.model_dump())  # -> "loss.clip_epsilon", ...
            for step in range(t.last_step + 1, n_steps):
                t.log_metrics({"reward/mean": r, "loss": loss}, step=step)
                t.log_table(samples, "generations", step=step)
            t.log_checkpoint(ckpt_dir, step=step)

    ``Tracker(..., run_id=old_id)`` resumes; ``parent_run_id`` (default ``$MLFLOW_PARENT_RUN_ID``)
    nests the run under a flow's run. ``enabled=False`` makes every method a no-op (unit tests
    of training loops); ``run_id`` is then None. ``log_system_metrics=None`` turns MLflow's
    CPU/GPU/memory sampling on when ``psutil`` is installed (unless
    ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` says otherwise); it stops for good if the server
    goes away mid-run. ``log_checkpoint_files=False`` records checkpoint paths as tags only.
    The spool goes to ``spool_dir`` (default ``$LLMRL_MLFLOW_SPOOL``, else ``./.mlflow-spool``).
    """

    def __init__(
        self,
        stage: str,
        *,
        experiment: str = "llmrl",
        tracking_uri: str | None = None,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        run_id: str | None = None,
        spool_dir: str | Path | None = None,
        tags: dict | None = None,
        enabled: bool = True,
        retry_interval_s: float = 5.0,
        log_checkpoint_files: bool = True,
        log_system_metrics: bool | None = None,
        finish_attempts: int = 3,
    ) -> None:
        self.stage = stage
        self.enabled = enabled
        self.tracking_uri = tracking_uri or default_tracking_uri()
        if parent_run_id is None:
            parent_run_id = os.environ.get(PARENT_RUN_ENV) or None
        self.log_checkpoint_files = log_checkpoint_files
        self.finish_attempts = finish_attempts
        self.last_step = -1
        self.stats = {
            "skipped_nonfinite": 0,
            "skipped_invalid": 0,
            "skipped_duplicate_steps": 0,
            "spool_flushes": 0,
        }
        self._key_steps: dict[str, int] = {}  # largest step logged per metric key
        self._resume_floor = -1  # largest step the run had when resumed (tables at or below skip)
        self._params: dict[str, str] = {}
        self._changed_params: set[str] = set()
        self._started = self._finished = False
        clean_tags = {
            sanitize_key(k): storable_value(v, MAX_TAG_VAL_LENGTH) for k, v in (tags or {}).items()
        }
        self._link = RunLink(
            self.tracking_uri,
            stage=stage,
            create={
                "experiment": experiment,
                "run_name": run_name or stage,
                "tags": {"llmrl.stage": stage, **clean_tags},
                "parent_run_id": parent_run_id if parent_run_id != run_id else None,
            },
            run_id=run_id,
            spool_dir=Path(spool_dir) if spool_dir is not None else default_spool_dir(),
            retry_interval_s=retry_interval_s,
            log_system_metrics=log_system_metrics,
            on_resume=self._on_resume,
            stats=self.stats,
        )

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (None when disabled, or while the server was never reached)."""
        return self._link.run_id if self.enabled else None

    @property
    def spooled(self) -> int:
        """Metric records currently waiting in the spool."""
        return self._link.spooled

    @property
    def spool_dir(self) -> Path:
        """The folder of the spool (:func:`~llmrl.tracking.flush_spool` replays it)."""
        return self._link.spool_dir

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> str | None:
        """Create (or continue) the run and return its id (None when disabled or unreachable).

        When the server does not answer, a warning names the URI and the spool; logging goes on
        into the spool and the run is created when the server comes back. The first logging call
        starts the tracker if this was not called.
        """
        if self.enabled and not self._started:
            self._started = True
            self._link.connect()
        return self.run_id

    def finish(self, status: str = "FINISHED") -> None:
        """Replay the spool (up to ``finish_attempts`` tries) and end the run with ``status``.

        If the server is still unreachable the spool stays on disk with the final status, a
        warning says where and how to replay it (:func:`~llmrl.tracking.flush_spool`), and the
        run gets the tag ``llmrl.spool_path`` if the server takes it.
        """
        if self.enabled and self._started and not self._finished:
            self._link.close(status, self.finish_attempts)
        self._finished = True

    def __enter__(self) -> Tracker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.finish("FINISHED")
        else:
            self.finish("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")

    # ---------------------------------------------------------------- logging

    def log_params(self, params: dict) -> None:
        """Log ``params`` flattened (``"loss.clip_epsilon"``); each key once per run."""
        if not self._active():
            return
        flat = flatten_params(params)
        new = {k: v for k, v in flat.items() if k not in self._params}
        changed = {k for k, v in flat.items() if k in self._params and self._params[k] != v}
        if changed - self._changed_params:
            self._changed_params |= changed
            logger.warning(
                "stage %r: params changed, kept the logged values: %s", self.stage, sorted(changed)
            )
            self.set_tags({PARAMS_CHANGED_TAG: ",".join(sorted(self._changed_params))})
        if not new:
            return
        self._params.update(new)
        if self._link.ready():
            try:
                send_params(self._link.client, self.run_id, new)
                return
            except Exception as e:
                if not self._link.failed(e, "params"):
                    return
        self._link.spool().update("params", new)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` in one batch, skipping non-finite and already-logged ones.

        A key is skipped at a step at or below the largest step already logged for it (resume).
        """
        if not self._active():
            return
        step = int(step)
        now = int(time.time() * 1000)
        records = []
        for raw_key, value in metrics.items():
            key = sanitize_key(raw_key)
            try:
                v = float(value)
            except (TypeError, ValueError):
                self.stats["skipped_invalid"] += 1
                logger.debug("metric %s=%r at step %d is not a number; skipped", key, value, step)
                continue
            if not math.isfinite(v):
                if self.stats["skipped_nonfinite"] == 0:
                    logger.warning(
                        "stage %r: non-finite %s=%s at step %d skipped (counted in "
                        "stats['skipped_nonfinite'])",
                        self.stage,
                        key,
                        v,
                        step,
                    )
                self.stats["skipped_nonfinite"] += 1
                continue
            if step <= self._key_steps.get(key, -1):
                self.stats["skipped_duplicate_steps"] += 1
                continue
            self._key_steps[key] = step
            records.append({"run_id": None, "key": key, "value": v, "step": step, "timestamp": now})
        if records:
            self.last_step = max(self.last_step, step)
        if self._link.ready() and records:
            try:
                send_metrics(self._link.client, self.run_id, records)
                fault_point("log_metrics", step)  # crash tests: sent, the caller goes on
                return
            except Exception as e:
                if not self._link.failed(e, "metrics"):
                    return
        if records:
            for r in records:  # lines spooled before the run was opened name no run
                r["run_id"] = self.run_id if self._link.opened else None
            self._link.spool().append(records)

    def log_table(self, rows: list[dict], name: str, step: int) -> None:
        """Log sample generations as ``samples/{name}_step{step:06d}.json`` (an MLflow table).

        Skipped on resume for steps the run already had.
        """
        if not self._active() or not rows:
            return
        if step <= self._resume_floor:
            self.stats["skipped_duplicate_steps"] += 1
            return
        artifact_file = f"samples/{name}_step{int(step):06d}.json"
        columns = _table_columns(rows)
        if self._link.ready():
            try:
                self._link.client.log_table(self.run_id, data=columns, artifact_file=artifact_file)
                return
            except Exception as e:
                if not self._link.failed(e, f"table {artifact_file}"):
                    return
        import pandas as pd

        spool = self._link.spool()
        spool.files_dir.mkdir(parents=True, exist_ok=True)
        local = spool.files_dir / f"{uuid.uuid4().hex[:8]}-{Path(artifact_file).name}"
        pd.DataFrame(columns).to_json(local, orient="split", index=False)
        spool.add_artifact("table", local, artifact_file)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file, or a directory's contents, under ``artifact_path``."""
        if self._active():
            self._upload(Path(path), artifact_path, ephemeral=False)

    def log_checkpoint(self, path: str | Path, step: int) -> None:
        """Tag ``checkpoint.step-XXXXXX`` = local path; upload it under ``checkpoints/step-XXXXXX``.

        The upload is skipped with ``log_checkpoint_files=False`` (large models).
        """
        if not self._active():
            return
        label = f"step-{int(step):06d}"
        self.set_tags({f"checkpoint.{label}": str(Path(path).resolve())})
        if self.log_checkpoint_files:
            self._upload(Path(path), f"checkpoints/{label}", ephemeral=False)

    def log_reward_curve(
        self, history: dict[str, list[tuple[int, float]]], name: str = "reward_curve.png"
    ) -> None:
        """Draw ``{series: [(step, value), ...]}`` as a PNG and log it as artifact ``name``."""
        if not self._active():
            return
        with tempfile.TemporaryDirectory(prefix="llmrl-plot-") as tmp:
            try:
                png = render_reward_curve(history, Path(tmp) / posixpath.basename(name))
            except Exception as e:  # a plot is never worth a crash
                logger.warning("reward curve %s not drawn: %s", name, e)
                return
            self._upload(png, posixpath.dirname(name) or None, ephemeral=True)

    def log_inputs(self, refs: list[DatasetRef]) -> None:
        """Log the datasets the stage read as the run's inputs
        (:mod:`llmrl.tracking.datasets`). Not spooled: while the server is away they are
        skipped, with a warning."""
        if not self._active() or not refs:
            return
        if self._link.ready():
            try:
                send_inputs(self._link.client, self.run_id, refs)
                return
            except Exception as e:
                self._link.failed(e, "dataset inputs")
        logger.warning("stage %r: dataset inputs not logged (MLflow away)", self.stage)

    def log_model(self, model_dir: str | Path, registered_model: str) -> str | None:
        """Upload the model directory ``model_dir`` as the run's logged model and register it
        as a version of ``registered_model`` (:mod:`llmrl.tracking.models`); return
        ``"<name>/<version>"``, or None when it could not be (a warning says why: the
        checkpoint stays on disk, named in the tag ``llmrl.checkpoint``)."""
        if not self._active():
            return None
        if self._link.ready():
            try:
                version = log_model_dir(
                    self._link.client, self.run_id, model_dir, self.stage, registered_model
                )
            except Exception as e:
                self._link.failed(e, f"model {model_dir}")
            else:
                label = f"{version.name}/{version.version}"
                self.set_tags({"llmrl.registered_model": label})
                return label
        logger.warning("stage %r: model %s not registered in MLflow", self.stage, model_dir)
        self.set_tags({"llmrl.checkpoint": str(Path(model_dir).resolve())})
        return None

    def set_tags(self, tags: dict) -> None:
        """Set run tags (values stringified, truncated to 8000 chars, NUL written as ``\\x00``)."""
        if not self._active():
            return
        clean = {sanitize_key(k): storable_value(v, MAX_TAG_VAL_LENGTH) for k, v in tags.items()}
        if self._link.ready():
            try:
                send_tags(self._link.client, self.run_id, clean)
                return
            except Exception as e:
                if not self._link.failed(e, "tags"):
                    return
        self._link.spool().update("tags", clean)

    # ---------------------------------------------------------------- internals

    def _active(self) -> bool:
        if not self.enabled or self._finished:
            return False
        if not self._started:
            self.start()
        return True

    def _on_resume(self, params: dict[str, str], steps: dict[str, int]) -> None:
        """What the resumed run already holds: later logging skips it."""
        self._params = {**params, **self._params}
        for key, s in steps.items():
            self._key_steps[key] = max(self._key_steps.get(key, -1), s)
        self._resume_floor = max(steps.values(), default=-1)
        self.last_step = max(self.last_step, self._resume_floor)

    def _upload(self, local: Path, artifact_path: str | None, *, ephemeral: bool) -> None:
        if not local.exists():
            logger.warning("artifact %s does not exist; not logged", local)
            return
        if self._link.ready():
            try:
                if local.is_dir():
                    self._link.client.log_artifacts(self.run_id, str(local), artifact_path)
                else:
                    self._link.client.log_artifact(self.run_id, str(local), artifact_path)
                return
            except Exception as e:
                if not self._link.failed(e, f"artifact {local}"):
                    return
        spool = self._link.spool()
        if ephemeral:  # a temporary file: keep a copy until it is uploaded
            keep = spool.files_dir / uuid.uuid4().hex[:8] / local.name
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(local, keep)
            local = keep
        spool.add_artifact("path", local.resolve(), artifact_path)
