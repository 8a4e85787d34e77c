"""Datasets as MLflow run inputs: what a stage read, shown in the run's "Datasets used".

A run input is a metadata-only dataset (MLflow's ``MetaDataset``: name, digest, source; the rows
are not uploaded) with the context it was used in (``training``, ``evaluation``) and its row
count as input tags. A prepared dataset folder (``llmrl prepare``) gives one input per split file
it lists in its manifest (:func:`prepared_inputs`): the source is the file's absolute path, the
digest the first 16 hex digits of its sha256 from the manifest, the name ``<folder>/<split>``
(``arithmetic-3f2a.../train``), so two runs that read the same bytes show the same dataset.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTEXT_TAG = "mlflow.data.context"
DIGEST_LENGTH = 16


@dataclass(frozen=True)
class DatasetRef:
    """One dataset a run read (see the module docstring)."""

    name: str
    source: str
    digest: str
    context: str
    rows: int | None = None


def prepared_inputs(
    path: str | Path, manifest: Mapping[str, Any], contexts: Mapping[str, str]
) -> list[DatasetRef]:
    """The inputs of a prepared folder: ``contexts`` maps each split file a run read (as
    ``manifest["files"]`` names it, e.g. ``train.jsonl``) to its context (``training``)."""
    folder = Path(path).resolve()
    files = manifest.get("files") or {}
    refs = []
    for file, context in contexts.items():
        recorded = files.get(file) or {}
        digest = recorded.get("sha256") or manifest.get("digest") or ""
        refs.append(
            DatasetRef(
                name=f"{folder.name}/{Path(file).stem}",
                source=str(folder / file),
                digest=str(digest)[:DIGEST_LENGTH],
                context=context,
                rows=recorded.get("rows"),
            )
        )
    return refs


def send_inputs(client: Any, run_id: str, refs: list[DatasetRef]) -> None:
    """Log ``refs`` as the run's dataset inputs in one request."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    inputs = []
    for ref in refs:
        with warnings.catch_warnings():  # MLflow registers its local source twice and says so
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(ref.source)
        dataset = MetaDataset(source, name=ref.name, digest=ref.digest)
        tags = [InputTag(CONTEXT_TAG, ref.context)]
        if ref.rows is not None:
            tags.append(InputTag("rows", str(ref.rows)))
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags=tags))
    client.log_inputs(run_id, datasets=inputs)
