"""The launcher's Role: one set of rules (chart = k8s/launcher-rbac.yaml), enough for the
launcher, the flow's cleanup and the Prefect worker, and nothing more.

The launcher's calls are recorded by the fake API server (tests/flows/fake_k8s_api.py), which
enforces the chart's Role, across its scenarios: a Job stage and a RayJob stage that succeed, a
failing stage, a cancelled one, and the flow's cleanup of a flow run. The Prefect worker's calls
are :data:`tests.flows.rbac.PREFECT_WORKER_CALLS` (read from prefect-kubernetes' source).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.launchers import KubernetesLauncher, KubernetesSettings, StageError, StageFailedError
from llmrl.topology import Topology
from tests.flows.fake_k8s_api import FakeKubernetes
from tests.flows.rbac import (
    PREFECT_WORKER_CALLS,
    Permission,
    chart_role_rules,
    granted,
    manifest_role_rules,
    without,
)
from tests.support.signals import send_ctrl_c

pytest.importorskip("kubernetes")
helm = pytest.importorskip("helm_python", reason="helm-python-sdk renders the chart's Role")

NAMESPACE = "llmrl"
FLOW_RUN = "0f1e2d3c-flow-run"


def _settings(**changes: Any) -> KubernetesSettings:
    values = {
        "namespace": NAMESPACE,
        "image": "registry.example/llmrl:test",
        "watch_window_s": 1,
        "unschedulable_timeout_s": 0,
        "api_retry_s": 0,
        **changes,
    }
    return KubernetesSettings(**values)


def _launcher(fake: FakeKubernetes, owner: dict[str, Any] | None = None) -> KubernetesLauncher:
    """A launcher for flow run :data:`FLOW_RUN`, its objects owned by the flow-run pod."""
    changes = {}
    if owner is not None and "owner_pod" in KubernetesSettings.model_fields:
        changes["owner_pod"] = {"name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}
    return KubernetesLauncher(
        _settings(shared_mount_path=str(fake.shared_dir), **changes),
        api_client=fake.api_client(),
        topology=Topology.local_default(),
        flow_run_id=FLOW_RUN,
    )


def _flow_run_pod(fake: FakeKubernetes) -> dict[str, Any]:
    """The flow-run pod, as the Prefect worker's Job made it (seeded: no RBAC involved)."""
    body = {"metadata": {"name": "flow-run-pod"}, "spec": {}, "status": {"phase": "Running"}}
    return fake.seed("pods", NAMESPACE, body)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "stage.yaml"
    path.write_text("batch_size: 4\n", encoding="utf-8")
    return path


def _cancel_when_running(fake: FakeKubernetes) -> None:
    """Ctrl-C (Prefect cancelling the task) once a stage pod runs."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stage_pods = [p for p in fake.pods() if "llmrl.io/run" in p["metadata"].get("labels", {})]
        if any(p["status"]["phase"] == "Running" for p in stage_pods):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    send_ctrl_c()


def _launcher_calls(config_file: Path) -> set[Permission]:
    """Every permission the launcher and the flow's cleanup needed, across the scenarios."""
    from flows.launchers.kubernetes import delete_flow_run_resources

    used: set[Permission] = set()
    runs = [("success", "eval"), ("success", "sft"), ("oom", "eval"), ("config_error", "grpo")]
    for scenario, stage in runs:
        with FakeKubernetes(scenario, step_s=0.05) as fake:
            launcher = _launcher(fake, _flow_run_pod(fake))
            try:
                launcher.run(stage, config_file, [], {})
            except StageError:
                assert scenario != "success"
            assert fake.denied == [], f"{scenario} {stage}: {fake.denied}"
            assert fake.collected == [], fake.collected  # the owner references hold
            used |= fake.permissions_used()
    with FakeKubernetes("hang", step_s=0.05) as fake:  # cancelled, then the flow cleans up
        launcher = _launcher(fake, _flow_run_pod(fake))
        threading.Thread(target=_cancel_when_running, args=(fake,), daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            launcher.run("grpo", config_file, [], {})
        delete_flow_run_resources(launcher.settings, FLOW_RUN, api_client=fake.api_client())
        assert fake.denied == [], f"cancellation: {fake.denied}"
        used |= fake.permissions_used()
    return used


def test_the_chart_and_the_plain_manifest_grant_one_set_of_rules() -> None:
    chart = chart_role_rules()
    assert chart == manifest_role_rules()
    for rule in chart:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert not rule.get("resourceNames")


def test_the_role_covers_the_prefect_workers_calls() -> None:
    missing = PREFECT_WORKER_CALLS - granted(chart_role_rules())
    assert not missing, f"the Prefect worker would get 403 on: {sorted(missing)}"


@pytest.mark.timeout(120)
def test_every_grant_is_used_and_every_call_is_granted(config_file, default_sigint) -> None:
    rules = chart_role_rules()
    used = _launcher_calls(config_file) | PREFECT_WORKER_CALLS
    unused = granted(rules) - used
    ungranted = used - granted(rules)
    assert not ungranted, f"calls the Role does not grant: {sorted(ungranted)}"
    assert not unused, f"grants nobody uses (least privilege): {sorted(unused)}"
    assert not any(p.resource == "rayclusters" for p in used)  # KubeRay makes them, not llmrl


def test_without_the_configmaps_rule_the_first_stage_fails_with_the_403(config_file) -> None:
    # The issue: the Role granted no ConfigMaps, so every stage with a config file failed.
    rules = without(chart_role_rules(), "configmaps")
    with FakeKubernetes("success", rules=rules) as fake, pytest.raises(StageFailedError) as caught:
        _launcher(fake).run("eval", config_file, [], {})
    message = str(caught.value)
    assert "creating the ConfigMap: the Kubernetes API answered 403 Forbidden" in message
    assert (
        'configmaps is forbidden: User "system:serviceaccount:llmrl:llmrl-launcher" cannot '
        'create resource "configmaps" in API group "" in the namespace "llmrl"'
    ) in message
    assert fake.created == []


def test_the_workers_observer_watches_only_the_release_namespace() -> None:
    """prefect-kubernetes >= 0.7's observer (kopf) watches pods and jobs cluster-wide unless
    told a namespace, which the namespaced Role forbids."""
    with helm.Chart.load(Path(__file__).resolve().parents[2] / "helm" / "llmrl") as chart:
        rendered = chart.render({}, name="llmrl", namespace=NAMESPACE)
    (worker,) = [
        doc
        for doc in yaml.safe_load_all(rendered["llmrl/templates/prefect-worker.yaml"])
        if doc and doc["kind"] == "Deployment"
    ]
    env = {
        e["name"]: e.get("value")
        for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env.get("PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES") == NAMESPACE
