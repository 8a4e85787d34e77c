"""The MCP servers' lifecycle: a crashed server is restarted (up to ``max_restarts``),
closing the env stops them, and a start that fails (a clash of tool names, a server that exits
or never answers) is reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmrl.envs import ChatEnv, queries
from llmrl.envs.transforms import MCPServerSpec, MCPToolError, MCPToolTransform
from tests.support.mcp_servers import ADD, gone, pid_in, spec
from tests.support.scripted import ScriptedPolicy


def test_a_crashed_server_is_restarted_on_the_next_call_then_unavailable(server_script, tmp_path):
    pid_file = tmp_path / "pid"
    tool = MCPToolTransform(
        [spec(server_script, pid_file)], max_restarts=1, stderr=subprocess.DEVNULL
    )
    env = ChatEnv(max_turns=3, transforms=[tool])
    try:
        first_pid = pid_in(pid_file)
        state = env.reset(queries(["q"]))
        out = env.step(ScriptedPolicy(['<tool_call>{"name": "crash"}</tool_call>'])(state))
        message = out["next", "history"].prompt.to_chats()[0][-1]["content"]
        assert message.startswith("Error: MCP server 'calc' crashed")
        assert "restarted on the next call" in message
        assert gone(first_pid), "the crashed server is reaped"
        # the next call restarts it: a new process answers
        out = env.step(ScriptedPolicy([ADD])(out["next"]))
        assert out["next", "history"].prompt.to_chats()[0][-1]["content"] == "5"
        second_pid = pid_in(pid_file)
        assert second_pid != first_pid
        # a second crash: max_restarts=1 is used up, its tools are reported unavailable
        assert "not restarted again" in tool.call_tool("crash")
        assert gone(second_pid)
        unavailable = tool.call_tool("add", {"a": 1, "b": 2})
        assert unavailable.startswith("Error: MCP server 'calc' is unavailable")
        assert "unknown tool" in tool.call_tool("nope"), "the transform itself keeps serving"
    finally:
        env.close()


def test_closing_the_env_stops_the_server_process(server_script, tmp_path):
    pid_file = tmp_path / "pid"
    tool = MCPToolTransform([spec(server_script, pid_file)], stderr=subprocess.DEVNULL)
    env = ChatEnv(max_turns=2, transforms=[tool])
    pid = pid_in(pid_file)
    assert tool.call_tool("add", {"a": 1, "b": 1}) == "2"
    os.kill(pid, 0)  # alive
    env.close()
    assert tool.closed and gone(pid, within_s=0.5), "stopped by close(), not later"
    assert not tool._runtime.thread.is_alive(), "the event loop thread ends"
    env.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        env.step(ScriptedPolicy([ADD])(env.reset(queries(["q"]))))


def test_tool_name_clash_across_servers_is_refused_at_start(server_script, tmp_path):
    servers = [
        spec(server_script, tmp_path / "a", "one"),
        spec(server_script, tmp_path / "b", "two"),
    ]
    with pytest.raises(MCPToolError, match=r"'add' is a tool of servers 'one' and 'two'"):
        MCPToolTransform(servers, stderr=subprocess.DEVNULL)
    assert gone(pid_in(tmp_path / "a")) and gone(pid_in(tmp_path / "b")), "both stopped"


def test_a_server_that_does_not_start_is_reported(tmp_path):
    exits = MCPServerSpec("broken", sys.executable, ["-c", "raise SystemExit(1)"])
    with pytest.raises(MCPToolError, match="MCP server 'broken' failed to start"):
        MCPToolTransform([exits], start_timeout_s=10, stderr=subprocess.DEVNULL)
    mute = MCPServerSpec("mute", sys.executable, ["-c", "import sys; sys.stdin.read()"])
    with pytest.raises(MCPToolError, match=r"MCP server 'mute' did not start within 0\.5 s"):
        MCPToolTransform([mute], start_timeout_s=0.5, stderr=subprocess.DEVNULL)
    with pytest.raises(ValueError, match="exactly one of them"):
        MCPServerSpec("both", command="x", url="http://h")
