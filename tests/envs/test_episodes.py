"""Whole episodes: reset -> policy -> step, on task envs and with the Python tool."""

from __future__ import annotations

import pytest
import torch

from llmrl.envs import ArithmeticEnv, ChatEnv, GSM8KEnv, PythonInterpreter, queries
from llmrl.envs.sandbox import SandboxLimits
from llmrl.policies import TransformersWrapper
from tests.support.paths import SHARED_DATA
from tests.support.scripted import ScriptedPolicy

GSM8K_TRAIN = SHARED_DATA / "gsm8k" / "train.jsonl"


def test_arithmetic_episode_with_the_tiny_model(tiny, tokenizer):
    env = ArithmeticEnv(batch_size=2, repeats=3, num_problems=20, seed=0)
    policy = TransformersWrapper(tiny, tokenizer, generate_kwargs={"max_new_tokens": 8, "seed": 1})
    state = env.reset()
    transition = env.step(policy(state))
    assert transition.batch_size == (6,)
    assert transition["done"].all(), "single-turn task: every row ends after one reply"
    groups = transition["group_id"].tolist()
    assert groups == [groups[0]] * 3 + [groups[3]] * 3
    # a random model is (almost surely) wrong: rewards come from the task's parser
    assert set(transition["reward"].tolist()) <= {0.0, 0.1, 1.0}
    system = transition["history"].prompt[0][0]
    assert system.role == "system" and "####" in system.content


def test_multi_turn_episode_with_the_python_tool():
    env = ChatEnv(max_turns=3, transforms=[PythonInterpreter(SandboxLimits(timeout_s=5))])
    state = env.reset(queries(["What is 6 * 7?", "Say hi"]))
    code_reply = "Let me compute.\n```python\nprint(6 * 7)\n```"
    first = env.step(ScriptedPolicy([code_reply, "hi"])(state))
    assert first["done"].tolist() == [False, True]
    tool_message = first["next", "history"].prompt[0][-1]
    assert tool_message.role == "tool" and "42" in tool_message.content
    # the second turn sees the tool output and answers: the episode ends
    second = env.step(ScriptedPolicy(["The answer is 42."])(first["next"][:1]))
    assert second["terminated"].tolist() == [True]
    roles = [m["role"] for m in second["next", "history"].prompt.to_chats()[0]]
    assert roles == ["user", "assistant", "tool", "assistant"]


def test_hostile_tool_code_does_not_take_the_env_down():
    env = ChatEnv(max_turns=2, transforms=[PythonInterpreter(SandboxLimits(timeout_s=1))])
    state = env.reset(queries(["a", "b"]))
    hostile = "```python\nimport os\nos.kill(os.getppid(), 9)\nwhile True: pass\n```"
    transition = env.step(ScriptedPolicy([hostile, "```python\nprint('fine')\n```"])(state))
    replies = [c[-1]["content"] for c in transition["next", "history"].prompt.to_chats()]
    assert "blocked" in replies[0] or "timed out" in replies[0]
    assert "fine" in replies[1]


@pytest.mark.slow
def test_real_smollm2_episodes_on_arithmetic_and_gsm8k(tokenizer):
    from llmrl.models import load_model

    model = load_model("smollm2-135m-instruct")
    policy = TransformersWrapper(
        model, tokenizer, generate_kwargs={"max_new_tokens": 48, "seed": 0}
    )
    envs = [ArithmeticEnv(batch_size=2, repeats=2, num_problems=10)]
    if GSM8K_TRAIN.is_file():
        envs.append(GSM8KEnv(GSM8K_TRAIN, batch_size=2, repeats=2, limit=10))
    for env in envs:
        transition = env.step(policy(env.reset()))
        assert transition.batch_size == (4,)
        replies = [str(r) for r in transition["text"].response.tolist()]
        assert all(reply.strip() for reply in replies), "SmolLM2 answers every prompt"
        assert torch.isfinite(transition["reward"]).all()
        assert transition["done"].all()
