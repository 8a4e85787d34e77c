"""`OpenEnvTask`: train on an OpenEnv environment server (PyPI ``openenv``), in llmrl's own loop.

An OpenEnv environment is a server; a client session (a WebSocket) ``reset``\\s it to an
observation and ``step``\\s it with an action to the next observation, a reward and ``done``.
Here each row of a GRPO batch is one episode in its own session:

- **Rows.** :meth:`OpenEnvTask.generate` makes the prepared dataset: one row per episode start,
  whose ``fields`` carry the reset arguments (``{"seed": 1234}``; a user's dataset may give a
  ``seed`` column or a ``reset`` dict column instead). The ``G`` copies of a row reset with the
  same arguments, so they start from the same state where the server's ``reset`` takes the
  seed. OpenEnv's server drops reset arguments its ``reset()`` does not accept, silently: a
  server that ignores ``seed`` starts the copies of a group from different states, and the
  adapter logs a warning (once) when it sees the copies' first observations differ.
- **Turns.** At reset every row opens a session and resets it; the first user message is the
  rendered observation (``prompt_template``). Each reply becomes an action (``action_field``:
  ``{"message": reply}``, or a JSON object the reply writes, or the user's ``action_fn``), the
  server steps, and its next observation is the next user message (``observation_role``), until
  the server says ``done`` or ``max_turns`` replies were given. Sessions close when their
  episode ends.
- **Reward.** The row that ends an episode gets the episode's return (the sum of the server's
  step rewards, ``reward_mode="sum"``, or the last one, ``"last"``) and ``correct`` when the
  return reaches ``success_reward``; earlier rows get 0 (GRPO scores a trajectory by its final
  row). Columns: ``openenv_reward`` (the server's reward of this step), ``openenv_return``,
  ``openenv_done`` (the server said done), ``openenv_ended``, ``task_failed``.
- **Faults.** A server that errors, refuses or overstays ``timeout_s`` (per call) never
  crashes the run: the row's episode ends with ``fallback_reward`` and ``task_failed``, and the
  first traceback is logged once (later failures are counted in ``task_failed``). A reply that
  cannot be made into an action (``action_format="json"`` without a JSON object, an
  ``action_fn`` raising ``ValueError``) ends the episode with ``formatted`` false.
- **Servers.** ``base_url`` (a running server), or ``app`` (``"my_env.server.app:app"``, run
  with uvicorn on a free port) or ``server_command`` (argv with a ``{port}`` placeholder),
  started lazily by each process that runs episodes (each env worker its own) and stopped by
  :meth:`OpenEnvTask.close`; a crashed server of its own is restarted at the next reset (at
  most ``max_restarts`` times). The server must accept one session per row in flight (OpenEnv's
  ``max_concurrent_envs``, and ``SUPPORTS_CONCURRENT_SESSIONS`` on the environment).

Not supported (refused by name): Docker images and Hugging Face Spaces started by the client
(``docker_image``, ``env_id``, ``provider``: start the server yourself and pass ``base_url``),
OpenEnv's MCP "production" mode (``mode``), and MCP tool actions (``tools``). Observations are
text: a non-text field (an image, a tensor) reaches the model as its JSON.

Example (a guess-the-number server on port 8000; a training run takes the same options from
the prepare config's ``task: openenv`` and ``task_options``):

    task = OpenEnvTask(base_url="http://127.0.0.1:8000", max_turns=4)
    env = TaskEnv(task, task.generate(64, seed=0, split="train"), batch_size=4, repeats=8)
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from llmrl.core.user_code import load_object
from llmrl.data import ChatHistory, History
from llmrl.data.non_tensor import as_list
from llmrl.data.problem import Problem
from llmrl.envs.ecosystem.openenv_sessions import INSTALL_HINT, OpenEnvSessions, Session
from llmrl.envs.tasks.base import Score, sample_split
from llmrl.envs.transforms.base import EnvTransform

DEFAULT_INSTRUCTIONS = (
    "You are interacting with an environment. Each user message is what the environment "
    "shows you; reply with your next action."
)
OBSERVATION_NAMES = ("prompt", "message", "text", "content", "observation", "output", "result")
"""Observation fields used as the message text (first found) when the observation has several
text fields and no ``observation_field`` is set."""
UNAVAILABLE = "[the environment is unavailable]"
"""The first user message of an episode whose session did not open (the row fails)."""

UNSUPPORTED = {
    "docker_image": "starting an OpenEnv server from a Docker image is not supported: run the "
    "container yourself (docker run -p 8000:8000 IMAGE) and pass base_url",
    "env_id": "starting a Hugging Face Space's OpenEnv server is not supported: run it yourself "
    "and pass base_url, or app='<its package>.server.app:app' when it is installed",
    "provider": "OpenEnv's container and runtime providers are not supported: start the server "
    "yourself and pass base_url, or let the task start it with app or server_command",
    "mode": "OpenEnv's 'production' mode (MCP JSON-RPC) is not supported: the task speaks the "
    "simulation protocol (reset/step over the /ws WebSocket)",
    "tools": "MCP tool environments (list_tools/call_tool actions) are not supported; for MCP "
    "tools use llmrl's own (the GRPO stage's tools.mcp)",
}


class OpenEnvTask:
    """An OpenEnv environment server as an llmrl task (see the module docstring).

    Args:
        base_url: a running server (``http://host:port``); or ``app``: the server's ASGI app as
            ``module:attribute``, started with uvicorn; or ``server_command``: argv starting
            it, ``{port}`` replaced by a free port. Exactly one of the three.
        server_cwd: the working directory of a started server (default: this process's).
        instructions: the system prompt.
        max_turns: replies per episode at most.
        timeout_s: bound on each call to the server (connect, reset, step).
        start_timeout_s: how long a started server has to answer ``/health``.
        max_restarts: restarts of a started server that died, per process.
        reset_options: arguments of every reset (a row's ``seed``/``reset`` fields win).
        prompt_template: the first user message, from ``{observation}`` (the reset's rendered
            observation) and ``{prompt}`` (the row's prompt).
        observation_field: the observation field that is the message text (default: its only
            text field, else the first of :data:`OBSERVATION_NAMES`, else its JSON).
        observation_fn: ``"module:function"`` (or a picklable callable): observation dict ->
            message text; replaces ``observation_field``.
        observation_role: the role of the environment's messages, ``user`` or ``tool``.
        action_field: the action is ``{action_field: reply}`` (``action_format="text"``).
        action_format: ``text``, or ``json``: the action is the last JSON object the reply
            writes (:func:`json_object`).
        action_fn: ``"module:function"`` (or a picklable callable): ``(reply, observation) ->
            action dict``; raising ``ValueError`` marks the reply as not formatted.
        reward_mode: the episode's return: ``sum`` of the step rewards, or the ``last`` one.
        success_reward: a return at least this large counts as ``correct``.
        fallback_reward: the reward of an episode the server failed.
        check_same_start: warn (once) when the copies of a group start from different
            observations.
    """

    name = "openenv"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        app: str | None = None,
        server_command: Sequence[str] | None = None,
        server_cwd: str | None = None,
        instructions: str = DEFAULT_INSTRUCTIONS,
        max_turns: int = 8,
        timeout_s: float = 30.0,
        start_timeout_s: float = 60.0,
        max_restarts: int = 3,
        reset_options: dict[str, Any] | None = None,
        prompt_template: str = "{observation}",
        observation_field: str | None = None,
        observation_fn: str | Callable[[dict], str] | None = None,
        observation_role: str = "user",
        action_field: str = "message",
        action_format: str = "text",
        action_fn: str | Callable[[str, dict], dict] | None = None,
        reward_mode: str = "sum",
        success_reward: float = 1.0,
        fallback_reward: float = 0.0,
        check_same_start: bool = True,
        **unsupported: Any,
    ) -> None:
        for option in unsupported:
            if option in UNSUPPORTED:
                raise ValueError(f"openenv task_options.{option}: {UNSUPPORTED[option]}")
        if unsupported:
            raise TypeError(f"openenv task_options: unknown option(s) {sorted(unsupported)}")
        servers = {"base_url": base_url, "app": app, "server_command": server_command}
        given = [name for name, value in servers.items() if value is not None]
        if len(given) != 1:
            raise ValueError(
                "openenv task_options: give exactly one of base_url (a running server), app "
                f"('module:app', started with uvicorn) or server_command; got {given or 'none'}"
            )
        if base_url is not None and not re.match(r"^(https?|wss?)://", base_url):
            raise ValueError(
                f"openenv task_options.base_url: not an http(s)/ws(s) URL: {base_url!r}"
            )
        if app is not None and not re.match(r"^[\w.]+:[\w.]+$", app):
            raise ValueError(f"openenv task_options.app: expected 'module:attribute', got {app!r}")
        if server_command is not None and (
            isinstance(server_command, str) or not any("{port}" in a for a in server_command)
        ):
            raise ValueError(
                "openenv task_options.server_command: a list of arguments with a '{port}' "
                f"placeholder, got {server_command!r}"
            )
        _check(isinstance(max_turns, int) and max_turns >= 1, "max_turns", "an int >= 1")
        _check(timeout_s > 0, "timeout_s", "> 0")
        _check(start_timeout_s > 0, "start_timeout_s", "> 0")
        _check(max_restarts >= 0, "max_restarts", ">= 0")
        _check(observation_role in ("user", "tool"), "observation_role", "'user' or 'tool'")
        _check(action_format in ("text", "json"), "action_format", "'text' or 'json'")
        _check(reward_mode in ("sum", "last"), "reward_mode", "'sum' or 'last'")
        try:
            prompt_template.format(observation="", prompt="")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                "openenv task_options.prompt_template: only {observation} and {prompt} may be "
                f"used ({error!r})"
            ) from None
        self.base_url = base_url
        self.app = app
        self.server_command = list(server_command) if server_command is not None else None
        self.server_cwd = server_cwd
        self.instructions = instructions
        self.max_turns = max_turns
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.max_restarts = max_restarts
        self.reset_options = dict(reset_options or {})
        self.prompt_template = prompt_template
        self.observation_field = observation_field
        self.observation_fn = observation_fn
        self.observation_role = observation_role
        self.action_field = action_field
        self.action_format = action_format
        self.action_fn = action_fn
        self.reward_mode = reward_mode
        self.success_reward = float(success_reward)
        self.fallback_reward = float(fallback_reward)
        self.check_same_start = check_same_start
        self._hooks: dict[str, Callable] = {}
        self._sessions: OpenEnvSessions | None = None
        for option in ("observation_fn", "action_fn"):  # refuse a hook that does not import
            self._hook(option)

    # ------------------------------------------------------------------ the task protocol
    def generate(self, count: int, seed: int, split: str) -> list[Problem]:
        """``count`` episode starts of ``split``: rows whose ``fields`` hold the reset seed
        (deterministic in the arguments; train and eval never share a seed)."""
        seeds = sample_split(
            count, seed, split, lambda rng: rng.randrange(2**31), str, "OpenEnv reset seed"
        )
        return [
            Problem(
                id=f"openenv-{split}-{s}",
                prompt=f"OpenEnv episode (reset seed {s})",
                answer="",
                fields={"seed": s},
            )
            for s in seeds
        ]

    def score(self, response: str, answer: str, **fields: Any) -> Score:
        """Not available: the server scores whole episodes (through :meth:`env_options`)."""
        raise TypeError(
            "the openenv task has no per-reply score: its rewards come from the environment "
            "server, per episode, through env_options() (llmrl's TaskEnv runs them)"
        )

    def env_options(self) -> dict[str, Any]:
        """The episode's transforms (:class:`OpenEnvStep`), its reward (:class:`OpenEnvReward`),
        ``max_turns`` and the system prompt; the server is reached lazily, on the first reset."""
        if importlib.util.find_spec("openenv") is None:
            raise ImportError(f"the openenv task needs the `openenv` package: {INSTALL_HINT}")
        sessions = self.sessions()
        return {
            "transforms": [OpenEnvStep(sessions)],
            "reward": OpenEnvReward(self.success_reward, self.fallback_reward),
            "max_turns": self.max_turns,
            "system_prompt": self.instructions,
        }

    def sessions(self) -> OpenEnvSessions:
        """This process's sessions of the task (created on first use, never pickled)."""
        if self._sessions is None:
            self._sessions = OpenEnvSessions(self)
        return self._sessions

    def close(self) -> None:
        """Close every open session and stop a server this process started. Idempotent."""
        if self._sessions is not None:
            self._sessions.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_hooks": {}, "_sessions": None}

    def __repr__(self) -> str:
        where = self.base_url or self.app or " ".join(self.server_command or [])
        return f"OpenEnvTask({where!r}, max_turns={self.max_turns})"

    # ------------------------------------------------------------------ mapping
    def reset_kwargs(self, fields: dict[str, Any] | None) -> dict[str, Any]:
        """A row's reset arguments: ``reset_options``, its ``reset`` dict, its ``seed``."""
        fields = fields or {}
        row = fields.get("reset")
        kwargs = {**self.reset_options, **(row if isinstance(row, dict) else {})}
        if "seed" in fields:
            kwargs["seed"] = fields["seed"]
        return kwargs

    def observation_text(self, observation: dict[str, Any]) -> str:
        """The message text of an observation (see the class's ``observation_*`` options)."""
        hook = self._hook("observation_fn")
        if hook is not None:
            return str(hook(observation))
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise KeyError(
                    f"openenv task_options.observation_field: {self.observation_field!r} is not "
                    f"in the observation (fields: {sorted(observation)})"
                )
            return _as_text(observation[self.observation_field])
        texts = {k: v for k, v in observation.items() if isinstance(v, str)}
        if len(texts) == 1:
            return next(iter(texts.values()))
        name = next((n for n in OBSERVATION_NAMES if n in texts), None)
        return texts[name] if name is not None else _as_text(observation)

    def action(self, reply: str, observation: dict[str, Any]) -> dict[str, Any]:
        """The action of a reply; ``ValueError`` when the reply is not one."""
        hook = self._hook("action_fn")
        if hook is not None:
            action = hook(reply, observation)
            if not isinstance(action, dict):
                raise TypeError(f"openenv action_fn returned {type(action).__name__}, not a dict")
            return action
        if self.action_format == "json":
            return json_object(reply)
        return {self.action_field: reply.strip()}

    def _hook(self, option: str) -> Callable | None:
        spec = getattr(self, option)
        if spec is None or callable(spec):
            return spec
        if option not in self._hooks:
            self._hooks[option] = load_object(spec, field=f"task_options.{option}")
        return self._hooks[option]


def _check(ok: bool, option: str, expected: str) -> None:
    if not ok:
        raise ValueError(f"openenv task_options.{option}: must be {expected}")


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def json_object(reply: str) -> dict[str, Any]:
    """The last JSON object a reply writes (outside any other; fenced or not). Raises
    ``ValueError`` when there is none.

    Example:
        >>> json_object('I guess:\\n```json\\n{"guess": 5, "why": {"hint": "lower"}}\\n```')
        {'guess': 5, 'why': {'hint': 'lower'}}
    """
    decoder = json.JSONDecoder()
    found, start = None, reply.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(reply, start)
        except ValueError:
            start = reply.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found = value
        start = reply.find("{", end)
    if found is None:
        raise ValueError("the reply holds no JSON object")
    return found


class OpenEnvStep(EnvTransform):
    """Runs the episodes' turns on the server (an ``is_tool`` transform: a row goes on while
    its episode does). Reset: opens a session per row, resets it with the row's arguments and
    makes its observation the first user message. Step: sends each reply as an action, appends
    the next observation, and closes the sessions of the episodes that ended. Writes the
    ``openenv_*`` columns and ``task_failed`` that :class:`OpenEnvReward` reads."""

    is_tool = True

    def __init__(self, sessions: OpenEnvSessions, history_key: str = "history") -> None:
        self.sessions = sessions
        self.task = sessions.task
        self.history_key = history_key

    def on_reset(self, td: TensorDictBase) -> TensorDictBase:
        size = td.batch_size[0]
        fields = as_list(td.get("fields")) if "fields" in td.keys() else [None] * size  # noqa: SIM118
        ids = self.sessions.open([self.task.reset_kwargs(f) for f in fields])
        chats = td.get((self.history_key, "prompt")).to_chats()
        texts = []
        for sid, chat in zip(ids, chats, strict=True):
            session = self.sessions.sessions[sid]
            text = UNAVAILABLE
            if session.failure is None:
                try:
                    text = self.task.observation_text(session.observation or {})
                except Exception as error:  # (the user's mapping: the row fails)
                    self.sessions.fail(session, error, "rendering the first observation of")
            texts.append(text)
            users = [m for m in chat if m["role"] == "user"]
            prompt = users[-1]["content"] if users else ""
            message = self.task.prompt_template.format(observation=text, prompt=prompt)
            if users:
                users[-1]["content"] = message
            else:
                chat.append({"role": "user", "content": message})
        td.set(self.history_key, ChatHistory(prompt=History.from_chats(chats), batch_size=[size]))
        td.set("openenv_session", torch.tensor(ids, dtype=torch.long))
        if self.task.check_same_start and "group_id" in td.keys():  # noqa: SIM118
            self._check_same_start(td.get("group_id").reshape(-1).tolist(), texts)
        return td

    def _check_same_start(self, groups: list[int], texts: list[str]) -> None:
        starts: dict[int, set[str]] = {}
        for group, text in zip(groups, texts, strict=True):
            if text != UNAVAILABLE:
                starts.setdefault(group, set()).add(text)
        split = [group for group, seen in starts.items() if len(seen) > 1]
        if split:
            self.sessions.warn_once(
                "OpenEnv: the copies of group %s started from different observations: the "
                "server's reset() probably ignores `seed` (OpenEnv drops reset arguments it "
                "does not take), so GRPO compares replies to different states",
                split[0],
            )

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        ids = td.get("openenv_session").reshape(-1).tolist()
        full = td.get((self.history_key, "full")).to_chats()
        turns = td.get("turn").reshape(-1).tolist()
        sessions = [self.sessions.sessions.get(sid) for sid in ids]
        actions: list[dict[str, Any] | None] = []
        formatted = []
        for session, chat in zip(sessions, full, strict=True):
            action, ok = None, True
            if session is not None and session.failure is None and not session.done:
                reply = next((m["content"] for m in reversed(chat) if m["role"] == "assistant"), "")
                try:
                    action = self.task.action(reply, session.observation or {})
                except ValueError:
                    ok = False  # the reply is not an action: the model's fault, not the server's
                except Exception as error:  # (the user's action_fn is broken)
                    self.sessions.fail(session, error, "making the action of")
            actions.append(action)
            formatted.append(ok)
        self.sessions.step(ids, actions)

        key = ("next", self.history_key, "prompt")
        chats = td.get(key).to_chats()
        columns: dict[str, list] = {n: [] for n in ("reward", "return", "done", "ended", "failed")}
        called, ended_ids = [], []
        for i, (sid, session) in enumerate(zip(ids, sessions, strict=True)):
            if session is None:  # closed already (the task's sessions were closed meanwhile)
                session = Session()
                self.sessions.fail(session, KeyError(f"no open session {sid}"), "continuing")
            stepped = actions[i] is not None and session.failure is None
            complete = bool(full[i][-1].get("is_complete", True))
            last_turn = turns[i] + 1 >= self.task.max_turns
            failed = session.failure is not None
            ended = failed or not formatted[i] or session.done or last_turn or not complete
            text = None
            if not ended:
                try:
                    text = self.task.observation_text(session.observation or {})
                except Exception as error:  # (the user's mapping: the row fails)
                    self.sessions.fail(session, error, "rendering an observation of")
                    failed = ended = True
            if text is not None:
                chats[i].append({"role": self.task.observation_role, "content": text})
            else:
                ended_ids.append(sid)
            total = session.total if self.task.reward_mode == "sum" else session.reward
            columns["reward"].append(session.reward if stepped else 0.0)
            columns["return"].append(total)
            columns["done"].append(session.done)
            columns["ended"].append(ended)
            columns["failed"].append(failed)
            called.append(not ended)
        self.sessions.end(ended_ids)
        if any(called):
            td.set(key, History.from_chats(chats))
        td.set("tool_called", td.get("tool_called") | torch.tensor(called, dtype=torch.bool))
        td.set("openenv_reward", torch.tensor(columns["reward"], dtype=torch.float32))
        td.set("openenv_return", torch.tensor(columns["return"], dtype=torch.float32))
        td.set("openenv_done", torch.tensor(columns["done"], dtype=torch.bool))
        td.set("openenv_ended", torch.tensor(columns["ended"], dtype=torch.bool))
        td.set("openenv_formatted", torch.tensor(formatted, dtype=torch.bool))
        td.set("task_failed", torch.tensor(columns["failed"], dtype=torch.bool))
        return td

    def close(self) -> None:
        """Close the task's sessions in this process and the server it started
        (``ChatEnv.close`` calls it): every env of the task in the process shares them, so
        close an env once its episodes are over."""
        self.sessions.close()

    def __repr__(self) -> str:
        return f"OpenEnvStep({self.task!r})"


class OpenEnvReward(EnvTransform):
    """The episode's reward (the task's ``reward`` transform, replacing llmrl's TaskReward):
    on the row that ends an episode, adds its return (``fallback_reward`` when the server
    failed) to ``reward``; ``correct``: the return reached ``success_reward``; ``formatted``:
    the reply was an action. Rows whose episode goes on add 0."""

    def __init__(self, success_reward: float = 1.0, fallback_reward: float = 0.0) -> None:
        self.success_reward = success_reward
        self.fallback_reward = fallback_reward

    def on_step(self, td: TensorDictBase) -> TensorDictBase:
        if "openenv_ended" not in td.keys():  # noqa: SIM118
            raise KeyError("OpenEnvReward reads the columns OpenEnvStep writes: add it first")
        ended, failed = td.get("openenv_ended"), td.get("task_failed")
        episode_return = td.get("openenv_return")
        fallback = torch.full_like(episode_return, self.fallback_reward)
        reward = torch.where(failed, fallback, episode_return)
        td.set("reward", td.get("reward") + torch.where(ended, reward, torch.zeros_like(reward)))
        td.set("correct", ended & ~failed & (episode_return >= self.success_reward))
        td.set("formatted", td.get("openenv_formatted").clone())
        return td

    def __repr__(self) -> str:
        return f"OpenEnvReward(success_reward={self.success_reward:g})"
