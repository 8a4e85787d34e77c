"""MCP tools on a chat env: real MCP servers (the SDK's ``MCPServer``, written into a temporary
folder) started over stdio (and streamable HTTP) by :class:`MCPToolTransform`.

A scripted policy calls the tools; every failure (unknown tool, malformed call, tool error,
timeout, crash) gives the model an ``Error:`` tool message and the env keeps serving; closing
the env stops the server processes.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmrl.config.grpo import GRPOConfig
from llmrl.envs import ChatEnv, PythonInterpreter, queries
from llmrl.envs.tasks import ArithmeticTask
from llmrl.envs.transforms import MCPServerSpec, MCPToolError, MCPToolTransform
from llmrl.envs.transforms.mcp_tools import parse_tool_calls
from llmrl.runtime.env_workers import TaskEnvFactory
from tests.support.configs import stage_config
from tests.support.scripted import ScriptedPolicy

SERVER = '''
"""A small MCP server for tests: argv[1] is a file it writes its pid to; `--http PORT` serves
streamable HTTP on 127.0.0.1 instead of stdio."""
import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
server = MCPServer("calc", log_level="ERROR")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep for `seconds`, then say so."""
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ToolError("no luck today")


@server.tool()
def crash() -> str:
    """Kills the server."""
    os._exit(3)


if "--http" in sys.argv:
    port = int(sys.argv[sys.argv.index("--http") + 1])
    server.run("streamable-http", host="127.0.0.1", port=port)
else:
    server.run("stdio")
'''

ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def server_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "calc_server.py"
    path.write_text(SERVER)
    return path


def spec(script: Path, pid_file: Path, name: str = "calc", **options) -> MCPServerSpec:
    return MCPServerSpec(name, sys.executable, [str(script), str(pid_file)], **options)


def pid_in(path: Path) -> int:
    return int(path.read_text())


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` is gone (exited and reaped), waiting up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


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


# ---------------------------------------------------------------- the GRPO env workers' env
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


# ---------------------------------------------------------------- servers that break the protocol
RAW_SERVER = r'''
"""A hand-written stdio MCP server: argv[1] is a file it writes its pid to. Its one tool, `act`,
answers "ok", or with `mode` breaks the protocol: "binary" garbage, a "partial" line that never
ends, a "flood" of bytes without a newline, "notrpc" JSON, "deafen": answers, then stops reading
its stdin, "busy": answers, then computes without reading. `--banner` writes a non-protocol line
before anything else."""
import json
import os
import sys
import time

with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
if "--banner" in sys.argv:
    os.write(1, b"\x1b[32mServer ready!\x1b[0m\n")


def send(message):
    os.write(1, (json.dumps(message) + "\n").encode())


def forever():
    while True:
        time.sleep(60)


MODE = {"type": "object", "properties": {"mode": {"type": "string"}}}
TOOL = {"name": "act", "inputSchema": MODE}
for line in sys.stdin.buffer:
    request = json.loads(line)
    method, rid = request.get("method"), request.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [TOOL]}})
    elif method == "tools/call":
        mode = request["params"].get("arguments", {}).get("mode", "ok")
        if mode == "binary":
            os.write(1, b"\xff\xfe\x00\x1b[2J garbage \x89PNG\r\n")
        elif mode == "partial":
            os.write(1, b'{"jsonrpc": "2.0", "id": ' + str(rid).encode())
        elif mode == "flood":
            os.write(1, b"A" * (4 * 2**20))
        elif mode == "notrpc":
            os.write(1, b'{"hello": "world"}\n')
        else:
            send({"jsonrpc": "2.0", "id": rid,
                  "result": {"content": [{"type": "text", "text": "ok"}], "isError": False}})
            if mode == "deafen":
                forever()
            if mode == "busy":  # a loaded machine: the server computes and reads nothing
                while True:
                    pass
            continue
        forever()
    elif rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
