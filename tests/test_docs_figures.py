"""Measured figures live in one place: docs/measurements.md (the project's timings: the test
tiers, `make run`, model loading, packing, and the smaller costs the other pages quote),
benchmarks/README.md (each benchmark's figures, from its results file in benchmarks/results/)
and docs/learning.md (the dated record of the learning search). Every other page, and every
docstring and comment under llmrl/, links there instead of restating a figure, so no two places
can disagree about one.

What counts as a measured figure here, in prose or code blocks alike: a duration written in
minutes and seconds (``4 min 43 s``), in milliseconds or microseconds (``180 ms``, ``70 µs``)
or as a range of seconds or minutes (``17-60 s``, ``8.8-10.7 s``, ``3-6 minutes``), a speedup or
ratio (``1.32x``), a time per step (``6.6 s/step``, ``17 s a step``, ``3.4 s per step``), a
throughput in tokens a second (``140 tok/s``), a peak memory (``4200 MB peak``,
``peak 9613 MiB``), a percentage (``63%``, ``1.9%``, ``130-145%``), and an accuracy stated as a
number: after the word (``accuracy 0.380``, ``accuracy from 0 to ~0.38``), before it
(``0.45 held-out accuracy``), as ``pass@8 0.85``, as a gain with its interval
(``+0.100 [+0.058, +0.142]``) or as a row of an accuracy table (``after SFT  0.350  20  +0.350``,
``| 0.352 | - |``).

Settings are not figures and do not match: a duration followed by ``timeout``, ``deadline``,
``budget`` or ``limit`` (``a 500 ms timeout``; single seconds such as ``a 60 s timeout`` never
match), a confidence level (a percentage followed by ``CI``, ``interval``, ``paired``,
``bootstrap``, ``confidence`` or ``quantiles``: ``95% CI``, ``paired 95% interval``,
``95% paired-bootstrap``), a value in code (``'accuracy': 0.5``, ``T = 0.7``), ``8 x 8``
prompts x samples. Thresholds and tolerances a test or the code enforces, and figures that
follow from arithmetic rather than a measurement, read like figures to any rule: those are the
phrases of ``SETTINGS``, each with the reason it is a setting.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FIGURE_PAGES = {
    "docs/measurements.md",
    "benchmarks/README.md",
    # the dated record of the learning search (issues 16 and 31): every paragraph is a
    # measurement of its session, as benchmarks/README.md's are of their runs
    "docs/learning.md",
}
"""Where measured figures are written, each with its date (and results file)."""

_NUMBER = r"\d+(?:\.\d+)?"
_START = r"(?<![\w.])(?<!\d[-–])"  # a number starts here: not in a word, a decimal or a range
_SETTING_AFTER = r"(?! ?(?:timeout|deadline|budget|limit)s?\b)"  # `a 500 ms timeout`
_LEVEL_AFTER = (  # `95% CI`, `95% paired-bootstrap`, `the 2.5% and 97.5% quantiles`
    rf"(?!(?: (?:and|or|to) {_NUMBER}%)? ?"
    r"(?:CI|interval|paired|bootstrap|confidence|credible|quantiles?|percentiles?)\b)"
)
_DECIMAL_ACCURACY = r"(?<![\w.])[01]?\.\d+\b(?!\.)"  # 0.380, .38, 1.0: a share of problems

FIGURE = re.compile(
    r"\b\d+ min \d+ s\b"  # a duration: 4 min 43 s
    r"|\b\d+(?:\.\d+)?x(?![\w-])"  # a speedup or ratio: 1.32x, 3x
    r"|\b\d+(?:\.\d+)? ?s(?:/step| a step| per step)\b"  # a time per step
    r"|\b\d+(?:\.\d+)? ?tok/s\b"  # a throughput
    r"|\b\d+(?:\.\d+)? ?[MG]i?B peak\b|\bpeak (?:of )?\d+(?:\.\d+)? ?[MG]i?B\b"  # peak memory
    # a duration in ms or µs, or a range of them: 180 ms, 70 µs, 70 microseconds, 0.6-0.9 ms
    rf"|{_START}{_NUMBER}(?:[-–]{_NUMBER})? ?(?:ms|[µμ]s|(?:milli|micro)seconds?)\b{_SETTING_AFTER}"
    # a range of seconds or minutes: 17-60 s, 8.8-10.7 s, 3-6 minutes
    rf"|{_START}{_NUMBER}[-–]{_NUMBER} ?(?:s|seconds?|min|minutes?)\b{_SETTING_AFTER}"
    rf"|{_START}{_NUMBER}(?:[-–]{_NUMBER})?%{_LEVEL_AFTER}"  # a percentage: 63%, 130-145%
    # an accuracy after the word, in prose (not a quoted key, not `T = 0.7`): accuracy 0.380,
    # accuracy from 0 to ~0.38, accuracy (0.443
    rf"|\baccurac(?:y|ies)\b[^\n.;=:'\"]{{0,40}}?{_DECIMAL_ACCURACY}"
    rf"|\baccurac(?:y|ies): ?{_DECIMAL_ACCURACY}"  # accuracy: 0.45
    rf"|{_DECIMAL_ACCURACY} (?:[\w-]+ )?accuracy\b"  # 0.45 held-out accuracy
    rf"|\bpass@\d+ (?:= )?{_DECIMAL_ACCURACY}"  # pass@8 0.85, pass@8 = 0.28
    # a gain with its paired interval, or the interval alone, signed with at least two decimals
    # as the evaluation prints them (not a tensor in code): +0.100 [+0.058, +0.142]
    r"|(?:[+-]\d*\.\d{2,},? )?\[[+-]\d?\.\d{2,}, [+-]\d?\.\d{2,}\]"
    # a row of an accuracy table: a share with 3 decimals, then (after a count of problems) a
    # gain or an empty cell: `after SFT  0.350  20  +0.350 [...]`, `| 0.352 | - | - |`
    r"|(?<![\w.+-])[01]\.\d{3}(?=(?: *\|)? +(?:\d+ +)?(?:[+-]\d|-(?: |$)))"
)

SETTINGS = {
    # docs/testing.md: the floor `make coverage` (scripts/coverage_table.py) enforces on the
    # fast tier's share of covered lines, not a measured share
    "less than 85% of the whole suite's covered lines",
    # docs/grpo-runtime.md: the tolerance tests/runtime/test_trainer_group.py checks DDP and
    # FSDP weights against
    "weights to 1% of one learning-rate step",
    # docs/precision-and-memory.md: the bound tests/train/test_precision.py asserts on pure
    # bfloat16's changed elements
    "pure changes under 5% of them",
    # llmrl/envs/tasks/base.py: the split's shares split_of assigns by hash, a setting
    "``train`` (80%), ``eval`` (10%) or ``test`` (10%)",
    # llmrl/policies/response_scoring.py: the arithmetic of shared prompts at G = 4 with
    # prompts as long as responses, not a measurement
    "this removes ~35% of the tokens",
    # llmrl/train/precision.py: the spacing of bfloat16's 8-bit mantissa (2^-8 of a weight),
    # a property of the format
    "spaces neighbouring values ~0.4% of the weight apart",
}
"""Phrases whose figure is a setting, a tolerance or arithmetic (matched across line breaks)."""


def pages() -> list[str]:
    """Every Markdown page of the project (README, docs/, benchmarks/, configs' comments aside)."""
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found += sorted((REPO / "benchmarks").glob("*.md"))
    return [str(page.relative_to(REPO)) for page in found]


def _setting_spans(text: str) -> list[tuple[int, int]]:
    return [
        match.span()
        for phrase in SETTINGS
        for match in re.finditer(r"\s+".join(map(re.escape, phrase.split())), text)
    ]


def figures_in(text: str, first_line: int = 1) -> list[str]:
    """``line: match`` for every measured figure in ``text`` outside the phrases of
    ``SETTINGS``; ``first_line`` numbers the first line of ``text``."""
    settings = _setting_spans(text)
    found, start = [], 0
    for number, line in enumerate(text.splitlines(keepends=True), start=first_line):
        for match in FIGURE.finditer(line):
            span = (start + match.start(), start + match.end())
            if not any(low <= span[0] and span[1] <= high for low, high in settings):
                found.append(f"{number}: {match.group(0)!r}")
        start += len(line)
    return found


@pytest.mark.parametrize("page", sorted(set(pages()) - FIGURE_PAGES))
def test_no_page_restates_a_measured_figure(page):
    figures = figures_in((REPO / page).read_text(encoding="utf-8"))
    assert figures == [], (
        f"{page} states measured figures: {figures}; write them in docs/measurements.md (or the "
        "benchmark's section of benchmarks/README.md) with their date, and link there"
    )


def test_the_figure_pages_exist_and_hold_figures():
    for page in FIGURE_PAGES:
        assert figures_in((REPO / page).read_text(encoding="utf-8")), page


def python_texts(path: Path) -> list[tuple[int, str]]:
    """``(first line, text)`` of every docstring (module, class, function) and comment of
    ``path``."""
    source = path.read_text(encoding="utf-8")
    texts = [
        (node.body[0].lineno, docstring)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and (docstring := ast.get_docstring(node, clean=False))
    ]
    texts += [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    return texts


def test_no_docstring_or_comment_in_llmrl_restates_a_measured_figure():
    figures = [
        f"{path.relative_to(REPO)}:{figure}"
        for path in sorted((REPO / "llmrl").rglob("*.py"))
        for first_line, text in python_texts(path)
        for figure in figures_in(text, first_line)
    ]
    assert figures == [], (
        f"docstrings or comments state measured figures: {figures}; write them in "
        "docs/measurements.md with their date, and link there (docs/measurements.md#section)"
    )


def test_every_setting_is_still_written_somewhere():
    """A phrase of ``SETTINGS`` no page or docstring holds any more is a stale exemption."""
    texts = [(REPO / page).read_text(encoding="utf-8") for page in pages()]
    texts += [text for path in (REPO / "llmrl").rglob("*.py") for _, text in python_texts(path)]
    everything = "\n".join(texts)
    for phrase in SETTINGS:
        assert re.search(r"\s+".join(map(re.escape, phrase.split())), everything), phrase


@pytest.mark.parametrize(
    ("text", "figures"),
    [
        ("make test took 4 min 57 s on a clean clone", ["4 min 57 s"]),
        ("rollout 1.32x raw HF and 0.575 of TRL", ["1.32x"]),
        ("3x under the default; 10x is a margin", ["3x", "10x"]),
        (
            "17 s a step, 6.6 s/step, 3.4 s per step",
            ["17 s a step", "6.6 s/step", "3.4 s per step"],
        ),
        (
            "140.6 tok/s at 4200 MB peak, peak 9613 MiB",
            ["140.6 tok/s", "4200 MB peak", "peak 9613 MiB"],
        ),
        ("a 60 s timeout, 8 x 8 samples, 0x1f, 2-3x-faster", []),
        # durations in ms or µs
        (
            "median 180 ms against 169 ms, 70 µs, 0.6-0.9 ms, 70 microseconds, 5 milliseconds",
            ["180 ms", "169 ms", "70 µs", "0.6-0.9 ms", "70 microseconds", "5 milliseconds"],
        ),
        ("a 500 ms timeout, a 200 ms deadline, a 50 ms budget, 10 items", []),
        # ranges of seconds or minutes
        (
            "a step takes 17-60 s; generation 8.8-10.7 s, ~12-14 s, within 3-6 minutes",
            ["17-60 s", "8.8-10.7 s", "12-14 s", "3-6 minutes"],
        ),
        ("a 5-10 s timeout, steps 2-6, 8-32 tokens, a 30 s deadline", []),
        # percentages
        (
            "additions 63% -> 74%, 1.9% of the weights, 130-145% CPU",
            ["63%", "74%", "1.9%", "130-145%"],
        ),
        (
            "[95% CI], its paired 95% interval, a 95% paired-bootstrap interval, "
            "a 95% confidence level, the 2.5% and 97.5% quantiles",
            [],
        ),
        # accuracies stated as numbers
        (
            "held-out accuracy 0.380, lifts accuracy from 0 to ~0.38, accuracy: 0.45",
            ["accuracy 0.380", "accuracy from 0 to ~0.38", "accuracy: 0.45"],
        ),
        (
            "reached 0.453 held-out accuracy; pass@8 0.85 and pass@8 = 0.28",
            ["0.453 held-out accuracy", "pass@8 0.85", "pass@8 = 0.28"],
        ),
        (
            "the gain +0.100 [+0.058, +0.142], then [+0.010, +0.095]",
            ["+0.100 [+0.058, +0.142]", "[+0.010, +0.095]"],
        ),
        ("  base model     0.000        20  -                -  0/10  0/10", ["0.000"]),
        (
            "  after SFT      0.350        20  +0.350 [+0.150, +0.550]",
            ["0.350", "+0.350 [+0.150, +0.550]"],
        ),
        ("| student before (SFT) | 0.352 | - | - | - |", ["0.352"]),
        (
            "{'accuracy': 0.5}, accuracy at T = 0.7, the accuracy of the 0.5B model, "
            "clip [0.8, 1.2], torch.tensor([[-1.5, -1.0]]), lr 1e-5 | 0.001 | 3 |",
            [],
        ),
    ],
)
def test_what_counts_as_a_figure(text, figures):
    assert [match.group(0) for match in FIGURE.finditer(text)] == figures


@pytest.mark.parametrize(
    ("text", "figures"),
    [
        # a threshold a test enforces, across a line break as a page wraps it
        ("it fails when the fast tier keeps less than\n85% of the whole suite's covered lines", []),
        ("loss to 1e-5, weights to 1% of one learning-rate step", []),
        # the same figure outside its phrase is a figure
        (
            "the fast tier keeps 85% of the lines, weights moved 1% of a step",
            ["1: '85%'", "1: '1%'"],
        ),
    ],
)
def test_settings_are_exempt_only_in_their_phrase(text, figures):
    assert figures_in(text) == figures
