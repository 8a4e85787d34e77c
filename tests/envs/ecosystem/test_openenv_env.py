"""`OpenEnvTask`: episodes on a real OpenEnv server (guess-the-number, served by OpenEnv's own
``create_app`` under uvicorn, ``tests/support/openenv_server.py``), driven through ``ChatEnv``
by a scripted policy that knows each row's secret from its reset seed.

One server for the module; the killed-server test lets the task start (and restart) its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import signal
import sys
import threading

import pytest
import torch

from llmrl.core.user_code import UserCodeError
from llmrl.data.non_tensor import as_list
from llmrl.envs import ChatEnv
from llmrl.envs.ecosystem.openenv_env import OpenEnvReward, OpenEnvStep, OpenEnvTask, json_object
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.transforms.data_loading_primer import DataLoadingPrimer
from tests.support.openenv_server import NO_GRADIO, secret_number
from tests.support.own_task_grpo import grpo_step, prepared
from tests.support.paths import REPO
from tests.support.scripted import ScriptedPolicy
from tests.support.service_process import ServiceProcess, free_port

APP = "tests.support.openenv_server:app"
SLOW_CALL_S = 5.0
"""The per-call deadline of the slow-server test."""
LOGGER = "llmrl.envs.ecosystem.openenv_sessions"
CLIENT_MODULE = "openenv.core.generic_client"


@pytest.fixture(scope="module", autouse=True)
def no_gradio():
    """OpenEnv imports gradio (its web UI, off here) whenever it is installed: about 4 s per
    process. The module blocks that import, here and in the servers it starts (see
    :data:`NO_GRADIO`); the client and server code is the same."""
    blocked = "gradio" not in sys.modules
    if blocked:
        sys.modules["gradio"] = None  # type: ignore[assignment]
    yield
    if blocked and sys.modules.get("gradio", 0) is None:
        del sys.modules["gradio"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The guess-the-number server for the module (uvicorn, 64 sessions at most)."""
    port = free_port()
    service = ServiceProcess(
        [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(port)],
        {**os.environ, NO_GRADIO: "1"},
        port=port,
        health_url=f"http://127.0.0.1:{port}/health",
        log_path=tmp_path_factory.mktemp("openenv") / "server.log",
        cwd=REPO,
        name="openenv guess-the-number server",
    )
    # the client's import (about 2.5 s) overlaps the server's start (the same imports)
    importing = threading.Thread(target=importlib.import_module, args=(CLIENT_MODULE,))
    importing.start()
    service.start()
    importing.join()
    yield service
    service.stop()


def wrong(secret: int) -> str:
    """A wrong guess (1 when the secret is 10, else secret + 1, which is too high)."""
    return str(secret % 10 + 1)


class Guesser:
    """Replies to each row with ``plan(secret, copy, turn)``: the secret from the row's reset
    seed, the copy its ``sample_index`` in the group, the turn its reply's number."""

    def __init__(self, plan) -> None:
        self.plan = plan

    def __call__(self, td):
        seeds = [fields["seed"] for fields in as_list(td.get("fields"))]
        copies, turns = td.get("sample_index").tolist(), td.get("turn").tolist()
        replies = [
            self.plan(secret_number(seed), copy, turn)
            for seed, copy, turn in zip(seeds, copies, turns, strict=True)
        ]
        return ScriptedPolicy(replies)(td)


def chat_env(task: OpenEnvTask, rows: int, copies: int, seed: int = 0) -> ChatEnv:
    """A ChatEnv over ``rows`` generated episode starts, ``copies`` per group, in order."""
    options = task.env_options()
    problems = task.generate(rows, seed=seed, split="train")
    primer = DataLoadingPrimer(problems, batch_size=rows, repeats=copies, shuffle=False)
    return ChatEnv(
        system_prompt=options["system_prompt"],
        max_turns=options["max_turns"],
        transforms=[primer, *options["transforms"], options["reward"]],
    )


def columns(transition, *names: str) -> dict[str, list]:
    return {name: transition[name].tolist() for name in names}


def shout(reply: str, observation: dict) -> dict:
    """A user's action hook (module level: it pickles)."""
    return {"message": reply.upper()}


