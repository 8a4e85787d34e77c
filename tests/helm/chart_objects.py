"""What the helm/llmrl chart tests read from a render: its objects by kind, their pods, the
merged values, and the Jobs and RayJobs the launcher builds from a release's settings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deploy.chart_values import ChartValues
from flows.launchers.manifests import (
    KUBERAY_TESTED_VERSIONS,
    RAY_STAGES,
    build_job_manifest,
    build_rayjob_manifest,
    job_resources,
)
from tests.support.chart import NAMESPACE, of_kind, stage_inputs  # noqa: F401 (re-exported)
from tests.support.crd_schema import KUBERAY_KINDS, missing_crds, validate_custom_object

K8S_VERSION = "1.30"
"""The Kubernetes version whose bundled schemas validate the chart's objects."""


def render(chart: Any, values: dict[str, Any]) -> dict[str, str]:
    """The chart's files rendered with ``values`` as release ``llmrl`` in the test namespace."""
    return chart.render(values, name="llmrl", namespace=NAMESPACE)


def pod_specs(item: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod spec) of each pod an object creates (the chart's pods are Deployments')."""
    if item["kind"] == "Deployment":
        yield item["metadata"]["name"], item["spec"]["template"]["spec"]


def merged_values(chart: Any, values: dict[str, Any]) -> ChartValues:
    """The chart's defaults merged with ``values``, parsed as :class:`ChartValues`."""
    return ChartValues.model_validate(chart.merge_values(values))


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


def assert_valid_for_kuberay(item: dict[str, Any]) -> None:
    """A RayJob or RayCluster is valid for every tested KubeRay release (strict: no unknown
    fields); skips without ../shared/kuberay-crds."""
    missing = missing_crds(KUBERAY_TESTED_VERSIONS, tuple(KUBERAY_KINDS.values()))
    if missing:
        pytest.skip(missing)
    for version in KUBERAY_TESTED_VERSIONS:
        errors = validate_custom_object(item, version)
        assert errors == [], f"KubeRay {version}: " + "; ".join(map(str, errors))
