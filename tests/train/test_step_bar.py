"""step_bar: a drawn bar when progress is on, one log line per step when it is off."""

from __future__ import annotations

import logging

from llmrl.stages.common import step_bar


def test_hidden_bar_logs_each_step_from_where_a_resumed_run_starts(caplog):
    caplog.set_level(logging.INFO, logger="llmrl.stages.common")
    bar = step_bar("grpo", 2, 4, enabled=False)
    for step in bar:
        bar.set_postfix(reward=f"{step / 10:.3f}", loss="0.0100")
    assert [r.getMessage() for r in caplog.records] == [
        "grpo step 3/4: reward 0.200, loss 0.0100",
        "grpo step 4/4: reward 0.300, loss 0.0100",
    ]


def test_drawn_bar_shows_the_figures_and_logs_nothing(caplog, capsys):
    caplog.set_level(logging.INFO, logger="llmrl.stages.common")
    bar = step_bar("sft", 0, 2, enabled=True)
    for _ in bar:
        bar.set_postfix(loss="1.5")
    bar.close()
    assert caplog.records == []
    assert "loss=1.5" in capsys.readouterr().err


def test_a_grpo_step_that_trained_nothing_says_so_instead_of_nan(caplog):
    from llmrl.stages.grpo import step_postfix

    trained = {"reward_mean": 0.5, "loss": -0.0125, "policy_version": 3.0, "peak_memory_mb": 5437.4}
    assert step_postfix(trained) == {
        "reward": "0.500",
        "loss": "-0.0125",
        "version": "3",
        "mem": "5437MB",
    }
    # drop-only dynamic sampling: every group all right or all wrong, so no loss was computed
    untrained = {"reward_mean": 0.662, "policy_version": 20.0}
    caplog.set_level(logging.INFO, logger="llmrl.stages.common")
    bar = step_bar("grpo", 19, 48, enabled=False)
    for _ in bar:
        bar.set_postfix(step_postfix(untrained))
        break
    assert "grpo step 20/48: reward 0.662, loss none (no group to train), version 20, mem -" in (
        caplog.text
    )
    assert "nan" not in caplog.text
