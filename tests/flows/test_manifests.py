"""Every manifest the Kubernetes launcher builds, checked against Kubernetes' and KubeRay's schemas.

Jobs and ConfigMaps go through kubernetes-validate (strict: unknown fields fail); the RayJob
through the real KubeRay CRDs of every tested release (tests/support/crd_schema.py, unknown fields
fail; skipped without ../shared/kuberay-crds), and each of its pod templates (head, worker
groups, submitter) through kubernetes-validate as a ``v1 PodTemplate``.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.launchers.manifests import (
    DRIVER_CPUS,
    DRIVER_RESOURCE,
    KUBERAY_TESTED_VERSIONS,
    build_config_map,
    build_job_manifest,
    build_rayjob_manifest,
    job_resources,
    resource_name,
    topology_override,
)
from flows.launchers.runtime_env import USER_PACKAGES_DIR, USER_SITE_PACKAGES, RayRuntimeEnv
from flows.launchers.settings import RolePods
from llmrl.config import load_config
from llmrl.config.grpo import GRPOConfig
from llmrl.topology import (
    Topology,
)
from llmrl.topology.placement import GroupPlan, plan_groups, requested_resources
from tests.support.crd_schema import missing_crds, validate_custom_object
from tests.support.topologies import (
    CPU_NODES,
    GPU_NODES,
    SETTINGS,
    TOPOLOGIES,
    chart_topology,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S_VERSION = "1.30.0"
MISSING_CRDS = missing_crds(KUBERAY_TESTED_VERSIONS)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
REPO = Path(__file__).resolve().parents[2]
CHART_TOPOLOGIES = {
    "local-default": Topology.local_default(),
    "chart-default": Topology.model_validate(chart_topology()),
    **{
        path.name: Topology.model_validate(chart_topology(path.name))
        for path in sorted((REPO / "helm/llmrl/examples").glob("*.yaml"))
    },
}
ENV = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_PARENT_RUN_ID": "abc123"}
USES_ROLE = {
    "teacher": ("loss.distillation={}", "advantage.drop_zero_std=false"),
    "judge": ("rewards.judge={}",),
    "reward_model": ("rewards.reward_model={}",),
}
"""The GRPO config settings that use each model role (a topology's roles must be used)."""


def _valid(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def _pod_templates(rayjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    templates = {"head": cluster["headGroupSpec"]["template"]}
    templates.update({g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]})
    templates["submitter"] = rayjob["spec"]["submitterPodTemplate"]
    return templates


def _gpus(template: dict[str, Any]) -> int:
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    return int(limits.get("nvidia.com/gpu", 0))


def test_resource_names_are_short_unique_dns_labels() -> None:
    names = {resource_name("Eval_Base after SFT!") for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert name.startswith("llmrl-eval-base-after-sft-")
        assert len(name) <= 47
        assert DNS_LABEL.match(name)


def test_config_map_is_valid() -> None:
    config_map = build_config_map("llmrl-sft-0a1b2c", "llmrl", "sft", "steps: 20\n")
    _valid(config_map)
    assert config_map["data"] == {"sft.yaml": "steps: 20\n"}


@pytest.mark.parametrize("stage", ["prepare", "eval"])
@pytest.mark.parametrize("with_config", [True, False])
def test_job_manifests_are_valid(stage: str, with_config: bool) -> None:
    name = resource_name(stage)
    topology = TOPOLOGIES["split"]
    job = build_job_manifest(
        stage,
        name,
        SETTINGS,
        overrides=["label=base", "data.path=/shared/data/x y"],
        env=ENV,
        config_map=name if with_config else None,
        scheduling=topology.trainer.scheduling if stage == "eval" else CPU_NODES,
        resources=job_resources(stage, SETTINGS, topology),
    )
    _valid(job)
    spec = job["spec"]
    assert spec["backoffLimit"] == 0  # retries are the flow's decision
    assert spec["ttlSecondsAfterFinished"] == SETTINGS.ttl_seconds_after_finished
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "llmrl-stages"
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/llmrl/llmrl:0.1.0"
    assert container["command"][:2] == ["llmrl", stage]
    assert container["command"][-2:] == ["--set", "data.path=/shared/data/x y"]
    assert ("--config" in container["command"]) is with_config
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {**SETTINGS.env, **ENV}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/shared" in mounts and ("/etc/llmrl" in mounts) is with_config
    if stage == "eval":  # a GPU job on the trainer's nodes
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["nodeSelector"] == GPU_NODES.node_selector
        assert pod["tolerations"] == GPU_NODES.tolerations
    else:
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
        assert pod["nodeSelector"] == {"node-pool": "cpu"}


@pytest.mark.parametrize("topology_name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_rayjob_manifests_match_the_schemas(stage: str, topology_name: str) -> None:
    name = resource_name(stage)
    rayjob = build_rayjob_manifest(
        stage,
        name,
        SETTINGS,
        TOPOLOGIES[topology_name],
        overrides=["steps=2", "data.path=/shared/data/a b"],
        env=ENV,
        config_map=name,
    )
    for role, template in _pod_templates(rayjob).items():
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{name}-{role}"},
            "template": template,
        }
        _valid(pod_template)
    if MISSING_CRDS:
        pytest.skip(MISSING_CRDS)
    for version in KUBERAY_TESTED_VERSIONS:
        errors = validate_custom_object(rayjob, version)
        assert errors == [], f"KubeRay {version}: " + "; ".join(map(str, errors))


def test_rayjob_layout_follows_the_topology() -> None:
    topology = TOPOLOGIES["split"]
    rayjob = build_rayjob_manifest("grpo", "llmrl-grpo-0a1b2c", SETTINGS, topology, env=ENV,
                                   config_map="llmrl-grpo-0a1b2c")  # fmt: skip
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    # The Ray cluster (and its GPUs) goes the moment the job ends; the Job TTL is for Jobs.
    assert spec["ttlSecondsAfterFinished"] == 0 != SETTINGS.ttl_seconds_after_finished
    assert spec["activeDeadlineSeconds"] == 86400
    assert shlex.split(spec["entrypoint"]) == [
        "llmrl", "grpo", "--config", "/etc/llmrl/grpo.yaml", "--no-progress",
        "--set", topology_override(topology),
    ]  # fmt: skip
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"env_vars": {**SETTINGS.env, **ENV}}
    cluster = spec["rayClusterSpec"]
    templates = _pod_templates(rayjob)
    assert _gpus(templates["head"]) == 0
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert list(groups) == ["inference", "trainer", "reference", "env-workers"]
    assert groups["inference"]["replicas"] == 4
    assert _gpus(groups["inference"]["template"]) == 2  # = tensor_parallel_size
    assert _gpus(groups["trainer"]["template"]) == 8
    assert _gpus(groups["reference"]["template"]) == 1
    assert groups["env-workers"]["replicas"] == 8
    assert _gpus(groups["env-workers"]["template"]) == 0
    workers = groups["env-workers"]["template"]["spec"]
    assert workers["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert workers["nodeSelector"] == {"node-pool": "cpu"}
    for group in ("inference", "trainer"):
        pod = groups[group]["template"]["spec"]
        assert pod["nodeSelector"] == GPU_NODES.node_selector
        assert pod["tolerations"] == GPU_NODES.tolerations
    # The driver only orchestrates: it runs on the head's one CPU and asks for no GPU.
    assert json.loads(spec["entrypointResources"]) == {DRIVER_RESOURCE: 1}
    assert spec["entrypointNumCpus"] == DRIVER_CPUS == 1
    assert "entrypointNumGpus" not in spec
    head = cluster["headGroupSpec"]["rayStartParams"]
    assert head["num-cpus"] == "1" and DRIVER_RESOURCE in head["resources"]
    assert all("resources" not in group["rayStartParams"] for group in groups.values())
    # Every Ray pod sees the stage config and the shared volume.
    for template in templates.values():
        labels = template["metadata"]["labels"]
        assert labels["llmrl.io/run"] == "llmrl-grpo-0a1b2c"
    for role in ("head", "inference", "trainer", "env-workers"):
        mounts = {m["mountPath"] for m in templates[role]["spec"]["containers"][0]["volumeMounts"]}
        assert {"/etc/llmrl", "/shared", "/dev/shm"} <= mounts
    assert templates["submitter"]["metadata"]["labels"]["llmrl.io/role"] == "driver"


def test_sft_gets_only_the_trainer_and_colocated_grpo_one_group() -> None:
    sft = build_rayjob_manifest("sft", "llmrl-sft-0a1b2c", SETTINGS, TOPOLOGIES["split"])
    cluster = sft["spec"]["rayClusterSpec"]
    (trainer,) = cluster["workerGroupSpecs"]
    assert trainer["groupName"] == "trainer"
    # The sft driver is the training process: on the trainer group, with the trainer's GPUs.
    assert DRIVER_RESOURCE in trainer["rayStartParams"]["resources"]
    assert sft["spec"]["entrypointNumGpus"] == 8
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert "resources" not in cluster["headGroupSpec"]["rayStartParams"]
    colocated = build_rayjob_manifest(
        "grpo", "llmrl-grpo-0a1b2c", SETTINGS, TOPOLOGIES["colocated"]
    )
    group, workers = colocated["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["groupName"], workers["groupName"]) == ("colocated", "env-workers")
    assert _gpus(group["template"]) == 4
    assert "entrypointNumGpus" not in colocated["spec"]  # the engines share those GPUs
    colocated_sft = build_rayjob_manifest(
        "sft", "llmrl-sft-0a1b2c", SETTINGS, TOPOLOGIES["colocated"]
    )
    assert colocated_sft["spec"]["entrypointNumGpus"] == 4  # no engines: the trainer's GPUs
    cpu = build_rayjob_manifest("grpo", "llmrl-grpo-0a1b2c", SETTINGS, TOPOLOGIES["cpu"])
    for template in _pod_templates(cpu).values():
        assert _gpus(template) == 0
    assert "entrypointNumGpus" not in cpu["spec"]


def test_placed_model_roles_get_worker_groups_of_their_own() -> None:
    topology = TOPOLOGIES["model-roles"]
    roles = {"roles": {"judge": {"labels": {"llmrl.example/judge": "yes"}}}}
    settings = type(SETTINGS).model_validate(SETTINGS.model_dump() | roles)
    rayjob = build_rayjob_manifest("grpo", "llmrl-grpo-0a1b2c", settings, topology)
    groups = {g["groupName"]: g for g in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    # the served teacher (url) has no pods; the judge and the reward model one per engine
    assert list(groups) == ["inference", "trainer", "env-workers", "judge", "reward-model"]
    judge, reward = groups["judge"]["template"], groups["reward-model"]["template"]
    assert groups["judge"]["replicas"] == groups["reward-model"]["replicas"] == 1
    assert judge["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "500m",
        "memory": "2Gi",
    }
    assert (_gpus(judge), _gpus(reward)) == (0, 1)
    assert reward["spec"]["nodeSelector"] == GPU_NODES.node_selector
    assert judge["metadata"]["labels"]["llmrl.io/role"] == "judge"
    assert judge["metadata"]["labels"]["llmrl.example/judge"] == "yes"
    assert "llmrl.example/judge" not in reward["metadata"]["labels"]
    assert sum(_gpus(g["template"]) * g["replicas"] for g in groups.values()) == 1
    assert topology.total_gpus == 1
    sft = build_rayjob_manifest("sft", "llmrl-sft-0a1b2c", settings, topology)
    assert [g["groupName"] for g in sft["spec"]["rayClusterSpec"]["workerGroupSpecs"]] == [
        "trainer"
    ]


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_rayjob_carries_the_users_runtime_env(stage: str, tmp_path: Path) -> None:
    """The pipeline's runtime_env goes into runtimeEnvYAML beside llmrl's env_vars, in a form
    Ray's own parser takes (what the submitter's `ray job submit` runs), and the submitter,
    which uploads the local folder, mounts the shared claim."""
    package = tmp_path / "code" / "my_pkg"
    package.mkdir(parents=True)
    runtime_env = RayRuntimeEnv(
        pip=["my-rewards==1.2"],
        py_modules=[str(package), "s3://bucket/extra.zip"],
        env_vars={"MY_API": "http://svc"},
    )
    name = resource_name(stage)
    rayjob = build_rayjob_manifest(
        stage, name, SETTINGS, TOPOLOGIES["split"], env=ENV, config_map=name,
        runtime_env=runtime_env,
    )  # fmt: skip
    carried = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert carried == {
        "pip": ["my-rewards==1.2"],
        "py_modules": [str(package), "s3://bucket/extra.zip"],
        "env_vars": {**SETTINGS.env, **ENV, "MY_API": "http://svc"},
    }
    runtime_env_class = pytest.importorskip("ray.runtime_env").RuntimeEnv
    assert runtime_env_class(**carried)["py_modules"] == carried["py_modules"]
    submitter = _pod_templates(rayjob)["submitter"]["spec"]
    assert {m["mountPath"] for m in submitter["containers"][0]["volumeMounts"]} == {"/shared"}
    for template in _pod_templates(rayjob).values():
        _valid({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
                "template": template})  # fmt: skip
    if MISSING_CRDS:
        pytest.skip(MISSING_CRDS)
    for version in KUBERAY_TESTED_VERSIONS:
        errors = validate_custom_object(rayjob, version)
        assert errors == [], f"KubeRay {version}: " + "; ".join(map(str, errors))


def test_rayjob_without_local_paths_keeps_the_submitter_off_the_claim() -> None:
    runtime_env = RayRuntimeEnv(py_modules=["local:///opt/code/my_pkg", "gs://b/pkg.whl"])
    rayjob = build_rayjob_manifest("grpo", "llmrl-grpo-0a1b2c", SETTINGS, TOPOLOGIES["cpu"],
                                   runtime_env=runtime_env)  # fmt: skip
    assert yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"]) == {
        "py_modules": runtime_env.py_modules,
        "env_vars": SETTINGS.env,
    }
    assert "volumeMounts" not in _pod_templates(rayjob)["submitter"]["spec"]["containers"][0]


def test_job_installs_the_users_pip_packages_and_imports_its_folders() -> None:
    runtime_env = RayRuntimeEnv(
        pip={"packages": ["my-rewards==1.2"], "pip_install_options": ["--index-url", "https://pi"]},
        py_modules=["/shared/code/my_pkg"],
        env_vars={"MY_API": "http://svc"},
    )
    name = resource_name("prepare")
    job = build_job_manifest("prepare", name, SETTINGS, env=ENV, config_map=name,
                             runtime_env=runtime_env)  # fmt: skip
    _valid(job)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (init,) = pod["initContainers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {
        **SETTINGS.env,
        **ENV,
        "MY_API": "http://svc",
        "PYTHONPATH": f"{USER_SITE_PACKAGES}:/shared/code",
    }
    assert init["command"][:2] == ["sh", "-c"]
    assert "--index-url https://pi my-rewards==1.2" in init["command"][2]
    assert init["image"] == container["image"] and init["env"] == container["env"]
    assert init["securityContext"] == container["securityContext"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {USER_PACKAGES_DIR, "/shared", "/etc/llmrl"} <= mounts
    assert init["volumeMounts"] == container["volumeMounts"]
    assert {"name": "user-packages", "emptyDir": {}} in pod["volumes"]
    folders_only = build_job_manifest(
        "eval", name, SETTINGS, runtime_env=RayRuntimeEnv(working_dir="/shared/project")
    )
    pod = folders_only["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert {"name": "PYTHONPATH", "value": "/shared/project"} in pod["containers"][0]["env"]


def test_the_users_env_vars_never_override_llmrls() -> None:
    settings = SETTINGS.model_copy(
        update={"roles": {"env-workers": RolePods(env=[{"name": "SANDBOX", "value": "bwrap"}])}}
    )
    clashes = {"MLFLOW_PARENT_RUN_ID": "x", "HF_HUB_OFFLINE": "0", "SANDBOX": "none"}
    for variable, value in clashes.items():
        runtime_env = RayRuntimeEnv(env_vars={variable: value})
        with pytest.raises(ValueError, match=rf"runtime_env\.env_vars: {variable} is set by"):
            build_rayjob_manifest("grpo", "llmrl-grpo-0a1b2c", settings, TOPOLOGIES["cpu"],
                                  env=ENV, runtime_env=runtime_env)  # fmt: skip
    runtime_env = RayRuntimeEnv(env_vars={"MLFLOW_PARENT_RUN_ID": "x"})
    with pytest.raises(ValueError, match=r"runtime_env\.env_vars: MLFLOW_PARENT_RUN_ID is set"):
        build_job_manifest("eval", "llmrl-eval-0a1b2c", settings, env=ENV, runtime_env=runtime_env)


def test_an_invalid_manifest_is_caught_by_the_schemas() -> None:
    """The schemas bite: a misspelt field fails (so the passing tests above mean something)."""
    job = build_job_manifest("eval", "llmrl-eval-0a1b2c", SETTINGS)
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        _valid(job)
    if MISSING_CRDS:
        pytest.skip(MISSING_CRDS)
    rayjob = build_rayjob_manifest("sft", "llmrl-sft-0a1b2c", SETTINGS, TOPOLOGIES["split"])
    rayjob["spec"]["shutdownAfterJobFinish"] = rayjob["spec"].pop("shutdownAfterJobFinishes")
    for version in KUBERAY_TESTED_VERSIONS:
        errors = [str(error) for error in validate_custom_object(rayjob, version)]
        assert errors == ["spec.shutdownAfterJobFinish: unknown field"]


def _ray_node(group: dict[str, Any]) -> dict[str, float]:
    """The Ray resources one pod of a group advertises, as KubeRay starts it.

    KubeRay's ``ray start`` takes ``num-cpus``/``num-gpus`` from ``rayStartParams`` when given,
    else from the container's limits (CPU rounded up to whole cores, ``*gpu`` resources), plus
    the custom ``resources`` JSON.
    """
    params = group["rayStartParams"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    cpu = limits["cpu"]
    cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    node = {
        "CPU": float(params.get("num-cpus", math.ceil(cores))),
        "GPU": float(params.get("num-gpus", limits.get("nvidia.com/gpu", 0))),
    }
    if "resources" in params:
        node.update(json.loads(params["resources"].strip("'")))
    return node


def _ray_nodes(rayjob: dict[str, Any]) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(head, one entry per worker pod) of a RayJob's cluster, in Ray resources."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    workers = [
        _ray_node(group) for group in cluster["workerGroupSpecs"] for _ in range(group["replicas"])
    ]
    return _ray_node(cluster["headGroupSpec"]), workers


def _pack(plans: list[GroupPlan], nodes: list[dict[str, float]]) -> list[str]:
    """First-fit the planned bundles on the worker pods; the labels of groups that do not fit.

    A ``STRICT_PACK`` group must fit on one pod; the other strategies may spread.
    """
    free = [dict(node) for node in nodes]

    def fits(node: dict[str, float], need: dict[str, float]) -> bool:
        return all(node.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())

    def take(node: dict[str, float], need: dict[str, float]) -> None:
        for name, amount in need.items():
            node[name] -= amount

    unplaced = []
    for plan in plans:
        units = [requested_resources([plan])] if plan.strategy == "STRICT_PACK" else plan.bundles
        for need in units:
            node = next((node for node in free if fits(node, need)), None)
            if node is None:
                unplaced.append(plan.label)
                break
            take(node, need)
    return unplaced


@pytest.mark.parametrize("topology_name", CHART_TOPOLOGIES)
def test_grpo_rayjob_offers_ray_what_the_placement_reserves(topology_name: str) -> None:
    # The runtime reserves `plan_groups(topology)` on the RayJob's cluster and starts one actor
    # per role on it: the worker pods must advertise at least that, each GPU only once, and the
    # driver (on the head) must need no GPU and no core of a worker.
    topology = CHART_TOPOLOGIES[topology_name]
    rayjob = build_rayjob_manifest("grpo", "llmrl-grpo-0a1b2c", SETTINGS, topology)
    spec = rayjob["spec"]
    head, workers = _ray_nodes(rayjob)
    plan = plan_groups(topology)
    plans, roles = list(plan.groups), plan.roles
    requested = requested_resources(plans)
    for resource in ("CPU", "GPU"):
        offered = sum(node.get(resource, 0.0) for node in workers)
        assert offered + 1e-9 >= requested.get(resource, 0.0), resource
    assert sum(node["GPU"] for node in workers) == topology.total_gpus
    assert head["GPU"] == 0
    assert _pack(plans, workers) == []
    trainer = {role.role: role for role in roles}["trainer"]
    assert len(trainer.bundle_indices) == topology.trainer.world_size
    # The driver: no GPU, its one CPU and the driver resource on the head, nowhere else.
    assert spec.get("entrypointNumGpus", 0) == 0
    assert json.loads(spec["entrypointResources"]) == {DRIVER_RESOURCE: 1}
    assert head["CPU"] == spec["entrypointNumCpus"] == DRIVER_CPUS
    assert head[DRIVER_RESOURCE] == 1
    assert all(DRIVER_RESOURCE not in node for node in workers)
    # ...and the stage is told to place exactly this topology (the last --set wins)
    command = shlex.split(spec["entrypoint"])
    assert command[-2] == "--set" and command[-1].startswith("topology=")
    uses = [USES_ROLE[role] for role in topology.model_roles()]  # the config must use each
    settings = [command[-1], "data.path=d", "prompts_per_step=64", *(s for u in uses for s in u)]
    assert load_config(GRPOConfig, None, settings).topology == topology


@pytest.mark.parametrize("topology_name", CHART_TOPOLOGIES)
def test_sft_rayjob_driver_trains_on_the_trainer_group(topology_name: str) -> None:
    topology = CHART_TOPOLOGIES[topology_name]
    rayjob = build_rayjob_manifest("sft", "llmrl-sft-0a1b2c", SETTINGS, topology)
    head, workers = _ray_nodes(rayjob)
    (trainer,) = workers
    assert head["CPU"] == 0 and DRIVER_RESOURCE not in head
    assert trainer[DRIVER_RESOURCE] == 1
    assert trainer["GPU"] == topology.trainer.gpus
    assert rayjob["spec"].get("entrypointNumGpus", 0) == topology.trainer.gpus
    assert trainer["CPU"] >= rayjob["spec"]["entrypointNumCpus"]
