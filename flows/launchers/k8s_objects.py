"""The Kubernetes objects of one stage run, through the API: create the ConfigMap and the Job or
RayJob (the ConfigMap adopted by it, so it goes with it), list them, delete them; and the API's
errors turned into stage errors (:func:`api_errors`). ``kubernetes`` is imported on use."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from flows.launchers.base import StageFailedError, TransientStageError
from flows.launchers.manifests import build_config_map, owner_reference
from flows.launchers.settings import KubernetesSettings

TRANSIENT_STATUSES = frozenset({0, 429, 500, 502, 503, 504})
"""HTTP codes of API answers a retry can get past (0: no answer)."""
STRICT = "Strict"
"""fieldValidation of every write: an unknown or duplicate field is an error, not dropped."""
RAYJOBS = {"group": "ray.io", "version": "v1", "plural": "rayjobs"}
"""The custom-object coordinates of KubeRay RayJobs."""


class StageObjects:
    """What one stage run created on the cluster: ``kind`` is ``job`` or ``rayjob``, ``name``
    the name of its Job/RayJob and ConfigMap, ``label`` the stage run's name in errors and logs.

    ``core``, ``batch`` and ``custom`` are the API groups' clients on ``api_client``.
    """

    def __init__(
        self,
        *,
        api_client: Any,
        settings: KubernetesSettings,
        label: str,
        stage: str,
        name: str,
        kind: str,
        logger: logging.Logger | logging.LoggerAdapter,
    ) -> None:
        from kubernetes import client

        self.settings, self.namespace = settings, settings.namespace
        self.label, self.stage, self.name, self.kind, self.logger = label, stage, name, kind, logger
        self.core, self.batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.created: list[str] = []  # "configmap" / "job" / "rayjob"
        self.owners: list[dict[str, Any]] = []  # the ConfigMap's owners besides its stage

    def api_errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        """:func:`api_errors` for this run."""
        return api_errors(self.label, what)

    def create_config_map(self, config_text: str, flow_run_id: str | None) -> None:
        """Create the ConfigMap holding the stage's config file (owned by the flow-run pod, if
        known, until :meth:`create` makes the Job or RayJob its owner too)."""
        body = build_config_map(self.name, self.namespace, self.stage, config_text, flow_run_id)
        self.owners = [owner_reference(self.settings)] if self.settings.owner_pod else []
        if self.owners:  # gone with the flow run even if the Job below is never created
            body["metadata"]["ownerReferences"] = list(self.owners)
        with self.api_errors("creating the ConfigMap"):
            self.core.create_namespaced_config_map(self.namespace, body, field_validation=STRICT)
        self.created.append("configmap")

    def create(self, manifest: dict[str, Any]) -> None:
        """Create the Job or RayJob; it then owns the ConfigMap, if there is one."""
        with self.api_errors(f"creating the {manifest['kind']}"):
            if self.kind == "rayjob":
                created = self.custom.create_namespaced_custom_object(
                    **RAYJOBS, namespace=self.namespace, body=manifest, field_validation=STRICT
                )
                uid = created["metadata"]["uid"]
            else:
                created = self.batch.create_namespaced_job(
                    self.namespace, manifest, field_validation=STRICT
                )
                uid = created.metadata.uid
        self.created.append(self.kind)
        if "configmap" in self.created:
            self._adopt_config_map(manifest, uid)

    def _adopt_config_map(self, manifest: dict[str, Any], uid: str) -> None:
        """Make the Job or RayJob an owner of the ConfigMap: deleting it deletes the config."""
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
                        **RAYJOBS, namespace=self.namespace, name=self.name,
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

    def list_call(self) -> tuple[Any, dict[str, Any]]:
        """The list function of the run's kind and its arguments selecting the run's object
        (a watch streams the same function)."""
        selection = {"namespace": self.namespace, "field_selector": f"metadata.name={self.name}"}
        if self.kind == "rayjob":
            return self.custom.list_namespaced_custom_object, {**RAYJOBS, **selection}
        return self.batch.list_namespaced_job, selection

    def list_pods(self, selector: str) -> list[dict[str, Any]]:
        """The namespace's pods matching the label ``selector``, as plain JSON objects."""
        with self.api_errors("listing pods"):
            response = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _preload_content=False
            )
            return json.loads(response.data).get("items") or []


@contextlib.contextmanager
def api_errors(label: str, what: str) -> Iterator[None]:
    """Turn Kubernetes API errors into stage errors: 429/5xx/unreachable are transient
    (:class:`TransientStageError`), others :class:`StageFailedError`; ``what`` says what the
    launcher was doing."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as error:
        status = int(error.status or 0)
        text = f"{what}: the Kubernetes API answered {status} {error.reason}: {_message(error)}"
        if status in TRANSIENT_STATUSES:
            raise TransientStageError(label, text) from None
        raise StageFailedError(label, text) from None
    except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as error:
        text = f"{what}: the Kubernetes API is unreachable: {error}"
        raise TransientStageError(label, text) from None


def _message(error: Any) -> str:
    """The ``message`` of an API error's Status body (else the body's start)."""
    try:
        return json.loads(error.body).get("message", "")
    except (TypeError, ValueError, AttributeError):
        return str(error.body or "")[:500]
