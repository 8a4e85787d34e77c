"""Every pod llmrl creates meets the "restricted" Pod Security Standard; its RBAC stays in the
namespace.

The pods: the Helm chart rendered with its defaults, every example values file and the
chart tests' other value sets (Deployments, the RayCluster's head and worker groups); the
Kubernetes launcher's Job and RayJob of every stage (head, worker groups, submitter) for
several topologies and settings; the flow-run Job of the Prefect work pool template in k8s/.
They are checked by ``pod_security.py``; a pod that must deviate would go into
``EXCEPTIONS`` with its reason (none does: GPU pods need no privilege, /dev/shm is an
emptyDir). The RBAC of the chart and of k8s/ is checked by ``rbac_policy.py``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import yaml

from flows.launchers.manifests import (
    RAY_STAGES,
    KubernetesSettings,
    build_job_manifest,
    build_rayjob_manifest,
)
from tests.reliability.pod_security import pod_specs, restricted_violations
from tests.reliability.rbac_policy import rbac_violations
from tests.support.chart import NAMESPACE, VALUE_SETS, objects
from tests.support.k8s_manifests import JOB_TEMPLATE, all_objects, fill
from tests.support.topologies import SETTINGS, TOPOLOGIES

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

STAGES = (*KubernetesSettings().jobs, *RAY_STAGES)  # prepare, eval (Jobs); sft, grpo (RayJobs)
WORKLOAD_KINDS = frozenset(
    {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
    | {"RayCluster", "RayJob", "RayService"}
)
# "<Kind>/<name> <where>" of a pod allowed to deviate -> why. Empty: none needs to.
EXCEPTIONS: dict[str, str] = {}
# Cluster-scoped RBAC objects allowed anyway ("<Kind>/<name>" -> why). Empty: none.
CLUSTER_RBAC_EXCEPTIONS: dict[str, str] = {}
LAUNCHER_SETTINGS = {
    "defaults": KubernetesSettings(),
    "chart-run": SETTINGS,  # service account, deadline, extra env: as a chart release runs it
    # A user who empties the pod securityContext still gets restricted containers.
    "no-pod-context": KubernetesSettings(security_context={}),
}


def restricted_report(items: Iterable[Mapping[str, Any]]) -> tuple[int, list[str]]:
    """(pods found, violations not allow-listed) over ``items``; every workload must hold
    at least one pod spec, so a layout the finder misses fails instead of passing empty."""
    count, found = 0, []
    for item in items:
        who = (
            f"{item['kind']}/{item['metadata'].get('name') or item['metadata'].get('generateName')}"
        )
        pods = list(pod_specs(item))
        if item["kind"] in WORKLOAD_KINDS and not pods:
            found.append(f"{who}: no pod spec found")
        for where, spec, notes in pods:
            count += 1
            if f"{who} {where}" in EXCEPTIONS:
                continue
            found += [f"{who} {where}: {v}" for v in restricted_violations(spec, notes)]
    return count, found


@pytest.mark.parametrize("values", VALUE_SETS)
def test_chart_pods_meet_the_restricted_standard(chart, values: str) -> None:
    items = objects(chart.render(VALUE_SETS[values], name="llmrl", namespace=NAMESPACE))
    count, violations = restricted_report(items)
    assert violations == []
    deployments = [item for item in items if item["kind"] == "Deployment"]
    # One pod spec per Deployment; the chart runs no Ray cluster (stages bring their own,
    # checked by the launcher test below).
    assert count == len(deployments) and deployments


@pytest.mark.parametrize("settings", LAUNCHER_SETTINGS)
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("stage", STAGES)
def test_launcher_pods_meet_the_restricted_standard(stage: str, topology: str, settings: str):
    chosen, spec = LAUNCHER_SETTINGS[settings], TOPOLOGIES[topology]
    job = build_job_manifest(stage, "llmrl-x", chosen, config_map="llmrl-x", overrides=["a=1"])
    manifests = [job]
    if stage in RAY_STAGES:
        manifests.append(
            build_rayjob_manifest(stage, "llmrl-y", chosen, spec, config_map="llmrl-y")
        )
    count, violations = restricted_report(manifests)
    assert violations == []
    expected = 1  # the Job's pod
    if stage in RAY_STAGES:  # the RayJob's head, worker groups and submitter
        expected += 2 + len(manifests[1]["spec"]["rayClusterSpec"]["workerGroupSpecs"])
    assert count == expected


def test_work_pool_flow_run_pods_meet_the_restricted_standard() -> None:
    template = json.loads(JOB_TEMPLATE.read_text())
    values = {
        name: spec["default"]
        for name, spec in template["variables"]["properties"].items()
        if "default" in spec
    }
    values |= {"name": "llmrl-flow", "command": ["prefect", "flow-run", "execute"]}
    job = fill(copy.deepcopy(template["job_configuration"]["job_manifest"]), values)
    job["metadata"]["name"] = "llmrl-flow"
    assert restricted_report([job]) == (1, [])


@pytest.mark.parametrize("values", VALUE_SETS)
def test_chart_rbac_is_namespaced_least_privilege(chart, values: str) -> None:
    items = objects(chart.render(VALUE_SETS[values], name="llmrl", namespace=NAMESPACE))
    rbac = [item for item in items if item["kind"] in ("Role", "RoleBinding")]
    assert len(rbac) == 2
    assert rbac_violations(items, NAMESPACE, CLUSTER_RBAC_EXCEPTIONS) == []


def test_plain_manifests_rbac_is_namespaced_least_privilege() -> None:
    items = all_objects()
    assert {item["kind"] for item in items} >= {"Role", "RoleBinding"}
    assert rbac_violations(items, "llmrl", CLUSTER_RBAC_EXCEPTIONS) == []


BAD_POD = """
metadata:
  annotations:
    container.apparmor.security.beta.kubernetes.io/app: unconfined
