"""A tiny OpenEnv environment for the OpenEnv adapter's tests: guess the secret number.

Served with OpenEnv's own server machinery (``create_app``: a FastAPI app with the WebSocket
session endpoint ``/ws`` and ``/health``), run by uvicorn in a subprocess:
``python -m uvicorn tests.support.openenv_server:app --port PORT``. The app is built on first
access of ``app`` (:func:`build_app`), so the test process can import :func:`secret_number`
without importing OpenEnv.

The game: ``reset(seed, high=10)`` draws the secret with :func:`secret_number` and asks for a
guess between 1 and ``high``. Each ``step`` takes a ``message`` (the model's reply): the right
number gives reward 1 and ends the episode, another number gets ``higher``/``lower`` and reward
0, anything else ``not a number`` and reward 0. Test hooks: the reply ``sleep <s>`` sleeps that
long (a slow server), ``boom`` raises (the server answers with an error); the reset options
``hint`` (the prompt tells the secret) and ``ignore_seed`` (the secret is drawn unseeded: a
server whose reset ignores the seed).
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from typing import Any

NO_GRADIO = "LLMRL_TEST_OPENENV_NO_GRADIO"
"""Set to 1 in a server process's environment: OpenEnv imports gradio (its web UI, off here)
whenever it is installed, about 4 s per process; blocking the import makes OpenEnv take its
"no gradio" path and the server starts in about 2 s."""

MAX_SESSIONS = 64


def secret_number(seed: int, high: int = 10) -> int:
    """The secret of an episode reset with ``seed``."""
    return random.Random(seed).randint(1, high)


def build_app() -> Any:
    """The guess-the-number server's ASGI app (OpenEnv's ``create_app``, 64 sessions)."""
    if os.environ.get(NO_GRADIO) == "1" and "gradio" not in sys.modules:
        sys.modules["gradio"] = None  # type: ignore[assignment]
    from openenv.core.env_server import Action, Environment, Observation, State, create_app

    class GuessAction(Action):
        """A guess: the model's reply as text."""

        message: str

    class GuessObservation(Observation):
        """What the player sees next."""

        prompt: str

    class GuessTheNumber(Environment):
        """Guess-the-number (see the module docstring); one instance per session."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._secret = 0
            self._state = State(episode_id=None, step_count=0)

        def reset(
            self,
            seed: int | None = None,
            episode_id: str | None = None,
            high: int = 10,
            hint: bool = False,
            ignore_seed: bool = False,
            **kwargs: Any,
        ) -> GuessObservation:
            if ignore_seed:
                self._secret = random.Random().randint(1, high)
            else:
                self._secret = secret_number(seed if seed is not None else 0, high)
            self._state = State(episode_id=episode_id, step_count=0)
            prompt = f"Guess a number between 1 and {high}."
            if hint:
                prompt += f" (It is {self._secret}.)"
            return GuessObservation(prompt=prompt, reward=0.0, done=False)

        def step(
            self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any
        ) -> GuessObservation:
            self._state.step_count += 1
            text = action.message.strip()
            if text.startswith("sleep "):
                time.sleep(float(text.split()[1]))
            if text == "boom":
                raise RuntimeError("the guessing game broke")
            if re.fullmatch(r"-?\d+", text) is None:
                return GuessObservation(prompt="not a number", reward=0.0, done=False)
            guess = int(text)
            if guess == self._secret:
                return GuessObservation(prompt="correct", reward=1.0, done=True)
            hint = "higher" if guess < self._secret else "lower"
            return GuessObservation(prompt=hint, reward=0.0, done=False)

        @property
        def state(self) -> State:
            return self._state

    return create_app(
        GuessTheNumber, GuessAction, GuessObservation, max_concurrent_envs=MAX_SESSIONS
    )


def __getattr__(name: str) -> Any:
    """``app``, built on first access (what uvicorn's ``module:app`` reads)."""
    if name == "app":
        app = globals()["app"] = build_app()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
