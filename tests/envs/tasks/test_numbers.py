"""Number normalization and ``#### <number>`` extraction shared by arithmetic and GSM8K."""

from __future__ import annotations

import pytest

from llmrl.envs.tasks.numbers import extract_final_answer, normalize_number, score_final_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", "42"),
        (" 42 ", "42"),
        ("1,234", "1234"),
        ("1,234,567", "1234567"),
        ("$18", "18"),
        ("$18.", "18"),
        ("18.", "18"),
        ("3.0", "3"),
        ("3.00", "3"),
        ("1,234.00", "1234"),
        ("3.5", "3.5"),
        ("3.50", "3.5"),
        (".5", "0.5"),
        ("007", "7"),
        ("+5", "5"),
        ("-5", "-5"),
        ("−5", "-5"),  # unicode minus
        ("-$5", "-5"),
        ("$-5", "-5"),
        ("-0", "0"),
        ("-0.00", "0"),
    ],
)
def test_normalize_number(text: str, expected: str) -> None:
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    "text", ["", ".", "abc", "12,34", "1,2", "1.2.3", "+-5", "3/4", "1e5", "50%", "4 2", "٣"]
)
def test_normalize_number_rejects(text: str) -> None:
    assert normalize_number(text) is None


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("8 * 12 = 96\n37 + 96 = 133\n#### 133", "133"),
        ("#### 7\nOops, let me redo that.\n#### 8", "8"),  # the last #### wins
        ("#### 1,234.00", "1234"),
        ("####42", "42"),  # no space
        ("#### $18.", "18"),
        ("#### −5", "-5"),
        ("#### -5", "-5"),
        ("#### **42**", "42"),  # markdown around the number
        ("#### 42 apples, I think.", "42"),  # trailing text on the line
        ("#### 42, final", "42"),
        ("#### x2 = 4", "4"),  # digits glued to a word are no number token
        ("#### 3/4", "3"),  # fractions are not numbers: the first token is read
        ("#####5", "5"),
    ],
)
def test_extract_final_answer(response: str, expected: str) -> None:
    assert extract_final_answer(response) == expected


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 42.",  # buried in text, no ####
        "",
        "####",
        "#### forty-two",
        "#### 12,34",  # malformed grouping
        "####\n42",  # the number must be on the #### line
        "#### 5\n#### none",  # the last #### has no number; an earlier one does not count
    ],
)
def test_extract_final_answer_none(response: str) -> None:
    assert extract_final_answer(response) is None


def test_score_final_answer() -> None:
    assert score_final_answer("work\n#### 1,234", "1234", 0.1).reward == 1.0
    wrong = score_final_answer("#### 1233", "1234", 0.1)
    assert (wrong.reward, wrong.correct, wrong.formatted, wrong.parsed) == (
        0.1,
        False,
        True,
        "1233",
    )
    missing = score_final_answer("it is 1234", "1234", 0.1)
    assert (missing.reward, missing.formatted, missing.parsed) == (0.0, False, None)
    assert score_final_answer("#### 5", "5.0", 0.0).correct  # the reference is normalized too


def test_score_final_answer_rejects_bad_reference() -> None:
    with pytest.raises(ValueError, match="not a number"):
        score_final_answer("#### 1", "one", 0.0)
