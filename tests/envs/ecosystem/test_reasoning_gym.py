"""`ReasoningGymTask`: reasoning-gym's generators as problems, its scorers as rewards (checked
by hand on answers whose score is known), through ``ChatEnv`` with a scripted policy."""

from __future__ import annotations

import json
import math
import pickle

import pytest

from llmrl.envs import ChatEnv
from llmrl.envs.ecosystem.reasoning_gym import (
    ReasoningGymTask,
    decode,
    encode,
    extract_answer,
)
from llmrl.envs.tasks import make_task
from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer
from llmrl.envs.transforms.task_reward import TaskReward
from tests.support.own_task_grpo import grpo_step, prepared
from tests.support.scripted import ScriptedPolicy

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


@pytest.fixture(scope="module")
def task() -> ReasoningGymTask:
    return ReasoningGymTask("basic_arithmetic", config=SMALL)


def json_round_trip(fields: dict) -> dict:
    """What a prepared dataset gives back: the fields after a JSON file."""
    return json.loads(json.dumps(fields, allow_nan=False))


def test_generation_is_deterministic_and_the_splits_share_no_question(task):
    train = task.generate(40, seed=3, split="train")
    assert [p.prompt for p in train] == [p.prompt for p in task.generate(40, 3, "train")]
    assert [p.prompt for p in train] != [p.prompt for p in task.generate(40, 4, "train")]
    evaluation = task.generate(40, seed=3, split="eval")
    assert len({p.prompt for p in train}) == 40 and len({p.prompt for p in evaluation}) == 40
    assert not {p.prompt for p in train} & {p.prompt for p in evaluation}
    assert len({p.id for p in train + evaluation}) == 80
    first = train[0]
    assert first.prompt == first.fields["question"]
    assert first.sft_target == f"<answer>{first.answer}</answer>"
    assert first.fields["metadata"]["source_dataset"] == "basic_arithmetic"
    assert json_round_trip(first.fields) == first.fields


def test_a_right_answer_scores_1_a_wrong_one_0_and_no_tag_is_unformatted(task):
    problem = task.generate(1, seed=0, split="train")[0]
    fields = json_round_trip(problem.fields)
    wrong = str(int(problem.answer) + 1)
    right = task.score(f"Thinking...\n<answer>{problem.answer}</answer>", problem.answer, **fields)
    assert (right.reward, right.correct, right.formatted) == (1.0, True, True)
    assert right.parsed == problem.answer
    assert task.score(f"<answer>{wrong}</answer>", problem.answer, **fields).reward == 0.0
    bare = task.score(problem.answer, problem.answer, **fields)
    assert (bare.reward, bare.correct, bare.formatted, bare.parsed) == (0.0, False, False, None)


def test_partial_credit_format_reward_and_correct_at():
    # basic_arithmetic's scorer (reasoning-gym's default): len(oracle) / len(answer) when the
    # answer contains the oracle: "x7" for 7 scores 1/2
    strict = ReasoningGymTask("basic_arithmetic", config=SMALL, format_reward=0.1)
    lenient = ReasoningGymTask("basic_arithmetic", config=SMALL, correct_at=0.5)
    half = strict.score("<answer>x7</answer>", "7", metadata={})
    assert (half.reward, half.correct) == (0.5, False)
    assert lenient.score("<answer>x7</answer>", "7", metadata={}).correct
    assert strict.score("<answer>3</answer>", "7", metadata={}).reward == 0.1
    assert strict.score("7", "7", metadata={}).reward == 0.0  # no tag: no format reward


def test_metadata_with_tuples_survives_json_and_the_entry_can_be_rebuilt():
    # rearc's scorer compares grids held as tuples of tuples in the metadata: a plain JSON
    # round trip (lists) would score the right answer 0
    task = ReasoningGymTask("rearc")
    problem = task.generate(1, seed=0, split="train")[0]
    fields = json_round_trip(problem.fields)
    assert "__tuple__" in json.dumps(fields["metadata"])
    assert task.score(f"<answer>{problem.answer}</answer>", problem.answer, **fields).correct
    rebuilt = {name: value for name, value in fields.items() if name != "metadata"}
    assert task.score(f"<answer>{problem.answer}</answer>", problem.answer, **rebuilt).correct
    value = {"grid": ((1, 2), (3, 4)), 5: {"a", "b"}, "nan": float("inf"), "__set__": [1]}
    assert decode(json.loads(json.dumps(encode(value)))) == value


