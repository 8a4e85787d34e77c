"""Arithmetic word-free problems ("What is 37 + 8 * 12?") with exact integer answers.

Difficulty knob: ``(num_operands, digits, operators, nonnegative)``. ``num_operands`` integers,
each drawn uniformly from ``1 .. 10**digits - 1``, joined by operators drawn from ``operators``
(a subset of ``"+-*"``), evaluated with standard precedence (``*`` before ``+``/``-``, left to
right). Answers may be negative (``"3 - 8"`` -> ``-5``) unless ``nonnegative`` is set, which
redraws any problem with a negative step (small models learn borrowing long before the sign
flip). More operands and digits mean longer chains and bigger products; ``"+"`` alone is the
easiest setting.

The answer is computed by a small precedence evaluator over the generated tokens (no ``eval``),
which also writes the worked solution used as the SFT target, one step per line in evaluation
order, ending with the ``#### <number>`` line that :mod:`llmrl.envs.tasks.numbers` parses.

Example:
    >>> task = ArithmeticTask(num_operands=3, digits=2)
    >>> evaluate([37, 8, 12], ["+", "*"])
    (133, ['8 * 12 = 96', '37 + 96 = 133'])
    >>> task.score("8 * 12 = 96\\n37 + 96 = 133\\n#### 133", "133").reward
    1.0
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from llmrl.data.problem import Problem
from llmrl.envs.tasks.base import Score, check_format_reward, sample_split
from llmrl.envs.tasks.numbers import FINAL_ANSWER_INSTRUCTIONS, score_final_answer

OPERATORS = "+-*"


def evaluate(operands: Sequence[int], operators: Sequence[str]) -> tuple[int, list[str]]:
    """Evaluate ``operands[0] op0 operands[1] op1 ...`` with precedence; return value and steps.

    Multiplications collapse first (left to right), then additions and subtractions (left to
    right). Each step is written as ``"a op b = c"``.

    Example:
        >>> evaluate([2, 3, 4], ["-", "*"])
        (-10, ['3 * 4 = 12', '2 - 12 = -10'])
    """
    if len(operands) != len(operators) + 1:
        raise ValueError(
            f"need one more operand than operators, got {len(operands)} and {len(operators)}"
        )
    steps: list[str] = []
    terms = [operands[0]]
    additive: list[str] = []
    for op, value in zip(operators, operands[1:], strict=True):
        if op == "*":
            product = terms[-1] * value
            steps.append(f"{terms[-1]} * {value} = {product}")
            terms[-1] = product
        elif op in ("+", "-"):
            additive.append(op)
            terms.append(value)
        else:
            raise ValueError(f"unknown operator {op!r}; expected one of {OPERATORS!r}")
    total = terms[0]
    for op, value in zip(additive, terms[1:], strict=True):
        result = total + value if op == "+" else total - value
        steps.append(f"{total} {op} {value} = {result}")
        total = result
    return total, steps


def _has_negative_step(operands: Sequence[int], operators: Sequence[str]) -> bool:
    """Whether evaluating the expression passes through a negative number."""
    _, steps = evaluate(operands, operators)
    return any(step.rsplit("= ", 1)[1].startswith("-") for step in steps)


def render(operands: Sequence[int], operators: Sequence[str]) -> str:
    """The expression as written in the prompt: ``"37 + 8 * 12"``."""
    parts = [str(operands[0])]
    for op, value in zip(operators, operands[1:], strict=True):
        parts += [op, str(value)]
    return " ".join(parts)


@dataclass(frozen=True)
class ArithmeticTask:
    """Generated arithmetic problems scored by exact match of the ``#### <number>`` answer.

    Reward: 1.0 right, ``format_reward`` for a ``####`` answer that is wrong, 0.0 without one.
    """

    num_operands: int = 2
    digits: int = 2
    operators: str = OPERATORS
    format_reward: float = 0.1
    nonnegative: bool = False
    instructions: str = FINAL_ANSWER_INSTRUCTIONS

    name = "arithmetic"

    def __post_init__(self) -> None:
        if isinstance(self.num_operands, bool) or not isinstance(self.num_operands, int):
            raise ValueError(f"num_operands must be an int, got {self.num_operands!r}")
        if self.num_operands < 2:
            raise ValueError(f"num_operands must be >= 2, got {self.num_operands}")
        if isinstance(self.digits, bool) or not isinstance(self.digits, int):
            raise ValueError(f"digits must be an int, got {self.digits!r}")
        if not 1 <= self.digits <= 6:
            raise ValueError(f"digits must be in 1..6, got {self.digits}")
        if (
            not isinstance(self.operators, str)
            or not self.operators
            or not set(self.operators) <= set(OPERATORS)
        ):
            raise ValueError(
                f"operators must be a non-empty subset of {OPERATORS!r}, got {self.operators!r}"
            )
        if not isinstance(self.nonnegative, bool):
            raise ValueError(f"nonnegative must be true or false, got {self.nonnegative!r}")
        if not isinstance(self.instructions, str) or "####" not in self.instructions:
            raise ValueError(
                "instructions (the system prompt) must be a string that asks for the "
                f"'#### <number>' answer line the score reads, got {self.instructions!r}"
            )
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))

    def _draw(self, rng: random.Random) -> tuple[list[int], list[str]]:
        high = 10**self.digits - 1
        ops = "".join(sorted(set(self.operators), key=OPERATORS.index))
        while True:
            operands = [rng.randint(1, high) for _ in range(self.num_operands)]
            operators = [rng.choice(ops) for _ in range(self.num_operands - 1)]
            # Rejection keeps the draw uniform over the allowed problems; with two operands
            # about half of the subtractions are redrawn.
            if not self.nonnegative or not _has_negative_step(operands, operators):
                return operands, operators

    def generate(self, count: int, seed: int, split: str = "train") -> list[Problem]:
        """``count`` distinct problems, deterministic in ``(seed, split)``, disjoint across splits.

        Example:
            >>> ArithmeticTask().generate(1, seed=0)[0].prompt.startswith("What is ")
            True
        """
        drawn = sample_split(
            count, seed, split, self._draw, key=lambda item: render(*item), what=self.name
        )
        problems = []
        for index, (operands, operators) in enumerate(drawn):
            expression = render(operands, operators)
            value, steps = evaluate(operands, operators)
            problems.append(
                Problem(
                    id=f"{self.name}-{split}-{seed}-{index}",
                    prompt=f"What is {expression}?",
                    answer=str(value),
                    sft_target="\n".join([*steps, f"#### {value}"]),
                    meta={"expression": expression, "operands": operands, "operators": operators},
                )
            )
        return problems

    def kind(self, problem: Problem) -> str | None:
        """The problem's operators, each once, in the order of :data:`OPERATORS`: ``"+"`` for
        ``37 + 8``, ``"+*"`` for ``37 * 8 + 12`` (None without ``meta["operators"]``).

        Example:
            >>> ArithmeticTask().kind(Problem("a", "What is 1 * 2 - 3?", "-1",
            ...                               meta={"operators": ["*", "-"]}))
            '-*'
        """
        operators = problem.meta.get("operators")
        if not operators:
            return None
        return "".join(op for op in OPERATORS if op in operators)

    def score(self, response: str, problem_answer: str) -> Score:
        """Exact match of the last ``#### <number>`` against the reference answer."""
        return score_final_answer(response, problem_answer, self.format_reward)
