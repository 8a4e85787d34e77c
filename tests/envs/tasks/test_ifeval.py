"""IFEval-style constraints: each check, spec round trips, compatibility, generation, scoring."""

from __future__ import annotations

import itertools
import json

import pytest

from llmrl.envs.tasks.base import Task
from llmrl.envs.tasks.ifeval import (
    CONSTRAINT_TYPES,
    PROMPTS,
    AllLowercase,
    BulletPoints,
    EndsWith,
    IFEvalTask,
    IncludeKeywords,
    JsonFormat,
    NoCommas,
    WordCountAtLeast,
    WordCountAtMost,
    compatible,
    constraint_from_spec,
    constraint_to_spec,
    constraints_from_answer,
    constraints_to_answer,
    count_words,
)

ALL = [
    WordCountAtLeast(50),
    WordCountAtMost(80),
    IncludeKeywords(("ocean", "Paris")),
    NoCommas(),
    AllLowercase(),
    JsonFormat(),
    EndsWith("Any other questions?"),
    BulletPoints(3),
]


def test_is_a_task() -> None:
    assert isinstance(IFEvalTask(), Task)
    with pytest.raises(ValueError, match="format_reward"):
        IFEvalTask(format_reward=1.0)
    with pytest.raises(ValueError, match="all_or_nothing"):
        IFEvalTask(all_or_nothing=1)


def test_count_words() -> None:
    assert count_words("it's well-known, 42") == 3
    assert count_words("  one\ntwo\tthree!  ") == 3
    assert count_words("") == 0


def test_word_counts() -> None:
    assert WordCountAtLeast(3).check("one two three")
    assert not WordCountAtLeast(3).check("one two")
    assert WordCountAtMost(2).check("one, two.")
    assert not WordCountAtMost(2).check("one two three")


def test_include_keywords() -> None:
    keywords = IncludeKeywords(("ocean", "lantern"))
    assert keywords.check("The OCEAN glowed under a Lantern.")
    assert not keywords.check("The ocean glowed.")  # one missing
    assert not keywords.check("Oceanic lanterns everywhere.")  # inside other words
    assert not IncludeKeywords(("cat",)).check("concatenate the catalog")
    assert IncludeKeywords(("cat",)).check("a cat's toy")


def test_no_commas_and_lowercase() -> None:
    assert NoCommas().check("no commas here.")
    assert not NoCommas().check("one, two")
    assert not NoCommas().check("fullwidth，comma")
    assert AllLowercase().check("all lowercase, 100%.")
    assert not AllLowercase().check("Not lowercase")
    assert not AllLowercase().check("123 456")  # no letters at all


@pytest.mark.parametrize(
    ("response", "ok"),
    [
        ('{"title": "x", "n": 1}', True),
        ('  {"a": [1, 2]}\n', True),
        ('```json\n{"a": 1}\n```', True),
        ('```JSON\n{"a": 1}\n```', True),
        ('```\n{"a": 1}\n```', True),
        ("[1, 2]", False),  # an array, not an object
        ('Here you go: {"a": 1}', False),
        ('```json\n{"a": 1}\n```\nHope this helps!', False),
        ("{'a': 1}", False),
        ("[" * 100_000, False),  # deep nesting does not crash
    ],
)
def test_json_format(response: str, ok: bool) -> None:
    assert JsonFormat().check(response) is ok


def test_ends_with() -> None:
    end = EndsWith("Any other questions?")
    assert end.check("Done. Any other questions?  \n")
    assert not end.check("Done. Any other questions? Bye.")
    assert not end.check("Done. any other questions?")  # exact phrase, case included


def test_bullet_points() -> None:
    bullets = BulletPoints(3)
    assert bullets.check("Intro\n* one\n* two\n- three\nOutro")
    assert bullets.check("  * indented\n* two\n* three")
    assert not bullets.check("* one\n* two")
    assert not bullets.check("* one\n* two\n* three\n* four")
    assert not bullets.check("*one\n**bold**\n---\n* only")


@pytest.mark.parametrize("constraint", ALL, ids=lambda c: c.type)
def test_spec_round_trip(constraint) -> None:
    spec = constraint_to_spec(constraint)
    assert spec["type"] == constraint.type
    assert json.loads(json.dumps(spec)) == spec
    assert constraint_from_spec(spec) == constraint
    assert constraint.instruction()


