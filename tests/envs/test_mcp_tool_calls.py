"""MCP tools on a chat env: real MCP servers (the SDK's ``MCPServer``, written into a temporary
folder) started over stdio (and streamable HTTP) by :class:`MCPToolTransform`.

A scripted policy calls the tools; every failure (unknown tool, malformed call, tool error,
timeout, crash) gives the model an ``Error:`` tool message and the env keeps serving; closing
the env stops the server processes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmrl.envs import ChatEnv, queries
from llmrl.envs.transforms import MCPServerSpec, MCPToolTransform
from llmrl.envs.transforms.mcp_tools import parse_tool_calls
from tests.support.mcp_servers import ADD, gone, pid_in, spec
from tests.support.scripted import ScriptedPolicy


@pytest.fixture(scope="module")
def calc(server_script: Path, tmp_path_factory: pytest.TempPathFactory):
    """One server for the module's tests that neither crash nor close it."""
    pid_file = tmp_path_factory.mktemp("calc") / "pid"
    tool = MCPToolTransform(
        [spec(server_script, pid_file, timeout_s=1.5)], stderr=subprocess.DEVNULL
    )
    yield tool
    tool.close()
    assert gone(pid_in(pid_file))


def test_tools_are_listed_in_the_system_prompt(calc):
    assert set(calc.tools) == {"add", "sleep", "fail", "crash"}
    env = ChatEnv(system_prompt="Be brief.", max_turns=3, transforms=[calc])
    state = env.reset(queries(["What is 2 + 3?"]))
    system = state["history"].prompt.to_chats()[0][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n")
    assert '<tool_call>{"name": "<tool name>"' in system["content"]
    assert '"name": "add", "description": "Add two integers."' in system["content"]
    assert '"required": ["a", "b"]' in system["content"], "the input schema"
    # a system prompt that already holds the instructions is left alone; none: one is added
    again = ChatEnv(system_prompt=f"Go.\n\n{calc.instructions}", transforms=[calc])
    assert (
        again.reset(queries(["x"]))["history"].prompt.to_chats()[0][0]["content"].count("<tools>")
        == 1
    )
    bare = ChatEnv(transforms=[calc]).reset(queries(["x"]))["history"].prompt.to_chats()[0]
    assert [m["role"] for m in bare] == ["system", "user"]


def test_multi_turn_episode_calls_add_then_answers(calc):
    env = ChatEnv(system_prompt="Be brief.", max_turns=3, transforms=[calc])
    state = env.reset(queries(["What is 2 + 3?", "Say hi"]))
    first = env.step(ScriptedPolicy([f"Let me add.\n{ADD}", "hi"])(state))
    assert first["tool_called"].tolist() == [True, False]
    assert first["done"].tolist() == [False, True]
    chat = first["next", "history"].prompt.to_chats()[0]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool"]
    assert chat[-1]["content"] == "5", "the tool's result"
    second = env.step(ScriptedPolicy(["The answer is 5."])(first["next"][:1]))
    assert second["terminated"].tolist() == [True]
    assert second["tool_called"].tolist() == [False]
    final = second["next", "history"].prompt.to_chats()[0]
    assert [m["role"] for m in final][-3:] == ["assistant", "tool", "assistant"]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('<tool_call>{"name": "divide", "arguments": {}}</tool_call>', "unknown tool 'divide'"),
        ('<tool_call>{"name": add, "arguments": {}}</tool_call>', "malformed tool call: invalid"),
        ('<tool_call>["add", 2, 3]</tool_call>', "malformed tool call: expected a JSON object"),
        ('<tool_call>{"arguments": {"a": 1}}</tool_call>', "malformed tool call: the object has"),
        ('<tool_call>{"name": "add", "arguments": [2]}</tool_call>', 'malformed tool call: "arg'),
        ('<tool_call>{"name": "fail"}</tool_call>', "no luck today"),
        ('<tool_call>{"name": "add", "arguments": {"a": "x"}}</tool_call>', "tool 'add' failed"),
        ('<tool_call>{"name": "sleep", "arguments": {"seconds": 60}}', "timed out after 1.5 s"),
    ],
)
def test_a_failed_call_tells_the_model_and_the_env_keeps_serving(calc, reply, expected):
    env = ChatEnv(max_turns=3, transforms=[calc])
    state = env.reset(queries(["q", "q"]))
    out = env.step(ScriptedPolicy([reply, ADD])(state))
    assert out["tool_called"].tolist() == [True, True], "an error is an answer: another turn"
    error, ok = (chat[-1] for chat in out["next", "history"].prompt.to_chats())
    assert error["role"] == "tool" and error["content"].startswith("Error: ")
    assert expected in error["content"]
    if "malformed" in expected:
        assert '<tool_call>{"name": "<tool name>"' in error["content"], "shows the format"
    if "unknown" in expected:
        assert "Available tools: add, sleep, fail, crash" in error["content"]
    assert ok["content"] == "5", "the other row's call is answered"
    assert calc.call_tool("add", {"a": 1, "b": 1}) == "2", "the server still serves"


def test_several_calls_in_one_reply_and_the_limit(server_script, tmp_path):
    assert parse_tool_calls("no call here") == []
    assert (
        parse_tool_calls(f"{ADD} and {ADD}") == [{"name": "add", "arguments": {"a": 2, "b": 3}}] * 2
    )
    assert parse_tool_calls('<tool_call>{"name": "fail"}') == [{"name": "fail", "arguments": {}}]
    with MCPToolTransform(
        [spec(server_script, tmp_path / "pid")], max_calls=2, stderr=subprocess.DEVNULL
    ) as tool:
        two = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
        assert tool.run_reply(f"{ADD}\n{two}") == "5\n\n2"
        assert (
            tool.run_reply(ADD * 3) == "5\n\n5\n\n[1 more tool calls not run: at most 2 per reply]"
        )
        assert tool.run_reply("no tool") is None
    assert gone(pid_in(tmp_path / "pid"))


def test_a_streamable_http_server(server_script, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(server_script), str(tmp_path / "pid"), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "server up"
                time.sleep(0.05)
        remote = MCPServerSpec("remote", url=f"http://127.0.0.1:{port}/mcp", timeout_s=5)
        with MCPToolTransform([remote]) as tool:
            assert "add" in tool.tools
            assert tool.run_reply(ADD) == "5"
            assert "no luck today" in tool.call_tool("fail")
    finally:
        process.kill()
        process.wait()
