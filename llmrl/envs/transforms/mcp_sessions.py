"""The MCP side of :class:`~llmrl.envs.transforms.mcp_tools.MCPToolTransform`: server specs,
one SDK client session per server (stdio, watched by :mod:`~llmrl.envs.transforms.mcp_stdio`, or
streamable HTTP; restarted after a crash or a protocol violation), and the event loop in a
daemon thread that runs them for the synchronous env."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, TextIO

from llmrl.envs.transforms.mcp_stdio import StdioGuard, guarded_stdio_client

logger = logging.getLogger(__name__)

CLOSE_GRACE_S = 10.0  # the stdio shutdown is bounded by about 4 s
CALL_MARGIN_S = 1.0  # a call's backstop past its timeout, should the SDK's own not answer
MAX_MESSAGE_BYTES = 16 * 2**20


class MCPToolError(RuntimeError):
    """An MCP server could not be started, or the servers' tools clash."""


@dataclass(frozen=True)
class MCPServerSpec:
    """How to reach one MCP server: ``command`` (stdio, with ``args``, ``env``, ``cwd``) or
    ``url`` (streamable HTTP), not both; ``timeout_s`` bounds each tool call (and how long a
    stdio server may leave a message unfinished); a stdio message (one line) longer than
    ``max_message_bytes`` stops the server.

    A stdio server sees only the SDK's safe environment (``HOME``, ``PATH``, ``USER``, ...)
    plus ``env``.
    """

    name: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    timeout_s: float = 30.0
    max_message_bytes: int = MAX_MESSAGE_BYTES

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an MCP server needs a non-empty name")
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"MCP server {self.name!r}: give `command` (stdio) or `url` (streamable HTTP), "
                "exactly one of them"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"MCP server {self.name!r}: timeout_s must be > 0")
        if self.max_message_bytes < 1:
            raise ValueError(f"MCP server {self.name!r}: max_message_bytes must be >= 1")


@dataclass
class ToolInfo:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


