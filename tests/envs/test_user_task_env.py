"""A user's task in llmrl's own rollout loop: the row's fields reach the reward, a chat prompt
starts the conversation, a failing function flags its rows, and the step's metrics count it."""

from __future__ import annotations

import math

import torch

from llmrl.data.problem import Problem
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks import make_task
from llmrl.runtime.grpo_step import model_reward_metrics
from tests.support.own_task_grpo import grpo_step, prepared
from tests.support.scripted import ScriptedPolicy

PATH = "tests.support.user_rewards"
PROBLEMS = [
    Problem(id="a", prompt="2 m in cm?", answer="200", fields={"unit": "cm"}),
    Problem(
        id="b",
        prompt="1 km in m?",
        answer="1000",
        fields={"unit": "m"},
        messages=[
            {"role": "user", "content": "Units, please."},
            {"role": "user", "content": "1 km in m?"},
        ],
    ),
]


def test_fields_parts_and_failures_reach_the_batch_and_its_metrics():
    task = make_task(
        "reward-functions",
        functions=[
            {"function": f"{PATH}:exact", "weight": 1.0},
            {"function": f"{PATH}:raises", "weight": 3.0, "fallback_reward": -0.5, "name": "buggy"},
        ],
        instructions="Use units.",
    )
    env = TaskEnv(task, PROBLEMS, batch_size=2, repeats=2, shuffle=False)
    state = env.reset()
    chats = state.get(("history", "prompt")).to_chats()
    assert [(m["role"], m["content"]) for m in chats[0]] == [
        ("system", "Use units."),
        ("user", "2 m in cm?"),
    ]
    assert [m["content"] for m in chats[2]] == ["Use units.", "Units, please.", "1 km in m?"]
    out = env.step(ScriptedPolicy(["200 cm", "200", "1000 m", "1 km"])(state))
    # exact + 3 * fallback(-0.5): 1 - 1.5, 0 - 1.5, 1 - 1.5, 0 - 1.5
    assert out["reward"].tolist() == [-0.5, -1.5, -0.5, -1.5]
    assert out["correct"].tolist() == [True, False, True, False]
    assert out["task_failed"].tolist() == [True] * 4
    assert out["exact_score"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out["buggy_failed"].tolist() == [True] * 4
    metrics = model_reward_metrics(out)
    assert metrics["exact/score_mean"] == 0.5 and metrics["exact/failures"] == 0.0
    assert metrics["buggy/failures"] == 4.0 and metrics["task/failures"] == 4.0
    assert metrics["buggy/score_mean"] != metrics["buggy/score_mean"]  # NaN: no row scored


def test_a_builtin_task_keeps_its_columns_and_counts_no_failures():
    task = make_task("arithmetic")
    problems = [Problem(id="p", prompt="2 + 3?", answer="5")]
    env = TaskEnv(task, problems, batch_size=1, repeats=2)
    out = env.step(ScriptedPolicy(["#### 5", "#### 4"])(env.reset()))
    assert out["reward"].tolist() == [1.0, torch.tensor(0.1).item()]  # float32
    assert model_reward_metrics(out) == {"task/failures": 0.0}


def test_grpo_trains_a_step_with_the_users_functions(tmp_path, tiny_model_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(f'{{"prompt": "Say {n}.", "answer": "{n}", "unit": "m"}}\n' for n in range(12))
    )
    data = prepared(
        tmp_path / "data",
        reward=[f"{PATH}:exact", {"function": f"{PATH}:shortest", "weight": 0.5}],
        source=str(rows),
        split={"eval_fraction": 0.0},
    )
    _batch, metrics = grpo_step(data, tiny_model_dir)
    assert metrics["task/failures"] == 0.0 and metrics["trained_groups"] == 2
    # the group form gives each group of 2 replies 1 and 0, or 1 and 1 when they are as long
    assert 0.5 <= metrics["shortest/score_mean"] <= 1.0
    assert metrics["exact/failures"] == 0.0 and math.isfinite(metrics["loss"])