def test_generate_is_deterministic_and_splits_do_not_share_seeds():
    task = OpenEnvTask(base_url="http://127.0.0.1:1")
    train = task.generate(30, seed=3, split="train")
    assert train == task.generate(30, seed=3, split="train")
    assert len({p.id for p in train}) == 30
    evals = task.generate(10, seed=3, split="eval")
    assert {p.fields["seed"] for p in train}.isdisjoint(p.fields["seed"] for p in evals)
    first = train[0]
    assert first.answer == "" and first.id == f"openenv-train-{first.fields['seed']}"
    assert task.reset_kwargs(first.fields) == {"seed": first.fields["seed"]}
    assert OpenEnvTask(base_url="ws://h:1", reset_options={"high": 5, "seed": 1}).reset_kwargs(
        {"reset": {"high": 7}, "seed": 9}
    ) == {"high": 7, "seed": 9}


def test_options_are_checked_and_unsupported_features_refused_by_name():
    for option, word in (("docker_image", "Docker"), ("env_id", "Space"), ("mode", "MCP")):
        with pytest.raises(ValueError, match=f"task_options.{option}: .*{word}"):
            OpenEnvTask(base_url="http://h:1", **{option: "x"})
    with pytest.raises(TypeError, match="unknown option"):
        OpenEnvTask(base_url="http://h:1", max_turn=3)
    with pytest.raises(ValueError, match="exactly one of base_url"):
        OpenEnvTask(base_url="http://h:1", app=APP)
    with pytest.raises(ValueError, match="exactly one of base_url"):
        OpenEnvTask()
    with pytest.raises(ValueError, match=r"server_command.*port"):
        OpenEnvTask(server_command=["my-server", "--port", "8000"])
    with pytest.raises(ValueError, match="prompt_template"):
        OpenEnvTask(base_url="http://h:1", prompt_template="{observation} {secret}")
    with pytest.raises(ValueError, match="max_turns"):
        OpenEnvTask(base_url="http://h:1", max_turns=0)
    with pytest.raises(UserCodeError, match=r"task_options\.action_fn"):
        OpenEnvTask(base_url="http://h:1", action_fn="no_such_module:act")
    with pytest.raises(TypeError, match="rewards come from the environment server"):
        OpenEnvTask(base_url="http://h:1").score("5", "")


def test_replies_become_actions_and_observations_become_messages():
    text = OpenEnvTask(base_url="http://h:1")
    assert text.action("  7\n", {}) == {"message": "7"}
    as_json = OpenEnvTask(base_url="http://h:1", action_format="json")
    assert as_json.action('I say\n```json\n{"guess": 3}\n```', {}) == {"guess": 3}
    assert json_object('{"a": 1} then {"b": {"c": 2}} done') == {"b": {"c": 2}}
    assert json_object('{"a": 1} then {"b": oops}') == {"a": 1}
    with pytest.raises(ValueError, match="no JSON object"):
        as_json.action("seven", {})
    # the observation's only text field; else the first of the usual names; else its JSON
    assert text.observation_text({"echoed_message": "hi", "length": 2}) == "hi"
    assert text.observation_text({"prompt": "go", "board": "x.o"}) == "go"
    assert text.observation_text({"a": 1, "b": [2]}) == '{"a": 1, "b": [2]}'
    chosen = OpenEnvTask(base_url="http://h:1", observation_field="board")
    assert chosen.observation_text({"prompt": "go", "board": "x.o"}) == "x.o"
    with pytest.raises(KeyError, match="observation_field"):
        chosen.observation_text({"prompt": "go"})
    hooked = OpenEnvTask(base_url="http://h:1", observation_fn="json:dumps", action_fn=shout)
    assert hooked.observation_text({"x": 1}) == '{"x": 1}'
    assert hooked.action("go", {"prompt": "?"}) == {"message": "GO"}
    with pytest.raises(TypeError, match="not a dict"):
        OpenEnvTask(base_url="http://h:1", action_fn=max).action("go", "on")


