"""Every RayJob the launcher builds, validated against the real KubeRay CRDs of each supported
release (:data:`~flows.launchers.manifests.KUBERAY_TESTED_VERSIONS`), as an API server with
``fieldValidation=Strict`` would; and the validator (tests/support/crd_schema.py) itself.

The CRDs are read from ``<repo>/../shared/kuberay-crds``; without them these tests skip.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from flows.launchers import KubernetesSettings
from flows.launchers.kubernetes import load_topology
from flows.launchers.manifests import (
    KUBERAY_TESTED_VERSIONS,
    KUBERAY_VERSION,
    RAY_STAGES,
    build_rayjob_manifest,
)
from llmrl.topology import Topology
from tests.support.crd_schema import (
    FieldError,
    check,
    crd_path,
    missing_crds,
    validate,
    validate_custom_object,
)
from tests.support.topologies import chart_topology

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "llmrl"
MISSING = missing_crds(KUBERAY_TESTED_VERSIONS, ("rayjobs", "rayclusters"))
needs_crds = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

TOPOLOGIES = {
    "values.yaml": lambda: load_topology(str(CHART / "values.yaml")),
    **{
        path.name: (lambda name=path.name: Topology.model_validate(chart_topology(name)))
        for path in sorted((CHART / "examples").glob("*.yaml"))
    },
}
"""The chart's topologies: its default values, and each example merged over them as Helm does."""
RICH_SETTINGS: dict[str, Any] = {
    "namespace": "llmrl",
    "image": "ghcr.io/llmrl/llmrl:0.1.0",
    "service_account": "llmrl-stages",
    "active_deadline_seconds": 86400,
    "env": {"HF_HUB_OFFLINE": "1"},
    "image_pull_secrets": ["registry"],
    "env_from": [{"secretRef": {"name": "s3-credentials"}}],
    "pod_labels": {"team": "ml"},
    "pod_annotations": {"example.com/owner": "ml"},
    "roles": {
        role: {
            "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}}],
            "env_from": [{"configMapRef": {"name": f"{role}-env"}}],
            "labels": {"llmrl.example/role": role},
            "annotations": {"example.com/role": role},
        }
        for role in ("driver", "head", "inference", "trainer", "colocated", "reference")
    },
    "priority_class_name": "training",
    "runtime_class_name": "nvidia",
    "hf_token_secret": {"name": "hf", "key": "token"},
    "kueue_queue": "gpu-queue",
    "owner_pod": {"name": "llmrl-flow-run-abc", "uid": "6d1c3b1e-0000-4000-8000-000000000000"},
}
"""Every pod-level knob set (those the settings model has; it is still growing)."""
VARIANTS = {
    "bare": {},
    "full": {"config": True, "env": {"MLFLOW_PARENT_RUN_ID": "abc123"}, "flow_run": "0f1e2d"},
}


def _settings(variant: str) -> KubernetesSettings:
    if variant == "bare":
        return KubernetesSettings()
    known = KubernetesSettings.model_fields
    return KubernetesSettings.model_validate({k: v for k, v in RICH_SETTINGS.items() if k in known})


def _rayjob(stage: str, topology: Topology, variant: str) -> dict[str, Any]:
    options = VARIANTS[variant]
    name = f"llmrl-{stage}-0a1b2c"
    kwargs: dict[str, Any] = {"env": options.get("env"), "config_map": None}
    if options.get("config"):
        kwargs["config_map"] = name
    if options.get("flow_run"):
        kwargs["flow_run_id"] = options["flow_run"]
    return build_rayjob_manifest(stage, name, _settings(variant), topology, **kwargs)


def test_the_pinned_kuberay_release_is_the_newest_tested_one() -> None:
    assert KUBERAY_TESTED_VERSIONS[-1] == KUBERAY_VERSION
    assert list(KUBERAY_TESTED_VERSIONS) == sorted(
        KUBERAY_TESTED_VERSIONS, key=lambda v: tuple(map(int, v.split(".")))
    )


def test_missing_crds_give_a_skip_reason() -> None:
    reason = missing_crds(("0.0.1",))
    assert reason is not None and reason.startswith("../shared/kuberay-crds not found: ")
    assert str(crd_path("0.0.1", "rayjobs")) in reason


