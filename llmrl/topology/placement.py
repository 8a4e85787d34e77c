"""Reserve a :class:`~llmrl.topology.spec.Topology` on a Ray cluster as placement groups.

:func:`plan_groups` turns a topology into the placement groups it needs (pure, no Ray), from
its roles' specs (:func:`~llmrl.topology.roles.role_specs`, each pod group's bundles):

* one group per inference engine, one ``{"GPU": 1, "CPU": x}`` bundle per GPU of the engine
  (``STRICT_PACK``: a vllm engine's tensor-parallel ranks on one node), or one ``{"CPU": x}``
  bundle for a CPU transformers engine;
* one group for the trainer, one bundle per rank (``TrainerSpec.world_size``):
  ``{"GPU": 1, "CPU": cpus / gpus}`` per GPU rank, or ``{"CPU": cpus / ranks}`` per CPU rank,
  so ``placement.trainer.bundle_indices[rank]`` is the bundle of that rank's actor;
* with ``colocated``, one shared group instead: engine ``i`` uses bundles
  ``[i * tp, (i + 1) * tp)`` of the trainer's GPUs;
* one group for a dedicated reference model, and one ``SPREAD`` group of ``{"CPU": cpus_each}``
  bundles for the environment workers;
* one ``STRICT_PACK`` group per engine of each model role with engines of its own (``teacher``,
  ``judge``, ``reward_model``), shaped as an inference engine's; a role served by ``url`` has
  none.

:func:`place_on_ray` creates the groups and waits for them. It fails fast when the cluster
cannot hold the topology at all, and otherwise after ``timeout_s``; either way the error names
each group that could not be placed and compares requested with available resources. Memory is
not reserved in Ray (Kubernetes enforces it through the pods' limits).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmrl.topology.roles import Bundle, RoleSpecs, role_specs
from llmrl.topology.spec import Topology


class PlacementError(RuntimeError):
    """The Ray cluster cannot hold a topology; the message says what is missing."""


@dataclass(frozen=True)
class GroupPlan:
    """One placement group to create: a label for messages, its bundles and strategy."""

    label: str
    bundles: tuple[Bundle, ...]
    strategy: str


@dataclass(frozen=True)
class RolePlan:
    """Which bundles of which planned group (index into the plan's groups) a role uses."""

    role: str
    group: int
    bundle_indices: tuple[int, ...]


@dataclass(frozen=True)
class RoleGroup:
    """A role's reservation: its Ray placement group and the bundles in it that are its own."""

    role: str
    group: Any
    bundle_indices: tuple[int, ...]

    def scheduling_strategy(self, index: int = 0) -> Any:
        """A ``PlacementGroupSchedulingStrategy`` for an actor on this role's ``index``-th bundle.

        Example::

            actor_cls.options(scheduling_strategy=placement.trainer.scheduling_strategy())
        """
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group,
            placement_group_bundle_index=self.bundle_indices[index],
            placement_group_capture_child_tasks=True,
        )


@dataclass
class Placement:
    """The placement groups that hold a topology; :meth:`remove` releases them.

    ``specs`` (:func:`~llmrl.topology.roles.role_specs` of the topology) says how many actors
    each role has and what each asks of Ray on its bundle. ``models``: each placed model role's
    groups, one per engine (as ``inference``), by name (``specs.models`` says what each engine's
    actors ask). Usable as a context manager, which removes the groups on exit.
    """

    topology: Topology
    inference: list[RoleGroup]
    trainer: RoleGroup
    reference: RoleGroup | None
    env_workers: RoleGroup | None
    groups: list[Any] = field(default_factory=list)
    models: dict[str, list[RoleGroup]] = field(default_factory=dict)
    specs: RoleSpecs = field(init=False)

    def __post_init__(self) -> None:
        self.specs = role_specs(self.topology)

    def remove(self) -> None:
        """Remove every placement group of this placement (idempotent)."""
        _remove_groups(self.groups)
        self.groups = []

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


@dataclass(frozen=True)
class PlacementPlan:
    """What placing a topology takes (no Ray): its roles' specs, the placement groups to
    create, and which bundles each role uses."""

    specs: RoleSpecs
    groups: tuple[GroupPlan, ...]
    roles: tuple[RolePlan, ...]


def plan_groups(topology: Topology) -> PlacementPlan:
    """The placement groups ``topology`` needs and which bundles each role uses (no Ray), from
    its :func:`~llmrl.topology.roles.role_specs`.

    Roles are ``inference[i]``, ``trainer`` (one bundle per rank), ``reference`` (dedicated
    only), ``env_workers`` (when there are any) and ``<model role>[i]`` (``judge[0]``, ...).
    """
    specs = role_specs(topology)
    engines, trainer = specs.inference, specs.trainer
    groups: list[GroupPlan] = []
    roles: list[RolePlan] = []

    def add(role: str, bundles: tuple[Bundle, ...], strategy: str) -> None:
        roles.append(RolePlan(role, len(groups), tuple(range(len(bundles)))))
        groups.append(GroupPlan(role, bundles, strategy))

    if specs.colocated is not None:
        tp = engines.tensor_parallel_size
        groups.append(
            GroupPlan("colocated (inference + trainer)", specs.colocated.bundles(), "PACK")
        )
        for engine in range(engines.count):
            roles.append(
                RolePlan(f"inference[{engine}]", 0, tuple(range(engine * tp, (engine + 1) * tp)))
            )
        roles.append(RolePlan("trainer", 0, tuple(range(trainer.pod.gpus))))
    else:
        for engine in range(engines.count):
            add(f"inference[{engine}]", engines.pod.bundles(), "STRICT_PACK")
        add("trainer", trainer.pod.bundles(), "PACK")
    if specs.reference is not None:
        add("reference", specs.reference.pod.bundles(), "PACK")
    if specs.env_workers is not None:
        pods = specs.env_workers.pod
        add("env_workers", pods.bundles() * pods.replicas, "SPREAD")
    for name, model in specs.models.items():
        for engine in range(model.count):
            add(f"{name}[{engine}]", model.pod.bundles(), "STRICT_PACK")
    return PlacementPlan(specs, tuple(groups), tuple(roles))