def test_episodes_rewards_turns_and_done_flags_by_hand(server):
    """2 episode starts x 3 copies, at most 3 turns: copy 0 guesses right at once, copy 1 on
    its second reply, copy 2 never (its episode ends at max_turns with return 0)."""
    task = OpenEnvTask(base_url=server.url, max_turns=3, instructions="Guess.")
    env = chat_env(task, rows=2, copies=3)

    def plan(secret: int, copy: int, turn: int) -> str:
        return str(secret) if (copy, turn) in ((0, 0), (1, 1)) else wrong(secret)

    policy = Guesser(plan)
    state = env.reset()
    chats = state["history"].prompt.to_chats()
    assert chats[0] == [
        {"role": "system", "content": "Guess.", "is_complete": True},
        {"role": "user", "content": "Guess a number between 1 and 10.", "is_complete": True},
    ]
    first = env.step(policy(state))
    assert columns(first, "reward", "done", "correct", "openenv_done", "tool_called") == {
        "reward": [1.0, 0.0, 0.0, 1.0, 0.0, 0.0],
        "done": [True, False, False, True, False, False],
        "correct": [True, False, False, True, False, False],
        "openenv_done": [True, False, False, True, False, False],
        "tool_called": [False, True, True, False, True, True],
    }
    assert not first["task_failed"].any() and first["formatted"].all()
    secrets = [secret_number(f["seed"]) for f in as_list(first["fields"])]
    reply = first["next", "history"].prompt.to_chats()[1][-1]
    assert reply["role"] == "user"
    assert reply["content"] == ("higher" if secrets[1] == 10 else "lower")

    second = env.step(policy(first["next"][~first["done"]]))
    assert columns(second, "reward", "done", "openenv_reward", "turn") == {
        "reward": [1.0, 0.0, 1.0, 0.0],
        "done": [True, False, True, False],
        "openenv_reward": [1.0, 0.0, 1.0, 0.0],
        "turn": [1, 1, 1, 1],
    }
    third = env.step(policy(second["next"][~second["done"]]))
    assert columns(third, "reward", "done", "correct", "openenv_done", "openenv_ended") == {
        "reward": [0.0, 0.0],
        "done": [True, True],
        "correct": [False, False],
        "openenv_done": [False, False],  # cut by max_turns, not ended by the server
        "openenv_ended": [True, True],
    }
    assert third["terminated"].all()
    assert len(third["next", "history"].prompt.to_chats()[0]) == 2 + 2 * 3 - 1
    assert task.sessions().sessions == {}, "every ended episode closed its session"
    env.close()


def test_copies_of_a_group_start_from_the_same_state(server, caplog):
    """The reset's ``hint`` shows the secret: the copies of a row see the same one (its seed's);
    a server whose reset ignores the seed gives the copies different starts, and a warning."""
    task = OpenEnvTask(base_url=server.url, reset_options={"hint": True, "high": 1000})
    env = chat_env(task, rows=2, copies=4, seed=1)
    state = env.reset()
    firsts = [chat[-1]["content"] for chat in state["history"].prompt.to_chats()]
    seeds = [f["seed"] for f in as_list(state["fields"])]
    assert firsts == [f"Guess a number between 1 and 1000. (It is {secret_number(s, 1000)}.)"
                      for s in seeds]  # fmt: skip
    assert len(set(firsts[:4])) == 1 and len(set(firsts[4:])) == 1 and firsts[0] != firsts[4]
    env.close()

    unseeded = OpenEnvTask(
        base_url=server.url, reset_options={"hint": True, "high": 10**6, "ignore_seed": True}
    )
    env = chat_env(unseeded, rows=1, copies=4)
    with caplog.at_level("WARNING", logger=LOGGER):
        env.reset()
    assert [r.message for r in caplog.records if "different observations" in r.message]
    env.close()


def test_a_slow_or_failing_server_gives_the_fallback_and_flags_the_row(server, caplog):
    # the deadline must hold every healthy call of a loaded 2-core machine (a 0.5 s one timed
    # out a reset's handshake beside the fast tier, 2026-12-07); the slow reply sleeps 3x past it
    task = OpenEnvTask(
        base_url=server.url, max_turns=2, timeout_s=SLOW_CALL_S, fallback_reward=-1.0
    )
    env = chat_env(task, rows=1, copies=4)
    replies = {0: f"sleep {3 * SLOW_CALL_S}", 1: "boom", 2: "hmm", 3: None}
    policy = Guesser(lambda secret, copy, turn: replies[copy] or str(secret))
    with caplog.at_level("WARNING", logger=LOGGER):
        transition = env.step(policy(env.reset()))
    assert columns(transition, "reward", "done", "task_failed", "correct") == {
        "reward": [-1.0, -1.0, 0.0, 1.0],
        "done": [True, True, False, True],  # "hmm" is not a number: the game goes on
        "task_failed": [True, True, False, False],
        "correct": [False, False, False, True],
    }
    assert transition["next", "history"].prompt.to_chats()[2][-1]["content"] == "not a number"
    logged = [r for r in caplog.records if "failed while stepping" in r.message]
    assert len(logged) == 1 and logged[0].exc_info is not None, "the first traceback, once"
    assert task.sessions().failures == 2
    env.close()