@needs_crds
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("topology_name", TOPOLOGIES)
@pytest.mark.parametrize("stage", RAY_STAGES)
@pytest.mark.parametrize("version", KUBERAY_TESTED_VERSIONS)
def test_every_rayjob_the_launcher_builds_is_valid(version, stage, topology_name, variant) -> None:
    rayjob = _rayjob(stage, TOPOLOGIES[topology_name](), variant)
    errors = validate_custom_object(rayjob, version)
    assert errors == [], "\n".join(map(str, errors))


@needs_crds
def test_the_rich_settings_reach_the_manifest() -> None:
    # The "full" variant above means something: its knobs are in the RayJob it validates.
    rayjob = _rayjob("grpo", Topology.local_default(), "full")
    text = repr(rayjob)
    assert "s3-credentials" in text and "/etc/llmrl/grpo.yaml" in rayjob["spec"]["entrypoint"]
    if "owner_pod" in KubernetesSettings.model_fields:
        (owner,) = rayjob["metadata"]["ownerReferences"]
        assert owner["name"] == "llmrl-flow-run-abc"


BROKEN = [
    pytest.param(
        lambda rj: _container(rj).update(foo=1),
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].foo: unknown field",
        id="unknown-field",
    ),
    pytest.param(
        lambda rj: rj["spec"].update(shutdownAfterJobFinish=True),
        "spec.shutdownAfterJobFinish: unknown field",
        id="misspelt-field",
    ),
    pytest.param(
        lambda rj: rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].update(replicas="2"),
        'spec.rayClusterSpec.workerGroupSpecs[0].replicas: Invalid value: "string": '
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas in body must be of type integer: "
        '"string"',
        id="wrong-type",
    ),
    pytest.param(
        lambda rj: rj["spec"]["rayClusterSpec"].pop("headGroupSpec"),
        "spec.rayClusterSpec.headGroupSpec: Required value",
        id="missing-required",
    ),
    pytest.param(
        lambda rj: _container(rj).pop("name"),
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].name: Required value",
        id="missing-container-name",
    ),
    pytest.param(
        lambda rj: _container(rj)["resources"]["limits"].update(cpu=True),
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].resources.limits[cpu]: "
        'Invalid value: "boolean"',
        id="int-or-string",
    ),
    pytest.param(
        lambda rj: rj["spec"].update(ttlSecondsAfterFinished=2**31),
        "spec.ttlSecondsAfterFinished: Invalid value: 2147483648: spec.ttlSecondsAfterFinished "
        "in body must be of format int32",
        id="int32-overflow",
    ),
    pytest.param(
        lambda rj: rj["metadata"].update(labelz={"a": "b"}),
        "metadata.labelz: unknown field",
        id="unknown-metadata-field",
    ),
    pytest.param(
        lambda rj: rj["metadata"].update(ownerReferences=[{"apiVersion": "v1", "kind": "Pod"}]),
        "metadata.ownerReferences[0].name: Required value",
        id="owner-without-name",
    ),
]


def _container(rayjob: dict[str, Any]) -> dict[str, Any]:
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


@needs_crds
@pytest.mark.parametrize("version", KUBERAY_TESTED_VERSIONS)
@pytest.mark.parametrize(("breakage", "expected"), BROKEN)
def test_a_broken_rayjob_fails_naming_the_field(version, breakage, expected) -> None:
    rayjob = _rayjob("grpo", Topology.local_default(), "full")
    breakage(rayjob)
    errors = [str(error) for error in validate_custom_object(rayjob, version)]
    assert errors[0].startswith(expected), errors
    assert len(errors) == 1 or "ownerReferences" in expected, errors


