"""A stdio transport for MCP servers that stops a server whose output is not the protocol.

The SDK's ``stdio_client`` logs and drops a line that does not parse, keeps an unfinished line
in memory without bound, and cannot tell a slow tool from a server that stopped reading: a
server writing garbage wedges the call until its timeout, and then every later call. This
transport reads the server's stdout itself, one newline-terminated JSON-RPC message per line,
and stops the server (``SIGKILL`` to its process group) the moment it sees

- bytes that are not UTF-8, or a line that is not a JSON-RPC message (valid JSON included);
- a line longer than ``max_message_bytes`` (a flood without newlines);
- an unfinished line left waiting longer than ``line_timeout_s``.

:meth:`StdioGuard.stalled` tells a caller whose request timed out whether the server is wedged
(an unfinished line, or bytes it never read from its stdin) rather than slow; the pending
request then fails as the read side closes, and :class:`StdioGuard.violation` says why.

Example:
    guard = StdioGuard("calc", max_message_bytes=2**24, line_timeout_s=30)
    async with Client(guarded_stdio_client(params, sys.stderr, guard)) as client: ...
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import struct
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

import anyio

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES = 65536
EXIT_GRACE_S = 2.0  # after its stdin closes, a server has this long to exit before SIGTERM
TERM_GRACE_S = 1.0  # then this long before SIGKILL
UNREAD_GRACE_S = 0.3  # bytes left unread in its stdin this long: the server stopped reading


class ProtocolViolation(Exception):
    """The server's stdout is not the MCP stdio protocol (the message says how)."""


class StdioGuard:
    """What :func:`guarded_stdio_client` saw of one server process (one per start)."""

    def __init__(self, name: str, max_message_bytes: int, line_timeout_s: float) -> None:
        self.name = name
        self.max_message_bytes = max_message_bytes
        self.line_timeout_s = line_timeout_s
        self.violation: str | None = None
        """Why the server was stopped (None: it was not)."""
        self.process: asyncio.subprocess.Process | None = None
        self.partial_bytes = 0

    def stop(self, why: str) -> None:
        """Record ``why`` and kill the server's process group now (the read side then ends)."""
        if self.violation is None:
            self.violation = why
            logger.warning("stopping MCP server %r: %s", self.name, why)
        if self.process is not None and self.process.returncode is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def stalled(self) -> str | None:
        """Why the server is wedged rather than slow (None: it may just be slow)."""
        if self.violation is not None:
            return self.violation
        if self.partial_bytes:
            return f"it left an unfinished message ({self.partial_bytes} bytes, no newline)"
        unread = _unread_stdin_bytes(self.process)
        if unread:
            ticks = _cpu_ticks(self.process)
            await asyncio.sleep(UNREAD_GRACE_S)
            still = _unread_stdin_bytes(self.process)
            # a server that used the CPU meanwhile is slow (a loaded machine), not deaf
            busy = ticks is not None and _cpu_ticks(self.process) != ticks
            if still and still >= unread and not busy:
                return f"it stopped reading its stdin ({still} bytes unread)"
        return None

    async def messages(self, stdout: asyncio.StreamReader) -> AsyncIterator[Any]:
        """The JSON-RPC messages on ``stdout`` until EOF (raises :class:`ProtocolViolation`)."""
        from mcp_types import jsonrpc_message_adapter

        buffer = bytearray()
        started = 0.0
        while True:
            if buffer:
                left = started + self.line_timeout_s - time.monotonic()
                try:
                    chunk = await asyncio.wait_for(stdout.read(READ_CHUNK_BYTES), max(left, 0))
                except (TimeoutError, asyncio.TimeoutError):
                    raise ProtocolViolation(
                        f"it left an unfinished message ({len(buffer)} bytes, no newline) for "
                        f"{self.line_timeout_s:g} s"
                    ) from None
            else:
                chunk = await stdout.read(READ_CHUNK_BYTES)
            if not chunk:
                return
            if not buffer:
                started = time.monotonic()
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end]).rstrip(b"\r")
                del buffer[: end + 1]
                started = time.monotonic()
                if line.strip():
                    yield _parse(line, jsonrpc_message_adapter)
            self.partial_bytes = len(buffer)
            if len(buffer) > self.max_message_bytes:
                raise ProtocolViolation(
                    f"it wrote over {self.max_message_bytes} bytes without a newline "
                    "(max_message_bytes)"
                )


