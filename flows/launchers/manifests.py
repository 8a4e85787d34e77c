"""The Kubernetes objects a stage run is made of, built by pure functions (no API calls).

- :func:`build_config_map`: the stage's config file, mounted at ``/etc/llmrl/<stage>.yaml``.
- :func:`build_job_manifest`: a ``batch/v1`` Job for a one-pod stage (``prepare``, ``eval``).
- :func:`build_rayjob_manifest`: a KubeRay ``RayJob`` (``ray.io/v1``) for a Ray stage (``sft``,
  ``grpo``), with the worker groups of ``helm/llmrl``'s RayCluster, from the
  :class:`~llmrl.topology.Topology`: ``inference`` (one pod per engine, ``nvidia.com/gpu`` = its
  GPUs) and ``trainer`` (one pod holding every rank: its GPUs, or its cores shared by CPU
  ranks), or one ``colocated`` group; ``reference`` when dedicated; ``env-workers`` on CPU.
  The worker groups advertise to Ray what ``llmrl.topology.placement.plan_groups`` reserves,
  and each GPU is requested once. ``sft`` gets the trainer group only.

Where the entrypoint (the stage's driver) runs, pinned by the custom Ray resource
``llmrl_driver`` (:data:`DRIVER_RESOURCE`) so it never takes cores a role's bundles need:

- ``grpo``: the driver only orchestrates and logs; the runtime starts a Ray actor per role on
  the placement groups. It runs on the head, which offers Ray exactly one CPU
  (``num-cpus: "1"``) and ``llmrl_driver``; the driver reserves both (no GPU), so nothing else
  is scheduled on the head.
- ``sft`` (:data:`TRAINING_DRIVERS`): the driver is the training process. It runs on the trainer
  group, which offers ``llmrl_driver``, and reserves the trainer's GPUs; the head offers Ray no
  CPU (``num-cpus: "0"``).

Every object carries the labels of :func:`run_labels`; pods add ``llmrl.io/role`` (``job``,
``driver`` for the RayJob's submitter, ``head``, or the worker group's name). Every pod meets
the "restricted" Pod Security Standard (:data:`POD_SECURITY_CONTEXT`,
:data:`CONTAINER_SECURITY_CONTEXT`).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from flows.launchers.base import stage_arguments

if TYPE_CHECKING:
    from llmrl.topology import SchedulingSpec, Topology

RAY_STAGES: tuple[str, ...] = ("sft", "grpo")
"""Stages that run as a RayJob; the others run as a one-pod Job."""
CONFIG_DIR = "/etc/llmrl"
DRIVER_RESOURCE = "llmrl_driver"
"""Custom Ray resource of the one node that hosts a RayJob's entrypoint (the driver)."""
DRIVER_CPUS = 1
"""Ray CPUs the driver reserves (``entrypointNumCpus``); a ``grpo`` head offers exactly these."""
TRAINING_DRIVERS: tuple[str, ...] = ("sft",)
"""Ray stages whose driver is the training process (on the trainer group, with its GPUs);
the driver of the others only orchestrates, from the head."""
LABEL_RUN, LABEL_STAGE, LABEL_ROLE = "llmrl.io/run", "llmrl.io/stage", "llmrl.io/role"
# The "restricted" Pod Security Standard: a non-root uid, the runtime's seccomp profile, no
# privilege escalation and no capabilities. The container part is always applied, so a pod
# securityContext overridden in the settings cannot loosen it.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


