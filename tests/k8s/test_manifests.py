"""The plain manifests in k8s/: Kubernetes schemas, least privilege, the Prefect job template."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest

from tests.support.k8s_manifests import (
    JOB_TEMPLATE,
    K8S,
    MANIFESTS,
    PLACEHOLDER,
    all_objects,
    documents,
    fill,
)

K8S_VERSION = "1.30"
CLUSTER_SCOPED = {"Namespace", "StorageClass"}


def test_the_expected_manifests_exist():
    assert {p.name for p in MANIFESTS} == {
        "namespace.yaml",
        "launcher-rbac.yaml",
        "storage.yaml",
        "storage-classes.yaml",
    }
    assert (K8S / "README.md").is_file()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_kubernetes_schemas(path):
    docs = documents(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_everything_lives_in_the_llmrl_namespace():
    (namespace,) = documents(K8S / "namespace.yaml")
    name = namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    for doc in all_objects():
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == name, doc["metadata"]["name"]


def test_launcher_rbac_is_namespaced_least_privilege():
    docs = {doc["kind"]: doc for doc in documents(K8S / "launcher-rbac.yaml")}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}
    rules = docs["Role"]["rules"]
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert ("ray.io", "rayjobs", "create") in granted
    assert ("", "pods/log", "get") in granted
    # The stage ConfigMaps: created, adopted by their Job/RayJob (patch), deleted. Nothing else
    # is written in place. tests/flows/test_rbac.py proves every grant is used, and the same as
    # the chart's Role.
    config_maps = {verb for group, resource, verb in granted if resource == "configmaps"}
    assert config_maps == {"create", "patch", "delete"}
    assert not {verb for _, resource, verb in granted if resource != "configmaps"} & {
        "update",
        "patch",
        "deletecollection",
        "escalate",
    }
    assert not {resource for _, resource, _ in granted} & {
        "secrets",
        "roles",
        "rolebindings",
        "rayclusters",
        "events",
    }
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]


def test_example_storage_is_read_write_many():
    (claim,) = documents(K8S / "storage.yaml")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_example_storage_classes_are_rwx_provisioners():
    classes = documents(K8S / "storage-classes.yaml")
    assert {doc["kind"] for doc in classes} == {"StorageClass"}
    assert "namespace" not in set().union(*(doc["metadata"] for doc in classes))
    provisioners = {doc["provisioner"]: doc for doc in classes}
    assert set(provisioners) == {"nfs.csi.k8s.io", "efs.csi.aws.com"}
    assert {"server", "share"} <= set(provisioners["nfs.csi.k8s.io"]["parameters"])
    efs = provisioners["efs.csi.aws.com"]["parameters"]
    assert efs["provisioningMode"] == "efs-ap"
    assert (efs["uid"], efs["gid"]) == ("10001", "10001"), "the image runs as uid/gid 10001"
    # Retain: deleting a release must not delete checkpoints.
    assert {doc["reclaimPolicy"] for doc in classes} == {"Retain"}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return json.loads(JOB_TEMPLATE.read_text())


def placeholders(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set().union(*(placeholders(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(placeholders(value) for value in node))
    return set(PLACEHOLDER.findall(node)) if isinstance(node, str) else set()


def test_job_template_has_the_prefect_keys(template):
    assert set(template) == {"job_configuration", "variables"}
    configuration = template["job_configuration"]
    assert {"command", "env", "labels", "name", "namespace", "job_manifest"} <= set(configuration)
    variables = template["variables"]
    assert variables["type"] == "object"
    assert {"name", "env", "labels", "command", "namespace", "image"} <= set(
        variables["properties"]
    )
    missing = placeholders(configuration) - set(variables["properties"])
    assert not missing, f"placeholders without a variable: {sorted(missing)}"


def test_job_manifest_meets_prefect_kubernetes_requirements(template):
    # What prefect-kubernetes' KubernetesWorkerJobConfiguration validates in a job manifest.
    manifest = template["job_configuration"]["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert "labels" in manifest["metadata"]
    pod = manifest["spec"]["template"]["spec"]
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    assert pod["containers"][0]["name"] == "prefect-job"


def test_job_template_sets_the_service_urls_and_identity(template):
    properties = template["variables"]["properties"]
    env = properties["env"]["default"]
    assert env["PREFECT_API_URL"].endswith("/api")
    assert env["MLFLOW_TRACKING_URI"].startswith("http")
    (account,) = [d for d in documents(K8S / "launcher-rbac.yaml") if d["kind"] == "ServiceAccount"]
    assert properties["service_account_name"]["default"] == account["metadata"]["name"]
    assert properties["namespace"]["default"] == account["metadata"]["namespace"]


def test_job_built_from_the_defaults_is_a_valid_job(template):
    values = {
        name: spec["default"]
        for name, spec in template["variables"]["properties"].items()
        if "default" in spec
    }
    values |= {"name": "llmrl-flow", "command": ["prefect", "flow-run", "execute"]}
    values["labels"] = {"prefect.io/flow-run-id": "0"}
    job = fill(copy.deepcopy(template["job_configuration"]["job_manifest"]), values)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # The worker prepends its `env` mapping as name/value pairs to the fixed list.
    container["env"] = [{"name": k, "value": v} for k, v in values["env"].items()] + container[
        "env"
    ]
    # Not Pod fields: prefect-kubernetes requires them there; the API server drops them.
    del pod["parallelism"], pod["completions"]
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert {"PREFECT_API_URL", "MLFLOW_TRACKING_URI"} <= {e["name"] for e in container["env"]}
    assert "nvidia.com/gpu" not in container["resources"]["limits"], "flow runs are CPU-only"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "shared": "/shared", "topology": "/etc/llmrl/topology"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "llmrl-shared"
