"""The bad-input corpus: every row is a user mistake that must fail cleanly (exit code 2 or the
row's exception, a message naming the field, file and row, nothing left behind;
tests/reliability/bad_input.py says how each is checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.bad_input import Row, assert_fails_cleanly
from tests.reliability.bad_input_data import DATA_ROWS
from tests.reliability.bad_input_settings import SETTINGS_ROWS

ROWS: list[Row] = [*DATA_ROWS, *SETTINGS_ROWS]
"""Every row of the corpus, but the model folders' (test_bad_input_models.py)."""


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id, marks=r.marks) for r in ROWS])
def test_bad_input_fails_cleanly(row: Row, work: Path, prepared_dataset: Path, request, capsys):
    assert_fails_cleanly(row, work, prepared_dataset, request, capsys)


def test_the_corpus_covers_every_category():
    assert len(ROWS) >= 40
    assert len({row.id for row in ROWS}) == len(ROWS)
    prefixes = {row.id.split("-", 1)[0] for row in ROWS}
    assert prefixes >= {"jsonl", "json", "parquet", "prepared", "config", "topology", "genkw",
                        "chart", "cli"}  # fmt: skip
    assert sum(row.subprocess for row in ROWS) >= 4
