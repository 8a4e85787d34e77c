"""Every task's answer parser on hostile responses of up to ~1 MB: unclosed and nested braces,
long digit runs, and repeated patterns that make a backtracking regex take quadratic time.

The bounds are wall-clock but generous: the linear parsers take milliseconds on these inputs,
the quadratic ones they replace took seconds to minutes (8,000 unclosed ``\\boxed{``: 15 s)."""

from __future__ import annotations

import time
from functools import partial

import pytest

from llmrl.envs.tasks import ifeval_checks
from llmrl.envs.tasks.base import ANSWER_WINDOW_CHARS
from llmrl.envs.tasks.countdown import extract_expression, parse_expression
from llmrl.envs.tasks.gsm8k import strip_calculator_annotations
from llmrl.envs.tasks.math import last_boxed
from llmrl.envs.tasks.numbers import extract_final_answer, normalize_number

SIZE = 1_000_000
ATTACKS = {
    "unclosed-boxed": "\\boxed{" * (SIZE // 7),
    "boxed-then-space": "\\boxed " * (SIZE // 7),
    "open-braces": "{" * SIZE,
    "digit-run": "#### " + "1" * SIZE,
    "comma-groups": "#### " + "1,234" * (SIZE // 5) + "x",
    "hashes": "####" * (SIZE // 4),
    "signs": "#### " + "$-" * (SIZE // 2),
    "exclamations": "!" * SIZE + "x",
    "open-bracket": "[" + "a" * SIZE,
    "open-title": "<<" + "a" * SIZE,
    "blank-brackets": "[ " * (SIZE // 2),
    "newlines": "\n" * SIZE,
    "fence-of-spaces": "```" + " " * SIZE + "x",
    "stars": "*a" * (SIZE // 2),
    "json-nesting": "[" * SIZE,
    "hyphenated": "a-" * (SIZE // 2),
}
IFEVAL_KWARGS = {"int": 3, "index": 1, "relation": "less than", "text": "P.S.", "letter": "a",
                 "words": ["a", "b"]}  # fmt: skip


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


@pytest.mark.parametrize("name", ATTACKS)
def test_answer_extraction_is_fast_on_hostile_responses(name: str) -> None:
    text = ATTACKS[name]

    def extract() -> None:
        last_boxed(text)
        extract_final_answer(text)
        expression = extract_expression(text)
        if expression is not None:
            parse_expression(expression)
        strip_calculator_annotations(text)
        normalize_number(text[:ANSWER_WINDOW_CHARS])

    assert _timed(extract) < 2.0  # ~0.03 s here; the windowed parsers read 20,000 characters


@pytest.mark.parametrize("name", ATTACKS)
def test_every_ifeval_check_is_linear_on_hostile_responses(name: str) -> None:
    text = ATTACKS[name][:200_000]  # ifeval checks the whole response: no window
    for instruction_id, checker in ifeval_checks.CHECKERS.items():
        kwargs = {key: IFEVAL_KWARGS[kind] for key, kind in checker.params.items()}
        seconds = _timed(partial(ifeval_checks.check_instruction, instruction_id, kwargs, text))
        # ~0.01 s each here; a quadratic pattern (the old placeholder, title, sentence-end and
        # postscript regexes) takes minutes on 200,000 characters.
        assert seconds < 2.0, instruction_id


def test_8000_unclosed_boxes_are_extracted_in_linear_time() -> None:
    """The 15 s attack: the brace pairing is one pass, so 10x the boxes costs ~10x, not ~100x
    (window lifted to measure the algorithm, not the cut)."""

    def cost(boxes: int) -> float:
        text = "\\boxed{" * boxes + "\\boxed{42}" + "\\boxed{" * boxes
        return min(_timed(lambda: last_boxed(text, window=len(text))) for _ in range(3))

    small, large = cost(2_000), cost(20_000)
    assert last_boxed("\\boxed{" * 8_000) is None
    assert last_boxed("\\boxed{" * 8_000 + "\\boxed{42}") == "42"
    assert large < 30 * small + 0.05  # quadratic: ~100x; linear: ~10x (+ slack for a busy CPU)


def test_the_window_keeps_the_answer_at_the_end() -> None:
    padding = "x" * (2 * ANSWER_WINDOW_CHARS)
    assert last_boxed(padding + "\\boxed{7}") == "7"
    assert last_boxed("\\boxed{7}" + padding) is None  # before the window: not read
    assert extract_final_answer(padding + "#### 12") == "12"
    assert extract_expression(padding + "#### 1 + 2") == "1 + 2"


def test_placeholders_titles_and_sentences_count_as_before() -> None:
    check = ifeval_checks.check_instruction
    assert check("detectable_content:number_placeholders", {"num_placeholders": 2}, "[a] [ ] [b]")
    assert not check("detectable_content:number_placeholders", {"num_placeholders": 2}, "[a] [ ]")
    assert check("detectable_format:title", {}, "<< >> then <<Title>>")
    assert not check("detectable_format:title", {}, "<< >> and <<\t>>")
    assert ifeval_checks.count_sentences('Hi!!! "Yes!" he said. Ok?! fine') == 5
    postscript = {"postscript_marker": "P.S."}
    assert check("detectable_content:postscript", postscript, "body\n\n  P. S. bye")
    assert not check("detectable_content:postscript", postscript, "body P.S. bye")
    assert check("detectable_format:json_format", {}, '```json\n{"a": 1}\n```')
    assert check("detectable_format:json_format", {}, "```\n[1]```")
    assert not check("detectable_format:json_format", {}, "```json```")
