"""Countdown: combine the given numbers with ``+ - * /`` and parentheses to hit a target.

Generation samples ``num_numbers`` integers in ``1..max_number`` (repeats allowed) and folds them
into a random expression tree whose every intermediate value is a positive integer, so each
problem is solvable by construction; the hidden expression is kept in ``meta["solution"]``.

Answer rules (what :meth:`CountdownTask.score` accepts):

* the expression is the rest of the line after the **last** ``####``, cut at the first ``=``
  (``#### (3 + 5) * 2 = 16`` is fine); surrounding backticks and a trailing ``.`` are ignored,
  and ``×``, ``÷`` and the unicode minus ``−`` read as ``*``, ``/`` and ``-``;
* grammar: integer literals, binary ``+ - * /``, parentheses and unary minus (it cannot help
  reach a positive target that subtraction could not). Anything else -- names, calls,
  attributes, ``**``, ``//``, ``%``, floats, strings, leading zeros -- is garbage, as is an
  expression over 200 characters;
* every given number is used exactly once (as a multiset) and the value, computed exactly with
  :class:`fractions.Fraction`, equals the target. Division by zero is simply wrong.

Reward: 1.0 correct; ``format_reward`` for a well-formed expression with wrong numbers or value;
0.0 for no or garbage expression.

Example:
    >>> answer = '{"numbers": [3, 5, 2], "target": 16}'
    >>> CountdownTask(num_numbers=3).score("#### (3 + 5) * 2", answer).reward
    1.0
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from llmrl.data.problem import Problem
from llmrl.envs.tasks.base import ANSWER_WINDOW_CHARS, Score, check_format_reward, sample_split

MAX_EXPRESSION_CHARS = 200
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]+")
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_TRANSLATE = str.maketrans({"×": "*", "÷": "/", "−": "-", "\t": " "})


def extract_expression(response: str) -> str | None:
    """The text after the last ``####`` on its line, before any ``=``; ``None`` when absent.

    Only the last :data:`~llmrl.envs.tasks.base.ANSWER_WINDOW_CHARS` characters are read.
    """
    response = response[-ANSWER_WINDOW_CHARS:]
    start = response.rfind("####")
    if start < 0:
        return None
    line = response[start + 4 :].split("\n", 1)[0].split("=", 1)[0]
    expression = line.strip(" \t`").rstrip(".").strip(" \t`")
    return expression or None


def parse_expression(expression: str) -> ast.expr | None:
    """Parse ``expression`` under the countdown grammar; ``None`` when it is not allowed.

    Example:
        >>> parse_expression("(1 + 2) * 3") is not None, parse_expression("2 ** 8")
        (True, None)
    """
    text = expression.translate(_TRANSLATE)
    if len(text) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree.body if _well_formed(tree.body) else None


def _well_formed(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _well_formed(node.operand)
    if isinstance(node, ast.BinOp):
        return type(node.op) in _BINARY and _well_formed(node.left) and _well_formed(node.right)
    return False


def literals(node: ast.expr) -> list[int]:
    """The integer literals of a well-formed expression, left to right."""
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, ast.UnaryOp):
        return literals(node.operand)
    assert isinstance(node, ast.BinOp)
    return literals(node.left) + literals(node.right)


def evaluate(node: ast.expr) -> Fraction:
    """Exact value of a well-formed expression; raises ``ZeroDivisionError`` on ``x / 0``."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -evaluate(node.operand)
    assert isinstance(node, ast.BinOp)
    left, right = evaluate(node.left), evaluate(node.right)
    op = _BINARY[type(node.op)]
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return left / right


def _fold(numbers: list[int], rng: random.Random) -> tuple[int, str, list[str]] | None:
    """Combine random pairs until one value is left; ``None`` if a step is not a positive int.

    Returns the value, the expression (fully parenthesized below the root) and the steps.
    """
    pool = [(n, str(n)) for n in numbers]
    steps: list[str] = []
    while len(pool) > 1:
        a, a_text = pool.pop(rng.randrange(len(pool)))
        b, b_text = pool.pop(rng.randrange(len(pool)))
        op = rng.choice("+-*/")
        if (op == "-" and a < b) or (op == "/" and a % b):
            (a, a_text), (b, b_text) = (b, b_text), (a, a_text)
        if op == "/" and a % b:
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        if value <= 0:
            return None
        steps.append(f"{a} {op} {b} = {value}")
        text = f"{a_text} {op} {b_text}"
        pool.append((value, f"({text})" if pool else text))
    return pool[0][0], pool[0][1], steps


@dataclass(frozen=True)
class CountdownTask:
    """Countdown problems: ``num_numbers`` numbers in ``1..max_number``, target ``1..max_target``.

    Difficulty grows with ``num_numbers`` (more numbers to place) and ``max_number``.
    """

    num_numbers: int = 4
    max_number: int = 100
    format_reward: float = 0.1
    max_target: int = 1000

    name = "countdown"
    instructions = (
        "Write the final expression on its own line as '#### <expression>', "
        "using each given number exactly once."
    )

    def __post_init__(self) -> None:
        for field_name, low, high in (
            ("num_numbers", 2, 6),
            ("max_number", 2, 10_000),
            ("max_target", 1, 1_000_000),
        ):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{field_name} must be an int in {low}..{high}, got {value!r}")
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))

    def _draw(self, rng: random.Random) -> tuple[list[int], int, str, list[str]]:
        """Numbers, target, solution expression and its steps; redraws until a tree fits."""
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
            folded = _fold(numbers, rng)
            if folded is not None and folded[0] <= self.max_target:
                return numbers, *folded

    def generate(self, count: int, seed: int, split: str = "train") -> list[Problem]:
        """``count`` distinct solvable problems, deterministic in ``(seed, split)``.

        Problems with the same numbers (in any order) and target count as the same problem,
        and never appear in two splits.
        """
        drawn = sample_split(
            count,
            seed,
            split,
            self._draw,
            key=lambda item: f"{sorted(item[0])} -> {item[1]}",
            what=self.name,
        )
        problems = []
        for index, (numbers, target, solution, steps) in enumerate(drawn):
            prompt = (
                f"Using the numbers {numbers} exactly once each, with + - * / and parentheses, "
                f"write an expression equal to {target}. Put the expression after ####."
            )
            problems.append(
                Problem(
                    id=f"{self.name}-{split}-{seed}-{index}",
                    prompt=prompt,
                    answer=json.dumps({"numbers": numbers, "target": target}),
                    sft_target="\n".join([*steps, f"#### {solution}"]),
                    meta={"numbers": numbers, "target": target, "solution": solution},
                )
            )
        return problems

    def score(self, response: str, problem_answer: str) -> Score:
        """Check the expression after the last ``####`` (see the module docstring)."""
        spec = json.loads(problem_answer)
        numbers, target = spec["numbers"], spec["target"]
        expression = extract_expression(response)
        node = None if expression is None else parse_expression(expression)
        if node is None:
            return Score(reward=0.0, correct=False, formatted=False, parsed=expression)
        correct = False
        if Counter(literals(node)) == Counter(numbers):
            try:
                correct = evaluate(node) == target
            except ZeroDivisionError:
                correct = False
        reward = 1.0 if correct else self.format_reward
        return Score(reward=reward, correct=correct, formatted=True, parsed=expression)
