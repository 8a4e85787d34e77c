"""`VerifiersTask`: a tiny local verifiers environment (``tests/support/verifiers_tiny_env.py``,
found by ``verifiers.load_environment`` like an installed one) as rows, as weighted rewards
(checked by hand), and as single- and multi-turn episodes in llmrl's ``ChatEnv`` driven by a
scripted policy."""

from __future__ import annotations

import pickle
import signal

import pytest
import torch

from llmrl.data.non_tensor import as_list
from llmrl.envs import ChatEnv
from llmrl.envs.ecosystem.verifiers_env import VerifiersTask, parse_tool_calls
from llmrl.envs.ecosystem.verifiers_turns import EPISODE_KEY
from llmrl.envs.tasks import make_task
from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer
from llmrl.envs.transforms.task_reward import TaskReward
from tests.support.own_task_grpo import grpo_step, prepared
from tests.support.paths import REPO
from tests.support.scripted import ScriptedPolicy

ENV = "tests.support.verifiers_tiny_env"


@pytest.fixture(scope="module")
def single() -> VerifiersTask:
    return VerifiersTask(ENV)


def episode_env(task: VerifiersTask, problems: list) -> ChatEnv:
    """The env a GRPO worker builds from the task's ``env_options()``."""
    options = task.env_options()
    primer = DataLoadingPrimer(problems, batch_size=len(problems), shuffle=False)
    return ChatEnv(
        system_prompt=options["system_prompt"],
        max_turns=options.get("max_turns", 1),
        transforms=[
            primer,
            *options.get("transforms", []),
            options.get("reward", TaskReward(task)),
        ],
    )


def test_rows_come_from_the_dataset_and_the_eval_dataset(single):
    train = single.generate(12, seed=0, split="train")
    assert len({p.prompt for p in train}) == 12
    assert [p.id for p in train] == [p.id for p in single.generate(12, 0, "train")]
    assert [p.id for p in train] != [p.id for p in single.generate(12, 1, "train")]
    evaluation = single.generate(4, seed=0, split="eval")
    assert not {p.prompt for p in train} & {p.prompt for p in evaluation}
    problem = train[0]
    assert problem.messages[0] == {
        "role": "system",
        "content": "Answer inside <answer></answer> tags.",
    }
    assert problem.messages[-1] == {"role": "user", "content": problem.prompt}
    a, b = problem.fields["info"]["a"], problem.fields["info"]["b"]
    assert problem.answer == str(a + b) and problem.fields["prompt"] == problem.messages
    assert {"task", "example_id"} <= set(problem.fields)
    with pytest.raises(ValueError, match="has 4 eval rows; asked for 5"):
        single.generate(5, seed=0, split="eval")


def test_without_an_eval_dataset_a_tenth_of_the_rows_by_hash_go_to_eval():
    task = VerifiersTask(ENV, {"kind": "no_eval"})
    evaluation = task._split_rows("eval")
    train = task._split_rows("train")
    assert len(train) + len(evaluation) == 12 and len(evaluation) < len(train)
    keys = {str(row["prompt"]) for row in train}
    assert not keys & {str(row["prompt"]) for row in evaluation}


def test_weights_combine_as_computed_by_hand(single):
    problem = single.generate(1, seed=0, split="train")[0]
    fields = problem.fields
    # exact (weight 1) + brief (weight 0.5, async: under 20 characters); num_chars has weight 0
    right = single.score(f"<answer>{problem.answer}</answer>", problem.answer, **fields)
    assert (right.reward, right.correct, right.formatted, right.parsed) == (
        1.5,
        True,
        True,
        problem.answer,
    )
    long_right = single.score(f"So: <answer>{problem.answer}</answer>!", problem.answer, **fields)
    assert (long_right.reward, long_right.correct) == (1.0, True)
    wrong = single.score("<answer>99</answer>", problem.answer, **fields)
    assert (wrong.reward, wrong.correct) == (0.5, False)
    untagged = single.score(problem.answer, problem.answer, **fields)
    assert (untagged.reward, untagged.formatted, untagged.parsed) == (0.5, False, None)
    rows = single.score_rows(["<answer>99</answer>"], [{"answer": "99", **fields}], [0])
    assert rows[0].parts["exact"].reward == 1.0 and rows[0].parts["brief"].reward == 1.0


