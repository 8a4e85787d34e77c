"""A small expression language for the topology's rules: one expression, three readings.

Every node reads the same condition three ways: :meth:`Expr.evaluate` against a
:class:`~llmrl.topology.spec.Topology` (or one of its sections), :meth:`Expr.go` as a Go template
expression over the Helm chart's values, and :meth:`Expr.schema` as the exact JSON schema of the
values it holds for (where JSON Schema can say it; :class:`NotInSchema` otherwise). The rules in
:mod:`llmrl.topology.rules` are written once in it, so the Python validator, the chart's guard
template and its ``values.schema.json`` cannot drift apart.

Semantics shared by all three readings: a field left out takes its default; an ordering
comparison (``<``, ``<=``, ...) with a null field is false; ``==`` with a null field is false
and ``!=`` true.

Example:

>>> from llmrl.topology import Topology
>>> transformers = Compare("==", Field("inference.backend", "str"), Const("transformers"))
>>> transformers.evaluate(Topology())
False
>>> transformers.go("$t")
'(eq $t.inference.backend "transformers")'
>>> transformers.schema(Topology())
{'properties': {'inference': {'properties': {'backend': {'const': 'transformers'}},
  'required': ['backend']}}, 'required': ['inference']}
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["int", "float", "str", "bool"]
"""The type of an expression's value (what Go casts it to, what JSON schema types it as)."""

_GO_CAST: dict[str, str] = {"int": "int", "float": "float64"}
_JSON_TYPE: dict[str, str] = {
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "boolean",
}
_COMPARE: dict[str, tuple[Callable[[Any, Any], bool], str, str | None]] = {
    # operator: (Python function, Go template function, JSON schema keyword)
    "==": (operator.eq, "eq", "const"),
    "!=": (operator.ne, "ne", None),
    "<": (operator.lt, "lt", "exclusiveMaximum"),
    "<=": (operator.le, "le", "maximum"),
    ">": (operator.gt, "gt", "exclusiveMinimum"),
    ">=": (operator.ge, "ge", "minimum"),
}


class NotInSchema(Exception):
    """JSON Schema cannot state this expression (it compares fields or derives a value)."""


class Expr(ABC):
    """A node of a rule's expression; see the module docstring for its three readings."""

    kind: Kind = "bool"

    @abstractmethod
    def evaluate(self, root: Any) -> Any:
        """The value of the expression for ``root`` (a Topology, or the section it is about)."""

    @abstractmethod
    def go(self, root: str) -> str:
        """A Go template expression of the value; ``root`` is the values' path, e.g. ``$t``."""

    def schema(self, defaults: Any, prefix: str = "") -> dict[str, Any]:
        """The JSON schema of exactly the values this condition holds for.

        ``defaults`` is the default object (what a left-out key means); ``prefix`` (e.g.
        ``"inference."``) is left out of the schema's paths, for a section's own schema.
        """
        raise NotInSchema(f"{type(self).__name__} has no JSON schema")

    def fields(self) -> Iterator[Field]:
        """The fields the expression reads (those of its operands)."""
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            for operand in value if isinstance(value, tuple) else (value,):
                if isinstance(operand, Expr):
                    yield from operand.fields()


def _go_call(function: str, *args: str) -> str:
    return f"({function} {' '.join(args)})" if len(args) > 1 or function == "not" else args[0]


def _kind_of(operand: str) -> Any:
    """A ``kind`` property that is the kind of the node's ``operand``."""
    return property(lambda node: getattr(node, operand).kind, doc=f"The kind of ``{operand}``.")


