"""The scripted life of a Job or RayJob in the fake Kubernetes API
(:mod:`tests.flows.fake_k8s_api`): the controllers' part (the Job controller, KubeRay, the
kubelet) and the stage's.

:class:`Scenario` makes the run's pods (a RayJob first gets its RayCluster), then plays the
scenario's steps, :attr:`~tests.flows.fake_k8s_api.FakeKubernetes.step_s` apart, until the run
ends or is deleted. Statuses are what the real controllers write: a Job's ``Complete``/``Failed``
conditions, a RayJob's ``jobStatus``/``jobDeploymentStatus``/``reason``/``message`` as KubeRay
1.7 sets them (the RayJob CRD has no conditions).

The stage does what ``llmrl`` does: it prints its config and its summary (the log), and when it
succeeds writes its result to ``$LLMRL_RESULT_FILE`` as the process that runs it sees that
variable (a Job's container env; a RayJob's ``runtimeEnvYAML`` over the env of the pod that
hosts the entrypoint). The file reaches the test only as a real pod's would: through the fake's
shared claim (:attr:`~tests.flows.fake_k8s_api.FakeKubernetes.shared_claim`), mounted in that
pod at a folder above the file; anywhere else it lands on the container's own disk, and is lost.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml

from flows.launchers.manifests import DRIVER_RESOURCE
from llmrl.stages.result_file import RESULT_FILE_ENV

if TYPE_CHECKING:
    from tests.flows.fake_k8s_api import FakeKubernetes


class Scenario:
    """One created Job or RayJob (``kind``: ``jobs`` or ``rayjobs``) playing the fake's
    scenario; :meth:`play` runs it (in a thread of its own)."""

    def __init__(self, fake: FakeKubernetes, kind: str, obj: dict[str, Any]) -> None:
        self.fake, self.kind, self.obj = fake, kind, obj
        self.namespace, self.name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        self.stage = obj["metadata"]["labels"].get("llmrl.io/stage", "eval")
        self.pods: list[dict[str, Any]] = []
        self.stage_pod: dict[str, Any] = {}  # where the stage's process runs

    @property
    def driver(self) -> dict[str, Any]:
        """The pod whose log is the stage's output: the Job's pod, the RayJob's submitter."""
        return self.pods[-1]

    @property
    def log(self) -> list[str]:
        return self.fake.logs[(self.namespace, self.driver["metadata"]["name"])]

    def play(self) -> None:
        """Make the pods, then play the steps until the run ends or is deleted."""
        key = (self.kind, self.namespace, self.name)
        with self.fake.lock:
            if key not in self.fake.objects:
                return
            self._make_pods()
        for step in self._steps():
            time.sleep(self.fake.step_s)
            with self.fake.lock:
                if key not in self.fake.objects:
                    return  # deleted: the scenario ends
                step()

    def _steps(self) -> list[Callable[[], None]]:
        return {
            "success": [self.running, self.finish_success],
            "config_error": [self.running, self.finish_config_error],
            "crash": [self.running, self.finish_crash],
            "oom": [self.running, self.oom],
            "unschedulable": [self.unschedulable],
            "imagepull": [self.image_pull],
            "hang": [self.running, *[self.progress] * 10_000],
            "api_error": [],
        }[self.fake.scenario]

    # -- pods

    def _make_pods(self) -> None:
        """The run's pods, Pending; the driver (job pod or RayJob submitter) is the last one.

        A Job owns its pod; a RayJob owns its RayCluster (which owns the Ray pods) and its
        submitter pod (really through a submitter Job)."""
        spec, owner = self.obj["spec"], owner_of(self.obj)
        if self.kind == "jobs":
            self.stage_pod = self._make_pod("job", spec["template"], owner)
            return
        cluster = self.fake.store(
            "rayclusters",
            self.namespace,
            {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "metadata": {
                    "name": f"{self.name}-{uuid.uuid4().hex[:5]}",
                    "labels": dict(self.obj["metadata"].get("labels") or {}),
                    "ownerReferences": [owner],
                },
                "spec": copy.deepcopy(spec["rayClusterSpec"]),
            },
        )
        self.obj["status"] = {"rayClusterName": cluster["metadata"]["name"]}
        ray_owner, head = owner_of(cluster), spec["rayClusterSpec"]["headGroupSpec"]
        self.stage_pod = self._make_pod("head", head["template"], ray_owner)
        for group in spec["rayClusterSpec"].get("workerGroupSpecs") or []:
            for index in range(group.get("replicas", 1)):
                pod = self._make_pod(f"{group['groupName']}-{index}", group["template"], ray_owner)
                if DRIVER_RESOURCE in str(group.get("rayStartParams", {}).get("resources", "")):
                    self.stage_pod = pod  # the entrypoint needs the resource this node offers
        self._make_pod("submitter", spec["submitterPodTemplate"], owner)

    def _make_pod(self, suffix: str, template: dict[str, Any], owner: dict[str, Any]) -> dict:
        pod_name = f"{self.name}-{suffix}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "ownerReferences": [owner],
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", "conditions": []},
        }
        self.pods.append(self.fake.store("pods", self.namespace, pod))
        self.fake.logs[(self.namespace, pod_name)] = []
        return pod

    # -- the stage's result

    def stage_env(self) -> dict[str, str]:
        """The environment of the stage's process (plain ``value`` entries only)."""
        container = self.stage_pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        runtime_env = yaml.safe_load(self.obj["spec"].get("runtimeEnvYAML") or "{}") or {}
        return {**env, **(runtime_env.get("env_vars") or {})} if self.kind == "rayjobs" else env

    def write_result(self) -> None:
        """Write the result file as the stage would (see the module docstring)."""
        target = self.stage_env().get(RESULT_FILE_ENV)
        local = self.fake.shared_path(self.stage_pod, target) if target else None
        if local is None or not self.fake.write_result:
            return
        result = {"path": self.fake.summary_path} if self.stage == "prepare" else self.fake.summary
        local.parent.mkdir(parents=True, exist_ok=True)
        text = self.fake.result_text if self.fake.result_text is not None else json.dumps(result)
        local.write_text(text, encoding="utf-8")

    # -- the steps

    def running(self) -> None:
        for pod in self.pods:
            set_running(pod)
            self.fake.bump(pod)
        if self.kind == "rayjobs":
            status = self.obj.setdefault("status", {})
            status.update({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
            self.fake.bump(self.obj)
        self.log.extend([f"stage: {self.stage}", "seed: 0", "progress: false"])
        self.fake.lock.notify_all()

    def finish_success(self) -> None:
        last = self.fake.summary_path if self.stage == "prepare" else json.dumps(self.fake.summary)
        trailer = ["------", "Job 'raysubmit_1' succeeded", "------"]
        self.log.extend(["INFO llmrl: step 1", "INFO llmrl: step 2", last])
        self.log.extend(trailer if self.kind == "rayjobs" else [])
        self.write_result()
        set_terminated(self.driver, 0, "Completed")
        self.fake.bump(self.driver)
        set_success(self.kind, self.obj)
        self.fake.bump(self.obj)

    def finish_config_error(self) -> None:
        self.log.append(
            f"llmrl {self.stage}: error: --set max_new_tokens=0: max_new_tokens: "
            "Input should be greater than or equal to 1"
        )
        set_terminated(self.driver, 2 if self.kind == "jobs" else 1, "Error")
        self.fake.bump(self.driver)
        set_failure(self.kind, self.obj, "Job entrypoint command failed with exit code 2")
        self.fake.bump(self.obj)

    def finish_crash(self) -> None:
        self.log.extend(["Traceback (most recent call last):", "RuntimeError: boom"])
        set_terminated(self.driver, 1, "Error")
        self.fake.bump(self.driver)
        message = "Job has reached the specified backoff limit"
        if self.kind == "rayjobs":
            message = "Job entrypoint command failed with exit code 1"
        set_failure(self.kind, self.obj, message)
        self.fake.bump(self.obj)

    def oom(self) -> None:
        pods = self.pods
        victim = self.driver if self.kind == "jobs" else pods[1 if len(pods) > 2 else 0]
        set_terminated(victim, 137, "OOMKilled")
        if self.kind == "rayjobs":  # a Ray worker restarts: the OOM is its last state
            status = victim["status"]["containerStatuses"][0]
            status["lastState"] = status.pop("state")
            status["state"] = {"running": {}}
            status["restartCount"] = 1
            victim["status"]["phase"] = "Running"
        self.fake.bump(victim)
        if self.kind == "jobs":
            set_failure(self.kind, self.obj, "Job has reached the specified backoff limit")
            self.fake.bump(self.obj)

    def unschedulable(self) -> None:
        for pod in self.pods:
            pod["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ]
            self.fake.bump(pod)

    def image_pull(self) -> None:
        waiting = {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "llmrl:missing"',
        }
        for pod in self.pods:
            pod["status"]["containerStatuses"] = [
                {"name": name, "ready": False, "restartCount": 0, "state": {"waiting": waiting}}
                for name in container_names(pod)
            ]
            self.fake.bump(pod)

    def progress(self) -> None:
        self.log.append("INFO llmrl: still training")
        self.fake.lock.notify_all()


def mounted_claim_path(pod: dict[str, Any], claim: str, path: str) -> PurePosixPath | None:
    """Where ``path`` lies inside the PersistentVolumeClaim ``claim`` as the pod's first
    container sees it (relative to the claim's root), or None when no mount of it holds it."""
    volumes = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    }
    target = PurePosixPath(path)
    for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
        if volumes.get(mount["name"]) != claim:
            continue
        root = PurePosixPath(mount["mountPath"]) / mount.get("subPath", "")
        if target.is_relative_to(root) and target != root:
            return target.relative_to(root)
    return None


def container_names(pod: dict[str, Any]) -> list[str]:
    return [container["name"] for container in pod["spec"]["containers"]]


def owner_of(obj: dict[str, Any], *, controller: bool = True, block: bool = True) -> dict:
    """An ownerReference to ``obj``; by default the one a controller puts on what it creates
    for ``obj`` (``controller``, ``blockOwnerDeletion``)."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": block,
    }


def set_running(pod: dict[str, Any]) -> None:
    pod["status"]["phase"] = "Running"
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    pod["status"]["containerStatuses"] = [
        {"name": name, "ready": True, "restartCount": 0, "state": {"running": {}}}
        for name in container_names(pod)
    ]


def set_terminated(pod: dict[str, Any], code: int, reason: str) -> None:
    pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
    pod["status"]["containerStatuses"] = [
        {
            "name": name,
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}},
        }
        for name in container_names(pod)
    ]


def set_success(kind: str, obj: dict[str, Any]) -> None:
    """A Job's ``Complete`` condition; a RayJob's ``SUCCEEDED`` job, ``Complete`` deployment."""
    if kind == "jobs":
        obj["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    else:
        obj.setdefault("status", {}).update(
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
        )


def set_failure(kind: str, obj: dict[str, Any], message: str) -> None:
    """A Job's ``Failed`` condition; a failed RayJob as KubeRay 1.7 leaves it (``Failed``
    deployment, ``AppFailed``, the Ray job's message)."""
    if kind == "jobs":
        condition = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
        obj["status"] = {"failed": 1, "conditions": [{**condition, "message": message}]}
    else:
        obj.setdefault("status", {}).update(
            {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": message,
            }
        )
