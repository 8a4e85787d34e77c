"""Run a stage on Kubernetes: a KubeRay ``RayJob`` for the GPU stages (``sft``, ``grpo``), a
plain ``batch/v1`` ``Job`` for the one-pod stages (``prepare``, ``eval``).

For one stage run, :class:`KubernetesLauncher`:

1. creates a ConfigMap with the stage's config file, mounted at ``/etc/llmrl/<stage>.yaml``;
2. creates the Job or RayJob (built by :mod:`flows.launchers.manifests`) and makes it the
   ConfigMap's owner, so deleting it removes the ConfigMap too;
3. watches it until it succeeds or fails. After every watch event, and at least every
   ``watch_window_s``, it lists the run's pods: ``ImagePullBackOff``, ``ErrImagePull``,
   ``CrashLoopBackOff``, ``OOMKilled`` fail the stage at once with the pod's reason, and so does
   ``Unschedulable`` (condition ``PodScheduled=False``) once it lasts
   ``unschedulable_timeout_s``. The driver pod's log is followed into the task's logger;
4. reads the summary from the driver's log: its last JSON line (``prepare``: its last line).

When the task is cancelled it deletes what it created; after a failure too, unless
``delete_on_failure`` is off. After a success ``ttlSecondsAfterFinished`` cleans up. API errors
429/5xx and an unreachable API are :class:`TransientStageError` (the flow retries); while
watching, they are retried in place for ``api_retry_s`` first. ``kubernetes`` is imported only
when a launcher talks to a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from flows.launchers.base import (
    StageConfigError,
    StageError,
    StageFailedError,
    StageResult,
    TransientStageError,
    parse_summary,
    stage_logger,
    tail_text,
)
from flows.launchers.k8s_status import (
    HINTS,
    job_outcome,
    pod_exit_code,
    pod_problem,
    rayjob_outcome,
)
from flows.launchers.manifests import (
    LABEL_FLOW_RUN,
    LABEL_ROLE,
    LABEL_RUN,
    RAY_STAGES,
    build_config_map,
    build_job_manifest,
    build_rayjob_manifest,
    job_resources,
    owner_reference,
    requested_gpus,
    resource_name,
)
from flows.launchers.settings import KubernetesSettings, effective_settings

if TYPE_CHECKING:
    from llmrl.topology import SchedulingSpec, Topology

DRIVER_ROLES = ("job", "driver")
TRANSIENT_STATUSES = frozenset({0, 429, 500, 502, 503, 504})
STRICT = "Strict"
"""fieldValidation of every write: an unknown or duplicate field is an error, not dropped."""
# ------------------------------------------------------------------------ the launcher


class KubernetesLauncher:
    """Runs stages as Kubernetes Jobs and KubeRay RayJobs and waits for them.

    ``api_client`` is a ``kubernetes.client.ApiClient`` (default: in-cluster config, else
    ``~/.kube/config``); ``topology`` defaults to ``settings.topology``'s file, else
    ``Topology()``.

    Example::

        launcher = KubernetesLauncher(KubernetesSettings(namespace="llmrl", image="llmrl:0.1"))
        result = launcher.run("sft", "configs/sft.yaml", ["steps=100"], env={...}, name="sft")
    """

    def __init__(
        self,
        settings: KubernetesSettings | None = None,
        *,
        api_client: Any = None,
        topology: Topology | None = None,
        flow_run_id: str | None = None,
    ) -> None:
        try:
            self.settings = effective_settings(settings or KubernetesSettings())
        except ValueError as error:
            raise StageConfigError("kubernetes", str(error)) from None
        self._api_client = api_client
        self._topology = topology
        self._flow_run_id = flow_run_id

    # -- public

    def run(
        self,
        stage: str,
        config_path: str | Path | None,
        overrides: Sequence[str],
        env: Mapping[str, str],
        *,
        name: str | None = None,
    ) -> StageResult:
        """Run the stage on the cluster; see :meth:`flows.launchers.base.Launcher.run`."""
        label = name or stage
        logger = stage_logger()
        resource = resource_name(label)
        ray = stage in RAY_STAGES
        config_text = Path(config_path).read_text(encoding="utf-8") if config_path else None
        config_map = resource if config_text is not None else None
        flow_run_id = self.flow_run_id
        if ray:
            manifest = build_rayjob_manifest(
                stage, resource, self.settings, self.topology,
                overrides=overrides, env=env, config_map=config_map, flow_run_id=flow_run_id,
            )  # fmt: skip
        else:
            manifest = build_job_manifest(
                stage, resource, self.settings,
                overrides=overrides, env=env, config_map=config_map,
                scheduling=self._job_scheduling(stage),
                resources=job_resources(stage, self.settings, self.topology),
                flow_run_id=flow_run_id,
            )  # fmt: skip
        self._check_gpus(label, manifest)
        run = _Run(self, label, stage, resource, "rayjob" if ray else "job", logger)
        start = time.monotonic()
        try:
            if config_text is not None:
                run.create_config_map(config_text, flow_run_id)
            run.create(manifest)
            logger.info("%s: created %s %s/%s", label, manifest["kind"], run.namespace, resource)
            summary = run.wait()
            if ray:  # the Ray cluster is gone already (TTL 0); the RayJob and submitter go too
                run.delete()
        except StageError:
            if self.settings.delete_on_failure:
                run.delete()
            else:
                logger.warning("%s: kept %s/%s for inspection", label, run.kind, resource)
            raise
        except BaseException:
            logger.warning("%s: cancelled; deleting %s %s", label, run.kind, resource)
            run.delete()
            raise
        seconds = time.monotonic() - start
        logger.info("%s: finished in %.1f s", label, seconds)
        details = {"kind": manifest["kind"], "name": resource, "namespace": run.namespace}
        return StageResult(summary, tail_text(run.log_lines), seconds, details)

    @property
    def flow_run_id(self) -> str | None:
        """The Prefect flow run this launcher works for (label ``llmrl.io/flow-run``): the one
        given, else the current flow run's, else None."""
        if self._flow_run_id is None:
            try:
                from prefect.runtime import flow_run
            except ImportError:  # pragma: no cover - prefect is in the same extra as flows
                return None
            self._flow_run_id = flow_run.id or None
        return self._flow_run_id

    def _check_gpus(self, label: str, manifest: dict[str, Any]) -> None:
        """Refuse a stage that would ask for more GPUs than the topology has: the cluster is
        sized for the topology, so its pods would stay Unschedulable."""
        gpus, budget = requested_gpus(manifest), self.topology.total_gpus
        if gpus > budget:
            raise StageConfigError(
                label,
                f"the {manifest['kind']} requests {gpus} GPU(s) but the topology has {budget}; "
                "lower kubernetes.jobs.<stage>.gpus (or leave it null to follow the topology), "
                "or give the topology more GPUs",
            )

    @property
    def topology(self) -> Topology:
        """The topology RayJobs are built from (see :func:`load_topology`)."""
        if self._topology is None:
            self._topology = load_topology(self.settings.topology)
        return self._topology

    def _job_scheduling(self, stage: str) -> SchedulingSpec | None:
        """GPU jobs go where the trainer goes, CPU jobs where the env workers go."""
        gpus = job_resources(stage, self.settings, self.topology).gpus
        topology = self.topology
        return topology.trainer.scheduling if gpus else topology.env_workers.scheduling

    def api(self) -> Any:
        """The ``kubernetes.client.ApiClient`` (loaded from the environment on first use)."""
        if self._api_client is None:
            try:
                from kubernetes import client, config
            except ImportError as error:  # pragma: no cover - depends on the environment
                raise StageFailedError(
                    "kubernetes", "the kubernetes launcher needs `pip install 'llmrl[k8s]'`"
                ) from error
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as error:
                    raise StageFailedError(
                        "kubernetes",
                        f"no cluster to talk to: not in a pod, and no usable kubeconfig ({error})",
                    ) from None
            self._api_client = client.ApiClient()
        return self._api_client


