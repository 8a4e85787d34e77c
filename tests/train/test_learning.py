"""Does the pipeline learn? `make check-learning` runs the pipeline flow exactly as `make run`
does: prepare -> SFT -> GRPO -> greedy evaluation of the base model, after SFT and after GRPO,
with the repository's own stage configs (configs/prepare.yaml, sft.yaml, grpo.yaml, eval.yaml,
read when the test runs: whatever they say now is what is checked), on the default number of
evaluation problems, with the real SmolLM2-135M-Instruct on CPU.

It asserts that each training stage brings a real gain on the same held-out problems: the lower
bound of the paired 95% bootstrap interval (:mod:`llmrl.eval.paired`) of SFT's gain over the base
model and of GRPO's gain over SFT is above 0. It prints the pipeline's report (``-s``): the
held-out table with each gain's interval and McNemar p, the accuracy per problem kind, and the
stage times.

Slow (minutes on 2 cores; marker ``learning``, not run by `make test`). The fast test below
checks the verdict on hand-made results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from flows.stages import COMMANDS, TITLES
from flows.summary import compare_models

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
CLAIMS: tuple[tuple[str, str], ...] = (("sft", "base"), ("grpo", "sft"))
"""``(after, before)``: the gains that must be real."""


def unproven_gains(
    summary: Mapping[str, Any], claims: Sequence[tuple[str, str]] = CLAIMS
) -> list[str]:
    """Why each claim "``after`` beats ``before``" is not shown by the pipeline summary's
    gains (the lower bound of its 95% interval is not above 0, or it has no interval); empty
    when every claim holds."""
    gains = {(gain["after"], gain["before"]): gain for gain in summary.get("gains") or []}
    problems = []
    for after, before in claims:
        what = f"{TITLES.get(after, after)} over {TITLES.get(before, before)}"
        gain = gains.get((after, before))
        if gain is None:
            problems.append(f"{what}: not measured (a model was not evaluated)")
        elif gain["ci_low"] is None:
            problems.append(f"{what}: no interval ({gain['note']})")
        elif gain["ci_low"] <= 0.0:
            problems.append(
                f"{what}: gain {gain['gain']:+.3f}, 95% interval [{gain['ci_low']:+.3f}, "
                f"{gain['ci_high']:+.3f}] does not exclude 0 (McNemar p={gain['p_value']:.3f}, "
                f"{gain['improved']} problems fixed, {gain['regressed']} broken of "
                f"{gain['num_problems']})"
            )
    return problems


def pipeline_params(work_dir: Path, tracking_uri: str) -> Any:
    """The pipeline's parameters for the check: the repository's configs, no overrides."""
    from flows.pipeline import PipelineParams

    configs = {f"{command}_config": str(CONFIGS / f"{command}.yaml") for command in COMMANDS}
    return PipelineParams(
        **configs,
        work_dir=str(work_dir),
        mlflow_tracking_uri=tracking_uri,
        experiment="llmrl",
        retries=0,
    )


@pytest.mark.slow
@pytest.mark.learning
def test_the_default_pipeline_learns(prefect_api, mlflow_uri, tmp_path: Path) -> None:
    from flows.__main__ import format_report
    from flows.pipeline import pipeline

    params = pipeline_params(tmp_path / "work", mlflow_uri)
    state = pipeline(params, return_state=True)
    assert state.is_completed(), state.result(raise_on_failure=False)
    summary = state.result()
    print("\nlearning check:", format_report(summary, str(state.state_details.flow_run_id)))
    problems = unproven_gains(summary)
    assert not problems, "no real gain:\n" + "\n".join(problems)


def _outcomes(*correct: int) -> dict[str, Any]:
    results = {f"p{i}": bool(right) for i, right in enumerate(correct)}
    return {"accuracy": sum(correct) / len(correct), "outcomes": results}


def test_the_verdict_on_hand_made_results() -> None:
    """Ten problems: SFT fixes 8 of them (interval [0.6, 1.0]), GRPO ties with SFT, then fixes
    the other 2 ([0, 0.4], which does not exclude 0)."""
    base, sft = _outcomes(*[0] * 10), _outcomes(*[1] * 8, 0, 0)
    same = {"gains": compare_models([("base", base), ("sft", sft), ("grpo", sft)])}
    assert unproven_gains(same) == [
        "after GRPO over after SFT: gain +0.000, 95% interval [+0.000, +0.000] does not exclude "
        "0 (McNemar p=1.000, 0 problems fixed, 0 broken of 10)"
    ]
    better = _outcomes(*[1] * 10)
    summary = {"gains": compare_models([("base", base), ("sft", sft), ("grpo", better)])}
    assert unproven_gains(summary, [("sft", "base")]) == []  # 8 of 10 fixed: a real gain
    (grpo,) = unproven_gains(summary)
    assert grpo.startswith("after GRPO over after SFT: gain +0.200, 95% interval [+0.000, +0.")
    unpaired = {"gains": compare_models([("base", {"accuracy": 0.0}), ("sft", sft)])}
    assert unproven_gains(unpaired) == [
        "after SFT over base model: no interval (no per-problem results to pair (evaluated "
        "before they were recorded))",
        "after GRPO over after SFT: not measured (a model was not evaluated)",
    ]


def test_the_check_runs_the_repository_configs(tmp_path: Path) -> None:
    params = pipeline_params(tmp_path, "sqlite:///x.db")
    for command in COMMANDS:
        path = Path(params.config_path(command))
        assert path.is_file() and path.parent == CONFIGS
    assert params.overrides == {} and params.skip == [] and params.start_from == {}
