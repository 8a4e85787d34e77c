"""The user's reward functions and task classes: their forms, weights and fields (hand-computed),
and their faults contained: a raise, a hang, NaN, a wrong type or length give the fallback reward,
a flag, and one log line naming the function."""

from __future__ import annotations

import logging
import pickle
import time

import pytest

from llmrl.core.user_code import UserCodeError
from llmrl.envs.tasks import RewardFunction, RewardFunctionTask, Score, make_task
from llmrl.envs.tasks.scoring import TaskScorer
from tests.support import user_rewards

PATH = "tests.support.user_rewards"
ROWS = [{"answer": "200", "unit": "cm", "prompt": "2 m?"}] * 2 + [
    {"answer": "1000", "unit": "m", "prompt": "1 km?"}
] * 2
GROUPS = [0, 0, 1, 1]
REPLIES = ["200 cm", "it is 200 m", "1000 m", "1000 m!"]


def rewards(task, replies=REPLIES, rows=ROWS, groups=GROUPS):
    return [row.score.reward for row in TaskScorer(task).score_rows(replies, rows, groups)]


def test_a_single_function_gets_the_fields_it_names():
    task = make_task(f"{PATH}:exact")
    assert rewards(task) == [1.0, 0.0, 1.0, 0.0]
    scores = TaskScorer(task).score_rows(REPLIES, ROWS, GROUPS)
    assert [s.score.correct for s in scores] == [True, False, True, False]
    assert [s.score.formatted for s in scores] == [True, False, True, True]


def test_group_and_batch_forms_see_a_group_and_the_whole_batch():
    # group: the shortest of {"200 cm", "it is 200 m"} and of {"1000 m", "1000 m!"}
    assert rewards(make_task(f"{PATH}:shortest")) == [1.0, 0.0, 1.0, 0.0]
    # batch: 6, 11, 6, 7 characters of 30
    assert rewards(make_task(f"{PATH}:length_share")) == pytest.approx(
        [6 / 30, 11 / 30, 6 / 30, 7 / 30]
    )


def test_weighted_functions_add_up_and_report_each_part():
    task = make_task(
        "reward-functions",
        functions=[
            {"function": f"{PATH}:exact", "weight": 2.0},
            {"function": f"{PATH}:shortest", "weight": -0.5, "name": "brevity"},
        ],
        instructions="Answer with units.",
    )
    scores = TaskScorer(task).score_rows(REPLIES, ROWS, GROUPS)
    # 2 * exact - 0.5 * shortest: 2 - 0.5, 0 - 0, 2 - 0.5, 0 - 0
    assert [s.score.reward for s in scores] == [1.5, 0.0, 1.5, 0.0]
    assert [s.parts["brevity"].reward for s in scores] == [1.0, 0.0, 1.0, 0.0]
    assert [s.score.correct for s in scores] == [True, False, True, False]  # the first function's
    assert task.instructions == "Answer with units."


def test_a_task_class_is_built_with_its_options_and_gets_named_fields_only():
    task = make_task(f"{PATH}:UnitTask", bonus=0.25)
    assert rewards(task) == [1.25, 0.25, 1.25, 0.25]
    with pytest.raises(ValueError, match=r"UnitTask.*unexpected keyword argument 'colour'"):
        make_task(f"{PATH}:UnitTask", colour="red")


@pytest.mark.parametrize(
    ("name", "failure"),
    [
        ("raises", "raised"),
        ("returns_nan", "nan"),
        ("returns_text", "wrong_type"),
    ],
)
def test_faults_give_the_fallback_a_flag_and_one_log_line(name, failure, caplog):
    function = getattr(user_rewards, name)
    reward = RewardFunction(function, fallback_reward=-1.0)
    with caplog.at_level(logging.WARNING):
        outcomes = reward.score_rows(REPLIES, ROWS, GROUPS)
    assert [o.reward for o in outcomes] == [-1.0] * 4
    assert [o.failure for o in outcomes] == [failure] * 4
    logged = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(logged) == 1, logged  # once per function, not once per row
    if failure == "raised":
        assert "KeyError" in logged[0] and "Traceback" in logged[0]


