"""ChatEnv: reset, step, stop conditions, what is carried to the next state."""

from __future__ import annotations

import pytest
import torch

from llmrl.data import ChatHistory, History
from llmrl.envs import ChatEnv, EnvTransform, queries
from tests.support.scripted import ScriptedPolicy


class MarkToolCalls(EnvTransform):
    """A fake tool: answers replies containing 'CALL' with a tool message."""

    is_tool = True

    def on_step(self, td):
        chats = td.get(("next", "history", "prompt")).to_chats()
        called = []
        for chat in chats:
            calls = "CALL" in chat[-1]["content"]
            called.append(calls)
            if calls:
                chat.append({"role": "tool", "content": "tool says hi"})
        td.set(("next", "history", "prompt"), History.from_chats(chats))
        td.set("tool_called", td.get("tool_called") | torch.tensor(called))
        return td


def test_reset_builds_conversations_with_the_system_prompt():
    env = ChatEnv(system_prompt="Be brief.")
    td = env.reset(queries(["2+2?", "Name a colour."], answer=["4", "red"]))
    chats = td["history"].prompt.to_chats()
    assert chats[1] == [
        {"role": "system", "content": "Be brief.", "is_complete": True},
        {"role": "user", "content": "Name a colour.", "is_complete": True},
    ]
    assert td["turn"].tolist() == [0, 0] and not td["done"].any()
    assert list(td["answer"].tolist()) == ["4", "red"]


def test_reset_from_a_history_keeps_an_existing_system_prompt():
    history = History.from_chats(
        [[{"role": "system", "content": "Own."}, {"role": "user", "content": "q"}]]
    )
    env = ChatEnv(system_prompt="Default.")
    td = env.reset(env_input := _history_input(history))
    assert td["history"].prompt.to_chats()[0][0]["content"] == "Own."
    assert env_input["history"].prompt is history, "reset must not modify its input"


def _history_input(history):
    from tensordict import TensorDict

    return TensorDict({"history": ChatHistory(prompt=history, batch_size=[1])}, batch_size=[1])


def test_step_stop_conditions():
    env = ChatEnv(max_turns=2, transforms=[MarkToolCalls()])
    state = env.reset(queries(["a", "b", "c"]))
    policy = ScriptedPolicy(["final answer", ("cut of", False), "CALL the tool"])
    transition = env.step(policy(state))
    assert transition["terminated"].tolist() == [True, False, False]
    assert transition["truncated"].tolist() == [False, True, False]
    assert transition["done"].tolist() == [True, True, False]
    next_chat = transition["next", "history"].prompt.to_chats()[2]
    assert [m["role"] for m in next_chat] == ["user", "assistant", "tool"]
    # the tool-calling row goes on; at max_turns a second tool call truncates it
    again = env.step(ScriptedPolicy(["CALL again"])(transition["next"][2:]))
    assert again["truncated"].tolist() == [True] and again["next", "turn"].tolist() == [2]


def test_next_state_carries_row_columns_but_not_policy_outputs():
    env = ChatEnv()
    state = env.reset(queries(["q"], answer=["42"], prompt_id=["row-7"]))
    transition = env.step(ScriptedPolicy(["x"])(state))
    next_keys = set(transition["next"].keys())
    assert {"answer", "prompt_id", "history", "turn", "done"} <= next_keys
    assert not next_keys & {"reward", "text", "tokens", "log_probs", "tool_called"}
    assert transition["next", "answer"].tolist() == ["42"]
    assert transition["next", "turn"].tolist() == [1] and transition["turn"].tolist() == [0]
    assert transition["reward"].tolist() == [0.0]


def test_a_continuing_state_has_the_columns_of_a_reset_state():
    # an inference actor merges fresh and continuing states into one batch: same keys
    env = ChatEnv(max_turns=2, transforms=[MarkToolCalls()])
    state = env.reset(queries(["q"], answer=["42"]))
    out = ScriptedPolicy(["CALL"])(state)
    out.set("policy_version", torch.tensor([3]))  # as an inference actor stamps its replies
    transition = env.step(out)
    assert transition["done"].tolist() == [False]
    assert set(transition["next"].keys()) == set(state.keys())
    assert transition["policy_version"].tolist() == [3], "the transition keeps its stamp"


def test_errors_name_what_is_missing():
    env = ChatEnv()
    with pytest.raises(ValueError, match="reset needs prompts"):
        env.reset()
    from tensordict import TensorDict

    with pytest.raises(KeyError, match=r"reset needs 'query' strings .* keys present: \['x'\]"):
        env.reset(TensorDict({"x": torch.zeros(1)}, [1]))
    with pytest.raises(KeyError, match=r"step needs the policy's \('history', 'full'\)"):
        env.step(env.reset(queries(["q"])))
    with pytest.raises(ValueError, match="max_turns must be >= 1, got 0"):
        ChatEnv(max_turns=0)
    with pytest.raises(TypeError, match="expected an EnvTransform, got str"):
        ChatEnv().append_transform("reward")
