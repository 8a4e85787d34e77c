"""Write the chart's files generated from llmrl.topology, or check they are current.

The files are ``helm/llmrl/values.schema.json`` (the values schema, with the topology rules
JSON Schema can state) and ``helm/llmrl/templates/_topology_guard.tpl`` (every topology rule as a
Go template ``fail``); :mod:`deploy.chart_files` renders both.

Usage::

    python scripts/chart_schema.py            # (re)write both files (make chart-schema)
    python scripts/chart_schema.py --check    # exit 1 when a committed file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if str(ROOT) not in sys.path:  # run as a plain script from a checkout
    sys.path.insert(0, str(ROOT))

from deploy.chart_files import (  # noqa: E402
    GUARD_FILE,
    SCHEMA_FILE,
    generated_files,
    render_guard,
    render_schema,
)

__all__ = ["main", "render_guard", "render_schema"]

SCHEMA_PATH = ROOT / SCHEMA_FILE
GUARD_PATH = ROOT / GUARD_FILE


def main(argv: list[str] | None = None) -> int:
    """Write the files, or with ``--check`` compare them with the committed ones."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a generated file is not up to date"
    )
    parser.add_argument("--output", type=Path, default=SCHEMA_PATH, help="schema file to write")
    parser.add_argument("--guard", type=Path, default=GUARD_PATH, help="guard template to write")
    args = parser.parse_args(argv)
    fresh = generated_files()
    targets = {args.output: fresh[SCHEMA_FILE], args.guard: fresh[GUARD_FILE]}
    if args.check:
        return _check(targets)
    for path, text in targets.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _check(targets: dict[Path, str]) -> int:
    stale = 0
    for path, text in targets.items():
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            print(f"{path} is up to date")
            continue
        stale += 1
        state = "is missing" if current is None else "is out of date"
        print(f"{path} {state}: regenerate it with make chart-schema", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