def test_group_functions_get_each_group_at_once():
    task = VerifiersTask(ENV, {"kind": "group"})
    replies = [
        "<answer>5</answer>",
        "<answer>5</answer>",
        "<answer>4</answer>",
        "<answer>5</answer>",
    ]
    rows = [{"answer": "5", "prompt": "What is 2 + 3?"}] * 4
    scores = task.score_rows(replies, rows, [7, 7, 8, 8])
    # exact (1) + 2 * first_right: the first right reply of each group gets the bonus
    assert [s.score.reward for s in scores] == [3.0, 1.0, 0.0, 3.0]


def test_a_failing_reward_function_gives_its_fallback_flagged():
    task = VerifiersTask(ENV, {"kind": "broken"}, fallback_reward=-1.0)
    [row] = task.score_rows(["<answer>5</answer>"], [{"answer": "5", "prompt": "2 + 3?"}], [0])
    assert row.score.reward == 1.0 - 1.0 and row.failed
    assert row.parts["explodes"].failure == "raised" and not row.parts["exact"].failed


def test_single_turn_episode_through_chat_env_with_the_task_reward(single):
    problems = single.generate(2, seed=0, split="train")
    env = episode_env(single, problems)
    state = env.reset()
    assert state["history"].prompt[0][0].content.startswith("Answer inside")
    replies = [f"<answer>{problems[0].answer}</answer>", "<answer>99</answer> is my answer"]
    transition = env.step(ScriptedPolicy(replies)(state))
    assert transition["reward"].tolist() == [1.5, 0.0]
    assert transition["correct"].tolist() == [True, False]
    assert transition["done"].all()


