"""IFEval instruction following: a prompt plus instructions from the public IFEval id set.

Data. A row has the shape of the public IFEval set (google/IFEval)::

    {"key": 1000, "prompt": "Write a 300+ word summary ...",
     "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
     "kwargs": [{}, {"relation": "at least", "num_words": 300}]}

one kwargs object per instruction id (``None`` values and a ``None`` object mean "no
argument"; ``key`` is optional and not used). ``llmrl prepare --set task=ifeval --set
source=file.jsonl`` reads such rows (any format ``prepare`` reads); :func:`problem_from_row`
validates them, so an unsupported id or a bad argument fails at prepare time naming the row and
the id. Without a ``source``, ``prepare`` generates problems instead: a writing prompt from
:data:`PROMPTS` plus 1-3 instructions drawn from :data:`GENERATED_IDS` with real IFEval kwargs,
so generated and user rows share one answer format and one checker.

Supported ids (checkers in :mod:`llmrl.envs.tasks.ifeval_checks`, which documents the exact
semantics): keywords:existence, keywords:frequency, keywords:forbidden_words,
keywords:letter_frequency, length_constraints:number_words, length_constraints:number_sentences,
length_constraints:number_paragraphs, length_constraints:nth_paragraph_first_word,
detectable_content:number_placeholders, detectable_content:postscript,
detectable_format:number_bullet_lists, detectable_format:constrained_response,
detectable_format:number_highlighted_sections, detectable_format:multiple_sections,
detectable_format:json_format, detectable_format:title, combination:two_responses,
combination:repeat_prompt, startend:end_checker, startend:quotation,
change_case:capital_word_frequency, change_case:english_capital,
change_case:english_lowercase, punctuation:no_comma. Not supported: language:response_language
(it needs a language-ID model); a row using it, or any other id, is an invalid row.

A problem's answer is the JSON list ``[{"id": ..., "kwargs": {...}}, ...]`` of its instructions
(see :func:`instructions_to_answer`).

Reward (strict, per instruction, on the raw response): ``base`` is the fraction of instructions
followed (1 or 0 with ``all_or_nothing``), ``reward = format_reward + (1 - format_reward) *
base`` for a non-blank response; a blank one scores 0 and follows nothing. ``correct`` means
every instruction is followed (IFEval's prompt-level strict accuracy). Only the instructions are
checked, not whether the text answers the prompt.

Example:
    >>> answer = instructions_to_answer([("punctuation:no_comma", {}),
    ...     ("length_constraints:number_words", {"relation": "less than", "num_words": 5})])
    >>> IFEvalTask().score("short and sweet", answer).reward
    1.0
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmrl.data.problem import Problem
from llmrl.envs.tasks.base import Score, check_format_reward, sample_split
from llmrl.envs.tasks.ifeval_checks import (
    SUPPORTED_IDS,
    check_instruction,
    count_words,
    validate_instruction,
)

__all__ = [
    "GENERATED_IDS",
    "PROMPTS",
    "SUPPORTED_IDS",
    "IFEvalTask",
    "Instruction",
    "compatible",
    "count_words",
    "instruction_text",
    "instructions_from_answer",
    "instructions_to_answer",
    "problem_from_row",
]

Instruction = tuple[str, dict[str, Any]]
"""``(instruction id, normalized kwargs)``."""


def instructions_to_answer(instructions: Sequence[Instruction]) -> str:
    """A problem's answer: the JSON list of its instructions, kwargs validated and normalized.

    Raises:
        ValueError: an unsupported id or a bad argument.
    """
    specs = [{"id": i, "kwargs": validate_instruction(i, kw)} for i, kw in instructions]
    if not specs:
        raise ValueError("an ifeval problem needs at least one instruction")
    return json.dumps(specs, ensure_ascii=False)


def instructions_from_answer(answer: str) -> list[Instruction]:
    """Read back :func:`instructions_to_answer`'s JSON; ``ValueError`` when malformed."""
    specs = json.loads(answer)
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"an ifeval answer must be a non-empty JSON list, got {answer!r}")
    instructions = []
    for spec in specs:
        if not isinstance(spec, dict) or "id" not in spec:
            raise ValueError(f"an ifeval instruction must be an object with an 'id', got {spec!r}")
        instructions.append((spec["id"], validate_instruction(spec["id"], spec.get("kwargs"))))
    return instructions


