"""The ``prepare`` stage: turn a task into a content-addressed ``train.jsonl`` / ``eval.jsonl``.

A prepared dataset lives in ``<output_dir>/<task>-<digest>``. The 16-hex digest covers the config
(all of it but ``output_dir``), the source bytes (sha256; for a hub id: id, subset, revision), the
task's code and :data:`~llmrl.data.prepared_folder.FORMAT_VERSION`, so the same inputs always map
to the same folder and a second run reuses it without writing anything. The folder is built under
a temporary name next to its final place and renamed at the end: a crash leaves neither a
half-written dataset nor the temporary folder. ``manifest.json`` records the inputs and the
sha256 of every file, which :func:`load_prepared` checks. The folder's files and manifest:
:mod:`llmrl.data.prepared_folder`; reading and checking the sources' rows:
:mod:`llmrl.data.prepare_sources`.

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
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from llmrl.config.prepare import SOURCE_TASK_FIELDS, PrepareConfig
from llmrl.config.task_spec import BUILTIN_TASKS
from llmrl.core.config_loading import ConfigError
from llmrl.core.user_code import find_entry_point, is_import_path
from llmrl.data.dataset_error import DatasetError
from llmrl.data.json_rows import load_json_line
from llmrl.data.prepare_sources import RowCopier, SourceInput, resolve_inputs
from llmrl.data.prepared_folder import (
    FORMAT_VERSION,
    MANIFEST,
    SPLIT_FILES,
    SplitWriter,
    install,
    read_manifest,
    reusable_manifest,
    verify_files,
    write_manifest,
)
from llmrl.data.problem import Problem
from llmrl.data.row_mapping import RowMapping

logger = logging.getLogger(__name__)

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


def prepare_dataset(config: PrepareConfig, progress: bool = True) -> PreparedDataset:
    """Prepare (or reuse) the dataset that ``config`` describes.

    Raises:
        DatasetError: a source cannot be read, or (``on_invalid: error``) a row is invalid; the
            message names the file, the row and the field.
        ConfigError: a generated task rejects ``generate.options`` or a size.
        MissingDatasetsError: a directory or hub source without the ``datasets`` package.
    """
    modules = _task_modules(config)
    inputs = {} if config.is_generated else resolve_inputs(config)
    code_sha = _code_sha256(modules)
    identity = {
        "format_version": FORMAT_VERSION,
        "config": config.model_dump(mode="json", exclude=_NOT_IN_DIGEST[config.reader]),
        "sources": {name: item.fingerprint for name, item in inputs.items()},
        "task_code": code_sha,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    final = Path(config.output_dir) / f"{task_slug(config.task)}-{digest}"
    manifest = reusable_manifest(final, digest)
    if manifest is not None:
        logger.info("reusing %s: it was prepared from the same inputs", final)
        return PreparedDataset(final, manifest, reused=True)

    logger.info("preparing task %s into %s", config.task, final)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; prepared data is meant to be shared
        writer = SplitWriter(staging)
        with writer:
            if not config.is_llmrl_task:
                described = _write_user_task(config, inputs, writer, progress)
            elif config.is_generated:
                described = _write_generated(config, modules[0], writer)
            else:
                described = _write_from_sources(config, modules[0], inputs, writer, progress)
        manifest = {
            "format_version": FORMAT_VERSION,
            "digest": digest,
            "task": config.task,
            **({} if config.is_llmrl_task else {"task_options": config.task_build_options()}),
            **described,
            "config": config.model_dump(mode="json"),
            "rows": dict(writer.rows),
            "files": writer.files,
            "task_code_sha256": code_sha,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        write_manifest(staging / MANIFEST, manifest)
        install(staging, final, digest)
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
    verify_files(folder, manifest)
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


def task_slug(task: str) -> str:
    """A folder-name-safe short form of a task spec: ``my_pkg.rewards:score`` -> ``score``."""
    short = task.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return re.sub(r"[^A-Za-z0-9_-]+", "-", short).strip("-") or "task"


def _task_modules(config: PrepareConfig) -> list[Any]:
    """The modules whose code makes the task (the digest covers them): an llmrl task's module;
    for the user's code, the module of each reward function or of the task class."""
    if config.is_llmrl_task:
        return [importlib.import_module(_TASKS[config.task][0])]
    specs = [spec.function for spec in config.reward or []] or [config.task]
    modules = []
    for spec in specs:
        target = BUILTIN_TASKS.get(spec, spec)
        if not is_import_path(target):  # an entry point: its module
            found = find_entry_point(target)
            target = found.value if found is not None else target
        try:
            modules.append(importlib.import_module(target.partition(":")[0].strip()))
        except ImportError as error:
            raise ConfigError([f"task: {spec!r} does not import: {error}"]) from None
    return modules


