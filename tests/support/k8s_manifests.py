"""The plain manifests in k8s/ and Prefect's templating of the work pool's job template."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

K8S = REPO / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
JOB_TEMPLATE = K8S / "prefect-work-pool-job-template.json"
PLACEHOLDER = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")
"""A Prefect template placeholder, ``{{ name }}``."""
_UNSET = object()


def documents(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of a manifest file (empty ones left out)."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def all_objects() -> list[dict[str, Any]]:
    """Every object of every manifest in k8s/."""
    return [doc for path in MANIFESTS for doc in documents(path)]


def fill(node: Any, values: dict[str, Any]) -> Any:
    """Prefect's templating: a whole-string placeholder takes the value (any type), others are
    substituted as text, and a key whose placeholder has no value is dropped."""
    if isinstance(node, dict):
        filled = {key: fill(value, values) for key, value in node.items()}
        return {key: value for key, value in filled.items() if value is not _UNSET}
    if isinstance(node, list):
        return [fill(value, values) for value in node]
    if not isinstance(node, str):
        return node
    whole = PLACEHOLDER.fullmatch(node.strip())
    if whole:
        return values.get(whole.group(1), _UNSET)
    return PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), "")), node)
