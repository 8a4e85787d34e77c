"""The pipeline summary's held-out table on hand-made evaluation results: each gain with its
paired 95% interval and McNemar p, correct/total per problem kind, in the terminal, the markdown
artifact, the table artifact and the parent run's metrics and artifacts.

Four problems, kinds ``+ * + -``; which each model got right (``1``) and the hand-computed gains
(a resample's gain is ``(fixed - broken) / 4``; its 2.5% and 97.5% quantiles come from the
multinomial probabilities, none of which is near 2.5%):

=====  ====  ===  ====  =======================================================================
model  p0-3  acc  gain  interval, McNemar p
=====  ====  ===  ====  =======================================================================
base   0000  0    -     -
sft    1100  .5   +.5   2 fixed of 4: P(none drawn) = P(all) = 1/16 -> [0, 1]; p = 2/4 = 0.5
grpo   1011  .75  +.25  2 fixed, 1 broken: P(gain <= -.75) = 1.95% -> -.5, P(+1) = 1/16 -> [-.5,
                        1]; p = 2 (1 + 3) / 8, capped at 1
=====  ====  ===  ====  =======================================================================

GRPO over base: 3 fixed of 4, P(at most 1 fixed drawn) = 5.1% and P(none) = 0.4% -> [0.25, 1];
p = 2 / 8 = 0.25.
"""

from __future__ import annotations

from typing import Any

import pytest

from flows.__main__ import format_report
from flows.pipeline import PipelineParams, log_summary_artifacts
from flows.summary import (
    NO_OUTCOMES,
    build_summary,
    evaluation_lines,
    evaluation_records,
    render_markdown,
)
from llmrl.tracking import PipelineRun

KINDS = {"p0": "+", "p1": "*", "p2": "+", "p3": "-"}
TRACKING = PipelineRun("sqlite:////x/mlflow.db", "llmrl", "1", "parent123", "http://mlflow:5000")


def _evaluation(*correct: int) -> dict[str, Any]:
    """An eval stage's summary with these per-problem results (as the evaluator writes it)."""
    outcomes = {pid: bool(right) for pid, right in zip(KINDS, correct, strict=True)}
    by_kind: dict[str, dict[str, Any]] = {}
    for pid, kind in sorted(KINDS.items(), key=lambda item: item[1]):
        counts = by_kind.setdefault(kind, {"correct": 0, "total": 0})
        counts["correct"] += outcomes[pid]
        counts["total"] += 1
    for counts in by_kind.values():
        counts["accuracy"] = counts["correct"] / counts["total"]
    return {
        "accuracy": sum(correct) / len(correct),
        "num_problems": len(correct),
        "accuracy_by_kind": by_kind,
        "outcomes": outcomes,
    }


RECORDS = {
    "eval-base": {"summary": _evaluation(0, 0, 0, 0), "seconds": 3.0, "status": "ran"},
    "eval-sft": {"summary": _evaluation(1, 1, 0, 0), "seconds": 3.0, "status": "ran"},
    "eval-grpo": {"summary": _evaluation(1, 0, 1, 1), "seconds": 3.0, "status": "ran"},
}


@pytest.fixture(scope="module")
def summary() -> dict[str, Any]:
    return build_summary(PipelineParams(), TRACKING, RECORDS, "run-x")


def test_gains_and_their_intervals_by_hand(summary) -> None:
    gains = {(g["after"], g["before"]): g for g in summary["gains"]}
    assert list(gains) == [("sft", "base"), ("grpo", "sft"), ("grpo", "base")]
    expected = {  # gain, interval, McNemar p, fixed, broken
        ("sft", "base"): (0.5, 0.0, 1.0, 0.5, 2, 0),
        ("grpo", "sft"): (0.25, -0.5, 1.0, 1.0, 2, 1),
        ("grpo", "base"): (0.75, 0.25, 1.0, 0.25, 3, 0),
    }
    for pair, (gain, low, high, p, improved, regressed) in expected.items():
        found = gains[pair]
        assert (found["gain"], found["ci_low"], found["ci_high"]) == (gain, low, high), pair
        assert found["p_value"] == pytest.approx(p), pair  # float64 binomial sums: ~1e-16 rel
        assert (found["improved"], found["regressed"], found["note"]) == (improved, regressed, None)
    assert [g["previous"] for g in summary["gains"]] == [True, True, False]
    assert summary["kinds"] == ["*", "+", "-"]


