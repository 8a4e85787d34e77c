"""The MCP test server of ``tests/envs`` (the SDK's ``MCPServer``, written into a temporary
folder by the ``server_script`` fixture) and helpers to start it and watch its process."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from llmrl.envs.transforms import MCPServerSpec

CALC_SERVER = '''
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
