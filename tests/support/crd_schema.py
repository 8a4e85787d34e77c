"""Validate objects as the Kubernetes API server does: custom resources against their CRD's
structural ``openAPIV3Schema`` (:mod:`tests.support.structural_schema`), core kinds against
kubernetes-validate's bundled schemas.

The KubeRay CRDs come from ``<repo>/../shared/kuberay-crds/v<version>/ray.io_<plural>.yaml``
(:data:`KUBERAY_CRDS`); tests skip with :func:`missing_crds` when they are not there.

Example::

    errors = validate_custom_object(rayjob, "1.7.0")   # [] when valid
    str(errors[0])  # 'spec.rayClusterSpec.headGroupSpec: Required value'
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import SHARED
from tests.support.structural_schema import (
    Checked,
    FieldError,
    check,
    json_type,
    show,
    validate,
)

__all__ = [
    "KUBERAY_CRDS",
    "KUBERAY_KINDS",
    "CRDNotFoundError",
    "Checked",
    "FieldError",
    "check",
    "check_core_object",
    "check_custom_object",
    "crd_path",
    "crd_schema",
    "missing_crds",
    "validate",
    "validate_core_object",
    "validate_custom_object",
]

KUBERAY_CRDS = SHARED / "kuberay-crds"
KUBERAY_KINDS = {"RayJob": "rayjobs", "RayCluster": "rayclusters"}
"""KubeRay kinds and their CRDs' plurals (``ray.io_<plural>.yaml``)."""

# ------------------------------------------------------------------------ the CRDs


class CRDNotFoundError(FileNotFoundError):
    """A CRD file of :data:`KUBERAY_CRDS` is missing."""


def crd_path(version: str, plural: str) -> Path:
    """``<shared>/kuberay-crds/v<version>/ray.io_<plural>.yaml``."""
    return KUBERAY_CRDS / f"v{version.removeprefix('v')}" / f"ray.io_{plural}.yaml"


def missing_crds(versions: tuple[str, ...], plurals: tuple[str, ...] = ("rayjobs",)) -> str | None:
    """Why the CRDs of ``versions`` cannot be used (a reason for ``pytest.skip``), or None."""
    missing = [crd_path(v, p) for v in versions for p in plurals if not crd_path(v, p).is_file()]
    if not missing:
        return None
    names = ", ".join(str(path) for path in missing)
    return f"../shared/kuberay-crds not found: {names} (the KubeRay CRDs live next to the repo)"


@functools.cache
def crd_schema(version: str, plural: str, served: str = "v1") -> dict[str, Any]:
    """The ``openAPIV3Schema`` of version ``served`` of a KubeRay CRD (parsed once)."""
    path = crd_path(version, plural)
    if not path.is_file():
        raise CRDNotFoundError(missing_crds((version,), (plural,)))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    for entry in crd["spec"]["versions"]:
        if entry["name"] == served:
            return entry["schema"]["openAPIV3Schema"]
    raise KeyError(f"{path}: no version {served!r}")


def check_custom_object(obj: Mapping[str, Any], version: str) -> Checked:
    """A RayJob or RayCluster checked against the CRD of KubeRay ``version``."""
    kind = obj.get("kind")
    if kind not in KUBERAY_KINDS:
        raise ValueError(f"not a KubeRay kind: {kind!r}; expected one of {sorted(KUBERAY_KINDS)}")
    checked = check(obj, crd_schema(version, KUBERAY_KINDS[kind]))
    if obj.get("apiVersion") != "ray.io/v1":
        detail = f'Unsupported value: {show(obj.get("apiVersion"))}: supported values: "ray.io/v1"'
        checked.errors.append(FieldError("apiVersion", "FieldValueNotSupported", detail))
    return checked


def validate_custom_object(obj: Mapping[str, Any], version: str) -> list[FieldError]:
    """Every error of a KubeRay object, unknown fields included (``fieldValidation=Strict``)."""
    return check_custom_object(obj, version).strict_errors()


# ------------------------------------------------------------------------ core kinds


def check_core_object(obj: Mapping[str, Any], kubernetes_version: str = "1.30") -> Checked:
    """A built-in kind (Job, ConfigMap, Pod...) checked against kubernetes-validate's strict
    schema of the newest Kubernetes release not newer than ``kubernetes_version``; the value is
    ``obj`` without its unknown fields."""
    validator = _core_validator(obj["kind"], obj["apiVersion"], kubernetes_version)
    checked = Checked(copy.deepcopy(dict(obj)))
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path))):
        path = _json_path(error.absolute_path)
        if error.validator == "additionalProperties":
            known = set(error.schema.get("properties") or {})
            for name in sorted(set(error.instance) - known):
                checked.unknown.append(f"{path}.{name}" if path else name)
                _remove(checked.value, [*error.absolute_path, name])
        elif error.validator == "required":
            for name in error.validator_value:
                if name not in error.instance:
                    where = f"{path}.{name}" if path else name
                    checked.errors.append(FieldError(where, "FieldValueRequired", "Required value"))
        elif error.validator == "type":
            expected = [t for t in _as_list(error.validator_value) if t != "null"]
            got = json_type(error.instance)
            detail = f'Invalid value: "{got}": {path} in body must be of type {",".join(expected)}'
            checked.errors.append(FieldError(path, "FieldValueTypeInvalid", detail))
        elif error.validator == "enum":
            supported = ", ".join(show(v) for v in error.validator_value if v is not None)
            detail = f"Unsupported value: {show(error.instance)}: supported values: {supported}"
            checked.errors.append(FieldError(path, "FieldValueNotSupported", detail))
        else:
            detail = f"Invalid value: {show(error.instance)}: {error.message}"
            checked.errors.append(FieldError(path, "FieldValueInvalid", detail))
    checked.unknown.sort()
    return checked


def validate_core_object(
    obj: Mapping[str, Any], kubernetes_version: str = "1.30"
) -> list[FieldError]:
    """:func:`check_core_object`'s errors, unknown fields included."""
    return check_core_object(obj, kubernetes_version).strict_errors()


@functools.cache
def _core_validator(kind: str, api_version: str, kubernetes_version: str) -> Any:
    import jsonschema
    import kubernetes_validate.utils as kv
    from referencing import Registry, Resource

    wanted = kv.major_minor(kubernetes_version.removeprefix("v"))
    releases = [v for v in kv.all_versions() if _release(kv.major_minor(v)) <= _release(wanted)]
    folder = f"kubernetes-json-schema/v{releases[-1]}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", wanted)
    except FileNotFoundError:
        raise KeyError(f"no schema for {api_version} {kind} in Kubernetes {wanted}") from None
    definitions = kv.schema_contents(f"{folder}/_definitions.json", wanted)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _json_path(parts: Any) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _remove(obj: Any, parts: list[Any]) -> None:
    for part in parts[:-1]:
        obj = obj[part]
    obj.pop(parts[-1], None)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
