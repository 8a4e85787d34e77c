"""The helm/llmrl chart, rendered and linted offline by the real Helm engine (helm-python-sdk).

Every rendered object is validated: Kubernetes kinds against the bundled Kubernetes 1.30 schemas
(kubernetes-validate, strict: unknown fields fail), KubeRay kinds against the real KubeRay CRDs
of every tested release (tests/support/crd_schema.py, unknown fields fail). The chart renders no
Ray cluster: the RayJobs the launcher builds from each release's settings are validated so.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from flows.launchers.manifests import (
    KUBERAY_TESTED_VERSIONS,
    RAY_STAGES,
    build_job_manifest,
    build_rayjob_manifest,
    job_resources,
    requested_gpus,
)
from flows.launchers.settings import KubernetesSettings
from llmrl.topology import Topology
from llmrl.topology.chart_values import ChartValues
from tests.support.chart import CHART, EXAMPLES, NAMESPACE, VALUE_SETS, objects
from tests.support.crd_schema import KUBERAY_KINDS, missing_crds, validate_custom_object
from tests.support.topologies import INVALID as SPEC_INVALID

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30"


def render(chart, values: dict[str, Any]) -> dict[str, str]:
    return chart.render(values, name="llmrl", namespace=NAMESPACE)


@pytest.fixture(scope="module")
def rendered(chart):
    """The parsed objects of each value set, rendered once per module (do not mutate)."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def get(name: str) -> list[dict[str, Any]]:
        if name not in cache:
            cache[name] = objects(render(chart, VALUE_SETS[name]))
        return cache[name]

    return get


def of_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item for item in items if item["kind"] == kind]


