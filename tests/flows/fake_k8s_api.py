"""A tiny Kubernetes API server for launcher tests: just the endpoints the launcher calls.

It is a threaded :mod:`http.server` that keeps objects in memory and plays a scripted scenario
when a ``Job`` or ``RayJob`` is created: it makes the run's pods (with the labels of their pod
templates; a RayJob also gets its RayCluster), moves them through their phases, writes their
logs and updates the job's status.

Like a real API server, and in its order, it:

- **authorizes** every request against Role ``rules`` (default: the chart's Role, see
  :mod:`tests.flows.rbac`): a request they do not grant gets a 403 Forbidden Status;
- **decodes** creates, patches and updates with ``fieldValidation``: ``Strict`` refuses unknown
  fields (400 ``strict decoding error: unknown field "spec.foo"``); ``Warn`` (the default) and
  ``Ignore`` drop them (``Warn`` adds a ``Warning`` header, also kept in :attr:`warnings`);
  strategic-merge patches of custom resources get 415;
- **validates** RayJobs and RayClusters against the KubeRay CRD of ``kuberay_version`` and core
  kinds (Job, ConfigMap) against Kubernetes ``kubernetes_version``'s schemas: 422 Invalid;
- **admits** ownerReferences as OwnerReferencesPermissionEnforcement does: ``blockOwnerDeletion:
  true`` needs ``update`` on the owner's ``<resource>/finalizers``, and changing the owners of
  an existing object needs ``delete`` on it: 403 otherwise;
- **collects garbage**: deleting an object deletes, recursively, every object whose
  ownerReferences name its uid, unless another owner of it still exists (then only that
  reference goes). ``propagationPolicy=Orphan`` (the default for ``batch/v1`` Jobs, as on a
  real server) keeps the dependents and strips the reference.

Endpoints: create/get/list/watch/patch/update/delete/deletecollection of any namespaced
resource; pods' ``log`` (``follow=true`` streams until the pod ends). Watches send ADDED,
MODIFIED and DELETED events (newline-delimited JSON) until ``timeoutSeconds``.

Scenarios: ``success``, ``oom`` (a container OOMKilled), ``unschedulable`` (PodScheduled=False),
``imagepull`` (ImagePullBackOff), ``config_error`` (the stage exits 2), ``hang`` (runs until
deleted: for cancellation), ``api_error`` (creating a job answers 503).

Example::

    with FakeKubernetes("success") as fake:
        launcher = KubernetesLauncher(settings, api_client=fake.api_client())
        launcher.run("eval", None, [], {})
        fake.requests  # [("POST", "/apis/batch/v1/namespaces/llmrl/jobs"), ...]
        fake.permissions_used()  # {Permission("batch", "jobs", "", "create"), ...}
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from flows.launchers.manifests import KUBERAY_VERSION
from tests.flows import crd_schema
from tests.flows.rbac import (
    LAUNCHER_USER,
    Attributes,
    Permission,
    Rules,
    allows,
    default_rules,
    forbidden_message,
    forbidden_status,
    group_resource,
    request_attributes,
    resource_for,
    used_permissions,
)

SCENARIOS = (
    "success",
    "oom",
    "unschedulable",
    "imagepull",
    "config_error",
    "hang",
    "api_error",
)
CHART_RULES = "chart"
"""``rules=CHART_RULES`` (the default): enforce the chart's Role (:func:`default_rules`)."""
KINDS = {
    "jobs": ("batch/v1", "Job"),
    "rayjobs": ("ray.io/v1", "RayJob"),
    "rayclusters": ("ray.io/v1", "RayCluster"),
    "configmaps": ("v1", "ConfigMap"),
    "pods": ("v1", "Pod"),
}
"""apiVersion and kind of the resources the fake knows by name (others: stored as sent)."""
MERGE_KEYS = {
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
"""Strategic-merge-patch keys of the lists that merge (others are replaced)."""

Key = tuple[str, str, str]  # (resource, namespace, name)


class ApiError(Exception):
    """An answer other than success: its HTTP code and Status body."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            **({"details": details} if details else {}),
            "code": code,
        }


class FakeKubernetes:
    """The fake API server; ``host`` is its URL. Use it as a context manager.

    ``summary`` is the JSON object the driver prints last (``prepare`` prints ``summary_path``);
    ``step_s`` is the pause between the scenario's steps. ``rules``: the Role rules enforced
    (default: the chart's; None: everything allowed); ``user``: who the 403s name.
    ``kuberay_version``: the KubeRay CRDs RayJobs/RayClusters are validated against (None: not
    validated; also when ../shared/kuberay-crds is missing, see :attr:`crd_skip_reason`).
    """

    def __init__(
        self,
        scenario: str = "success",
        *,
        summary: dict[str, Any] | None = None,
        summary_path: str = "/shared/runs/pipeline/data/arithmetic-0123456789abcdef",
        step_s: float = 0.1,
        rules: Rules | str | None = CHART_RULES,
        user: str = LAUNCHER_USER,
        kuberay_version: str | None = KUBERAY_VERSION,
        kubernetes_version: str = "1.30",
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
        self.scenario = scenario
        self.summary = summary or {"step": 2, "final_checkpoint": "/shared/ckpt/model"}
        self.summary_path = summary_path
        self.step_s = step_s
        self.rules: Rules | None = default_rules() if rules == CHART_RULES else rules  # type: ignore[assignment]
        self.user = user
        self.crd_skip_reason = None
        if kuberay_version is not None:
            self.crd_skip_reason = crd_schema.missing_crds(
                (kuberay_version,), tuple(crd_schema.KUBERAY_KINDS.values())
            )
        self.kuberay_version = None if self.crd_skip_reason else kuberay_version
        self.kubernetes_version = kubernetes_version
        self.objects: dict[Key, dict[str, Any]] = {}
        self.tombstones: list[tuple[int, str, dict[str, Any]]] = []  # (version, resource, obj)
        self.logs: dict[tuple[str, str], list[str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.calls: list[Attributes] = []
        self.denied: list[Attributes] = []
        self.warnings: list[str] = []
        self.collected: list[str] = []  # what garbage collection deleted for want of an owner
        self.created: list[dict[str, Any]] = []
        self.lock = threading.Condition()
        self._version = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )  # a short poll interval: leaving the context manager takes at most that long

    # -- lifecycle

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubernetes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.objects.clear()
            self.lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.host))

    # -- what the tests look at, and do behind the API's back (no RBAC, no validation)

    def deletes(self) -> list[str]:
        """Paths of the DELETE requests received."""
        return [path for method, path in self.requests if method == "DELETE"]

    def permissions_used(self) -> set[Permission]:
        """``(group, resource, subresource, verb)`` of every request received, granted or not."""
        with self.lock:
            return used_permissions(self.calls)

    def pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return [obj for (kind, _, _), obj in self.objects.items() if kind == "pods"]

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A copy of a stored object, or None."""
        with self.lock:
            obj = self.objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def seed(self, resource: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store ``body`` as if someone else had created it (e.g. the flow-run pod's Job, made
        by the Prefect worker); returns a copy of what is stored, with its uid."""
        body = copy.deepcopy(body)
        if resource in KINDS:
            api_version, kind = KINDS[resource]
            body.setdefault("apiVersion", api_version)
            body.setdefault("kind", kind)
        with self.lock:
            return copy.deepcopy(self._store(resource, namespace, body))

    def delete_object(
        self, resource: str, namespace: str, name: str, propagation: str = "Background"
    ) -> bool:
        """Delete an object as someone else would (garbage collection follows); False if absent."""
        with self.lock:
            return self._delete(resource, namespace, name, propagation) is not None

    # -- state changes (callers hold the lock)

    def _bump(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.lock.notify_all()

    def _store(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        metadata["namespace"] = namespace
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.objects[(kind, namespace, metadata["name"])] = body
        self._bump(body)
        return body

    def _delete(
        self, kind: str, namespace: str, name: str, propagation: str | None = None
    ) -> dict[str, Any] | None:
        """Remove an object, then collect its dependents' garbage."""
        obj = self.objects.pop((kind, namespace, name), None)
        if obj is None:
            return None
        self._bump(obj)
        self.tombstones.append((self._version, kind, obj))
        if propagation is None:  # batch/v1 Jobs orphan their pods unless told otherwise
            propagation = "Orphan" if kind == "jobs" else "Background"
        uid = obj["metadata"]["uid"]
        live = {other["metadata"]["uid"] for other in self.objects.values()}
        for key, other in list(self.objects.items()):
            owners = other["metadata"].get("ownerReferences") or []
            if key not in self.objects or not any(o.get("uid") == uid for o in owners):
                continue
            others_alive = any(o.get("uid") in live for o in owners if o.get("uid") != uid)
            if propagation == "Orphan" or others_alive:
                other["metadata"]["ownerReferences"] = [o for o in owners if o.get("uid") != uid]
                self._bump(other)
            else:
                self._delete(*key, "Background")
        return obj

    def _collect_if_orphaned(self, kind: str, obj: dict[str, Any]) -> None:
        """The garbage collector deletes an object whose owners are all absent (a wrong uid, or
        an owner already deleted); :attr:`collected` says why."""
        owners = obj["metadata"].get("ownerReferences") or []
        live = {other["metadata"]["uid"] for other in self.objects.values()}
        if owners and not any(owner.get("uid") in live for owner in owners):
            names = ", ".join(f"{o.get('kind')} {o.get('name')} ({o.get('uid')})" for o in owners)
            self.collected.append(f"{kind}/{obj['metadata']['name']}: no owner exists: {names}")
            self._delete(kind, obj["metadata"]["namespace"], obj["metadata"]["name"], "Background")

    # -- the API: authorize, decode, validate, admit, store

    def authorize(self, attributes: Attributes) -> None:
        """Record the request; raise the 403 the Role would give."""
        with self.lock:
            self.calls.append(attributes)
        if self.rules is not None and not allows(self.rules, attributes):
            with self.lock:
                self.denied.append(attributes)
            raise _forbidden(forbidden_status(attributes, self.user))

    def decode(
        self, attributes: Attributes, obj: dict[str, Any], field_validation: str
    ) -> tuple[dict[str, Any], list[str]]:
        """Check ``obj`` as the server decodes and validates it: what it stores, and the
        warnings of the answer."""
        if attributes.resource in KINDS:
            api_version, kind = KINDS[attributes.resource]
            obj = {"apiVersion": api_version, "kind": kind, **obj}
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        name = (obj.get("metadata") or {}).get("name") or attributes.name
        if kind in crd_schema.KUBERAY_KINDS and self.kuberay_version:
            checked = crd_schema.check_custom_object(obj, self.kuberay_version)
        elif attributes.resource in ("jobs", "configmaps"):
            checked = crd_schema.check_core_object(obj, self.kubernetes_version)
        else:
            checked = crd_schema.Checked(obj)
        if checked.unknown and field_validation == "Strict":
            version = api_version.rpartition("/")[2]
            fields = ", ".join(f'unknown field "{path}"' for path in checked.unknown)
            raise ApiError(
                400,
                "BadRequest",
                f'{kind} in version "{version}" cannot be handled as a {kind}: '
                f"strict decoding error: {fields}",
            )
        warnings = []
        if checked.unknown and field_validation != "Ignore":
            warnings = [f'unknown field "{path}"' for path in checked.unknown]
            with self.lock:
                self.warnings += warnings
        if checked.errors:
            raise _invalid(attributes, kind, name, checked.errors)
        return checked.value, warnings

    def admit_owners(
        self, attributes: Attributes, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        """OwnerReferencesPermissionEnforcement: 403 for owners the user may not block."""
        refs = (obj.get("metadata") or {}).get("ownerReferences") or []
        old_refs = ((old or {}).get("metadata") or {}).get("ownerReferences") or []
        if old is not None and refs != old_refs and self.rules is not None:
            deleting = attributes._replace(verb="delete", subresource="")
            if not allows(self.rules, deleting):
                raise _forbidden(
                    forbidden_status(
                        attributes,
                        self.user,
                        "cannot set an ownerRef on a resource you can't delete: "
                        + forbidden_message(deleting, self.user),
                    )
                )
        blocking_before = {r.get("uid") for r in old_refs if r.get("blockOwnerDeletion")}
        for ref in refs:
            if not ref.get("blockOwnerDeletion") or ref.get("uid") in blocking_before:
                continue
            group, plural = resource_for(ref.get("apiVersion", ""), ref.get("kind", ""))
            finalizers = Attributes(
                "update",
                group,
                ref.get("apiVersion", "").rpartition("/")[2],
                plural,
                "finalizers",
                attributes.namespace,
                ref.get("name", ""),
            )
            if self.rules is not None and not allows(self.rules, finalizers):
                raise _forbidden(
                    forbidden_status(
                        attributes,
                        self.user,
                        "cannot set blockOwnerDeletion if an ownerReference refers to a resource "
                        f"you can't set finalizers on: {forbidden_message(finalizers, self.user)}"
                        f", {json.dumps(ref, sort_keys=True)}",
                    )
                )

    def create(
        self, attributes: Attributes, body: dict[str, Any], field_validation: str
    ) -> tuple[dict[str, Any], list[str]]:
        """POST: the stored object (a copy) and the warnings, after decoding, validation and
        admission. An object whose owners are all gone is collected at once."""
        kind, namespace = attributes.resource, attributes.namespace
        body, warnings = self.decode(attributes, body, field_validation)
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise _invalid(
                attributes,
                body.get("kind", ""),
                "",
                [crd_schema.FieldError("metadata.name", "FieldValueRequired", "Required value")],
            )
        self.admit_owners(attributes._replace(name=name), body, None)
        if kind in ("jobs", "rayjobs") and self.scenario == "api_error":
            raise ApiError(503, "ServiceUnavailable", "etcdserver: request timed out")
        with self.lock:
            if (kind, namespace, name) in self.objects:
                raise _exists(attributes, name)
            stored = self._store(kind, namespace, body)
            snapshot = copy.deepcopy(stored)
            self.created.append(copy.deepcopy(stored))
            self._collect_if_orphaned(kind, stored)
        if kind in ("jobs", "rayjobs"):
            self._start_scenario(kind, stored)
        return snapshot, warnings

    def change(
        self,
        attributes: Attributes,
        new_of: Callable[[dict[str, Any]], dict[str, Any]],
        field_validation: str,
    ) -> tuple[dict[str, Any], list[str]]:
        """PATCH/PUT: ``new_of(current copy)`` replaces the object (uid and status kept); the
        changed object (a copy) and the warnings."""
        key = (attributes.resource, attributes.namespace, attributes.name)
        with self.lock:
            current = self.objects.get(key)
            if current is None:
                raise _not_found(attributes)
            old = copy.deepcopy(current)
        new, warnings = self.decode(attributes, new_of(copy.deepcopy(old)), field_validation)
        self.admit_owners(attributes, new, old)
        with self.lock:
            current = self.objects.get(key)
            if current is None:
                raise _not_found(attributes)
            for field in ("uid", "creationTimestamp", "namespace", "name"):
                new.setdefault("metadata", {})[field] = old["metadata"][field]
            if "status" in old:
                new["status"] = current.get("status")
            current.clear()
            current.update(new)  # in place: the scenario thread holds this dict
            self._bump(current)
            snapshot = copy.deepcopy(current)
            self._collect_if_orphaned(attributes.resource, current)
            return snapshot, warnings

    # -- the scenario

    def _start_scenario(self, kind: str, obj: dict[str, Any]) -> None:
        thread = threading.Thread(target=self._play, args=(kind, obj), daemon=True)
        thread.start()

    def _play(self, kind: str, obj: dict[str, Any]) -> None:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        with self.lock:
            if (kind, namespace, name) not in self.objects:
                return
            pods = self._make_pods(kind, obj)
            driver = pods[-1]
        for step in self._steps(kind, obj, driver, pods):
            time.sleep(self.step_s)
            with self.lock:
                if (kind, namespace, name) not in self.objects:
                    return  # deleted: the scenario ends
                step()

    def _make_pods(self, kind: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The run's pods, Pending; the driver (job pod or RayJob submitter) is the last one.

        A Job owns its pod; a RayJob owns its RayCluster (which owns the Ray pods) and its
        submitter pod (really through a submitter Job)."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        spec = obj["spec"]
        templates: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        owner = _owner_of(obj)
        if kind == "jobs":
            templates.append(("job", spec["template"], owner))
        else:
            cluster = self._store(
                "rayclusters",
                namespace,
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "metadata": {
                        "name": f"{name}-{uuid.uuid4().hex[:5]}",
                        "labels": dict(obj["metadata"].get("labels") or {}),
                        "ownerReferences": [owner],
                    },
                    "spec": copy.deepcopy(spec["rayClusterSpec"]),
                },
            )
            obj["status"] = {"rayClusterName": cluster["metadata"]["name"]}
            ray_owner = _owner_of(cluster)
            cluster_spec = spec["rayClusterSpec"]
            templates.append(("head", cluster_spec["headGroupSpec"]["template"], ray_owner))
            for group in cluster_spec.get("workerGroupSpecs") or []:
                for index in range(group.get("replicas", 1)):
                    suffix = f"{group['groupName']}-{index}"
                    templates.append((suffix, group["template"], ray_owner))
            templates.append(("submitter", spec["submitterPodTemplate"], owner))
        pods = []
        for suffix, template, pod_owner in templates:
            pod_name = f"{name}-{suffix}"
            containers = [c["name"] for c in template["spec"]["containers"]]
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                    "ownerReferences": [pod_owner],
                },
                "spec": template["spec"],
                "status": {"phase": "Pending", "conditions": []},
                "_containers": containers,
            }
            pods.append(self._store("pods", namespace, pod))
            self.logs[(namespace, pod_name)] = []
        return pods

    def _steps(
        self, kind: str, obj: dict[str, Any], driver: dict[str, Any], pods: list[dict[str, Any]]
    ) -> list[Callable[[], None]]:
        namespace = obj["metadata"]["namespace"]
        stage = obj["metadata"]["labels"].get("llmrl.io/stage", "eval")
        log = self.logs[(namespace, driver["metadata"]["name"])]
        config = [f"stage: {stage}", "seed: 0", "progress: false"]
        last = self.summary_path if stage == "prepare" else json.dumps(self.summary)
        trailer = ["------", "Job 'raysubmit_1' succeeded", "------"] if kind == "rayjobs" else []
        scenario = self.scenario

        def running() -> None:
            for pod in pods:
                _set_running(pod)
                self._bump(pod)
            if kind == "rayjobs":
                status = obj.setdefault("status", {})
                status.update({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
                self._bump(obj)
            log.extend(config)
            self.lock.notify_all()

        def finish_success() -> None:
            log.extend(["INFO llmrl: step 1", "INFO llmrl: step 2", last, *trailer])
            _set_terminated(driver, 0, "Completed")
            self._bump(driver)
            _set_success(kind, obj)
            self._bump(obj)

        def finish_config_error() -> None:
            log.append(
                f"llmrl {stage}: error: --set max_new_tokens=0: max_new_tokens: "
                "Input should be greater than or equal to 1"
            )
            if kind == "jobs":
                _set_terminated(driver, 2, "Error")
            else:
                _set_terminated(driver, 1, "Error")
            self._bump(driver)
            _set_failure(kind, obj, "Job entrypoint command failed with exit code 2")
            self._bump(obj)

        def oom() -> None:
            victim = driver if kind == "jobs" else pods[1 if len(pods) > 2 else 0]
            _set_terminated(victim, 137, "OOMKilled")
            if kind == "rayjobs":  # a Ray worker restarts: the OOM is its last state
                status = victim["status"]["containerStatuses"][0]
                status["lastState"] = status.pop("state")
                status["state"] = {"running": {}}
                status["restartCount"] = 1
                victim["status"]["phase"] = "Running"
            self._bump(victim)
            if kind == "jobs":
                _set_failure(kind, obj, "Job has reached the specified backoff limit")
                self._bump(obj)

        def unschedulable() -> None:
            for pod in pods:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ]
                self._bump(pod)

        def image_pull() -> None:
            for pod in pods:
                pod["status"]["containerStatuses"] = [
                    {
                        "name": name,
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "llmrl:missing"',
                            }
                        },
                    }
                    for name in pod["_containers"]
                ]
                self._bump(pod)

        def progress() -> None:
            log.append("INFO llmrl: still training")
            self.lock.notify_all()

        return {
            "success": [running, finish_success],
            "config_error": [running, finish_config_error],
            "oom": [running, oom],
            "unschedulable": [unschedulable],
            "imagepull": [image_pull],
            "hang": [running, *[progress] * 10_000],
            "api_error": [],
        }[scenario]


def _owner_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The controller ownerReference a controller puts on what it creates for ``obj``."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _set_running(pod: dict[str, Any]) -> None:
    pod["status"]["phase"] = "Running"
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    pod["status"]["containerStatuses"] = [
        {"name": name, "ready": True, "restartCount": 0, "state": {"running": {}}}
        for name in pod["_containers"]
    ]


def _set_terminated(pod: dict[str, Any], code: int, reason: str) -> None:
    pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
    pod["status"]["containerStatuses"] = [
        {
            "name": name,
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}},
        }
        for name in pod["_containers"]
    ]


