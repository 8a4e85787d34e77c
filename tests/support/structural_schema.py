"""Validate objects as the Kubernetes API server does against a CRD's structural
``openAPIV3Schema`` (apiextensions.k8s.io/v1): ``type``, ``required``, ``enum``, ``nullable``
(a ``null`` in a non-nullable field is pruned, as the server does),
``x-kubernetes-int-or-string``, ``x-kubernetes-preserve-unknown-fields`` (anything below),
``x-kubernetes-embedded-resource``, ``additionalProperties``, ``format`` (int32, int64,
date-time), bounds and lengths, ``pattern``, list types ``set``/``map``, and
``anyOf``/``allOf``/``oneOf``/``not``. A field the schema does not name is an *unknown field*:
the server drops it, or refuses the object with ``fieldValidation=Strict``. CEL rules
(``x-kubernetes-validations``) are not evaluated. :mod:`tests.support.crd_schema` applies it to
the KubeRay CRDs.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DROP = object()


@dataclass(frozen=True)
class FieldError:
    """One violation, as the API server words it: ``<path>: <detail>``."""

    path: str
    reason: (
        str  # a Status cause: FieldValueRequired, FieldValueTypeInvalid, ... or FieldValueUnknown
    )
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


@dataclass
class Checked:
    """What the server makes of an object: its stored form, its unknown fields, its errors."""

    value: Any
    unknown: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)

    def strict_errors(self) -> list[FieldError]:
        """Every error, unknown fields first (as ``fieldValidation=Strict`` refuses them)."""
        unknown = [FieldError(path, "FieldValueUnknown", "unknown field") for path in self.unknown]
        return unknown + self.errors


# ------------------------------------------------------------------------ the walker


def check(obj: Any, schema: Mapping[str, Any]) -> Checked:
    """Check ``obj`` (a whole object: its root ``metadata`` is an ObjectMeta) against a
    structural schema; the returned value is ``obj`` pruned as the server stores it."""
    walker = _Walker()
    value = walker.node(copy.deepcopy(obj), schema, "", root=True)
    return Checked(None if value is _DROP else value, sorted(walker.unknown), walker.errors)


def validate(obj: Any, schema: Mapping[str, Any]) -> list[FieldError]:
    """:func:`check`'s errors, unknown fields included."""
    return check(obj, schema).strict_errors()