def test_a_reply_that_is_no_action_ends_the_episode_unformatted(server):
    task = OpenEnvTask(base_url=server.url, action_format="json", action_fn=None)
    env = chat_env(task, rows=1, copies=2)
    policy = Guesser(lambda secret, copy, turn: f'{{"message": "{secret}"}}' if copy else "five")
    transition = env.step(policy(env.reset()))
    assert columns(transition, "reward", "done", "formatted", "task_failed") == {
        "reward": [0.0, 1.0],
        "done": [True, True],
        "formatted": [False, True],
        "task_failed": [False, False],
    }
    env.close()


def test_a_server_killed_mid_episode_fails_its_rows_and_is_restarted(monkeypatch):
    """The task starts its own server (``app``); killed after the first turn, the episodes in
    flight fail with the fallback; the next reset restarts it and episodes work again."""
    monkeypatch.setenv(NO_GRADIO, "1")  # the server the task starts inherits it
    task = OpenEnvTask(app=APP, server_cwd=str(REPO), max_turns=3, timeout_s=5.0)
    env = chat_env(task, rows=2, copies=1)
    policy = Guesser(lambda secret, copy, turn: wrong(secret) if turn == 0 else str(secret))
    first = env.step(policy(env.reset()))
    assert not first["done"].any()
    process = task.sessions()._server
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    second = env.step(policy(first["next"]))
    assert columns(second, "reward", "done", "task_failed") == {
        "reward": [0.0, 0.0],
        "done": [True, True],
        "task_failed": [True, True],
    }
    again = env.step(Guesser(lambda secret, copy, turn: str(secret))(env.reset()))
    assert columns(again, "reward", "task_failed") == {
        "reward": [1.0, 1.0],
        "task_failed": [False, False],
    }
    assert task.sessions()._server is not process
    task.close()
    assert task.sessions()._server is None


def test_the_task_and_its_transforms_pickle_and_reconnect_lazily(server):
    task = OpenEnvTask(base_url=server.url, max_turns=2)
    env = chat_env(task, rows=1, copies=2)
    env.reset()  # open sessions, a live event loop: none of it travels
    step = next(t for t in env.transforms if isinstance(t, OpenEnvStep))
    copy = pickle.loads(pickle.dumps(task))
    assert copy._sessions is None and copy.base_url == server.url
    step_copy = pickle.loads(pickle.dumps(step))
    assert step_copy.sessions.sessions == {} and step_copy.sessions._loop is None
    assert isinstance(copy.env_options()["reward"], OpenEnvReward)
    transition = env_in_worker(copy)
    assert transition["reward"].tolist() == [1.0, 1.0]
    env.close()
    copy.close()


def env_in_worker(task: OpenEnvTask):
    """What an env worker does with the unpickled task: a TaskEnv over its rows (the task's
    env_options give its turns, reward and max_turns), one reply per row."""
    env = TaskEnv(task, task.generate(1, seed=5, split="train"), batch_size=1, repeats=2)
    assert env.max_turns == task.max_turns
    transition = env.step(Guesser(lambda secret, copy, turn: str(secret))(env.reset()))
    assert transition["openenv_session"].dtype == torch.long
    env.close()
    return transition


def test_grpo_trains_a_step_on_the_server(server, tmp_path, tiny_model_dir):
    data = prepared(
        tmp_path,
        task="openenv",
        task_options={"base_url": server.url, "max_turns": 2},
        generate={"train_size": 4, "eval_size": 2},
    )
    _batch, metrics = grpo_step(data, tiny_model_dir)
    assert metrics["task/failures"] == 0.0 and metrics["trained_groups"] == 2
    assert 0.0 <= metrics["reward_mean"] <= 1.0  # a guess's return: 1 when right, else 0
