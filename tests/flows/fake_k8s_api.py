"""A tiny Kubernetes API server for launcher tests: just the endpoints the launcher calls.

It is a threaded :mod:`http.server` that keeps objects in memory and plays a scripted scenario
when a ``Job`` or ``RayJob`` is created: it makes the run's pods (with the labels of their pod
templates; a RayJob also gets its RayCluster), moves them through their phases, writes their
logs and updates the job's status (:mod:`tests.flows.fake_k8s_scenario`); the stage in it
writes its result file to the fake's shared claim (:attr:`FakeKubernetes.shared_dir`).

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

Endpoints (:mod:`tests.flows.fake_k8s_http`): create/get/list/watch/patch/update/delete/
deletecollection of any namespaced resource; pods' ``log`` (``follow=true`` streams until the
pod ends). Watches send ADDED, MODIFIED and DELETED events (newline-delimited JSON) until
``timeoutSeconds``.

Scenarios: ``success``, ``oom`` (a container OOMKilled), ``unschedulable`` (PodScheduled=False),
``imagepull`` (ImagePullBackOff), ``config_error`` (the stage exits 2), ``crash`` (it exits 1
after a traceback), ``hang`` (runs until deleted: for cancellation), ``api_error`` (creating a
job answers 503).

Example::

    with FakeKubernetes("success") as fake:
        settings = KubernetesSettings(shared_mount_path=str(fake.shared_dir))
        launcher = KubernetesLauncher(settings, api_client=fake.api_client())
        launcher.run("eval", None, [], {})
        fake.requests  # [("POST", "/apis/batch/v1/namespaces/llmrl/jobs"), ...]
        fake.permissions_used()  # {Permission("batch", "jobs", "", "create"), ...}
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from flows.launchers.manifests import KUBERAY_VERSION
from tests.flows.fake_k8s_errors import ApiError, exists, forbidden, invalid, not_found
from tests.flows.fake_k8s_http import handler_class
from tests.flows.fake_k8s_scenario import Scenario, mounted_claim_path
from tests.flows.rbac import (
    LAUNCHER_USER,
    Attributes,
    Permission,
    Rules,
    allows,
    default_rules,
    forbidden_message,
    forbidden_status,
    resource_for,
    used_permissions,
)
from tests.support import crd_schema

SCENARIOS = (
    "success",
    "oom",
    "unschedulable",
    "imagepull",
    "config_error",
    "crash",
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

Key = tuple[str, str, str]  # (resource, namespace, name)


class FakeKubernetes:
    """The fake API server; ``host`` is its URL. Use it as a context manager.

    ``summary`` is the stage's result: the JSON object it prints last and writes to its result
    file (``prepare``: ``summary_path``, written as ``{"path": ...}``); ``write_result`` False
    leaves the file out, ``result_text`` replaces its content. :attr:`shared_dir` is the local
    folder holding the PersistentVolumeClaim ``shared_claim`` (a fresh temporary folder, removed
    on exit). ``step_s`` is the pause between the scenario's steps. ``rules``: the Role rules
    enforced (default: the chart's; None: everything allowed); ``user``: who the 403s name.
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
        write_result: bool = True,
        result_text: str | None = None,
        shared_claim: str = "llmrl-shared",
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
        self.scenario = scenario
        self.summary = summary or {"step": 2, "final_checkpoint": "/shared/ckpt/model"}
        self.summary_path = summary_path
        self.step_s = step_s
        self.write_result, self.result_text = write_result, result_text
        self.shared_claim = shared_claim
        self.shared_dir = Path(tempfile.mkdtemp(prefix="fake-k8s-shared-"))
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
        self.version = 0  # the last resourceVersion given
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class(self))
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
        shutil.rmtree(self.shared_dir, ignore_errors=True)

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.host))

    def shared_path(self, pod: dict[str, Any], path: str) -> Path | None:
        """Where a file the pod writes at ``path`` lands in :attr:`shared_dir`, or None when
        its first container has no mount of :attr:`shared_claim` holding ``path``."""
        inside = mounted_claim_path(pod, self.shared_claim, path)
        return None if inside is None else self.shared_dir.joinpath(*inside.parts)

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
            return copy.deepcopy(self.store(resource, namespace, body))

    def delete_object(
        self, resource: str, namespace: str, name: str, propagation: str = "Background"
    ) -> bool:
        """Delete an object as someone else would (garbage collection follows); False if absent."""
        with self.lock:
            return self.remove(resource, namespace, name, propagation) is not None

    # -- state changes (callers hold the lock)

    def bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.lock.notify_all()

    def store(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        metadata["namespace"] = namespace
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.objects[(kind, namespace, metadata["name"])] = body
        self.bump(body)
        return body

    def remove(
        self, kind: str, namespace: str, name: str, propagation: str | None = None
    ) -> dict[str, Any] | None:
        """Remove an object, then collect its dependents' garbage."""
        obj = self.objects.pop((kind, namespace, name), None)
        if obj is None:
            return None
        self.bump(obj)
        self.tombstones.append((self.version, kind, obj))
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
                self.bump(other)
            else:
                self.remove(*key, "Background")
        return obj

    def _collect_if_orphaned(self, kind: str, obj: dict[str, Any]) -> None:
        """The garbage collector deletes an object whose owners are all absent (a wrong uid, or
        an owner already deleted); :attr:`collected` says why."""
        owners = obj["metadata"].get("ownerReferences") or []
        live = {other["metadata"]["uid"] for other in self.objects.values()}
        if owners and not any(owner.get("uid") in live for owner in owners):
            names = ", ".join(f"{o.get('kind')} {o.get('name')} ({o.get('uid')})" for o in owners)
            self.collected.append(f"{kind}/{obj['metadata']['name']}: no owner exists: {names}")
            self.remove(kind, obj["metadata"]["namespace"], obj["metadata"]["name"], "Background")

    # -- the API: authorize, decode, validate, admit, store

    def authorize(self, attributes: Attributes) -> None:
        """Record the request; raise the 403 the Role would give."""
        with self.lock:
            self.calls.append(attributes)
        if self.rules is not None and not allows(self.rules, attributes):
            with self.lock:
                self.denied.append(attributes)
            raise forbidden(forbidden_status(attributes, self.user))

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
            raise invalid(attributes, kind, name, checked.errors)
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
                raise forbidden(
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
                raise forbidden(
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
            raise invalid(
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
                raise exists(attributes, name)
            stored = self.store(kind, namespace, body)
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
                raise not_found(attributes)
            old = copy.deepcopy(current)
        new, warnings = self.decode(attributes, new_of(copy.deepcopy(old)), field_validation)
        self.admit_owners(attributes, new, old)
        with self.lock:
            current = self.objects.get(key)
            if current is None:
                raise not_found(attributes)
            for field in ("uid", "creationTimestamp", "namespace", "name"):
                new.setdefault("metadata", {})[field] = old["metadata"][field]
            if "status" in old:
                new["status"] = current.get("status")
            current.clear()
            current.update(new)  # in place: the scenario thread holds this dict
            self.bump(current)
            snapshot = copy.deepcopy(current)
            self._collect_if_orphaned(attributes.resource, current)
            return snapshot, warnings

    # -- the scenario

    def _start_scenario(self, kind: str, obj: dict[str, Any]) -> None:
        thread = threading.Thread(target=Scenario(self, kind, obj).play, daemon=True)
        thread.start()