def pod_specs(item: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of each pod an object creates (the chart's pods are Deployments')."""
    if item["kind"] == "Deployment":
        yield item["metadata"]["name"], item["spec"]["template"]["spec"]


def merged_values(chart, values: dict[str, Any]) -> ChartValues:
    return ChartValues.model_validate(chart.merge_values(values))


def stage_inputs(items: list[dict[str, Any]]) -> tuple[KubernetesSettings, Topology]:
    """The stage pods' settings and the topology, as the flow-run pod reads them from the
    chart's ConfigMap."""
    (config,) = of_kind(items, "ConfigMap")
    settings = KubernetesSettings.model_validate(yaml.safe_load(config["data"]["kubernetes.yaml"]))
    topology = Topology.model_validate(yaml.safe_load(config["data"]["topology.yaml"]))
    return settings, topology


def stage_manifests(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Job or RayJob the launcher builds for each stage from a chart release's settings."""
    settings, topology = stage_inputs(items)
    built = {}
    for stage in ("prepare", "sft", "grpo", "eval"):
        name = f"llmrl-{stage}-0a1b2c"
        if stage in RAY_STAGES:
            built[stage] = build_rayjob_manifest(stage, name, settings, topology, config_map=name)
        else:
            resources = job_resources(stage, settings, topology)
            built[stage] = build_job_manifest(stage, name, settings, resources=resources)
    return built


def gpus_of(item: dict[str, Any]) -> int:
    """nvidia.com/gpu requested by every container of a chart object's pods."""
    total = 0
    for _, spec in pod_specs(item):
        for container in spec["containers"]:
            total += int(container["resources"]["requests"].get("nvidia.com/gpu", 0))
    return total


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean(name):
    report = helm.lint(CHART, VALUE_SETS[name], namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_object_validates(name, rendered):
    items = rendered(name)
    kinds = {item["kind"] for item in items}
    assert {"ConfigMap", "Deployment", "Role", "RoleBinding"} <= kinds
    for item in items:
        if item["kind"] in KUBERAY_KINDS:  # none today: each stage brings its own RayJob
            assert_valid_for_kuberay(item)
        else:
            kubernetes_validate.validate(item, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_stage_manifests_of_every_release_validate(name, rendered):
    """The Jobs and RayJobs the launcher builds from a release's settings and topology."""
    for stage, manifest in stage_manifests(rendered(name)).items():
        if stage in RAY_STAGES:
            assert_valid_for_kuberay(manifest)
        else:
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def assert_valid_for_kuberay(item: dict[str, Any]) -> None:
    """A RayJob or RayCluster is valid for every tested KubeRay release (strict: no unknown
    fields); skips without ../shared/kuberay-crds."""
    missing = missing_crds(KUBERAY_TESTED_VERSIONS, tuple(KUBERAY_KINDS.values()))
    if missing:
        pytest.skip(missing)
    for version in KUBERAY_TESTED_VERSIONS:
        errors = validate_custom_object(item, version)
        assert errors == [], f"KubeRay {version}: " + "; ".join(map(str, errors))


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_container_is_bounded_and_locked_down(name, rendered):
    for item in rendered(name):
        for where, spec in pod_specs(item):
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            writable = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
            for container in spec["containers"]:
                label = f"{where}/{container['name']}"
                for part in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(container["resources"][part]), label
                context = container["securityContext"]
                assert context["runAsNonRoot"] is True, label
                assert context["runAsUser"] == 10001, label
                assert context["allowPrivilegeEscalation"] is False, label
                assert context["capabilities"] == {"drop": ["ALL"]}, label
                assert context["readOnlyRootFilesystem"] is True, label
                tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
                assert tmp and tmp[0]["name"] in writable, f"{label}: /tmp must be an emptyDir"


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


SENSITIVE_KEY = re.compile(r"password|passwd|token|secret|credential|apikey|api_key", re.I)
SECRET_LOOKING = re.compile(r"://[^/\s:@]+:[^/\s@]+@|AKIA[0-9A-Z]{16}|-----BEGIN")


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")
    else:
        yield path, node


@pytest.mark.parametrize("path", [CHART / "values.yaml", *EXAMPLES], ids=lambda p: p.name)
def test_values_hold_no_secret_values(path):
    for where, value in _walk(yaml.safe_load(path.read_text())):
        if isinstance(value, str):
            assert not SECRET_LOOKING.search(value), f"{where} looks like a credential"
        leaf = where.rsplit(".", 1)[-1]
        if SENSITIVE_KEY.search(where) and value not in ("", None):
            # Only Secret references: a Secret's name or the name of a key inside it.
            assert leaf in {
                "name",
                "key",
                "credentialsSecret",
                "accessKeyIdKey",
                "secretAccessKeyKey",
            }, f"{where} holds a value, not a Secret ref"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_sensitive_env_comes_from_secrets(name, rendered):
    items = rendered(name)
    assert of_kind(items, "Secret") == [], "the chart never creates Secrets"
    sensitive = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|STORE_URI|CONNECTION_URL|ACCESS_KEY")
    for item in items:
        for where, spec in pod_specs(item):
            for container in spec["containers"]:
                for env in container.get("env", []):
                    if sensitive.search(env["name"]):
                        assert "secretKeyRef" in env.get("valueFrom", {}), f"{where}: {env}"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rbac_is_namespaced_and_least_privilege(name, rendered):
    items = rendered(name)
    assert not {"ClusterRole", "ClusterRoleBinding"} & {item["kind"] for item in items}
    (role,) = of_kind(items, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # tests/flows/test_rbac.py: each one is used (by the launcher, the flow's cleanup or the
    # Prefect worker), each call they make is granted, and k8s/launcher-rbac.yaml grants the same.
    expected = {("ray.io", "rayjobs", v) for v in ("create", "list", "watch", "delete")}
    expected |= {("batch", "jobs", v) for v in ("create", "get", "list", "watch", "delete")}
    expected |= {("", "configmaps", v) for v in ("create", "patch", "delete")}
    expected |= {("", "pods", v) for v in ("list", "watch")}
    expected |= {("", "pods/log", "get")}
    assert granted == expected
    (binding,) = of_kind(items, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    (account,) = of_kind(items, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]


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


@pytest.mark.parametrize("name", VALUE_SETS)
def test_values_validate_as_chart_values(chart, name):
    merged = chart.merge_values(VALUE_SETS[name])
    ChartValues.model_validate(merged)
    chart.validate_schema(VALUE_SETS[name])


def test_schema_is_current():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chart_schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert chart_schema_text() == (CHART / "values.schema.json").read_text()


def chart_schema_text() -> str:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import chart_schema
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return chart_schema.render_schema()


def test_schema_check_detects_drift(tmp_path):
    stale = tmp_path / "values.schema.json"
    stale.write_text((CHART / "values.schema.json").read_text().replace('"vllm"', '"tgi"', 1))
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chart_schema.py"),
            "--check",
            "--output",
            str(stale),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "is out of date" in result.stderr


def test_schema_is_draft07_without_refs():
    text = (CHART / "values.schema.json").read_text()
    schema = json.loads(text)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert "$ref" not in text and "$defs" not in text
    jsonschema.Draft7Validator.check_schema(schema)
    assert (
        schema["properties"]["topology"]["properties"]["inference"]["additionalProperties"] is False
    )


INVALID_TOPOLOGIES = [
    pytest.param(
        {
            "colocated": True,
            "inference": {"engines": 2, "tensor_parallel_size": 2},
            "trainer": {"gpus": 2, "strategy": "ddp"},
        },
        r"topology\.trainer\.gpus: colocated .* \(2 x 2 = 4\), got 2",
        id="colocated-mismatch-fail-guard",
    ),
    pytest.param(
        {"inference": {"tensor_parallel_size": 2, "gpus_per_engine": 1}},
        r"topology\.inference\.gpus_per_engine: .* must equal .*tensor_parallel_size \(2\), .*1",
        id="gpus-per-engine-fail-guard",
    ),
    pytest.param(
        {"inference": {"backend": "transformers", "tensor_parallel_size": 2}},
        r"/topology/inference/tensor_parallel_size",
        id="transformers-tp-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 4, "strategy": "single"}},
        r"/topology/trainer/gpus.*maximum",
        id="single-gpus-schema",
    ),
    pytest.param(
        {"reference": {"placement": "dedicated", "gpus": 0}},
        r"/topology/reference/gpus.*minimum",
        id="dedicated-reference-schema",
    ),
    pytest.param(
        {"inference": {"backend": "transformers", "gpus_per_engine": 2}},
        r"/topology/inference/gpus_per_engine.*one of 0, 1",
        id="transformers-gpus-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 0, "strategy": "ddp"}},
        r"/topology/trainer/gpus': minimum: got 0, want 2",
        id="ddp-needs-2-ranks-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 0, "ranks": 2, "strategy": "single"}},
        r"/topology/trainer/ranks.*one of 1",
        id="single-is-one-rank-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 2, "ranks": 4, "strategy": "fsdp"}},
        r"topology\.trainer\.ranks: each rank of a GPU trainer drives one GPU; must equal "
        r"trainer\.gpus \(2\) or be left out \(got 4\)",
        id="one-rank-per-gpu-fail-guard",
    ),
    pytest.param(
        {"trainer": {"ranks": 2, "strategy": "ddp"}},  # gpus stays at the chart's 1
        r"topology\.trainer\.ranks: .* set trainer\.gpus to 0 for CPU ranks",
        id="cpu-ranks-need-gpus-0-fail-guard",
    ),
    pytest.param(
        {"inference": {"engine": 2}},
        r"additional properties 'engine' not allowed",
        id="unknown-key-schema",
    ),
    pytest.param(
        {"inference": {"engines": 0}}, r"/topology/inference/engines.*minimum", id="bounds-schema"
    ),
]


@pytest.mark.parametrize(("topology", "message"), INVALID_TOPOLOGIES)
def test_invalid_topology_does_not_render(chart, topology, message):
    with pytest.raises(helm.HelmError, match=message):
        render(chart, {"topology": topology})
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        ChartValues.model_validate(chart.merge_values({"topology": topology}))


@pytest.fixture(scope="module")
def chart_without_schema(tmp_path_factory):
    """A copy of the chart without values.schema.json (as with --skip-schema-validation)."""
    copy_dir = tmp_path_factory.mktemp("chart") / "llmrl"
    shutil.copytree(CHART, copy_dir)
    (copy_dir / "values.schema.json").unlink()
    with helm.Chart.load(copy_dir) as loaded:
        yield loaded


@pytest.mark.parametrize(("topology", "message"), SPEC_INVALID)
def test_fail_guard_mirrors_every_topology_rule(chart_without_schema, topology, message):
    # The template guard alone (no schema) rejects what Topology rejects, with the same (first)
    # message, prefixed with "topology.": both come from llmrl/topology/rules.py.
    values = chart_without_schema.merge_values({"topology": topology})["topology"]
    with pytest.raises(ValueError, match=message) as refused:
        Topology.model_validate(values)
    first = refused.value.errors()[0]["ctx"]["error"].args[0].splitlines()[0]
    with pytest.raises(helm.HelmRenderError, match=re.escape(f"topology.{first}")):
        render(chart_without_schema, {"topology": topology})


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


def test_mlflow_uses_existing_secrets_or_an_external_server(chart, rendered):
    items = rendered("default")
    (deployment,) = [
        d for d in of_kind(items, "Deployment") if d["metadata"]["name"] == "llmrl-mlflow"
    ]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"] == {
        "name": "llmrl-mlflow-db",
        "key": "uri",
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "llmrl-mlflow-s3"
    assert container["command"][container["command"].index("--artifacts-destination") + 1] == (
        "s3://mlflow/artifacts"
    )
    assert [s["metadata"]["name"] for s in of_kind(items, "Service")] == ["llmrl-mlflow"]
    external = rendered("external-mlflow")
    assert "llmrl-mlflow" not in {d["metadata"]["name"] for d in of_kind(external, "Deployment")}
    (config,) = of_kind(external, "ConfigMap")
    stages = yaml.safe_load(config["data"]["stages.yaml"])
    assert stages["mlflow_tracking_uri"] == "https://mlflow.example.com"
    with pytest.raises(helm.HelmError, match=r"mlflow\.externalUri"):
        render(chart, {"mlflow": {"enabled": False}})


def test_servers_run_the_versions_llmrl_uses(rendered):
    """The MLflow server runs the client's MLflow (with a Postgres driver: the Dockerfile's
    mlflow target); the Prefect worker and server the Prefect of prefect.yaml."""
    import mlflow
    import prefect

    items = rendered("everything-on")
    images = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["image"]
        for d in of_kind(items, "Deployment")
    }
    assert images["llmrl-mlflow"] == f"ghcr.io/llmrl/llmrl-mlflow:{mlflow.__version__}"
    project = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert project["prefect-version"] == prefect.__version__
    assert (
        images["llmrl-prefect-worker"]
        == f"prefecthq/prefect:{prefect.__version__}-python3.11-kubernetes"
    )
    assert images["llmrl-prefect-server"] == f"prefecthq/prefect:{prefect.__version__}-python3.11"


PLATFORM_VALUES: dict[str, Any] = {
    "podLabels": {"team": "rl"},
    "podAnnotations": {"cost-center": "42"},
    "priorityClassName": "gpu-high",
    "runtimeClassName": "nvidia",
    "imagePullSecrets": [{"name": "regcred"}],
    "huggingFace": {"tokenSecret": {"name": "hf", "key": "token"}},
    "kueue": {"queueName": "gpu-queue"},
    "stagePods": {
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "envFrom": [{"secretRef": {"name": "s3"}}],
        "roles": {
            "trainer": {
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "podLabels": {"role": "trainer"},
            },
            "envWorkers": {"podAnnotations": {"sandbox": "gvisor"}},
        },
    },
    "mlflow": {"env": [{"name": "GUNICORN_CMD_ARGS", "value": "--timeout 120"}]},
    "prefect": {"worker": {"envFrom": [{"configMapRef": {"name": "proxy"}}]}},
}


def test_platform_values_reach_chart_pods(chart):
    items = objects(render(chart, copy.deepcopy(PLATFORM_VALUES)))
    for item in items:
        kubernetes_validate.validate(item, K8S_VERSION, strict=True)
    deployments = {
        d["metadata"]["name"]: d["spec"]["template"] for d in of_kind(items, "Deployment")
    }
    for name, template in deployments.items():
        assert template["metadata"]["labels"]["team"] == "rl", name
        assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "llmrl", name
        assert template["metadata"]["annotations"] == {"cost-center": "42"}, name
        spec = template["spec"]
        assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("gpu-high", "nvidia")
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], name
    mlflow_env = deployments["llmrl-mlflow"]["spec"]["containers"][0]["env"]
    assert {"name": "GUNICORN_CMD_ARGS", "value": "--timeout 120"} in mlflow_env
    worker = deployments["llmrl-prefect-worker"]["spec"]["containers"][0]
    assert worker["envFrom"] == [{"configMapRef": {"name": "proxy"}}]


def test_platform_values_reach_stage_pods(chart):
    """The chart's values reach the Jobs and RayJobs the launcher builds, role by role."""
    items = objects(render(chart, copy.deepcopy(PLATFORM_VALUES)))
    built = stage_manifests(items)
    for stage, manifest in built.items():
        assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue", stage
    grpo = built["grpo"]["spec"]
    cluster = grpo["rayClusterSpec"]
    templates = {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}
    templates["head"] = cluster["headGroupSpec"]["template"]
    templates["driver"] = grpo["submitterPodTemplate"]
    templates["job"] = built["eval"]["spec"]["template"]
    for role, template in templates.items():
        spec, labels = template["spec"], template["metadata"]["labels"]
        assert labels["team"] == "rl" and labels["llmrl.io/role"] == role, role
        assert (spec["priorityClassName"], spec["runtimeClassName"]) == ("gpu-high", "nvidia")
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], role
        container = spec["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
        expected = "INFO" if role == "trainer" else "WARN"
        assert env["NCCL_DEBUG"]["value"] == expected, role
        assert container["envFrom"] == [{"secretRef": {"name": "s3"}}], role
    assert templates["trainer"]["metadata"]["labels"]["role"] == "trainer"
    assert "role" not in templates["inference"]["metadata"]["labels"]
    assert templates["env-workers"]["metadata"]["annotations"] == {
        "cost-center": "42",
        "sandbox": "gvisor",
    }


def test_prefect_worker_and_optional_server(chart, rendered):
    items = rendered("default")
    names = {d["metadata"]["name"] for d in of_kind(items, "Deployment")}
    assert "llmrl-prefect-server" not in names
    (worker,) = [
        d for d in of_kind(items, "Deployment") if d["metadata"]["name"] == "llmrl-prefect-worker"
    ]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:7] == [
        "prefect",
        "worker",
        "start",
        "--pool",
        "llmrl-k8s",
        "--type",
        "kubernetes",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PREFECT_API_URL"] == "http://prefect-server.prefect.svc:4200/api"
    assert worker["spec"]["template"]["spec"]["serviceAccountName"] == "llmrl"
    with_server = rendered("everything-on")
    assert {"llmrl-prefect-server"} <= {
        d["metadata"]["name"] for d in of_kind(with_server, "Deployment")
    }
    (worker,) = [
        d
        for d in of_kind(with_server, "Deployment")
        if d["metadata"]["name"] == "llmrl-prefect-worker"
    ]
    env = {e["name"]: e for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PREFECT_API_URL"]["value"] == "http://llmrl-prefect-server.llmrl.svc:4200/api"
    assert env["PREFECT_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "prefect-cloud"
    with pytest.raises(helm.HelmError, match=r"prefect\.apiUrl"):
        render(chart, {"prefect": {"apiUrl": ""}})


def test_notes_explain_access_and_how_to_run(chart):
    notes = render(chart, {})["llmrl/templates/NOTES.txt"]
    assert "kubectl -n llmrl port-forward svc/llmrl-mlflow 5000:5000" in notes
    (line,) = [x for x in notes.splitlines() if "prefect deployment run" in x]
    assert line.strip().startswith(
        "prefect deployment run 'llmrl-pipeline/default' --param params="
    )
    params = json.loads(line.split("params=", 1)[1].strip("'"))
    assert params["launcher"] == "kubernetes"
    assert params["work_dir"].startswith("/shared/")
    # The stage pods' settings are the release's, from kubernetes.yaml in its ConfigMap.
    assert "kubernetes" not in params
    assert "settings (key kubernetes.yaml)" in notes
    assert params["mlflow_tracking_uri"] == "http://llmrl-mlflow.llmrl.svc:5000"
    assert "trainer 1 rank(s) on 1 GPU(s) (single)" in notes
    cpu_ddp = render(chart, copy.deepcopy(VALUE_SETS["cpu-ddp"]))["llmrl/templates/NOTES.txt"]
    assert "trainer 2 rank(s) on 0 GPU(s) (ddp)" in cpu_ddp
    with_server = render(chart, copy.deepcopy(VALUE_SETS["everything-on"]))
    assert (
        "port-forward svc/llmrl-prefect-server 4200:4200"
        in with_server["llmrl/templates/NOTES.txt"]
    )