spec:
  hostNetwork: true
  hostPID: true
  hostIPC: true
  securityContext:
    runAsUser: 0
    seccompProfile: {type: Unconfined}
    sysctls: [{name: kernel.msgmax, value: "1"}]
    seLinuxOptions: {type: spc_t, user: root}
  volumes:
    - {name: host, hostPath: {path: /}}
    - {name: ok, emptyDir: {}}
  initContainers:
    - name: init
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
  containers:
    - name: app
      ports: [{containerPort: 80, hostPort: 80}]
      securityContext:
        privileged: true
        runAsNonRoot: false
        procMount: Unmasked
        appArmorProfile: {type: Unconfined}
        capabilities: {add: [SYS_ADMIN, NET_BIND_SERVICE]}
"""
BAD_RBAC = """
kind: ClusterRole
metadata: {name: everything}
rules:
  - {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
  - {nonResourceURLs: [/metrics], verbs: [get]}
---
kind: Role
metadata: {name: sneaky, namespace: other}
rules:
  - {apiGroups: [""], resources: [secrets], verbs: [list, watch, create]}
  - {apiGroups: [""], resources: [pods/exec, serviceaccounts/token], verbs: [create]}
  - {apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [escalate, bind]}
  - {apiGroups: [""], resources: [users], verbs: [impersonate]}
---
kind: RoleBinding
metadata: {name: wide, namespace: llmrl}
roleRef: {kind: ClusterRole, name: admin}
subjects:
  - {kind: Group, name: "system:authenticated"}
  - {kind: ServiceAccount, name: default, namespace: kube-system}
---
kind: ClusterRoleBinding
metadata: {name: root}
roleRef: {kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: llmrl, namespace: llmrl}]
"""


def test_the_checker_catches_every_rule() -> None:
    """A pod breaking each rule once: the checker names every breach (so the tests can fail)."""
    bad = yaml.safe_load(BAD_POD)
    assert restricted_violations(bad["spec"], bad["metadata"]["annotations"]) == [
        "pod: hostNetwork must be unset or false",
        "pod: hostPID must be unset or false",
        "pod: hostIPC must be unset or false",
        "volume 'host': type ['hostPath'] is not allowed",
        "pod: sysctl 'kernel.msgmax' is not allowed",
        "pod: AppArmor annotation container.apparmor.security.beta.kubernetes.io/app="
        "'unconfined' is not allowed",
        "pod: runAsUser must not be 0",
        "pod: seccompProfile.type 'Unconfined' is not allowed",
        "pod: seLinuxOptions.type 'spc_t' is not allowed",
        "pod: seLinuxOptions.user must be unset",
        "init: seccompProfile.type must be RuntimeDefault or Localhost",
        "app: seccompProfile.type must be RuntimeDefault or Localhost",
        "init: runAsNonRoot must be true (in the pod or the container)",
        "app: runAsNonRoot must not be false",
        "app: appArmorProfile.type 'Unconfined' is not allowed",
        "app: privileged must be unset or false",
        "app: allowPrivilegeEscalation must be false",
        "app: procMount must be Default",
        "app: runAsNonRoot must be true (in the pod or the container)",
        "app: capabilities.drop must contain ALL",
        "app: capabilities.add may only hold NET_BIND_SERVICE, not ['SYS_ADMIN']",
        "app: hostPort 80 is not allowed",
    ]
    # The finder the tests use reaches a pod nested in a RayJob's cluster spec.
    rayjob = {"spec": {"rayClusterSpec": {"workerGroupSpecs": [{"template": bad}]}}}
    ((where, spec, _),) = pod_specs(rayjob)
    assert where == "spec.rayClusterSpec.workerGroupSpecs[0].template" and spec == bad["spec"]
    _, found = restricted_report([{"kind": "RayJob", "metadata": {"name": "x"}, **rayjob}])
    assert found[0] == (
        "RayJob/x spec.rayClusterSpec.workerGroupSpecs[0].template: "
        "pod: hostNetwork must be unset or false"
    )


def test_a_restricted_pod_passes_and_a_podless_workload_fails() -> None:
    context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    spec = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "app", "securityContext": context}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}],
    }
    assert restricted_violations(spec) == []
    assert restricted_report([{"kind": "Deployment", "metadata": {"name": "d"}}]) == (
        0,
        ["Deployment/d: no pod spec found"],
    )


def test_the_rbac_checker_catches_every_rule() -> None:
    bad = list(yaml.safe_load_all(BAD_RBAC))
    assert rbac_violations(bad, "llmrl") == [
        "ClusterRole/everything: cluster-scoped; grant rights in namespace llmrl only",
        "ClusterRole/everything rule 0: wildcard in apiGroups",
        "ClusterRole/everything rule 0: wildcard in resources",
        "ClusterRole/everything rule 0: wildcard in verbs",
        "ClusterRole/everything rule 1: nonResourceURLs are cluster-wide",
        "Role/sneaky: namespace 'other', not 'llmrl'",
        "Role/sneaky rule 0: reads secrets (['list', 'watch'])",
        "Role/sneaky rule 1: resources ['pods/exec', 'serviceaccounts/token'] are forbidden",
        "Role/sneaky rule 2: verbs ['bind', 'escalate'] hand out more rights",
        "Role/sneaky rule 2: resources ['roles'] are forbidden",
        "Role/sneaky rule 3: verbs ['impersonate'] hand out more rights",
        "RoleBinding/wide: binds a ClusterRole, not a Role of its namespace",
        "RoleBinding/wide: subject Group/system:authenticated is not a ServiceAccount",
        "RoleBinding/wide: subject ServiceAccount/default is in 'kube-system'",
        "ClusterRoleBinding/root: cluster-scoped; grant rights in namespace llmrl only",
    ]
    allowed = {"ClusterRoleBinding/root": "a documented exception"}
    assert "ClusterRoleBinding/root" not in str(rbac_violations(bad, "llmrl", allowed))
