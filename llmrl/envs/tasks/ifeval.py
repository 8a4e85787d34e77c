"""IFEval-style instruction following: a writing prompt plus 1-3 mechanically checkable rules.

Each constraint is a frozen dataclass with ``instruction()`` (the sentence added to the prompt),
``check(response)`` and a JSON spec (``{"type": "word_count_at_least", "n": 50}``). A problem's
answer is the JSON list of its specs; :func:`constraints_from_answer` reads it back.

Scoring: ``base`` is the fraction of constraints satisfied (1 or 0 with ``all_or_nothing``), and
``reward = format_reward + (1 - format_reward) * base`` for a non-blank response; a blank one
scores 0 and satisfies nothing. ``correct`` means all constraints hold. Only the rules are
checked, not whether the text answers the writing prompt.

Words are runs of letters/digits (``don't`` and ``well-known`` count once). ``EndsWith`` ignores
only trailing whitespace. ``JsonFormat`` accepts one JSON object, optionally in a ```json fence.

Example:
    >>> answer = constraints_to_answer([NoCommas(), WordCountAtMost(5)])
    >>> IFEvalTask().score("short and sweet", answer).reward
    1.0
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, fields
from typing import ClassVar, get_args

from llmrl.envs.tasks.base import Problem, Score, check_format_reward, sample_split

_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL | re.IGNORECASE)


def count_words(text: str) -> int:
    """Number of words in ``text``. Example: ``count_words("it's well-known, 42")`` is 3."""
    return len(_WORD.findall(text))


@dataclass(frozen=True)
class _Count:
    n: int

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive int, got {self.n!r}")


@dataclass(frozen=True)
class WordCountAtLeast(_Count):
    type: ClassVar[str] = "word_count_at_least"

    def instruction(self) -> str:
        return f"Your response should contain at least {self.n} words."

    def check(self, response: str) -> bool:
        return count_words(response) >= self.n


@dataclass(frozen=True)
class WordCountAtMost(_Count):
    type: ClassVar[str] = "word_count_at_most"

    def instruction(self) -> str:
        return f"Your response should contain at most {self.n} words."

    def check(self, response: str) -> bool:
        return count_words(response) <= self.n


@dataclass(frozen=True)
class IncludeKeywords:
    """Every keyword appears as a whole word, case-insensitively ("cat" is not in "concat")."""

    words: tuple[str, ...]
    type: ClassVar[str] = "include_keywords"

    def __post_init__(self) -> None:
        words = tuple(self.words) if isinstance(self.words, (list, tuple)) else ()
        if not words or not all(isinstance(w, str) and w.strip() for w in words):
            raise ValueError(f"words must be a non-empty list of strings, got {self.words!r}")
        object.__setattr__(self, "words", tuple(w.strip() for w in words))

    def instruction(self) -> str:
        quoted = ", ".join(f'"{w}"' for w in self.words)
        return f"Include the keyword{'s' if len(self.words) > 1 else ''} {quoted} in the response."

    def check(self, response: str) -> bool:
        return all(
            re.search(rf"(?<!\w){re.escape(w)}(?!\w)", response, re.IGNORECASE) for w in self.words
        )


@dataclass(frozen=True)
class NoCommas:
    type: ClassVar[str] = "no_commas"

    def instruction(self) -> str:
        return "In your entire response, refrain from the use of any commas."

    def check(self, response: str) -> bool:
        return "," not in response and "，" not in response


@dataclass(frozen=True)
class AllLowercase:
    """No uppercase character, and at least one letter."""

    type: ClassVar[str] = "all_lowercase"

    def instruction(self) -> str:
        return "Your entire response should be in lowercase letters. No capitals are allowed."

    def check(self, response: str) -> bool:
        return response == response.lower() and any(c.isalpha() for c in response)


@dataclass(frozen=True)
class JsonFormat:
    type: ClassVar[str] = "json_format"

    def instruction(self) -> str:
        return "Your entire response must be a single JSON object (a ```json fence is allowed)."

    def check(self, response: str) -> bool:
        text = response.strip()
        fenced = _FENCE.fullmatch(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except (ValueError, RecursionError):
            return False
        return isinstance(value, dict)


@dataclass(frozen=True)
class EndsWith:
    phrase: str
    type: ClassVar[str] = "ends_with"

    def __post_init__(self) -> None:
        if not isinstance(self.phrase, str) or not self.phrase.strip():
            raise ValueError(f"phrase must be a non-empty string, got {self.phrase!r}")
        object.__setattr__(self, "phrase", self.phrase.strip())

    def instruction(self) -> str:
        return f"End your response with this exact phrase and nothing after it: {self.phrase}"

    def check(self, response: str) -> bool:
        return response.rstrip().endswith(self.phrase)


@dataclass(frozen=True)
class BulletPoints(_Count):
    """Exactly ``n`` lines start (after indentation) with ``"* "`` or ``"- "``."""

    type: ClassVar[str] = "bullet_points"

    def instruction(self) -> str:
        return f"Use exactly {self.n} bullet points, each on its own line starting with '* '."

    def check(self, response: str) -> bool:
        bullets = [ln for ln in response.splitlines() if ln.lstrip().startswith(("* ", "- "))]
        return len(bullets) == self.n


Constraint = (
    WordCountAtLeast
    | WordCountAtMost
    | IncludeKeywords
    | NoCommas
    | AllLowercase
    | JsonFormat
    | EndsWith
    | BulletPoints
)
CONSTRAINT_TYPES: dict[str, type] = {cls.type: cls for cls in get_args(Constraint)}


def constraint_to_spec(constraint: Constraint) -> dict:
    """``{"type": ..., **params}``; e.g. ``{"type": "bullet_points", "n": 3}``."""
    spec: dict = {"type": constraint.type}
    for item in fields(constraint):
        value = getattr(constraint, item.name)
        spec[item.name] = list(value) if isinstance(value, tuple) else value
    return spec


def constraint_from_spec(spec: dict) -> Constraint:
    """Inverse of :func:`constraint_to_spec`; ``ValueError`` on unknown types or bad params."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"a constraint spec must be a dict with a 'type', got {spec!r}")
    params = {key: value for key, value in spec.items() if key != "type"}
    cls = CONSTRAINT_TYPES.get(spec["type"])
    if cls is None:
        raise ValueError(f"unknown constraint type {spec['type']!r}")
    try:
        return cls(**params)
    except TypeError as error:
        raise ValueError(f"bad parameters for constraint {spec['type']!r}: {params}") from error


