"""Placement groups of a topology: the plan (no Ray), then a real local Ray cluster."""

from __future__ import annotations

import os
import sys
import tempfile
import time

import pytest

from llmrl.core.errors import MissingExtraError
from llmrl.topology import PlacementError, Topology, place_on_ray
from llmrl.topology.placement import plan_groups, requested_resources

CPU_ENGINE_AND_TRAINER = {
    "inference": {"backend": "transformers", "cpus_per_engine": 0.5},
    "trainer": {"gpus": 0, "cpus": 0.5},
}
"""Half a core each for a transformers engine and a CPU trainer (of the 2-core test cluster)."""


def _plan(topology: Topology) -> tuple[list, list]:
    plan = plan_groups(topology)
    return list(plan.groups), list(plan.roles)


def test_plan_of_the_local_default_is_cpu_only():
    groups, roles = _plan(Topology.local_default())
    assert [(g.label, g.bundles, g.strategy) for g in groups] == [
        ("inference[0]", ({"CPU": 0.5},), "STRICT_PACK"),
        ("trainer", ({"CPU": 0.5},), "PACK"),
        ("env_workers", ({"CPU": 0.5}, {"CPU": 0.5}), "SPREAD"),
    ]
    assert [r.role for r in roles] == ["inference[0]", "trainer", "env_workers"]
    assert requested_resources(groups) == {"CPU": 2.0}


def test_vllm_engines_get_one_gpu_bundle_per_tensor_parallel_rank():
    topology = Topology.model_validate(
        {
            "inference": {"engines": 2, "tensor_parallel_size": 2, "cpus_per_engine": 4},
            "trainer": {"gpus": 2, "strategy": "fsdp", "cpus": 6},
            "reference": {"placement": "dedicated", "gpus": 1, "cpus": 2},
            "env_workers": {"count": 0},
        }
    )
    groups, roles = _plan(topology)
    assert [g.label for g in groups] == ["inference[0]", "inference[1]", "trainer", "reference"]
    assert groups[0].bundles == ({"GPU": 1.0, "CPU": 2.0},) * 2
    assert groups[2].bundles == ({"GPU": 1.0, "CPU": 3.0},) * 2
    assert groups[3].bundles == ({"GPU": 1.0, "CPU": 2.0},)
    assert requested_resources(groups) == {"GPU": topology.total_gpus, "CPU": topology.total_cpus}
    assert "env_workers" not in [r.role for r in roles]


def test_the_trainer_gets_one_bundle_per_rank():
    gpu = Topology.model_validate({"trainer": {"gpus": 4, "strategy": "ddp", "cpus": 8}})
    groups, roles = _plan(gpu)
    trainer = {r.role: r for r in roles}["trainer"]
    assert groups[trainer.group].bundles == ({"GPU": 1.0, "CPU": 2.0},) * 4
    assert trainer.bundle_indices == (0, 1, 2, 3)
    cpu = Topology.model_validate(
        {
            "inference": {"backend": "transformers"},
            "trainer": {"gpus": 0, "ranks": 3, "strategy": "ddp", "cpus": 2},
        }
    )
    groups, roles = _plan(cpu)
    trainer = {r.role: r for r in roles}["trainer"]
    # 2 cores / 3 ranks, rounded down to Ray's 1e-4 resolution so the bundles fit the pod.
    assert groups[trainer.group].bundles == ({"CPU": 0.6666},) * 3
    assert trainer.bundle_indices == (0, 1, 2) and len(trainer.bundle_indices) == 3
    assert requested_resources(groups).get("GPU", 0) == 0


def test_a_transformers_engine_on_one_gpu_gets_a_gpu_bundle():
    topology = Topology.model_validate(
        {"inference": {"backend": "transformers", "gpus_per_engine": 1, "cpus_per_engine": 2}}
    )
    groups, _ = _plan(topology)
    assert groups[0].label == "inference[0]"
    assert groups[0].bundles == ({"GPU": 1.0, "CPU": 2.0},)
    assert requested_resources(groups)["GPU"] == topology.total_gpus == 2


def test_colocated_engines_share_the_trainer_group():
    topology = Topology.model_validate(
        {
            "colocated": True,
            "inference": {"engines": 4, "tensor_parallel_size": 2, "cpus_per_engine": 2},
            "trainer": {"gpus": 8, "strategy": "fsdp", "cpus": 8},
            "env_workers": {"count": 1},
        }
    )
    groups, roles = _plan(topology)
    assert len(groups) == 2 and len(groups[0].bundles) == 8
    by_role = {r.role: r for r in roles}
    assert by_role["inference[1]"].group == by_role["trainer"].group == 0
    assert by_role["inference[1]"].bundle_indices == (2, 3)
    assert by_role["trainer"].bundle_indices == tuple(range(8))
    assert requested_resources(groups)["GPU"] == topology.total_gpus == 8


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(MissingExtraError, match=r"pip install 'llmrl\[local\]'"):
        place_on_ray(Topology.local_default())