def test_parent_run_metrics_carry_each_gain_its_interval_and_p(summary) -> None:
    metrics = summary["metrics"]
    assert {k: v for k, v in metrics.items() if k.startswith("gain/")} == {
        "gain/sft_over_base": 0.5,
        "gain/sft_over_base_ci_low": 0.0,
        "gain/sft_over_base_ci_high": 1.0,
        "gain/sft_over_base_p_mcnemar": 0.5,
        "gain/grpo_over_sft": 0.25,
        "gain/grpo_over_sft_ci_low": -0.5,
        "gain/grpo_over_sft_ci_high": 1.0,
        "gain/grpo_over_sft_p_mcnemar": 1.0,
        "gain/grpo_over_base": 0.75,
        "gain/grpo_over_base_ci_low": 0.25,
        "gain/grpo_over_base_ci_high": 1.0,
        "gain/grpo_over_base_p_mcnemar": 0.25,
    }
    assert metrics["accuracy_grpo"] == 0.75  # what `python -m flows compare` reads is unchanged


def test_terminal_table(summary) -> None:
    lines = evaluation_lines(summary)
    assert lines[:6] == [
        "Held-out accuracy",
        "  model       accuracy  problems  gain vs previous [95% CI]  McNemar p    *    +    -",
        "  base model     0.000         4  -                                  -  0/1  0/2  0/1",
        "  after SFT      0.500         4  +0.500 [+0.000, +1.000]        0.500  1/1  1/2  0/1",
        "  after GRPO     0.750         4  +0.250 [-0.500, +1.000]        1.000  0/1  2/2  1/1",
        "  after GRPO vs base model: +0.750 [+0.250, +1.000], McNemar p=0.250",
    ]
    legend = " ".join(line.strip() for line in lines[6:])
    assert "paired bootstrap over the problems (10,000 resamples)" in legend
    assert "the gain is real when the interval excludes 0" in legend
    assert "correct/total greedy answers per problem kind" in legend
    report = format_report(summary, None)  # what `python -m flows` prints
    assert "\n".join(lines) in report and "Wall time per stage" in report
    # the MLflow links open the model-training view's runs table and the parent run
    assert "\n  MLflow:  mlflow ui --backend-store-uri sqlite:////x/mlflow.db\n" in report
    assert (
        "\n           then http://mlflow:5000/#/experiments/1/runs?workflowType=machine_learning\n"
        "           pipeline run: "
        "http://mlflow:5000/#/experiments/1/runs/parent123?workflowType=machine_learning\n"
    ) in report


def test_markdown_and_table_artifacts(summary) -> None:
    markdown = render_markdown(summary)
    assert (
        "MLflow parent run [parent123]"
        "(http://mlflow:5000/#/experiments/1/runs/parent123?workflowType=machine_learning) in "
        "experiment [`llmrl`](http://mlflow:5000/#/experiments/1/runs?workflowType=machine_learning)"
    ) in markdown
    for row in [
        "| model | accuracy | problems | gain vs previous [95% CI] | McNemar p | \\* | + | - |",
        "| base model | 0.000 | 4 | - | - | 0/1 | 0/2 | 0/1 |",
        "| after SFT | 0.500 | 4 | +0.500 [+0.000, +1.000] | 0.500 | 1/1 | 1/2 | 0/1 |",
        "| after GRPO | 0.750 | 4 | +0.250 [-0.500, +1.000] | 1.000 | 0/1 | 2/2 | 1/1 |",
        "- after GRPO vs base model: +0.750 [+0.250, +1.000], McNemar p=0.250",
    ]:
        assert row + "\n" in markdown, row
    records = evaluation_records(summary)
    assert [r["model"] for r in records] == ["base", "sft", "grpo"]
    assert records[2] == {
        "model": "grpo",
        "accuracy": "0.750",
        "problems": "4",
        "gain vs previous [95% CI]": "+0.250 [-0.500, +1.000]",
        "McNemar p": "1.000",
        "*": "0/1",
        "+": "2/2",
        "-": "1/1",
        "mlflow_run_id": None,
    }


