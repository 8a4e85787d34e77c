"""The env workers' envs from the stage config: ``tools`` switches the Python interpreter on
for the task (multi-turn, bounded by ``tools.max_turns``); bad values name their field."""

from __future__ import annotations

import pickle

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.core.config_loading import ConfigError
from llmrl.envs import PythonInterpreter
from llmrl.envs.tasks import ArithmeticTask
from llmrl.runtime.env_workers import TaskEnvFactory
from tests.support.configs import stage_config
from tests.support.scripted import ScriptedPolicy

TASK = ArithmeticTask()
ROWS = TASK.generate(8, seed=0)
SHARDS = {"num_workers": 2, "prompts_per_worker": 1, "num_samples": 2}  # each worker's draws


def _config(*overrides: str) -> GRPOConfig:
    return stage_config(GRPOConfig, "data.path=prepared", *overrides)


def _env(config: GRPOConfig, worker: int = 0):
    factory = TaskEnvFactory(task=TASK, rows=ROWS, seed=0, tools=config.tools, **SHARDS)
    return pickle.loads(pickle.dumps(factory))(worker)  # shipped to the worker actors


def test_tools_are_off_by_default_single_turn_episodes():
    env = _env(_config())
    assert env.max_turns == 1
    assert not [t for t in env.transforms if isinstance(t, PythonInterpreter)]
    assert env.system_prompt == TASK.instructions


def test_the_python_tool_from_the_config():
    config = _config(
        "tools.python.enabled=true",
        "tools.python.timeout_s=2.5",
        "tools.python.memory_mb=128",
        "tools.python.max_output_chars=100",
        "tools.python.max_blocks=2",
        "tools.max_turns=4",
    )
    env = _env(config)
    assert env.max_turns == 4
    [tool] = [t for t in env.transforms if isinstance(t, PythonInterpreter)]
    assert (tool.limits.timeout_s, tool.limits.memory_mb) == (2.5, 128)
    assert (tool.limits.max_output_chars, tool.max_blocks) == (100, 2)
    # the tool runs before the task's reward, which then scores the reply after the tool
    assert type(env.transforms[-1]).__name__ == "TaskReward"
    assert env.system_prompt == f"{TASK.instructions}\n\n{PythonInterpreter.instructions}"


def test_a_tool_episode_code_then_answer():
    env = _env(_config("tools.python.enabled=true", "tools.max_turns=3"))
    state = env.reset()  # one prompt x 2 samples
    answer = state["answer"].tolist()[0]
    first = env.step(ScriptedPolicy([f"```python\nprint({answer} + 0)\n```", "#### 0"])(state))
    assert first["done"].tolist() == [False, True]
    assert first["tool_called"].tolist() == [True, False]
    chat = first["next", "history"].prompt.to_chats()[0]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool"]
    assert chat[-1]["content"] == answer, "the code's output"
    second = env.step(ScriptedPolicy([f"#### {answer}"])(first["next"][:1]))
    assert second["terminated"].tolist() == [True]
    assert second["reward"].tolist() == [1.0] and second["turn"].tolist() == [1]


def test_a_model_still_calling_the_tool_at_max_turns_is_truncated():
    env = _env(_config("tools.python.enabled=true", "tools.max_turns=2"))
    state = env.reset()
    code = "```python\nprint(1)\n```"
    first = env.step(ScriptedPolicy([code, code])(state))
    second = env.step(ScriptedPolicy([code, code])(first["next"]))
    assert first["done"].tolist() == [False, False]
    assert second["truncated"].tolist() == [True, True]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tools.python.timeout_s=0", "tools.python.timeout_s: Input should be greater than 0"),
        ("tools.python.timeout_s=7200", "tools.python.timeout_s: Input should be less than"),
        ("tools.python.memory_mb=10", "tools.python.memory_mb: Input should be greater than"),
        ("tools.python.max_blocks=0", "tools.python.max_blocks: Input should be greater than"),
        ("tools.max_turns=1", "tools.max_turns: Input should be greater than or equal to 2"),
        ("tools.python.enabled=maybe", "tools.python.enabled: Input should be a valid boolean"),
        ("tools.python.timeout=3", "unknown key 'tools.python.timeout'"),
    ],
)
def test_bad_tool_settings_name_their_field(override, message):
    with pytest.raises(ConfigError) as error:
        _config(override)
    assert message in str(error.value)
