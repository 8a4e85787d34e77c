"""Names, labels and metadata of the Kubernetes objects of one stage run (pure functions).

:func:`resource_name` names a stage run; every object it is made of carries
:func:`run_labels` (:func:`object_metadata` for a Job or RayJob, with the Kueue queue and the
ownerReference to the flow-run pod); pods add ``llmrl.io/role`` (:func:`pod_metadata`). The
launcher finds, watches and deletes what it created by these labels.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from flows.launchers.settings import KUEUE_QUEUE_LABEL, KubernetesSettings

LABEL_RUN, LABEL_STAGE, LABEL_ROLE = "llmrl.io/run", "llmrl.io/stage", "llmrl.io/role"
LABEL_FLOW_RUN = "llmrl.io/flow-run"


def resource_name(name: str) -> str:
    """A fresh DNS-1123 name for one stage run: ``llmrl-<name>-<6 hex>`` (at most 37 chars)."""
    base = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:24].strip("-") or "stage"
    return f"llmrl-{base}-{secrets.token_hex(3)}"


def run_labels(name: str, stage: str, flow_run_id: str | None = None) -> dict[str, str]:
    """Labels of every object of one stage run; pods add ``llmrl.io/role``.

    ``llmrl.io/flow-run`` (:data:`LABEL_FLOW_RUN`) names the Prefect flow run that launched it,
    so the flow's cancellation hook can find everything it started.
    """
    labels = {
        "app.kubernetes.io/name": "llmrl",
        "app.kubernetes.io/component": stage,
        "app.kubernetes.io/managed-by": "llmrl-flows",
        LABEL_RUN: name,
        LABEL_STAGE: stage,
    }
    if flow_run_id:
        labels[LABEL_FLOW_RUN] = flow_run_id
    return labels


def object_metadata(
    name: str, stage: str, settings: KubernetesSettings, flow_run_id: str | None
) -> dict[str, Any]:
    """``metadata`` of a stage's Job or RayJob: labels, the Kueue queue, the owner Job."""
    labels = run_labels(name, stage, flow_run_id)
    if settings.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = settings.kueue_queue
    metadata: dict[str, Any] = {"name": name, "namespace": settings.namespace, "labels": labels}
    if settings.owner_pod is not None:
        metadata["ownerReferences"] = [owner_reference(settings)]
    return metadata


def owner_reference(settings: KubernetesSettings) -> dict[str, Any]:
    """The ownerReference to the flow-run pod. ``blockOwnerDeletion`` stays false: setting it
    would need ``update`` on ``pods/finalizers``, and deleting the flow run must not wait."""
    owner = settings.owner_pod
    assert owner is not None
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": owner.name,
        "uid": owner.uid,
        "controller": False,
        "blockOwnerDeletion": False,
    }


def pod_metadata(settings: KubernetesSettings, labels: dict[str, str], role: str) -> dict:
    """Pod template metadata: the settings' and the role's labels and annotations, then the
    run's labels (which nothing may override: the launcher finds its pods by them)."""
    extra = settings.role(role)
    metadata: dict[str, Any] = {
        "labels": {**settings.pod_labels, **extra.labels, **labels, LABEL_ROLE: role}
    }
    annotations = {**settings.pod_annotations, **extra.annotations}
    if annotations:
        metadata["annotations"] = annotations
    return metadata
