"""The turns of a multi-turn `verifiers` environment in llmrl's rollout loop.

:class:`~llmrl.envs.ecosystem.verifiers_env.VerifiersTask` gives a multi-turn environment to
:class:`~llmrl.envs.ChatEnv` as two transforms sharing the open :class:`Episodes`:

- :class:`VerifiersTurns` (a tool-like transform): at reset, the environment's state for each
  row (``init_state`` and ``setup_state``) and its tools in the system prompt; after each reply,
  the reply joins the episode (its ``<tool_call>`` calls as ``tool_calls``), the environment's
  stop conditions run (``is_completed``) and, unless the episode ended (or the reply was cut off
  or it was the last of ``max_turns``), its ``env_response`` answers: those messages join the
  conversation and the row goes on (``tool_called``).
- :class:`VerifiersReward` (the env's reward, in place of llmrl's ``TaskReward``): a row that
  ends at this step is scored by the rubric on its whole episode (completion and state).

Each row carries its episode's key (:data:`EPISODE_KEY`) from reset to its last step.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tensordict import NonTensorStack, TensorDictBase

from llmrl.data import History
from llmrl.data.non_tensor import as_list
from llmrl.envs.tasks.base import Score
from llmrl.envs.tasks.reward_function import RowScore
from llmrl.envs.transforms.base import EnvTransform

if TYPE_CHECKING:
    from llmrl.envs.ecosystem.verifiers_env import VerifiersTask

INSTALL = "pip install 'llmrl[ecosystem]'"
TESTED_VERSION = "0.1.10"
MAX_OPEN_EPISODES = 10_000
"""Episodes one env keeps state for at once; the oldest is dropped past that (its row, should it
come back, ends with the fallback reward, flagged)."""
EPISODE_KEY = "vf_episode"
"""The batch column that ties a row to its episode's verifiers state."""
CALL_FORMAT = '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>'


def import_verifiers() -> Any:
    """The ``verifiers`` package (its 0.1 API); ``ImportError`` naming the extra otherwise."""
    try:
        import verifiers
    except ImportError as error:
        raise ImportError(
            f"task 'verifiers' needs the verifiers package ({error}): {INSTALL}"
        ) from error
    if not all(hasattr(verifiers, n) for n in ("load_environment", "MultiTurnEnv", "Rubric")):
        version = getattr(verifiers, "__version__", "?")
        raise ImportError(
            f"verifiers {version} lacks the 0.1 API this adapter uses (load_environment, "
            f"MultiTurnEnv, Rubric; verifiers 0.4 moved to verifiers.v1): {INSTALL} installs "
            f"verifiers=={TESTED_VERSION}"
        )
    return verifiers


@dataclass
class Episode:
    """One row's verifiers state and conversation (verifiers' message dicts)."""

    state: Any
    prompt: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    final: list[dict[str, Any]] = field(default_factory=list)

    def completion(self) -> list[dict[str, Any]]:
        """The episode's messages after its prompt, and the environment's final message."""
        return [*self.messages[len(self.prompt) :], *self.final]


class Episodes:
    """The open episodes of one env, by :data:`EPISODE_KEY` (shared by its two transforms)."""

    def __init__(self, limit: int = MAX_OPEN_EPISODES) -> None:
        self.limit = limit
        self.open: OrderedDict[str, Episode] = OrderedDict()
        self.dropped = 0

    def add(self, key: str, episode: Episode) -> None:
        """Open ``episode``; past ``limit`` the oldest open one is dropped."""
        self.open[key] = episode
        while len(self.open) > self.limit:
            self.open.popitem(last=False)
            self.dropped += 1


class VerifiersTurns(EnvTransform):
    """The environment's side of each turn (see the module docstring)."""

    is_tool = True

    def __init__(self, task: VerifiersTask, episodes: Episodes, history_key: str = "history"):
        self.task = task
        self.episodes = episodes
        self.history_key = history_key

    def on_reset(self, td: TensorDictBase) -> TensorDictBase:
        key = (self.history_key, "prompt")
        chats = td.get(key).to_chats()
        size = len(chats)
        columns = set(td.keys())
        answers = as_list(td.get("answer")) if "answer" in columns else [""] * size
        fields = as_list(td.get("fields")) if "fields" in columns else [{}] * size
        names = [uuid.uuid4().hex for _ in range(size)]
        for chat, answer, row, name in zip(chats, answers, fields, names, strict=True):
            prompt = [{"role": m["role"], "content": m["content"]} for m in chat]
            state = self.task.new_state(prompt, str(answer), row or {})
            self.episodes.add(name, Episode(state, prompt, list(prompt)))
            tools = tool_instructions(state.get("oai_tools") or self.task.tools)
            if not tools:
                continue
            if chat[0]["role"] != "system":
                chat.insert(0, {"role": "system", "content": tools})
            elif tools not in chat[0]["content"]:
                chat[0] = {**chat[0], "content": f"{chat[0]['content']}\n\n{tools}"}
        td.set(key, History.from_chats(chats))
        td.set(EPISODE_KEY, NonTensorStack(*names))
        return td

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        key = ("next", self.history_key, "prompt")
        chats = td.get(key).to_chats()
        turns = td.get(("next", "turn")).reshape(-1).tolist()
        called = []
        for chat, name, turn in zip(chats, as_list(td.get(EPISODE_KEY)), turns, strict=True):
            episode = self.episodes.open.get(name)
            reply = chat[-1] if chat[-1]["role"] == "assistant" else None
            answer = None if episode is None or reply is None else self._turn(episode, reply, turn)
            called.append(answer is not None)
            chat.extend({"role": m["role"], "content": m["content"]} for m in answer or ())
        if any(called):
            td.set(key, History.from_chats(chats))
        td.set("tool_called", td.get("tool_called") | torch.tensor(called, dtype=torch.bool))
        return td

    def _turn(self, episode: Episode, reply: dict[str, Any], turn: int) -> list | None:
        """Record ``reply``; the environment's answer, or None when the episode ends."""
        task, state, vf = self.task, episode.state, import_verifiers()
        message = task.assistant_message(reply["content"], turn)
        state["trajectory"].append(trajectory_step(list(episode.messages), [message], state))
        episode.messages.append(message)
        if task.run(task.env.is_completed(state)):
            return None
        if not reply.get("is_complete", True) or turn >= task.max_turns:
            return None
        try:
            answer = task.run(task.env.env_response(list(episode.messages), state))
        except vf.Error as error:  # verifiers' way to end an episode on an error
            state["error"] = error
            return None
        answer = [text_message(m, f"{task.env_id} env_response") for m in answer or []]
        final = state.get("final_env_response")
        if final is not None:  # the environment ended the episode with this message
            episode.final = [text_message(m, f"{task.env_id} final_env_response") for m in final]
            return None
        episode.messages.extend(answer)
        return answer

    def __repr__(self) -> str:
        return f"VerifiersTurns({self.task.env_id!r}, open={len(self.episodes.open)})"


