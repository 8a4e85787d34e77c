"""The plain row readers of .jsonl, .json and .parquet files, which need no ``datasets``.

Each yields ``(row_number, row)``: JSONL rows numbered by line (blank lines counted, skipped),
JSON and Parquet rows from 1. A line over ``MAX_ROW_BYTES`` is refused without being read whole,
and every problem is a :class:`DatasetError` naming the file and the line or row.

Example:
    for number, row in read_jsonl(resolve_source("data/train.jsonl"), None):
        print(number, row)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from llmrl.data.dataset_error import DatasetError
from llmrl.data.json_rows import (
    MAX_ROW_BYTES,
    check_depth,
    check_unicode,
    decode_utf8,
    json_kind,
    load_json_line,
)
from llmrl.data.sources import DataSource


def read_jsonl(source: DataSource, columns: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
    """The objects of a JSONL file, one per non-blank line, numbered by line."""
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
                raise _not_an_object(row, " per line", source, line=number)
            yield number, row


def read_json(source: DataSource, columns: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
    """The objects of a JSON file holding one list of objects."""
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
            raise _not_an_object(row, "", source, row=number)
        check_unicode(row, text, source.spec, number)
        yield number, row


def read_parquet(source: DataSource, columns: Sequence[str] | None) -> Iterator[tuple[int, dict]]:
    """The rows of a Parquet file, batch by batch; only ``columns`` (those present) when given."""
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


def _not_an_object(value: object, where: str, source: DataSource, **place: int) -> DatasetError:
    """The error for a JSON value that is not an object; ``place`` is its ``line`` or ``row``."""
    return DatasetError(
        f"expected a JSON object{where}, got {json_kind(value)}",
        file=source.spec,
        reason="not_an_object",
        **place,
    )
