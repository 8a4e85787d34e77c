"""The task a prepared dataset was made for, read from its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmrl.core.config_loading import ConfigError
from llmrl.core.user_code import UserCodeError, is_import_path
from llmrl.data.dataset_error import DatasetError
from llmrl.data.prepared_folder import read_manifest
from llmrl.envs.tasks import Task, make_task


def prepared_task(path: str | Path) -> tuple[Task, dict[str, Any]]:
    """The task a prepared dataset was made for (with its generator options) and its manifest.

    Raises:
        ConfigError: ``path`` is not a prepared dataset (a user error: the CLI exits 2).
        DatasetError: its manifest is broken or names an unknown task.
    """
    manifest_path = Path(path) / "manifest.json"
    if not manifest_path.is_file():
        what = "does not exist" if not Path(path).exists() else "has no manifest.json"
        raise ConfigError(
            [f"data.path: {path} {what}: not a prepared dataset; run `llmrl prepare` first"]
        )
    manifest = read_manifest(path)
    generated = manifest.get("generated") or {}
    options = {**generated.get("options", {}), **manifest.get("task_options", {})}
    try:
        return make_task(manifest.get("task"), **options), manifest
    except UserCodeError as error:
        if not is_import_path(str(manifest.get("task"))) and "task_options" not in manifest:
            # an unknown name: a manifest from elsewhere, or a package's entry point missing
            raise DatasetError(f"names no usable task ({error})", file=manifest_path) from None
        # the user's package is not installed where this runs
        raise ConfigError(
            [
                f"data.path: {path} was prepared for task {manifest.get('task')!r}, which this "
                f"process cannot load: {error} (install the package, or ship it with the "
                "RayJob's runtime_env: docs/own-task.md)"
            ]
        ) from None
    except (TypeError, ValueError) as error:
        raise DatasetError(f"names no usable task ({error})", file=manifest_path) from None
