"""Offline checkers for the instruction ids of the public IFEval set (google/IFEval).

Each supported id has a checker ``(response, kwargs) -> bool`` and a declared list of keyword
arguments. :func:`validate_instruction` normalizes a row's kwargs for an id (drops ``None``
values, checks that required ones are there with the right type, rejects unknown ones) and
:func:`check_instruction` runs the checker. Written for this project from the public
descriptions of the instructions; the semantics below are ours where the public set leaves room.

Text units used by the checkers:

* a *word* is a run of letters/digits (``don't`` and ``well-known`` are one word);
* a *sentence* ends at ``.``, ``!`` or ``?`` followed by whitespace or the end of the text;
* keywords (``keywords:*``) match as whole words, case-insensitively ("cat" is not in
  "concatenate");
* ``relation`` (and ``let_relation``, ``capital_relation``) is ``"less than"`` (count < N) or
  ``"at least"`` (count >= N), as in the public set.

Not supported: ``language:response_language`` (needs a language-ID model); the ``english_*``
case checks test letter case only, not that the text is English.

Example:
    >>> check_instruction("punctuation:no_comma", {}, "no commas here")
    True
    >>> check_instruction("length_constraints:number_words",
    ...                   {"relation": "less than", "num_words": 5}, "one two three four five")
    False
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RELATIONS = ("less than", "at least")
UNSUPPORTED = {"language:response_language": "it needs a language-identification model"}
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
# Possessive quantifiers (``++``, ``*+``) and a lone ``\S`` never backtrack, so every pattern
# here runs in time linear in the response (a run of 1 MB of ``!`` or ``[`` included).
_SENTENCE_END = re.compile(r"(?<![.!?])[.!?]++[\"'’”)\]]*+(?=\s|$)")
_DIVIDER = re.compile(r"^[ \t]*\*\*\*[ \t]*$", re.MULTILINE)
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_BULLET = re.compile(r"^[ \t]*[*-][ \t]+\S", re.MULTILINE)
_HIGHLIGHT = re.compile(r"\*\*([^\n*]+)\*\*|\*([^\n*]+)\*")
_PLACEHOLDER = re.compile(r"\[[^\[\]\n]*+\]")  # counted when not blank (see _placeholders)
_TITLE = re.compile(r"<<[^\n<>]*+>>")  # a title when not blank (see _has_title)
_SEPARATOR = re.compile(r"(?<!\*)\*{6}(?!\*)")


def words(text: str) -> list[str]:
    """The words of ``text``. Example: ``words("it's well-known, 42")`` has 3."""
    return _WORD.findall(text)


def count_words(text: str) -> int:
    """Number of words in ``text``. Example: ``count_words("it's well-known, 42")`` is 3."""
    return len(words(text))


def count_sentences(text: str) -> int:
    """Sentences: text pieces with a word, ended by ``.``/``!``/``?`` + whitespace or the end.

    Example: ``count_sentences("Hi there. How are you? Fine")`` is 3.
    """
    return sum(1 for piece in _SENTENCE_END.split(text) if _WORD.search(piece))


def _keyword_count(text: str, keyword: str) -> int:
    pattern = rf"(?<!\w){re.escape(keyword.strip())}(?!\w)"
    return len(re.findall(pattern, text, re.IGNORECASE))


def _compare(count: int, relation: str, n: int) -> bool:
    return count < n if relation == "less than" else count >= n


def _paragraphs(text: str, separator: re.Pattern[str]) -> list[str] | None:
    """Paragraphs split by ``separator``; None when one in the middle is empty."""
    parts = [part.strip() for part in separator.split(text)]
    filled = [index for index, part in enumerate(parts) if part]
    parts = parts[filled[0] : filled[-1] + 1] if filled else []
    return None if any(not part for part in parts) else parts


def _number_paragraphs(text: str, kw: dict) -> bool:
    parts = _paragraphs(text, _DIVIDER)
    return parts is not None and len(parts) == kw["num_paragraphs"]


def _nth_paragraph_first_word(text: str, kw: dict) -> bool:
    parts = _paragraphs(text, _BLANK_LINE)
    nth = kw["nth_paragraph"]
    if parts is None or len(parts) != kw["num_paragraphs"] or not 1 <= nth <= len(parts):
        return False
    first = words(parts[nth - 1])
    return bool(first) and first[0].lower() == kw["first_word"].strip().lower()


def _postscript(text: str, kw: dict) -> bool:
    marker = kw["postscript_marker"].strip()
    pattern = "".join(re.escape(c) + (r"\s?" if c == "." else "") for c in marker)
    return re.search(rf"^[^\S\n]*+{pattern}", text, re.IGNORECASE | re.MULTILINE) is not None


def _placeholders(text: str) -> int:
    return sum(1 for match in _PLACEHOLDER.finditer(text) if match.group()[1:-1].strip())


def _has_title(text: str) -> bool:
    return any(match.group()[2:-2].strip() for match in _TITLE.finditer(text))


def _highlights(text: str) -> int:
    return sum(1 for match in _HIGHLIGHT.finditer(text) if (match[1] or match[2]).strip())


def _json_format(text: str, kw: dict) -> bool:
    body = text.strip()
    if len(body) >= 6 and body.startswith("```") and body.endswith("```"):  # a fenced block
        body = body[3:-3]
        body = body[4:] if body[:4].lower() == "json" else body
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, (dict, list))


def _two_responses(text: str, kw: dict) -> bool:
    parts = _paragraphs(text, _SEPARATOR)
    return parts is not None and len(parts) == 2 and parts[0] != parts[1]


def _end_checker(text: str, kw: dict) -> bool:
    end = text.strip().rstrip('"”').rstrip().lower()
    return end.endswith(kw["end_phrase"].strip().lower())


def _quotation(text: str, kw: dict) -> bool:
    body = text.strip()
    return len(body) > 1 and (body[0], body[-1]) in (('"', '"'), ("“", "”"))


def _capital_words(text: str) -> int:
    return sum(1 for word in words(text) if word == word.upper() and word != word.lower())


def _has_letter(text: str) -> bool:
    return any(c.isalpha() for c in text)


@dataclass(frozen=True)
class _Checker:
    params: dict[str, str]
    """kwarg name -> kind: ``int`` (>= 1), ``index`` (>= 1), ``relation``, ``text``, ``letter``,
    ``words`` (non-empty list of strings)."""
    check: Callable[[str, dict], bool]


CHECKERS: dict[str, _Checker] = {
    "keywords:existence": _Checker(
        {"keywords": "words"},
        lambda t, kw: all(_keyword_count(t, k) for k in kw["keywords"]),
    ),
    "keywords:frequency": _Checker(
        {"keyword": "text", "frequency": "int", "relation": "relation"},
        lambda t, kw: _compare(_keyword_count(t, kw["keyword"]), kw["relation"], kw["frequency"]),
    ),
    "keywords:forbidden_words": _Checker(
        {"forbidden_words": "words"},
        lambda t, kw: not any(_keyword_count(t, k) for k in kw["forbidden_words"]),
    ),
    "keywords:letter_frequency": _Checker(
        {"letter": "letter", "let_frequency": "int", "let_relation": "relation"},
        lambda t, kw: _compare(
            t.lower().count(kw["letter"].lower()), kw["let_relation"], kw["let_frequency"]
        ),
    ),
    "length_constraints:number_words": _Checker(
        {"num_words": "int", "relation": "relation"},
        lambda t, kw: _compare(count_words(t), kw["relation"], kw["num_words"]),
    ),
    "length_constraints:number_sentences": _Checker(
        {"num_sentences": "int", "relation": "relation"},
        lambda t, kw: _compare(count_sentences(t), kw["relation"], kw["num_sentences"]),
    ),
    "length_constraints:number_paragraphs": _Checker({"num_paragraphs": "int"}, _number_paragraphs),
    "length_constraints:nth_paragraph_first_word": _Checker(
        {"num_paragraphs": "int", "nth_paragraph": "index", "first_word": "text"},
        _nth_paragraph_first_word,
    ),
    "detectable_content:number_placeholders": _Checker(
        {"num_placeholders": "int"},
        lambda t, kw: _placeholders(t) >= kw["num_placeholders"],
    ),
    "detectable_content:postscript": _Checker({"postscript_marker": "text"}, _postscript),
    "detectable_format:number_bullet_lists": _Checker(
        {"num_bullets": "int"}, lambda t, kw: len(_BULLET.findall(t)) == kw["num_bullets"]
    ),
    "detectable_format:constrained_response": _Checker(
        {}, lambda t, kw: any(option in t for option in CONSTRAINED_OPTIONS)
    ),
    "detectable_format:number_highlighted_sections": _Checker(
        {"num_highlights": "int"}, lambda t, kw: _highlights(t) >= kw["num_highlights"]
    ),
    "detectable_format:multiple_sections": _Checker(
        {"section_spliter": "text", "num_sections": "int"},
        lambda t, kw: (
            len(re.findall(rf"(?<!\w){re.escape(kw['section_spliter'].strip())}\s*\d+", t))
            >= kw["num_sections"]
        ),
    ),
    "detectable_format:json_format": _Checker({}, _json_format),
    "detectable_format:title": _Checker({}, lambda t, kw: _has_title(t)),
    "combination:two_responses": _Checker({}, _two_responses),
    "combination:repeat_prompt": _Checker(
        {"prompt_to_repeat": "text"},
        lambda t, kw: t.strip().lower().startswith(kw["prompt_to_repeat"].strip().lower()),
    ),
    "startend:end_checker": _Checker({"end_phrase": "text"}, _end_checker),
    "startend:quotation": _Checker({}, _quotation),
    "change_case:capital_word_frequency": _Checker(
        {"capital_frequency": "int", "capital_relation": "relation"},
        lambda t, kw: _compare(_capital_words(t), kw["capital_relation"], kw["capital_frequency"]),
    ),
    "change_case:english_capital": _Checker({}, lambda t, kw: t == t.upper() and _has_letter(t)),
    "change_case:english_lowercase": _Checker({}, lambda t, kw: t == t.lower() and _has_letter(t)),
    "punctuation:no_comma": _Checker({}, lambda t, kw: "," not in t and "，" not in t),
}
SUPPORTED_IDS: tuple[str, ...] = tuple(CHECKERS)
"""Every instruction id :func:`check_instruction` can score."""


def validate_instruction(instruction_id: Any, kwargs: Any) -> dict[str, Any]:
    """``kwargs`` for ``instruction_id``, normalized: ``None`` values dropped, types checked.

    Raises:
        ValueError: an unsupported id, a missing or unknown argument, or a wrong value.
    """
    if not isinstance(instruction_id, str):
        raise ValueError(f"an instruction id must be a string, got {instruction_id!r}")
    checker = CHECKERS.get(instruction_id)
    if checker is None:
        why = UNSUPPORTED.get(instruction_id)
        problem = f"is not supported ({why})" if why else "is not a known instruction id"
        raise ValueError(
            f"instruction {instruction_id!r} {problem}; supported: {', '.join(SUPPORTED_IDS)}"
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"kwargs of {instruction_id!r} must be an object, got {kwargs!r}")
    given = {key: value for key, value in kwargs.items() if value is not None}
    unknown = sorted(set(given) - set(checker.params))
    if unknown:
        accepted = ", ".join(checker.params) or "none"
        raise ValueError(
            f"{instruction_id!r} does not take argument(s) {', '.join(unknown)} "
            f"(it takes: {accepted})"
        )
    normalized = {}
    for name, kind in checker.params.items():
        if name not in given:
            raise ValueError(f"{instruction_id!r} needs the argument {name!r}")
        normalized[name] = _check_value(instruction_id, name, kind, given[name])
    return normalized


def _check_value(instruction_id: str, name: str, kind: str, value: Any) -> Any:
    where = f"{instruction_id!r} argument {name!r}"
    if kind in ("int", "index"):
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # e.g. a pandas round trip made it 3.0
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where} must be a positive integer, got {value!r}")
        return value
    if kind == "relation":
        if value not in RELATIONS:
            raise ValueError(f"{where} must be one of {', '.join(map(repr, RELATIONS))}")
        return value
    if kind == "words":
        if isinstance(value, tuple):
            value = list(value)
        if not (isinstance(value, list) and value) or not all(
            isinstance(w, str) and w.strip() for w in value
        ):
            raise ValueError(f"{where} must be a non-empty list of strings, got {value!r}")
        return [w.strip() for w in value]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} must be a non-empty string, got {value!r}")
    if kind == "letter" and (len(value.strip()) != 1 or not value.strip().isalpha()):
        raise ValueError(f"{where} must be a single letter, got {value!r}")
    return value.strip() if kind == "letter" else value


def check_instruction(instruction_id: str, kwargs: dict[str, Any], response: str) -> bool:
    """Whether ``response`` follows the instruction (``kwargs`` as :func:`validate_instruction`
    returns them; unvalidated ones are validated first)."""
    return CHECKERS[instruction_id].check(response, validate_instruction(instruction_id, kwargs))
