"""The Kubernetes objects a stage run is made of, built by pure functions (no API calls).

- :func:`build_config_map`: the stage's config file, mounted at ``/etc/llmrl/<stage>.yaml``.
- :func:`build_job_manifest`: a ``batch/v1`` Job for a one-pod stage (``prepare``, ``eval``).
- :func:`build_rayjob_manifest`: a KubeRay ``RayJob`` (``ray.io/v1``) for a Ray stage (``sft``,
  ``grpo``), on its own Ray cluster built from the
  :class:`~llmrl.topology.Topology`: ``inference`` (one pod per engine, ``nvidia.com/gpu`` = its
  GPUs) and ``trainer`` (one pod holding every rank: its GPUs, or its cores shared by CPU
  ranks), or one ``colocated`` group; ``reference`` when dedicated; ``env-workers`` on CPU.
  The worker groups are the pod groups of ``llmrl.topology.placement.plan_groups``' role
  specs, so they offer Ray what it reserves, each GPU requested once. ``sft`` gets the trainer
  group only.

Where the entrypoint (the stage's driver) runs, pinned by the custom Ray resource
``llmrl_driver`` (:data:`DRIVER_RESOURCE`) so it never takes cores a role's bundles need:

- ``grpo``: the driver only orchestrates and logs; the runtime starts a Ray actor per role on
  the placement groups. It runs on the head, which offers Ray exactly one CPU
  (``num-cpus: "1"``) and ``llmrl_driver``; the driver reserves both (no GPU), so nothing else
  is scheduled on the head.
- ``sft`` (:data:`TRAINING_DRIVERS`): the driver is the training process. It runs on the trainer
  group, which offers ``llmrl_driver``, and reserves the trainer's GPUs; the head offers Ray no
  CPU (``num-cpus: "0"``).

The user's code (the pipeline's ``runtime_env``, :mod:`flows.launchers.runtime_env`): a
RayJob carries it in ``runtimeEnvYAML`` beside llmrl's own ``env_vars`` (its submitter, which
uploads local paths, then mounts the shared claim); a Job gets an init container that installs
its ``pip`` packages into an ``emptyDir``, and ``PYTHONPATH`` and env for the rest.

Every object carries the labels of :func:`~flows.launchers.k8s_metadata.run_labels` (with
``llmrl.io/flow-run``), the Kueue queue label when one is set, and an ownerReference to the
flow-run pod when the settings know it; pods add ``llmrl.io/role`` (``job``, ``driver`` for
the RayJob's submitter, ``head``, or the worker group's name) and the settings' labels,
annotations, env and envFrom for that role
(:class:`~flows.launchers.settings.KubernetesSettings`). Every pod meets the "restricted" Pod
Security Standard (``POD_SECURITY_CONTEXT`` and ``CONTAINER_SECURITY_CONTEXT`` of
:mod:`flows.launchers.settings`).
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from flows.launchers.base import stage_arguments

# Names and labels of a stage run's objects; re-exported for the launcher's other modules.
from flows.launchers.k8s_metadata import (  # noqa: F401
    LABEL_FLOW_RUN,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_STAGE,
    object_metadata,
    owner_reference,
    pod_metadata,
    resource_name,
    run_labels,
)
from flows.launchers.runtime_env import (
    PIP_INSTALL_CPUS,
    PIP_INSTALL_MEMORY_GB,
    PYTHONPATH,
    USER_PACKAGES_DIR,
    USER_SITE_PACKAGES,
    RayRuntimeEnv,
    job_code,
    merged_env,
    pip_install_script,
)
from flows.launchers.settings import (
    CONTAINER_SECURITY_CONTEXT,
    KubernetesSettings,
    PodResources,
)

# Which stages run on Ray, train in their driver, or place roles from a topology: the stage
# table's (RAY_STAGES is re-exported for the manifests' users).
from flows.stages import RAY_STAGES, TOPOLOGY_STAGES, TRAINING_DRIVERS  # noqa: F401
from llmrl.topology.model_roles import MODEL_ROLES
from llmrl.topology.placement import plan_groups

if TYPE_CHECKING:
    from llmrl.topology import SchedulingSpec, Topology
    from llmrl.topology.roles import PodGroup

# The KubeRay release llmrl pins (the operator the docs install); RayJobs are built for it.
KUBERAY_VERSION = "1.7.0"
# KubeRay releases whose CRDs every RayJob the launcher builds is tested against (oldest first).
KUBERAY_TESTED_VERSIONS: tuple[str, ...] = ("1.4.2", "1.7.0")
CONFIG_DIR = "/etc/llmrl"
DRIVER_RESOURCE = "llmrl_driver"
"""Custom Ray resource of the one node that hosts a RayJob's entrypoint (the driver)."""
DRIVER_CPUS = 1
"""Ray CPUs the driver reserves (``entrypointNumCpus``); a ``grpo`` head offers exactly these."""

