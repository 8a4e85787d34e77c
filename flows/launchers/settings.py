"""Where and how stages run on Kubernetes: :class:`KubernetesSettings` (the pipeline's
``kubernetes`` parameter) and the pod-level knobs a platform engineer sets per role.

Settings come from two places, merged field by field:

1. the file named by ``$LLMRL_KUBERNETES_SETTINGS`` (the Helm chart renders it into its
   ConfigMap as ``kubernetes.yaml`` from its values: image, service account, volume, pull
   secrets, priority class, Kueue queue, per-role env ...; the work pool mounts it into the
   flow-run pod), then
2. the fields given explicitly in the flow run's parameters, which win.

:func:`effective_settings` does the merge. Pod roles (:data:`POD_ROLES`): ``job`` (a one-pod
stage), ``driver`` (a RayJob's submitter), ``head``, and the Ray worker groups ``inference``,
``trainer``, ``colocated``, ``reference``, ``env-workers`` and the model roles' ``teacher``,
``judge``, ``reward-model``.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SETTINGS_ENV = "LLMRL_KUBERNETES_SETTINGS"
"""Environment variable naming the chart-rendered settings file (see the module docstring)."""
OWNER_NAME_ENV, OWNER_UID_ENV = "LLMRL_OWNER_POD_NAME", "LLMRL_OWNER_POD_UID"
"""Set by the work pool's job template (downward API) to the flow-run pod's name and uid."""
POD_ROLES: tuple[str, ...] = (
    "job",
    "driver",
    "head",
    "inference",
    "trainer",
    "colocated",
    "reference",
    "env-workers",
    "teacher",
    "judge",
    "reward-model",
)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RESULTS_FOLDER = "stage-results"
"""The folder under ``shared_mount_path`` that holds the stages' result files."""

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
    """CPU cores, memory and GPUs of one pod; ``gpus`` None = 1 when the topology has GPUs,
    else 0 (so one values file's ``eval`` job fits both a CPU and a GPU cluster)."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(1.0, gt=0, description="CPU cores (requests = limits)")
    memory_gb: float = Field(4.0, gt=0, description="memory in GiB (requests = limits)")
    gpus: int | None = Field(
        0, ge=0, description="nvidia.com/gpu; null = 1 if the topology has any"
    )


class SecretRef(BaseModel):
    """A key of an existing Secret in the stages' namespace."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="name of the Secret")
    key: str = Field(min_length=1, description="key inside it")


class OwnerPod(BaseModel):
    """The flow-run pod; stage Jobs and RayJobs become its dependents, so when it is deleted
    (the flow run cancelled, its Job deleted, the pod evicted, or the Job's TTL after a crash)
    Kubernetes' garbage collector deletes them too."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)

    @classmethod
    def from_environment(cls) -> OwnerPod | None:
        """The owner named by :data:`OWNER_NAME_ENV` / :data:`OWNER_UID_ENV`, if both are set."""
        name, uid = os.environ.get(OWNER_NAME_ENV), os.environ.get(OWNER_UID_ENV)
        return cls(name=name, uid=uid) if name and uid else None


class RolePods(BaseModel):
    """Extra env, envFrom, labels and annotations of one pod role's pods."""

    model_config = ConfigDict(extra="forbid")

    env: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes EnvVar objects (value or valueFrom)"
    )
    env_from: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Kubernetes EnvFromSource objects (configMapRef/secretRef)",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="pod labels")
    annotations: dict[str, str] = Field(default_factory=dict, description="pod annotations")


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
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="names of Secrets to pull the image with"
    )
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
    shared_mount_path: str = Field(
        "/shared",
        description="where shared_claim is mounted, in the stage pods and in the flow-run pod "
        "that launches them (stages hand their results back in <shared_mount_path>/"
        f"{RESULTS_FOLDER})",
    )
    ttl_seconds_after_finished: int = Field(
        3600,
        ge=0,
        description="delete finished Jobs (prepare, eval) after this; a finished pod holds no "
        "GPU. RayJobs always shut their Ray cluster down the moment the job ends (TTL 0) and the "
        "launcher deletes them once it has read the summary",
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
            "eval": PodResources(cpus=8, memory_gb=32, gpus=None),
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
    env_from: list[dict[str, Any]] = Field(
        default_factory=list, description="EnvFromSource objects of every stage container"
    )
    pod_labels: dict[str, str] = Field(default_factory=dict, description="labels of every pod")
    pod_annotations: dict[str, str] = Field(
        default_factory=dict, description="annotations of every pod"
    )
    roles: dict[str, RolePods] = Field(
        default_factory=dict, description=f"per pod role additions; roles: {', '.join(POD_ROLES)}"
    )
    priority_class_name: str | None = Field(None, description="priorityClassName of every pod")
    runtime_class_name: str | None = Field(None, description="runtimeClassName of every pod")
    hf_token_secret: SecretRef | None = Field(
        None, description="Secret key given to every stage container as HF_TOKEN"
    )
    kueue_queue: str | None = Field(
        None, description=f"Kueue LocalQueue: label {KUEUE_QUEUE_LABEL} on every Job and RayJob"
    )
    owner_pod: OwnerPod | None = Field(
        None,
        description=f"the flow-run pod, owner of every stage object; empty: "
        f"${OWNER_NAME_ENV} and ${OWNER_UID_ENV} when set",
    )

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, value: dict[str, RolePods]) -> dict[str, RolePods]:
        unknown = sorted(set(value) - set(POD_ROLES))
        if unknown:
            raise ValueError(f"unknown pod role(s) {unknown}; expected some of {list(POD_ROLES)}")
        return value

    @property
    def results_dir(self) -> Path:
        """The folder on the shared claim where stages write their result files."""
        return Path(self.shared_mount_path) / RESULTS_FOLDER

    def role(self, name: str) -> RolePods:
        """The additions of one pod role (empty when not configured)."""
        return self.roles.get(name) or RolePods()


def effective_settings(settings: KubernetesSettings) -> KubernetesSettings:
    """``settings`` on top of the file in ``$LLMRL_KUBERNETES_SETTINGS``: fields set explicitly
    in ``settings`` win, the file fills the rest, and ``owner_pod`` falls back to the env.

    Raises:
        ValueError: the file is unreadable or not valid settings (names the file and field).
    """
    path = os.environ.get(SETTINGS_ENV)
    merged = settings
    if path:
        base = load_settings_file(path)
        explicit = settings.model_dump(include=settings.model_fields_set)
        merged = KubernetesSettings.model_validate({**base.model_dump(), **explicit})
    if merged.owner_pod is None:
        owner = OwnerPod.from_environment()
        if owner is not None:
            merged = merged.model_copy(update={"owner_pod": owner})
    return merged


def load_settings_file(path: str | Path) -> KubernetesSettings:
    """The :class:`KubernetesSettings` in a YAML file (the chart's ``kubernetes.yaml``)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        return KubernetesSettings.model_validate(data)
    except OSError as error:
        raise ValueError(f"{path} (${SETTINGS_ENV}): cannot read: {error}") from None
    except (yaml.YAMLError, ValidationError) as error:
        message = f"{path} (${SETTINGS_ENV}): not valid Kubernetes settings: {error}"
        raise ValueError(message) from None
