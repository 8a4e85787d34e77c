"""Waiting for one stage run on Kubernetes: list its Job or RayJob, then watch it from there, and
check its pods after every event and at least every ``watch_window_s``.

- :class:`RunWatcher` ends with the run's :class:`~flows.launchers.k8s_status.Outcome` once the
  Job's conditions or the RayJob's status say it ended. A pod problem fails the stage at once
  (``ImagePullBackOff``, ``ErrImagePull``, ``CrashLoopBackOff``, ``OOMKilled``, ...), and so
  does ``Unschedulable`` once it lasts ``unschedulable_timeout_s``. API errors 429/5xx and an
  unreachable API are retried (list again, then watch) for ``api_retry_s``, then raised.
- :class:`LogFollower` streams the driver pods' logs into the task's logger, for the user to
  see (a failure's message ends with the last lines); nothing is parsed from them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from flows.launchers.base import StageFailedError, TransientStageError, tail_text
from flows.launchers.k8s_objects import StageObjects
from flows.launchers.k8s_status import (
    DRIVER_ROLES,
    HINTS,
    Outcome,
    drivers,
    outcome_of,
    pod_problem,
)
from flows.launchers.manifests import LABEL_ROLE, LABEL_RUN


class LogFollower:
    """Streams the logs of a run's driver pods (one thread each) into its logger; keeps the last
    ``keep`` lines in :attr:`lines`."""

    def __init__(self, objects: StageObjects, *, keep: int = 2000) -> None:
        self.objects = objects
        self.lines: deque[str] = deque(maxlen=keep)
        self._threads: dict[str, threading.Thread] = {}

    def follow_new(self, pods: list[dict[str, Any]]) -> None:
        """Start following every started driver pod not followed yet."""
        for pod in pods:
            name = pod["metadata"]["name"]
            role = (pod["metadata"].get("labels") or {}).get(LABEL_ROLE)
            phase = (pod.get("status") or {}).get("phase")
            started = phase in ("Running", "Succeeded", "Failed")
            if role in DRIVER_ROLES and started and name not in self._threads:
                self._threads[name] = self._start(name)

    def join(self, timeout: float = 10.0) -> None:
        """Wait (up to ``timeout`` each) for the streams to end: the run's pods have ended."""
        for thread in self._threads.values():
            thread.join(timeout=timeout)

    def tail(self, pods: list[Mapping[str, Any]], count: int = 20) -> str:
        """The last ``count`` lines of the newest driver pod's whole log (the followed lines
        when it cannot be read)."""
        newest = drivers(pods)[-1:]
        lines = self._read(newest[0]["metadata"]["name"]) if newest else []
        return tail_text(lines or list(self.lines), count)

    def _read(self, pod_name: str) -> list[str]:
        objects = self.objects
        try:
            text = objects.core.read_namespaced_pod_log(pod_name, objects.namespace)
        except Exception as error:  # fall back to the followed lines
            objects.logger.warning(
                "%s: could not read %s's log: %s", objects.label, pod_name, error
            )
            return []
        return str(text).splitlines()

    def _start(self, pod_name: str) -> threading.Thread:
        from kubernetes import watch

        objects = self.objects

        def follow() -> None:
            try:
                stream = watch.Watch().stream(
                    objects.core.read_namespaced_pod_log, name=pod_name, namespace=objects.namespace
                )
                for line in stream:
                    self.lines.append(line)
                    if line.strip():
                        objects.logger.info("[%s] %s", objects.label, line)
            except Exception as error:  # the log is only shown: a broken stream is no failure
                objects.logger.debug(
                    "%s: log stream of %s ended: %s", objects.label, pod_name, error
                )

        thread = threading.Thread(target=follow, name=f"log-{pod_name}", daemon=True)
        thread.start()
        return thread