class PodResources(BaseModel):
    """CPU cores, memory and GPUs of one pod."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(1.0, gt=0, description="CPU cores (requests = limits)")
    memory_gb: float = Field(4.0, gt=0, description="memory in GiB (requests = limits)")
    gpus: int = Field(0, ge=0, description="nvidia.com/gpu")


class KubernetesSettings(BaseModel):
    """Where and how stages run on Kubernetes (the ``kubernetes`` pipeline parameter).

    Example::

        KubernetesSettings(namespace="llmrl", image="ghcr.io/org/llmrl:0.1.0",
                           topology="/etc/llmrl/topology/topology.yaml")
    """

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field("llmrl", description="namespace of the stage Jobs and RayJobs")
    image: str = Field("llmrl:latest", description="the llmrl image of every stage pod")
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    topology: str | None = Field(
        None,
        description="YAML file of an llmrl Topology (or a Helm values file with a `topology` "
        "section); empty: $LLMRL_TOPOLOGY if that file exists (the work pool mounts the chart's "
        "topology ConfigMap at /etc/llmrl/topology/topology.yaml), else the Topology defaults",
    )
    service_account: str | None = Field(None, description="service account of the stage pods")
    shared_claim: str | None = Field(
        "llmrl-shared",
        description="PersistentVolumeClaim mounted in every stage pod (datasets, checkpoints); "
        "the pipeline's work_dir must be on it",
    )
    shared_mount_path: str = Field("/shared", description="where shared_claim is mounted")
    ttl_seconds_after_finished: int = Field(
        3600, ge=0, description="delete finished Jobs (and RayJobs' Ray clusters) after this"
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="fail a stage running longer than this"
    )
    delete_on_failure: bool = Field(True, description="delete a failed stage's Job/RayJob")
    unschedulable_timeout_s: float = Field(
        600, ge=0, description="fail when a pod stays Unschedulable this long (autoscalers)"
    )
    watch_window_s: int = Field(10, ge=1, description="longest wait between pod checks")
    api_retry_s: float = Field(
        120, ge=0, description="keep re-watching through API errors this long before giving up"
    )
    ray_version: str = Field("2.60.0", description="the image's Ray version")
    head: PodResources = Field(
        default_factory=lambda: PodResources(cpus=2, memory_gb=8), description="Ray head pod"
    )
    jobs: dict[str, PodResources] = Field(
        default_factory=lambda: {
            "prepare": PodResources(cpus=2, memory_gb=8),
            "eval": PodResources(cpus=8, memory_gb=32, gpus=1),
        },
        description="resources of the one-pod stages (prepare, eval)",
    )
    security_context: dict[str, Any] = Field(
        default_factory=lambda: copy.deepcopy(POD_SECURITY_CONTEXT),
        description="pod securityContext of every stage pod (the image runs as uid 10001); "
        "each container also gets CONTAINER_SECURITY_CONTEXT, whatever this holds",
    )
    shm_fraction: float = Field(
        0.3, gt=0, le=1, description="/dev/shm of Ray pods, as a share of their memory"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra env of every pod")


# ------------------------------------------------------------------------ manifests (pure)


def resource_name(name: str) -> str:
    """A fresh DNS-1123 name for one stage run: ``llmrl-<name>-<6 hex>`` (at most 37 chars)."""
    base = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:24].strip("-") or "stage"
    return f"llmrl-{base}-{secrets.token_hex(3)}"


def run_labels(name: str, stage: str) -> dict[str, str]:
    """Labels of every object of one stage run; pods add ``llmrl.io/role``."""
    return {
        "app.kubernetes.io/name": "llmrl",
        "app.kubernetes.io/component": stage,
        "app.kubernetes.io/managed-by": "llmrl-flows",
        LABEL_RUN: name,
        LABEL_STAGE: stage,
    }


def build_config_map(name: str, namespace: str, stage: str, config_text: str) -> dict[str, Any]:
    """The ConfigMap holding a stage's config file under the key ``<stage>.yaml``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": run_labels(name, stage)},
        "data": {f"{stage}.yaml": config_text},
    }


def stage_command(stage: str, overrides: Sequence[str], config_map: str | None) -> list[str]:
    """The command line a stage pod runs: ``llmrl <stage> --config /etc/llmrl/... --set ...``."""
    config = f"{CONFIG_DIR}/{stage}.yaml" if config_map else None
    return ["llmrl", *stage_arguments(stage, config, overrides)]


def build_job_manifest(
    stage: str,
    name: str,
    settings: KubernetesSettings,
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    config_map: str | None = None,
    scheduling: SchedulingSpec | None = None,
) -> dict[str, Any]:
    """A ``batch/v1`` Job running one stage in one pod (no retries: the flow decides)."""
    resources = settings.jobs.get(stage, PodResources())
    labels = run_labels(name, stage)
    container = {
        "name": "llmrl",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": stage_command(stage, overrides, config_map),
        "env": _env_list({**settings.env, **(env or {})}),
        "resources": _resources(resources.cpus, resources.memory_gb, resources.gpus),
    }
    pod = _pod_spec(settings, [container], config_map, scheduling, shm_gb=None)
    pod["restartPolicy"] = "Never"
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "template": {"metadata": {"labels": {**labels, LABEL_ROLE: "job"}}, "spec": pod},
    }
    if settings.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    metadata = {"name": name, "namespace": settings.namespace, "labels": labels}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


