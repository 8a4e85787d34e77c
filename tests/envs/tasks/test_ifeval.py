"""IFEval: every supported instruction id on a passing and a failing reply, user rows, scoring."""

from __future__ import annotations

import itertools
import json

import pytest

from llmrl.config import PrepareConfig
from llmrl.data.datasets import DatasetError
from llmrl.data.prepare import load_prepared, prepare_dataset
from llmrl.envs.tasks.base import Task
from llmrl.envs.tasks.ifeval import (
    GENERATED_IDS,
    PROMPTS,
    IFEvalTask,
    compatible,
    instructions_from_answer,
    instructions_to_answer,
    problem_from_row,
)
from llmrl.envs.tasks.ifeval_checks import (
    SUPPORTED_IDS,
    check_instruction,
    count_sentences,
    count_words,
    validate_instruction,
)

# (id, kwargs, a reply that follows it, a reply that does not), each checked by hand.
CASES = [
    ("keywords:existence", {"keywords": ["ocean", "Paris"]}, "The OCEAN near paris.", "Oceans."),
    (
        "keywords:frequency",
        {"keyword": "cat", "frequency": 2, "relation": "at least"},
        "A cat and a Cat.",
        "A cat in a catalog.",
    ),
    (
        "keywords:frequency",
        {"keyword": "cat", "frequency": 2, "relation": "less than"},
        "One cat.",
        "cat cat",
    ),
    ("keywords:forbidden_words", {"forbidden_words": ["red"]}, "Reddish sky.", "A RED sky."),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 3, "let_relation": "at least"},
        "Zig zag zoo",
        "zig zag",
    ),
    (
        "length_constraints:number_words",
        {"relation": "less than", "num_words": 5},
        "one two three four",
        "one two three four five",
    ),
    (
        "length_constraints:number_words",
        {"relation": "at least", "num_words": 3},
        "it's well-known, really",
        "it's well-known",
    ),
    (
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 3},
        "One. Two!",
        "One. Two! Three?",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "First part.\n***\nSecond part.",
        "First part.\n***\n\n***\nSecond part.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "Intro here.\n\nThen, the end.",
        "Intro here.\n\nAfter that, the end.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], at [address].",
        "Dear [name], at [ ].",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Body.\n\np. s. see you",
        "Body. PS see you",
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "Intro\n* one\n- two\n**bold** line",
        "* one\n* two\n* three",
    ),
    ("detectable_format:constrained_response", {}, "My answer is no.", "My answer is nope."),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*first* and **second**",
        "*first* and ** **",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\nhi\nSECTION 2\nbye",
        "SECTION 1\nhi\nSection 2\nbye",
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', 'Here: {"a": 1}'),
    ("detectable_format:title", {}, "<<A Poem>>\nroses", "<< >>\nroses"),
    ("combination:two_responses", {}, "First take.\n******\nSecond take.", "Same.\n******\nSame."),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem."},
        "write a poem. Roses are red.",
        "Roses are red. Write a poem.",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        '"Done. any other questions?"\n',
        "Any other questions? Bye.",
    ),
    ("startend:quotation", {}, '  "quoted reply"\n', '"quoted" reply'),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "ONE capital here",
        "TWO CAPITAL words",
    ),
    ("change_case:english_capital", {}, "ALL CAPS, 100%!", "ALL CAPS but one"),
    ("change_case:english_lowercase", {}, "all lowercase, 100%.", "123 456"),
    ("punctuation:no_comma", {}, "no commas here.", "fullwidth，comma"),
]


def test_every_supported_id_has_cases() -> None:
    assert {case[0] for case in CASES} == set(SUPPORTED_IDS)
    assert len(SUPPORTED_IDS) == 24 and "language:response_language" not in SUPPORTED_IDS


@pytest.mark.parametrize(("instruction_id", "kwargs", "good", "bad"), CASES)
def test_checker(instruction_id: str, kwargs: dict, good: str, bad: str) -> None:
    assert check_instruction(instruction_id, kwargs, good) is True
    assert check_instruction(instruction_id, kwargs, bad) is False


def test_counts() -> None:
    assert count_words("it's well-known, 42") == 3
    assert count_words("") == 0
    assert count_sentences("Hi there. How are you? Fine") == 3
    assert count_sentences("Version 1.5 is out.") == 1


