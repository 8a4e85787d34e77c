"""The helm chart tests' fixture: each value set's objects, rendered once per module (the
chart itself is tests/conftest.py's ``chart``)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart_objects import render
from tests.support.chart import VALUE_SETS, objects


@pytest.fixture(scope="module")
def rendered(chart):
    """The parsed objects of each value set, rendered once per module (do not mutate)."""
    cache: dict[str, list[dict[str, Any]]] = {}

    def get(name: str) -> list[dict[str, Any]]:
        if name not in cache:
            cache[name] = objects(render(chart, VALUE_SETS[name]))
        return cache[name]

    return get
