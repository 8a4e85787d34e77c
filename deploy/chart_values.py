"""The values of the ``helm/llmrl`` chart, as a pydantic model; its JSON schema is the chart's.

``scripts/chart_schema.py`` writes ``ChartValues``' JSON schema to
``helm/llmrl/values.schema.json``, so ``helm install``/``template``/``lint`` reject unknown keys
and wrong types before any template renders. The ``topology`` section is a
:class:`~llmrl.topology.spec.Topology`; the rest describes the platform services. Chart keys use
Helm's camelCase; ``topology`` keeps the snake_case of the Python model it is.

Secrets never appear here, only the names of existing Secrets and the keys inside them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from llmrl.core.config_loading import ConfigModel
from llmrl.topology.spec import Topology

PREFECT_VERSION = "3.8.8"
"""The Prefect release llmrl is built and tested with (prefect.yaml's prefect-version)."""
MLFLOW_VERSION = "3.17.2"
"""The MLflow release of llmrl's client; the chart's server runs the same."""

Quantity = str | float
PullPolicy = Literal["IfNotPresent", "Always", "Never"]


class ImageSpec(ConfigModel):
    """A container image."""

    repository: str = Field(description="image repository, e.g. ghcr.io/org/llmrl")
    tag: str = Field("", description="image tag; empty uses the chart's appVersion")
    pullPolicy: PullPolicy = Field("IfNotPresent", description="Kubernetes imagePullPolicy")


class ResourceList(ConfigModel):
    """CPU and memory of a container (Kubernetes quantities)."""

    cpu: Quantity = Field(description="CPU, e.g. 500m or 2")
    memory: Quantity = Field(description="memory, e.g. 512Mi or 4Gi")


class Resources(ConfigModel):
    """Requests and limits of a container; both are required for every container."""

    requests: ResourceList = Field(description="what the scheduler reserves")
    limits: ResourceList = Field(description="what the container may use at most")


class SecretKeyRef(ConfigModel):
    """A key of an existing Secret (created outside the chart); empty name = not used."""

    name: str = Field("", description="name of an existing Secret in the release namespace")
    key: str = Field("", description="key inside that Secret")


class ServiceAccountValues(ConfigModel):
    """The service account of the Prefect worker and of the flow-run Jobs it starts."""

    create: bool = Field(True, description="create the ServiceAccount")
    name: str = Field("", description="its name; empty derives it from the release")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="annotations, e.g. for workload identity"
    )


class RbacValues(ConfigModel):
    """The namespaced Role of the launcher (RayJobs, Jobs, pods, logs, events)."""

    create: bool = Field(True, description="create the Role and RoleBinding")


class PodSecurityValues(ConfigModel):
    """User and group ids every pod of the chart runs as (non-root)."""

    runAsUser: int = Field(10001, ge=1, description="uid of every container")
    runAsGroup: int = Field(10001, ge=1, description="gid of every container")
    fsGroup: int = Field(10001, ge=1, description="group that owns mounted volumes")


class StorageValues(ConfigModel):
    """The shared ReadWriteMany volume for datasets, checkpoints and the model cache."""

    existingClaim: str = Field("", description="use this PVC instead of creating one")
    storageClass: str = Field(
        "", description="storage class of the created PVC (must support RWX); empty = default"
    )
    size: str = Field("500Gi", description="size of the created PVC")
    mountPath: str = Field("/shared", description="where every Ray pod mounts it")


class SchedulingValues(ConfigModel):
    """Scheduling constraints of a platform pod (Kubernetes keys)."""

    nodeSelector: dict[str, str] = Field(default_factory=dict, description="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="tolerations")
    affinity: dict[str, Any] = Field(default_factory=dict, description="affinity")


class PodExtrasValues(ConfigModel):
    """Extra env, envFrom, labels and annotations of one kind of pod."""

    env: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes EnvVar objects ({name, value|valueFrom})"
    )
    envFrom: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes EnvFromSource objects (secretRef, ...)"
    )
    podLabels: dict[str, str] = Field(default_factory=dict, description="pod labels")
    podAnnotations: dict[str, str] = Field(default_factory=dict, description="pod annotations")


