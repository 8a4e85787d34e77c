"""Final-answer extraction and number normalization for the ``#### <number>`` answer format.

Arithmetic and GSM8K share GSM8K's convention: the response ends with the final answer on its
own line as ``#### <number>``. Rules, in the order they apply:

* the **last** ``####`` in the response wins (earlier ones are drafts);
* the answer is the **first number token on the rest of that line** (``#### **42** apples`` gives
  ``42``); a number on a later line does not count, and neither does a number without ``####``;
* numbers normalize to a canonical string: spaces, a leading ``$`` and ``+``, thousands commas
  (well grouped: ``1,234`` yes, ``12,34`` no), a trailing ``.`` and trailing fractional zeros go
  away (``1,234.00`` -> ``1234``, ``3.50`` -> ``3.5``), ``-0`` -> ``0``, and the unicode minus
  ``−`` reads as ``-``. Fractions (``3/4``), percents and scientific notation are not numbers
  here (``3/4`` reads as ``3``).

Example:
    >>> extract_final_answer("8 * 12 = 96\\n37 + 96 = 133\\n#### 133")
    '133'
    >>> normalize_number("$1,234.00")
    '1234'
"""

from __future__ import annotations

import re

from llmrl.envs.tasks.base import ANSWER_WINDOW_CHARS, Score

FINAL_ANSWER_INSTRUCTIONS = (
    "Solve the problem step by step, then give the final answer on its own line as '#### <number>'."
)

_MINUS = "−"  # U+2212, the unicode minus sign
_NUMBER = re.compile(
    r"(?P<sign>[-+]?)\s*\$?\s*(?P<sign2>[-+]?)"
    r"(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)?(?:\.(?P<frac>[0-9]+))?\.?"
)
# A number-looking token inside free text: optional sign and "$", digits with commas, decimals.
# Digits glued to a word or a decimal point ("x2", "v1.5") do not start a token.
_TOKEN = re.compile(r"(?<![\w.])[-+−]?\$?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)")


def normalize_number(text: str) -> str | None:
    """The canonical string of a written number, or ``None`` when ``text`` is not one.

    Example:
        >>> [normalize_number(t) for t in ["1,234", "$18.", "3.50", "-0", "−7", "+5", "abc"]]
        ['1234', '18', '3.5', '0', '-7', '5', None]
    """
    match = _NUMBER.fullmatch(text.strip().replace(_MINUS, "-"))
    if match is None or (match["int"] is None and match["frac"] is None):
        return None
    if match["sign"] and match["sign2"]:
        return None
    integer = (match["int"] or "0").replace(",", "").lstrip("0") or "0"
    fraction = (match["frac"] or "").rstrip("0")
    number = f"{integer}.{fraction}" if fraction else integer
    negative = "-" in (match["sign"], match["sign2"])
    return f"-{number}" if negative and number != "0" else number


def extract_final_answer(response: str) -> str | None:
    """The normalized first number after the last ``####`` on its line, or ``None``.

    Only the last :data:`~llmrl.envs.tasks.base.ANSWER_WINDOW_CHARS` characters are read.

    Example:
        >>> extract_final_answer("#### 7\\nwait, no.\\n#### $1,234.00 dollars")
        '1234'
        >>> extract_final_answer("The answer is 42.") is None
        True
    """
    response = response[-ANSWER_WINDOW_CHARS:]
    start = response.rfind("####")
    if start < 0:
        return None
    line = response[start + 4 :].split("\n", 1)[0]
    token = _TOKEN.search(line)
    if token is None:
        return None
    return normalize_number(token.group().rstrip(","))


def score_final_answer(response: str, reference: str, format_reward: float) -> Score:
    """Exact-match scoring shared by arithmetic and GSM8K.

    1.0 when the extracted answer equals the (normalized) reference, ``format_reward`` when a
    ``#### <number>`` answer is present but wrong, 0.0 when there is none.

    Example:
        >>> score_final_answer("#### 133", "133", 0.1).reward
        1.0
    """
    expected = normalize_number(reference)
    if expected is None:
        raise ValueError(f"reference answer {reference!r} is not a number")
    parsed = extract_final_answer(response)
    if parsed is None:
        return Score(reward=0.0, correct=False, formatted=False, parsed=None)
    correct = parsed == expected
    return Score(
        reward=1.0 if correct else format_reward, correct=correct, formatted=True, parsed=parsed
    )
