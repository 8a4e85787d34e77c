"""Rows read with the Hugging Face ``datasets`` library: ``save_to_disk`` folders, hub ids, and
files with ``reader: datasets`` (converted to Arrow once in a cache folder).

Local files and folders are read offline, always: ``datasets`` is used inside :func:`offline`
(``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set, ``DownloadConfig(local_files_only=True)``),
so reading them never touches the network. A hub id is downloaded as ``datasets`` does, unless
:func:`environment_is_offline`: then it is read from the local Hugging Face cache only, and one
that is not cached fails at once with the :class:`DatasetError` of :func:`hub_error`.

Example:
    for number, row in read_datasets(resolve_source("data/gsm8k"), "test", None, None):
        print(number, row)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmrl.data.dataset_error import DatasetError, MissingDatasetsError
from llmrl.data.json_rows import jsonl_line_numbers
from llmrl.data.sources import SUPPORTED, DataSource

_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


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


def read_datasets(
    source: DataSource,
    split: str | None,
    subset: str | None,
    revision: str | None,
    cache_dir: str | Path | None = None,
) -> Iterator[tuple[int, dict]]:
    """The rows of ``source`` (one ``split`` of it) as ``datasets`` loads them, numbered from 1
    (a JSONL file's by line, as :func:`~llmrl.data.file_readers.read_jsonl` numbers them)."""
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
    if source.kind == "jsonl":  # number rows by line, blank lines included, as read_jsonl does
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
