"""The code of a documentation page that a test runs as written."""

from __future__ import annotations

import re

from tests.support.paths import REPO


def python_block(page: str) -> str:
    """The one ```python block of ``page`` (a path from the repository root)."""
    text = (REPO / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1, f"{page} should hold exactly one ```python block"
    return blocks[0]
