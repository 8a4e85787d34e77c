"""Read dataset rows from JSONL, JSON, Parquet, ``datasets`` directories and hub ids.

Every reader yields ``(row_number, row)`` with 1-based row numbers a user can find in the file
(for JSONL, the line number), and every problem becomes a :class:`DatasetError` naming the file,
the row and, where there is one, the field.

Two readers:

* ``reader="auto"`` (the default): .jsonl/.json/.parquet files are streamed by the plain
  readers here (no ``datasets`` needed); a directory is read with ``datasets.load_from_disk``.
* ``reader="datasets"``: files are loaded with ``datasets.load_dataset("json"|"parquet",
  data_files=...)``, which converts them to Arrow once in ``cache_dir`` (``llmrl prepare``
  passes ``cache_dir`` or ``<output_dir>/.datasets-cache``, never the home-directory default,
  so the cache sits next to the prepared data and is easy to delete). Rows are numbered as the
  plain readers number them (JSONL: by line, blank lines counted), so both readers give the same
  row errors and the same prepared rows; one difference: Arrow cannot tell a missing field from
  a null one, so a row without a field that other rows have reads as a null value (the error
  still names the file, row and field).

A ``save_to_disk`` directory may hold a ``Dataset`` (one split, read whatever ``split`` says when
that is None or ``train``) or a ``DatasetDict`` (``split`` picks one; with a single split it is
the default; a missing split is an error listing the available ones).

Local files and folders are read offline, always: ``datasets`` is used inside :func:`offline`
(``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, ``DownloadConfig(local_files_only=True)``),
so reading them never touches the network. A hub id (``owner/name``, when no such local path
exists) is downloaded as ``datasets`` does, unless the environment already says offline
(``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set to 1, as ``make run`` and the tests do): then
it is read from the local Hugging Face cache only, and one that is not cached fails at once
with a :class:`DatasetError` that says how to save a local copy (see :func:`hub_error`)
instead of hanging on the network.

Example:
    for row_number, row in read_rows("data/train.jsonl", columns=["question", "answer"]):
        print(row_number, row["question"])
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llmrl.data.dataset_error import DatasetError
from llmrl.data.json_rows import (
    MAX_ROW_BYTES,
    READ_CHUNK_BYTES,
    check_depth,
    check_unicode,
    decode_utf8,
    json_kind,
    jsonl_line_numbers,
    load_json_line,
)

FILE_FORMATS = (".jsonl", ".json", ".parquet")
SUPPORTED = (
    ".jsonl (one JSON object per line), .json (a list of objects), .parquet, "
    "a datasets save_to_disk directory, or a Hugging Face hub id (owner/name)"
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")

SourceKind = Literal["jsonl", "json", "parquet", "directory", "hub"]


class MissingDatasetsError(ImportError):
    """Reading a ``datasets`` directory or a hub id needs the ``datasets`` package."""

    def __init__(self, source: str) -> None:
        super().__init__(
            f"reading {source} (a datasets directory or hub id) needs the 'datasets' package, "
            "which is not installed. Install it with: pip install datasets"
        )
        self.source = source

    def __reduce__(self) -> tuple:
        return (type(self), (self.source,))


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
        rows = _read_datasets(resolved, split, subset, revision, cache_dir)
    else:
        readers = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet}
        rows = readers[resolved.kind](resolved, columns)
    for number, row in rows:
        if columns is not None:
            row = {name: row[name] for name in columns if name in row}
        yield number, row


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


def _read_jsonl(source: DataSource, columns: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
    with open(source.location, "rb") as stream:
        number = 0
        while raw := stream.readline(MAX_ROW_BYTES + 1):
            number += 1
            if len(raw.rstrip(b"\r\n")) > MAX_ROW_BYTES:
                raise DatasetError(
                    f"the line is over {MAX_ROW_BYTES} bytes (MAX_ROW_BYTES); is this a JSONL "
                    "file, one object per line?",
                    file=source.spec,
                    line=number,
                    reason="too_long",
                )
            text = decode_utf8(raw, source.spec, number, strip_bom=number == 1)
            if not text.strip():
                continue
            row = load_json_line(text, source.spec, number)
            if not isinstance(row, dict):
                raise DatasetError(
                    f"expected a JSON object per line, got {json_kind(row)}",
                    file=source.spec,
                    line=number,
                    reason="not_an_object",
                )
            yield number, row


def _read_json(source: DataSource, columns: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
    raw = Path(source.location).read_bytes()
    text = decode_utf8(raw, source.spec, None, strip_bom=True)
    check_depth(text, source.spec, None)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise DatasetError(
            f"invalid JSON: {error.msg} (column {error.colno})",
            file=source.spec,
            line=error.lineno,
            reason="invalid_json",
        ) from None
    if not isinstance(data, list):
        raise DatasetError(
            f"expected a JSON list of objects, got {json_kind(data)}; a file with one object "
            "per line should be named .jsonl",
            file=source.spec,
            reason="not_a_list",
        )
    for number, row in enumerate(data, start=1):
        if not isinstance(row, dict):
            raise DatasetError(
                f"expected a JSON object, got {json_kind(row)}",
                file=source.spec,
                row=number,
                reason="not_an_object",
            )
        check_unicode(row, text, source.spec, number)
        yield number, row


def _read_parquet(source: DataSource, columns: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source.location)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
        raise DatasetError(f"not a readable Parquet file ({error})", file=source.spec) from None
    wanted = None
    if columns is not None:
        present = set(parquet.schema_arrow.names)
        wanted = [name for name in columns if name in present]
    number = 0
    for batch in parquet.iter_batches(columns=wanted):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def require_datasets(source: DataSource, reader: str = "auto") -> None:
    """Fail early, before any work, when ``source`` needs the missing ``datasets`` package."""
    needs = source.kind in ("directory", "hub") or reader == "datasets"
    if needs and importlib.util.find_spec("datasets") is None:
        raise MissingDatasetsError(source.spec)


def hub_error(source: DataSource, cause: object = None) -> DatasetError:
    """The error for a hub id that is not in the local cache: what to run to get a local copy."""
    why = f" ({cause})" if cause else ""
    return DatasetError(
        f"a Hugging Face hub id that is not in the local Hugging Face cache{why}, and the "
        "environment is offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set), so prepare "
        "does not download it. Unset those to download, or save a local copy once where the "
        "hub is reachable, "
        f"e.g. python -c \"import datasets; datasets.load_dataset('{source.location}')"
        f".save_to_disk('data/{source.location.rsplit('/', 1)[-1]}')\" (add the subset name "
        "after the id if it has several), then set source to that folder",
        file=source.spec,
        reason="hub_not_cached",
    )


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Run ``datasets`` / ``huggingface_hub`` offline: no request leaves the machine.

    Sets ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` in the environment and in both libraries'
    already-imported config modules (they read the variables at import), restoring all on exit.
    """
    import datasets.config
    import huggingface_hub.constants

    saved_env = {name: os.environ.get(name) for name in _OFFLINE_VARIABLES}
    saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
    os.environ.update(dict.fromkeys(_OFFLINE_VARIABLES, "1"))
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _read_datasets(
    source: DataSource,
    split: str | None,
    subset: str | None,
    revision: str | None,
    cache_dir: str | Path | None = None,
) -> Iterator[tuple[int, dict]]:
    try:
        import datasets
    except ImportError:
        raise MissingDatasetsError(source.spec) from None
    cache = None if cache_dir is None else str(Path(cache_dir).expanduser().resolve())
    local_only = source.kind != "hub" or environment_is_offline()
    with offline() if local_only else contextlib.nullcontext():
        loaded = _load(datasets, source, subset, revision, cache, local_only)
    if isinstance(loaded, (datasets.DatasetDict, dict)):
        names = sorted(loaded)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in loaded:
            wanted = "no split was named" if split is None else f"it has no split {split!r}"
            raise DatasetError(
                f"{wanted}; its splits are {', '.join(names)} (set source_split / eval_split)",
                file=source.spec,
                reason="missing_split",
            )
        loaded = loaded[split]
    elif split is not None and split != "train" and source.kind == "directory":
        raise DatasetError(
            f"split {split!r} given, but the folder holds a single Dataset (no splits); save a "
            "DatasetDict to pick splits, or name a separate eval_source",
            file=source.spec,
            reason="missing_split",
        )
    numbers: Iterator[int] = iter(range(1, len(loaded) + 1))
    if source.kind == "jsonl":  # number rows by line, blank lines included, as _read_jsonl does
        numbers = jsonl_line_numbers(source.location)
    for number, row in zip(numbers, loaded, strict=False):
        yield number, dict(row)