# ------------------------------------------------------------------------ manifests (pure)


def build_config_map(
    name: str, namespace: str, stage: str, config_text: str, flow_run_id: str | None = None
) -> dict[str, Any]:
    """The ConfigMap holding a stage's config file under the key ``<stage>.yaml``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": run_labels(name, stage, flow_run_id),
        },
        "data": {f"{stage}.yaml": config_text},
    }


def stage_command(stage: str, overrides: Sequence[str], config_map: str | None) -> list[str]:
    """The command line a stage pod runs: ``llmrl <stage> --config /etc/llmrl/... --set ...``."""
    config = f"{CONFIG_DIR}/{stage}.yaml" if config_map else None
    return ["llmrl", *stage_arguments(stage, config, overrides)]


def job_resources(stage: str, settings: KubernetesSettings, topology: Topology) -> PodResources:
    """The pod resources of a one-pod stage; ``gpus`` None becomes 1 if the topology has GPUs."""
    resources = settings.jobs.get(stage, PodResources())
    if resources.gpus is None:
        resources = resources.model_copy(update={"gpus": 1 if topology.total_gpus else 0})
    return resources


def build_job_manifest(
    stage: str,
    name: str,
    settings: KubernetesSettings,
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    config_map: str | None = None,
    scheduling: SchedulingSpec | None = None,
    resources: PodResources | None = None,
    flow_run_id: str | None = None,
    runtime_env: RayRuntimeEnv | None = None,
) -> dict[str, Any]:
    """A ``batch/v1`` Job running one stage in one pod (no retries: the flow decides).

    ``resources`` defaults to ``settings.jobs[stage]`` (GPUs left open count as 0 here; the
    launcher resolves them from the topology with :func:`job_resources`). ``runtime_env``: the
    user's code (see the module docstring).

    Raises:
        ValueError: ``runtime_env`` cannot reach a Job (a remote URI) or its ``env_vars``
            clash with llmrl's (named).
    """
    resources = resources or settings.jobs.get(stage, PodResources())
    container = {
        "name": "llmrl",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": stage_command(stage, overrides, config_map),
        "resources": _resources(resources.cpus, resources.memory_gb, resources.gpus or 0),
    }
    labels = run_labels(name, stage, flow_run_id)
    all_env = {**settings.env, **(env or {})}
    runtime_env = runtime_env or RayRuntimeEnv()
    requirements, paths = job_code(runtime_env)
    all_env = merged_env(runtime_env.env_vars, all_env, _pod_env_names(settings, ["job"]))
    if requirements:
        paths = [USER_SITE_PACKAGES, *paths]
    if paths:
        inherited = all_env.get(PYTHONPATH)
        all_env[PYTHONPATH] = ":".join([*paths, *([inherited] if inherited else [])])
    pod = _pod_spec(settings, "job", [container], all_env, config_map, scheduling, shm_gb=None)
    if requirements:
        _add_pip_init_container(pod, settings, runtime_env, requirements)
    pod["restartPolicy"] = "Never"
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
        "template": {"metadata": pod_metadata(settings, labels, "job"), "spec": pod},
    }
    if settings.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    metadata = object_metadata(name, stage, settings, flow_run_id)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def _add_pip_init_container(
    pod: dict[str, Any],
    settings: KubernetesSettings,
    runtime_env: RayRuntimeEnv,
    requirements: list[str],
) -> None:
    """Give a Job's pod the init container that installs ``requirements`` into an
    ``emptyDir`` at :data:`~flows.launchers.runtime_env.USER_PACKAGES_DIR`, with the stage
    container's env (a pip index, a proxy) and mounts (wheels on the shared claim)."""
    (container,) = pod["containers"]
    volume = {"name": "user-packages", "emptyDir": {}}
    mount = {"name": "user-packages", "mountPath": USER_PACKAGES_DIR}
    container["volumeMounts"] = [*container.get("volumeMounts", []), mount]
    pod["volumes"] = [*pod.get("volumes", []), volume]
    init = {
        "name": "user-packages",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["sh", "-c", pip_install_script(runtime_env, requirements)],
        "resources": _resources(PIP_INSTALL_CPUS, PIP_INSTALL_MEMORY_GB, 0),
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        "volumeMounts": copy.deepcopy(container["volumeMounts"]),
    }
    for key in ("env", "envFrom"):
        if key in container:
            init[key] = copy.deepcopy(container[key])
    pod["initContainers"] = [init]


def topology_override(topology: Topology) -> str:
    """``topology=<json>``: the ``--set`` that gives a stage the RayJob's topology (the model
    roles it leaves out stay out)."""
    unset = set(MODEL_ROLES) - set(topology.model_roles())
    data = topology.model_dump(mode="json", exclude=unset)
    return "topology=" + json.dumps(data, separators=(",", ":"))


