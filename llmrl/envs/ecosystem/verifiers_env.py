"""`VerifiersTask`: a `verifiers` environment as an llmrl task, run in llmrl's own rollout loop.

`verifiers <https://pypi.org/project/verifiers/>`_ (an optional extra: ``pip install
'llmrl[ecosystem]'``, which pins the 0.1 line this adapter is written against) packages an RL
environment as a Python module with ``load_environment(**args)``: a dataset (and an eval
dataset), a system prompt, a parser, a rubric of weighted reward functions and, for multi-turn
environments, ``env_response``/stop conditions or tools. ``verifiers.load_environment(env_id)``
imports the module named ``env_id`` (dashes as underscores), so the environment's package must be
installed wherever the task runs (the prepare stage and every env worker)::

    task: verifiers
    task_options: {env_id: my-math-env, env_args: {difficulty: easy}}
    generate: {train_size: 1000, eval_size: 100, seed: 0}

What llmrl takes from the environment:

- **rows** (:meth:`VerifiersTask.generate`): the dataset's rows for ``train``, the eval dataset's
  for ``eval``, in a seeded order; the chat prompt becomes ``Problem.messages`` (system prompt
  included), ``answer`` the answer, and ``task``, ``info``, ``example_id`` and the other columns
  (with the prompt) ``Problem.fields``. Train never holds a prompt of the eval dataset; an
  environment without one gives a tenth of its rows (by a hash of the prompt) to ``eval``.
- **reward**: every reward function of the rubric with a non-zero weight, called with the
  arguments it names (``prompt``, ``completion``, ``answer``, ``state``, ``task``, ``info``, the
  rubric's objects such as ``parser``; ``prompts``/``completions``/... for group functions),
  sync or ``async``; the reward is their weighted sum. Each function is a fault domain of its
  own (:class:`~llmrl.envs.tasks.user_calls.GuardedCall`): one that raises, hangs past
  ``timeout_s`` or returns no number gives its ``fallback_reward``, flagged and counted as
  ``<function>_failed``; its value is reported as ``<function>_score``. ``correct``: the reward
  reaches ``correct_at``; ``formatted``/``parsed``: the environment's parser found an answer.
- **turns** (multi-turn environments, :meth:`VerifiersTask.env_options`): after each reply the
  environment's stop conditions (``is_completed``) decide whether the episode ends; if not, its
  ``env_response`` answers and the episode goes on, up to ``max_turns`` replies. Tools
  (``ToolEnv``, ``StatefulToolEnv``): the system prompt lists them and the model calls one as
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the calls reach the environment
  as the assistant message's ``tool_calls``, its tool messages come back to the model. The
  episode is scored once it ends, with its whole completion and state.

Refused at construction, by name (they need verifiers' own rollout client, remote sandboxes or
another protocol): :data:`REFUSED_CLASSES`, environments that are not a ``MultiTurnEnv`` or that
override one of :data:`ROLLOUT_HOOKS`, ``message_type="completion"``, rubrics that replace
``score_rollout``/``score_group``, group reward functions in a multi-turn environment, and a
rubric without a weighted reward function. Not applied: the environment's ``sampling_args``
(llmrl's generation settings govern) and its ``max_seq_len``; its own ``max_turns`` stop
condition still ends an episode. The loaded environment does not pickle: the task keeps
``env_id``/``env_args`` and loads it again, lazily, where it is unpickled (env workers).
Loading keeps the process's SIGINT/SIGTERM handlers (verifiers' ``Environment`` installs its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import random
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from llmrl.data.problem import Problem
from llmrl.envs.ecosystem.verifiers_turns import (
    Episodes,
    VerifiersReward,
    VerifiersTurns,
    import_verifiers,
    text_message,
    tool_instructions,
    trajectory_step,
)
from llmrl.envs.tasks.base import Score
from llmrl.envs.tasks.reward_function import RowScore
from llmrl.envs.tasks.user_calls import GuardedCall, Outcome

DEFAULT_MAX_TURNS = 10
"""Replies per episode when neither the environment (``max_turns=-1``) nor the task sets one."""
REFUSED_CLASSES = {
    "EnvGroup": "it routes rows to several sub-environments; load each as its own task",
    "SandboxEnv": "its tools run in Prime's remote sandboxes",
    "PythonEnv": "its tools run in Prime's remote sandboxes (llmrl's own: tools.python)",
    "CliAgentEnv": "it runs an agent program against verifiers' own model endpoint",
    "HarborEnv": "it runs an agent program against verifiers' own model endpoint",
    "RLMEnv": "it runs its own nested model calls",
    "BrowserEnv": "it drives a remote browser session",
    "MCPEnv": "it manages its own MCP connections (llmrl's own: tools.mcp)",
    "OpenEnvEnv": "use task: openenv, llmrl's own OpenEnv adapter",
}
"""verifiers environment classes the adapter refuses, and why."""
ROLLOUT_HOOKS = (
    "rollout",
    "get_prompt_messages",
    "render_completion",
    "get_model_response",
    "add_model_response",
    "add_trajectory_step",
)
"""``MultiTurnEnv`` methods an environment may not override: they mean a rollout loop of its own
(non-linear conversations, its own model calls), which llmrl's loop does not run."""
GROUP_ARGUMENTS = ("prompts", "completions", "answers", "states", "tasks", "infos")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