class RunWatcher:
    """Waits for one run (its :class:`StageObjects`) to end; see the module docstring."""

    def __init__(self, objects: StageObjects, *, follower: LogFollower) -> None:
        self.objects, self.follower = objects, follower
        self.settings = objects.settings
        self._unschedulable_since: dict[str, float] = {}

    def wait(self) -> Outcome:
        """Watch until the run ends: its outcome (``succeeded`` or ``failed``).

        Raises:
            StageFailedError: a pod cannot work, or the Job/RayJob was deleted.
            TransientStageError: the API kept failing for ``api_retry_s``.
        """
        resource_version: str | None = None
        failing_since: float | None = None
        while True:
            try:
                outcome, resource_version = self._watch_window(resource_version)
                if outcome is not None:
                    return outcome
                failing_since = None
            except TransientStageError as error:
                resource_version = None  # list again: the watch may have missed events
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > self.settings.api_retry_s:
                    raise
                self.objects.logger.warning(
                    "%s: %s; watching again", self.objects.label, error.message
                )
                time.sleep(min(5.0, self.settings.watch_window_s))

    def _watch_window(self, resource_version: str | None) -> tuple[Outcome | None, str | None]:
        """List the object (when ``resource_version`` is None), then watch it for one window:
        the outcome if the run ended (else None), and the resource version to go on from."""
        from kubernetes import watch

        objects = self.objects
        list_function, selection = objects.list_call()
        with objects.api_errors(f"watching the {objects.kind}"):
            if not resource_version:  # list, then watch from there
                obj = self._current(list_function, selection)
                resource_version = obj["metadata"].get("resourceVersion")
                outcome = self._outcome(obj)
                if outcome.state != "running":
                    return outcome, resource_version
            events = watch.Watch().stream(
                list_function, resource_version=resource_version,
                timeout_seconds=self.settings.watch_window_s, **selection,
            )  # fmt: skip
            for event in events:
                if event["type"] == "DELETED":
                    raise StageFailedError(objects.label, f"{objects.name} was deleted")
                obj = event["raw_object"]
                resource_version = (obj.get("metadata") or {}).get("resourceVersion")
                outcome = self._outcome(obj)
                if outcome.state != "running":
                    return outcome, resource_version
            self.check_pods()
        return None, resource_version

    def _outcome(self, obj: Mapping[str, Any]) -> Outcome:
        """The run's outcome as ``obj`` (its Job or RayJob) says, with its pods checked."""
        state, message = outcome_of(self.objects.kind, obj)
        return Outcome(state, message, self.check_pods())

    def _current(self, list_function: Any, selection: dict[str, Any]) -> dict[str, Any]:
        """The run's Job or RayJob as it is now. A watch only reports changes, so one started
        after the object was deleted (e.g. garbage-collected with the flow-run pod) would wait
        forever: an object that is gone fails the stage here."""
        response = list_function(**selection, _preload_content=False)
        items = json.loads(response.data).get("items") or []
        if not items:
            raise StageFailedError(self.objects.label, f"{self.objects.name} was deleted")
        return items[0]

    def check_pods(self) -> list[dict[str, Any]]:
        """List the run's pods; raise on a fatal pod problem; follow new driver pods' logs."""
        pods = self.objects.list_pods(f"{LABEL_RUN}={self.objects.name}")
        now = time.monotonic()
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            problem = pod_problem(pod)
            if problem is None:
                self._unschedulable_since.pop(pod_name, None)
                continue
            if problem[0] == "Unschedulable":
                first = self._unschedulable_since.setdefault(pod_name, now)
                if now - first < self.settings.unschedulable_timeout_s:
                    continue
            raise StageFailedError(self.objects.label, self._explain(*problem))
        self.follower.follow_new(pods)
        return pods

    def _explain(self, reason: str, description: str) -> str:
        """A pod problem's description, its hint, and the last lines of the driver's log."""
        hint = HINTS.get(reason)
        tail = tail_text(self.follower.lines, 10)
        text = f"{description} ({hint})" if hint else description
        return f"{text}\nlast log lines:\n{tail}" if tail else text
