#!/usr/bin/env bash
# The test tiers (docs/testing.md), run by `make test` (fast) and `make test-all` (all).
#
#   scripts/test_tiers.sh fast   the fast tier: every test not marked slow in .venv, and beside
#                                it the vLLM module not marked slow (one engine) in .venv-stage
#   scripts/test_tiers.sh all    the fast tier, then every slow test in both environments, then
#                                tests/tier_costs.json rewritten from the run's JUnit reports
#
# Every suite runs even when an earlier one failed; the script fails when any did. Each suite's
# JUnit report lands in .test-reports/<tier>-<environment>.xml (TEST_REPORTS: another folder).
# Environment: MAIN_PYTHON, STAGE_PYTHON (the two environments' interpreters), TEST_WORKERS
# (pytest-xdist processes, default 2), PYTEST_ARGS (added to every suite, e.g. -x or -k),
# MAKE_STARTED (epoch seconds when make started: the total then includes the installs),
# COVERAGE=1 (`make coverage`: every suite under coverage.py, one combined data file per tier in
# .coverage-data/, settings in pyproject.toml's [tool.coverage.run]).
set -uo pipefail
cd "$(dirname "$0")/.."

tiers=${1:-}
if [ "$tiers" != fast ] && [ "$tiers" != all ]; then
    echo "usage: scripts/test_tiers.sh fast|all" >&2
    exit 2
fi
main_python=${MAIN_PYTHON:-.venv/bin/python}
stage_python=${STAGE_PYTHON:-.venv-stage/bin/python}
workers=${TEST_WORKERS:-2}
reports=${TEST_REPORTS:-.test-reports}
started=${MAKE_STARTED:-$(date +%s)}
# One module per xdist worker at a time (module fixtures are built once), in the order
# tests/conftest.py gives (longest measured module first).
xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
# Each module is compiled to bytecode once, when a test first imports it (installs compile none).
export PYTHONDONTWRITEBYTECODE=

mkdir -p "$reports"
rm -f "$reports"/*.xml "$reports"/*.status "$reports"/*.log
if [ "${COVERAGE:-0}" = 1 ]; then
    rm -rf .coverage-data
    mkdir -p .coverage-data
fi
suites=()

# suite NAME PYTHON PYTEST-ARGS...: run one suite; its time and exit status go to NAME.status
suite() {
    local name=$1 python=$2
    shift 2
    local start code
    start=$(date +%s)
    local runner=(-m pytest)
    if [ "${COVERAGE:-0}" = 1 ]; then
        # absolute: stage subprocesses and Ray actors run in other folders
        export COVERAGE_FILE="$PWD/.coverage-data/${name%%-*}"
        runner=(-m coverage run -m pytest)
    fi
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
    "$python" "${runner[@]}" "$@" --junitxml="$reports/$name.xml" ${PYTEST_ARGS:-}
    code=$?
    # pytest's 5, no test selected: expected where PYTEST_ARGS narrows the run (a -k or a path
    # that leaves one environment nothing), a broken selection otherwise
    if [ "$code" = 5 ] && [ -n "${PYTEST_ARGS:-}" ]; then
        code=0
    fi
    echo "$name $(($(date +%s) - start)) s (exit $code)" >"$reports/$name.status"
    return "$code"
}

# tier NAME MAIN-MARKS VLLM-MARKS: the tier's vLLM suite (one worker: one engine at a time)
# beside its main suite (xdist workers). The machine waits about half the time in either (engine,
# stage and server start-ups, polling), so together they take less than one after the other.
# The vLLM suite's output follows the main suite's.
tier() {
    local name=$1 main_marks=$2 vllm_marks=$3
    suites+=("$name-main" "$name-vllm")
    suite "$name-vllm" "$stage_python" -m "$vllm_marks" tests/vllm >"$reports/$name-vllm.log" 2>&1 &
    local vllm_pid=$!
    suite "$name-main" "$main_python" -m "$main_marks" "${xdist[@]}"
    wait "$vllm_pid"
    cat "$reports/$name-vllm.log"
}

tier fast "not slow and not learning and not vllm and not images" "vllm and not slow"
if [ "$tiers" = all ]; then
    tier slow "slow and not learning and not vllm and not images" "vllm and slow"
fi

if [ "${COVERAGE:-0}" = 1 ]; then
    for tier in fast slow; do
        if compgen -G ".coverage-data/$tier.*" >/dev/null; then
            COVERAGE_FILE=".coverage-data/$tier" "$main_python" -m coverage combine --quiet \
                ".coverage-data/$tier".*
        fi
    done
fi
failed=0
printf 'test tiers (%s):' "$tiers"
for name in "${suites[@]}"; do
    status=$(cat "$reports/$name.status" 2>/dev/null || echo "$name did not finish (exit 1)")
    printf ' %s,' "$status"
    [[ $status == *"(exit 0)" ]] || failed=1
done
echo " $(($(date +%s) - started)) s in all (installs included)"
# Costs from a plain run only: coverage slows the suite unevenly.
if [ "$tiers" = all ] && [ "$failed" = 0 ] && [ "${COVERAGE:-0}" != 1 ]; then
    "$main_python" scripts/tier_costs.py "$reports"/*.xml --write tests/tier_costs.json || {
        echo "test tiers: the costs were not written (scripts/tier_costs.py failed)" >&2
        failed=1
    }
fi
exit "$failed"