class StageRolesValues(ConfigModel):
    """Per-role additions to the stage pods (merged after ``stagePods.env``/``envFrom``)."""

    job: PodExtrasValues = Field(default_factory=PodExtrasValues, description="prepare/eval pod")
    driver: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="a RayJob's submitter pod"
    )
    head: PodExtrasValues = Field(default_factory=PodExtrasValues, description="Ray head pods")
    inference: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="inference engine pods"
    )
    trainer: PodExtrasValues = Field(default_factory=PodExtrasValues, description="trainer pod")
    colocated: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="the colocated engines+trainer pod"
    )
    reference: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="dedicated reference pod"
    )
    envWorkers: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="environment worker pods"
    )
    teacher: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="a teacher's engine pods"
    )
    judge: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="a judge's engine pods"
    )
    rewardModel: PodExtrasValues = Field(
        default_factory=PodExtrasValues, description="a reward model's engine pods"
    )


class JobPodValues(ConfigModel):
    """Resources of a one-pod stage (prepare, eval)."""

    cpus: float = Field(gt=0, description="CPU cores")
    memoryGb: float = Field(gt=0, description="memory in GiB")
    gpus: int | None = Field(
        None, ge=0, description="GPUs; null = 1 when the topology has GPUs, else 0"
    )


class RayHeadValues(ConfigModel):
    """The Ray head pod of each stage's cluster: CPU only."""

    cpus: float = Field(2, gt=0, description="CPU cores of the head pod")
    memoryGb: float = Field(8, gt=0, description="memory of the head pod, in GiB")


class StagePodsValues(ConfigModel):
    """The pods of the stages the pipeline launches: a Job per one-pod stage, a RayJob (its own
    Ray cluster, gone when the stage ends) per Ray stage. The chart renders these values into
    ``kubernetes.yaml`` of its ConfigMap, which the flow-run pod's launcher starts from."""

    rayVersion: str = Field("2.60.0", description="Ray version of the image (KubeRay uses it)")
    shmFraction: float = Field(
        0.3, gt=0, le=1, description="size of each Ray pod's /dev/shm, as a share of its memory"
    )
    head: RayHeadValues = Field(default_factory=RayHeadValues, description="Ray head pods")
    jobs: dict[Literal["prepare", "eval"], JobPodValues] = Field(
        default_factory=lambda: {
            "prepare": JobPodValues(cpus=2, memoryGb=8, gpus=0),
            "eval": JobPodValues(cpus=8, memoryGb=32, gpus=None),
        },
        description="resources of the one-pod stages",
    )
    ttlSecondsAfterFinished: int = Field(
        3600, ge=0, description="delete finished stage Jobs after this (RayJobs: at once)"
    )
    env: list[dict[str, Any]] = Field(
        default_factory=list, description="EnvVar objects of every stage container"
    )
    envFrom: list[dict[str, Any]] = Field(
        default_factory=list, description="EnvFromSource objects of every stage container"
    )
    roles: StageRolesValues = Field(
        default_factory=StageRolesValues, description="per-role env, envFrom, labels, annotations"
    )


class HuggingFaceValues(ConfigModel):
    """Hugging Face Hub access of the stage pods."""

    tokenSecret: SecretKeyRef = Field(
        default_factory=SecretKeyRef,
        description="existing Secret key given to every stage container as HF_TOKEN",
    )


class KueueValues(ConfigModel):
    """Kueue admission of the stages (optional)."""

    queueName: str = Field(
        "", description="LocalQueue: label kueue.x-k8s.io/queue-name on every stage Job/RayJob"
    )