TOPOLOGY_STAGES: tuple[str, ...] = ("grpo",)
"""Stages that place their roles from a topology: the RayJob hands them its own."""


def topology_override(topology: Topology) -> str:
    """``topology=<json>``: the ``--set`` that gives a stage the RayJob's topology."""
    return "topology=" + json.dumps(topology.model_dump(mode="json"), separators=(",", ":"))


def build_rayjob_manifest(
    stage: str,
    name: str,
    settings: KubernetesSettings,
    topology: Topology,
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    config_map: str | None = None,
) -> dict[str, Any]:
    """A KubeRay ``RayJob`` (ray.io/v1) running one stage on its own Ray cluster.

    The driver runs on the trainer group for a stage of :data:`TRAINING_DRIVERS`, else on the
    head (see the module docstring).
    """
    labels = run_labels(name, stage)
    trains = stage in TRAINING_DRIVERS
    all_env = {**settings.env, **(env or {})}
    head_container = {
        **_ray_container(settings, "ray-head", settings.head, all_env),
        "ports": [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ],
    }
    # The head runs Ray's control plane, and the orchestrating driver (its one CPU) if any.
    head_cpus = "0" if trains else str(DRIVER_CPUS)
    head_start = {"num-cpus": head_cpus, **({} if trains else _driver_start_params())}
    head = {
        "rayStartParams": {**head_start, "dashboard-host": "0.0.0.0"},
        "template": _ray_pod(settings, labels, "head", head_container, config_map, None),
    }
    groups = [
        _worker_group(settings, labels, all_env, config_map, *group)
        for group in _ray_groups(stage, topology)
    ]
    submitter = {
        "metadata": {"labels": {**labels, LABEL_ROLE: "driver"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": settings.image,
                    "imagePullPolicy": settings.image_pull_policy,
                    "resources": _resources(0.5, 1.0, 0),
                    "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
                }
            ],
            **({"securityContext": settings.security_context} if settings.security_context else {}),
        },
    }
    if stage in TOPOLOGY_STAGES:  # the stage places exactly the roles this cluster provides
        overrides = [*overrides, topology_override(topology)]
    spec: dict[str, Any] = {
        "entrypoint": shlex.join(stage_command(stage, overrides, config_map)),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "backoffLimit": 0,
        "submissionMode": "K8sJobMode",
        "entrypointNumCpus": DRIVER_CPUS,
        "entrypointResources": json.dumps({DRIVER_RESOURCE: 1}),
        "submitterPodTemplate": submitter,
        "rayClusterSpec": {
            "rayVersion": settings.ray_version,
            "enableInTreeAutoscaling": False,
            "headGroupSpec": head,
            "workerGroupSpecs": groups,
        },
    }
    if trains and topology.trainer.gpus:
        spec["entrypointNumGpus"] = topology.trainer.gpus
    if all_env:
        spec["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": dict(all_env)}, sort_keys=True)
    if settings.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    metadata = {"name": name, "namespace": settings.namespace, "labels": labels}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": spec}


def _ray_groups(stage: str, topology: Topology) -> list[tuple[str, int, PodResources, Any, bool]]:
    """(group name, replicas, pod resources, scheduling, hosts the driver) per worker group.

    The trainer group is one pod for every rank (``trainer.world_size``): a GPU each, or CPU
    ranks sharing ``trainer.cpus``, as the trainer's placement group asks.
    """
    inference, trainer = topology.inference, topology.trainer
    groups: list[tuple[str, int, PodResources, Any, bool]] = []
    if topology.colocated and stage == "grpo":
        cpus = trainer.cpus + inference.engines * inference.cpus_per_engine
        memory = trainer.memory_gb + inference.engines * inference.memory_gb
        resources = PodResources(cpus=cpus, memory_gb=memory, gpus=trainer.gpus)
        groups.append(("colocated", 1, resources, trainer.scheduling, False))
    else:
        if stage == "grpo":
            engine = PodResources(
                cpus=inference.cpus_per_engine,
                memory_gb=inference.memory_gb,
                gpus=inference.engine_gpus,
            )
            groups.append(("inference", inference.engines, engine, inference.scheduling, False))
        resources = PodResources(cpus=trainer.cpus, memory_gb=trainer.memory_gb, gpus=trainer.gpus)
        groups.append(("trainer", 1, resources, trainer.scheduling, stage in TRAINING_DRIVERS))
    reference = topology.reference
    if stage == "grpo" and reference.placement == "dedicated":
        resources = PodResources(
            cpus=reference.cpus, memory_gb=reference.memory_gb, gpus=reference.gpus
        )
        groups.append(("reference", 1, resources, reference.scheduling, False))
    workers = topology.env_workers
    if stage == "grpo" and workers.count:
        resources = PodResources(cpus=workers.cpus_each, memory_gb=workers.memory_gb)
        groups.append(("env-workers", workers.count, resources, workers.scheduling, False))
    return groups


