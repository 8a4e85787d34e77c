"""`MCPToolTransform`: the tools of MCP servers, called by the assistant from a chat env.

The transform starts the configured `Model Context Protocol <https://modelcontextprotocol.io>`_
servers with the official ``mcp`` SDK client (stdio: ``command``, ``args``, ``env``, ``cwd``;
or streamable HTTP: ``url``), lists their tools and tells the model about them in the system
prompt, then answers every tool call of an assistant reply with a ``tool`` message.

Tool-call format (the Qwen / Hermes convention), anywhere in the assistant reply::

    <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>

``arguments`` (a JSON object) may be left out when the tool takes none. A reply may hold
several calls (at most ``max_calls`` run, in order); the closing tag may be missing at the very
end of the reply (a reply cut at a stop string). The results of one reply's calls form one
``tool`` message (in call order, separated by blank lines): a tool's text content, else its
structured content as JSON, cut to ``max_output_chars``. The row is marked ``tool_called`` and
the episode goes on to another turn (see :class:`~llmrl.envs.ChatEnv`).

Failures never stop the env: the model gets a ``tool`` message starting with ``Error:`` that
says what went wrong, and the env keeps serving:

- malformed call (not JSON, not an object, no ``name``, ``arguments`` not an object), or an
  unknown tool: the message shows the expected format / lists the available tools;
- the tool reports an error (``isError``, e.g. it raised or its arguments did not validate):
  ``Error: tool 'x' failed: <the server's message>``;
- the call takes longer than its server's ``timeout_s``: ``Error: tool 'x' timed out ...``.
  The server is kept (a slow tool does not take down the others' calls);
- the server crashed or closed the connection: the call reports it, and the server is
  **restarted on the next call** to one of its tools, at most ``max_restarts`` times over the
  transform's life; past that (or when a restart fails) its tools answer
  ``Error: MCP server 'x' is unavailable ...``.

Tool names must be unique across servers: a clash is refused at start with an error naming the
tool and both servers (the model calls plain tool names, as MCP servers define them).

Lifecycle: the MCP SDK is asyncio-based while the env is synchronous, so the transform owns one
event loop in a daemon thread; every server's session lives there, opened at construction
(a server that does not start within ``start_timeout_s`` fails the construction with
:class:`MCPToolError`) and kept open across calls. :meth:`MCPToolTransform.close` (called by
:meth:`ChatEnv.close <llmrl.envs.ChatEnv.close>`, at interpreter exit, or by leaving a ``with``
block) closes the sessions and stops the stdio server processes (the SDK closes their stdin,
then terminates and kills their process group). A stdio server also exits when its client
process dies (its stdin closes).

Config (GRPO stage, see :class:`llmrl.config.common.MCPToolSettings`)::

    tools:
      max_turns: 4
      mcp:
        enabled: true
        servers:
          - {name: calc, command: python, args: [calc_server.py], env: {KEY: value}, timeout_s: 10}
          - {name: search, url: "http://localhost:8000/mcp"}

The Python tool (``tools.python``) may be on at the same time: each answers its own call
format, and a reply with both a python block and a tool call gets both tool messages.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import torch
from tensordict import TensorDictBase

from llmrl.data import History
from llmrl.envs.transforms.base import EnvTransform
from llmrl.envs.transforms.mcp_sessions import (
    MCPServerSpec,
    MCPToolError,
    ServerConnection,
    SessionLoop,
    ToolInfo,
    stderr_target,
)

logger = logging.getLogger(__name__)

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
"""A tool call: ``<tool_call>JSON</tool_call>`` (the closing tag may end the reply unwritten)."""
CALL_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>'


def parse_tool_calls(reply: str) -> list[dict[str, Any] | str]:
    """The tool calls of a reply, in order: ``{"name", "arguments"}`` dicts, or for a malformed
    call, the error message the model gets (see the module docstring for the format)."""
    calls: list[dict[str, Any] | str] = []
    for match in TOOL_CALL.finditer(reply):
        body = match.group(1).strip()
        problem = None
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            problem = f"invalid JSON ({error})"
        else:
            if not isinstance(call, dict):
                problem = f"expected a JSON object, got {type(call).__name__}"
            elif not isinstance(call.get("name"), str) or not call["name"]:
                problem = 'the object has no "name" string'
            elif not isinstance(call.get("arguments", {}), dict):
                problem = '"arguments" must be a JSON object'
        if problem is not None:
            calls.append(f"Error: malformed tool call: {problem}. Call a tool as {CALL_FORMAT}")
        else:
            calls.append({"name": call["name"], "arguments": call.get("arguments", {})})
    return calls


class MCPToolTransform(EnvTransform):
    """The tools of MCP servers for chat envs (see the module docstring).

    Args:
        servers: the servers (:class:`MCPServerSpec`, or mappings of its fields).
        max_calls: tool calls run per reply, at most (the rest are reported as not run).
        max_output_chars: a tool result is cut to this many characters.
        start_timeout_s: limit for a server to start and list its tools (also on a restart).
        max_restarts: restarts of a crashed server over the transform's life, per server.
        role: the role of the answering messages.
        add_instructions: add :attr:`instructions` (the tool list and the call format) to the
            system prompt at reset, unless the system prompt already holds them.
        stderr: where stdio servers write their stderr (default: this process's stderr).

    Example:
        tools = MCPToolTransform([MCPServerSpec("calc", sys.executable, ["calc.py"])])
        env = ChatEnv(max_turns=3, transforms=[tools])
        # episodes: env.reset(...), then env.step(...) until done; tool calls reach "calc"
        env.close()  # stops the servers
    """

    is_tool = True

    def __init__(
        self,
        servers: Sequence[MCPServerSpec | Mapping[str, Any]],
        max_calls: int = 4,
        max_output_chars: int = 4000,
        start_timeout_s: float = 30.0,
        max_restarts: int = 3,
        role: str = "tool",
        add_instructions: bool = True,
        stderr: TextIO | int | None = None,
        history_key: str = "history",
    ) -> None:
        specs = [s if isinstance(s, MCPServerSpec) else MCPServerSpec(**s) for s in servers]
        if not specs:
            raise ValueError("MCPToolTransform needs at least one server")
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"MCP server names must be unique, got {names}")
        if max_calls < 1 or max_output_chars < 1 or max_restarts < 0 or start_timeout_s <= 0:
            raise ValueError(
                "need max_calls >= 1, max_output_chars >= 1, max_restarts >= 0 and "
                "start_timeout_s > 0"
            )
        self.specs = specs
        self.max_calls = max_calls
        self.max_output_chars = max_output_chars
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.role = role
        self.add_instructions = add_instructions
        self.history_key = history_key
        self.calls = 0
        self.errors = 0
        self.tools: dict[str, ToolInfo] = {}
        self._runtime = SessionLoop()
        self._finalizer = weakref.finalize(self, self._runtime.shutdown)
        try:
            self._start(stderr_target(stderr))
        except BaseException:
            self.close()
            raise

    def _start(self, stderr: TextIO | int) -> None:
        runtime = self._runtime

        async def start_all() -> list[Any]:
            for spec in self.specs:
                runtime.connections[spec.name] = ServerConnection(spec, stderr)
            return await asyncio.gather(
                *(c.start(self.start_timeout_s) for c in runtime.connections.values()),
                return_exceptions=True,
            )

        listings = runtime.run(start_all())
        failures = [str(x) for x in listings if isinstance(x, BaseException)]
        if failures:
            raise MCPToolError("; ".join(failures))
        for spec, listing in zip(self.specs, listings, strict=True):
            for tool in listing:
                known = self.tools.get(tool.name)
                if known is not None:
                    raise MCPToolError(
                        f"MCP tool name clash: {tool.name!r} is a tool of servers "
                        f"{known.server!r} and {spec.name!r}; tool names must be unique"
                    )
                self.tools[tool.name] = ToolInfo(
                    spec.name, tool.name, tool.description or "", dict(tool.input_schema or {})
                )

    # ------------------------------------------------------------------ the model's view
    @property
    def instructions(self) -> str:
        """What the system prompt tells the model: the call format and the tools (name,
        description, JSON schema of the arguments)."""
        listed = "\n".join(
            json.dumps({"name": t.name, "description": t.description, "parameters": t.input_schema})
            for t in self.tools.values()
        )
        return (
            "You can call tools. To call one, write\n"
            f"{CALL_FORMAT}\n"
            "and its result comes back to you in the next message. Once you know the answer, "
            f"reply without a tool call.\nThe tools:\n<tools>\n{listed}\n</tools>"
        )

    def call_tool(self, name: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Call one tool by name; returns the text the model would get (errors included)."""
        return self._runtime.run(self._call(name, dict(arguments or {})))

    def run_reply(self, reply: str) -> str | None:
        """The tool message for one assistant reply, or None when it calls no tool."""
        outputs = self._runtime.run(self._answer_all([reply]))
        return outputs[0]

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls += 1
        tool = self.tools.get(name)
        if tool is None:
            self.errors += 1
            available = ", ".join(self.tools) or "none"
            return f"Error: unknown tool {name!r}. Available tools: {available}"
        connection = self._runtime.connections[tool.server]
        ok, text = await connection.call(name, arguments, self.max_restarts, self.start_timeout_s)
        self.errors += not ok
        if len(text) > self.max_output_chars:
            cut = len(text) - self.max_output_chars
            text = f"{text[: self.max_output_chars]}\n[... {cut} more characters cut]"
        return text

    async def _answer(self, reply: str) -> str | None:
        calls = parse_tool_calls(reply)
        if not calls:
            return None
        results = []
        for call in calls[: self.max_calls]:
            if isinstance(call, str):  # malformed: the message says so
                self.calls += 1
                self.errors += 1
                results.append(call)
            else:
                results.append(await self._call(call["name"], call["arguments"]))
        if len(calls) > self.max_calls:
            skipped = len(calls) - self.max_calls
            results.append(
                f"[{skipped} more tool calls not run: at most {self.max_calls} per reply]"
            )
        return "\n\n".join(results)

    async def _answer_all(self, replies: list[str]) -> list[str | None]:
        return list(await asyncio.gather(*(self._answer(reply) for reply in replies)))

    # ------------------------------------------------------------------ env hooks
    def on_reset(self, td: TensorDictBase) -> TensorDictBase:
        if not self.add_instructions:
            return td
        key = (self.history_key, "prompt")
        chats = td.get(key).to_chats()
        instructions = self.instructions
        changed = False
        for chat in chats:
            if chat and chat[0]["role"] == "system":
                if instructions not in chat[0]["content"]:
                    chat[0] = {**chat[0], "content": f"{chat[0]['content']}\n\n{instructions}"}
                    changed = True
            else:
                chat.insert(0, {"role": "system", "content": instructions})
                changed = True
        if changed:
            td.set(key, History.from_chats(chats))
        return td

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        self._check_open()
        key = ("next", self.history_key, "prompt")
        chats = td.get(key).to_chats()
        replies = [_reply_of(chat) for chat in chats]
        outputs = self._runtime.run(self._answer_all(replies))
        called = torch.tensor([output is not None for output in outputs], dtype=torch.bool)
        if called.any():
            for chat, output in zip(chats, outputs, strict=True):
                if output is not None:
                    chat.append({"role": self.role, "content": output})
            td.set(key, History.from_chats(chats))
        td.set("tool_called", td.get("tool_called") | called)
        return td

    # ------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("MCPToolTransform is closed")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the servers are stopped)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Close the sessions and stop the servers and the event loop thread (idempotent)."""
        self._finalizer()

    def __enter__(self) -> MCPToolTransform:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MCPToolTransform(servers={[s.name for s in self.specs]}, tools={list(self.tools)})"


def _reply_of(chat: list[dict[str, Any]]) -> str:
    """The step's assistant reply: the last message, or the last before the tool messages
    that earlier tool transforms (e.g. the Python interpreter) appended in this step."""
    for message in reversed(chat):
        if message["role"] == "assistant":
            return message["content"]
        if message["role"] != "tool":
            break
    return ""
