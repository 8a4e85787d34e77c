"""The test tiers' own machinery: scripts/test_tiers.sh runs every suite and fails when any
did, scripts/tier_costs.py writes each module's measured cost per tier from JUnit reports, and
tests/tier_costs.json (what orders the run) names only modules that exist."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import tier_costs  # noqa: E402  (scripts/ is not a package)

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.runtime.test_a" name="test_one" time="10.25" />
<testcase classname="tests.runtime.test_a" name="test_two[x]" time="4.5" />
<testcase classname="tests.runtime.test_a.TestGroup" name="test_three" time="0.75" />
<testcase classname="tests.test_cli" name="test_help" time="0.2" />
</testsuite></testsuites>
"""


def test_module_seconds_sum_every_test_of_a_module(tmp_path):
    report = tmp_path / "fast-main.xml"
    report.write_text(REPORT)
    assert tier_costs.module_seconds(report) == pytest.approx(
        # exact decimal sums: 10.25 + 4.5 + 0.75 and 0.2 (binary rounding of a few additions)
        {"tests/runtime/test_a.py": 15.5, "tests/test_cli.py": 0.2},
        abs=1e-12,
    )


def test_doctests_count_for_the_library_module_they_run_in():
    """The fast tier runs ``llmrl/``'s docstring examples: a module's and a package's."""
    assert tier_costs.module_of("llmrl.core.config_loading", None) == (
        "llmrl/core/config_loading.py"
    )
    assert tier_costs.module_of("llmrl.core", None) == "llmrl/core/__init__.py"
    for module in ("llmrl/core/config_loading.py", "llmrl/core/__init__.py"):
        assert (REPO / module).is_file()


def test_costs_replace_the_measured_tier_and_keep_the_other(tmp_path):
    report = tmp_path / "slow-main.xml"
    report.write_text(REPORT)
    previous = {
        "tests/runtime/test_a.py": {"fast": 3, "slow": 99},
        "tests/gone.py": {"slow": 7},
        "tests/kept.py": {"fast": 2},
    }
    assert tier_costs.costs([report], previous) == {
        "tests/kept.py": {"fast": 2},
        "tests/runtime/test_a.py": {"fast": 3, "slow": 16},  # 15.5 rounds half to even
        "tests/test_cli.py": {"slow": 1},  # at least a second: measured means not free
    }
    table = tier_costs.costs([report], previous)
    assert json.loads(tier_costs.dumps(table)) == table


def test_a_report_named_for_no_tier_is_refused(tmp_path):
    report = tmp_path / "main.xml"
    report.write_text(REPORT)
    with pytest.raises(ValueError, match=r"main\.xml: a report.s name starts with one of"):
        tier_costs.costs([report], {})


def test_the_measured_costs_name_existing_modules():
    table = json.loads((REPO / "tests" / "tier_costs.json").read_text())
    assert table, "tests/tier_costs.json is empty: run `make test-all` and commit it"
    missing = [module for module in table if not (REPO / module).is_file()]
    assert missing == [], "measured modules that no longer exist: run `make test-all`"
    assert all(set(tiers) <= {"fast", "slow"} for tiers in table.values())


FAKE_PYTHON = """#!/usr/bin/env bash
# a stand-in interpreter: records its arguments, writes the JUnit report, exits as told
echo "$*" >> "{log}"
for arg in "$@"; do
    case $arg in --junitxml=*) echo '<testsuites/>' > "${{arg#--junitxml=}}" ;; esac
done
exit {code}
"""


def _fake_python(folder: Path, name: str, code: int, log: Path) -> Path:
    path = folder / name
    path.write_text(FAKE_PYTHON.format(log=log, code=code))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("tiers", "main_code", "narrowed", "expected_suites", "expected_exit"),
    [
        ("fast", 0, False, ["fast-main", "fast-vllm"], 0),
        ("fast", 1, False, ["fast-main", "fast-vllm"], 1),  # the vLLM suite still runs
        ("all", 1, False, ["fast-main", "fast-vllm", "slow-main", "slow-vllm"], 1),
        # pytest's 5 (nothing selected) fails a plain run, passes one PYTEST_ARGS narrowed
        ("fast", 5, False, ["fast-main", "fast-vllm"], 1),
        ("fast", 5, True, ["fast-main", "fast-vllm"], 0),
    ],
)
def test_every_suite_runs_and_any_failure_fails_the_tiers(
    tmp_path, tiers, main_code, narrowed, expected_suites, expected_exit
):
    log = tmp_path / "calls.log"
    main = _fake_python(tmp_path, "main-python", main_code, log)
    stage = _fake_python(tmp_path, "stage-python", 0, log)
    reports = tmp_path / "reports"
    env = {
        **os.environ,
        "MAIN_PYTHON": str(main),
        "STAGE_PYTHON": str(stage),
        "TEST_REPORTS": str(reports),
    }
    env.pop("PYTEST_ARGS", None)
    if narrowed:
        env["PYTEST_ARGS"] = "-k something"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "test_tiers.sh"), tiers],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == expected_exit, done.stdout + done.stderr
    calls = log.read_text().splitlines()
    by_suite = {call.split(f"--junitxml={reports}/")[1].split(".xml")[0]: call for call in calls}
    assert len(by_suite) == len(calls) == len(expected_suites)
    # the fast tier's two suites first (side by side: either may start first), the slow ones after
    assert sorted(list(by_suite)[:2]) == ["fast-main", "fast-vllm"]
    assert sorted(by_suite) == sorted(expected_suites)
    assert sorted(p.stem for p in reports.glob("*.xml")) == sorted(expected_suites)
    # the marks select each tier; the fast tier never runs a slow test
    assert "-m not slow and not learning and not vllm and not images" in by_suite["fast-main"]
    assert "-m vllm and not slow tests/vllm" in by_suite["fast-vllm"]
    if tiers == "all":
        assert "-m slow and not learning and not vllm and not images" in by_suite["slow-main"]
        assert "-m vllm and slow tests/vllm" in by_suite["slow-vllm"]
    summary = done.stdout.splitlines()[-1]
    assert summary.startswith(f"test tiers ({tiers}): fast-main ")
    for name in expected_suites:
        code = main_code if name.endswith("-main") and not (narrowed and main_code == 5) else 0
        assert re.search(rf"{name} \d+ s \(exit {code}\),", summary), summary
