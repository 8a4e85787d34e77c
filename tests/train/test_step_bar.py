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
