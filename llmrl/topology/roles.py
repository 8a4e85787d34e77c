"""Per-role specs: what each role of a :class:`~llmrl.topology.spec.Topology` runs and reserves.

:func:`role_specs` reads a topology once into one frozen spec per role:

- :class:`EngineRole`: the inference engines, one pod each;
- :class:`TrainerRole`: the trainer ranks, together in one pod (a bundle each);
- :class:`ReferenceRole`: a dedicated reference model, in a pod of its own;
- :class:`EnvWorkerRole`: the environment workers, one pod each;
- :class:`ModelRole`: each model role with engines of its own (``teacher``, ``judge``,
  ``reward_model``; a role served by ``url`` has none), one pod per engine, sized as the
  inference engines are (never colocated).

Each spec says how many actors the role has and what each asks of Ray (``cpus``, ``gpus``:
:meth:`RoleSpec.actor_options`), and its :class:`PodGroup`: the pods that hold it (a KubeRay
worker group) and the Ray bundles each pod offers. Colocated engines and trainer ranks share
one pod group and split each of its GPU bundles in half.

:func:`~llmrl.topology.placement.plan_groups` makes the placement groups from these specs, the
Kubernetes launcher its worker groups (:meth:`RoleSpecs.pod_groups`), and the GRPO runtime sizes
its actors with them: every per-role resource rule is written here, once.

Example::

    specs = role_specs(Topology.local_default())
    specs.trainer.count, specs.trainer.pod.bundles()  # 1, ({"CPU": 0.5},)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from llmrl.topology.sections import EngineSpec
from llmrl.topology.spec import SchedulingSpec, Topology

Bundle = dict[str, float]


class _PodSettings(Protocol):
    """What every role's topology section says of its pods."""

    memory_gb: float
    scheduling: SchedulingSpec


def floor_cpus(amount: float) -> float:
    """``amount`` rounded down to Ray's resolution (1e-4), so shares never sum above a whole."""
    return math.floor(amount * 10_000) / 10_000


@dataclass(frozen=True, kw_only=True)
class PodGroup:
    """``replicas`` pods alike: one KubeRay worker group, and the Ray bundles each pod offers.

    Attributes:
        name: the worker group's name (and its pods' ``llmrl.io/role``).
        replicas: pods in the group.
        cpus, gpus, memory_gb: each pod's.
        scheduling: the pods' node selector, tolerations and affinity.
        processes: role processes in each pod (trainer ranks); on CPU, a bundle each.
    """

    name: str
    replicas: int
    cpus: float
    gpus: int
    memory_gb: float
    scheduling: SchedulingSpec
    processes: int = 1

    def bundles(self) -> tuple[Bundle, ...]:
        """One pod's bundles: ``{"GPU": 1, "CPU": share}`` per GPU, else ``{"CPU": share}`` per
        process; the pod's CPUs shared evenly, rounded down."""
        if self.gpus:
            share = floor_cpus(self.cpus / self.gpus)
            return tuple({"GPU": 1.0, "CPU": share} for _ in range(self.gpus))
        share = floor_cpus(self.cpus / self.processes)
        return tuple({"CPU": share} for _ in range(self.processes))


@dataclass(frozen=True, kw_only=True)
class RoleSpec:
    """A role's ``count`` actors, each asking Ray for ``cpus`` and ``gpus`` on its bundle, held
    by the pods of ``pod``."""

    count: int
    cpus: float
    gpus: float
    pod: PodGroup

    @property
    def memory_gb(self) -> float:
        """Each actor's share of its pods' memory (GiB)."""
        return self.pod.memory_gb * self.pod.replicas / self.count

    def actor_options(self, scheduling_strategy: Any) -> dict[str, Any]:
        """Ray options of one of the role's actors on the bundle ``scheduling_strategy`` names."""
        return {
            "num_cpus": self.cpus,
            "num_gpus": self.gpus,
            "scheduling_strategy": scheduling_strategy,
        }


@dataclass(frozen=True, kw_only=True)
class EngineRole(RoleSpec):
    """The inference engines. ``cpus`` and ``gpus`` are each engine's front actor's (an
    :class:`~llmrl.collectors.InferenceActor`); a vLLM engine actor behind it takes
    ``server_gpus`` (its tensor-parallel workers take the bundles themselves when > 1).

    Attributes:
        backend: ``vllm`` or ``transformers``.
        tensor_parallel_size: GPUs (bundles) each engine shards over.
        device: where a transformers engine's model lives (``cuda`` or ``cpu``).
    """

    backend: str
    tensor_parallel_size: int
    server_gpus: float
    device: str


@dataclass(frozen=True, kw_only=True)
class ModelRole(EngineRole):
    """A model role's engines (``name``: ``teacher``, ``judge`` or ``reward_model``), each as an
    inference engine: ``cpus`` and ``gpus`` its front actor's, ``server_gpus`` a vLLM engine
    actor's behind it, on the bundles of one placement group per engine."""

    name: str


_Engines = TypeVar("_Engines", bound=EngineRole)


@dataclass(frozen=True, kw_only=True)
class TrainerRole(RoleSpec):
    """The trainer ranks (``count`` = the world size), one bundle each; ``strategy``:
    ``single``, ``ddp`` or ``fsdp``."""

    strategy: str


@dataclass(frozen=True, kw_only=True)
class ReferenceRole(RoleSpec):
    """A dedicated reference model: one actor on the first GPU of its own pod."""