def test_an_answer_the_scorer_cannot_read_is_wrong_not_an_error():
    task = ReasoningGymTask("prime_factorization")
    problem = task.generate(1, seed=0, split="eval")[0]
    score = task.score("<answer>not a number</answer>", problem.answer, **problem.fields)
    assert (score.reward, score.correct, score.formatted) == (0.0, False, True)


def test_extract_answer_takes_the_last_tag():
    assert extract_answer("<answer>1</answer> no, <answer> 2 </answer>") == "2"
    assert extract_answer("<answer>unclosed") is None


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match=r"dataset: unknown .*did you mean chain_sum"):
        ReasoningGymTask("chain_summ")
    with pytest.raises(ValueError, match=r"config: .*'bogus'.*its options: .*max_terms"):
        ReasoningGymTask("chain_sum", config={"bogus": 1})
    with pytest.raises(ValueError, match=r"config: .*max_terms must be >= min_terms"):
        ReasoningGymTask("chain_sum", config={"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match=r"config: \['seed'\] are set by generation"):
        ReasoningGymTask("chain_sum", config={"seed": 1})
    with pytest.raises(ValueError, match=r"system_prompt: 'defualt'"):
        ReasoningGymTask("chain_sum", system_prompt="defualt")
    with pytest.raises(ValueError, match=r"split must be one of"):
        ReasoningGymTask("chain_sum").generate(1, 0, "test")


def test_pickling_keeps_the_options_and_rebuilds_the_scorer(task):
    problems = task.generate(3, seed=1, split="train")
    copy = pickle.loads(pickle.dumps(task))
    assert copy._scorer is None and copy.config == SMALL
    for problem in problems:
        reply = f"<answer>{problem.answer}</answer>"
        assert copy.score(reply, problem.answer, **problem.fields).reward == 1.0


def test_make_task_and_a_composite_dataset():
    specs = [
        {"name": "chain_sum", "weight": 1, "config": {}},
        {"name": "basic_arithmetic", "weight": 1, "config": {}},
    ]
    task = make_task("reasoning-gym", dataset="composite", config={"datasets": specs})
    assert isinstance(task, ReasoningGymTask)
    problems = task.generate(8, seed=0, split="train")
    assert {task.kind(p) for p in problems} == {"chain_sum", "basic_arithmetic"}
    assert all(
        task.score(f"<answer>{p.answer}</answer>", p.answer, **p.fields).correct for p in problems
    )


def test_an_episode_through_chat_env_with_the_task_reward(task):
    problems = task.generate(2, seed=5, split="train")
    primer = DataLoadingPrimer(problems, batch_size=2, shuffle=False)
    env = ChatEnv(system_prompt=task.instructions, transforms=[primer, TaskReward(task)])
    state = env.reset()
    replies = [f"<answer>{problems[0].answer}</answer>", "<answer>none</answer>"]
    transition = env.step(ScriptedPolicy(replies)(state))
    assert transition["reward"].tolist() == [1.0, 0.0]
    assert transition["correct"].tolist() == [True, False]
    assert transition["done"].all()
    system = transition["history"].prompt[0][0]
    assert system.role == "system" and "<answer>" in system.content


def test_grpo_trains_a_step_on_a_prepared_dataset(tmp_path, tiny_model_dir):
    data = prepared(
        tmp_path,
        task="reasoning-gym",
        task_options={"dataset": "basic_arithmetic", "config": SMALL},
        generate={"train_size": 8, "eval_size": 4},
    )
    batch, metrics = grpo_step(data, tiny_model_dir)
    assert batch["reward"].numel() == 4 and metrics["task/failures"] == 0.0
    assert math.isfinite(metrics["reward_mean"]) and metrics["trained_groups"] == 2
