"""Write ``helm/llmrl/values.schema.json`` from the pydantic models, or check it is current.

The schema is :class:`llmrl.topology.chart_values.ChartValues`' JSON schema (its ``topology``
section is :class:`llmrl.topology.spec.Topology`'s), converted to what Helm validates values
with: draft-07, every ``$ref`` into ``$defs`` inlined (with its sibling keywords merged in,
which draft-07 would otherwise ignore) and ``$defs`` dropped.

Usage::

    python scripts/chart_schema.py            # (re)write the schema
    python scripts/chart_schema.py --check    # exit 1 when the committed schema is stale
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = ROOT / "helm" / "llmrl" / "values.schema.json"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"

if str(ROOT) not in sys.path:  # run as a plain script from a checkout
    sys.path.insert(0, str(ROOT))


def build_schema() -> dict[str, Any]:
    """The chart's values schema: ChartValues' JSON schema, refs inlined, as draft-07."""
    from llmrl.topology.chart_values import ChartValues

    schema = ChartValues.model_json_schema()
    definitions = schema.pop("$defs", {})
    inlined = _inline(schema, definitions, ())
    return {"$schema": DRAFT_07, **inlined}


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


def main(argv: list[str] | None = None) -> int:
    """Write the schema, or with ``--check`` compare it with the committed file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the schema file is not up to date"
    )
    parser.add_argument("--output", type=Path, default=SCHEMA_PATH, help="schema file to write")
    args = parser.parse_args(argv)
    fresh = render_schema()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if current != fresh:
            state = "is missing" if current is None else "is out of date"
            print(
                f"{args.output} {state}: regenerate it with python scripts/chart_schema.py",
                file=sys.stderr,
            )
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(fresh, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
