"""Measured figures live in one place: docs/measurements.md (the project's timings: the test
tiers, `make run`, model loading, packing) and benchmarks/README.md (each benchmark's figures,
from its results file in benchmarks/results/). Every other page links there instead of restating
a figure, so no two pages can disagree about one.

What counts as a measured figure here, in prose or code blocks alike: a duration written in
minutes and seconds (``4 min 43 s``), a speedup or ratio (``1.32x``), a time per step
(``6.6 s/step``, ``17 s a step``, ``3.4 s per step``), a throughput in tokens a second
(``140 tok/s``) and a peak memory (``4200 MB peak``, ``peak 9613 MiB``). Settings (a ``60 s``
timeout, ``8 x 8`` prompts x samples) are not figures and do not match.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FIGURE_PAGES = {"docs/measurements.md", "benchmarks/README.md"}
"""Where measured figures are written, each with its date (and results file)."""

FIGURE = re.compile(
    r"\b\d+ min \d+ s\b"  # a duration: 4 min 43 s
    r"|\b\d+(?:\.\d+)?x(?![\w-])"  # a speedup or ratio: 1.32x, 3x
    r"|\b\d+(?:\.\d+)? ?s(?:/step| a step| per step)\b"  # a time per step
    r"|\b\d+(?:\.\d+)? ?tok/s\b"  # a throughput
    r"|\b\d+(?:\.\d+)? ?[MG]i?B peak\b|\bpeak (?:of )?\d+(?:\.\d+)? ?[MG]i?B\b"  # peak memory
)


def pages() -> list[str]:
    """Every Markdown page of the project (README, docs/, benchmarks/, configs' comments aside)."""
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found += sorted((REPO / "benchmarks").glob("*.md"))
    return [str(page.relative_to(REPO)) for page in found]


def figures_in(text: str) -> list[str]:
    """``line: match`` for every measured figure in ``text``."""
    return [
        f"{number}: {match.group(0)!r}"
        for number, line in enumerate(text.splitlines(), start=1)
        for match in FIGURE.finditer(line)
    ]


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
    ],
)
def test_what_counts_as_a_figure(text, figures):
    assert [match.group(0) for match in FIGURE.finditer(text)] == figures
