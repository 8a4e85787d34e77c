"""Per-role specs (no Ray): each role's actors and what they ask of Ray, the pod groups that hold
them, and the placement groups plan_groups makes of those pods."""

from __future__ import annotations

import pytest

from llmrl.topology import Topology
from llmrl.topology.placement import plan_groups, requested_resources
from llmrl.topology.roles import PodGroup, role_specs

SPLIT = Topology.model_validate(
    {
        "inference": {"engines": 2, "tensor_parallel_size": 2, "cpus_per_engine": 4},
        "trainer": {"gpus": 4, "strategy": "fsdp", "cpus": 6, "memory_gb": 100},
        "reference": {"placement": "dedicated", "gpus": 1, "cpus": 2, "memory_gb": 20},
        "env_workers": {"count": 3, "cpus_each": 1.5, "memory_gb": 3},
    }
)
COLOCATED = Topology.model_validate(
    {
        "colocated": True,
        "inference": {"engines": 2, "cpus_per_engine": 2, "memory_gb": 10},
        "trainer": {"gpus": 2, "strategy": "ddp", "cpus": 3, "memory_gb": 40},
        "env_workers": {"count": 1},
    }
)


def test_the_local_default_roles_fit_two_cores():
    specs = role_specs(Topology.local_default())
    assert (specs.inference.count, specs.trainer.count, specs.env_workers.count) == (1, 1, 2)
    assert specs.reference is None and specs.colocated is None
    # a transformers engine's front actor holds its bundle; the rank and the workers theirs
    assert (specs.inference.cpus, specs.inference.gpus, specs.inference.device) == (0.5, 0, "cpu")
    assert (specs.trainer.cpus, specs.trainer.gpus) == (0.5, 0.0)
    assert specs.env_workers.actor_options("bundle") == {
        "num_cpus": 0.5,
        "num_gpus": 0.0,
        "scheduling_strategy": "bundle",
    }
    assert [(pod.name, pod.replicas) for pod in specs.pod_groups()] == [
        ("inference", 1),
        ("trainer", 1),
        ("env-workers", 2),
    ]
    pods_cpus = sum(pod.cpus * pod.replicas for pod in specs.pod_groups())
    assert pods_cpus == Topology.local_default().total_cpus == 2


def test_disaggregated_roles_get_their_own_pods_and_gpus():
    specs = role_specs(SPLIT)
    engines, trainer, reference = specs.inference, specs.trainer, specs.reference
    # a vLLM engine's front actor leaves its bundles to the engine, whose TP workers take them
    assert (engines.cpus, engines.gpus, engines.server_gpus) == (0.0, 0.0, 0.0)
    assert engines.pod.bundles() == ({"GPU": 1.0, "CPU": 2.0},) * 2
    assert (trainer.count, trainer.cpus, trainer.gpus, trainer.strategy) == (4, 1.5, 1.0, "fsdp")
    assert trainer.memory_gb == 25  # each rank's share of the trainer pod
    assert (reference.count, reference.cpus, reference.gpus) == (1, 0.0, 1.0)
    pods = {pod.name: pod for pod in specs.pod_groups()}
    assert list(pods) == ["inference", "trainer", "reference", "env-workers"]
    assert pods["inference"] == PodGroup(
        name="inference",
        replicas=2,
        cpus=4,
        gpus=2,
        memory_gb=SPLIT.inference.memory_gb,
        scheduling=SPLIT.inference.scheduling,
    )
    assert (pods["trainer"].replicas, pods["trainer"].gpus, pods["trainer"].processes) == (1, 4, 4)
    assert (pods["env-workers"].replicas, pods["env-workers"].cpus) == (3, 1.5)
    assert sum(pod.gpus * pod.replicas for pod in pods.values()) == SPLIT.total_gpus
    assert sum(pod.memory_gb * pod.replicas for pod in pods.values()) == SPLIT.total_memory_gb


def test_a_single_gpu_vllm_engine_actor_holds_its_gpu_and_a_cpu_build_none():
    one_gpu = role_specs(Topology.model_validate({"inference": {"engines": 2}}))
    assert one_gpu.inference.server_gpus == 1.0 and one_gpu.inference.device == "cuda"
    cpu = Topology.model_validate(
        {
            "inference": {"gpus_per_engine": 0, "cpus_per_engine": 0.5},
            "trainer": {"gpus": 0, "ranks": 2, "strategy": "ddp", "cpus": 1.0},
        }
    )
    assert role_specs(cpu).inference.server_gpus == 0.0


def test_colocated_engines_and_ranks_share_one_pod_group_half_and_half():
    specs = role_specs(COLOCATED)
    (pods,) = specs.pod_groups()[:1]
    assert pods == specs.colocated
    assert (pods.name, pods.replicas, pods.gpus) == ("colocated", 1, 2)
    assert (pods.cpus, pods.memory_gb) == (3 + 2 * 2, 40 + 2 * 10)
    assert [pod.name for pod in specs.pod_groups()] == ["colocated", "env-workers"]
    # a rank and an engine's front actor each take half of the rank's share of one bundle
    assert (specs.trainer.cpus, specs.trainer.gpus) == (0.75, 0.5)
    assert (specs.inference.cpus, specs.inference.gpus) == (0.75, 0.0)
    assert specs.inference.server_gpus == 0.5
    groups = plan_groups(COLOCATED).groups
    assert groups[0].bundles == pods.bundles() == ({"GPU": 1.0, "CPU": 3.5},) * 2


def test_cpu_ranks_split_their_pod_into_a_bundle_each_rounded_down():
    topology = Topology.model_validate(
        {
            "inference": {"backend": "transformers"},
            "trainer": {"gpus": 0, "ranks": 3, "strategy": "ddp", "cpus": 2},
        }
    )
    trainer = role_specs(topology).trainer
    assert trainer.pod.bundles() == ({"CPU": 0.6666},) * 3
    assert trainer.cpus == 0.6666 and trainer.gpus == 0.0
    assert sum(bundle["CPU"] for bundle in trainer.pod.bundles()) <= trainer.pod.cpus


@pytest.mark.parametrize("topology", [Topology.local_default(), SPLIT, COLOCATED, Topology()])
def test_the_placement_groups_are_the_pod_groups_bundles(topology: Topology):
    plan = plan_groups(topology)
    assert plan.specs == role_specs(topology)
    pods = plan.specs.pod_groups()
    offered = [bundle for pod in pods for _ in range(pod.replicas) for bundle in pod.bundles()]
    planned = [bundle for group in plan.groups for bundle in group.bundles]
    assert sorted(map(str, planned)) == sorted(map(str, offered))
    assert requested_resources(plan.groups).get("GPU", 0) == topology.total_gpus
    # every actor of a role has a bundle of its own (colocated: engines share the ranks')
    roles = {role.role: role for role in plan.roles}
    assert len(roles["trainer"].bundle_indices) == plan.specs.trainer.count
    assert sum(name.startswith("inference[") for name in roles) == plan.specs.inference.count
    workers = plan.specs.env_workers
    if workers is not None:
        assert len(roles["env_workers"].bundle_indices) == workers.count