class VerifiersTask:
    """A verifiers environment as an llmrl task (see the module docstring).

    Args:
        env_id: the environment's id, as ``verifiers.load_environment`` takes it.
        env_args: keyword arguments of the environment's ``load_environment``.
        max_turns: replies per episode of a multi-turn environment (default: the
            environment's own, else :data:`DEFAULT_MAX_TURNS`; the environment's own limit
            still ends an episode).
        correct_at: a reply (an episode) counts as correct when its reward reaches this.
        timeout_s: seconds a reward function call or an environment step may take.
        fallback_reward: the reward of a function that failed on a row.
    """

    def __init__(
        self,
        env_id: str,
        env_args: dict[str, Any] | None = None,
        max_turns: int | None = None,
        correct_at: float = 1.0,
        timeout_s: float | None = 60.0,
        fallback_reward: float = 0.0,
    ) -> None:
        if not isinstance(env_id, str) or not env_id:
            raise ValueError(f"task_options.env_id: expected an environment id, got {env_id!r}")
        if env_args is not None and not isinstance(env_args, dict):
            raise ValueError(f"task_options.env_args: expected a mapping, got {env_args!r}")
        if max_turns is not None and (isinstance(max_turns, bool) or max_turns < 1):
            raise ValueError(f"task_options.max_turns: expected an int >= 1, got {max_turns!r}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"task_options.timeout_s: expected seconds > 0, got {timeout_s!r}")
        self.env_id = env_id
        self.env_args = dict(env_args or {})
        self.correct_at = float(correct_at)
        self.timeout_s = timeout_s
        self.fallback_reward = float(fallback_reward)
        self.name = f"verifiers-{env_id.split('/')[-1]}"
        self._env: Any = None
        self._loop: _Loop | None = None
        self._parts: list[_Part] = []
        env = self.env  # loads it here, so what is not supported is refused before anything runs
        self.tools: list[dict[str, Any]] = list(getattr(env, "oai_tools", None) or [])
        single = isinstance(env, import_verifiers().SingleTurnEnv) or env.max_turns == 1
        self.multi_turn = not single or bool(self.tools)
        own = env.max_turns if env.max_turns and env.max_turns > 0 else DEFAULT_MAX_TURNS
        self.max_turns = 1 if not self.multi_turn else int(max_turns or own)
        if self.multi_turn and any(part.group for part in self._parts):
            names = [part.name for part in self._parts if part.group]
            raise ValueError(
                f"verifiers environment {env_id!r}: group reward functions {names} in a "
                "multi-turn environment are not supported (its episodes end at different steps)"
            )
        prompt = env.system_prompt or ""
        tools = tool_instructions(self.tools)
        self.instructions = "\n\n".join(text for text in (prompt, tools) if text)

    # ------------------------------------------------------------------ the environment
    @property
    def env(self) -> Any:
        """The loaded verifiers environment (loaded on first use, checked)."""
        if self._env is None:
            vf = import_verifiers()
            with keep_signal_handlers():
                try:
                    env = vf.load_environment(self.env_id, **self.env_args)
                except (ValueError, RuntimeError, ImportError, TypeError) as error:
                    inner = str(error.__cause__ or "")
                    cause = f" ({inner})" if inner and inner not in str(error) else ""
                    raise ValueError(
                        f"task_options.env_id: verifiers environment {self.env_id!r} with "
                        f"env_args {self.env_args} does not load: {error}{cause} (is its package "
                        "installed where this runs? are env_args its load_environment's?)"
                    ) from None
            self._parts = _check(vf, env, self.env_id, self.fallback_reward, self.timeout_s)
            self._env = env
        return self._env

    def run(self, coroutine: Any) -> Any:
        """Run one of the environment's coroutines on the task's event loop thread."""
        if self._loop is None:
            self._loop = _Loop()
        return self._loop.run(coroutine, self.timeout_s)

    # ------------------------------------------------------------------ rows
    def generate(self, count: int, seed: int, split: str) -> list[Problem]:
        """``count`` rows of ``split`` (``train``: the dataset, ``eval``: the eval dataset) in
        an order drawn from ``seed``; the splits never share a prompt."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        rows = self._split_rows(split)
        if count > len(rows):
            raise ValueError(
                f"verifiers environment {self.env_id!r} has {len(rows)} {split} rows; "
                f"asked for {count}"
            )
        order = list(range(len(rows)))
        random.Random(f"{seed}-{split}").shuffle(order)
        return [self._problem(rows[index], split) for index in order[:count]]

    def _split_rows(self, split: str) -> list[dict[str, Any]]:
        env = self.env
        train = _built(env, "dataset")
        evaluation = _built(env, "eval_dataset")
        if evaluation is not None:
            eval_rows = _unique(evaluation)
            if split == "eval":
                return eval_rows
            if train is None:
                raise ValueError(f"verifiers environment {self.env_id!r} has no train dataset")
            taken = {_prompt_key(row) for row in eval_rows}
            return [row for row in _unique(train) if _prompt_key(row) not in taken]
        if train is None:
            raise ValueError(f"verifiers environment {self.env_id!r} has no dataset")
        return [row for row in _unique(train) if _split_of(_prompt_key(row)) == split]

    def _problem(self, row: dict[str, Any], split: str) -> Problem:
        example_id = row.get("example_id")
        where = f"verifiers environment {self.env_id!r}, example {example_id}"
        if not isinstance(row.get("prompt"), list):
            raise ValueError(f"{where}: expected a chat prompt (a list of messages)")
        messages = [text_message(m, where) for m in row["prompt"]]
        fields = {k: _json_value(v) for k, v in row.items() if k not in ("prompt", "answer")}
        fields["prompt"] = messages
        text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        answer = row.get("answer")
        return Problem(
            id=f"{self.name}-{split}-{example_id}",
            prompt=text,
            answer="" if answer is None else str(answer),
            meta={"env_id": self.env_id},
            fields=fields,
            messages=messages,
        )

    # ------------------------------------------------------------------ scoring
    def new_state(self, prompt: Any, answer: str, fields: dict[str, Any]) -> Any:
        """A verifiers ``State`` for one row (``init_state`` then ``setup_state``)."""
        env = self.env
        vf = import_verifiers()
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        row = {
            "prompt": messages,
            "answer": answer,
            "task": fields.get("task") or env.env_id or "default",
            "info": fields.get("info") or {},
            "example_id": fields.get("example_id") or 0,
        }
        state = self.run(env.init_state(row, None, "llmrl"))
        try:
            state = self.run(env.setup_state(state))
        except vf.Error as error:
            state["error"] = error
        return state

    def assistant_message(self, text: str, turn: int) -> dict[str, Any]:
        """A reply as verifiers sees it: its ``<tool_call>`` calls as ``tool_calls``."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        calls = parse_tool_calls(text) if self.tools else []
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{turn}_{index}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for index, (name, arguments) in enumerate(calls)
            ]
        return message

    def score(self, response: str, answer: str, **fields: Any) -> Score:
        """One reply's score (a one-turn episode); ``fields``: the row's (``prompt``, ...)."""
        return self.score_rows([response], [{"answer": answer, **fields}], [0])[0].score

    def score_rows(
        self, replies: Sequence[str], rows: Sequence[dict[str, Any]], groups: Sequence[int]
    ) -> list[RowScore]:
        """Every reply's :class:`RowScore` as a one-turn episode of its row; group reward
        functions get each GRPO group (``groups[i]``: reply ``i``'s) at once."""
        states = []
        for reply, row in zip(replies, rows, strict=True):
            state = self.new_state(row.get("prompt", ""), str(row.get("answer", "")), row)
            completion = [self.assistant_message(reply, 0)]
            state["trajectory"] = [trajectory_step(state["prompt"], completion, state)]
            state["completion"] = completion
            states.append(state)
        return self.score_states(states, groups)

    def score_states(self, states: list[Any], groups: Sequence[int]) -> list[RowScore]:
        """The rubric's weighted reward of finished episodes (``state["completion"]`` set)."""
        each: dict[str, list[Outcome]] = {}
        for part in self._parts:
            if part.group:
                found: list[Outcome] = [part.guard.failed("raised")] * len(states)
                for members in _members(groups).values():
                    outcomes = part.guard.many(
                        self._invoke, len(members), part, _group_arguments(states, members)
                    )
                    for index, outcome in zip(members, outcomes, strict=True):
                        found[index] = outcome
                each[part.name] = found
            else:
                each[part.name] = [
                    part.guard(self._invoke, part, _arguments(state)) for state in states
                ]
        scores = []
        for index, state in enumerate(states):
            parts = {name: outcomes[index] for name, outcomes in each.items()}
            reward = sum(part.weight * parts[part.name].reward for part in self._parts)
            parsed = self._parsed(state.get("completion") or [])
            score = Score(reward, reward >= self.correct_at, parsed is not None, parsed)
            scores.append(RowScore(score, any(o.failed for o in parts.values()), parts))
        return scores

    def _invoke(self, part: _Part, arguments: dict[str, Any]) -> Any:
        given = {**arguments, **part.objects}
        if part.accepted is not None:
            given = {name: value for name, value in given.items() if name in part.accepted}
        value = part.function(**given)
        return self.run(value) if inspect.isawaitable(value) else value

    def _parsed(self, completion: list[dict[str, Any]]) -> str | None:
        try:
            parsed = self.env.parser.parse_answer(completion)
        except Exception:  # a parser that cannot read the reply found no answer
            return None
        return None if parsed is None else str(parsed)

    @property
    def part_names(self) -> list[str]:
        """The weighted reward functions, by the names their metrics take."""
        self.env  # noqa: B018 (loads the environment, which lists them)
        return [part.name for part in self._parts]

    # ------------------------------------------------------------------ the rollout loop
    def env_options(self) -> dict[str, Any]:
        """The env's system prompt and, for a multi-turn environment, its turns
        (:class:`VerifiersTurns`), ``max_turns`` and its episode reward
        (:class:`VerifiersReward`)."""
        options: dict[str, Any] = {"system_prompt": self.instructions or None}
        if self.multi_turn:
            episodes = Episodes()
            options["transforms"] = [VerifiersTurns(self, episodes)]
            options["reward"] = VerifiersReward(self, episodes)
            options["max_turns"] = self.max_turns
        return options

    def close(self) -> None:
        """Stop the task's event loop thread (it starts again when needed)."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_env": None, "_loop": None, "_parts": []}

    def __repr__(self) -> str:
        return f"VerifiersTask({self.env_id!r}, env_args={self.env_args})"


# ---------------------------------------------------------------------- helpers
@dataclass
class _Part:
    """One weighted reward function of the rubric, with what it is called with."""

    name: str
    function: Any
    weight: float
    objects: dict[str, Any]
    group: bool
    accepted: set[str] | None
    guard: GuardedCall


def _check(vf: Any, env: Any, env_id: str, fallback: float, timeout_s: float | None) -> list:
    """Refuse what the adapter does not support (by name); the rubric's weighted functions."""
    where = f"verifiers environment {env_id!r} ({type(env).__name__})"
    for cls in type(env).__mro__:
        if cls.__name__ in REFUSED_CLASSES:
            raise ValueError(
                f"{where}: {cls.__name__} is not supported: {REFUSED_CLASSES[cls.__name__]}"
            )
    if not isinstance(env, vf.MultiTurnEnv):
        raise ValueError(f"{where}: not a MultiTurnEnv: it runs a rollout of its own")
    if getattr(env, "message_type", "chat") != "chat":
        raise ValueError(
            f"{where}: message_type={env.message_type!r} is not supported (chats only)"
        )
    for hook in ROLLOUT_HOOKS:
        if getattr(type(env), hook, None) is not getattr(vf.MultiTurnEnv, hook, None):
            raise ValueError(f"{where}: it overrides {hook}(), a rollout loop of its own")
    parts: list[_Part] = []
    for rubric in _rubrics(vf, env.rubric):
        for hook in ("score_rollout", "score_group"):
            if getattr(type(rubric), hook) is not getattr(vf.Rubric, hook):
                raise ValueError(
                    f"{where}: its rubric {type(rubric).__name__} overrides {hook}(), a scoring "
                    "protocol of its own"
                )
        for function, weight in zip(rubric.funcs, rubric.weights, strict=True):
            if not weight:
                continue  # a metric: it does not change the reward
            unique = _unique_name(function, {part.name for part in parts})
            parameters = inspect.signature(function).parameters.values()
            keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
            accepted = None if keywords else {p.name for p in parameters}
            group = bool(accepted and accepted & set(GROUP_ARGUMENTS))
            guard = GuardedCall(unique, fallback, timeout_s)
            objects = dict(rubric.class_objects)
            parts.append(_Part(unique, function, float(weight), objects, group, accepted, guard))
    if not parts:
        raise ValueError(f"{where}: its rubric has no reward function with a non-zero weight")
    return parts


