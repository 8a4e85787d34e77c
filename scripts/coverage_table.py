"""Line coverage of `llmrl/` and `flows/` per package: the fast tier against the whole suite.

`make coverage` runs both tiers under coverage.py (`scripts/test_tiers.sh` with COVERAGE=1),
one combined data file per tier, then this script. The whole suite's covered lines are the union
of the two tiers' (``make test-all`` runs the fast tier, then the slow tests). Printed as the
Markdown table of docs/measurements.md; fails when the fast tier keeps less than ``--minimum``
of the whole suite's covered lines, or when a package has no line covered by the fast tier.

    python scripts/coverage_table.py --fast .coverage-data/fast --slow .coverage-data/slow
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("llmrl", "flows")


def package_of(path: Path) -> str:
    """``llmrl/policies/x.py`` -> ``llmrl.policies``; a top-level module -> its package."""
    parts = path.relative_to(ROOT).parts
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def covered_lines(data_file: Path) -> dict[str, set[int]]:
    """Executed lines per absolute source path in one (combined) coverage data file."""
    if not data_file.is_file():
        raise FileNotFoundError(f"no coverage data at {data_file}: run `make coverage` first")
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    return {str(Path(f).resolve()): set(data.lines(f) or ()) for f in data.measured_files()}


def table(fast: dict[str, set[int]], slow: dict[str, set[int]]) -> dict[str, list[int]]:
    """Per package: statements, lines the whole suite covers, lines the fast tier covers."""
    analyser = coverage.Coverage(data_file=None)
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            statements = set(analyser.analysis2(str(path))[1])
            key = str(path.resolve())
            in_fast = fast.get(key, set()) & statements
            in_all = (slow.get(key, set()) & statements) | in_fast
            row = rows[package_of(path)]
            row[0] += len(statements)
            row[1] += len(in_all)
            row[2] += len(in_fast)
    return dict(sorted(rows.items()))


def percent(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``, one decimal; ``-`` for an empty whole."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", type=Path, required=True, help="the fast tier's data file")
    parser.add_argument("--slow", type=Path, required=True, help="the slow tests' data file")
    parser.add_argument("--minimum", type=float, default=0.85, help="fast / whole, at least")
    args = parser.parse_args()
    rows = table(covered_lines(args.fast), covered_lines(args.slow))
    print("| package | statements | whole suite | fast tier | fast / whole |")
    print("| --- | ---: | ---: | ---: | ---: |")
    totals = [0, 0, 0]
    for package, (statements, whole, fast) in rows.items():
        totals = [t + v for t, v in zip(totals, (statements, whole, fast), strict=True)]
        print(
            f"| `{package}` | {statements} | {whole} ({percent(whole, statements)}) "
            f"| {fast} ({percent(fast, statements)}) | {percent(fast, whole)} |"
        )
    statements, whole, fast = totals
    print(
        f"| **all** | {statements} | {whole} ({percent(whole, statements)}) "
        f"| {fast} ({percent(fast, statements)}) | **{percent(fast, whole)}** |"
    )
    problems = [f"{p}: the fast tier covers no line" for p, r in rows.items() if r[1] and not r[2]]
    if whole and fast / whole < args.minimum:
        problems.append(f"the fast tier keeps {percent(fast, whole)} (< {args.minimum:.0%})")
    for problem in problems:
        print(f"coverage_table: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
