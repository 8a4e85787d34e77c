"""Where the tests find the repository and the data shared beside it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root (what ``llmrl`` subprocesses and Ray actors get on ``PYTHONPATH``)."""

SHARED = (REPO / ".." / "shared").resolve()
"""The folder beside the repository with data the tests read but do not ship (KubeRay CRDs,
GSM8K)."""

SHARED_DATA = SHARED / "data"