def problem_from_row(row: dict[str, Any], index: int, split: str) -> Problem:
    """One IFEval row (``prompt``, ``instruction_id_list``, ``kwargs``) as a :class:`Problem`.

    Raises:
        ValueError: naming the row, the field and the instruction (its position and id).

    Example:
        >>> row = {"prompt": "Say hi.", "instruction_id_list": ["punctuation:no_comma"],
        ...        "kwargs": [{}]}
        >>> problem_from_row(row, 3, "train").id
        'ifeval-train-00003'
    """
    prompt, ids, kwargs = row.get("prompt"), row.get("instruction_id_list"), row.get("kwargs")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"IFEval row {index}, field 'prompt': expected a non-blank string")
    if isinstance(ids, tuple):
        ids = list(ids)
    if not isinstance(ids, list) or not ids:
        raise ValueError(
            f"IFEval row {index}, field 'instruction_id_list': expected a non-empty list of "
            f"instruction ids, got {ids!r}"
        )
    if kwargs is None:
        kwargs = [{}] * len(ids)
    if isinstance(kwargs, tuple):
        kwargs = list(kwargs)
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        count = len(kwargs) if isinstance(kwargs, list) else type(kwargs).__name__
        raise ValueError(
            f"IFEval row {index}, field 'kwargs': expected a list of {len(ids)} objects (one per "
            f"instruction id), got {count}"
        )
    instructions = []
    for position, (instruction_id, arguments) in enumerate(zip(ids, kwargs, strict=True), 1):
        field = "kwargs" if instruction_id in SUPPORTED_IDS else "instruction_id_list"
        try:
            instructions.append((instruction_id, validate_instruction(instruction_id, arguments)))
        except ValueError as error:
            raise ValueError(
                f"IFEval row {index}, field '{field}': instruction {position}: {error}"
            ) from None
    return Problem(
        id=f"ifeval-{split}-{index:05d}",
        prompt=prompt.strip(),
        answer=instructions_to_answer(instructions),
        meta={"split": split, "index": index},
    )


# --- the generator: real ids, real kwargs ------------------------------------------------------

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
KEYWORDS += ("Monday", "Paris")  # capitalized: never paired with english_lowercase
END_PHRASES = ("Is there anything else I can help with?", "Any other questions?", "that is all.")

_SAMPLERS: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "length_constraints:number_words": lambda rng: rng.choice(
        [{"relation": "at least", "num_words": n} for n in (50, 100, 150, 200, 300)]
        + [{"relation": "less than", "num_words": n} for n in (40, 60, 80, 100, 150)]
    ),
    "keywords:existence": lambda rng: {"keywords": rng.sample(KEYWORDS, rng.randint(1, 3))},
    "punctuation:no_comma": lambda rng: {},
    "change_case:english_lowercase": lambda rng: {},
    "detectable_format:json_format": lambda rng: {},
    "startend:end_checker": lambda rng: {"end_phrase": rng.choice(END_PHRASES)},
    "detectable_format:number_bullet_lists": lambda rng: {"num_bullets": rng.randint(2, 5)},
}
GENERATED_IDS: tuple[str, ...] = tuple(sorted(_SAMPLERS))
"""The instruction ids the generator draws from (a subset of :data:`SUPPORTED_IDS`)."""


def instruction_text(instruction_id: str, kwargs: dict[str, Any]) -> str:
    """The sentence a generated prompt uses for one of :data:`GENERATED_IDS`."""
    if instruction_id == "length_constraints:number_words":
        return f"Answer with {kwargs['relation']} {kwargs['num_words']} words."
    if instruction_id == "keywords:existence":
        quoted = ", ".join(f'"{w}"' for w in kwargs["keywords"])
        plural = "s" if len(kwargs["keywords"]) > 1 else ""
        return f"Make sure the word{plural} {quoted} appear{'' if plural else 's'} in your answer."
    if instruction_id == "startend:end_checker":
        return f"Finish your answer with the exact phrase: {kwargs['end_phrase']}"
    if instruction_id == "detectable_format:number_bullet_lists":
        return (
            f"Your answer must contain exactly {kwargs['num_bullets']} bullet points, each on its "
            "own line starting with '* '."
        )
    fixed = {
        "punctuation:no_comma": "Do not use any commas anywhere in your answer.",
        "change_case:english_lowercase": "Write your whole answer in lowercase letters only.",
        "detectable_format:json_format": "Format your entire answer as JSON (a ```json fence "
        "around it is fine).",
    }
    return fixed[instruction_id]


