"""The ``prepare`` stage: turn a task into a content-addressed ``train.jsonl`` / ``eval.jsonl``.

A prepared dataset lives in ``<output_dir>/<task>-<digest>``. The 16-hex digest covers the config
(all of it but ``output_dir``), the source bytes (sha256; for a hub id: id, subset, revision), the
task's code and :data:`FORMAT_VERSION`, so the same inputs always map to the same folder and a
second run reuses it without writing anything. The folder is built under a temporary name next to
its final place and renamed at the end: a crash leaves neither a half-written dataset nor the
temporary folder. ``manifest.json`` records the inputs and the sha256 of every file, which
:func:`load_prepared` checks.

A source without separate eval rows is split by hashing each row's question text with
``split.seed``: a row's split does not depend on row order or on the other rows (reordering,
appending or removing rows moves no other row), duplicated questions never straddle the splits,
and the eval share is ``eval_fraction`` on average, not exactly.

Example:
    prepared = prepare_dataset(load_config(PrepareConfig, "configs/prepare.yaml"))
    train, eval_problems = load_prepared(prepared.path)
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from llmrl.config.prepare import (
    OPTIONAL_TASK_FIELDS,
    SOURCE_TASK_FIELDS,
    STRUCTURED_FIELDS,
    PrepareConfig,
)
from llmrl.core.config_loading import ConfigError
from llmrl.data.datasets import (
    DatasetError,
    DataSource,
    count_rows,
    fingerprint,
    read_rows,
    require_datasets,
    require_fields,
    require_text_fields,
    resolve_source,
    sha256_file,
)
from llmrl.data.json_rows import load_json_line
from llmrl.data.problem import Problem

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the layout or content of prepared files changes: older folders are then rebuilt."""
MANIFEST = "manifest.json"
SPLIT_FILES = {"train": "train.jsonl", "eval": "eval.jsonl"}
PROGRESS_MIN_ROWS = 1000
"""Sources with more rows than this get a progress bar (when ``progress`` is on)."""

# task -> (module, the generator class or, for source tasks, the row -> Problem function)
_TASKS = {
    "arithmetic": ("llmrl.envs.tasks.arithmetic", "ArithmeticTask"),
    "countdown": ("llmrl.envs.tasks.countdown", "CountdownTask"),
    "ifeval": ("llmrl.envs.tasks.ifeval", "IFEvalTask"),
    "gsm8k": ("llmrl.envs.tasks.gsm8k", "problem_from_row"),
    "math": ("llmrl.envs.tasks.math", "problem_from_row"),
}
# generated tasks that also read a source: their row -> Problem function
_ROW_FUNCTIONS = {"ifeval": "problem_from_row"}
DATASETS_CACHE = ".datasets-cache"
"""Folder under ``output_dir`` for the ``datasets`` Arrow cache when ``cache_dir`` is not set."""
# cache_dir does not change the rows; reader "auto" (the default) is left out so that the digests
# of datasets prepared before the option existed do not change.
_NOT_IN_DIGEST = {
    "auto": {"output_dir", "cache_dir", "reader"},
    "datasets": {"output_dir", "cache_dir"},
}


@dataclass(frozen=True)
class PreparedDataset:
    """A prepared dataset folder (``train.jsonl``, ``eval.jsonl``, ``manifest.json``).

    ``reused`` is True when the folder already existed for the same inputs and nothing was
    written.

    Example:
        >>> import tempfile
        >>> folder = tempfile.TemporaryDirectory()
        >>> config = PrepareConfig(generate={"train_size": 10}, output_dir=folder.name)
        >>> prepared = prepare_dataset(config, progress=False)
        >>> prepared.manifest["rows"]
        {'train': 10, 'eval': 200}
        >>> folder.cleanup()
    """

    path: Path
    manifest: dict[str, Any]
    reused: bool


