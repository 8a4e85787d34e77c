"""The sources ``llmrl prepare`` reads, and the copying of their rows into the prepared splits.

:func:`resolve_inputs` turns a config's ``source`` / ``eval_source`` / splits into
:class:`SourceInput` items with their fingerprints (before any row is read); a
:class:`RowCopier` reads one, checks each row's fields (:mod:`llmrl.data.row_fields`), lets the
task turn it into a :class:`Problem` and writes it to the split ``assign`` picks, counting the
invalid rows it skips (``on_invalid: skip``) by reason.

Example:
    inputs = resolve_inputs(config)
    copier = RowCopier(config, make_problem, writer, progress=True)
    rows_read = copier.copy(inputs["source"], lambda values: "train")
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from llmrl.config.prepare import (
    OPTIONAL_TASK_FIELDS,
    SOURCE_TASK_FIELDS,
    STRUCTURED_FIELDS,
    PrepareConfig,
)
from llmrl.data.dataset_error import DatasetError
from llmrl.data.datasets import read_rows
from llmrl.data.hf_datasets import require_datasets
from llmrl.data.prepared_folder import SplitWriter
from llmrl.data.problem import Problem
from llmrl.data.row_fields import present_fields, require_fields, require_text_fields
from llmrl.data.row_mapping import RowMapping
from llmrl.data.sources import DataSource, count_rows, fingerprint, resolve_source

logger = logging.getLogger(__name__)

PROGRESS_MIN_ROWS = 1000
"""Sources with more rows than this get a progress bar (when ``progress`` is on)."""
DATASETS_CACHE = ".datasets-cache"
"""Folder under ``output_dir`` for the ``datasets`` Arrow cache when ``cache_dir`` is not set."""


@dataclass(frozen=True)
class SourceInput:
    """One source to read, which of its splits, and its fingerprint."""

    source: DataSource
    split: str | None
    sha256: str | None
    fingerprint: str

    def describe(self, config: PrepareConfig, rows_read: int) -> dict[str, Any]:
        """What the manifest records of this source, having read ``rows_read`` rows of it."""
        described = {"spec": self.source.spec, "kind": self.source.kind}
        described |= {"location": self.source.location, "split": self.split}
        described |= {"sha256": self.sha256, "rows_read": rows_read}
        if self.source.kind == "hub":
            described |= {"subset": config.subset, "revision": config.revision}
        return described


def resolve_inputs(config: PrepareConfig) -> dict[str, SourceInput]:
    """The config's ``source`` and, where there is one, ``eval_source`` (a separate source, or
    ``eval_split`` of the same one), each resolved and fingerprinted.

    Raises:
        DatasetError: a source does not exist, or an ``eval_split`` is named for a file.
        MissingDatasetsError: a source needs the ``datasets`` package, which is missing.
    """
    inputs = {"source": _input(config, str(config.source), config.source_split, named=False)}
    if config.eval_source is not None:
        inputs["eval_source"] = _input(config, config.eval_source, config.eval_split)
    elif config.eval_split is not None:
        inputs["eval_source"] = _input(config, str(config.source), config.eval_split)
    return inputs


def _input(config: PrepareConfig, spec: str, split: str | None, named: bool = True) -> SourceInput:
    """A source with its fingerprint; ``named=False``: ``split`` applies only if it has splits."""
    source = resolve_source(spec)
    require_datasets(source, config.reader)
    if source.kind == "hub":
        return SourceInput(source, split, None, fingerprint(source, config.subset, config.revision))
    if source.kind != "directory" and split is not None:
        if named:  # an explicit eval_split: fail now, not after reading the training rows
            raise DatasetError(
                f"eval_split {split!r} given, but a .{source.kind} file has no splits; name a "
                "separate eval_source file instead",
                file=spec,
            )
        split = None  # files have no splits; the default source_split does not apply to them
    sha = fingerprint(source)
    return SourceInput(source, split, sha, sha)


@dataclass
class RowCopier:
    """Reads a source's rows, validates them, and writes their problems to a split."""

    config: PrepareConfig
    make_problem: Callable[[dict, int, str], Problem] | None
    """An llmrl task's row -> Problem function (None for rows mapped by ``mapping``)."""
    writer: SplitWriter
    progress: bool
    skipped: Counter[str] = field(default_factory=Counter)
    mapping: RowMapping | None = None
    """Rows in the user's shape (a task that is not llmrl's own): mapped whole, see
    :mod:`llmrl.data.row_mapping`; ``make_problem`` is not used then."""

    def copy(self, item: SourceInput, assign: Callable[[dict[str, str]], str]) -> int:
        """Copy every row of ``item``; returns how many rows were read."""
        config, spec = self.config, item.source.spec
        fields = () if self.mapping is not None else SOURCE_TASK_FIELDS[config.task]
        columns = {name: config.columns.get(name, name) for name in fields}
        optional = {
            name: config.columns.get(name, name)
            for name in OPTIONAL_TASK_FIELDS.get(config.task, ())
        }
        logger.info("reading %s%s", spec, f" [{item.split}]" if item.split else "")
        # Whole rows (not just `columns`): a row missing a column is reported with the fields
        # it does have, so a misnamed column is easy to spot.
        cache_dir = config.cache_dir
        if cache_dir is None and item.source.kind != "hub":  # a hub id: the user's HF cache
            cache_dir = Path(config.output_dir) / DATASETS_CACHE
        rows = read_rows(
            item.source,
            None,
            split=item.split,
            subset=config.subset,
            revision=config.revision,
            reader=config.reader,
            cache_dir=cache_dir,
        )
        structured = STRUCTURED_FIELDS.get(config.task, ())
        text_columns = {name: column for name, column in columns.items() if name not in structured}
        value_columns = {name: column for name, column in columns.items() if name in structured}
        total = count_rows(item.source)
        if config.max_rows is not None:
            total = config.max_rows if total is None else min(total, config.max_rows)
        quiet = not self.progress or (total is not None and total <= PROGRESS_MIN_ROWS)
        read = 0
        with tqdm(
            total=total,
            disable=quiet,
            desc=f"prepare {Path(spec).name}",
            unit="row",
            file=sys.stderr,
        ) as bar:
            for number, row in rows:
                if config.max_rows is not None and read >= config.max_rows:
                    break
                read += 1
                bar.update()
                try:
                    if self.mapping is not None:
                        values = {"prompt": self.mapping.prompt_text(row, spec, number)}
                        split = assign(values)
                        self.writer.write(split, self.mapping.problem(row, number, split, spec))
                        continue
                    values = require_text_fields(
                        row,
                        text_columns,
                        file=spec,
                        row_number=number,
                        max_chars=config.max_row_chars,
                    )
                    values |= require_fields(row, value_columns, file=spec, row_number=number)
                    values |= present_fields(
                        row, optional, file=spec, row_number=number, max_chars=config.max_row_chars
                    )
                    split = assign(values)
                    problem = self._problem(values, number, split, spec, columns | optional)
                except DatasetError as error:
                    if config.on_invalid == "error":
                        raise
                    if self.skipped.total() < 5:
                        logger.warning("skipping %s", error)
                    self.skipped[error.reason or "invalid"] += 1
                    continue
                self.writer.write(split, problem)
        return read

    def _problem(
        self, values: dict[str, str], number: int, split: str, spec: str, columns: dict[str, str]
    ) -> Problem:
        try:
            assert self.make_problem is not None  # rows with a mapping never get here
            return self.make_problem(values, number, split)
        except ValueError as error:
            message = str(error)
            named = [name for name in columns if f"'{name}'" in message]
            column = columns[named[-1]] if named else None
            detail = message.rsplit(f"'{named[-1]}': ", 1)[-1] if named else message
            raise DatasetError(
                f"unparseable: {detail}", file=spec, row=number, field=column, reason="unparseable"
            ) from None