def test_kwargs_validation() -> None:
    # None values (the shape of the public set on the hub) are dropped; floats like 3.0 accepted
    kwargs = {"num_words": 3.0, "relation": "at least", "keywords": None, "prompt_to_repeat": None}
    assert validate_instruction("length_constraints:number_words", kwargs) == {
        "num_words": 3,
        "relation": "at least",
    }
    assert validate_instruction("punctuation:no_comma", None) == {}
    bad = [
        ("length_constraints:number_words", {"num_words": 3}, "needs the argument 'relation'"),
        ("length_constraints:number_words", {"num_words": 3, "relation": "exactly"}, "one of"),
        ("length_constraints:number_words", {"num_words": 0, "relation": "at least"}, "positive"),
        ("punctuation:no_comma", {"n": 1}, "does not take argument"),
        ("keywords:existence", {"keywords": "ocean"}, "list of strings"),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
            "single letter",
        ),
        ("language:response_language", {"language": "de"}, "language-identification"),
        ("rhyme:scheme", {}, "not a known instruction id"),
    ]
    for instruction_id, arguments, match in bad:
        with pytest.raises(ValueError, match=match):
            validate_instruction(instruction_id, arguments)


PUBLIC_ROWS = [
    {
        "key": 1000,
        "prompt": "Write a short note to a neighbour.",
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [{}, {"relation": "less than", "num_words": 8}],
    },
    {
        "key": 1001,
        "prompt": "Describe tea.",
        "instruction_id_list": ["change_case:english_lowercase", "keywords:existence"],
        "kwargs": [{"keywords": None}, {"keywords": ["leaf"], "num_words": None}],
    },
    {
        "key": 1002,
        "prompt": "Give a title.",
        "instruction_id_list": ["detectable_format:title"],
        "kwargs": [{}],
    },
]