def test_results_that_cannot_be_paired_get_a_gain_without_interval() -> None:
    stored_before = {k: v for k, v in RECORDS["eval-base"]["summary"].items() if k != "outcomes"}
    other_problems = _evaluation(1, 0, 1, 1)
    del other_problems["outcomes"]["p3"]
    records = {
        "eval-base": {"summary": stored_before},  # a result stored before outcomes were recorded
        "eval-sft": RECORDS["eval-sft"],
        "eval-grpo": {"summary": other_problems},
    }
    summary = build_summary(PipelineParams(), TRACKING, records, "run-y")
    sft, grpo, over_base = summary["gains"]
    assert (sft["gain"], sft["ci_low"], sft["p_value"], sft["note"]) == (
        0.5,
        None,
        None,
        NO_OUTCOMES,
    )
    assert (grpo["gain"], grpo["ci_low"], grpo["ci_high"]) == (0.25, None, None)
    assert grpo["note"] == (
        "sft and grpo answered different problems, so they cannot be paired: "
        "1 missing from grpo (p3)"
    )
    assert (over_base["gain"], over_base["note"]) == (0.75, NO_OUTCOMES)
    assert summary["metrics"]["gain/sft_over_base"] == 0.5
    assert not [k for k in summary["metrics"] if k.endswith(("_ci_low", "_ci_high", "_p_mcnemar"))]
    lines = evaluation_lines(summary)
    assert lines[3].startswith("  after SFT      0.500         4  +0.500 (no CI)")
    assert f"  after SFT vs base model: no interval: {NO_OUTCOMES}" in lines
    assert f"  after GRPO vs base model: +0.750, no interval: {NO_OUTCOMES}" in lines


def test_two_models_have_one_gain_and_no_kinds_without_them() -> None:
    def plain(*correct: int) -> dict[str, Any]:  # a task without kinds
        return {k: v for k, v in _evaluation(*correct).items() if k != "accuracy_by_kind"}

    records = {
        "eval-base": {"summary": plain(0, 0, 0, 0)},
        "eval-grpo": {"summary": plain(1, 0, 0, 0)},
    }
    summary = build_summary(PipelineParams(), TRACKING, records, "run-z")
    (gain,) = summary["gains"]
    assert (gain["after"], gain["before"], gain["previous"]) == ("grpo", "base", True)
    assert summary["kinds"] == []
    header, _, grpo = evaluation_lines(summary)[1:4]
    assert "+0.250 [+0.000, +0.750]" in grpo  # P(3 or 4 fixed of 4 drawn) = 5.1%, P(4) = 0.4%
    assert header.endswith("McNemar p") and "per problem kind" not in render_markdown(summary)


class _ParentRun:
    """Records what the flow stores on the parent run; fails when told to."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.stored = fail, {}

    def log_text(self, text: str, artifact_file: str) -> None:
        if self.fail:
            raise ConnectionError("MLflow went away")
        self.stored[artifact_file] = text

    def log_dict(self, data: dict, artifact_file: str) -> None:
        self.stored[artifact_file] = data


def test_the_parent_run_gets_the_markdown_and_the_evaluation(summary, caplog) -> None:
    from prefect.logging import disable_run_logger

    parent = _ParentRun()
    log_summary_artifacts(parent, summary, "# markdown")
    assert parent.stored["pipeline_summary.md"] == "# markdown"
    evaluation = parent.stored["evaluation.json"]
    assert evaluation["gains"] == summary["gains"] and evaluation["kinds"] == ["*", "+", "-"]
    assert evaluation["evaluation"][1]["accuracy_by_kind"]["+"] == {
        "correct": 1,
        "total": 2,
        "accuracy": 0.5,
    }
    with disable_run_logger():
        log_summary_artifacts(_ParentRun(fail=True), summary, "# markdown")  # does not raise