@dataclass(frozen=True, kw_only=True)
class EnvWorkerRole(RoleSpec):
    """The environment workers: one actor per pod, on CPU."""


@dataclass(frozen=True, kw_only=True)
class RoleSpecs:
    """Every role of a topology; ``colocated``: the pod group engines and trainer share;
    ``models``: the model roles with engines of their own, by name, in
    :data:`~llmrl.topology.model_roles.MODEL_ROLES` order."""

    inference: EngineRole
    trainer: TrainerRole
    reference: ReferenceRole | None
    env_workers: EnvWorkerRole | None
    colocated: PodGroup | None
    models: dict[str, ModelRole] = field(default_factory=dict)

    def pod_groups(self) -> tuple[PodGroup, ...]:
        """Every worker group: the colocated one or the engines' and the trainer's, then a
        dedicated reference's and the env workers' (when there are any), then each placed
        model role's."""
        shared = (self.colocated,) if self.colocated else (self.inference.pod, self.trainer.pod)
        others = (role.pod for role in (self.reference, self.env_workers) if role is not None)
        return (*shared, *others, *(role.pod for role in self.models.values()))


def role_specs(topology: Topology) -> RoleSpecs:
    """The specs of ``topology``'s roles (pure). Colocated, an engine's front actor and a
    trainer rank each take half of a bundle's GPU and half of the rank's CPU share."""
    trainer = topology.trainer
    # colocated, a rank and an engine's front actor each take half of the rank's CPU share
    rank_share = trainer.cpus / trainer.world_size / (2 if topology.colocated else 1)
    ranks = TrainerRole(
        count=trainer.world_size,
        cpus=floor_cpus(rank_share),
        gpus=0.5 if topology.colocated else float(bool(trainer.gpus)),
        pod=_pod("trainer", 1, trainer, trainer.cpus, trainer.gpus, trainer.world_size),
        strategy=trainer.strategy,
    )
    return RoleSpecs(
        inference=_engines(topology, rank_share),
        trainer=ranks,
        reference=_reference(topology),
        env_workers=_env_workers(topology),
        colocated=_colocated(topology) if topology.colocated else None,
        models={
            name: _engine_role(ModelRole, spec, name.replace("_", "-"), name=name)
            for name, spec in topology.placed_model_roles().items()
        },
    )


def _pod(
    name: str, replicas: int, spec: _PodSettings, cpus: float, gpus: int, processes: int = 1
) -> PodGroup:
    return PodGroup(
        name=name,
        replicas=replicas,
        cpus=cpus,
        gpus=gpus,
        memory_gb=spec.memory_gb,
        scheduling=spec.scheduling,
        processes=processes,
    )


def _engines(topology: Topology, rank_share: float) -> EngineRole:
    """The inference engines; colocated, each front actor takes half of a trainer rank's share
    (and half of a transformers engine's GPU)."""
    colocated = rank_share if topology.colocated else None
    return _engine_role(EngineRole, topology.inference, "inference", colocated=colocated)


def _engine_role(
    role: type[_Engines],
    spec: EngineSpec,
    pod_name: str,
    *,
    colocated: float | None = None,
    **extra: Any,
) -> _Engines:
    """Engine front actors: a transformers engine's holds its bundle (and GPU); a vLLM one's
    leaves it to the engine actor. ``colocated``: the CPU share of a front actor on the
    trainer's bundles (None: the engines have pods of their own)."""
    gpus = spec.engine_gpus
    front_gpus = float(gpus) if spec.backend == "transformers" else 0.0
    front_cpus = spec.cpus_per_engine if spec.backend == "transformers" else 0.0
    if colocated is not None:
        front_cpus, front_gpus = colocated, front_gpus / 2
    server_gpus = (0.5 if colocated is not None else 1.0) if gpus else 0.0
    return role(
        count=spec.engines,
        cpus=floor_cpus(front_cpus),
        gpus=front_gpus,
        pod=_pod(pod_name, spec.engines, spec, spec.cpus_per_engine, gpus),
        backend=spec.backend,
        tensor_parallel_size=spec.tensor_parallel_size,
        server_gpus=server_gpus if spec.tensor_parallel_size == 1 else 0.0,
        device="cuda" if gpus else "cpu",
        **extra,
    )


def _reference(topology: Topology) -> ReferenceRole | None:
    reference = topology.reference
    if reference.placement != "dedicated":
        return None
    pod = _pod("reference", 1, reference, reference.cpus, reference.gpus)
    return ReferenceRole(count=1, cpus=0.0, gpus=1.0, pod=pod)


def _env_workers(topology: Topology) -> EnvWorkerRole | None:
    workers = topology.env_workers
    if not workers.count:
        return None
    pod = _pod("env-workers", workers.count, workers, workers.cpus_each, 0)
    return EnvWorkerRole(count=workers.count, cpus=workers.cpus_each, gpus=0.0, pod=pod)


def _colocated(topology: Topology) -> PodGroup:
    """One pod group for the engines and the trainer: the trainer's GPUs, both roles' CPUs and
    memory, the trainer's scheduling."""
    inference, trainer = topology.inference, topology.trainer
    return PodGroup(
        name="colocated",
        replicas=1,
        cpus=trainer.cpus + inference.engines * inference.cpus_per_engine,
        gpus=trainer.gpus,
        memory_gb=trainer.memory_gb + inference.engines * inference.memory_gb,
        scheduling=trainer.scheduling,
        processes=trainer.world_size,
    )
