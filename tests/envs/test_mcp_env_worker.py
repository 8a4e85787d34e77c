"""MCP tools in the GRPO env workers' env: configured by ``tools.mcp``, next to the Python
tool and before the reward; off by default."""

from __future__ import annotations

import pickle
import sys

from llmrl.config.grpo import GRPOConfig
from llmrl.envs import PythonInterpreter
from llmrl.envs.tasks import ArithmeticTask
from llmrl.envs.transforms import MCPToolTransform
from llmrl.runtime.env_workers import TaskEnvFactory
from tests.support.configs import stage_config
from tests.support.mcp_servers import ADD, gone, pid_in
from tests.support.scripted import ScriptedPolicy

TASK = ArithmeticTask()
ROWS = TASK.generate(8, seed=0)
SHARDS = {"num_workers": 2, "prompts_per_worker": 1, "num_samples": 2}  # each worker's draws


def _worker_env(*overrides: str):
    config = stage_config(GRPOConfig, "data.path=prepared", *overrides)
    factory = TaskEnvFactory(task=TASK, rows=ROWS, seed=0, tools=config.tools, **SHARDS)
    return pickle.loads(pickle.dumps(factory))(0)  # as shipped to an env worker actor


def test_env_worker_env_with_mcp_and_python_tools(server_script, tmp_path):
    server = (
        f"tools.mcp.servers=[{{name: calc, command: {sys.executable}, "
        f"args: [{server_script}, {tmp_path / 'pid'}], timeout_s: 5}}]"
    )
    env = _worker_env(
        "tools.mcp.enabled=true", server, "tools.python.enabled=true", "tools.max_turns=3"
    )
    try:
        [tool] = [t for t in env.transforms if isinstance(t, MCPToolTransform)]
        assert [t for t in env.transforms if isinstance(t, PythonInterpreter)]
        assert type(env.transforms[-1]).__name__ == "TaskReward", "tools before the reward"
        assert env.max_turns == 3
        assert env.system_prompt == (
            f"{TASK.instructions}\n\n{PythonInterpreter.instructions}\n\n{tool.instructions}"
        )
        state = env.reset()
        system = state["history"].prompt.to_chats()[0][0]["content"]
        assert system == env.system_prompt, "the tool list is not added twice"
        answer = state["answer"].tolist()[0]
        call = f'<tool_call>{{"name": "add", "arguments": {{"a": {answer}, "b": 0}}}}</tool_call>'
        both = f"```python\nprint(7)\n```\n{ADD}"  # each tool answers its own call
        first = env.step(ScriptedPolicy([call, both])(state))
        assert first["tool_called"].tolist() == [True, True]
        chats = first["next", "history"].prompt.to_chats()
        assert (chats[0][-1]["role"], chats[0][-1]["content"]) == ("tool", answer)
        assert [m["role"] for m in chats[1][-3:]] == ["assistant", "tool", "tool"]
        assert [m["content"] for m in chats[1][-2:]] == ["7", "5"], "python's, then MCP's"
        second = env.step(ScriptedPolicy([f"#### {answer}", "#### 0"])(first["next"]))
        assert second["terminated"].tolist() == [True, True]
        assert second["reward"].tolist()[0] == 1.0
    finally:
        env.close()
    assert gone(pid_in(tmp_path / "pid"))


def test_mcp_tools_off_by_default():
    env = _worker_env()
    assert not [t for t in env.transforms if isinstance(t, MCPToolTransform)]
    assert env.max_turns == 1