class VerifiersReward(EnvTransform):
    """The reward of a multi-turn verifiers episode: rows that end at this step (no
    environment response) are scored by the rubric on the whole episode; rows that go on get 0
    (GRPO reads an episode's last reward). Writes what
    :class:`~llmrl.envs.transforms.task_reward.TaskReward` writes: ``reward`` (added),
    ``correct``, ``formatted``, ``task_failed`` and ``<function>_score``/``<function>_failed``."""

    def __init__(self, task: VerifiersTask, episodes: Episodes, history_key: str = "history"):
        self.task = task
        self.episodes = episodes
        self.history_key = history_key

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        going_on = td.get("tool_called").reshape(-1).tolist()
        scores = [RowScore(Score(0.0, False, True), False, {}) for _ in going_on]
        ending, states = [], []
        for index, name in enumerate(as_list(td.get(EPISODE_KEY))):
            if going_on[index]:
                continue
            episode = self.episodes.open.pop(name, None)
            if episode is None:  # dropped (MAX_OPEN_EPISODES) or never opened here
                fallback = Score(self.task.fallback_reward, False, False)
                scores[index] = RowScore(fallback, True, {})
                continue
            episode.state["completion"] = episode.completion()
            episode.state["is_completed"] = True
            ending.append(index)
            states.append(episode.state)
        if states:
            for index, score in zip(ending, self.task.score_states(states, ending), strict=True):
                scores[index] = score
        rewards = torch.tensor([s.score.reward for s in scores], dtype=torch.float32)
        td.set("reward", td.get("reward") + rewards)
        td.set("correct", torch.tensor([s.score.correct for s in scores], dtype=torch.bool))
        td.set("formatted", torch.tensor([s.score.formatted for s in scores], dtype=torch.bool))
        td.set("task_failed", torch.tensor([s.failed for s in scores], dtype=torch.bool))
        for part in self.task.part_names:
            found = [s.parts.get(part) for s in scores]
            values = [0.0 if o is None else o.reward for o in found]
            td.set(f"{part}_score", torch.tensor(values, dtype=torch.float32))
            failed = [o is not None and o.failed for o in found]
            td.set(f"{part}_failed", torch.tensor(failed, dtype=torch.bool))
        return td

    def __repr__(self) -> str:
        return f"VerifiersReward({self.task.env_id!r})"


def trajectory_step(prompt: list, completion: list, state: Any) -> dict[str, Any]:
    """A verifiers trajectory step (no model response object: llmrl's policy wrote it)."""
    return {
        "prompt": prompt,
        "completion": completion,
        "response": None,
        "tokens": None,
        "reward": None,
        "advantage": None,
        "is_truncated": False,
        "trajectory_id": state.get("trajectory_id", ""),
        "extras": {},
    }


def tool_instructions(tools: list[dict[str, Any]]) -> str:
    """What the system prompt says about the tools (OpenAI tool schemas) and the call format."""
    if not tools:
        return ""
    listed = "\n".join(json.dumps(tool.get("function", tool)) for tool in tools)
    return (
        f"You can call tools. To call one, write\n{CALL_FORMAT}\nand its result comes back to "
        "you in the next message. Once you know the answer, reply without a tool call.\n"
        f"The tools:\n<tools>\n{listed}\n</tools>"
    )


def text_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """``{"role", "content"}`` with text content (text parts joined); refuses other parts."""
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            kinds = sorted({str(p.get("type")) if isinstance(p, dict) else "?" for p in content})
            raise ValueError(f"{where}: message content parts {kinds} are not supported (text)")
        content = "".join(str(part.get("text", "")) for part in content)
    return {"role": str(message["role"]), "content": "" if content is None else str(content)}
