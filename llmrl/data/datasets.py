"""Read dataset rows from JSONL, JSON, Parquet, ``datasets`` directories and hub ids.

Every reader yields ``(row_number, row)`` with 1-based row numbers a user can find in the file
(for JSONL, the line number), and every problem becomes a :class:`DatasetError` naming the file,
the row and, where there is one, the field.

Two readers:

* ``reader="auto"`` (the default): .jsonl/.json/.parquet files are streamed by the plain
  readers of :mod:`llmrl.data.file_readers` (no ``datasets`` needed); a directory is read with
  ``datasets.load_from_disk``.
* ``reader="datasets"``: files are loaded (:mod:`llmrl.data.hf_datasets`) with
  ``datasets.load_dataset("json"|"parquet", data_files=...)``, which converts them to Arrow once
  in ``cache_dir`` (``llmrl prepare`` passes ``cache_dir`` or ``<output_dir>/.datasets-cache``,
  never the home-directory default, so the cache sits next to the prepared data and is easy to
  delete). Rows are numbered as the plain readers number them (JSONL: by line, blank lines
  counted), so both readers give the same row errors and the same prepared rows; one
  difference: Arrow cannot tell a missing field from a null one, so a row without a field that
  other rows have reads as a null value (the error still names the file, row and field).

A ``save_to_disk`` directory may hold a ``Dataset`` (one split, read whatever ``split`` says when
that is None or ``train``) or a ``DatasetDict`` (``split`` picks one; with a single split it is
the default; a missing split is an error listing the available ones).

Local files and folders are read offline, always: ``datasets`` is used inside
:func:`~llmrl.data.hf_datasets.offline` (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set,
``DownloadConfig(local_files_only=True)``), so reading them never touches the network. A hub id
(``owner/name``, when no such local path exists) is downloaded as ``datasets`` does, unless the
environment already says offline (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set to 1, as
``make run`` and the tests do): then it is read from the local Hugging Face cache only, and one
that is not cached fails at once with a :class:`DatasetError` that says how to save a local copy
(see :func:`~llmrl.data.hf_datasets.hub_error`) instead of hanging on the network.

Where a source is and what it is: :mod:`llmrl.data.sources`; checking a row's fields:
:mod:`llmrl.data.row_fields`.

Example:
    for row_number, row in read_rows("data/train.jsonl", columns=["question", "answer"]):
        print(row_number, row["question"])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from llmrl.data.dataset_error import DatasetError
from llmrl.data.file_readers import read_json, read_jsonl, read_parquet
from llmrl.data.hf_datasets import read_datasets
from llmrl.data.sources import DataSource, resolve_source


def read_rows(
    source: str | Path | DataSource,
    columns: Sequence[str] | None = None,
    *,
    split: str | None = None,
    subset: str | None = None,
    revision: str | None = None,
    reader: Literal["auto", "datasets"] = "auto",
    cache_dir: str | Path | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(row_number, row)`` for each row of ``source``, row numbers starting at 1.

    ``columns`` keeps only those keys of each row (absent ones stay absent, so a validator can
    name them). ``split`` picks a split of a hub id or saved ``DatasetDict`` (required when it
    has several); ``subset`` and ``revision`` are a hub dataset's config name and revision.
    ``reader="datasets"`` reads a file with the ``datasets`` library (Arrow cache in
    ``cache_dir``) instead of the plain readers; directories and hub ids always use it.

    Raises:
        DatasetError: unreadable input, naming the file, the line or row, and the problem.
        MissingDatasetsError: a directory or hub id without the ``datasets`` package.
    """
    resolved = source if isinstance(source, DataSource) else resolve_source(source)
    is_file = resolved.kind not in ("directory", "hub")
    if is_file and split is not None:
        raise DatasetError(
            f"split {split!r} given, but a .{resolved.kind} file has no splits; use a "
            "separate eval source file instead",
            file=resolved.spec,
        )
    if not is_file or reader == "datasets":
        rows = read_datasets(resolved, split, subset, revision, cache_dir)
    else:
        readers = {"jsonl": read_jsonl, "json": read_json, "parquet": read_parquet}
        rows = readers[resolved.kind](resolved, columns)
    for number, row in rows:
        if columns is not None:
            row = {name: row[name] for name in columns if name in row}
        yield number, row