def load_topology(path: str | None) -> Topology:
    """The :class:`~llmrl.topology.Topology` in ``path`` (a topology YAML, or a Helm values file
    with a ``topology`` section); without a path, ``$LLMRL_TOPOLOGY`` if that file exists (the
    work pool mounts the chart's topology ConfigMap there), else ``Topology()``.

    Raises:
        StageConfigError: the file is missing or is not a valid topology.
    """
    from pydantic import ValidationError

    from llmrl.config import ConfigError, load_config
    from llmrl.topology import Topology

    if not path:
        path = os.environ.get("LLMRL_TOPOLOGY")
        if not path or not Path(path).is_file():
            return Topology()
    if not Path(path).is_file():
        raise StageConfigError("topology", f"{path}: topology file does not exist")
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("topology"), dict):
            return Topology.model_validate(data["topology"])
        return load_config(Topology, path)
    except (ConfigError, ValidationError, yaml.YAMLError) as error:
        raise StageConfigError("topology", f"{path}: {error}") from None


def delete_flow_run_resources(
    settings: KubernetesSettings, flow_run_id: str, *, api_client: Any = None
) -> list[str]:
    """Delete every Job and RayJob a flow run launched (label ``llmrl.io/flow-run``); their pods
    and ConfigMaps go with them (garbage collection). The flow's cancellation and crash hooks
    call it; the owner reference to the flow-run pod covers a flow-run pod that was killed.

    Returns ``["<kind>/<name>", ...]`` of what was deleted. Errors are API errors, raised.
    """
    from kubernetes import client

    launcher = KubernetesLauncher(settings, api_client=api_client, flow_run_id=flow_run_id)
    api = launcher.api()
    namespace = launcher.settings.namespace
    selector = f"{LABEL_FLOW_RUN}={flow_run_id}"
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    deleted: list[str] = []
    rayjobs = custom.list_namespaced_custom_object(
        "ray.io", "v1", namespace, "rayjobs", label_selector=selector
    )
    for item in rayjobs.get("items") or []:
        name = item["metadata"]["name"]
        _ignore_missing(
            custom.delete_namespaced_custom_object,
            "ray.io", "v1", namespace, "rayjobs", name, propagation_policy="Background",
        )  # fmt: skip
        deleted.append(f"RayJob/{name}")
    for job in batch.list_namespaced_job(namespace, label_selector=selector).items:
        name = job.metadata.name
        _ignore_missing(
            batch.delete_namespaced_job, name, namespace, propagation_policy="Background"
        )
        deleted.append(f"Job/{name}")
    return deleted


