"""The helm/llmrl chart, rendered and linted offline by the real Helm engine (helm-python-sdk).

Every rendered object is validated: Kubernetes kinds against the bundled Kubernetes 1.30 schemas
(kubernetes-validate, strict: unknown fields fail), KubeRay kinds against the real KubeRay CRDs
of every tested release (tests/support/crd_schema.py, unknown fields fail). The chart renders no
Ray cluster: the RayJobs the launcher builds from each release's settings are validated so.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from flows.launchers.manifests import RAY_STAGES
from tests.helm.chart_objects import K8S_VERSION, assert_valid_for_kuberay, stage_manifests
from tests.support.chart import CHART, NAMESPACE, VALUE_SETS
from tests.support.crd_schema import KUBERAY_KINDS

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart


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