def _worker_group(
    settings: KubernetesSettings,
    labels: dict[str, str],
    env: Mapping[str, str],
    config_map: str | None,
    group: str,
    replicas: int,
    resources: PodResources,
    scheduling: Any,
    driver: bool,
) -> dict[str, Any]:
    container = _ray_container(settings, "ray-worker", resources, env)
    start = _driver_start_params() if driver else {}
    return {
        "groupName": group,
        "replicas": replicas,
        "minReplicas": replicas,
        "maxReplicas": replicas,
        "rayStartParams": start,
        "template": _ray_pod(settings, labels, group, container, config_map, scheduling),
    }


def _driver_start_params() -> dict[str, str]:
    """``rayStartParams`` of the node that hosts the driver: it offers :data:`DRIVER_RESOURCE`."""
    # A shell-quoted JSON mapping: KubeRay pastes it into the `ray start` command line.
    return {"resources": f"'{json.dumps({DRIVER_RESOURCE: 1})}'"}


def _ray_container(
    settings: KubernetesSettings, name: str, resources: PodResources, env: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "name": name,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "env": _env_list(env),
        "resources": _resources(resources.cpus, resources.memory_gb, resources.gpus),
    }


def _ray_pod(
    settings: KubernetesSettings,
    labels: dict[str, str],
    role: str,
    container: dict[str, Any],
    config_map: str | None,
    scheduling: Any,
) -> dict[str, Any]:
    memory_gb = _memory_gb(container["resources"]["limits"]["memory"])
    spec = _pod_spec(
        settings, [container], config_map, scheduling, shm_gb=memory_gb * settings.shm_fraction
    )
    return {"metadata": {"labels": {**labels, LABEL_ROLE: role}}, "spec": spec}


def _pod_spec(
    settings: KubernetesSettings,
    containers: list[dict[str, Any]],
    config_map: str | None,
    scheduling: Any,
    shm_gb: float | None,
) -> dict[str, Any]:
    """Containers with the config, shared and /dev/shm volumes, and the role's scheduling."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if config_map:
        volumes.append({"name": "stage-config", "configMap": {"name": config_map}})
        mounts.append({"name": "stage-config", "mountPath": CONFIG_DIR, "readOnly": True})
    if settings.shared_claim:
        claim = {"claimName": settings.shared_claim}
        volumes.append({"name": "shared", "persistentVolumeClaim": claim})
        mounts.append({"name": "shared", "mountPath": settings.shared_mount_path})
    if shm_gb:
        shm = {"medium": "Memory", "sizeLimit": _memory(shm_gb)}
        volumes.append({"name": "dshm", "emptyDir": shm})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    for container in containers:
        container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
        if mounts:
            container["volumeMounts"] = list(mounts)
    spec: dict[str, Any] = {"containers": containers}
    if volumes:
        spec["volumes"] = volumes
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.security_context:
        spec["securityContext"] = dict(settings.security_context)
    if scheduling is not None:
        if scheduling.node_selector:
            spec["nodeSelector"] = dict(scheduling.node_selector)
        if scheduling.tolerations:
            spec["tolerations"] = [dict(t) for t in scheduling.tolerations]
        if scheduling.affinity:
            spec["affinity"] = dict(scheduling.affinity)
    return spec


def _resources(cpus: float, memory_gb: float, gpus: int) -> dict[str, Any]:
    amounts = {"cpu": _cpu(cpus), "memory": _memory(memory_gb)}
    limits = {**amounts, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"requests": dict(limits), "limits": limits}


def _cpu(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def _memory(gb: float) -> str:
    return f"{int(gb)}Gi" if float(gb).is_integer() else f"{round(gb * 1024)}Mi"


def _memory_gb(quantity: str) -> float:
    return float(quantity[:-2]) / (1024 if quantity.endswith("Mi") else 1)


def _env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": key, "value": str(value)} for key, value in sorted(env.items())]