def _ignore_missing(delete: Any, *args: Any, **kwargs: Any) -> None:
    """Call ``delete``; an object already gone (404) is what we wanted."""
    from kubernetes.client.exceptions import ApiException

    try:
        delete(*args, **kwargs)
    except ApiException as error:
        if error.status != 404:
            raise


class _Run:
    """One stage run on the cluster: what was created, its pods, its driver's log."""

    def __init__(
        self, launcher: KubernetesLauncher, label: str, stage: str, name: str, kind: str, logger
    ) -> None:
        from kubernetes import client

        self.settings = launcher.settings
        self.label, self.stage, self.name, self.kind, self.logger = label, stage, name, kind, logger
        self.namespace = self.settings.namespace
        api = launcher.api()
        self.core, self.batch = client.CoreV1Api(api), client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.created: list[str] = []  # "configmap" / "job" / "rayjob"
        self.owners: list[dict[str, Any]] = []  # the ConfigMap's owners besides its stage
        self.log_lines: deque[str] = deque(maxlen=2000)
        self._followed: dict[str, threading.Thread] = {}
        self._unschedulable_since: dict[str, float] = {}

    # -- creation and deletion

    def create_config_map(self, config_text: str, flow_run_id: str | None) -> None:
        body = build_config_map(self.name, self.namespace, self.stage, config_text, flow_run_id)
        self.owners = [owner_reference(self.settings)] if self.settings.owner_pod else []
        if self.owners:  # gone with the flow run even if the Job below is never created
            body["metadata"]["ownerReferences"] = list(self.owners)
        with self.api_errors("creating the ConfigMap"):
            self.core.create_namespaced_config_map(self.namespace, body, field_validation=STRICT)
        self.created.append("configmap")

    def create(self, manifest: dict[str, Any]) -> None:
        with self.api_errors(f"creating the {manifest['kind']}"):
            if self.kind == "rayjob":
                created = self.custom.create_namespaced_custom_object(
                    "ray.io", "v1", self.namespace, "rayjobs", manifest, field_validation=STRICT
                )
                uid = created["metadata"]["uid"]
            else:
                created = self.batch.create_namespaced_job(
                    self.namespace, manifest, field_validation=STRICT
                )
                uid = created.metadata.uid
        self.created.append(self.kind)
        if "configmap" in self.created:  # deleting the job deletes its config
            owner = {
                "apiVersion": manifest["apiVersion"],
                "kind": manifest["kind"],
                "name": self.name,
                "uid": uid,
            }
            patch = {"metadata": {"ownerReferences": [*self.owners, owner]}}
            with self.api_errors("adopting the ConfigMap"):
                self.core.patch_namespaced_config_map(
                    self.name, self.namespace, patch, field_validation=STRICT
                )

    def delete(self) -> None:
        """Delete what this run created (best effort: errors are logged, not raised)."""
        for what in reversed(self.created):
            try:
                if what == "rayjob":
                    self.custom.delete_namespaced_custom_object(
                        "ray.io", "v1", self.namespace, "rayjobs", self.name,
                        propagation_policy="Background",
                    )  # fmt: skip
                elif what == "job":
                    self.batch.delete_namespaced_job(
                        self.name, self.namespace, propagation_policy="Background"
                    )
                else:
                    self.core.delete_namespaced_config_map(self.name, self.namespace)
                self.logger.info("%s: deleted %s %s", self.label, what, self.name)
            except Exception as error:  # cleanup must not hide the real error
                if getattr(error, "status", None) != 404:
                    self.logger.warning("%s: could not delete %s: %s", self.label, what, error)
        self.created.clear()

    # -- waiting

    def wait(self) -> dict[str, Any]:
        """Watch until the run ends; the parsed summary, or a StageError."""
        from kubernetes import watch

        outcome_of = rayjob_outcome if self.kind == "rayjob" else job_outcome
        resource_version: str | None = None
        failing_since: float | None = None
        while True:
            try:
                with self.api_errors(f"watching the {self.kind}"):
                    kwargs = {
                        "namespace": self.namespace,
                        "field_selector": f"metadata.name={self.name}",
                    }
                    if not resource_version:  # list, then watch from there
                        obj = self._current(kwargs)
                        resource_version = obj["metadata"].get("resourceVersion")
                        state, message = outcome_of(obj)
                        pods = self.check_pods()
                        if state != "running":
                            return self.finish(state, message, pods)
                    kwargs["resource_version"] = resource_version
                    for event in watch.Watch().stream(
                        self._list_function(), timeout_seconds=self.settings.watch_window_s,
                        **self._list_args(), **kwargs,
                    ):  # fmt: skip
                        obj = event["raw_object"]
                        if event["type"] == "DELETED":
                            raise StageFailedError(self.label, f"{self.name} was deleted")
                        resource_version = (obj.get("metadata") or {}).get("resourceVersion")
                        state, message = outcome_of(obj)
                        pods = self.check_pods()
                        if state != "running":
                            return self.finish(state, message, pods)
                    self.check_pods()
                failing_since = None
            except TransientStageError as error:
                resource_version = None
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > self.settings.api_retry_s:
                    raise
                self.logger.warning("%s: %s; watching again", self.label, error.message)
                time.sleep(min(5.0, self.settings.watch_window_s))

    def _current(self, selection: dict[str, Any]) -> dict[str, Any]:
        """The run's Job or RayJob as it is now. A watch only reports changes, so one started
        after the object was deleted (e.g. garbage-collected with the flow-run pod) would wait
        forever: an object that is gone fails the stage here."""
        response = self._list_function()(**self._list_args(), **selection, _preload_content=False)
        items = json.loads(response.data).get("items") or []
        if not items:
            raise StageFailedError(self.label, f"{self.name} was deleted")
        return items[0]

    def _list_function(self) -> Any:
        if self.kind == "rayjob":
            return self.custom.list_namespaced_custom_object
        return self.batch.list_namespaced_job

    def _list_args(self) -> dict[str, Any]:
        if self.kind == "rayjob":
            return {"group": "ray.io", "version": "v1", "plural": "rayjobs"}
        return {}

    def check_pods(self) -> list[dict[str, Any]]:
        """List the run's pods; raise on a fatal pod problem; follow new driver pods' logs."""
        selector = f"{LABEL_RUN}={self.name}"
        with self.api_errors("listing pods"):
            response = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _preload_content=False
            )
            pods = json.loads(response.data).get("items") or []
        now = time.monotonic()
        for pod in pods:
            pod_name = pod["metadata"]["name"]
            problem = pod_problem(pod)
            if problem and problem[0] == "Unschedulable":
                first = self._unschedulable_since.setdefault(pod_name, now)
                if now - first < self.settings.unschedulable_timeout_s:
                    continue
            elif problem is None:
                self._unschedulable_since.pop(pod_name, None)
            if problem:
                reason, description = problem
                raise StageFailedError(self.label, self._explain(reason, description))
            role = (pod["metadata"].get("labels") or {}).get(LABEL_ROLE)
            phase = (pod.get("status") or {}).get("phase")
            started = phase in ("Running", "Succeeded", "Failed")
            if role in DRIVER_ROLES and started and pod_name not in self._followed:
                self._followed[pod_name] = self._follow(pod_name)
        return pods

    def finish(self, state: str, message: str, pods: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary of a succeeded run, or the error of a failed one."""
        for thread in self._followed.values():
            thread.join(timeout=10)
        drivers = [
            p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) in DRIVER_ROLES
        ]
        drivers.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
        lines = self._driver_log(drivers[-1]["metadata"]["name"]) if drivers else []
        lines = lines or list(self.log_lines)
        if state == "succeeded":
            return parse_summary(self.stage, lines)
        tail = tail_text(lines) or "(no log)"
        exit_code = pod_exit_code(drivers[-1]) if drivers and self.kind == "job" else None
        if exit_code == 2 or re.search(r"exit code 2\b", message):
            raise StageConfigError(self.label, f"bad config or data (exit code 2):\n{tail}")
        raise StageFailedError(self.label, f"{message}\n{tail}")

    def _explain(self, reason: str, description: str) -> str:
        hint = HINTS.get(reason)
        tail = tail_text(self.log_lines, 10)
        text = f"{description} ({hint})" if hint else description
        return f"{text}\nlast log lines:\n{tail}" if tail else text

    def _driver_log(self, pod_name: str) -> list[str]:
        try:
            text = self.core.read_namespaced_pod_log(pod_name, self.namespace)
        except Exception as error:  # fall back to the followed lines
            self.logger.warning("%s: could not read %s's log: %s", self.label, pod_name, error)
            return []
        return str(text).splitlines()

    def _follow(self, pod_name: str) -> threading.Thread:
        """A thread streaming a pod's log lines into the logger and ``log_lines``."""
        from kubernetes import watch

        def follow() -> None:
            try:
                stream = watch.Watch().stream(
                    self.core.read_namespaced_pod_log, name=pod_name, namespace=self.namespace
                )
                for line in stream:
                    self.log_lines.append(line)
                    if line.strip():
                        self.logger.info("[%s] %s", self.label, line)
            except Exception as error:  # the final log read covers the summary
                self.logger.debug("%s: log stream of %s ended: %s", self.label, pod_name, error)

        thread = threading.Thread(target=follow, name=f"log-{pod_name}", daemon=True)
        thread.start()
        return thread

    @contextlib.contextmanager
    def api_errors(self, what: str) -> Iterator[None]:
        """Turn Kubernetes API errors into stage errors: 429/5xx/unreachable are transient."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            yield
        except ApiException as error:
            status = int(error.status or 0)
            detail = _api_message(error)
            text = f"{what}: the Kubernetes API answered {status} {error.reason}: {detail}"
            if status in TRANSIENT_STATUSES:
                raise TransientStageError(self.label, text) from None
            raise StageFailedError(self.label, text) from None
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as error:
            text = f"{what}: the Kubernetes API is unreachable: {error}"
            raise TransientStageError(self.label, text) from None


def _api_message(error: Any) -> str:
    try:
        return json.loads(error.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return str(error.body or "")[:500]