@dataclass(frozen=True)
class _Input:
    """One source to read, which of its splits, and its fingerprint."""

    source: DataSource
    split: str | None
    sha256: str | None
    fingerprint: str

    def describe(self, config: PrepareConfig, rows_read: int) -> dict[str, Any]:
        described = {"spec": self.source.spec, "kind": self.source.kind}
        described |= {"location": self.source.location, "split": self.split}
        described |= {"sha256": self.sha256, "rows_read": rows_read}
        if self.source.kind == "hub":
            described |= {"subset": config.subset, "revision": config.revision}
        return described


def prepare_dataset(config: PrepareConfig, progress: bool = True) -> PreparedDataset:
    """Prepare (or reuse) the dataset that ``config`` describes.

    Raises:
        DatasetError: a source cannot be read, or (``on_invalid: error``) a row is invalid; the
            message names the file, the row and the field.
        ConfigError: a generated task rejects ``generate.options`` or a size.
        MissingDatasetsError: a directory or hub source without the ``datasets`` package.
    """
    module = importlib.import_module(_TASKS[config.task][0])
    inputs = {} if config.is_generated else _resolve_inputs(config)
    code_sha = _code_sha256(module)
    identity = {
        "format_version": FORMAT_VERSION,
        "config": config.model_dump(mode="json", exclude=_NOT_IN_DIGEST[config.reader]),
        "sources": {name: item.fingerprint for name, item in inputs.items()},
        "task_code": code_sha,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(config.output_dir) / f"{config.task}-{digest}"
    manifest = _reusable(final, digest)
    if manifest is not None:
        logger.info("reusing %s: it was prepared from the same inputs", final)
        return PreparedDataset(final, manifest, reused=True)

    logger.info("preparing task %s into %s", config.task, final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; prepared data is meant to be shared
        writer = _SplitWriter(staging)
        with writer:
            if config.is_generated:
                described = _write_generated(config, module, writer)
            else:
                described = _write_from_sources(config, module, inputs, writer, progress)
        manifest = {
            "format_version": FORMAT_VERSION,
            "digest": digest,
            "task": config.task,
            **described,
            "config": config.model_dump(mode="json"),
            "rows": dict(writer.rows),
            "files": writer.files,
            "task_code_sha256": code_sha,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        _write_manifest(staging / MANIFEST, manifest)
        _install(staging, final, digest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("wrote %s", final)
    return PreparedDataset(final, manifest, reused=False)


def load_prepared(path: str | Path) -> tuple[list[Problem], list[Problem]]:
    """The ``(train, eval)`` problems of a prepared folder, after checking every file's sha256.

    Raises:
        DatasetError: the folder has no valid manifest, or a file is missing or was changed after
            preparation (the message names it).
    """
    folder = Path(path)
    manifest = read_manifest(folder)
    _verify_files(folder, manifest)
    splits = []
    for split, name in SPLIT_FILES.items():
        file = folder / name
        with file.open(encoding="utf-8") as lines:
            problems = []
            for number, line in enumerate(lines, start=1):
                row = load_json_line(line, str(file), number)
                try:
                    problems.append(Problem(**row))
                except (ValueError, TypeError) as error:
                    raise DatasetError(
                        f"not a prepared problem ({error})", file=file, row=number
                    ) from None
        if len(problems) != manifest["rows"][split]:
            raise DatasetError(
                f"{len(problems)} rows, manifest says {manifest['rows'][split]}", file=file
            )
        splits.append(problems)
    return splits[0], splits[1]


def _resolve_inputs(config: PrepareConfig) -> dict[str, _Input]:
    inputs = {"source": _input(config, str(config.source), config.source_split, named=False)}
    if config.eval_source is not None:
        inputs["eval_source"] = _input(config, config.eval_source, config.eval_split)
    elif config.eval_split is not None:
        inputs["eval_source"] = _input(config, str(config.source), config.eval_split)
    return inputs


def _input(config: PrepareConfig, spec: str, split: str | None, named: bool = True) -> _Input:
    """A source with its fingerprint; ``named=False``: ``split`` applies only if it has splits."""
    source = resolve_source(spec)
    require_datasets(source, config.reader)
    if source.kind == "hub":
        return _Input(source, split, None, fingerprint(source, config.subset, config.revision))
    if source.kind != "directory" and split is not None:
        if named:  # an explicit eval_split: fail now, not after reading the training rows
            raise DatasetError(
                f"eval_split {split!r} given, but a .{source.kind} file has no splits; name a "
                "separate eval_source file instead",
                file=spec,
            )
        split = None  # files have no splits; the default source_split does not apply to them
    sha = fingerprint(source)
    return _Input(source, split, sha, sha)


def _code_sha256(module: Any) -> str:
    """sha256 of the task's module and of the ``llmrl.envs.tasks`` modules it uses."""
    names = {module.__name__}
    for value in vars(module).values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.startswith("llmrl.envs.tasks."):
            names.add(name)
    digest = hashlib.sha256()
    for name in sorted(names):
        source_file = Path(str(inspect.getsourcefile(sys.modules[name])))
        digest.update(name.encode() + b"\0" + source_file.read_bytes())
    return digest.hexdigest()


def _write_generated(config: PrepareConfig, module: Any, writer: _SplitWriter) -> dict[str, Any]:
    task_cls = getattr(module, _TASKS[config.task][1])
    options = config.generate.options
    try:
        task = task_cls(**options)
    except TypeError as error:
        accepted = ", ".join(inspect.signature(task_cls).parameters)
        raise ConfigError([f"generate.options: {error} (accepted: {accepted})"]) from None
    except ValueError as error:
        raise ConfigError([f"generate.options: {error}"]) from None
    seed = config.generate.seed
    for split, size in (("train", config.generate.train_size), ("eval", config.generate.eval_size)):
        logger.info("generating %d %s problems of %s (seed %d)", size, split, config.task, seed)
        try:
            problems = task.generate(size, seed, split)
        except ValueError as error:
            raise ConfigError([f"generate.{split}_size: {error}"]) from None
        for problem in problems:
            writer.write(split, problem)
    generated = {"class": f"{module.__name__}.{task_cls.__name__}", "options": options}
    return {"source": None, "eval_source": None, "generated": generated, "skipped": {}}


def _write_from_sources(
    config: PrepareConfig,
    module: Any,
    inputs: dict[str, _Input],
    writer: _SplitWriter,
    progress: bool,
) -> dict[str, Any]:
    make_problem = getattr(module, _ROW_FUNCTIONS.get(config.task, _TASKS[config.task][1]))
    fields = SOURCE_TASK_FIELDS[config.task]
    copier = _RowCopier(config, make_problem, writer, progress)
    described: dict[str, Any] = {"source": None, "eval_source": None, "generated": None}
    if "eval_source" in inputs:
        for name, split in (("source", "train"), ("eval_source", "eval")):
            read = copier.copy(inputs[name], lambda _row, split=split: split)
            described[name] = inputs[name].describe(config, read)
    else:
        fraction, seed = config.split.eval_fraction, config.split.seed

        def assign(row: dict[str, str]) -> str:
            return "eval" if _hash_fraction(seed, row[fields[0]]) < fraction else "train"

        described["source"] = inputs["source"].describe(
            config, copier.copy(inputs["source"], assign)
        )
    skipped = copier.skipped
    if skipped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items()))
        logger.warning("skipped %d invalid rows (%s)", skipped.total(), reasons)
    if writer.rows["train"] == 0:
        raise DatasetError(
            f"no valid training rows ({skipped.total()} invalid rows skipped)",
            file=inputs["source"].source.spec,
        )
    if writer.rows["eval"] == 0:
        logger.warning("the eval split is empty")
    return described | {"skipped": dict(sorted(skipped.items()))}


def _present_fields(
    row: dict[str, Any], columns: dict[str, str], *, file: str, row_number: int, max_chars: int
) -> dict[str, Any]:
    """The optional fields ``row`` has (absent or null ones left out), keyed by task field; the
    task checks their values. A text longer than ``max_chars`` is a ``too_long`` error."""
    present = {}
    for name, column in columns.items():
        value = row.get(column)
        if value is None:
            continue
        if isinstance(value, str) and len(value) > max_chars:
            problem = f"{len(value)} characters, over the limit of {max_chars} (max_row_chars)"
            raise DatasetError(problem, file=file, row=row_number, field=column, reason="too_long")
        present[name] = value
    return present


def _hash_fraction(seed: int, key: str) -> float:
    """A uniform number in [0, 1) from ``seed`` and a row's key text: its place in the split."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class _RowCopier:
    """Reads a source's rows, validates them, and writes their problems to a split."""

    config: PrepareConfig
    make_problem: Callable[[dict, int, str], Problem]
    writer: _SplitWriter
    progress: bool
    skipped: Counter[str] = field(default_factory=Counter)

    def copy(self, item: _Input, assign: Callable[[dict[str, str]], str]) -> int:
        """Copy every row of ``item``; returns how many rows were read."""
        config, spec = self.config, item.source.spec
        columns = {name: config.columns.get(name, name) for name in SOURCE_TASK_FIELDS[config.task]}
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
                    values = require_text_fields(
                        row,
                        text_columns,
                        file=spec,
                        row_number=number,
                        max_chars=config.max_row_chars,
                    )
                    values |= require_fields(row, value_columns, file=spec, row_number=number)
                    values |= _present_fields(
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
            return self.make_problem(values, number, split)
        except ValueError as error:
            message = str(error)
            named = [name for name in columns if f"'{name}'" in message]
            column = columns[named[-1]] if named else None
            detail = message.rsplit(f"'{named[-1]}': ", 1)[-1] if named else message
            raise DatasetError(
                f"unparseable: {detail}", file=spec, row=number, field=column, reason="unparseable"
            ) from None


class _SplitWriter:
    """Writes problems as JSON lines into ``train.jsonl`` / ``eval.jsonl``, hashing as it goes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows: Counter[str] = Counter({split: 0 for split in SPLIT_FILES})
        self.files: dict[str, dict[str, Any]] = {}
        self._streams = {s: (folder / n).open("wb") for s, n in SPLIT_FILES.items()}
        self._hashes = {split: hashlib.sha256() for split in SPLIT_FILES}

    def write(self, split: str, problem: Problem) -> None:
        try:
            line = json.dumps(asdict(problem), ensure_ascii=False) + "\n"
        except TypeError as error:
            raise DatasetError(f"problem {problem.id} is not JSON-serializable ({error})") from None
        data = line.encode("utf-8")
        self._streams[split].write(data)
        self._hashes[split].update(data)
        self.rows[split] += 1

    def __enter__(self) -> _SplitWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for split, stream in self._streams.items():
            stream.close()
            name = SPLIT_FILES[split]
            self.files[name] = {"sha256": self._hashes[split].hexdigest(), "rows": self.rows[split]}


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
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


def _verify_files(folder: Path, manifest: dict[str, Any]) -> None:
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


def _reusable(final: Path, digest: str) -> dict[str, Any] | None:
    """The manifest of an intact, existing ``final`` folder for ``digest``, else None."""
    if not final.exists():
        return None
    try:
        manifest = read_manifest(final)
        if manifest.get("digest") != digest or manifest.get("format_version") != FORMAT_VERSION:
            raise DatasetError("manifest is for other inputs", file=final / MANIFEST)
        _verify_files(final, manifest)
    except DatasetError as error:
        logger.warning("%s exists but cannot be reused (%s); rebuilding it", final, error)
        return None
    return manifest


def _install(staging: Path, final: Path, digest: str) -> None:
    """Rename ``staging`` to ``final``, replacing a broken ``final`` (never an intact one)."""
    stale = None
    if final.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
        os.replace(final, stale / final.name)
    try:
        os.rename(staging, final)
    except OSError:
        # Another process installed the same dataset meanwhile: keep theirs when it is intact.
        if _reusable(final, digest) is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)
    finally:
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