class PrefectWorkerValues(ConfigModel):
    """The Prefect worker that turns flow runs into Kubernetes Jobs."""

    enabled: bool = Field(True, description="deploy the worker")
    image: ImageSpec = Field(
        default_factory=lambda: ImageSpec(
            repository="prefecthq/prefect", tag=f"{PREFECT_VERSION}-python3.11-kubernetes"
        ),
        description="image with prefect and prefect-kubernetes",
    )
    clusterUid: str = Field(
        "llmrl",
        description=(
            "PREFECT_KUBERNETES_CLUSTER_UID; set so the worker need not read the kube-system "
            "namespace (a cluster-scoped permission)"
        ),
    )
    apiKey: SecretKeyRef = Field(
        default_factory=SecretKeyRef, description="PREFECT_API_KEY from a Secret (Prefect Cloud)"
    )
    env: list[dict[str, Any]] = Field(
        default_factory=list, description="extra EnvVar objects of the container"
    )
    envFrom: list[dict[str, Any]] = Field(
        default_factory=list, description="EnvFromSource objects of the container"
    )
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests=ResourceList(cpu="100m", memory="256Mi"),
            limits=ResourceList(cpu="500m", memory="512Mi"),
        ),
        description="requests and limits",
    )


class PrefectServerValues(ConfigModel):
    """An in-cluster Prefect server (off by default: point prefect.apiUrl at yours)."""

    enabled: bool = Field(False, description="deploy a Prefect server")
    image: ImageSpec = Field(
        default_factory=lambda: ImageSpec(
            repository="prefecthq/prefect", tag=f"{PREFECT_VERSION}-python3.11"
        ),
        description="Prefect image",
    )
    port: int = Field(4200, ge=1, le=65535, description="port of the server and its Service")
    database: SecretKeyRef = Field(
        default_factory=SecretKeyRef,
        description=(
            "PREFECT_API_DATABASE_CONNECTION_URL from a Secret; empty = SQLite on an emptyDir "
            "(lost when the pod restarts)"
        ),
    )
    env: list[dict[str, Any]] = Field(
        default_factory=list, description="extra EnvVar objects of the container"
    )
    envFrom: list[dict[str, Any]] = Field(
        default_factory=list, description="EnvFromSource objects of the container"
    )
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests=ResourceList(cpu="250m", memory="512Mi"),
            limits=ResourceList(cpu="1", memory="1Gi"),
        ),
        description="requests and limits",
    )


class PrefectValues(ConfigModel):
    """Prefect: the API the worker and flow runs talk to, the work pool, the deployment."""

    apiUrl: str = Field(
        "http://prefect-server.prefect.svc:4200/api",
        description="PREFECT_API_URL; empty = the in-chart server (prefect.server.enabled)",
    )
    workPool: str = Field("llmrl-k8s", description="Kubernetes work pool the worker polls")
    deployment: str = Field(
        "llmrl-pipeline/default", description="the pipeline deployment (shown in NOTES)"
    )
    worker: PrefectWorkerValues = Field(
        default_factory=PrefectWorkerValues, description="the worker"
    )
    server: PrefectServerValues = Field(
        default_factory=PrefectServerValues, description="optional server"
    )

    @model_validator(mode="after")
    def _has_api(self) -> PrefectValues:
        if not self.apiUrl and not self.server.enabled:
            raise ValueError("apiUrl: required unless prefect.server.enabled is true")
        return self


class MlflowArtifactsValues(ConfigModel):
    """Where MLflow stores artifacts (S3 or MinIO), proxied by the server."""

    destination: str = Field(
        "s3://mlflow/artifacts", description="--artifacts-destination, e.g. s3://bucket/prefix"
    )
    s3EndpointUrl: str = Field("", description="MLFLOW_S3_ENDPOINT_URL for MinIO; empty = AWS S3")
    credentialsSecret: str = Field(
        "", description="existing Secret with the S3 credentials; empty = use the pod's identity"
    )
    accessKeyIdKey: str = Field("AWS_ACCESS_KEY_ID", description="its access key id key")
    secretAccessKeyKey: str = Field(
        "AWS_SECRET_ACCESS_KEY", description="its secret access key key"
    )