'''
RAW_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def raw_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("raw") / "raw_server.py"
    path.write_text(RAW_SERVER)
    return path


@pytest.fixture(scope="module")
def raw(raw_script: Path, tmp_path_factory: pytest.TempPathFactory):
    """One transform over the raw server, shared by the attacks; closing it leaves nothing."""
    import psutil

    pid_file = tmp_path_factory.mktemp("raw-pid") / "pid"
    server = MCPServerSpec(
        "raw", sys.executable, [str(raw_script), str(pid_file)], timeout_s=RAW_TIMEOUT_S,
        max_message_bytes=2**20,
    )  # fmt: skip

    def children() -> set[int]:
        return {child.pid for child in psutil.Process().children(recursive=True)}

    others, threads = children(), set(threading.enumerate())  # other fixtures' servers
    tool = MCPToolTransform([server], max_restarts=20, stderr=subprocess.DEVNULL)
    tool.pid_file = pid_file
    yield tool
    tool.close()
    assert gone(pid_in(pid_file))
    assert not children() - others, "no server process is left"
    assert not tool._runtime.thread.is_alive() and tool._runtime.loop.is_closed()
    assert not set(threading.enumerate()) - threads, "no thread is left (waitpid's included)"


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("binary", "bytes that are not UTF-8 text (byte 0xff at offset 0"),
        ("partial", "unfinished message"),
        ("flood", "bytes without a newline (max_message_bytes)"),
        ("notrpc", 'not a JSON-RPC message: b\'{"hello": "world"}\''),
        ("deafen", "it stopped reading its stdin"),
    ],
)
def test_a_server_breaking_the_protocol_is_stopped_and_restarted(raw, mode, reason):
    pid = pid_in(raw.pid_file)
    if mode == "deafen":  # answers, then reads no more: the next call is never read
        assert raw.call_tool("act", {"mode": "deafen"}) == "ok"
    start = time.monotonic()
    message = raw.call_tool("act", {"mode": mode if mode != "deafen" else "ok"})
    elapsed = time.monotonic() - start
    assert message.startswith("Error: MCP server 'raw' broke the MCP protocol while running tool")
    assert reason in message and "restarted on the next call" in message
    assert "\x1b" not in message and "\x00" not in message, "the garbage is shown escaped"
    assert elapsed < RAW_TIMEOUT_S + 1.5, f"detected within the timeout ({elapsed:.1f} s)"
    assert gone(pid, within_s=1.0), "the broken server is killed"
    assert raw.call_tool("act", {"mode": "ok"}) == "ok", "a fresh server serves the next call"
    assert pid_in(raw.pid_file) != pid


def test_a_server_busy_computing_is_slow_not_deaf(raw):
    """Unread bytes in a server's stdin while it uses the CPU: a slow server (a loaded machine),
    kept, not a protocol break."""
    assert raw.call_tool("act", {"mode": "busy"}) == "ok"
    pid = pid_in(raw.pid_file)
    try:
        message = raw.call_tool("act", {"mode": "ok"})
        assert message == f"Error: tool 'act' timed out after {RAW_TIMEOUT_S:g} s (no result)"
        os.kill(pid, 0)  # kept: still running
    finally:
        os.kill(pid, signal.SIGKILL)
    assert gone(pid, within_s=5.0)
    # killed between calls: the next call (or, if it first hears of the death, the one after)
    # starts a fresh server
    replies = [raw.call_tool("act", {"mode": "ok"}) for _ in range(2)]
    assert replies[-1] == "ok", replies


def test_a_broken_server_in_an_episode_is_a_tool_message(raw):
    env = ChatEnv(max_turns=3, transforms=[raw])
    state = env.reset(queries(["q", "q"]))
    garbage = '<tool_call>{"name": "act", "arguments": {"mode": "binary"}}</tool_call>'
    out = env.step(ScriptedPolicy([garbage, "no tool"])(state))
    assert out["tool_called"].tolist() == [True, False], "the episode goes on"
    message = out["next", "history"].prompt.to_chats()[0][-1]
    assert message["role"] == "tool" and "broke the MCP protocol" in message["content"]
    assert raw.call_tool("act") == "ok"


def test_a_server_writing_garbage_at_start_is_reported(raw_script, tmp_path):
    banner = MCPServerSpec(
        "banner", sys.executable, [str(raw_script), str(tmp_path / "p"), "--banner"]
    )
    with pytest.raises(MCPToolError, match=r"'banner' failed to start: .*not a JSON-RPC message"):
        MCPToolTransform([banner], start_timeout_s=10, stderr=subprocess.DEVNULL)
    assert gone(pid_in(tmp_path / "p"), within_s=1.0)
