"""The library's docstring examples run as tests: every ``>>>`` example in ``llmrl/`` is a
doctest of the fast tier (``testpaths`` names ``llmrl``; tests/ keeps its own conftest).

Collected here rather than with ``--doctest-modules``, which would import every module under
``tests/`` as a doctest module too. A module is left out only when it cannot be imported in the
main environment ``.venv``:

- ``llmrl/policies/vllm_file_engine.py`` and ``llmrl/policies/vllm_transfer.py`` subclass vLLM's
  weight-transfer classes at import, and vLLM lives in the stage environment ``.venv-stage``
  only (docs/environments.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule

LIBRARY = Path(__file__).resolve().parent / "llmrl"
NOT_IMPORTABLE_HERE = {
    LIBRARY / "policies" / "vllm_file_engine.py",
    LIBRARY / "policies" / "vllm_transfer.py",
}


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """A doctest module for each library module (its examples, if it has any)."""
    if file_path.suffix != ".py" or LIBRARY not in file_path.parents:
        return None
    if file_path in NOT_IMPORTABLE_HERE:
        return None
    return DoctestModule.from_parent(parent, path=file_path)