class _Walker:
    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.errors: list[FieldError] = []

    def error(self, path: str, reason: str, detail: str) -> None:
        self.errors.append(FieldError(path or "<root>", reason, detail))

    def node(self, value: Any, schema: Mapping[str, Any], path: str, root: bool = False) -> Any:
        """Check one value; returns it pruned, or ``_DROP`` (a pruned ``null``)."""
        if value is None:
            if schema.get("nullable"):
                return None
            return _DROP  # the server prunes a null it cannot hold
        if schema.get("x-kubernetes-int-or-string"):
            if not (isinstance(value, str) or _is_int(value)):
                self.type_error(path, value, "integer,string")
                return value
        elif "type" in schema and not _has_type(value, schema["type"]):
            self.type_error(path, value, schema["type"])
            return value
        self.values(value, schema, path)
        if isinstance(value, dict):
            return self.object(value, schema, path, root)
        if isinstance(value, list) and "items" in schema:
            return [
                self.item(item, schema["items"], f"{path}[{i}]") for i, item in enumerate(value)
            ]
        return value

    def item(self, value: Any, schema: Mapping[str, Any], path: str) -> Any:
        """A list item: a ``null`` is an error there, not pruned."""
        if value is None and not schema.get("nullable"):
            self.type_error(path, value, schema.get("type", "object"))
            return value
        return self.node(value, schema, path)

    def object(self, value: dict, schema: Mapping[str, Any], path: str, root: bool) -> dict:
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        embedded = root or schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            where = f"{path}.{key}" if path else key
            if embedded and key == "metadata" and "properties" not in properties.get(key, {}):
                value[key] = self.object_meta(value[key], where)
                continue
            if key in properties:
                sub = properties[key]
            elif embedded and key in ("apiVersion", "kind"):
                sub = {"type": "string"}
            elif isinstance(additional, Mapping):
                sub, where = additional, f"{path}[{key}]"
            elif additional is True or preserve:
                continue  # kept as it is, whatever it holds
            else:
                self.unknown.append(where)
                del value[key]
                continue
            kept = self.node(value[key], sub, where)
            if kept is _DROP:
                del value[key]
            else:
                value[key] = kept
        for name in schema.get("required") or []:
            if name not in value:
                self.error(
                    f"{path}.{name}" if path else name, "FieldValueRequired", "Required value"
                )
        return value

    def object_meta(self, meta: Any, path: str) -> Any:
        """A root (or embedded) ``metadata``: an ObjectMeta, whatever the schema says."""
        if not isinstance(meta, dict):
            self.type_error(path, meta, "object")
            return meta
        for key in list(meta):
            if key not in OBJECT_META_FIELDS:
                self.unknown.append(f"{path}.{key}")
                del meta[key]
        for key in ("labels", "annotations"):
            for name, text in (meta.get(key) or {}).items():
                if not isinstance(text, str):
                    self.type_error(f"{path}.{key}[{name}]", text, "string")
        for index, ref in enumerate(meta.get("ownerReferences") or []):
            for key in ("apiVersion", "kind", "name", "uid"):
                if not (isinstance(ref, dict) and isinstance(ref.get(key), str) and ref[key]):
                    where = f"{path}.ownerReferences[{index}].{key}"
                    self.error(where, "FieldValueRequired", "Required value")
        name = meta.get("name")
        if name is not None and not (isinstance(name, str) and _DNS_SUBDOMAIN.match(name)):
            self.error(
                f"{path}.name",
                "FieldValueInvalid",
                f"Invalid value: {show(name)}: a lowercase RFC 1123 subdomain must consist of "
                "lower case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character",
            )
        return meta

    def type_error(self, path: str, value: Any, expected: str) -> None:
        got = json_type(value)
        detail = f'Invalid value: "{got}": {path} in body must be of type {expected}: "{got}"'
        self.error(path, "FieldValueTypeInvalid", detail)

    def values(self, value: Any, schema: Mapping[str, Any], path: str) -> None:
        """Value validations: enum, format, bounds, lengths, pattern, list types, combinators."""
        for check_one in _VALUE_CHECKS:
            problem = check_one(value, schema, path)
            if problem:
                self.error(path, *problem)
        for keyword in ("allOf", "anyOf", "oneOf"):
            if keyword not in schema:
                continue
            passing = sum(not _quiet(value, sub) for sub in schema[keyword])
            if keyword == "allOf" and passing < len(schema[keyword]):
                self.invalid(path, value, "must validate all the schemas (allOf)")
            elif keyword == "anyOf" and not passing:
                self.invalid(path, value, "must validate at least one schema (anyOf)")
            elif keyword == "oneOf" and passing != 1:
                self.invalid(path, value, "must validate one and only one schema (oneOf)")
        if "not" in schema and not _quiet(value, schema["not"]):
            self.invalid(path, value, "must not validate the schema (not)")

    def invalid(self, path: str, value: Any, what: str) -> None:
        self.error(
            path, "FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body {what}"
        )


def _quiet(value: Any, schema: Mapping[str, Any]) -> list[FieldError]:
    """The errors of a combinator's branch (its unknown fields are not its business)."""
    walker = _Walker()
    walker.node(copy.deepcopy(value), schema, "")
    return walker.errors


# ------------------------------------------------------------------------ value checks


