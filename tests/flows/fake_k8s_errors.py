"""The fake Kubernetes API's answers other than success (:class:`ApiError` and the Status
bodies a real server sends: 403, 404, 409, 422) and its patch formats (JSON merge, strategic
merge, JSON patch), for :mod:`tests.flows.fake_k8s_api`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from tests.flows.rbac import Attributes, group_resource
from tests.support import crd_schema

MERGE_KEYS = {
    "ownerReferences": "uid",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
"""Strategic-merge-patch keys of the lists that merge (others are replaced)."""


class ApiError(Exception):
    """An answer other than success: its HTTP code and Status body."""

    def __init__(self, code: int, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            **({"details": details} if details else {}),
            "code": code,
        }


# ------------------------------------------------------------------------ Status errors


def forbidden(status: dict[str, Any]) -> ApiError:
    error = ApiError(403, "Forbidden", status["message"])
    error.status = status
    return error


def not_found(attributes: Attributes) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{group_resource(attributes)} "{attributes.name}" not found',
        name=attributes.name,
        group=attributes.group,
        kind=attributes.resource,
    )


def exists(attributes: Attributes, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{group_resource(attributes)} "{name}" already exists',
        name=name,
        group=attributes.group,
        kind=attributes.resource,
    )


def invalid(
    attributes: Attributes, kind: str, name: str, errors: Sequence[crd_schema.FieldError]
) -> ApiError:
    """422: ``RayJob.ray.io "x" is invalid: <path>: <detail>`` (several: ``[a, b]``)."""
    qualified = f"{kind}.{attributes.group}" if attributes.group else kind
    listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    causes = [{"reason": e.reason, "message": e.detail, "field": e.path} for e in errors]
    return ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {listed}',
        name=name,
        group=attributes.group,
        kind=kind,
        causes=causes,
    )


# ------------------------------------------------------------------------ patches


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch; ``strategic``: lists of :data:`MERGE_KEYS` merge by key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in MERGE_KEYS and isinstance(value, list):
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        else:
            result[key] = merge_patch(result.get(key), value, strategic)
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        index = next((i for i, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if index is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = merge_patch(merged[index], item, strategic=True)
    return merged


def json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch: add, replace, remove, test."""
    doc = copy.deepcopy(target)
    for operation in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last: Any = parts[-1]
        if isinstance(parent, list):
            last = len(parent) if last == "-" else int(last)
        op = operation["op"]
        if op == "remove":
            del parent[last]
        elif op == "add" and isinstance(parent, list):
            parent.insert(last, operation["value"])
        elif op in ("add", "replace"):
            parent[last] = operation["value"]
        elif op == "test" and parent[last] != operation["value"]:
            raise ApiError(422, "Invalid", f"test operation failed at {operation['path']}")
    return doc