def test_a_hung_function_costs_its_timeout_not_the_run():
    reward = RewardFunction(user_rewards.hangs, timeout_s=0.2, fallback_reward=0.5)
    started = time.perf_counter()
    outcomes = reward.score_rows(REPLIES[:2], ROWS[:2], GROUPS[:2])
    took = time.perf_counter() - started
    assert [o.failure for o in outcomes] == ["timeout", "timeout"]
    assert [o.reward for o in outcomes] == [0.5, 0.5]
    assert took < user_rewards.HANG_S  # two deadlines (0.4 s), not a hang


def test_a_list_of_the_wrong_length_fails_every_row_of_the_call():
    reward = RewardFunction(user_rewards.short_list, form="batch")
    assert [o.failure for o in reward.score_rows(REPLIES, ROWS, GROUPS)] == ["wrong_length"] * 4


def test_async_functions_run_concurrently_and_time_out_per_call():
    reward = RewardFunction(user_rewards.remote)
    started = time.perf_counter()
    outcomes = reward.score_rows(["200", "20", "1000", "1000"], ROWS, GROUPS)
    took = time.perf_counter() - started
    assert [o.reward for o in outcomes] == [1.0, 0.0, 1.0, 1.0]
    # four calls one after another take at least 4 x REMOTE_S; together, REMOTE_S and overhead
    assert took < 4 * user_rewards.REMOTE_S
    hung = RewardFunction(user_rewards.remote_hangs, timeout_s=0.2)
    assert [o.failure for o in hung.score_rows(REPLIES, ROWS, GROUPS)] == ["timeout"] * 4


def test_a_broken_task_class_is_contained_by_the_scorer():
    scorer = TaskScorer(make_task(f"{PATH}:BrokenTask"), fallback_reward=-2.0, timeout_s=5)
    scores = scorer.score_rows(REPLIES, ROWS, GROUPS)
    assert [(s.score.reward, s.failed) for s in scores] == [(-2.0, True)] * 4


def test_builtin_tasks_score_as_before():
    scores = TaskScorer(make_task("arithmetic")).score_rows(
        ["#### 5", "#### 6"], [{"answer": "5"}] * 2, [0, 0]
    )
    assert [(s.score.reward, s.failed) for s in scores] == [(1.0, False), (0.1, False)]


def test_tasks_pickle_for_env_workers():
    task = make_task(
        "reward-functions", functions=[{"function": f"{PATH}:exact", "timeout_s": 1.0}]
    )
    TaskScorer(task).score_rows(REPLIES, ROWS, GROUPS)  # starts the guard's thread
    copy = pickle.loads(pickle.dumps(task))
    assert rewards(copy) == [1.0, 0.0, 1.0, 0.0]


def test_names_that_do_not_load_are_refused_naming_the_cause(tmp_path, monkeypatch):
    with pytest.raises(
        UserCodeError, match=r"task: no_such_pkg.x:y does not import: ModuleNotFoundError"
    ):
        make_task("no_such_pkg.x:y")
    with pytest.raises(UserCodeError, match="has no attribute 'nope'"):
        make_task(f"{PATH}:nope")
    (tmp_path / "broken_user_module.py").write_text(
        "import json\nraise RuntimeError('boom at import')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserCodeError, match="does not import: RuntimeError: boom at import"):
        make_task("broken_user_module:score")
    with pytest.raises(UserCodeError, match=r"neither an import path .* nor an entry point"):
        make_task("my-unregistered-task")
    with pytest.raises(ValueError, match="lacks name, instructions, score"):
        make_task("tests.support.user_rewards:HANG_S")


def test_an_installed_entry_point_names_a_task(tmp_path, monkeypatch):
    info = tmp_path / "user_tasks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: user-tasks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[llmrl.tasks]\nunits = {PATH}:UnitTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = make_task("units", bonus=1.0)
    assert rewards(task) == [2.0, 1.0, 2.0, 1.0]


def test_a_plain_score_result_counts_as_correct_at_the_threshold():
    task = RewardFunctionTask([RewardFunction(lambda response: 0.5, name="half", correct_at=0.5)])
    assert task.score("x", "") == Score(0.5, correct=True)


def test_a_task_class_with_score_group_scores_each_group_at_once():
    task = make_task(f"{PATH}:PairTask")
    # groups {0: "a", "a", "b"} and {1: "c", "d"}: only the repeated "a"s score
    scores = TaskScorer(task).score_rows(
        ["a", "a", "b", "c", "d"], [ROWS[0]] * 3 + [ROWS[2]] * 2, [0, 0, 0, 1, 1]
    )
    assert [s.score.reward for s in scores] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert not any(s.failed for s in scores)
