"""The helm/llmrl chart's security: locked-down, bounded containers; no secret in its values,
sensitive environment only from Secrets; namespaced, least-privilege RBAC."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.helm.chart_objects import of_kind, pod_specs
from tests.support.chart import CHART, EXAMPLES, NAMESPACE, VALUE_SETS

pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart


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
