"""The helm/llmrl chart and the topology: the GPUs a release asks for, the topology and
settings its ConfigMap hands the stage pods, and the Ray pods the launcher builds from them."""

from __future__ import annotations

import pytest
import yaml

from flows.launchers.manifests import build_rayjob_manifest, requested_gpus
from flows.launchers.settings import KubernetesSettings
from llmrl.topology import Topology
from tests.helm.chart_objects import (
    gpus_of,
    merged_values,
    of_kind,
    stage_inputs,
    stage_manifests,
)
from tests.support.chart import NAMESPACE, VALUE_SETS

pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart


def test_stage_ray_pods_have_memory_backed_shm_and_the_shared_claim(rendered):
    items = rendered("default")
    rayjob = stage_manifests(items)["grpo"]
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = [cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    for template in templates:
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
        assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "llmrl-shared"
        mounts = {m["mountPath"] for m in template["spec"]["containers"][0]["volumeMounts"]}
        assert {"/dev/shm", "/shared", "/etc/llmrl"} <= mounts
    (claim,) = of_kind(items, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    everything_on = rendered("everything-on")
    assert of_kind(everything_on, "PersistentVolumeClaim") == []
    settings, _ = stage_inputs(everything_on)
    assert settings.shared_claim == "llmrl-shared"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_gpus_requested_never_exceed_the_topology(chart, name, rendered):
    """One owner of the GPUs: the chart runs no Ray cluster and no GPU pod; the stages run one
    at a time, each on its own Ray cluster or pod. At any moment the release asks for the
    chart's GPUs (0) plus the running stage's, which must fit the topology's."""
    items = rendered(name)
    topology = merged_values(chart, VALUE_SETS[name]).topology
    assert of_kind(items, "RayCluster") == []
    assert sum(gpus_of(item) for item in items) == 0
    built = stage_manifests(items)
    for stage, manifest in built.items():
        assert requested_gpus(manifest) <= topology.total_gpus, stage
    # Each GPU of the topology is requested exactly once by the GRPO stage's Ray cluster; SFT
    # trains on the trainer's GPUs only; eval takes one GPU when there are any.
    assert requested_gpus(built["grpo"]) == topology.total_gpus
    assert requested_gpus(built["sft"]) == topology.trainer.gpus
    assert requested_gpus(built["eval"]) == min(1, topology.total_gpus)
    assert requested_gpus(built["prepare"]) == 0


def test_gpu_count_counts_every_replica():
    """The measure above is not vacuous: 2 engines x TP 2 + 4 trainer GPUs = 8."""
    topology = Topology.model_validate(
        {
            "inference": {"backend": "vllm", "engines": 2, "tensor_parallel_size": 2},
            "trainer": {"gpus": 4, "strategy": "fsdp"},
        }
    )
    rayjob = build_rayjob_manifest("grpo", "g", KubernetesSettings(), topology)
    assert requested_gpus(rayjob) == topology.total_gpus == 8


@pytest.mark.parametrize("name", VALUE_SETS)
def test_topology_configmap_parses_back(chart, name, rendered):
    values = VALUE_SETS[name]
    items = rendered(name)
    (config,) = of_kind(items, "ConfigMap")
    parsed = Topology.model_validate(yaml.safe_load(config["data"]["topology.yaml"]))
    expected = merged_values(chart, values).topology
    assert parsed.inference.gpus_per_engine == expected.inference.engine_gpus
    assert parsed.model_copy(update={"inference": expected.inference}) == expected
    settings = KubernetesSettings.model_validate(yaml.safe_load(config["data"]["kubernetes.yaml"]))
    assert settings.namespace == NAMESPACE and settings.shared_claim.endswith("shared")
    assert settings.topology == "/etc/llmrl/topology/topology.yaml"
    stages = yaml.safe_load(config["data"]["stages.yaml"])
    assert stages["shared_dir"] == "/shared"
    assert set(stages["stages"]) == {"prepare", "sft", "grpo", "evaluate"}
    assert stages["mlflow_tracking_uri"].startswith(("http://", "https://"))


def test_cpu_ddp_example_runs_two_cpu_ranks_in_one_trainer_pod(chart, rendered):
    topology = merged_values(chart, VALUE_SETS["cpu-ddp"]).topology
    assert topology.total_gpus == 0
    assert (topology.trainer.strategy, topology.trainer.world_size) == ("ddp", 2)
    assert topology.inference.backend == "transformers" and topology.env_workers.count == 2
    rayjob = stage_manifests(rendered("cpu-ddp"))["grpo"]
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    trainer = groups["trainer"]
    assert trainer["replicas"] == 1
    limits = trainer["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["cpu"] == "2" and "nvidia.com/gpu" not in limits
    assert requested_gpus(rayjob) == 0


def test_model_roles_example_places_the_teacher_and_calls_the_judge(chart, rendered):
    topology = merged_values(chart, VALUE_SETS["model-roles"]).topology
    assert topology.judge is not None and topology.judge.remote
    assert topology.teacher is not None and topology.teacher.engine_gpus == 2
    (config,) = of_kind(rendered("model-roles"), "ConfigMap")
    shipped = yaml.safe_load(config["data"]["topology.yaml"])
    assert shipped["judge"] == {
        "url": "http://judge.llm.svc:8000",
        "served_model": "Qwen/Qwen2.5-32B-Instruct",
    }
    assert shipped.get("reward_model") is None  # null in values.yaml: Helm drops the key
    rayjob = stage_manifests(rendered("model-roles"))["grpo"]
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert list(groups) == ["inference", "trainer", "env-workers", "teacher"]  # no judge pods
    teacher = groups["teacher"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (teacher["nvidia.com/gpu"], teacher["cpu"], teacher["memory"]) == ("2", "8", "96Gi")
    assert requested_gpus(rayjob) == topology.total_gpus == 8
