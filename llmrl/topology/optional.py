"""Expressions about an optional section of the topology: a model role (``teacher``, ``judge``,
``reward_model``) is null unless set, and the chart's values hold no defaults inside it.

Two nodes of the rules' language (:mod:`llmrl.topology.expressions`), each with its three
readings:

- :class:`Present`: the section is set. A rule about the section starts with it, so in Python
  and in Go (whose ``and`` stops at the first false part) nothing inside a null section is read.
- :class:`FilledField`: a field of the section with a default: a key left out of the chart's
  values takes it in Go, as pydantic gives it in Python and the JSON schema assumes.

Example:

>>> from llmrl.topology import Topology
>>> Present("judge").evaluate(Topology())
False
>>> Present("judge").go("$t")
'(not (kindIs "invalid" $t.judge))'
>>> FilledField("judge.engines", default=1).go("$t")
'(int (ternary 1 $t.judge.engines (kindIs "invalid" $t.judge.engines)))'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmrl.topology.expressions import Expr, Field, NotInSchema


@dataclass(frozen=True)
class Present(Expr):
    """The optional ``section`` is set (neither null nor left out)."""

    section: str

    def evaluate(self, root: Any) -> bool:
        """Whether the section is not None."""
        return getattr(root, self.section) is not None

    def go(self, root: str) -> str:
        """The section is neither nil nor missing."""
        return f'(not (kindIs "invalid" {root}.{self.section}))'

    def schema(self, defaults: Any, prefix: str = "") -> dict[str, Any]:
        """In the section's own schema (``prefix`` is the section's), which only an object that
        is set meets, always true; in the topology's, the section is an object."""
        if prefix == f"{self.section}.":
            return {"type": "object"}
        if prefix:
            raise NotInSchema(f"{self.section} is not a part of the {prefix[:-1]} section")
        return {"properties": {self.section: {"type": "object"}}, "required": [self.section]}


@dataclass(frozen=True)
class FilledField(Field):
    """A field of an optional section that Go reads as ``default`` when its key is left out
    (its Python and JSON-schema readings are :class:`Field`'s: the model fills it in)."""

    default: int | str = 0

    def raw(self, root: str) -> str:
        """The value, or the default when the key is nil or missing."""
        value = f"{root}.{self.path}"
        return f'(ternary {json.dumps(self.default)} {value} (kindIs "invalid" {value}))'