@pytest.fixture(scope="module")
def ray_cluster():
    """A private 2-CPU, 0-GPU local Ray cluster for this module."""
    ray = pytest.importorskip("ray")
    with (
        pytest.MonkeyPatch.context() as patch,
        tempfile.TemporaryDirectory(prefix="ray", ignore_cleanup_errors=True) as tmp,
    ):
        patch.setenv("RAY_AUTH_MODE", "disabled")
        patch.setenv("RAY_TMPDIR", tmp)
        if ray.is_initialized():
            ray.shutdown()
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
            os.environ.pop("RAY_ADDRESS", None)


def _states(ray) -> list[str]:
    return [group["state"] for group in ray.util.placement_group_table().values()]


@pytest.mark.integration
def test_local_default_is_placed_and_removed(ray_cluster):
    placement = place_on_ray(Topology.local_default(), timeout_s=30)
    try:
        assert len(placement.groups) == 3
        assert [g.role for g in placement.inference] == ["inference[0]"]
        assert placement.reference is None
        assert placement.env_workers is not None and placement.env_workers.bundle_indices == (0, 1)
        assert all(group.wait(10) for group in placement.groups)
        strategy = placement.trainer.scheduling_strategy()
        assert strategy.placement_group is placement.trainer.group
    finally:
        placement.remove()
    placement.remove()  # idempotent
    assert _all_removed(ray_cluster)


@pytest.mark.integration
def test_a_gpu_topology_fails_fast_naming_what_is_missing(ray_cluster):
    start = time.monotonic()
    with pytest.raises(PlacementError) as caught:
        place_on_ray(Topology(), timeout_s=60)
    assert time.monotonic() - start < 5, "it must not wait for the timeout"
    message = str(caught.value)
    assert "GPU: needs 2, the cluster has 0" in message
    assert "inference[0]: 1 x {GPU: 1, CPU: 4} (STRICT_PACK)" in message
    assert "trainer: 1 x {GPU: 1, CPU: 8} (PACK)" in message
    assert "cluster total: GPU 0, CPU 2" in message
    assert _all_removed(ray_cluster), "nothing is left behind"


@pytest.mark.integration
def test_a_transformers_judge_engine_gets_a_group_of_its_own(ray_cluster):
    topology = Topology.model_validate(
        CPU_ENGINE_AND_TRAINER
        | {
            "env_workers": {"count": 1, "cpus_each": 0.5},
            "judge": {"model": "m", "backend": "transformers", "cpus_per_engine": 0.5},
            "teacher": {"url": "http://teacher:8000"},  # served: nothing placed
        }
    )
    with place_on_ray(topology, timeout_s=30) as placement:
        assert list(placement.models) == ["judge"] and len(placement.groups) == 4
        (judge,) = placement.models["judge"]
        assert judge.role == "judge[0]" and judge.bundle_indices == (0,)
        assert judge.group not in {placement.trainer.group, placement.inference[0].group}
        assert judge.group.wait(10)
        (bundle,) = judge.group.bundle_specs
        assert bundle == {"CPU": 0.5}
        strategy = judge.scheduling_strategy(0)
        options = placement.specs.models["judge"].actor_options(strategy)
        assert (options["num_cpus"], options["num_gpus"]) == (0.5, 0.0)
        assert strategy.placement_group is judge.group
    assert _all_removed(ray_cluster)
    gpu_judge = topology.model_copy(
        update={"judge": topology.judge.model_copy(update={"gpus_per_engine": 1})}
    )
    with pytest.raises(PlacementError) as caught:
        place_on_ray(gpu_judge, timeout_s=60)
    assert "judge[0]: 1 x {GPU: 1, CPU: 0.5} (STRICT_PACK)" in str(caught.value)
    assert "GPU: needs 1, the cluster has 0" in str(caught.value)


@pytest.mark.integration
def test_an_unplaceable_group_times_out_and_is_removed(ray_cluster):
    too_wide = Topology.model_validate(
        CPU_ENGINE_AND_TRAINER | {"env_workers": {"count": 2, "cpus_each": 1.5}}
    )
    # Under load the placeable groups may also still be pending at the deadline: both are named.
    with pytest.raises(
        PlacementError, match=r"could not place (.*, )?env_workers within 2 s"
    ) as caught:
        place_on_ray(too_wide, timeout_s=2, check_capacity=False)
    assert "env_workers: 2 x {CPU: 1.5} (SPREAD)" in str(caught.value)
    assert _all_removed(ray_cluster), "the groups that were placed are removed too"


def _all_removed(ray, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while set(_states(ray)) - {"REMOVED"}:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
