"""The helm/llmrl chart: where it is, the value sets the tests render it with, and the objects
of a render."""

from __future__ import annotations

from typing import Any

import yaml

from flows.launchers.settings import KubernetesSettings
from llmrl.topology import Topology
from tests.support.paths import REPO

CHART = REPO / "helm" / "llmrl"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
"""The chart's example values files."""
NAMESPACE = "llmrl"
"""The namespace the tests render and lint the chart in."""

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    **{path.stem: yaml.safe_load(path.read_text()) for path in EXAMPLES},
    "everything-on": {
        "prefect": {
            "apiUrl": "",
            "server": {"enabled": True, "database": {"name": "prefect-db", "key": "url"}},
            "worker": {"apiKey": {"name": "prefect-cloud", "key": "api-key"}},
        },
        "storage": {"existingClaim": "llmrl-shared"},
        "imagePullSecrets": [{"name": "registry"}],
        "topology": {
            "trainer": {"gpus": 2, "strategy": "ddp"},
            "reference": {"placement": "dedicated", "gpus": 1},
        },
    },
    "external-mlflow": {"mlflow": {"enabled": False, "externalUri": "https://mlflow.example.com"}},
    "transformers-on-gpus": {
        "topology": {
            "inference": {"backend": "transformers", "engines": 2, "gpus_per_engine": 1},
            "trainer": {"gpus": 2, "ranks": 2, "strategy": "ddp"},
        }
    },
}
"""Named values the chart is rendered with: the defaults, every example and a few more."""


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object of a render (NOTES.txt and empty documents left out)."""
    found = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            found += [doc for doc in yaml.safe_load_all(text) if doc]
    return found


def of_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of ``items`` of one kind."""
    return [item for item in items if item["kind"] == kind]


def stage_inputs(items: list[dict[str, Any]]) -> tuple[KubernetesSettings, Topology]:
    """The stage pods' settings and the topology, as the flow-run pod reads them from the
    chart's ConfigMap."""
    (config,) = of_kind(items, "ConfigMap")
    settings = KubernetesSettings.model_validate(yaml.safe_load(config["data"]["kubernetes.yaml"]))
    topology = Topology.model_validate(yaml.safe_load(config["data"]["topology.yaml"]))
    return settings, topology