def environment_is_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` says the hub is off limits."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in _OFFLINE_VARIABLES
    )


def _load(
    datasets: Any,
    source: DataSource,
    subset: str | None,
    revision: str | None,
    cache: Any,
    local_only: bool = True,
):
    """``load_from_disk`` / ``load_dataset`` (from local files only unless ``local_only`` is
    False: a hub id in an online environment), with failures as :class:`DatasetError`."""
    if source.kind == "directory":
        try:
            return datasets.load_from_disk(source.location)
        except FileNotFoundError as error:
            raise DatasetError(
                f"not a datasets save_to_disk directory ({error}); expected {SUPPORTED}",
                file=source.spec,
            ) from None
    config = datasets.DownloadConfig(local_files_only=local_only, cache_dir=cache)
    try:
        if source.kind == "hub":
            return datasets.load_dataset(
                source.location, subset, revision=revision, cache_dir=cache, download_config=config
            )
        builder = "json" if source.kind in ("jsonl", "json") else "parquet"
        # One split named "train": the file is the whole dataset, the caller's split is ignored.
        return datasets.load_dataset(
            builder,
            data_files={"train": source.location},
            split="train",
            cache_dir=cache,
            download_config=config,
        )
    except (ConnectionError, OSError) as error:
        if source.kind == "hub":
            raise hub_error(source, type(error).__name__) from None
        raise DatasetError(f"datasets could not read it ({error})", file=source.spec) from None
    except Exception as error:  # DatasetGenerationError, ArrowInvalid, ... for a bad file
        if source.kind == "hub":
            raise hub_error(source, f"{type(error).__name__}: {error}") from None
        cause = error.__cause__ or error
        raise DatasetError(
            f"datasets could not read it ({type(cause).__name__}: {cause}); reader: auto reads "
            "it row by row and names the bad row",
            file=source.spec,
            reason="unreadable",
        ) from None


def require_text_fields(
    row: dict[str, Any],
    columns: dict[str, str],
    *,
    file: str,
    row_number: int,
    max_chars: int,
) -> dict[str, str]:
    """Check that ``row`` has non-blank string columns; returns them keyed by task field.

    ``columns`` maps each task field to the source column that holds it. The first problem
    raises a :class:`DatasetError` naming the column, with ``reason`` one of ``missing_field``,
    ``wrong_type``, ``empty`` or ``too_long``.

    Example:
        >>> require_text_fields({"q": "2+2?"}, {"question": "q"}, file="a", row_number=1,
        ...                     max_chars=100)
        {'question': '2+2?'}
    """
    values = {}
    for field, column in columns.items():
        if column in row:
            found = _text_problem(row[column], max_chars)
        else:
            found = (_missing(row), "missing_field")
        if found is not None:
            problem, reason = found
            if field != column:
                problem += f" (task field '{field}'; see `columns`)"
            raise DatasetError(problem, file=file, row=row_number, field=column, reason=reason)
        values[field] = row[column]
    return values


def require_fields(
    row: dict[str, Any], columns: dict[str, str], *, file: str, row_number: int
) -> dict[str, Any]:
    """The values of ``columns`` (task field -> source column) in ``row``, of any type.

    For structured fields (lists, objects) that the task itself checks; a missing column raises
    a :class:`DatasetError` (``reason`` ``missing_field``) naming it and the row's fields.
    """
    values = {}
    for field, column in columns.items():
        if column not in row:
            problem = _missing(row)
            if field != column:
                problem += f" (task field '{field}'; see `columns`)"
            raise DatasetError(
                problem, file=file, row=row_number, field=column, reason="missing_field"
            )
        values[field] = row[column]
    return values


def _missing(row: dict[str, Any]) -> str:
    present = ", ".join(sorted(map(str, row))[:20]) or "none"
    return f"missing (the row's fields: {present})"


def _text_problem(value: Any, max_chars: int) -> tuple[str, str] | None:
    """What is wrong with a text value, as (problem, reason), or None when it is fine."""
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        return f"expected a string, got {kind}", "wrong_type"
    if not value:
        return "empty string", "empty"
    if not value.strip():
        return "whitespace only", "empty"
    if len(value) > max_chars:
        return f"{len(value)} characters, over the limit of {max_chars} (max_row_chars)", "too_long"
    return None
