"""Where dataset rows come from: a path or hub id resolved to a :class:`DataSource`, and what can
be known of it before reading: its fingerprint (sha256) and a cheap row count.

Example:
    source = resolve_source("data/train.jsonl")  # or a folder, or a hub id such as openai/gsm8k
    print(source.kind, count_rows(source), fingerprint(source))
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmrl.data.dataset_error import DatasetError
from llmrl.data.json_rows import READ_CHUNK_BYTES, jsonl_line_numbers

FILE_FORMATS = (".jsonl", ".json", ".parquet")
SUPPORTED = (
    ".jsonl (one JSON object per line), .json (a list of objects), .parquet, "
    "a datasets save_to_disk directory, or a Hugging Face hub id (owner/name)"
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

SourceKind = Literal["jsonl", "json", "parquet", "directory", "hub"]


@dataclass(frozen=True)
class DataSource:
    """A resolved row source: what kind it is and where it lives.

    ``location`` is an absolute path for local sources and the id itself for the hub.
    """

    kind: SourceKind
    location: str
    spec: str
    """What the user wrote, kept for messages."""


def resolve_source(source: str | Path) -> DataSource:
    """Decide how to read ``source``, without touching the network.

    A string is a hub id only when no such local path exists, it has the ``owner/name`` shape,
    no file extension we read, and its first component is not an existing local folder (so a
    mistyped ``data/gsm8k`` is reported as a missing path rather than sent to the hub).

    Raises:
        DatasetError: the path does not exist or has an unsupported format.
    """
    spec = str(source).strip()
    if not spec:
        raise DatasetError(f"the data source is empty; expected {SUPPORTED}")
    path = Path(spec).expanduser()
    if path.is_dir():
        return DataSource("directory", str(path.resolve()), spec)
    suffix = path.suffix.lower()
    if path.is_file():
        if suffix not in FILE_FORMATS:
            raise DatasetError(
                f"unsupported data format {suffix or '(no extension)'!r}; supported: {SUPPORTED}",
                file=spec,
            )
        return DataSource(suffix[1:], str(path.resolve()), spec)  # type: ignore[arg-type]
    first = Path(spec.split("/", 1)[0])
    local_looking = spec.startswith(("/", ".", "~")) or suffix in FILE_FORMATS or first.is_dir()
    if not local_looking and _HUB_ID.match(spec):
        return DataSource("hub", spec, spec)
    raise DatasetError(f"data source does not exist; expected {SUPPORTED}", file=spec)


def count_rows(source: DataSource) -> int | None:
    """A cheap row count (non-blank JSONL lines, Parquet metadata), or None when it is not cheap
    or the file cannot be read."""
    if source.kind == "jsonl":
        return sum(1 for _ in jsonl_line_numbers(source.location))
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(source.location).metadata.num_rows
        except Exception:  # unreadable: the reader reports it, naming the file
            return None
    return None


def fingerprint(source: DataSource, subset: str | None = None, revision: str | None = None) -> str:
    """sha256 of a local source's bytes (a directory: of its files' names and bytes).

    For a hub id it hashes the id, subset and revision: the content is not known before download,
    so pin ``revision`` to make the fingerprint stand for fixed data.
    """
    digest = hashlib.sha256()
    if source.kind == "hub":
        identity = {"hub": source.location, "subset": subset, "revision": revision}
        digest.update(json.dumps(identity, sort_keys=True).encode())
        return digest.hexdigest()
    root = Path(source.location)
    if not root.is_dir():
        return sha256_file(root)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(sha256_file(file).encode())
    return digest.hexdigest()


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
