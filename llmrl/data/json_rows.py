"""JSON and JSONL text read within bounds: lines never held beyond :data:`MAX_ROW_BYTES`,
nesting checked before parsing (:data:`MAX_JSON_DEPTH`), UTF-8 and lone surrogates reported
with the file and row. The dataset readers (:mod:`llmrl.data.file_readers`) and the prepared-data
loader use these."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from llmrl.core.config_loading import quoted
from llmrl.data.dataset_error import DatasetError

MAX_ROW_BYTES = 1 << 26
"""A JSONL line longer than this (64 MiB) is refused without being held whole in memory."""
MAX_JSON_DEPTH = 64
"""JSON lists and objects nested deeper than this are refused (rows nest ~3 deep); checked
before parsing, so Python's recursion limit never decides."""
READ_CHUNK_BYTES = 1 << 20
"""Bytes read at a time where whole lines need not be held."""


def load_json_line(text: str, file: str, number: int) -> Any:
    """Line ``number`` of the JSONL ``file`` parsed, within :data:`MAX_JSON_DEPTH` and without
    lone surrogates; a :class:`DatasetError` naming the file and line (row) otherwise.

    Example:
        >>> load_json_line('{"q": "2+2?"}', "a.jsonl", 1)
        {'q': '2+2?'}
    """
    check_depth(text, file, number)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise DatasetError(
            f"invalid JSON: {error.msg} (column {error.colno})",
            file=file,
            line=number,
            reason="invalid_json",
        ) from None
    if isinstance(value, dict):
        check_unicode(value, text, file, number)
    return value


_JSON_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]++")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def json_depth(text: str) -> int:
    """How deep the lists and objects of the JSON ``text`` nest, found without parsing it (in
    linear time, without recursion): brackets inside strings do not count.

    Example:
        >>> json_depth('{"a": [1, {"b": "[[["}]}')
        3
    """
    if text.count("[") + text.count("{") <= 1:
        return text.count("[") + text.count("{")
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_NESTING.__getitem__, brackets)), default=0)


def check_depth(text: str, file: str, line: int | None) -> None:
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise DatasetError(
            f"JSON nested {depth} levels deep, over the limit of {MAX_JSON_DEPTH}",
            file=file,
            line=line,
            reason="too_deep",
        )


def check_unicode(row: dict[str, Any], text: str, file: str, row_number: int) -> None:
    """Refuse a row holding a lone surrogate (a ``\\ud800`` escape without its pair): it is
    not Unicode text, and writing or tokenizing it fails later, far from the file."""
    if not _SURROGATE_ESCAPE.search(text):
        return
    pending: list[tuple[str, Any]] = [(str(key), value) for key, value in row.items()]
    pending += [(str(key), key) for key in row]
    while pending:
        field, value = pending.pop()
        if isinstance(value, dict):
            pending += [(field, item) for pair in value.items() for item in pair]
        elif isinstance(value, list):
            pending += [(field, item) for item in value]
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                raise DatasetError(
                    f"invalid Unicode: a lone surrogate {quoted(value[error.start])} at "
                    f"character {error.start + 1} (a \\uD800-\\uDFFF escape without its pair)",
                    file=file,
                    row=row_number,
                    field=field,
                    reason="invalid_unicode",
                ) from None


def jsonl_line_numbers(path: str) -> Iterator[int]:
    """The numbers of the file's non-blank lines, read :data:`READ_CHUNK_BYTES` bytes at a
    time: a line is never held whole, so a file of one huge line costs no more memory than any
    other."""
    number, blank = 1, True
    with open(path, "rb") as stream:
        while chunk := stream.read(READ_CHUNK_BYTES):
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                if blank and chunk[start : None if end < 0 else end].strip():
                    blank = False
                if end < 0:
                    break
                if not blank:
                    yield number
                number, blank, start = number + 1, True, end + 1
    if not blank:
        yield number


def decode_utf8(raw: bytes, file: str, line: int | None, strip_bom: bool) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        where = line if line is not None else raw[: error.start].count(b"\n") + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise DatasetError(
            f"not valid UTF-8 (byte 0x{raw[error.start]:02x} at byte {column} of the line); "
            "re-encode the file as UTF-8",
            file=file,
            line=where,
            reason="not_utf8",
        ) from None
    return text.removeprefix("\ufeff") if strip_bom else text


def json_kind(value: Any) -> str:
    names = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    if type(value) in names:
        return names[type(value)]
    return "a number" if isinstance(value, (int, float)) else type(value).__name__
