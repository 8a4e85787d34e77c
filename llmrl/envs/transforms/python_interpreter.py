"""`PythonInterpreter`: runs the assistant's ```python blocks and answers with their output.

Each block of a reply runs in :func:`llmrl.envs.sandbox.run_python` (a separate process under
bubblewrap, with a wall-clock timeout, memory and output limits, no network, its own temporary
directory and a scrubbed environment; ``limits.os_sandbox`` says whether bubblewrap is
required). The combined result is appended to the conversation as a message from ``role``
(``tool`` by default) in ``("next", "history", "prompt")``, and the row is marked
``tool_called`` so the episode continues.
Rows run in parallel threads; a hostile snippet only ever produces an error message. At most
``max_blocks`` blocks of one reply run (one after another), so a reply made of many endless
loops holds a step for at most ``max_blocks * limits.timeout_s`` seconds; the rest are
reported as not run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from tensordict import TensorDictBase

from llmrl.data import History
from llmrl.envs.sandbox import SandboxLimits, extract_python_blocks, run_python
from llmrl.envs.transforms.base import EnvTransform


class PythonInterpreter(EnvTransform):
    """A code-execution tool for chat envs (see the module docstring).

    Example:
        env = ChatEnv(max_turns=3, transforms=[PythonInterpreter(SandboxLimits(timeout_s=2))])
    """

    is_tool = True
    instructions = (
        "You can run Python: write a ```python code block and its output comes back to you in "
        "the next message. Once you know the answer, reply without a code block."
    )
    """What a system prompt tells the model about this tool (the GRPO stage appends it to the
    task's instructions when the tool is on)."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        role: str = "tool",
        max_workers: int = 4,
        history_key: str = "history",
        max_blocks: int = 8,
    ) -> None:
        if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 1:
            raise ValueError(f"max_blocks must be an integer >= 1, got {max_blocks!r}")
        self.limits = limits or SandboxLimits()
        self.max_blocks = max_blocks
        self.role = role
        self.max_workers = max_workers
        self.history_key = history_key
        self.calls = 0

    def run_reply(self, reply: str) -> str | None:
        """The tool message for one assistant reply, or None when it has no python block."""
        blocks = extract_python_blocks(reply)
        if not blocks:
            return None
        ran = blocks[: self.max_blocks]
        results = [run_python(code, self.limits).as_message() for code in ran]
        if len(blocks) > len(ran):
            skipped = len(blocks) - len(ran)
            results.append(
                f"[{skipped} more python blocks not run: at most {self.max_blocks} per reply]"
            )
        return "\n\n".join(results)

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        key = ("next", self.history_key, "prompt")
        chats = td.get(key).to_chats()
        replies = [chat[-1]["content"] if chat[-1]["role"] == "assistant" else "" for chat in chats]
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            outputs = list(pool.map(self.run_reply, replies))
        called = torch.tensor([output is not None for output in outputs])
        if called.any():
            for chat, output in zip(chats, outputs, strict=True):
                if output is not None:
                    chat.append({"role": self.role, "content": output})
            td.set(key, History.from_chats(chats))
            self.calls += int(called.sum())
        td.set("tool_called", td.get("tool_called") | called)
        return td

    def __repr__(self) -> str:
        return f"PythonInterpreter(timeout_s={self.limits.timeout_s}, role={self.role!r})"