def test_multi_turn_episode_runs_the_environments_turns_and_scores_the_episode():
    task = VerifiersTask(ENV, {"kind": "guess"})
    assert task.multi_turn and task.max_turns == 3
    env = episode_env(task, task.generate(2, seed=0, split="train"))
    state = env.reset()
    secrets = [int(a) for a in as_list(state["answer"])]
    low = [f"<answer>{s - 1}</answer>" if s > 1 else "<answer>0</answer>" for s in secrets]
    first = env.step(ScriptedPolicy(low)(state))
    assert first["done"].tolist() == [False, False] and first["tool_called"].all()
    assert first["reward"].tolist() == [0.0, 0.0]
    assert [c[-1]["content"] for c in first["next", "history"].prompt.to_chats()] == ["higher"] * 2
    # row 0 guesses right on its second turn: solved 1 + speed 0.5 * 1/2
    second = env.step(ScriptedPolicy([f"<answer>{secrets[0]}</answer>", low[1]])(first["next"]))
    assert second["done"].tolist() == [True, False]
    assert second["reward"][0].item() == pytest.approx(1.25)
    assert (second["solved_score"][0].item(), second["speed_score"][0].item()) == (1.0, 0.5)
    # row 1 misses three times: the episode ends at max_turns with speed 0.5 * 1/3 only
    third = env.step(ScriptedPolicy([low[1]])(second["next"][1:]))
    assert third["done"].tolist() == [True] and not third["tool_called"].any()
    assert third["reward"].item() == pytest.approx(0.5 / 3)
    assert third["correct"].tolist() == [False]
    roles = [m["role"] for m in third["next", "history"].prompt.to_chats()[0]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert not env.transforms[1].episodes.open  # both episodes closed


def test_tool_calls_reach_the_tool_env_and_its_answers_come_back():
    task = VerifiersTask(ENV, {"kind": "tools"})
    assert "add" in task.instructions and "<tool_call>" in task.instructions
    problem = task.generate(1, seed=0, split="train")[0]
    env = episode_env(task, [problem])
    state = env.reset()
    assert '"name": "add"' in state["history"].prompt[0][0].content
    a, b = problem.fields["info"]["a"], problem.fields["info"]["b"]
    call = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    first = env.step(ScriptedPolicy([call])(state))
    assert first["tool_called"].tolist() == [True]
    tool = first["next", "history"].prompt.to_chats()[0][-1]
    assert (tool["role"], tool["content"]) == ("tool", str(a + b))
    second = env.step(ScriptedPolicy([f"<answer>{tool['content']}</answer>"])(first["next"]))
    assert second["done"].tolist() == [True]
    assert second["reward"].item() == pytest.approx(1.0 + 0.25)  # exact + 0.25 * used_tool
    assert parse_tool_calls("<tool_call>not json</tool_call> <tool_call>[1]</tool_call>") == []


def test_the_task_pickles_and_loads_its_environment_again_where_it_lands():
    task = VerifiersTask(ENV, {"kind": "guess"})
    copy = pickle.loads(pickle.dumps(task))
    assert copy._env is None and copy.env_args == {"kind": "guess"}
    assert [p.id for p in copy.generate(3, 0, "train")] == [
        p.id for p in task.generate(3, 0, "train")
    ]
    options = copy.env_options()
    assert options["max_turns"] == 3 and copy._env is not None
    state = episode_env(copy, copy.generate(1, 0, "train")).reset()
    assert len(as_list(state[EPISODE_KEY])) == 1


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [
        ("completion", "message_type='completion' is not supported"),
        ("own_loop", r"overrides get_prompt_messages\(\), a rollout loop of its own"),
        ("own_rubric", r"rubric OwnRubric overrides score_group\(\)"),
        ("group_turns", r"group reward functions \['first_right'\] in a multi-turn"),
        ("env_group", "EnvGroup is not supported"),
        ("metrics_only", "no reward function with a non-zero weight"),
    ],
)
def test_unsupported_protocols_are_refused_by_name(kind, refusal):
    with pytest.raises(ValueError, match=refusal):
        VerifiersTask(ENV, {"kind": kind})


def test_env_ids_resolve_as_verifiers_resolves_them_and_unknown_ones_are_refused(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tests" / "support"))
    task = make_task("verifiers", env_id="verifiers-tiny-env")
    assert isinstance(task, VerifiersTask) and task.env.__class__.__name__ == "SingleTurnEnv"
    with pytest.raises(ValueError, match=r"env_id: verifiers environment 'no-such-env'"):
        VerifiersTask("no-such-env")


def test_loading_an_environment_keeps_the_processs_signal_handlers():
    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        VerifiersTask(ENV, {"kind": "single", "train": 11})
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_reward_columns_are_the_same_on_every_step():
    task = VerifiersTask(ENV, {"kind": "guess"})
    env = episode_env(task, task.generate(1, seed=0, split="train"))
    transition = env.step(ScriptedPolicy(["<answer>0</answer>"])(env.reset()))
    assert transition["task_failed"].dtype == torch.bool
    assert {"solved_score", "speed_score", "solved_failed"} <= set(transition.keys())


def test_grpo_trains_a_step_on_a_multi_turn_environment(tmp_path, tiny_model_dir):
    data = prepared(
        tmp_path,
        task="verifiers",
        task_options={"env_id": ENV, "env_args": {"kind": "guess"}},
        generate={"train_size": 4, "eval_size": 2},
    )
    _batch, metrics = grpo_step(data, tiny_model_dir)
    assert metrics["task/failures"] == 0.0 and metrics["trained_groups"] == 2
    assert metrics["solved/failures"] == 0.0 and metrics["speed/failures"] == 0.0
    # every episode takes 1 to 3 replies, so speed's raw score 1/replies is in [1/3, 1]
    assert 1 / 3 - 1e-6 <= metrics["speed/score_mean"] <= 1 + 1e-6