def requested_resources(groups: Sequence[GroupPlan]) -> Bundle:
    """The sum of every bundle of ``groups``, per resource."""
    total: Bundle = {}
    for group in groups:
        for bundle in group.bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
    return total


def place_on_ray(
    topology: Topology, *, timeout_s: float = 60.0, check_capacity: bool = True
) -> Placement:
    """Reserve ``topology`` on the connected Ray cluster (``ray.init()`` when not connected).

    Args:
        topology: what to reserve.
        timeout_s: how long to wait for all groups to be placed.
        check_capacity: fail at once when the cluster's total resources are smaller than the
            request; turn off on an autoscaling cluster whose nodes are not there yet.

    Raises:
        PlacementError: the cluster is too small, or some group was not placed within
            ``timeout_s`` (its groups are removed; the message names what was not placed,
            what it requested, and what the cluster has and has free).
        MissingExtraError: Ray is not installed.

    Example::

        with place_on_ray(Topology.local_default(), timeout_s=10) as placement:
            strategy = placement.trainer.scheduling_strategy()
    """
    try:
        import ray
        from ray.util.placement_group import placement_group
    except ImportError as error:
        from llmrl.core.errors import MissingExtraError

        raise MissingExtraError("ray", "local", "Placing a topology on Ray") from error
    if not ray.is_initialized():
        ray.init()
    plan = plan_groups(topology)
    plans = list(plan.groups)
    requested = requested_resources(plans)
    if check_capacity:
        _check_capacity(ray, plans, requested)
    created = [placement_group(list(group.bundles), strategy=group.strategy) for group in plans]
    refs = [group.ready() for group in created]
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        waiting = set(pending)
        unplaced = [group for group, ref in zip(plans, refs, strict=True) if ref in waiting]
        cluster, available = ray.cluster_resources(), ray.available_resources()
        _remove_groups(created)
        names = ", ".join(group.label for group in unplaced)
        raise PlacementError(
            f"could not place {names} within {timeout_s:g} s (their groups were removed)\n"
            + _describe(unplaced, requested, cluster, available)
        )
    by_role = {
        role.role: RoleGroup(role.role, created[role.group], role.bundle_indices)
        for role in plan.roles
    }
    return Placement(
        topology=topology,
        inference=[by_role[f"inference[{i}]"] for i in range(topology.inference.engines)],
        trainer=by_role["trainer"],
        reference=by_role.get("reference"),
        env_workers=by_role.get("env_workers"),
        groups=created,
        models={
            name: [by_role[f"{name}[{i}]"] for i in range(model.count)]
            for name, model in plan.specs.models.items()
        },
    )


def _check_capacity(ray: Any, plans: list[GroupPlan], requested: Bundle) -> None:
    """Raise :class:`PlacementError` when the cluster's total resources are short of
    ``requested``, naming each resource that is."""
    cluster = ray.cluster_resources()
    short = {
        name: amount for name, amount in requested.items() if amount > cluster.get(name, 0.0) + 1e-9
    }
    if short:
        lacking = ", ".join(
            f"{name}: needs {_num(amount)}, the cluster has {_num(cluster.get(name, 0.0))}"
            for name, amount in short.items()
        )
        raise PlacementError(
            f"cannot place the topology on this Ray cluster ({lacking})\n"
            + _describe(plans, requested, cluster, ray.available_resources())
        )


def _num(amount: float) -> str:
    return f"{amount:g}"


def _shape(bundle: Bundle) -> str:
    return "{" + ", ".join(f"{name}: {_num(value)}" for name, value in bundle.items()) + "}"


def _describe(
    plans: list[GroupPlan],
    requested: Bundle,
    cluster: dict[str, float],
    available: dict[str, float],
) -> str:
    lines = [f"  {line}" for line in _group_lines(plans)]
    lines.append(f"  requested in all: {_resources(requested)}")
    lines.append(f"  cluster total: {_resources(cluster, requested)}")
    lines.append(f"  cluster available: {_resources(available, requested)}")
    return "\n".join(lines)


def _group_lines(plans: list[GroupPlan]) -> Iterator[str]:
    for plan in plans:
        shapes: dict[str, int] = {}
        for bundle in plan.bundles:
            shapes[_shape(bundle)] = shapes.get(_shape(bundle), 0) + 1
        parts = ", ".join(f"{count} x {shape}" for shape, count in shapes.items())
        yield f"{plan.label}: {parts} ({plan.strategy})"


def _resources(resources: dict[str, float], keys: Bundle | None = None) -> str:
    names = list(keys) if keys is not None else list(resources)
    return ", ".join(f"{name} {_num(resources.get(name, 0.0))}" for name in names) or "nothing"


def _remove_groups(groups: list[Any]) -> None:
    if not groups:
        return
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        try:
            remove_placement_group(group)
        except Exception:  # already removed, or Ray shut down: nothing left to release
            continue