def _unique_name(function: Any, taken: set[str]) -> str:
    name = str(getattr(function, "__name__", type(function).__name__))
    number = 1
    while name in taken:
        number += 1
        name = f"{name.rsplit('_', 1)[0] if number > 2 else name}_{number}"
    return name


def _rubrics(vf: Any, rubric: Any) -> Iterator[Any]:
    if isinstance(rubric, vf.RubricGroup):
        for inner in rubric.rubrics:
            yield from _rubrics(vf, inner)
    elif rubric is not None:
        yield rubric


def _arguments(state: Any) -> dict[str, Any]:
    return {
        "prompt": state["prompt"],
        "completion": state["completion"],
        "answer": state.get("answer", ""),
        "state": state,
        "task": state["task"],
        "info": state.get("info") or {},
    }


def _group_arguments(states: list[Any], members: list[int]) -> dict[str, Any]:
    rows = [_arguments(states[index]) for index in members]
    singular = ("prompt", "completion", "answer", "state", "task", "info")
    return {
        plural: [row[one] for row in rows]
        for one, plural in zip(singular, GROUP_ARGUMENTS, strict=True)
    }


def _members(groups: Sequence[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(int(group), []).append(index)
    return members


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The well-formed ``<tool_call>`` calls of a reply, as ``(name, arguments)``; anything
    else is text (as an inference server's tool parser leaves it).

    Example:
        >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        [('add', {'a': 1})]
    """
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"]:
            arguments = call.get("arguments", {})
            if isinstance(arguments, dict):
                calls.append((call["name"], arguments))
    return calls


def _built(env: Any, name: str) -> Any:
    build = getattr(env, f"build_{name}", None)
    return build() if callable(build) else getattr(env, name, None)


def _unique(dataset: Any) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for row in dataset:
        rows.setdefault(_prompt_key(row), dict(row))
    return list(rows.values())


def _prompt_key(row: dict[str, Any]) -> str:
    return json.dumps(row.get("prompt"), sort_keys=True, default=str)


def _split_of(key: str) -> str:
    return "eval" if hashlib.sha256(key.encode("utf-8")).digest()[0] % 10 == 0 else "train"


def _json_value(value: Any) -> Any:
    """``value`` as JSON values (anything JSON does not know becomes its ``str``)."""
    return json.loads(json.dumps(value, default=str))


class _Loop:
    """An event loop on a daemon thread: every coroutine of the environment runs there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="verifiers")
        self.thread.start()

    def run(self, coroutine: Any, timeout_s: float | None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"a verifiers coroutine took longer than {timeout_s} s") from None

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5.0)
        if not self.thread.is_alive():
            self.loop.close()


class _NoSignals:
    """Stands in for the ``signal`` module inside verifiers while an environment loads."""

    SIGINT, SIGTERM = signal.SIGINT, signal.SIGTERM
    default_int_handler = staticmethod(signal.default_int_handler)

    @staticmethod
    def signal(*args: Any) -> None:
        return None


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Keep the process's SIGINT/SIGTERM handlers while verifiers builds an environment: its
    ``Environment`` installs its own (a stage's graceful shutdown would be lost) and could not
    from a thread other than the main one."""
    module = sys.modules.get("verifiers.envs.environment")
    shim = module is not None and getattr(module, "signal", None) is signal
    if shim:
        module.signal = _NoSignals  # type: ignore[union-attr]
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        if shim:
            module.signal = signal  # type: ignore[union-attr]
        for number, handler in saved.items():
            if signal.getsignal(number) is not handler and handler is not None:
                signal.signal(number, handler)