def _parse(line: bytes, adapter: Any) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProtocolViolation(
            f"it wrote bytes that are not UTF-8 text (byte 0x{line[error.start]:02x} at "
            f"offset {error.start}: {_preview(line)})"
        ) from None
    try:
        return adapter.validate_json(text, by_name=False)
    except ValueError:
        raise ProtocolViolation(
            f"it wrote a line that is not a JSON-RPC message: {_preview(line)}"
        ) from None


def _preview(line: bytes, limit: int = 60) -> str:
    shown = repr(line[:limit])
    return shown + (f" ... ({len(line)} bytes)" if len(line) > limit else "")


def _cpu_ticks(process: asyncio.subprocess.Process | None) -> int | None:
    """The server process's user + system CPU time in clock ticks (``/proc/<pid>/stat``), or
    None where it cannot be read (no such process, no procfs)."""
    if process is None or process.returncode is not None:
        return None
    try:
        with open(f"/proc/{process.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)


def _unread_stdin_bytes(process: asyncio.subprocess.Process | None) -> int:
    """Bytes written to the server's stdin that it has not read (our buffer and the pipe's)."""
    if process is None or process.stdin is None or process.returncode is not None:
        return 0
    transport = process.stdin.transport
    pending = transport.get_write_buffer_size()
    pipe = transport.get_extra_info("pipe")
    if pipe is None:
        return pending
    try:
        queued = fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except (OSError, ValueError):
        return pending
    return pending + struct.unpack("i", queued)[0]


@asynccontextmanager
async def guarded_stdio_client(
    params: Any, errlog: TextIO | int, guard: StdioGuard
) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP ``Transport`` for a stdio server (``StdioServerParameters``), watched by
    ``guard``: the streams the SDK's ``Client`` reads and writes."""
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await asyncio.create_subprocess_exec(
        params.command,
        *params.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=errlog,
        env=get_default_environment() | (params.env or {}),
        cwd=params.cwd,
        start_new_session=True,  # its own process group: one killpg stops its children too
    )
    guard.process = process
    to_session, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, from_session = anyio.create_memory_object_stream[Any](0)

    async def read_stdout() -> None:
        async with to_session:
            try:
                async for message in guard.messages(process.stdout):
                    await to_session.send(SessionMessage(message))
            except ProtocolViolation as violation:
                guard.stop(str(violation))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
                pass  # the session is gone

    async def write_stdin() -> None:
        try:
            async with from_session:
                async for item in from_session:
                    json = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    process.stdin.write((json + "\n").encode())
                    await process.stdin.drain()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the request would hang: end the session instead

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read_stdout)
        tasks.start_soon(write_stdin)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for stream in (read_stream, write_stream, to_session, from_session):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Close its stdin, give it :data:`EXIT_GRACE_S` to exit, then SIGTERM and SIGKILL its
    process group; every wait is bounded."""
    with suppress(OSError, RuntimeError):
        process.stdin.close()
    for grace, kill in ((EXIT_GRACE_S, signal.SIGTERM), (TERM_GRACE_S, signal.SIGKILL)):
        if await _exited(process, grace):
            break
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, kill)
    if not await _exited(process, TERM_GRACE_S):
        logger.warning("MCP server process %d survived SIGKILL; abandoning it", process.pid)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # children left in its group
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


async def _exited(process: asyncio.subprocess.Process, within_s: float) -> bool:
    """Whether the process exits within ``within_s`` (polled: ``wait()`` also waits for EOF
    on pipes that a child may hold)."""
    deadline = time.monotonic() + within_s
    while process.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True