def _set_success(kind: str, obj: dict[str, Any]) -> None:
    if kind == "jobs":
        obj["status"] = {
            "succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True"}],
        }
    else:
        obj.setdefault("status", {}).update(
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
        )


def _set_failure(kind: str, obj: dict[str, Any], message: str) -> None:
    if kind == "jobs":
        obj["status"] = {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": message,
                }
            ],
        }
    else:
        obj.setdefault("status", {}).update(
            {
                "jobDeploymentStatus": "Complete",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": message,
            }
        )


# ------------------------------------------------------------------------ Status errors


def _forbidden(status: dict[str, Any]) -> ApiError:
    error = ApiError(403, "Forbidden", status["message"])
    error.status = status
    return error


def _not_found(attributes: Attributes) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{group_resource(attributes)} "{attributes.name}" not found',
        name=attributes.name,
        group=attributes.group,
        kind=attributes.resource,
    )


def _exists(attributes: Attributes, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{group_resource(attributes)} "{name}" already exists',
        name=name,
        group=attributes.group,
        kind=attributes.resource,
    )


def _invalid(
    attributes: Attributes, kind: str, name: str, errors: Sequence[crd_schema.FieldError]
) -> ApiError:
    """422: ``RayJob.ray.io "x" is invalid: <path>: <detail>`` (several: ``[a, b]``)."""
    qualified = f"{kind}.{attributes.group}" if attributes.group else kind
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    causes = [{"reason": e.reason, "message": e.detail, "field": e.path} for e in errors]
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {listed}',
        name=name,
        group=attributes.group,
        kind=kind,
        causes=causes,
    )


