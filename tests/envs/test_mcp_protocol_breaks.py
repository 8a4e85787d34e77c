"""MCP servers that break the protocol (garbage bytes, an unfinished or endless message,
JSON that is not JSON-RPC, a server that stops reading): the call fails with an ``Error:`` the
model sees, the server is killed and restarted, and a slow server is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmrl.envs import ChatEnv, queries
from llmrl.envs.transforms import MCPServerSpec, MCPToolError, MCPToolTransform
from tests.support.mcp_servers import gone, pid_in
from tests.support.scripted import ScriptedPolicy

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