def _go_literal(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


@dataclass(frozen=True)
class Const(Expr):
    """A constant: an int, float, str or bool."""

    value: int | float | str | bool

    @property
    def kind(self) -> Kind:  # type: ignore[override]
        """The constant's type."""
        names: dict[type, Kind] = {bool: "bool", int: "int", float: "float", str: "str"}
        return names[type(self.value)]

    def evaluate(self, root: Any) -> Any:
        """The constant."""
        return self.value

    def go(self, root: str) -> str:
        """The constant as a Go literal."""
        return _go_literal(self.value)


@dataclass(frozen=True)
class Field(Expr):
    """A field of the topology by its dotted path, e.g. ``trainer.ranks`` (``nullable``: may be
    null, which means "derive it")."""

    path: str
    kind: Kind = "int"  # type: ignore[misc]
    nullable: bool = False

    def evaluate(self, root: Any) -> Any:
        """The field's value."""
        return functools.reduce(getattr, self.path.split("."), root)

    def raw(self, root: str) -> str:
        """The value as Helm holds it (numbers may be float64; a left-out key is nil)."""
        return f"{root}.{self.path}"

    def go(self, root: str) -> str:
        """The value cast to its kind (YAML numbers reach templates as float64)."""
        cast = _GO_CAST.get(self.kind)
        return f"({cast} {self.raw(root)})" if cast else self.raw(root)

    def is_null_go(self, root: str) -> str:
        """A Go condition: the field is null or left out."""
        return f'(kindIs "invalid" {self.raw(root)})'

    def fields(self) -> Iterator[Field]:
        """The field itself."""
        yield self

    def at_path(self, value: dict[str, Any], holds: bool, prefix: str) -> dict[str, Any]:
        """``value`` (a schema of this field's value) nested at the field's path; the keys on
        the way are required unless the condition ``holds`` for the default."""
        parts = self.path.removeprefix(prefix).split(".")
        node = value
        for name in reversed(parts):
            node = {"properties": {name: node}} | ({} if holds else {"required": [name]})
        return node


@dataclass(frozen=True)
class Compare(Expr):
    """``left <op> right`` with ``op`` one of ``== != < <= > >=``."""

    op: str
    left: Expr
    right: Expr

    def evaluate(self, root: Any) -> bool:
        """The comparison (an ordering with a null side is false)."""
        left, right = self.left.evaluate(root), self.right.evaluate(root)
        if (left is None or right is None) and self.op not in ("==", "!="):
            return False
        return _COMPARE[self.op][0](left, right)

    def go(self, root: str) -> str:
        """The comparison as a Go call, guarded against a null field."""
        compared = _go_call(_COMPARE[self.op][1], self.left.go(root), self.right.go(root))
        sides = (self.left, self.right)
        nulls = [s.is_null_go(root) for s in sides if isinstance(s, Field) and s.nullable]
        if not nulls:
            return compared
        if self.op == "!=":
            return _go_call("or", *nulls, compared)
        return _go_call("and", *[_go_call("not", null) for null in nulls], compared)

    def schema(self, defaults: Any, prefix: str = "") -> dict[str, Any]:
        """A field against a constant; comparing two fields has no schema."""
        if not isinstance(self.left, Field) or not isinstance(self.right, Const):
            raise NotInSchema("JSON Schema compares a field with constants only")
        keyword, constant = _COMPARE[self.op][2], self.right.value
        value = {keyword: constant} if keyword else {"not": {"const": constant}}
        if self.left.nullable and self.op != "!=":  # null satisfies no ordering here
            value["type"] = _JSON_TYPE[self.left.kind]
        return self.left.at_path(value, bool(self.evaluate(defaults)), prefix)


@dataclass(frozen=True)
class _OnField(Expr):
    """A test of one field's value (against constants)."""

    field: Field

    @abstractmethod
    def value_schema(self) -> dict[str, Any]:
        """The schema of the values the test holds for."""

    def schema(self, defaults: Any, prefix: str = "") -> dict[str, Any]:
        """:meth:`value_schema` at the field's path."""
        return self.field.at_path(self.value_schema(), bool(self.evaluate(defaults)), prefix)


@dataclass(frozen=True)
class In(_OnField):
    """The field's value is one of ``values`` (``None`` among them: null is allowed too)."""

    values: tuple[Any, ...]

    def evaluate(self, root: Any) -> bool:
        """Membership."""
        return self.field.evaluate(root) in self.values

    def go(self, root: str) -> str:
        """One Go test per value, joined with ``or``."""
        tests = [
            self.field.is_null_go(root)
            if value is None
            else Compare("==", self.field, Const(value)).go(root)
            for value in self.values
        ]
        return _go_call("or", *tests)

    def value_schema(self) -> dict[str, Any]:
        """An ``enum``."""
        return {"enum": list(self.values)}


@dataclass(frozen=True)
class IsNull(_OnField):
    """The field is null (or left out, when its default is null)."""

    def evaluate(self, root: Any) -> bool:
        """Whether the value is None."""
        return self.field.evaluate(root) is None

    def go(self, root: str) -> str:
        """``kindIs "invalid"``: nil or a missing key."""
        return self.field.is_null_go(root)

    def value_schema(self) -> dict[str, Any]:
        """``type: null``."""
        return {"type": "null"}


@dataclass(frozen=True)
class Not(Expr):
    """Negation."""

    part: Expr

    def evaluate(self, root: Any) -> bool:
        """``not part``."""
        return not self.part.evaluate(root)

    def go(self, root: str) -> str:
        """``(not part)``."""
        return _go_call("not", self.part.go(root))

    def schema(self, defaults: Any, prefix: str = "") -> dict[str, Any]:
        """``not``."""
        return {"not": self.part.schema(defaults, prefix)}


@dataclass(frozen=True)
class _Junction(Expr):
    parts: tuple[Expr, ...]

    def go(self, root: str) -> str:
        return _go_call(self._go_function, *(part.go(root) for part in self.parts))

    def schema(self, defaults: Any, prefix: str = "") -> dict[str, Any]:
        parts = [part.schema(defaults, prefix) for part in self.parts]
        return parts[0] if len(parts) == 1 else {self._schema_keyword: parts}

    _go_function = ""
    _schema_keyword = ""


class And(_Junction):
    """Every part holds (``allOf``); Go's ``and`` stops at the first false part."""

    _go_function, _schema_keyword = "and", "allOf"

    def evaluate(self, root: Any) -> bool:
        """``all`` of the parts."""
        return all(part.evaluate(root) for part in self.parts)


class Or(_Junction):
    """Some part holds (``anyOf``)."""

    _go_function, _schema_keyword = "or", "anyOf"

    def evaluate(self, root: Any) -> bool:
        """``any`` of the parts."""
        return any(part.evaluate(root) for part in self.parts)


def all_of(*parts: Expr) -> And:
    """``And`` of the parts (the parts of an ``And`` among them spliced in)."""
    return And(tuple(inner for part in parts for inner in _parts_of(part, And)))


def _parts_of(part: Expr, junction: type[_Junction]) -> tuple[Expr, ...]:
    return part.parts if isinstance(part, junction) else (part,)


def any_of(*parts: Expr) -> Or:
    """``Or`` of the parts (the parts of an ``Or`` among them spliced in)."""
    return Or(tuple(inner for part in parts for inner in _parts_of(part, Or)))


@dataclass(frozen=True)
class Coalesce(Expr):
    """The nullable field's value, or ``fallback`` when it is null."""

    field: Field
    fallback: Expr

    kind = _kind_of("fallback")  # type: ignore[assignment]

    def evaluate(self, root: Any) -> Any:
        """The field, else the fallback."""
        value = self.field.evaluate(root)
        return self.fallback.evaluate(root) if value is None else value

    def go(self, root: str) -> str:
        """``ternary`` on the field's nullness."""
        return _go_call(
            "ternary",
            self.field.go(root),
            self.fallback.go(root),
            _go_call("not", self.field.is_null_go(root)),
        )


@dataclass(frozen=True)
class Choose(Expr):
    """``then`` when ``condition`` holds, else ``otherwise``."""

    condition: Expr
    then: Expr
    otherwise: Expr

    kind = _kind_of("then")  # type: ignore[assignment]

    def evaluate(self, root: Any) -> Any:
        """The chosen branch's value."""
        branch = self.then if self.condition.evaluate(root) else self.otherwise
        return branch.evaluate(root)

    def go(self, root: str) -> str:
        """``ternary``."""
        parts = (self.then.go(root), self.otherwise.go(root), self.condition.go(root))
        return _go_call("ternary", *parts)


@dataclass(frozen=True)
class Mul(Expr):
    """The product of two integers."""

    left: Expr
    right: Expr
    kind: Kind = "int"  # type: ignore[misc]

    def evaluate(self, root: Any) -> int:
        """``left * right``."""
        return self.left.evaluate(root) * self.right.evaluate(root)

    def go(self, root: str) -> str:
        """Sprig's ``mul``."""
        return _go_call("mul", self.left.go(root), self.right.go(root))


@dataclass(frozen=True)
class Derived(Expr):
    """A value derived from one section's fields, e.g. the trainer's world size.

    ``expr`` reads ``section``'s fields (paths relative to it). The section's Python property
    (``name``) returns ``expr``'s value, and the chart defines it once as the named template
    ``llmrl.<helper>``, which every other template includes.
    """

    section: str
    name: str
    helper: str
    doc: str
    expr: Expr

    kind = _kind_of("expr")  # type: ignore[assignment]

    def evaluate(self, root: Any) -> Any:
        """The value, from ``root``'s section."""
        return self.expr.evaluate(getattr(root, self.section))

    def fields(self) -> Iterator[Field]:
        """None: a derived value has no place in a JSON schema."""
        return iter(())

    def go(self, root: str) -> str:
        """The chart's helper (included with the chart's context ``$``), cast to an int."""
        return f'(int (include "llmrl.{self.helper}" $))'
