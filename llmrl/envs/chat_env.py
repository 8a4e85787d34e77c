"""`ChatEnv`: the batched environment around a chat policy.

``reset(td)`` turns prompts (``query`` strings or a ``("history", "prompt")`` History, with an
optional system prompt) into conversations. ``step(td)`` takes the policy's output, whose
``("history", "full")`` holds each conversation with the new assistant reply, and returns the
*transition*: the policy's output plus ``reward``, ``done``, ``terminated`` and ``truncated``
(``[B]``) written by the transforms (rewards, tools, ...) in order, and under ``next`` the state
to continue from: ``("next", "history", "prompt")`` is the conversation so far (with any tool
replies), next to the row's own columns (``answer``, ``prompt_id``, ...).

When an episode ends:

- the reply called a tool (a transform with ``is_tool`` answered it): the episode continues,
  unless ``max_turns`` replies were given (``truncated``);
- otherwise the reply is final (``terminated``), unless it was cut off by the token limit before
  its end-of-turn (``truncated``).

Example:
    env = ChatEnv(system_prompt="Answer with a number.", max_turns=1)
    state = env.reset(queries(["2+2?"], answer=["4"]))
    transition = env.step(policy(state))
    transition["reward"], transition["done"]
    state = transition["next"]           # for multi-turn episodes
"""

from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from llmrl.data import ChatHistory, History
from llmrl.data.non_tensor import as_list
from llmrl.envs.transforms.base import EnvTransform

# Keys a policy writes, and keys describing a transition: neither is carried to the next state.
# ``policy_version`` stamps the weights that wrote *this* reply (an inference actor writes it in
# its output); the next reply gets its own, and a continuing state keeps the columns of a fresh
# reset state (a batching inference actor merges both kinds of requests).
POLICY_OUTPUT_KEYS = ("history", "text", "tokens", "masks", "log_probs", "logits", "policy_version")
TRANSITION_KEYS = ("reward", "done", "terminated", "truncated", "tool_called", "next")


class ChatEnv:
    """A batched chat environment (see the module docstring)."""

    def __init__(
        self,
        system_prompt: str | None = None,
        max_turns: int = 1,
        transforms: list[EnvTransform] | None = None,
        history_key: str = "history",
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.history_key = history_key
        self.transforms: list[EnvTransform] = []
        for transform in transforms or []:
            self.append_transform(transform)

    def append_transform(self, transform: EnvTransform) -> ChatEnv:
        """Add a transform after the existing ones; returns the env for chaining."""
        if not isinstance(transform, EnvTransform):
            raise TypeError(f"expected an EnvTransform, got {type(transform).__name__}")
        self.transforms.append(transform)
        return self

    def close(self) -> None:
        """Release what the transforms hold (e.g. stop MCP tool servers): calls ``close()`` on
        every transform that has one. Idempotent."""
        for transform in self.transforms:
            close = getattr(transform, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> ChatEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reset
    def reset(self, td: TensorDictBase | None = None) -> TensorDictBase:
        """Start conversations for a batch ``[B]`` of prompts."""
        for transform in self.transforms if td is None else ():
            td = transform.next_batch()  # may raise StopIteration: the dataset is exhausted
            if td is not None:
                break
        if td is None:
            raise ValueError("reset needs prompts: pass a TensorDict or add a DataLoadingPrimer")
        td = td.clone(False)
        batch = td.batch_size[0]
        td.set(self.history_key, ChatHistory(prompt=self._initial_history(td), batch_size=[batch]))
        td.set("turn", torch.zeros(batch, dtype=torch.long))
        for key in ("done", "terminated", "truncated"):
            td.set(key, torch.zeros(batch, dtype=torch.bool))
        for transform in self.transforms:
            td = transform.on_reset(td)
        return td

    def _initial_history(self, td: TensorDictBase) -> History:
        existing = td.get(self.history_key, None)
        if isinstance(existing, ChatHistory) and existing.prompt is not None:
            chats = existing.prompt.to_chats()
        elif "query" in td.keys():  # noqa: SIM118 (no `in` on tensordicts)
            chats = [[{"role": "user", "content": str(q)}] for q in as_list(td.get("query"))]
        else:
            present = sorted(str(k) for k in td.keys())  # noqa: SIM118 (a tensordict view)
            raise KeyError(
                f"reset needs 'query' strings or ('{self.history_key}', 'prompt'); "
                f"keys present: {present}"
            )
        if self.system_prompt is not None:
            chats = [
                chat
                if chat[0]["role"] == "system"
                else [{"role": "system", "content": self.system_prompt}, *chat]
                for chat in chats
            ]
        return History.from_chats(chats)

    # ------------------------------------------------------------------ step
    def step(self, td: TensorDictBase) -> TensorDictBase:
        """Apply the policy's reply to every row; returns the transition (see module doc)."""
        full = td.get((self.history_key, "full"), None)
        if not isinstance(full, History):
            raise KeyError(
                f"step needs the policy's ('{self.history_key}', 'full') History: run a "
                "history-mode policy on the reset state first"
            )
        batch = td.batch_size[0]
        next_state = td.exclude(*POLICY_OUTPUT_KEYS, *TRANSITION_KEYS)
        next_state.set(self.history_key, ChatHistory(prompt=full, batch_size=[batch]))
        next_state.set("turn", td.get("turn", torch.zeros(batch, dtype=torch.long)) + 1)
        out = td.clone(False)
        out.set("next", next_state)
        out.set("reward", torch.zeros(batch))
        out.set("tool_called", torch.zeros(batch, dtype=torch.bool))
        for transform in self.transforms:
            out = transform.on_step(out)
        complete = torch.tensor([bool(chat[-1]["is_complete"]) for chat in full.to_chats()])
        out_of_turns = next_state.get("turn") >= self.max_turns
        terminated = ~out.get("tool_called") & complete
        truncated = ~terminated & (out_of_turns | ~complete)
        for name, value in (
            ("terminated", terminated),
            ("truncated", truncated),
            ("done", terminated | truncated),
        ):
            out.set(name, value)
            out.set(("next", name), value)
        return out


def queries(texts: list[str], **columns: object) -> TensorDict:
    """A reset batch from prompt strings (and optional per-row columns such as ``answer``)."""
    td = TensorDict({"query": NonTensorStack(*texts)}, batch_size=[len(texts)])
    for name, values in columns.items():
        td.set(name, values if isinstance(values, torch.Tensor) else NonTensorStack(*values))
    return td
