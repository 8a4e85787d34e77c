"""The README and the pages under docs/: every relative link or picture reaches an existing
file (and, with ``#anchor``, a heading of it), and the README links every docs page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link there is code, not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown text: lower case, punctuation
    dropped, spaces to hyphens, ``-1``, ``-2`` ... for repeats."""
    anchors: set[str] = set()
    for line in _prose(text).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def _anchors_of(file: Path) -> set[str]:
    return heading_anchors(file.read_text(encoding="utf-8"))


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that reach no file, or no heading of the file."""
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors_of(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    readme = _prose((ROOT / "README.md").read_text(encoding="utf-8"))
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(readme)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert missing == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading, here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](other.md) [ok](other.md#a-code-heading-here) [ok](#page)\n"
        "[web](https://example.org/x) ![picture](missing.png)\n"
        "```\n[in code](nowhere.md)\n```\n"
        "[gone](nowhere.md) [bad anchor](other.md#nope) [bad here](#nope)\n"
    )
    assert broken_links(page) == [
        "missing.png: no such file",
        "nowhere.md: no such file",
        "other.md#nope: no heading #nope in other.md",
        "#nope: no heading #nope in page.md",
    ]