def _code_sha256(modules: list[Any]) -> str:
    """sha256 of the task's modules and of the ``llmrl.envs.tasks`` modules they use."""
    names = {module.__name__ for module in modules}
    for module in modules:
        for value in vars(module).values():
            name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
            if isinstance(name, str) and name.startswith("llmrl.envs.tasks."):
                names.add(name)
    digest = hashlib.sha256()
    for name in sorted(names):
        source = inspect.getsourcefile(sys.modules[name])
        code = Path(source).read_bytes() if source else repr(sys.modules[name]).encode()
        digest.update(name.encode() + b"\0" + code)
    return digest.hexdigest()


def _build_task(config: PrepareConfig) -> Any:
    """The user's (or an ecosystem) task, built as every later stage will build it."""
    # by name, like the llmrl task modules above: the envs layer sits above data
    make_task = importlib.import_module("llmrl.envs.tasks").make_task
    try:
        return make_task(config.task, **config.generate.options, **config.task_build_options())
    except (TypeError, ValueError) as error:
        raise ConfigError([f"task_options: {error}"]) from None


def _write_user_task(
    config: PrepareConfig, inputs: dict[str, SourceInput], writer: SplitWriter, progress: bool
) -> dict[str, Any]:
    """Rows of a task that is not llmrl's own: generated by its ``generate`` method, or read
    from a source in the user's shape (:class:`RowMapping`)."""
    task = _build_task(config)
    if config.is_generated:
        if not callable(getattr(task, "generate", None)):
            raise ConfigError(
                [
                    f"source: required: task {config.task!r} has no generate(count, seed, split) "
                    "method to make its problems"
                ]
            )
        _write_splits(config, task, writer)
        generated = {"class": config.task, "options": config.generate.options}
        return {"source": None, "eval_source": None, "generated": generated, "skipped": {}}
    mapping = RowMapping(
        task_slug(config.task), config.columns, config.prompt_template, config.max_row_chars
    )
    return _copy_sources(
        config, RowCopier(config, None, writer, progress, mapping=mapping), inputs, "prompt"
    )


def _write_splits(config: PrepareConfig, task: Any, writer: SplitWriter) -> None:
    """A generated task's train and eval problems, from ``generate``'s sizes and seed."""
    seed = config.generate.seed
    for split, size in (("train", config.generate.train_size), ("eval", config.generate.eval_size)):
        logger.info("generating %d %s problems of %s (seed %d)", size, split, config.task, seed)
        try:
            problems = task.generate(size, seed, split)
        except ValueError as error:
            raise ConfigError([f"generate.{split}_size: {error}"]) from None
        for problem in problems:
            writer.write(split, problem)


def _write_generated(config: PrepareConfig, module: Any, writer: SplitWriter) -> dict[str, Any]:
    task_cls = getattr(module, _TASKS[config.task][1])
    options = config.generate.options
    try:
        task = task_cls(**options)
    except TypeError as error:
        accepted = ", ".join(inspect.signature(task_cls).parameters)
        raise ConfigError([f"generate.options: {error} (accepted: {accepted})"]) from None
    except ValueError as error:
        raise ConfigError([f"generate.options: {error}"]) from None
    _write_splits(config, task, writer)
    generated = {"class": f"{module.__name__}.{task_cls.__name__}", "options": options}
    return {"source": None, "eval_source": None, "generated": generated, "skipped": {}}


def _write_from_sources(
    config: PrepareConfig,
    module: Any,
    inputs: dict[str, SourceInput],
    writer: SplitWriter,
    progress: bool,
) -> dict[str, Any]:
    make_problem = getattr(module, _ROW_FUNCTIONS.get(config.task, _TASKS[config.task][1]))
    copier = RowCopier(config, make_problem, writer, progress)
    return _copy_sources(config, copier, inputs, SOURCE_TASK_FIELDS[config.task][0])


def _copy_sources(
    config: PrepareConfig, copier: RowCopier, inputs: dict[str, SourceInput], key: str
) -> dict[str, Any]:
    """Copy the sources' rows into the splits (``key``: the row value the split hash reads)."""
    described: dict[str, Any] = {"source": None, "eval_source": None, "generated": None}
    if "eval_source" in inputs:
        for name, split in (("source", "train"), ("eval_source", "eval")):
            read = copier.copy(inputs[name], lambda _row, split=split: split)
            described[name] = inputs[name].describe(config, read)
    else:
        fraction, seed = config.split.eval_fraction, config.split.seed

        def assign(row: dict[str, str]) -> str:
            return "eval" if _hash_fraction(seed, row[key]) < fraction else "train"

        described["source"] = inputs["source"].describe(
            config, copier.copy(inputs["source"], assign)
        )
    skipped = copier.skipped
    if skipped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items()))
        logger.warning("skipped %d invalid rows (%s)", skipped.total(), reasons)
    if copier.writer.rows["train"] == 0:
        raise DatasetError(
            f"no valid training rows ({skipped.total()} invalid rows skipped)",
            file=inputs["source"].source.spec,
        )
    if copier.writer.rows["eval"] == 0:
        logger.warning("the eval split is empty")
    return described | {"skipped": dict(sorted(skipped.items()))}


def _hash_fraction(seed: int, key: str) -> float:
    """A uniform number in [0, 1) from ``seed`` and a row's key text: its place in the split."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
