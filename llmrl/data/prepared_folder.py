"""A prepared dataset folder on disk: ``train.jsonl``, ``eval.jsonl`` and ``manifest.json``.

:class:`SplitWriter` writes the split files and hashes them as it goes; ``manifest.json`` records
every file's sha256 and row count, which :func:`read_manifest` and :func:`verify_files` check.
A folder is built under a temporary name and :func:`install` renames it into place, so a crash
leaves no half-written dataset; :func:`reusable_manifest` says whether an existing one is intact.

Example:
    manifest = read_manifest("data/prepared/gsm8k-0123456789abcdef")
    verify_files(Path("data/prepared/gsm8k-0123456789abcdef"), manifest)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmrl.data.dataset_error import DatasetError
from llmrl.data.problem import Problem
from llmrl.data.sources import sha256_file

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the layout or content of prepared files changes: older folders are then rebuilt."""
MANIFEST = "manifest.json"
SPLIT_FILES = {"train": "train.jsonl", "eval": "eval.jsonl"}


class SplitWriter:
    """Writes problems as JSON lines into ``train.jsonl`` / ``eval.jsonl``, hashing as it goes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows: Counter[str] = Counter({split: 0 for split in SPLIT_FILES})
        self.files: dict[str, dict[str, Any]] = {}
        self._streams = {s: (folder / n).open("wb") for s, n in SPLIT_FILES.items()}
        self._hashes = {split: hashlib.sha256() for split in SPLIT_FILES}

    def write(self, split: str, problem: Problem) -> None:
        """Append ``problem`` to ``split``'s file."""
        try:
            line = json.dumps(_row(problem), ensure_ascii=False) + "\n"
        except TypeError as error:
            raise DatasetError(f"problem {problem.id} is not JSON-serializable ({error})") from None
        data = line.encode("utf-8")
        self._streams[split].write(data)
        self._hashes[split].update(data)
        self.rows[split] += 1

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for split, stream in self._streams.items():
            stream.close()
            name = SPLIT_FILES[split]
            self.files[name] = {"sha256": self._hashes[split].hexdigest(), "rows": self.rows[split]}


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` as indented JSON to ``path``."""
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The ``manifest.json`` of a prepared folder, after checking it lists both split files.

    Raises:
        DatasetError: the manifest is missing, not JSON, or not a prepared dataset's.
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DatasetError("not a prepared dataset: manifest.json is missing", file=folder)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files, rows = manifest["files"], manifest["rows"]
        if set(files) != set(SPLIT_FILES.values()) or set(rows) != set(SPLIT_FILES):
            raise ValueError("it does not list train.jsonl and eval.jsonl")
    except (ValueError, KeyError, TypeError) as error:
        raise DatasetError(f"invalid manifest ({error!r})", file=path) from None
    return manifest


def verify_files(folder: Path, manifest: dict[str, Any]) -> None:
    """Check that every file ``manifest`` lists is in ``folder`` with the recorded sha256.

    Raises:
        DatasetError: a file is missing or changed after preparation (the message names it).
    """
    for name, recorded in manifest["files"].items():
        file = folder / name
        if not file.is_file():
            raise DatasetError("missing from the prepared dataset", file=file)
        if sha256_file(file) != recorded["sha256"]:
            raise DatasetError(
                "sha256 differs from manifest.json: the file changed after it was "
                "prepared; run `llmrl prepare` again",
                file=file,
            )


def reusable_manifest(final: Path, digest: str) -> dict[str, Any] | None:
    """The manifest of an intact, existing ``final`` folder for ``digest``, else None."""
    if not final.exists():
        return None
    try:
        manifest = read_manifest(final)
        if manifest.get("digest") != digest or manifest.get("format_version") != FORMAT_VERSION:
            raise DatasetError("manifest is for other inputs", file=final / MANIFEST)
        verify_files(final, manifest)
    except DatasetError as error:
        logger.warning("%s exists but cannot be reused (%s); rebuilding it", final, error)
        return None
    return manifest


def install(staging: Path, final: Path, digest: str) -> None:
    """Rename ``staging`` to ``final``, replacing a broken ``final`` (never an intact one)."""
    stale = None
    if final.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
        os.replace(final, stale / final.name)
    try:
        os.rename(staging, final)
    except OSError:
        # Another process installed the same dataset meanwhile: keep theirs when it is intact.
        if reusable_manifest(final, digest) is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)
    finally:
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)


def _row(problem: Problem) -> dict[str, Any]:
    """A problem as its JSON row; ``fields`` and ``messages`` only when set, so a built-in task's
    files are byte for byte what they were before user columns existed."""
    row = asdict(problem)
    if not row["fields"]:
        del row["fields"]
    if row["messages"] is None:
        del row["messages"]
    return row