# ------------------------------------------------------------------------ patches


def _merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch; ``strategic``: lists of :data:`MERGE_KEYS` merge by key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in MERGE_KEYS and isinstance(value, list):
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        else:
            result[key] = _merge_patch(result.get(key), value, strategic)
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        index = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = _merge_patch(merged[index], item, strategic=True)
    return merged


def _json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch: add, replace, remove, test."""
    doc = copy.deepcopy(target)
    for operation in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last: Any = parts[-1]
        if isinstance(parent, list):
            last = len(parent) if last == "-" else int(last)
        op = operation["op"]
        if op == "remove":
            del parent[last]
        elif op == "add" and isinstance(parent, list):
            parent.insert(last, operation["value"])
        elif op in ("add", "replace"):
            parent[last] = operation["value"]
        elif op == "test" and parent[last] != operation["value"]:
            raise ApiError(422, "Invalid", f"test operation failed at {operation['path']}")
    return doc


# ------------------------------------------------------------------------ HTTP


def _handler_class(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        # plumbing ------------------------------------------------------------

        def _serve(self, verb_handler: Callable[[Attributes, dict[str, list[str]]], None]) -> None:
            with fake.lock:
                fake.requests.append((self.command, urlparse(self.path).path))
            attributes = request_attributes(self.command, self.path)
            try:
                if attributes is None:
                    raise ApiError(404, "NotFound", f"the server could not find {self.path}")
                fake.authorize(attributes)
                verb_handler(attributes, parse_qs(urlparse(self.path).query))
            except ApiError as error:
                self._send(error.code, error.status)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for warning in self.warnings:
                self.send_header("Warning", f"299 - {json.dumps(warning)}")
            self.end_headers()
            self.wfile.write(data)

        warnings: Sequence[str] = ()  # the Warning headers of the answer

        @staticmethod
        def _validation(query: dict[str, list[str]]) -> str:
            """``fieldValidation``: Strict, Warn (the server's default) or Ignore."""
            return query.get("fieldValidation", ["Warn"])[0]

        # verbs ---------------------------------------------------------------

        def do_POST(self) -> None:
            def create(attributes: Attributes, query: dict[str, list[str]]) -> None:
                stored, self.warnings = fake.create(
                    attributes, self._body(), self._validation(query)
                )
                self._send(201, stored)

            self._serve(create)

        def do_PATCH(self) -> None:
            def patch(attributes: Attributes, query: dict[str, list[str]]) -> None:
                content_type = (self.headers.get("Content-Type") or "").split(";")[0]
                body = self._body()
                custom = attributes.group not in ("", "batch", "apps")
                if content_type == "application/strategic-merge-patch+json" and custom:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media "
                        "types include: application/json-patch+json, "
                        "application/merge-patch+json, application/apply-patch+yaml",
                    )
                if content_type == "application/json-patch+json":

                    def new_of(current: dict[str, Any]) -> dict[str, Any]:
                        return _json_patch(current, body)
                else:
                    strategic = content_type == "application/strategic-merge-patch+json"

                    def new_of(current: dict[str, Any]) -> dict[str, Any]:
                        return _merge_patch(current, body, strategic)

                changed, self.warnings = fake.change(attributes, new_of, self._validation(query))
                self._send(200, changed)

            self._serve(patch)

        def do_PUT(self) -> None:
            def update(attributes: Attributes, query: dict[str, list[str]]) -> None:
                body = self._body()
                changed, self.warnings = fake.change(
                    attributes, lambda _: body, self._validation(query)
                )
                self._send(200, changed)

            self._serve(update)

        def do_DELETE(self) -> None:
            def delete(attributes: Attributes, query: dict[str, list[str]]) -> None:
                options = self._body() if self.headers.get("Content-Length") else {}
                propagation = query.get("propagationPolicy", [None])[0]
                propagation = propagation or (options or {}).get("propagationPolicy")
                if attributes.verb == "deletecollection":
                    with fake.lock:
                        names = [
                            key[2]
                            for key, obj in fake.objects.items()
                            if key[:2] == (attributes.resource, attributes.namespace)
                            and _matches(obj, query)
                        ]
                        for name in names:
                            fake._delete(
                                attributes.resource, attributes.namespace, name, propagation
                            )
                    self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                    return
                with fake.lock:
                    obj = fake._delete(
                        attributes.resource, attributes.namespace, attributes.name, propagation
                    )
                    payload = copy.deepcopy(obj)
                if obj is None:
                    raise _not_found(attributes)
                if attributes.resource == "jobs" and propagation is None:
                    self.warnings = [
                        "child pods are preserved by default when jobs are deleted; set "
                        "propagationPolicy=Background to remove them or set "
                        "propagationPolicy=Orphan to suppress this warning"
                    ]
                self._send(200, payload)

            self._serve(delete)

        def do_GET(self) -> None:
            def read(attributes: Attributes, query: dict[str, list[str]]) -> None:
                if attributes.subresource == "log":
                    follow = query.get("follow", ["false"])[0] == "true"
                    self._log(attributes, follow)
                elif attributes.verb == "get":
                    obj = fake.get(attributes.resource, attributes.namespace, attributes.name)
                    if obj is None:
                        raise _not_found(attributes)
                    self._send(200, obj)
                elif attributes.verb == "watch":
                    self._watch(attributes, query)
                else:
                    self._list(attributes, query)

            self._serve(read)

        # reads ---------------------------------------------------------------

        def _list(self, attributes: Attributes, query: dict[str, list[str]]) -> None:
            with fake.lock:
                items = [
                    obj
                    for (k, ns, _), obj in fake.objects.items()
                    if k == attributes.resource
                    and ns == attributes.namespace
                    and _matches(obj, query)
                ]
                payload = json.dumps(
                    {
                        "kind": "List",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(fake._version)},
                        "items": items,
                    }
                ).encode()
            self._send(200, payload)

        def _stream_start(self, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Connection", "close")
            self.end_headers()

        def _watch(self, attributes: Attributes, query: dict[str, list[str]]) -> None:
            resource, namespace = attributes.resource, attributes.namespace
            timeout = float(query.get("timeoutSeconds", ["5"])[0])
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            deadline = time.monotonic() + timeout
            self._stream_start("application/json")

            def selected(kind: str, obj: dict[str, Any]) -> bool:
                meta = obj["metadata"]
                return (kind, meta.get("namespace")) == (resource, namespace) and _matches(
                    obj, query
                )

            with fake.lock:
                current = [(k[0], obj) for k, obj in fake.objects.items() if selected(k[0], obj)]
                if since:  # a resumed watch: what existed then is known
                    known = {obj["metadata"]["name"] for _, obj in current}
                    known |= {
                        obj["metadata"]["name"]
                        for version, kind, obj in fake.tombstones
                        if version > since and selected(kind, obj)
                    }
                    cursor = floor = since
                else:  # a fresh watch starts with every object, as ADDED
                    known, cursor, floor = set(), 0, fake._version
                while True:
                    events: list[tuple[int, str, dict[str, Any]]] = []
                    for (kind, _, name), obj in fake.objects.items():
                        version = int(obj["metadata"]["resourceVersion"])
                        if version > cursor and selected(kind, obj):
                            events.append((version, "MODIFIED" if name in known else "ADDED", obj))
                            known.add(name)
                    for version, kind, obj in fake.tombstones:
                        name = obj["metadata"]["name"]
                        fresh = version > max(cursor, floor)
                        if fresh and name in known and selected(kind, obj):
                            events.append((version, "DELETED", obj))
                            known.discard(name)
                    cursor = fake._version
                    for _, event, obj in sorted(events, key=lambda item: item[0]):
                        self._event(event, obj)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    fake.lock.wait(remaining)

        def _event(self, kind: str, obj: dict[str, Any]) -> None:
            self.wfile.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            self.wfile.flush()

        def _log(self, attributes: Attributes, follow: bool) -> None:
            namespace, pod = attributes.namespace, attributes.name
            with fake.lock:
                if (namespace, pod) not in fake.logs:
                    raise ApiError(404, "NotFound", f'pods "{pod}" not found')
                if not follow:
                    text = "".join(line + "\n" for line in fake.logs[(namespace, pod)])
                    self._send(200, text.encode(), "text/plain")
                    return
            self._stream_start("text/plain")
            sent = 0
            with fake.lock:
                while True:
                    lines = fake.logs.get((namespace, pod), [])
                    for line in lines[sent:]:
                        self.wfile.write(line.encode() + b"\n")
                    self.wfile.flush()
                    sent = len(lines)
                    pod_obj = fake.objects.get(("pods", namespace, pod))
                    if pod_obj is None or pod_obj["status"]["phase"] in ("Succeeded", "Failed"):
                        return
                    fake.lock.wait(1.0)

    return Handler


def _matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """labelSelector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``) and the metadata.name /
    metadata.namespace fieldSelector."""
    labels = obj["metadata"].get("labels") or {}
    for selector in query.get("labelSelector", []):
        for requirement in filter(None, selector.split(",")):
            if "!=" in requirement:
                key, value = requirement.split("!=", 1)
                if labels.get(key) == value:
                    return False
            elif "=" in requirement:
                key, value = requirement.split("=", 1)
                if labels.get(key) != value.lstrip("="):
                    return False
            elif requirement.startswith("!"):
                if requirement[1:] in labels:
                    return False
            elif requirement not in labels:
                return False
    for selector in query.get("fieldSelector", []):
        for requirement in filter(None, selector.split(",")):
            key, _, value = requirement.partition("=")
            field = key.removeprefix("metadata.")
            if field in ("name", "namespace") and obj["metadata"].get(field) != value.lstrip("="):
                return False
    return True