@needs_crds
def test_fields_of_newer_releases_are_unknown_to_older_ones() -> None:
    rayjob = _rayjob("sft", Topology.local_default(), "bare")
    rayjob["spec"]["deletionStrategy"] = {"onSuccess": {"policy": "DeleteCluster"}}
    assert [str(e) for e in validate_custom_object(rayjob, "1.4.2")] == [
        "spec.deletionStrategy: unknown field"
    ]
    rayjob["spec"]["deletionStrategy"]["onSuccess"]["policy"] = "Keep"
    assert [str(e) for e in validate_custom_object(rayjob, "1.7.0")] == [
        'spec.deletionStrategy.onSuccess.policy: Unsupported value: "Keep": supported values: '
        '"DeleteCluster", "DeleteWorkers", "DeleteSelf", "DeleteNone"'
    ]


# ------------------------------------------------------------------------ the walker's semantics

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"x-kubernetes-int-or-string": True},
                "count": {"type": "integer", "format": "int32", "minimum": 0},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "note": {"type": "string", "nullable": True},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "ratio": {"type": "number"},
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["port"],
                    "items": {"type": "object", "properties": {"port": {"type": "integer"}}},
                },
                "template": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "properties": {"spec": {"type": "object"}},
                },
                "either": {
                    "type": "string",
                    "anyOf": [{"pattern": "^x"}, {"maxLength": 2}],
                },
            },
        },
    },
}


def _errors(spec: dict[str, Any]) -> list[str]:
    return [
        str(e) for e in validate({"kind": "T", "metadata": {"name": "t"}, "spec": spec}, SCHEMA)
    ]


def _type(field: str, got: str, want: str) -> str:
    where = f"spec.{field}"
    return f'{where}: Invalid value: "{got}": {where} in body must be of type {want}: "{got}"'


TEMPLATE = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
ANY_OF = 'spec.either: Invalid value: "abc": spec.either in body must validate at least one schema'


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"size": 3}, []),
        ({"size": "3Gi"}, []),
        ({"size": 1.5}, [_type("size", "number", "integer,string")]),
        ({"size": 1, "free": {"any": {"thing": [1, "x"]}}}, []),
        ({"size": 1, "labels": {"a": "b"}}, []),
        ({"size": 1, "labels": {"a": 1}}, [_type("labels[a]", "integer", "string")]),
        ({"size": 1, "note": None}, []),
        ({"size": 1, "count": None}, []),  # a null in a non-nullable field is pruned
        ({"size": 1, "count": True}, [_type("count", "boolean", "integer")]),
        (
            {"size": 1, "count": -1},
            [
                "spec.count: Invalid value: -1: spec.count in body should be greater than or "
                "equal to 0"
            ],
        ),
        ({"size": 1, "ratio": 2}, []),
        (
            {"size": 1, "mode": "c"},
            ['spec.mode: Unsupported value: "c": supported values: "a", "b"'],
        ),
        ({"size": 1, "ports": [{"port": 1}, {"port": 1}]}, ["spec.ports: Duplicate value: [1]"]),
        ({"size": 1, "template": TEMPLATE}, []),
        ({"size": 1, "either": "xyz"}, []),
        ({"size": 1, "either": "abc"}, [f"{ANY_OF} (anyOf)"]),
        ({}, ["spec.size: Required value"]),
        ({"size": None}, ["spec.size: Required value"]),
        ({"size": 1, "extra": {"deep": 1}}, ["spec.extra: unknown field"]),
    ],
)
def test_structural_schema_semantics(spec, expected) -> None:
    assert _errors(spec) == expected


def test_unknown_fields_are_pruned_from_what_is_stored() -> None:
    obj = {"kind": "T", "metadata": {"name": "t", "x": 1}, "spec": {"size": 1, "y": {"z": 1}}}
    checked = check(obj, SCHEMA)
    assert checked.unknown == ["metadata.x", "spec.y"]
    assert checked.errors == []
    assert checked.value == {"kind": "T", "metadata": {"name": "t"}, "spec": {"size": 1}}
    assert obj["spec"]["y"] == {"z": 1}  # the input is left alone
    strict = checked.strict_errors()
    assert strict[0] == FieldError("metadata.x", "FieldValueUnknown", "unknown field")


def test_an_invalid_name_is_refused() -> None:
    obj = copy.deepcopy({"kind": "T", "metadata": {"name": "Not_A_Name"}, "spec": {"size": 1}})
    (error,) = validate(obj, SCHEMA)
    assert error.path == "metadata.name" and "RFC 1123" in error.detail