def test_row_answer_round_trip_and_score() -> None:
    problem = problem_from_row(PUBLIC_ROWS[0], 4, "train")
    assert problem.id == "ifeval-train-00004" and problem.prompt == PUBLIC_ROWS[0]["prompt"]
    assert json.loads(problem.answer) == [
        {"id": "punctuation:no_comma", "kwargs": {}},
        {
            "id": "length_constraints:number_words",
            "kwargs": {"relation": "less than", "num_words": 8},
        },
    ]
    task = IFEvalTask()
    full = task.score("Hello there neighbour", problem.answer)
    assert (full.reward, full.correct, full.formatted) == (1.0, True, True)
    half = task.score("Hello, there neighbour, how are you doing today my friend", problem.answer)
    assert (half.reward, half.correct) == (0.0, False)
    one = task.score("Hello, neighbour", problem.answer)
    assert one.reward == 0.5 and not one.correct
    assert one.parsed == "punctuation:no_comma=fail, length_constraints:number_words=ok"
    blank = task.score("  \n", problem.answer)  # blank follows nothing, even no_comma
    assert (blank.reward, blank.correct, blank.formatted) == (0.0, False, False)
    assert IFEvalTask(all_or_nothing=True).score("Hello, neighbour", problem.answer).reward == 0.0
    shaped = IFEvalTask(format_reward=0.1)
    # float64 0.1 + (1 - 0.1) * 0.5: within an ulp of 0.55, inside approx's default rel=1e-6
    assert shaped.score("Hello, neighbour", problem.answer).reward == pytest.approx(0.55)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        (
            {
                "prompt": "x",
                "instruction_id_list": ["language:response_language"],
                "kwargs": [{"language": "de"}],
            },
            r"IFEval row 7, field 'instruction_id_list': instruction 1: instruction "
            r"'language:response_language' is not supported",
        ),
        (
            {"prompt": "x", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]},
            r"field 'kwargs': expected a list of 1 objects",
        ),
        (
            {"prompt": "x", "instruction_id_list": [], "kwargs": []},
            r"field 'instruction_id_list': expected a non-empty list",
        ),
        (
            {
                "prompt": "x",
                "instruction_id_list": ["detectable_format:title", "keywords:existence"],
                "kwargs": [{}, {}],
            },
            r"field 'kwargs': instruction 2: 'keywords:existence' needs the argument 'keywords'",
        ),
    ],
)
def test_bad_rows(row: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        problem_from_row(row, 7, "train")


def test_bad_answers() -> None:
    for answer, match in [
        ("[]", "non-empty"),
        ('[{"kwargs": {}}]', "'id'"),
        ('[{"id": "language:response_language", "kwargs": {}}]', "not supported"),
        ("not json", "Expecting value"),
    ]:
        with pytest.raises(ValueError, match=match):
            instructions_from_answer(answer)


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_user_jsonl_prepares_and_scores(tmp_path) -> None:
    source = tmp_path / "ifeval.jsonl"
    write_jsonl(source, PUBLIC_ROWS * 1)
    config = PrepareConfig(task="ifeval", source=str(source), output_dir=tmp_path / "out")
    assert not config.is_generated
    prepared = prepare_dataset(config, progress=False)
    train, eval_problems = load_prepared(prepared.path)
    problems = {p.meta["index"]: p for p in train + eval_problems}
    assert sorted(problems) == [1, 2, 3]
    task = IFEvalTask()
    assert task.score("a leaf in hot water", problems[2].answer).correct
    assert not task.score("A leaf in hot water", problems[2].answer).correct
    assert task.score("<<Tea>>", problems[3].answer).reward == 1.0


def test_unsupported_id_fails_prepare_naming_row_and_id(tmp_path) -> None:
    rows = [*PUBLIC_ROWS]
    rows.insert(
        1,
        {
            "key": 9,
            "prompt": "Antworte auf Deutsch.",
            "instruction_id_list": ["language:response_language"],
            "kwargs": [{"language": "de"}],
        },
    )
    source = tmp_path / "ifeval.jsonl"
    write_jsonl(source, rows)
    config = PrepareConfig(task="ifeval", source=str(source), output_dir=tmp_path / "out")
    with pytest.raises(DatasetError) as caught:
        prepare_dataset(config, progress=False)
    message = str(caught.value)
    assert message.startswith(f"{source}: row 2: field 'instruction_id_list': unparseable: ")
    assert "'language:response_language' is not supported" in message
    skipping = PrepareConfig(
        task="ifeval", source=str(source), on_invalid="skip", output_dir=tmp_path / "out"
    )
    assert prepare_dataset(skipping, progress=False).manifest["skipped"] == {"unparseable": 1}


def test_missing_structured_field_names_it(tmp_path) -> None:
    source = tmp_path / "ifeval.jsonl"
    write_jsonl(source, [{"prompt": "x", "instruction_id_list": ["punctuation:no_comma"]}])
    config = PrepareConfig(task="ifeval", source=str(source), output_dir=tmp_path / "out")
    with pytest.raises(DatasetError, match=r"row 1: field 'kwargs': missing \(the row's fields"):
        prepare_dataset(config, progress=False)


def test_is_a_task() -> None:
    assert isinstance(IFEvalTask(), Task)
    with pytest.raises(ValueError, match="format_reward"):
        IFEvalTask(format_reward=1.0)
    with pytest.raises(ValueError, match="all_or_nothing"):
        IFEvalTask(all_or_nothing=1)


def test_generated_problems_use_real_ids_and_one_checker() -> None:
    assert set(GENERATED_IDS) <= set(SUPPORTED_IDS)
    problems = IFEvalTask().generate(300, seed=0)
    assert len({p.prompt for p in problems}) == 300
    seen = set()
    for problem in problems:
        instructions = instructions_from_answer(problem.answer)
        assert 1 <= len(instructions) <= 3
        assert all(compatible(a, b) for a, b in itertools.combinations(instructions, 2))
        assert problem.meta["base_prompt"] in PROMPTS and problem.prompt.startswith(
            problem.meta["base_prompt"]
        )
        assert instructions_to_answer(instructions) == problem.answer
        seen |= {i for i, _ in instructions}
    assert seen == set(GENERATED_IDS)
    # a generated problem and the same instructions as a user row share the answer
    first = instructions_from_answer(problems[0].answer)
    row = {
        "prompt": problems[0].prompt,
        "instruction_id_list": [i for i, _ in first],
        "kwargs": [kw for _, kw in first],
    }
    assert problem_from_row(row, 1, "train").answer == problems[0].answer


def test_compatible() -> None:
    json_format = ("detectable_format:json_format", {})
    assert not compatible(
        json_format, ("detectable_format:number_bullet_lists", {"num_bullets": 3})
    )
    assert not compatible(("punctuation:no_comma", {}), json_format)
    lower = ("change_case:english_lowercase", {})
    assert not compatible(lower, ("keywords:existence", {"keywords": ["Paris"]}))
    assert compatible(lower, ("keywords:existence", {"keywords": ["paris"]}))
    short = ("length_constraints:number_words", {"relation": "less than", "num_words": 5})
    assert not compatible(short, ("detectable_format:number_bullet_lists", {"num_bullets": 5}))
    assert not compatible(short, short)


def test_determinism_and_splits() -> None:
    task = IFEvalTask()
    assert task.generate(40, seed=4) == task.generate(40, seed=4)
    assert task.generate(40, seed=4) != task.generate(40, seed=5)
    train = {p.prompt for p in task.generate(1000, seed=0)}
    eval_ = {p.prompt for p in task.generate(100, seed=0, split="eval")}
    assert not train & eval_


def test_generated_prepare_still_works(tmp_path) -> None:
    config = PrepareConfig(
        task="ifeval", generate={"train_size": 5, "eval_size": 2}, output_dir=tmp_path
    )
    assert config.is_generated
    train, eval_problems = load_prepared(prepare_dataset(config, progress=False).path)
    assert len(train) == 5 and len(eval_problems) == 2
    assert IFEvalTask().score("ok", train[0].answer).formatted