def constraints_to_answer(constraints: list[Constraint]) -> str:
    """A problem's answer: the JSON list of its constraint specs."""
    return json.dumps([constraint_to_spec(c) for c in constraints])


def constraints_from_answer(answer: str) -> list[Constraint]:
    """Read back :func:`constraints_to_answer`'s JSON; ``ValueError`` when malformed."""
    specs = json.loads(answer)
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"an ifeval answer must be a non-empty JSON list, got {answer!r}")
    return [constraint_from_spec(spec) for spec in specs]


def compatible(a: Constraint, b: Constraint) -> bool:
    """Whether both rules fit one natural response (no two of a kind, no JSON with bullets...)."""
    kinds = {a.type, b.type}
    if a.type == b.type or kinds == {"word_count_at_least", "word_count_at_most"}:
        return False
    if "json_format" in kinds and kinds & {"bullet_points", "ends_with", "no_commas"}:
        return False
    for one, other in ((a, b), (b, a)):
        text = " ".join(getattr(other, "words", ())) + " " + getattr(other, "phrase", "")
        if isinstance(one, AllLowercase) and text != text.lower():
            return False
        # Each bullet point needs a word; keywords and the closing phrase need theirs.
        needed = count_words(text) + (other.n if isinstance(other, BulletPoints) else 0)
        if isinstance(one, WordCountAtMost) and needed > one.n:
            return False
    return True


PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe your ideal weekend morning.",
    "Explain to a high school student why sleep matters for learning.",
    "Write a product description for a reusable water bottle.",
    "Write a letter to a friend recommending a book you enjoyed.",
    "Explain how the gears on a bicycle work.",
    "Write a short blog post about starting a vegetable garden on a balcony.",
    "Describe a city you would like to visit and explain why.",
    "Give advice to someone preparing for their first job interview.",
    "Write a review of an imaginary restaurant that only serves soup.",
    "Explain the water cycle to a ten-year-old.",
    "Write a short speech welcoming new members to a chess club.",
    "Discuss the benefits and drawbacks of working from home.",
    "Write a diary entry from the point of view of a cat.",
    "Suggest ways to reduce food waste in a school cafeteria.",
    "Describe how to make a cup of tea for someone who has never made one.",
)
KEYWORDS = ("ocean", "lantern", "garden", "history", "balance", "future", "silence", "journey")
KEYWORDS += ("Monday", "Paris")  # capitalized: never paired with AllLowercase
END_PHRASES = ("Is there anything else I can help with?", "Any other questions?", "that is all.")


_SAMPLERS = {  # a random instance of each constraint type, for the generator
    "word_count_at_least": lambda rng: WordCountAtLeast(rng.choice((50, 100, 150, 200, 300))),
    "word_count_at_most": lambda rng: WordCountAtMost(rng.choice((40, 60, 80, 100, 150))),
    "include_keywords": lambda rng: IncludeKeywords(tuple(rng.sample(KEYWORDS, rng.randint(1, 3)))),
    "no_commas": lambda rng: NoCommas(),
    "all_lowercase": lambda rng: AllLowercase(),
    "json_format": lambda rng: JsonFormat(),
    "ends_with": lambda rng: EndsWith(rng.choice(END_PHRASES)),
    "bullet_points": lambda rng: BulletPoints(rng.randint(2, 5)),
}


@dataclass(frozen=True)
class IFEvalTask:
    """Generated instruction-following problems scored by the fraction of rules satisfied."""

    format_reward: float = 0.0
    all_or_nothing: bool = False

    name = "ifeval"
    instructions = "Follow every instruction in the prompt exactly."

    def __post_init__(self) -> None:
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))
        if not isinstance(self.all_or_nothing, bool):
            raise ValueError(f"all_or_nothing must be a bool, got {self.all_or_nothing!r}")

    def _draw(self, rng: random.Random) -> tuple[str, list[Constraint]]:
        base = rng.choice(PROMPTS)
        wanted = rng.randint(1, 3)
        chosen: list[Constraint] = []
        while len(chosen) < wanted:
            candidate = _SAMPLERS[rng.choice(sorted(_SAMPLERS))](rng)
            if all(compatible(candidate, other) for other in chosen):
                chosen.append(candidate)
        return base, chosen

    def generate(self, count: int, seed: int, split: str = "train") -> list[Problem]:
        """``count`` distinct problems, deterministic in ``(seed, split)``, disjoint across splits.

        Each pairs a base prompt from :data:`PROMPTS` with 1-3 pairwise :func:`compatible` rules.
        """
        drawn = sample_split(
            count, seed, split, self._draw, key=lambda item: _prompt(*item), what=self.name
        )
        return [
            Problem(
                id=f"{self.name}-{split}-{seed}-{index}",
                prompt=_prompt(base, constraints),
                answer=constraints_to_answer(constraints),
                meta={"base_prompt": base},
            )
            for index, (base, constraints) in enumerate(drawn)
        ]

    def score(self, response: str, problem_answer: str) -> Score:
        """Fraction (or all-or-nothing) of the answer's constraints the response satisfies."""
        constraints = constraints_from_answer(problem_answer)
        if not response.strip():
            return Score(reward=0.0, correct=False, formatted=False, parsed=None)
        results = [c.check(response) for c in constraints]
        correct = all(results)
        base = float(correct) if self.all_or_nothing else sum(results) / len(results)
        summary = ", ".join(
            f"{c.type}={'ok' if ok else 'fail'}" for c, ok in zip(constraints, results, strict=True)
        )
        reward = self.format_reward + (1.0 - self.format_reward) * base
        return Score(reward=reward, correct=correct, formatted=True, parsed=summary)


def _prompt(base: str, constraints: list[Constraint]) -> str:
    return base + " " + " ".join(c.instruction() for c in constraints)