def compatible(a: Instruction, b: Instruction) -> bool:
    """Whether two generated instructions fit one natural response (no two of a kind, no JSON
    with bullets or a closing phrase, no capitalized keyword with lowercase, room for words)."""
    ids = {a[0], b[0]}
    if a[0] == b[0]:
        return False
    if "detectable_format:json_format" in ids and ids & {
        "detectable_format:number_bullet_lists",
        "startend:end_checker",
        "punctuation:no_comma",
    }:
        return False
    for (one, one_kw), (_, other_kw) in ((a, b), (b, a)):
        text = " ".join(other_kw.get("keywords", ())) + " " + other_kw.get("end_phrase", "")
        if one == "change_case:english_lowercase" and text != text.lower():
            return False
        if one == "length_constraints:number_words" and one_kw["relation"] == "less than":
            # Each bullet point needs a word; keywords and the closing phrase need theirs.
            needed = count_words(text) + other_kw.get("num_bullets", 0)
            if needed >= one_kw["num_words"]:
                return False
    return True


@dataclass(frozen=True)
class IFEvalTask:
    """IFEval problems (generated or read from IFEval-format rows), scored per instruction."""

    format_reward: float = 0.0
    all_or_nothing: bool = False

    name = "ifeval"
    instructions = "Follow every instruction in the prompt exactly."

    def __post_init__(self) -> None:
        object.__setattr__(self, "format_reward", check_format_reward(self.format_reward))
        if not isinstance(self.all_or_nothing, bool):
            raise ValueError(f"all_or_nothing must be a bool, got {self.all_or_nothing!r}")

    def _draw(self, rng: random.Random) -> tuple[str, list[Instruction]]:
        base = rng.choice(PROMPTS)
        wanted = rng.randint(1, 3)
        chosen: list[Instruction] = []
        while len(chosen) < wanted:
            instruction_id = rng.choice(GENERATED_IDS)
            candidate = (instruction_id, _SAMPLERS[instruction_id](rng))
            if all(compatible(candidate, other) for other in chosen):
                chosen.append(candidate)
        return base, chosen

    def generate(self, count: int, seed: int, split: str = "train") -> list[Problem]:
        """``count`` distinct problems, deterministic in ``(seed, split)``, disjoint across splits.

        Each pairs a base prompt from :data:`PROMPTS` with 1-3 pairwise :func:`compatible`
        instructions; the answer has the same shape as a user row's.
        """
        drawn = sample_split(
            count, seed, split, self._draw, key=lambda item: _prompt(*item), what=self.name
        )
        return [
            Problem(
                id=f"{self.name}-{split}-{seed}-{index}",
                prompt=_prompt(base, instructions),
                answer=instructions_to_answer(instructions),
                meta={"base_prompt": base},
            )
            for index, (base, instructions) in enumerate(drawn)
        ]

    def score(self, response: str, problem_answer: str) -> Score:
        """Fraction (or all-or-nothing) of the answer's instructions the response follows."""
        instructions = instructions_from_answer(problem_answer)
        if not response.strip():
            return Score(reward=0.0, correct=False, formatted=False, parsed=None)
        results = [check_instruction(i, kw, response) for i, kw in instructions]
        correct = all(results)
        base = float(correct) if self.all_or_nothing else sum(results) / len(results)
        summary = ", ".join(
            f"{i}={'ok' if ok else 'fail'}"
            for (i, _), ok in zip(instructions, results, strict=True)
        )
        reward = self.format_reward + (1.0 - self.format_reward) * base
        return Score(reward=reward, correct=correct, formatted=True, parsed=summary)


def _prompt(base: str, instructions: list[Instruction]) -> str:
    return base + " " + " ".join(instruction_text(i, kw) for i, kw in instructions)
