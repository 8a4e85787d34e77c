"""Write the measured cost of every test module, per tier, from pytest's JUnit reports.

`make test-all` runs each suite with ``--junitxml=.test-reports/<tier>-<suite>.xml`` (tier
``fast`` or ``slow``) and then this script, which sums each module's test times (setup, call and
teardown: pytest's ``junit_duration_report = total``) and writes ``tests/tier_costs.json``:

    {"tests/runtime/test_grpo_runtime.py": {"slow": 81}, "tests/data/test_history.py": {"fast": 2}}

``tests/conftest.py`` orders each run by these numbers, longest module first, so the costs that
order the run are always those of the last measured run, never hand-edited. Commit the file
after a ``make test-all``.

    python scripts/tier_costs.py .test-reports/*.xml --write tests/tier_costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TIERS = ("fast", "slow")


def report_tier(path: Path) -> str:
    """The tier a report holds, from its file name (``fast-main.xml`` -> ``fast``)."""
    tier = path.name.split("-", 1)[0]
    if tier not in TIERS:
        raise ValueError(f"{path}: a report's name starts with one of {TIERS} and a dash")
    return tier


REPO = Path(__file__).resolve().parents[1]
LIBRARY = "llmrl"
"""The package whose modules are collected as doctests (the root ``conftest.py``)."""


def module_of(classname: str, file: str | None, repo: Path = REPO) -> str:
    """The test file a JUnit ``testcase`` belongs to, as a path from the repository root."""
    if file:
        return file
    parts = classname.split(".")
    if parts[0] == LIBRARY:
        # a doctest: classname "llmrl.core.config_loading" (a module) or "llmrl.core" (a package)
        module = "/".join(parts) + ".py"
        return module if (repo / module).is_file() else "/".join(parts) + "/__init__.py"
    # pytest writes classname "tests.runtime.test_x" or "tests.runtime.test_x.TestClass"
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    if not parts:
        raise ValueError(f"cannot tell the test module of classname {classname!r}")
    return "/".join(parts) + ".py"


def module_seconds(report: Path) -> dict[str, float]:
    """Seconds per test module in one JUnit report (every test case's total time)."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        module = module_of(case.get("classname", ""), case.get("file"))
        seconds[module] += float(case.get("time", 0.0))
    return dict(seconds)


def costs(reports: list[Path], previous: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``previous`` with the tiers these reports measured replaced by their figures: a tier
    no report covers keeps its last measured costs."""
    measured: dict[str, dict[str, float]] = defaultdict(dict)
    tiers = set()
    for report in reports:
        tier = report_tier(report)
        tiers.add(tier)
        for module, seconds in module_seconds(report).items():
            measured[module][tier] = measured[module].get(tier, 0.0) + seconds
    merged: dict[str, dict[str, int]] = {}
    for module in sorted(set(previous) | set(measured)):
        kept = {t: s for t, s in previous.get(module, {}).items() if t not in tiers}
        fresh = {t: max(1, round(s)) for t, s in measured.get(module, {}).items()}
        if kept or fresh:
            merged[module] = dict(sorted({**kept, **fresh}.items()))
    return merged


def dumps(table: dict[str, dict[str, int]]) -> str:
    """The costs as JSON, one module a line (small diffs when a run is re-measured)."""
    lines = [f"  {json.dumps(module)}: {json.dumps(tiers)}" for module, tiers in table.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML files, <tier>-*.xml")
    parser.add_argument("--write", type=Path, required=True, help="the costs file to update")
    args = parser.parse_args()
    missing = [str(r) for r in args.reports if not r.is_file()]
    if missing:
        print(f"tier_costs: no such report: {', '.join(missing)}", file=sys.stderr)
        return 1
    previous = json.loads(args.write.read_text()) if args.write.is_file() else {}
    table = costs(args.reports, previous)
    args.write.write_text(dumps(table))
    totals = {t: sum(c.get(t, 0) for c in table.values()) for t in TIERS}
    print(f"tier_costs: {len(table)} modules written to {args.write} ({totals} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
