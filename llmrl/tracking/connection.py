"""`RunLink`: a tracker's connection to its MLflow run, and what happens when it breaks.

It owns the ``MlflowClient``, opens the run (creates it, or continues a given run id and reports
what that run already holds), notices outages and spools while they last:

- a failed call with a connection error marks the server *down*: the caller spools, and the next
  attempt happens only after ``retry_interval_s`` (doubling, up to 60 s, while it keeps failing),
  so a dead server costs one failed request per interval, not one timeout per training step;
- :meth:`RunLink.ready` is called before every send: when a retry is due it opens the run if
  that never happened (server away at start) and replays the spool, so data keeps its order;
- an error that is not about the connection (MLflow rejected the data) is logged and the data
  dropped, or for a replay the spool is moved aside, so bad data never blocks the link.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmrl.tracking.client import configure_client_env, server_problem
from llmrl.tracking.spool import (
    Spool,
    create_run,
    is_transient,
    latest_steps,
    replay,
    send_tags,
)

logger = logging.getLogger("llmrl.tracking")

MAX_RETRY_DELAY_S = 60.0

_LEFT_BEHIND: list[Path] = []


def left_spools() -> list[Path]:
    """The spool metric files (``<base>.jsonl``) that runs of this process left on disk because
    the server was still away when they finished, in order (the CLI names them in its summary;
    :func:`~llmrl.tracking.flush_spool` replays them)."""
    return list(_LEFT_BEHIND)


class RunLink:
    """The connection of one tracker to one run (see the module docstring).

    ``create`` is how to create the run (``experiment``, ``run_name``, ``tags``,
    ``parent_run_id``); ``run_id`` continues an existing run instead, and then ``on_resume`` gets
    its params and the largest step logged per metric key. ``stats["spool_flushes"]`` counts
    successful replays.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        stage: str,
        create: dict[str, Any],
        run_id: str | None,
        spool_dir: Path,
        retry_interval_s: float,
        log_system_metrics: bool | None,
        on_resume: Callable[[dict[str, str], dict[str, int]], None],
        stats: dict[str, int],
    ) -> None:
        self.tracking_uri = tracking_uri
        self.stage = stage
        self.create = create
        self.run_id = run_id
        self.spool_dir = spool_dir
        self.retry_interval_s = retry_interval_s
        self.log_system_metrics = log_system_metrics
        self.on_resume = on_resume
        self.stats = stats
        self.client: Any = None
        self.opened = False
        self.down = False
        self._retry_at = 0.0
        self._delay = retry_interval_s
        self._spool: Spool | None = None
        self._monitor: Any = None

    def connect(self) -> None:
        """Make the client, check the server answers and open the run (or warn and spool)."""
        configure_client_env(self.tracking_uri)
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        if self.run_id:  # leftovers of an earlier process of this run are replayed first
            leftover = Spool(self.spool_dir / self.run_id)
            if not leftover.empty:
                self._spool = leftover
        problem = server_problem(self.tracking_uri)
        if problem is None:
            self.ready(force=True)
        else:
            self._mark_down(problem)

    def ready(self, force: bool = False) -> bool:
        """Open the run and replay the spool when needed; True when sending directly is fine.

        While the server is down this returns False at once until a retry is due (or ``force``).
        """
        if self.down and not force and time.monotonic() < self._retry_at:
            return False
        try:
            if not self.opened:
                self._open()
            if self._spool is not None and not self._spool.empty:
                _, sent = replay(self.client, self._spool, self.run_id)
                self.stats["spool_flushes"] += 1
                logger.info("replayed %d spooled metric records into run %s", sent, self.run_id)
        except Exception as e:  # never raise for the tracking server
            if is_transient(e):
                self._mark_down(e)
                return False
            if not self.opened:
                logger.warning(
                    "cannot open an MLflow run at %s (%s); stage %r logs into the spool %s only",
                    self.tracking_uri,
                    e,
                    self.stage,
                    self.spool_base(),
                )
                self.down, self._retry_at = True, math.inf
                return False
            moved = self._spool.quarantine() if self._spool is not None else None
            logger.warning(
                "MLflow at %s rejected the spool of run %s (%s); moved it to %s",
                self.tracking_uri,
                self.run_id,
                e,
                moved,
            )
        if self.down:
            logger.warning("MLflow tracking server %s is reachable again", self.tracking_uri)
        self.down = False
        return True

    def failed(self, exc: Exception, what: str) -> bool:
        """After a failed send: True means the server is away (spool it), False that MLflow
        rejected ``what`` (it is dropped, with a warning)."""
        if is_transient(exc):
            self._mark_down(exc)
            return True
        logger.warning(
            "MLflow at %s rejected %s of run %s: %s", self.tracking_uri, what, self.run_id, exc
        )
        return False

    @property
    def spooled(self) -> int:
        """Metric records waiting in the spool."""
        return self._spool.count if self._spool is not None else 0

    def spool_base(self) -> Path:
        """Where this run's spool lives (named on first use, files written when needed)."""
        if self._spool is None:
            stage = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.stage)
            name = self.run_id or f"pending-{stage}-{uuid.uuid4().hex[:12]}"
            self._spool = Spool(self.spool_dir / name)
        return self._spool.base

    def spool(self) -> Spool:
        """This run's spool, its meta naming the run (or how to create it) for a later replay."""
        self.spool_base()
        assert self._spool is not None
        meta = self._spool.meta
        ident = {"run_id": self.run_id} if self.run_id else {"create": self.create}
        if any(meta.get(k) != v for k, v in ident.items()):
            meta.update(ident)
            self._spool.save_meta()
        return self._spool

    def close(self, status: str, attempts: int) -> None:
        """Stop system metrics, replay the spool (``attempts`` tries) and end the run.

        When the server stays away, the spool keeps the final status and a warning says where
        it is and how to replay it.
        """
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        for attempt in range(max(1, attempts)):
            if attempt:
                time.sleep(self.retry_interval_s)
            if self.ready(force=True) and self._terminate(status):
                if self._spool is not None:
                    self._spool.clear()
                return
        spool = self.spool()
        spool.meta["status"] = status
        spool.save_meta()
        _LEFT_BEHIND.append(spool.metrics_path)
        logger.warning(
            "MLflow tracking server %s unreachable at the end of stage %r (run %s): %d metric "
            "records and the final status stay in the spool %s; replay them with "
            "llmrl.tracking.flush_spool(%r, %r)",
            self.tracking_uri,
            self.stage,
            self.run_id,
            spool.count,
            spool.base,
            str(self.spool_dir),
            self.tracking_uri,
        )
        if self.opened:
            try:  # best effort: the server is most likely away
                self.client.set_tag(self.run_id, "llmrl.spool_path", str(spool.base))
            except Exception as e:
                logger.debug("spool path tag not set: %s", e)

    def _terminate(self, status: str) -> bool:
        try:
            self.client.set_terminated(self.run_id, status)
        except Exception as e:  # never raise for the tracking server
            return not self.failed(e, "the final status")
        return True

    def _mark_down(self, reason: object) -> None:
        if not self.down:
            self._delay = self.retry_interval_s
            text = str(reason).splitlines()[0][:300] if str(reason) else type(reason).__name__
            logger.warning(
                "MLflow tracking server %s is unreachable (%s); stage %r keeps logging into the "
                "spool %s and retries every %.0f s or more",
                self.tracking_uri,
                text,
                self.stage,
                self.spool_base(),
                self.retry_interval_s,
            )
        else:
            self._delay = min(self._delay * 2, max(self.retry_interval_s, MAX_RETRY_DELAY_S))
        self.down = True
        self._retry_at = time.monotonic() + self._delay

    def _open(self) -> None:
        """Continue ``run_id`` (reporting its params and steps) or create the run."""
        from mlflow.exceptions import MlflowException

        resumed = False
        if self.run_id:
            try:
                run = self.client.get_run(self.run_id)
            except MlflowException as e:
                if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                logger.warning(
                    "run %s not found at %s; stage %r starts a new run",
                    self.run_id,
                    self.tracking_uri,
                    self.stage,
                )
                self.create["tags"]["llmrl.resume_missing_run"] = self.run_id
                self.run_id = None
            else:
                resumed = True
                if run.info.status != "RUNNING":
                    self.client.update_run(self.run_id, status="RUNNING")
                self._adopt(run)
                steps = latest_steps(self.client, self.run_id)
                own = {k: s for k, s in steps.items() if not k.startswith("system/")}
                self.on_resume(dict(run.data.params), own)
        if self.run_id is None:
            self.run_id = create_run(self.client, **self.create)
        self.opened = True
        if self._spool is not None:
            self._spool.meta.pop("create", None)
            self._spool.meta["run_id"] = self.run_id
            if self._spool.meta_path.exists():
                self._spool.save_meta()
        self._start_system_metrics(resumed)

    def _adopt(self, run: Any) -> None:
        """Nest a continued run under this process's parent run (a re-run pipeline resumes a
        stage of its killed predecessor), naming the parent it had in
        ``llmrl.previous_parent_run_id``."""
        parent = self.create.get("parent_run_id")
        previous = run.data.tags.get("mlflow.parentRunId")
        if parent and previous != parent:
            tags = {"mlflow.parentRunId": parent}
            if previous:
                tags["llmrl.previous_parent_run_id"] = previous
            send_tags(self.client, self.run_id, tags)

    def _start_system_metrics(self, resumed: bool) -> None:
        want = self.log_system_metrics
        if want is None:
            env = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING")
            if env is not None:
                want = env.strip().lower() in ("1", "true", "yes")
            else:
                want = importlib.util.find_spec("psutil") is not None
        if not want:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(
                self.run_id, resume_logging=resumed, tracking_uri=self.tracking_uri
            )
            self._monitor.start()
        except Exception as e:  # optional
            logger.info("system metrics logging off: %s", e)
            self._monitor = None
