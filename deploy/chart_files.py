"""The Helm chart's files generated from the Python models: its values schema and its guard.

- ``helm/llmrl/values.schema.json``: :class:`~deploy.chart_values.ChartValues`' JSON
  schema (its ``topology`` section is :class:`~llmrl.topology.spec.Topology`'s, with the
  ``if``/``then`` clauses of :mod:`llmrl.topology.rules`), as the draft-07 Helm validates
  values with: every ``$ref`` into ``$defs`` inlined (its sibling keywords merged in, which
  draft-07 would otherwise ignore) and ``$defs`` dropped.
- ``helm/llmrl/templates/_topology_guard.tpl``: every rule of :data:`llmrl.topology.rules.RULES`
  as a Go template ``fail`` with the Python message, so ``helm install``/``template`` refuses
  what :class:`Topology` refuses, also what the schema cannot state and with
  ``--skip-schema-validation``; and the derived values (``llmrl.engineGpus``, ...) the other
  templates include.

``make chart-schema`` (``scripts/chart_schema.py``) writes both; a test fails when the committed
files differ from :func:`generated_files`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from deploy.chart_values import ChartValues
from llmrl.topology.derived import DERIVED
from llmrl.topology.expressions import Not, all_of
from llmrl.topology.rules import RULES, FirstOf, Rule

SCHEMA_FILE = Path("helm/llmrl/values.schema.json")
GUARD_FILE = Path("helm/llmrl/templates/_topology_guard.tpl")
"""Paths of the generated files, relative to the repository root."""
COMMAND = "make chart-schema (scripts/chart_schema.py)"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"
_ROOT = "$t"  # the guard's variable for .Values.topology
_PRINTF = {"int": "%d", "str": "%s"}


def build_schema() -> dict[str, Any]:
    """The chart's values schema: ChartValues' JSON schema, refs inlined, as draft-07."""
    schema = ChartValues.model_json_schema()
    definitions = schema.pop("$defs", {})
    inlined = _inline(schema, definitions, ())
    comment = f"Generated from deploy.chart_values by {COMMAND}; do not edit."
    return {"$schema": DRAFT_07, "$comment": comment, **inlined}


def render_schema() -> str:
    """The schema file's exact text (2-space indented JSON and a final newline)."""
    return json.dumps(build_schema(), indent=2, ensure_ascii=False) + "\n"


def _inline(node: Any, definitions: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, definitions, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        name = ref.removeprefix("#/$defs/")
        if name == ref or name not in definitions:
            raise ValueError(f"cannot inline $ref {ref!r}: only #/$defs/<name> is supported")
        if name in seen:
            raise ValueError(f"cannot inline recursive model {name!r} into a Helm schema")
        target = _inline(copy.deepcopy(definitions[name]), definitions, (*seen, name))
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return {**target, **_inline(siblings, definitions, seen)}
    return {key: _inline(value, definitions, seen) for key, value in node.items()}


def _fail(rule: Rule) -> str:
    """The Go ``fail`` call of a broken rule: ``topology.<field>: <message>``."""
    if not rule.args:
        return f"fail {json.dumps(f'topology.{rule.field}: {rule.message}')}"
    pieces, args = [f"topology.{rule.field}: "], []
    for literal, name in rule.placeholders():
        pieces.append(literal.replace("%", "%%"))
        if name is not None:
            arg = rule.args[name]
            pieces.append(_PRINTF[arg.kind])
            args.append(arg.go(_ROOT))
    return f"fail (printf {json.dumps(''.join(pieces))} {' '.join(args)})"


def _rule_lines(rule: Rule) -> list[str]:
    broken = all_of(rule.when, Not(rule.require)).go(_ROOT)
    return [f"{{{{- if {broken} }}}}", f"{{{{- {_fail(rule)} }}}}", "{{- end }}"]


def render_guard() -> str:
    """The guard template's exact text."""
    lines = [
        "{{/*",
        f"Generated from llmrl/topology/rules.py by {COMMAND}; do not edit.",
        "The topology's cross-field rules (llmrl.topology.rules.RULES): a topology the values",
        "schema cannot judge (or one installed with --skip-schema-validation) fails with the",
        "message llmrl.topology.Topology gives, prefixed with 'topology.'.",
        "*/}}",
    ]
    for derived in DERIVED:
        root = f".Values.topology.{derived.section}"
        lines += [
            "",
            f"{{{{/* {derived.doc} ({derived.section}.{derived.name}). */}}}}",
            f'{{{{- define "llmrl.{derived.helper}" -}}}}',
            f"{{{{- {derived.expr.go(root)} }}}}",
            "{{- end }}",
        ]
    lines += [
        "",
        '{{- define "llmrl.validateTopology" -}}',
        f"{{{{- {_ROOT} := .Values.topology }}}}",
    ]
    for entry in RULES:
        for rule in entry.rules if isinstance(entry, FirstOf) else (entry,):
            lines += _rule_lines(rule)
    lines.append("{{- end }}")
    return "\n".join(lines) + "\n"


def generated_files() -> dict[Path, str]:
    """Each generated file's path (relative to the repository root) and its exact text."""
    return {SCHEMA_FILE: render_schema(), GUARD_FILE: render_guard()}
