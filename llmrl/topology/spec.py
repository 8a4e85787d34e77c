"""The cluster topology of a post-training run: who gets which GPUs, CPUs and memory.

A :class:`Topology` describes four roles: the inference engines that generate rollouts, the
trainer, the reference model (for the KL penalty) and the CPU environment workers that score
rollouts; and up to three model roles that give a training signal (``teacher``, ``judge``,
``reward_model``: :mod:`llmrl.topology.model_roles`), each engines of its own or a served
endpoint. It is the one description both deployments read: the Helm chart renders it into a
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

from typing import Literal

from pydantic import Field, model_validator

from llmrl.core.config_loading import MAX_CLUSTER, ConfigModel
from llmrl.topology.derived import WORLD_SIZE
from llmrl.topology.model_roles import MODEL_ROLES, ModelRoleSpec
from llmrl.topology.rules import problems
from llmrl.topology.sections import (
    Backend,
    EngineSpec,
    SchedulingSpec,
    scheduling_field,
    with_rules,
)

__all__ = [
    "Backend",
    "EngineSpec",
    "EnvWorkerSpec",
    "InferenceSpec",
    "ModelRoleSpec",
    "ReferencePlacement",
    "ReferenceSpec",
    "SchedulingSpec",
    "Strategy",
    "Topology",
    "TrainerSpec",
    "VLLMWeightBackend",
    "WeightTransport",
]

Strategy = Literal["single", "ddp", "fsdp"]
ReferencePlacement = Literal["with_trainer", "dedicated", "none"]
WeightTransport = Literal["auto", "object_store", "broadcast", "vllm"]
VLLMWeightBackend = Literal["llmrl_file", "nccl", "ipc"]
"""vLLM's weight-transfer engine a ``vllm`` transport uses (:mod:`llmrl.transports.vllm`)."""


class InferenceSpec(EngineSpec):
    """The rollout engines: how many, how each is sharded, and what each one needs.

    ``gpus_per_engine`` may be left out (null): :attr:`engine_gpus` then derives it from the
    backend (the tensor-parallel size for vllm, 0 for the transformers backend); when given, it
    must agree with the backend (a transformers engine runs on CPU or on one GPU; a vllm engine
    on one GPU per tensor-parallel rank, or on CPU with 0 and vLLM's CPU build).

    Example::

        InferenceSpec(backend="vllm", engines=4, tensor_parallel_size=2)
    """

    model_config = with_rules("inference")


class TrainerSpec(ConfigModel):
    """The policy trainer: its ranks, GPUs, parallel strategy and its pod's CPUs and memory.

    The trainer runs :attr:`world_size` processes (torch.distributed ranks): one per GPU, or
    ``ranks`` processes on CPU when ``gpus`` is 0 (``ddp`` on a development cluster).

    Example::

        TrainerSpec(gpus=8, strategy="fsdp", cpus=32, memory_gb=512)
        TrainerSpec(gpus=0, ranks=2, strategy="ddp", cpus=2)  # two CPU ranks
    """

    model_config = with_rules("trainer")

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
    scheduling: SchedulingSpec = scheduling_field()

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

    model_config = with_rules("reference")

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
    scheduling: SchedulingSpec = scheduling_field()


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
    scheduling: SchedulingSpec = scheduling_field()


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

    model_config = with_rules(None)

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
            "GPUs; transformers engines), 'vllm' (straight into the vllm engines through vLLM's "
            "weight-transfer engines: 'ipc' when colocated, 'nccl' on other GPUs, llmrl's "
            "checked file on CPU), or 'auto' (vllm on GPUs, object_store otherwise)"
        ),
    )
    teacher: ModelRoleSpec | None = Field(
        None,
        description=(
            "the teacher of on-policy distillation (loss.distillation): engines of its own "
            "model, or a served endpoint (url); null: none"
        ),
    )
    judge: ModelRoleSpec | None = Field(
        None,
        description=(
            "the generative judge of rewards.judge: engines of its own model, or a served "
            "endpoint (url); null: none"
        ),
    )
    reward_model: ModelRoleSpec | None = Field(
        None,
        description=(
            "the sequence-classification reward model of rewards.reward_model: engines of its "
            "own model, or a served endpoint (url); null: none"
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

    @classmethod
    def schema_defaults(cls) -> Topology:
        """What a left-out key means to the rules' JSON-schema reading: the default topology
        with each model role at its defaults (unvalidated: neither model nor url)."""
        roles = {role: ModelRoleSpec.model_construct() for role in MODEL_ROLES}
        return cls.model_construct(**roles)

    def model_roles(self) -> dict[str, ModelRoleSpec]:
        """The model roles that are set, by name, in :data:`MODEL_ROLES` order."""
        found = {role: getattr(self, role) for role in MODEL_ROLES}
        return {role: spec for role, spec in found.items() if spec is not None}

    def placed_model_roles(self) -> dict[str, ModelRoleSpec]:
        """The model roles with engines of their own (those without a ``url``)."""
        return {role: spec for role, spec in self.model_roles().items() if not spec.remote}

    @property
    def inference_gpus(self) -> int:
        """GPUs of all inference engines together."""
        return self.inference.engines * self.inference.engine_gpus

    @property
    def reference_gpus(self) -> int:
        """GPUs of a dedicated reference model (0 for the other placements)."""
        return self.reference.gpus if self.reference.placement == "dedicated" else 0

    @property
    def model_role_gpus(self) -> int:
        """GPUs of the placed model roles' engines together (a url role has none)."""
        return sum(spec.engines * spec.engine_gpus for spec in self.placed_model_roles().values())

    @property
    def total_gpus(self) -> int:
        """GPUs the whole run needs; colocated engines reuse the trainer's GPUs."""
        own = self.trainer.gpus + self.reference_gpus + self.model_role_gpus
        return own if self.colocated else own + self.inference_gpus

    @property
    def total_cpus(self) -> float:
        """CPU cores the whole run needs (engines, trainer, dedicated reference, env workers,
        placed model roles)."""
        reference = self.reference.cpus if self.reference.placement == "dedicated" else 0.0
        roles = self.placed_model_roles().values()
        return (
            self.inference.engines * self.inference.cpus_per_engine
            + self.trainer.cpus
            + reference
            + self.env_workers.count * self.env_workers.cpus_each
            + sum(spec.engines * spec.cpus_per_engine for spec in roles)
        )

    @property
    def total_memory_gb(self) -> float:
        """Memory (GiB) of all the run's pods together."""
        reference = self.reference.memory_gb if self.reference.placement == "dedicated" else 0.0
        roles = self.placed_model_roles().values()
        return (
            self.inference.engines * self.inference.memory_gb
            + self.trainer.memory_gb
            + reference
            + self.env_workers.count * self.env_workers.memory_gb
            + sum(spec.engines * spec.memory_gb for spec in roles)
        )