class ServerConnection:
    """One server's client session, held open by a task of the transform's event loop.

    The session is entered and exited in :meth:`_serve` (anyio needs both in one task); calls
    come from other tasks. Used on the event loop only.
    """

    def __init__(self, spec: MCPServerSpec, stderr: TextIO | int) -> None:
        self.spec = spec
        self.stderr = stderr
        self.client: Any = None
        self.task: asyncio.Task | None = None
        self.stop: asyncio.Event | None = None
        self.ready: asyncio.Future | None = None
        self.lock = asyncio.Lock()
        self.restarts = 0
        self.failure: str | None = None  # why the current session is gone (None: it is live)
        self.guard: StdioGuard | None = None  # watches the current stdio server process

    def _transport(self) -> Any:
        from mcp import StdioServerParameters

        spec = self.spec
        self.guard = None
        if spec.url is not None:
            return spec.url
        params = StdioServerParameters(
            command=spec.command, args=list(spec.args), env=dict(spec.env) or None, cwd=spec.cwd
        )
        self.guard = StdioGuard(spec.name, spec.max_message_bytes, spec.timeout_s)
        return guarded_stdio_client(params, self.stderr, self.guard)

    @property
    def violation(self) -> str | None:
        """Why the current stdio server was stopped for breaking the protocol (None: it was
        not)."""
        return self.guard.violation if self.guard is not None else None

    async def start(self, timeout_s: float) -> list[Any]:
        """Open a session and list the server's tools (raises :class:`MCPToolError`)."""
        self.ready = ready = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.failure = None
        self.task = asyncio.create_task(self._serve(ready, self.stop))
        try:
            return await asyncio.wait_for(asyncio.shield(ready), timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            await self.close()
            raise MCPToolError(
                f"MCP server {self.spec.name!r} did not start within {timeout_s:g} s"
            ) from None
        except MCPToolError:
            await self.close()
            raise

    async def _serve(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(self._transport(), cache=None) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.client = client
                if not ready.done():
                    ready.set_result(tools)
                await stop.wait()
        except BaseException as error:  # any end of the session is reported
            if not ready.done():
                why = self.violation or _describe(error)
                ready.set_exception(
                    MCPToolError(f"MCP server {self.spec.name!r} failed to start: {why}")
                )
            else:
                logger.debug("MCP server %r session ended: %s", self.spec.name, error)
            if isinstance(error, asyncio.CancelledError):
                raise
        finally:
            self.client = None
            if self.failure is None:
                self.failure = "its session ended"

    async def close(self) -> None:
        """End the session (stops a stdio server process); idempotent."""
        task, self.task = self.task, None
        if self.stop is not None:
            self.stop.set()
        if task is None:
            return
        if self.ready is not None and not self.ready.done():
            task.cancel()  # still starting: no session to end politely
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_GRACE_S)
        except (TimeoutError, asyncio.TimeoutError):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        except BaseException as error:  # closing: log, never raise
            logger.debug("closing MCP server %r: %s", self.spec.name, error)

    async def _live_client(self, max_restarts: int, start_timeout_s: float) -> Any:
        """The open session, restarting a crashed server (raises :class:`MCPToolError`)."""
        async with self.lock:
            if self.client is not None:
                return self.client
            name = self.spec.name
            if self.restarts >= max_restarts:
                raise MCPToolError(
                    f"MCP server {name!r} is unavailable ({self.failure}; restarted "
                    f"{self.restarts} times, at most {max_restarts})"
                )
            self.restarts += 1
            logger.warning("restarting MCP server %r (%s)", name, self.failure)
            await self.close()
            try:
                await self.start(start_timeout_s)
            except MCPToolError as error:
                self.failure = str(error)
                raise MCPToolError(f"MCP server {name!r} is unavailable: {error}") from None
            return self.client

    async def call(
        self, tool: str, arguments: dict[str, Any], max_restarts: int, start_timeout_s: float
    ) -> tuple[bool, str]:
        """``(ok, text)`` of one tool call; errors become text, never exceptions."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        name, timeout_s = self.spec.name, self.spec.timeout_s
        try:
            client = await self._live_client(max_restarts, start_timeout_s)
        except MCPToolError as error:
            return False, f"Error: {error}"
        guard = self.guard
        try:
            result = await asyncio.wait_for(
                client.call_tool(tool, arguments, read_timeout_seconds=timeout_s),
                timeout_s + CALL_MARGIN_S,  # a backstop: the SDK's own timeout answers first
            )
        except (TimeoutError, asyncio.TimeoutError):
            return False, await self._timed_out(client, guard, tool, max_restarts)
        except MCPError as error:
            if error.code == REQUEST_TIMEOUT:
                return False, await self._timed_out(client, guard, tool, max_restarts)
            if error.code == CONNECTION_CLOSED:
                if guard is not None and guard.violation is not None:
                    why = f"it broke the protocol during tool {tool!r}: {guard.violation}"
                    await self._lost(client, why)
                    return False, self._broke_protocol(guard.violation, tool, max_restarts)
                await self._lost(client, f"it closed the connection during tool {tool!r}")
                return False, (
                    f"Error: MCP server {name!r} crashed or closed the connection while "
                    f"running tool {tool!r}; {self._then(max_restarts)}"
                )
            return False, f"Error: tool {tool!r} failed: {error.message}"
        except Exception as error:  # a broken session or a bad result
            if self.task is None or self.task.done():
                await self._lost(client, f"its session failed during tool {tool!r}")
            return False, f"Error: tool {tool!r} failed: {_describe(error)}"
        text = _result_text(result)
        if result.is_error:
            return False, f"Error: tool {tool!r} failed: {text}"
        return True, text

    async def _timed_out(
        self, client: Any, guard: StdioGuard | None, tool: str, max_restarts: int
    ) -> str:
        """The message of a call that timed out; a wedged stdio server (see
        :meth:`StdioGuard.stalled`) is stopped, to be restarted on the next call."""
        why = await guard.stalled() if guard is not None else None
        if why is None:  # a slow tool: the server is kept
            return f"Error: tool {tool!r} timed out after {self.spec.timeout_s:g} s (no result)"
        guard.stop(why)
        await self._lost(client, f"it broke the protocol during tool {tool!r}: {why}")
        return self._broke_protocol(why, tool, max_restarts)

    def _broke_protocol(self, why: str, tool: str, max_restarts: int) -> str:
        return (
            f"Error: MCP server {self.spec.name!r} broke the MCP protocol while running tool "
            f"{tool!r} ({why}); it was stopped, {self._then(max_restarts)}"
        )

    def _then(self, max_restarts: int) -> str:
        if self.restarts < max_restarts:
            return "it is restarted on the next call"
        return "it is not restarted again"

    async def _lost(self, client: Any, why: str) -> None:
        """Mark ``client``'s session gone (the next call restarts the server) and reap it;
        nothing when that session was already replaced."""
        async with self.lock:
            if self.client is not client:
                return
            self.failure = why
            self.client = None
            await self.close()


def _describe(error: BaseException) -> str:
    nested = getattr(error, "exceptions", None)  # an exception group
    if isinstance(nested, (list, tuple)) and nested:
        return "; ".join(_describe(e) for e in nested)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _result_text(result: Any) -> str:
    """The text of a ``CallToolResult``: its text blocks, else its structured content."""
    texts = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            texts.append(block.text)
        else:
            texts.append(f"[{kind or type(block).__name__} content not shown]")
    has_text = any(getattr(b, "type", "") == "text" for b in result.content)
    if not has_text and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(texts) if texts else "(no output)"


class SessionLoop:
    """The event loop thread and the connections; :meth:`shutdown` is the transform's
    finalizer (it must not reference the transform)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp-tools", daemon=True)
        self.thread.start()
        self.connections: dict[str, ServerConnection] = {}

    def run(self, coroutine: Any, timeout_s: float | None = None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()
            raise

    def shutdown(self) -> None:
        if self.loop.is_closed():
            return
        if self.thread.is_alive():

            async def close_all() -> None:
                await asyncio.gather(*(c.close() for c in self.connections.values()))
                left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in left:  # nothing of the sessions outlives the loop
                    task.cancel()
                await asyncio.gather(*left, return_exceptions=True)

            try:
                self.run(close_all(), CLOSE_GRACE_S + 5.0)
            except Exception as error:  # closing: log, never raise
                logger.warning("while closing the MCP servers: %s", error)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5.0)
        if not self.thread.is_alive():
            self.loop.close()


def stderr_target(stderr: TextIO | int | None) -> TextIO | int:
    """``stderr``, or this process's stderr when it is a real file, else /dev/null."""
    if stderr is not None:
        return stderr
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL
    return sys.stderr
