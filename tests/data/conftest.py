"""Fixtures of the data tests."""

from __future__ import annotations

import importlib.util
import sys

import pytest


@pytest.fixture
def without_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the optional ``datasets`` package look uninstalled (the dev extra installs it):
    ``find_spec`` finds nothing and ``import datasets`` raises ImportError."""
    find_spec = importlib.util.find_spec

    def no_datasets(name: str, *args: object) -> object:
        return None if name == "datasets" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_datasets)
    monkeypatch.setitem(sys.modules, "datasets", None)
