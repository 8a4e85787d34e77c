"""A tiny `verifiers` environment module for the adapter's tests, found offline the way
verifiers finds any environment: ``verifiers.load_environment(env_id)`` imports the module named
``env_id`` (``tests.support.verifiers_tiny_env``, or ``verifiers-tiny-env`` with this folder on
``sys.path``) and calls its ``load_environment(**env_args)``.

``kind`` picks the environment:

- ``single``: "What is a + b?", answer in ``<answer>`` tags; rubric ``exact`` (weight 1, sync)
  + ``brief`` (weight 0.5, async: 1 when the reply is under 20 characters) + ``num_chars``
  (weight 0: a metric);
- ``group``: the same with a group function ``first_right`` (weight 2: 1 for the first right
  reply of a group, 0 for the others);
- ``guess``: a multi-turn game: guess the row's secret (1..8); the environment answers
  "higher"/"lower" until the guess is right (then the episode stops) or 3 guesses were made;
  rubric ``solved`` (weight 1) + ``speed`` (weight 0.5: 1 / number of guesses);
- ``tools``: a ``ToolEnv`` with ``add(a, b)``; rubric ``exact`` (weight 1) + ``used_tool``
  (weight 0.25: the completion holds a tool message);
- ``broken``: ``exact`` plus ``explodes`` (weight 1, always raises);
- refused ones: ``completion`` (message_type), ``own_loop`` (overrides get_prompt_messages),
  ``own_rubric`` (a rubric with its own score_group), ``group_turns`` (a group function in a
  multi-turn environment), ``env_group`` (an EnvGroup), ``metrics_only``.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

SYSTEM = "Answer inside <answer></answer> tags."
PAIRS = [(a, b) for a in range(1, 5) for b in range(1, 5)]


def _sums(rows: list[tuple[int, int]]) -> Dataset:
    return Dataset.from_list(
        [
            {"question": f"What is {a} + {b}?", "answer": str(a + b), "info": {"a": a, "b": b}}
            for a, b in rows
        ]
    )


def exact(completion, answer, parser) -> float:
    """1 when the parsed answer is the reference."""
    return 1.0 if parser.parse_answer(completion) == answer else 0.0


async def brief(completion) -> float:
    """1 when the last reply is under 20 characters (an async function)."""
    return 1.0 if len(completion[-1]["content"]) < 20 else 0.0


def num_chars(completion, **kwargs) -> float:
    """A metric (weight 0): never called by the adapter."""
    raise AssertionError("weight-0 metrics are not scored")


def first_right(completions, answers, parser) -> list[float]:
    """A group function: 1 for the first right reply of the group."""
    right = [parser.parse_answer(c) == a for c, a in zip(completions, answers, strict=True)]
    first = right.index(True) if True in right else -1
    return [1.0 if index == first else 0.0 for index in range(len(right))]


def explodes(completion) -> float:
    raise RuntimeError("this reward function always fails")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def used_tool(completion) -> float:
    return 1.0 if any(m["role"] == "tool" for m in completion) else 0.0


class GuessEnv(vf.MultiTurnEnv):
    """Guess the secret: the environment says higher or lower."""

    async def setup_state(self, state, **kwargs):
        state["guesses"] = 0
        return state

    @vf.stop
    async def guessed(self, state) -> bool:
        return bool(state["trajectory"]) and self._last_guess(state) == state["answer"]

    def _last_guess(self, state) -> str | None:
        return self.parser.parse_answer(state["trajectory"][-1]["completion"])

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        guess = self.parser.parse_answer(messages)
        word = "higher" if guess is None or int(guess) < int(state["answer"]) else "lower"
        return [{"role": "user", "content": word}]


def solved(state) -> float:
    trajectory = state["trajectory"]
    last = trajectory[-1]["completion"][-1]["content"] if trajectory else ""
    return 1.0 if f"<answer>{state['answer']}</answer>" in last else 0.0


def speed(completion) -> float:
    guesses = sum(m["role"] == "assistant" for m in completion)
    return 1.0 / guesses if guesses else 0.0


class OwnLoopEnv(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return []

    async def get_prompt_messages(self, state):
        return state["prompt"]


class OwnRubric(vf.Rubric):
    async def score_group(self, states):
        for state in states:
            state["reward"] = 1.0


def load_environment(kind: str = "single", train: int = 12, **kwargs) -> vf.Environment:
    """The environment ``kind`` names (see the module docstring); ``train`` rows of sums for
    training, the rest for evaluation."""
    parser = vf.XMLParser(["answer"], answer_field="answer")
    data = {"dataset": _sums(PAIRS[:train]), "eval_dataset": _sums(PAIRS[train:])}
    common = {**data, "system_prompt": SYSTEM, "parser": parser}
    rubric = vf.Rubric(funcs=[exact, brief, num_chars], weights=[1.0, 0.5, 0.0], parser=parser)
    if kind == "single":
        return vf.SingleTurnEnv(rubric=rubric, **common)
    if kind == "no_eval":
        return vf.SingleTurnEnv(dataset=data["dataset"], parser=parser, rubric=rubric)
    if kind == "group":
        grouped = vf.Rubric(funcs=[exact, first_right], weights=[1.0, 2.0], parser=parser)
        return vf.SingleTurnEnv(rubric=grouped, **common)
    if kind == "broken":
        broken = vf.Rubric(funcs=[exact, explodes], weights=[1.0, 1.0], parser=parser)
        return vf.SingleTurnEnv(rubric=broken, **common)
    if kind == "guess":
        secrets = Dataset.from_list(
            [
                {"question": f"Guess my number (1-8), game {n}.", "answer": str(n % 8 + 1)}
                for n in range(8)
            ]
        )
        game = vf.Rubric(funcs=[solved, speed], weights=[1.0, 0.5], parser=parser)
        return GuessEnv(
            dataset=secrets, system_prompt=SYSTEM, parser=parser, rubric=game, max_turns=3
        )
    if kind == "tools":
        tooled = vf.Rubric(funcs=[exact, used_tool], weights=[1.0, 0.25], parser=parser)
        return vf.ToolEnv(tools=[add], rubric=tooled, max_turns=4, **common)
    if kind == "completion":
        return vf.SingleTurnEnv(
            dataset=Dataset.from_list([{"prompt": "2+2=", "answer": "4"}]),
            message_type="completion",
            rubric=rubric,
        )
    if kind == "own_loop":
        return OwnLoopEnv(rubric=rubric, **common)
    if kind == "own_rubric":
        return vf.SingleTurnEnv(rubric=OwnRubric(funcs=[exact], parser=parser), **common)
    if kind == "group_turns":
        grouped = vf.Rubric(funcs=[first_right], parser=parser)
        return GuessEnv(dataset=data["dataset"], parser=parser, rubric=grouped, max_turns=3)
    if kind == "env_group":
        one = vf.SingleTurnEnv(rubric=rubric, **common)
        two = vf.SingleTurnEnv(rubric=rubric, **common)
        return vf.EnvGroup(envs=[one, two], env_names=["one", "two"])
    if kind == "metrics_only":
        metrics = vf.Rubric(funcs=[num_chars], weights=[0.0], parser=parser)
        return vf.SingleTurnEnv(rubric=metrics, **common)
    raise ValueError(f"unknown kind {kind!r}")