def test_answer_round_trip_and_specs() -> None:
    answer = constraints_to_answer(ALL)
    assert constraints_from_answer(answer) == ALL
    assert json.loads(answer)[0] == {"type": "word_count_at_least", "n": 50}
    assert json.loads(answer)[2] == {"type": "include_keywords", "words": ["ocean", "Paris"]}
    assert set(CONSTRAINT_TYPES) == {c.type for c in ALL}


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ('[{"type": "rhyme_scheme"}]', "rhyme_scheme"),
        ('[{"type": "word_count_at_least"}]', "word_count_at_least"),
        ('[{"type": "word_count_at_least", "n": 0}]', "n must be"),
        ('[{"type": "bullet_points", "n": "3"}]', "n must be"),
        ('[{"type": "include_keywords", "words": "ocean"}]', "words"),
        ('[{"type": "ends_with", "phrase": " "}]', "phrase"),
        ('[{"n": 3}]', "type"),
        ("[]", "non-empty"),
        ('{"type": "no_commas"}', "list"),
        ("not json", "Expecting value"),
    ],
)
def test_bad_answers(answer: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        constraints_from_answer(answer)


def test_compatible() -> None:
    assert not compatible(JsonFormat(), BulletPoints(3))
    assert not compatible(EndsWith("the end."), JsonFormat())
    assert not compatible(NoCommas(), JsonFormat())
    assert not compatible(AllLowercase(), IncludeKeywords(("Paris",)))
    assert compatible(AllLowercase(), IncludeKeywords(("paris",)))
    assert not compatible(EndsWith("Any other questions?"), AllLowercase())
    assert not compatible(WordCountAtLeast(50), WordCountAtMost(100))
    assert not compatible(BulletPoints(5), BulletPoints(2))
    assert not compatible(WordCountAtMost(4), BulletPoints(5))
    assert compatible(WordCountAtMost(40), BulletPoints(5))
    assert compatible(JsonFormat(), IncludeKeywords(("ocean",)))


def test_generate() -> None:
    task = IFEvalTask()
    problems = task.generate(300, seed=0)
    assert len({p.prompt for p in problems}) == 300
    for problem in problems:
        constraints = constraints_from_answer(problem.answer)
        assert 1 <= len(constraints) <= 3
        assert all(compatible(a, b) for a, b in itertools.combinations(constraints, 2))
        assert problem.meta["base_prompt"] in PROMPTS
        assert problem.prompt.startswith(problem.meta["base_prompt"])
        assert all(c.instruction() in problem.prompt for c in constraints)
        assert constraints_to_answer(constraints) == problem.answer
    first = problems[0]
    assert first.id == "ifeval-train-0-0"
    assert json.loads(first.answer) == [
        {"type": "word_count_at_most", "n": 150},
        {"type": "ends_with", "phrase": "Any other questions?"},
    ]


def test_determinism_and_splits() -> None:
    task = IFEvalTask()
    assert task.generate(40, seed=4) == task.generate(40, seed=4)
    assert task.generate(40, seed=4) != task.generate(40, seed=5)
    train = {p.prompt for p in task.generate(1000, seed=0)}
    eval_ = {p.prompt for p in task.generate(100, seed=0, split="eval")}
    test = {p.prompt for p in task.generate(100, seed=1, split="test")}
    assert not train & eval_ and not train & test and not eval_ & test


def test_score() -> None:
    answer = constraints_to_answer([NoCommas(), AllLowercase(), WordCountAtLeast(4)])
    task = IFEvalTask()
    full = task.score("just four little words", answer)
    assert (full.reward, full.correct, full.formatted) == (1.0, True, True)
    partial = task.score("Just four, little words", answer)
    assert partial.reward == pytest.approx(1 / 3) and not partial.correct
    assert partial.parsed == "no_commas=fail, all_lowercase=fail, word_count_at_least=ok"
    blank = task.score("   \n", answer)  # blank satisfies nothing, even NoCommas
    assert (blank.reward, blank.correct, blank.formatted) == (0.0, False, False)
    strict = IFEvalTask(all_or_nothing=True)
    assert strict.score("Just four, little words", answer).reward == 0.0
    assert strict.score("just four little words", answer).reward == 1.0
    shaped = IFEvalTask(format_reward=0.1)
    assert shaped.score("NONE, OF, THEM", answer).reward == pytest.approx(0.1)
    assert shaped.score("Just four, little words", answer).reward == pytest.approx(0.1 + 0.9 / 3)
    assert shaped.score("", answer).reward == 0.0


def test_score_json_in_fence() -> None:
    answer = constraints_to_answer([JsonFormat(), IncludeKeywords(("lantern",))])
    response = '```json\n{"story": "A lantern swung in the wind."}\n```'
    assert IFEvalTask().score(response, answer).correct
