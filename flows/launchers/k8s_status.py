"""What the Kubernetes API says about a stage run, read by pure functions: the outcome of a
``batch/v1`` Job (its ``Complete``/``Failed`` conditions) or a KubeRay RayJob (its
``jobStatus`` and ``jobDeploymentStatus``: the RayJob CRD has no conditions, see
``../shared/kuberay-crds``), what keeps a pod from working, its exit code, a hint for the user per
problem, and the stage error a failed run ends in.

Whether a stage succeeded is decided here, from these statuses alone; its result comes from its
result file (:mod:`flows.launchers.base`), and its log is only shown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flows.launchers.base import StageConfigError, StageError, StageFailedError
from flows.launchers.manifests import LABEL_ROLE

FATAL_WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
HINTS = {
    "ImagePullBackOff": "check kubernetes.image and the cluster's access to the registry",
    "ErrImagePull": "check kubernetes.image and the cluster's access to the registry",
    "OOMKilled": "the container ran out of memory; raise the memory of its role or job",
    "Unschedulable": "no node can hold the pod: check the topology's GPUs/CPUs/memory and its "
    "node selectors and tolerations",
    "CrashLoopBackOff": "the container keeps exiting; its log is above",
}


RAYJOB_FAILED_DEPLOYMENTS = frozenset({"Failed", "ValidationFailed"})
"""``jobDeploymentStatus`` values after which a RayJob never succeeds (KubeRay 1.4-1.7)."""
RAYJOB_FAILED_JOBS = frozenset({"FAILED", "STOPPED"})
"""``jobStatus`` values (the Ray job's own) of a job that ended without success."""
DRIVER_ROLES = ("job", "driver")
"""``llmrl.io/role`` of the pods whose log is the stage's output: a Job's pod, a RayJob's
submitter (it follows the Ray job's log)."""


@dataclass(frozen=True)
class Outcome:
    """Where a run stands: ``state`` is ``running``, ``succeeded`` or ``failed``; ``message``
    says why it failed (naming the Job or RayJob); ``pods`` are its pods as last listed."""

    state: str
    message: str = ""
    pods: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


def job_outcome(job: Mapping[str, Any]) -> tuple[str, str]:
    """``("running" | "succeeded" | "failed", message)`` of a batch/v1 Job."""
    name = (job.get("metadata") or {}).get("name", "?")
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded", ""
        if condition.get("type") in ("Failed", "FailureTarget"):
            reason, message = condition.get("reason", ""), condition.get("message", "")
            return "failed", f"Job {name} failed: {reason}: {message}".rstrip(": ")
    return "running", ""


def rayjob_outcome(rayjob: Mapping[str, Any]) -> tuple[str, str]:
    """``("running" | "succeeded" | "failed", message)`` of a RayJob."""
    name = (rayjob.get("metadata") or {}).get("name", "?")
    status = rayjob.get("status") or {}
    job_status, deployment = status.get("jobStatus", ""), status.get("jobDeploymentStatus", "")
    if job_status == "SUCCEEDED":
        return "succeeded", ""
    if job_status in RAYJOB_FAILED_JOBS or deployment in RAYJOB_FAILED_DEPLOYMENTS:
        reason, message = status.get("reason", ""), status.get("message", "")
        what = f"RayJob {name} {deployment or 'Failed'} (job {job_status or 'not started'})"
        return "failed", f"{what}: {reason}: {message}".rstrip(": ")
    if deployment == "Complete":
        return "failed", f"RayJob {name} Complete without success (job {job_status or 'unknown'})"
    return "running", ""


def outcome_of(kind: str, obj: Mapping[str, Any]) -> tuple[str, str]:
    """The outcome of a ``job`` or a ``rayjob`` (``kind``)."""
    return rayjob_outcome(obj) if kind == "rayjob" else job_outcome(obj)


def drivers(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods of :data:`DRIVER_ROLES`, oldest first."""
    found = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_ROLE) in DRIVER_ROLES]
    return sorted(found, key=lambda p: p["metadata"].get("creationTimestamp") or "")


def failure(label: str, kind: str, outcome: Outcome, log_tail: str) -> StageError:
    """The error a failed run ends in: :class:`StageConfigError` when the stage exited 2 (the
    Job's pod's exit code, the RayJob's status message), else :class:`StageFailedError`; both
    carry the outcome's message and the last lines of the driver's log."""
    tail = log_tail or "(no log)"
    last = drivers(outcome.pods)[-1:] if kind == "job" else []
    exit_code = pod_exit_code(last[0]) if last else None
    if exit_code == 2 or re.search(r"exit code 2\b", outcome.message):
        message = f"bad config or data (exit code 2): {outcome.message}".rstrip(": ")
        return StageConfigError(label, f"{message}\n{tail}")
    return StageFailedError(label, f"{outcome.message}\n{tail}")


def pod_problem(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(reason, description)`` of what keeps a pod from doing its work, or None.

    Reasons: ``Unschedulable`` (PodScheduled=False), a container waiting in one of
    :data:`FATAL_WAITING_REASONS`, ``OOMKilled`` (now or as the last termination), ``Evicted``.
    """
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return "Unschedulable", f"pod {name}: Unschedulable: {condition.get('message', '')}"
    if status.get("reason") == "Evicted":
        return "Evicted", f"pod {name}: Evicted: {status.get('message', '')}"
    containers = [*(status.get("initContainerStatuses") or [])]
    containers += status.get("containerStatuses") or []
    for container in containers:
        where = f"pod {name} container {container.get('name', '?')}"
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            return waiting["reason"], f"{where}: {waiting['reason']}: {waiting.get('message', '')}"
        for state in (container.get("state"), container.get("lastState")):
            terminated = (state or {}).get("terminated") or {}
            if terminated.get("reason") == "OOMKilled":
                code = terminated.get("exitCode", 137)
                return "OOMKilled", f"{where}: OOMKilled (exit code {code})"
    return None


def pod_exit_code(pod: Mapping[str, Any]) -> int | None:
    """The exit code of a pod's first terminated container, if any."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated and "exitCode" in terminated:
            return int(terminated["exitCode"])
    return None