def build_rayjob_manifest(
    stage: str,
    name: str,
    settings: KubernetesSettings,
    topology: Topology,
    *,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    config_map: str | None = None,
    flow_run_id: str | None = None,
    runtime_env: RayRuntimeEnv | None = None,
) -> dict[str, Any]:
    """A KubeRay ``RayJob`` (ray.io/v1) running one stage on its own Ray cluster.

    The driver runs on the trainer group for a stage of :data:`TRAINING_DRIVERS`, else on the
    head (see the module docstring). ``ttlSecondsAfterFinished`` is 0: KubeRay deletes the Ray
    cluster, and with it the GPUs, the moment the job ends; the submitter's Job (its log) stays
    until the RayJob itself is deleted. ``runtime_env``, the user's code, goes into
    ``runtimeEnvYAML`` with llmrl's env as its ``env_vars``.

    Raises:
        ValueError: ``runtime_env``'s ``env_vars`` clash with llmrl's (named).
    """
    labels = run_labels(name, stage, flow_run_id)
    trains = stage in TRAINING_DRIVERS
    all_env = {**settings.env, **(env or {})}
    runtime_env = runtime_env or RayRuntimeEnv()
    merged_env(runtime_env.env_vars, all_env, _pod_env_names(settings, settings.roles))
    ray_runtime_env = runtime_env.to_ray(all_env)
    head_container = {
        **_ray_container(settings, "ray-head", settings.head),
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
        "template": _ray_pod(settings, labels, "head", head_container, all_env, config_map, None),
    }
    groups = [
        _worker_group(settings, labels, all_env, config_map, *group)
        for group in _ray_groups(stage, topology)
    ]
    submitter_container = {
        "name": "ray-job-submitter",
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "resources": _resources(0.5, 1.0, 0),
    }
    # The submitter runs `ray job submit`, which uploads the runtime_env's local paths.
    submitter_spec = _pod_spec(settings, "driver", [submitter_container], all_env, None, None,
                               shm_gb=None, mount_shared=runtime_env.has_local_paths())  # fmt: skip
    submitter_spec["restartPolicy"] = "Never"
    submitter = {"metadata": pod_metadata(settings, labels, "driver"), "spec": submitter_spec}
    if stage in TOPOLOGY_STAGES:  # the stage places exactly the roles this cluster provides
        overrides = [*overrides, topology_override(topology)]
    spec: dict[str, Any] = {
        "entrypoint": shlex.join(stage_command(stage, overrides, config_map)),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": 0,
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
    if ray_runtime_env:
        spec["runtimeEnvYAML"] = yaml.safe_dump(ray_runtime_env, sort_keys=True)
    if settings.active_deadline_seconds:
        spec["activeDeadlineSeconds"] = settings.active_deadline_seconds
    metadata = object_metadata(name, stage, settings, flow_run_id)
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": spec}


def requested_gpus(manifest: Mapping[str, Any]) -> int:
    """``nvidia.com/gpu`` a Job or RayJob requests while it runs, over all its pods."""
    spec = manifest["spec"]
    if manifest["kind"] == "Job":
        return _template_gpus(spec["template"])
    cluster = spec["rayClusterSpec"]
    total = _template_gpus(cluster["headGroupSpec"]["template"])
    for group in cluster.get("workerGroupSpecs") or []:
        total += int(group.get("replicas", 1)) * _template_gpus(group["template"])
    return total + _template_gpus(spec.get("submitterPodTemplate") or {"spec": {}})


def _template_gpus(template: Mapping[str, Any]) -> int:
    return sum(
        int(container.get("resources", {}).get("requests", {}).get("nvidia.com/gpu", 0))
        for container in template["spec"].get("containers") or []
    )


def _ray_groups(stage: str, topology: Topology) -> list[tuple[PodGroup, bool]]:
    """The worker groups of a stage's Ray cluster, from ``plan_groups``' role specs (what its
    placement groups reserve), and whether each hosts the driver: every pod group for a stage
    of :data:`TOPOLOGY_STAGES`, else the trainer's alone."""
    specs = plan_groups(topology).specs
    pods = specs.pod_groups() if stage in TOPOLOGY_STAGES else (specs.trainer.pod,)
    return [(pod, stage in TRAINING_DRIVERS and pod.name == "trainer") for pod in pods]


def _worker_group(
    settings: KubernetesSettings,
    labels: dict[str, str],
    env: Mapping[str, str],
    config_map: str | None,
    pods: PodGroup,
    driver: bool,
) -> dict[str, Any]:
    container = _ray_container(settings, "ray-worker", pods)
    start = _driver_start_params() if driver else {}
    template = _ray_pod(settings, labels, pods.name, container, env, config_map, pods.scheduling)
    return {
        "groupName": pods.name,
        "replicas": pods.replicas,
        "minReplicas": pods.replicas,
        "maxReplicas": pods.replicas,
        "rayStartParams": start,
        "template": template,
    }


def _driver_start_params() -> dict[str, str]:
    """``rayStartParams`` of the node that hosts the driver: it offers :data:`DRIVER_RESOURCE`."""
    # A shell-quoted JSON mapping: KubeRay pastes it into the `ray start` command line.
    return {"resources": f"'{json.dumps({DRIVER_RESOURCE: 1})}'"}


def _ray_container(
    settings: KubernetesSettings, name: str, resources: PodResources | PodGroup
) -> dict[str, Any]:
    return {
        "name": name,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "resources": _resources(resources.cpus, resources.memory_gb, resources.gpus or 0),
    }


def _ray_pod(
    settings: KubernetesSettings,
    labels: dict[str, str],
    role: str,
    container: dict[str, Any],
    env: Mapping[str, str],
    config_map: str | None,
    scheduling: Any,
) -> dict[str, Any]:
    memory_gb = _memory_gb(container["resources"]["limits"]["memory"])
    spec = _pod_spec(settings, role, [container], env, config_map, scheduling,
                     shm_gb=memory_gb * settings.shm_fraction)  # fmt: skip
    return {"metadata": pod_metadata(settings, labels, role), "spec": spec}


def _pod_spec(
    settings: KubernetesSettings,
    role: str,
    containers: list[dict[str, Any]],
    env: Mapping[str, str],
    config_map: str | None,
    scheduling: Any,
    shm_gb: float | None,
    mount_shared: bool = True,
) -> dict[str, Any]:
    """Containers with env, the config, shared and /dev/shm volumes, and the pod-level settings
    (pull secrets, priority and runtime class, the role's scheduling)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if config_map:
        volumes.append({"name": "stage-config", "configMap": {"name": config_map}})
        mounts.append({"name": "stage-config", "mountPath": CONFIG_DIR, "readOnly": True})
    if settings.shared_claim and mount_shared:
        claim = {"claimName": settings.shared_claim}
        volumes.append({"name": "shared", "persistentVolumeClaim": claim})
        mounts.append({"name": "shared", "mountPath": settings.shared_mount_path})
    if shm_gb:
        shm = {"medium": "Memory", "sizeLimit": _memory(shm_gb)}
        volumes.append({"name": "dshm", "emptyDir": shm})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    env_list, env_from = _container_env(settings, role, env)
    for container in containers:
        container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
        if env_list:
            container["env"] = copy.deepcopy(env_list)
        if env_from:
            container["envFrom"] = copy.deepcopy(env_from)
        if mounts:
            container["volumeMounts"] = list(mounts)
    spec: dict[str, Any] = {"containers": containers}
    if volumes:
        spec["volumes"] = volumes
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    if settings.security_context:
        spec["securityContext"] = dict(settings.security_context)
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in settings.image_pull_secrets]
    if settings.priority_class_name:
        spec["priorityClassName"] = settings.priority_class_name
    if settings.runtime_class_name:
        spec["runtimeClassName"] = settings.runtime_class_name
    if scheduling is not None:
        if scheduling.node_selector:
            spec["nodeSelector"] = dict(scheduling.node_selector)
        if scheduling.tolerations:
            spec["tolerations"] = [dict(t) for t in scheduling.tolerations]
        if scheduling.affinity:
            spec["affinity"] = dict(scheduling.affinity)
    return spec


def _container_env(
    settings: KubernetesSettings, role: str, env: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``env`` and ``envFrom`` of a role's container: the run's variables, HF_TOKEN from its
    Secret, then the role's own entries (a later entry of the same name wins, as in Kubernetes)."""
    entries: dict[str, dict[str, Any]] = {
        key: {"name": key, "value": str(value)} for key, value in sorted(env.items())
    }
    if settings.hf_token_secret is not None:
        secret = settings.hf_token_secret
        ref = {"secretKeyRef": {"name": secret.name, "key": secret.key}}
        entries["HF_TOKEN"] = {"name": "HF_TOKEN", "valueFrom": ref}
    extra = settings.role(role)
    for entry in extra.env:
        entries[entry["name"]] = dict(entry)
    return list(entries.values()), [*settings.env_from, *extra.env_from]


def _pod_env_names(settings: KubernetesSettings, roles: Iterable[str]) -> set[str]:
    """Variables the pods of ``roles`` get from the settings besides ``env``: the HF token and
    each role's own env."""
    names = {"HF_TOKEN"} if settings.hf_token_secret is not None else set()
    for role in roles:
        names.update(entry["name"] for entry in settings.role(role).env)
    return names


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
