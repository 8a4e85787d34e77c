"""What the Kubernetes API says about a stage run, read by pure functions: the outcome of a
``batch/v1`` Job or a KubeRay RayJob, what keeps a pod from working, its exit code, and a hint
for the user per problem."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


def job_outcome(job: Mapping[str, Any]) -> tuple[str, str]:
    """``("running" | "succeeded" | "failed", message)`` of a batch/v1 Job."""
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "succeeded", ""
        if condition.get("type") in ("Failed", "FailureTarget"):
            reason, message = condition.get("reason", ""), condition.get("message", "")
            return "failed", f"Job failed: {reason}: {message}".rstrip(": ")
    return "running", ""


def rayjob_outcome(rayjob: Mapping[str, Any]) -> tuple[str, str]:
    """``("running" | "succeeded" | "failed", message)`` of a RayJob."""
    status = rayjob.get("status") or {}
    job_status, deployment = status.get("jobStatus", ""), status.get("jobDeploymentStatus", "")
    if job_status == "SUCCEEDED":
        return "succeeded", ""
    if job_status in ("FAILED", "STOPPED") or deployment == "Failed":
        reason, message = status.get("reason", ""), status.get("message", "")
        what = f"RayJob {deployment or 'Failed'} (job {job_status or 'not started'})"
        return "failed", f"{what}: {reason}: {message}".rstrip(": ")
    if deployment == "Complete":
        return "failed", f"RayJob Complete without success (job {job_status or 'unknown'})"
    return "running", ""


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
