"""The cluster topology of a post-training run: who gets which GPUs, CPUs and memory.

A :class:`Topology` describes four roles: the inference engines that generate rollouts, the
trainer, the reference model (for the KL penalty) and the CPU environment workers that score
rollouts. It is the one description both deployments read: the Helm chart renders it into a
KubeRay ``RayCluster`` (one worker group per role) and :func:`llmrl.topology.place_on_ray`
turns it into Ray placement groups. Every cross-field rule is a row of
:data:`llmrl.topology.rules.RULES`, and each error line starts with the dotted field it is about,
so :func:`llmrl.core.config_loading.load_config` reports ``<file>: <field>: <message>``.

The trainer runs as :attr:`TrainerSpec.world_size` processes (torch.distributed ranks): one
per GPU, or ``ranks`` CPU processes when it has no GPUs, so a development cluster can run
``ddp`` on CPU.

The rules JSON Schema can state (a transformers engine has no tensor parallelism, ``single``
training is one rank, ...) are also written into the JSON schema as ``if``/``then`` clauses, so
Helm's ``values.schema.json`` rejects them before any template renders; the chart's guard
template, generated from the same rules, checks every one (``make chart-schema``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from llmrl.core.config_loading import MAX_CLUSTER, ConfigModel
from llmrl.topology.rules import ENGINE_GPUS, WORLD_SIZE, problems
from llmrl.topology.rules import schema_clauses as _schema_clauses

Backend = Literal["vllm", "transformers"]
Strategy = Literal["single", "ddp", "fsdp"]
ReferencePlacement = Literal["with_trainer", "dedicated", "none"]
WeightTransport = Literal["auto", "object_store", "broadcast", "vllm"]


def _with_rules(section: str | None) -> ConfigDict:
    """A model config whose JSON schema carries the ``if``/``then`` clauses of the rules about
    ``section`` (None: the rules across sections, on the Topology)."""

    def add_clauses(schema: dict[str, Any]) -> None:
        clauses = _schema_clauses(section, Topology())
        if clauses:
            schema["allOf"] = clauses

    return ConfigDict(json_schema_extra=add_clauses)


class SchedulingSpec(ConfigModel):
    """Kubernetes scheduling constraints of one role's pods, passed through unchanged.

    The keys inside ``tolerations`` and ``affinity`` are Kubernetes' own (camelCase), as in a
    pod spec.

    Example::

        SchedulingSpec(
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        )
    """

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="the pods' nodeSelector (node label -> value)"
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="the pods' tolerations, as in a Kubernetes pod spec"
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="the pods' affinity, as in a Kubernetes pod spec"
    )


def _scheduling_field() -> Any:
    return Field(
        default_factory=SchedulingSpec,
        description="node selector, tolerations and affinity of this role's pods",
    )


class InferenceSpec(ConfigModel):
    """The rollout engines: how many, how each is sharded, and what each one needs.

    ``gpus_per_engine`` may be left out (null): :attr:`engine_gpus` then derives it from the
    backend (the tensor-parallel size for vllm, 0 for the transformers backend); when given, it
    must agree with the backend (a transformers engine runs on CPU or on one GPU; a vllm engine
    on one GPU per tensor-parallel rank, or on CPU with 0 and vLLM's CPU build).

    Example::

        InferenceSpec(backend="vllm", engines=4, tensor_parallel_size=2)
    """

    model_config = _with_rules("inference")

    backend: Backend = Field(
        "vllm",
        description=(
            "'vllm' (GPU engines, one GPU per tensor-parallel rank) or 'transformers' (one "
            "process per engine on CPU or one GPU, for development clusters)"
        ),
    )
    engines: int = Field(
        1, ge=1, le=MAX_CLUSTER, description="number of independent inference engines"
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=MAX_CLUSTER,
        description="GPUs each vllm engine shards its model over (1 for transformers)",
    )
    gpus_per_engine: int | None = Field(
        None,
        ge=0,
        le=MAX_CLUSTER,
        description=(
            "GPUs each engine's pod requests; derived when left out (tensor_parallel_size for "
            "vllm, 0 for transformers) and must agree with the backend when given (0 or 1 for "
            "transformers)"
        ),
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="share of each GPU's memory vllm may take (lower it when colocated)",
    )
    cpus_per_engine: float = Field(
        4.0, gt=0, le=MAX_CLUSTER, description="CPU cores of each engine"
    )
    cpu_kv_cache_gb: float = Field(
        1.0,
        gt=0,
        le=1024,
        description=(
            "KV cache of each vllm engine on CPU (gpus_per_engine 0, vLLM's CPU build), in GiB; "
            "vLLM's own default takes most of the machine's memory"
        ),
    )
    enforce_eager: bool | None = Field(
        None,
        description=(
            "run vllm engines without torch.compile and CUDA graphs; null: eager on CPU "
            "(half the start-up time), compiled on GPUs"
        ),
    )
    memory_gb: float = Field(
        32.0, gt=0, le=MAX_CLUSTER, description="memory of each engine's pod, in GiB"
    )
    scheduling: SchedulingSpec = _scheduling_field()

    @property
    def engine_gpus(self) -> int:
        """GPUs of each engine: ``gpus_per_engine``, or derived from the backend when unset."""
        return ENGINE_GPUS.expr.evaluate(self)


class TrainerSpec(ConfigModel):
    """The policy trainer: its ranks, GPUs, parallel strategy and its pod's CPUs and memory.

    The trainer runs :attr:`world_size` processes (torch.distributed ranks): one per GPU, or
    ``ranks`` processes on CPU when ``gpus`` is 0 (``ddp`` on a development cluster).

    Example::

        TrainerSpec(gpus=8, strategy="fsdp", cpus=32, memory_gb=512)
        TrainerSpec(gpus=0, ranks=2, strategy="ddp", cpus=2)  # two CPU ranks
    """

    model_config = _with_rules("trainer")

    gpus: int = Field(1, ge=0, le=MAX_CLUSTER, description="GPUs of the trainer (0 trains on CPU)")
    ranks: int | None = Field(
        None,
        ge=1,
        le=MAX_CLUSTER,
        description=(
            "trainer processes (torch.distributed ranks); derived when left out: gpus when > 0, "
            "else 1; with GPUs it must equal gpus (one rank per GPU)"
        ),
    )
    strategy: Strategy = Field(
        "single",
        description=(
            "'single' (one process, at most 1 GPU), 'ddp' (data parallel) or 'fsdp' (sharded); "
            "ddp and fsdp need at least 2 ranks (2 GPUs, or gpus 0 and ranks >= 2 on CPU)"
        ),
    )
    cpus: float = Field(8.0, gt=0, le=MAX_CLUSTER, description="CPU cores of the trainer's pod")
    memory_gb: float = Field(
        64.0, gt=0, le=MAX_CLUSTER, description="memory of the trainer's pod, in GiB"
    )
    scheduling: SchedulingSpec = _scheduling_field()

    @property
    def world_size(self) -> int:
        """Trainer processes (torch.distributed ranks): ``ranks``, else ``gpus``, else 1."""
        return WORLD_SIZE.expr.evaluate(self)


class ReferenceSpec(ConfigModel):
    """Where the frozen reference model (for the KL penalty) runs.

    ``with_trainer`` keeps it in the trainer's process and GPUs, ``dedicated`` gives it its own
    GPUs (``gpus`` > 0), ``none`` runs without a reference model (no KL penalty).

    Example::

        ReferenceSpec(placement="dedicated", gpus=1)
    """

    model_config = _with_rules("reference")

    placement: ReferencePlacement = Field(
        "with_trainer",
        description="'with_trainer' (shares the trainer), 'dedicated' (own GPUs) or 'none'",
    )
    gpus: int = Field(
        0, ge=0, le=MAX_CLUSTER, description="GPUs of a dedicated reference (0 otherwise)"
    )
    cpus: float = Field(
        4.0, gt=0, le=MAX_CLUSTER, description="CPU cores of a dedicated reference's pod"
    )
    memory_gb: float = Field(
        32.0, gt=0, le=MAX_CLUSTER, description="memory of a dedicated reference, in GiB"
    )
    scheduling: SchedulingSpec = _scheduling_field()


class EnvWorkerSpec(ConfigModel):
    """The CPU workers that run environments and reward functions (one pod each on Kubernetes).

    Example::

        EnvWorkerSpec(count=8, cpus_each=2, memory_gb=4)
    """

    count: int = Field(4, ge=0, le=MAX_CLUSTER, description="number of environment workers")
    cpus_each: float = Field(
        1.0, gt=0, le=MAX_CLUSTER, description="CPU cores of each environment worker"
    )
    memory_gb: float = Field(
        2.0, gt=0, le=MAX_CLUSTER, description="memory of each environment worker, in GiB"
    )
    scheduling: SchedulingSpec = _scheduling_field()


class Topology(ConfigModel):
    """How a run's roles map onto GPUs, CPUs and pods; the Helm chart's ``topology`` section.

    ``colocated`` runs the inference engines and the trainer on the same GPUs (vllm sleeps
    while the trainer steps), so the trainer's GPUs must be exactly the engines' GPUs.

    Example::

        Topology(
            inference=InferenceSpec(engines=4, tensor_parallel_size=2),
            trainer=TrainerSpec(gpus=8, strategy="fsdp"),
        )
    """

    model_config = _with_rules(None)

    inference: InferenceSpec = Field(
        default_factory=InferenceSpec, description="the rollout engines"
    )
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="the policy trainer")
    reference: ReferenceSpec = Field(
        default_factory=ReferenceSpec, description="where the reference model runs"
    )
    env_workers: EnvWorkerSpec = Field(
        default_factory=EnvWorkerSpec, description="the CPU environment / reward workers"
    )
    colocated: bool = Field(
        False,
        description=(
            "inference and training share the same GPUs; then trainer.gpus must equal "
            "inference.engines * inference.tensor_parallel_size"
        ),
    )
    weight_transport: WeightTransport = Field(
        "auto",
        description=(
            "how the trainer's weights reach the engines after each step: 'object_store' (Ray's "
            "object store), 'broadcast' (buckets over a process group: gloo on CPU, NCCL on "
            "GPUs; transformers engines), 'vllm' (straight into the vllm engines: NCCL on GPUs, "
            "a checked file on CPU), or 'auto' (vllm on GPUs, object_store otherwise)"
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        found = problems(self)
        if found:
            raise ValueError("\n".join(found))
        return self

    @classmethod
    def local_default(cls) -> Topology:
        """A CPU-only topology that fits a 2-core machine (``total_cpus == 2``, no GPUs).

        One transformers engine, a single-process CPU trainer holding the reference model, and
        two environment workers of half a core each.
        """
        return cls(
            inference=InferenceSpec(
                backend="transformers", engines=1, cpus_per_engine=0.5, memory_gb=2
            ),
            trainer=TrainerSpec(gpus=0, strategy="single", cpus=0.5, memory_gb=4),
            reference=ReferenceSpec(placement="with_trainer"),
            env_workers=EnvWorkerSpec(count=2, cpus_each=0.5, memory_gb=1),
        )

    @property
    def inference_gpus(self) -> int:
        """GPUs of all inference engines together."""
        return self.inference.engines * self.inference.engine_gpus

    @property
    def reference_gpus(self) -> int:
        """GPUs of a dedicated reference model (0 for the other placements)."""
        return self.reference.gpus if self.reference.placement == "dedicated" else 0

    @property
    def total_gpus(self) -> int:
        """GPUs the whole run needs; colocated engines reuse the trainer's GPUs."""
        if self.colocated:
            return self.trainer.gpus + self.reference_gpus
        return self.inference_gpus + self.trainer.gpus + self.reference_gpus

    @property
    def total_cpus(self) -> float:
        """CPU cores the whole run needs (engines, trainer, dedicated reference, env workers)."""
        reference = self.reference.cpus if self.reference.placement == "dedicated" else 0.0
        return (
            self.inference.engines * self.inference.cpus_per_engine
            + self.trainer.cpus
            + reference
            + self.env_workers.count * self.env_workers.cpus_each
        )

    @property
    def total_memory_gb(self) -> float:
        """Memory (GiB) of all the run's pods together."""
        reference = self.reference.memory_gb if self.reference.placement == "dedicated" else 0.0
        return (
            self.inference.engines * self.inference.memory_gb
            + self.trainer.memory_gb
            + reference
            + self.env_workers.count * self.env_workers.memory_gb
        )