def _enum(value: Any, schema: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    if "enum" not in schema or any(_same(value, option) for option in schema["enum"]):
        return None
    supported = ", ".join(show(option) for option in schema["enum"])
    return (
        "FieldValueNotSupported",
        f"Unsupported value: {show(value)}: supported values: {supported}",
    )


def _format(value: Any, schema: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    form = schema.get("format")
    if form in _INT_RANGES and _is_int(value):
        low, high = _INT_RANGES[form]
        if not low <= value <= high:
            return (
                "FieldValueInvalid",
                f"Invalid value: {value}: {path} in body must be of format {form}",
            )
    if form == "date-time" and isinstance(value, str) and not _DATE_TIME.match(value):
        return (
            "FieldValueInvalid",
            f"Invalid value: {show(value)}: {path} in body must be of type date-time",
        )
    return None


def _bounds(value: Any, schema: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    if not _is_number(value):
        return None
    where = f"Invalid value: {value}: {path} in body should be"
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    if minimum is not None:
        if schema.get("exclusiveMinimum") and value <= minimum:
            return "FieldValueInvalid", f"{where} greater than {minimum}"
        if value < minimum:
            return "FieldValueInvalid", f"{where} greater than or equal to {minimum}"
    if maximum is not None:
        if schema.get("exclusiveMaximum") and value >= maximum:
            return "FieldValueInvalid", f"{where} less than {maximum}"
        if value > maximum:
            return "FieldValueInvalid", f"{where} less than or equal to {maximum}"
    multiple = schema.get("multipleOf")
    # value / multiple is one float64 division (~1e-16 relative): isclose's default
    # rel_tol=1e-9 absorbs it, while a value off the grid is a sizable fraction of a step off
    if multiple and not math.isclose(value / multiple, round(value / multiple)):
        return "FieldValueInvalid", f"{where} a multiple of {multiple}"
    return None


def _sizes(value: Any, schema: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    kinds = {str: "Length", list: "Items", dict: "Properties"}
    noun = next((name for kind, name in kinds.items() if isinstance(value, kind)), None)
    if noun is None:
        return None
    low, high = schema.get(f"min{noun}"), schema.get(f"max{noun}")
    unit = {"Length": "chars long", "Items": "items", "Properties": "properties"}[noun]
    if low is not None and len(value) < low:
        return (
            "FieldValueInvalid",
            f"Invalid value: {show(value)}: {path} in body should have at least {low} {unit}",
        )
    if high is not None and len(value) > high:
        return "FieldValueTooLong", f"Too long: may not be more than {high} {unit}"
    return None


def _pattern(value: Any, schema: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        detail = f"Invalid value: {show(value)}: {path} in body should match '{schema['pattern']}'"
        return "FieldValueInvalid", detail
    return None


def _list_type(value: Any, schema: Mapping[str, Any], path: str) -> tuple[str, str] | None:
    if not isinstance(value, list):
        return None
    kind = schema.get("x-kubernetes-list-type")
    if kind == "set" or schema.get("uniqueItems"):
        keys = [json.dumps(item, sort_keys=True) for item in value]
    elif kind == "map":
        names = schema.get("x-kubernetes-list-map-keys") or []
        keys = [
            json.dumps([item.get(n) for n in names]) for item in value if isinstance(item, dict)
        ]
    else:
        return None
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return "FieldValueDuplicate", f"Duplicate value: {key}"
        seen.add(key)
    return None


_VALUE_CHECKS: tuple[Callable[[Any, Mapping[str, Any], str], tuple[str, str] | None], ...] = (
    _enum,
    _format,
    _bounds,
    _sizes,
    _pattern,
    _list_type,
)


# ------------------------------------------------------------------------ JSON helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _has_type(value: Any, expected: str) -> bool:
    return {
        "object": lambda: isinstance(value, dict),
        "array": lambda: isinstance(value, list),
        "string": lambda: isinstance(value, str),
        "integer": lambda: _is_int(value),
        "number": lambda: _is_number(value),
        "boolean": lambda: isinstance(value, bool),
    }.get(expected, lambda: True)()


def json_type(value: Any) -> str:
    """The JSON type name of ``value`` (``"null"`` for None), as the server reports it."""
    for name in ("boolean", "integer", "number", "string", "array", "object"):
        if _has_type(value, name):
            return name
    return "null"


def _same(a: Any, b: Any) -> bool:
    return json_type(a) == json_type(b) and a == b


def show(value: Any) -> str:
    """``value`` as an error message quotes it (JSON, containers cut at 80 characters)."""
    return json.dumps(value) if not isinstance(value, (dict, list)) else json.dumps(value)[:80]