class MlflowValues(ConfigModel):
    """The MLflow tracking server, or the URI of an external one."""

    enabled: bool = Field(True, description="deploy an MLflow server")
    externalUri: str = Field("", description="tracking URI of an external server when disabled")
    image: ImageSpec = Field(
        default_factory=lambda: ImageSpec(
            repository="ghcr.io/llmrl/llmrl-mlflow", tag=MLFLOW_VERSION
        ),
        description="MLflow server image with psycopg and boto3 (the Dockerfile's mlflow "
        "target), at the MLflow version of llmrl's client",
    )
    port: int = Field(5000, ge=1, le=65535, description="port of the server and its Service")
    backendStore: SecretKeyRef = Field(
        default_factory=lambda: SecretKeyRef(name="llmrl-mlflow-db", key="uri"),
        description="existing Secret key holding the Postgres URI (postgresql://...)",
    )
    artifacts: MlflowArtifactsValues = Field(
        default_factory=MlflowArtifactsValues, description="artifact store"
    )
    env: list[dict[str, Any]] = Field(
        default_factory=list, description="extra EnvVar objects of the container"
    )
    envFrom: list[dict[str, Any]] = Field(
        default_factory=list, description="EnvFromSource objects of the container"
    )
    resources: Resources = Field(
        default_factory=lambda: Resources(
            requests=ResourceList(cpu="250m", memory="512Mi"),
            limits=ResourceList(cpu="1", memory="2Gi"),
        ),
        description="requests and limits",
    )

    @model_validator(mode="after")
    def _reachable(self) -> MlflowValues:
        if self.enabled and not (self.backendStore.name and self.backendStore.key):
            raise ValueError(
                "backendStore: name and key of an existing Secret are required when enabled"
            )
        if not self.enabled and not self.externalUri:
            raise ValueError("externalUri: required when mlflow.enabled is false")
        return self


class ChartValues(ConfigModel):
    """Every value of the ``helm/llmrl`` chart; ``values.yaml`` and overrides must validate.

    Example::

        ChartValues.model_validate(yaml.safe_load(open("helm/llmrl/values.yaml")))
    """

    nameOverride: str = Field("", description="replaces the chart name in resource names")
    fullnameOverride: str = Field("", description="replaces the full resource name prefix")
    image: ImageSpec = Field(
        default_factory=lambda: ImageSpec(repository="ghcr.io/llmrl/llmrl"),
        description="the llmrl image (Ray pods and flow runs)",
    )
    imagePullSecrets: list[dict[str, str]] = Field(
        default_factory=list, description="pull secrets of every pod, [{name: ...}]"
    )
    podSecurity: PodSecurityValues = Field(
        default_factory=PodSecurityValues, description="uid/gid of every pod"
    )
    serviceAccount: ServiceAccountValues = Field(
        default_factory=ServiceAccountValues, description="the launcher's service account"
    )
    rbac: RbacValues = Field(default_factory=RbacValues, description="the launcher's Role")
    storage: StorageValues = Field(
        default_factory=StorageValues, description="shared checkpoint volume"
    )
    podLabels: dict[str, str] = Field(
        default_factory=dict, description="labels of every pod (chart and stage pods)"
    )
    podAnnotations: dict[str, str] = Field(
        default_factory=dict, description="annotations of every pod (chart and stage pods)"
    )
    priorityClassName: str = Field("", description="priorityClassName of every pod; empty = none")
    runtimeClassName: str = Field("", description="runtimeClassName of every pod; empty = none")
    huggingFace: HuggingFaceValues = Field(
        default_factory=HuggingFaceValues, description="Hugging Face token"
    )
    kueue: KueueValues = Field(default_factory=KueueValues, description="Kueue queue")
    stagePods: StagePodsValues = Field(
        default_factory=StagePodsValues, description="pods of the stages the pipeline launches"
    )
    prefect: PrefectValues = Field(default_factory=PrefectValues, description="Prefect")
    mlflow: MlflowValues = Field(default_factory=MlflowValues, description="MLflow")
    topology: Topology = Field(
        default_factory=Topology, description="roles and resources of the run (llmrl Topology)"
    )
    stages: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "per-stage config defaults (prepare, sft, grpo, evaluate: the stage's config keys), "
            "written to the topology ConfigMap as stages.yaml"
        ),
    )
