"""The ``llmrl`` console script, run as a real subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from llmrl.models import resolve_spec
from llmrl.models.gguf_cache import converted_dir_for


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    script = shutil.which("llmrl", path=str(Path(sys.executable).parent))
    assert script, "the llmrl console script is not installed in this environment"
    return subprocess.run(
        [script, *args], capture_output=True, text=True, env=env or dict(os.environ), timeout=300
    )


def test_convert_model_prints_the_cache_directory(tokenizer):  # tokenizer: conversion done once
    result = _run("convert-model")
    assert result.returncode == 0, result.stderr
    printed = Path(result.stdout.strip())
    assert printed == converted_dir_for(resolve_spec("smollm2-135m-instruct").location)
    assert (printed / "model.safetensors").is_file()


def test_unknown_model_fails_with_a_clear_message():
    result = _run("convert-model", "no-such-model")
    assert result.returncode == 2
    assert "unknown model name 'no-such-model'" in result.stderr
    assert "smollm2-135m-instruct" in result.stderr


def test_missing_gguf_file_fails_naming_it(tmp_path):
    result = _run("convert-model", str(tmp_path / "absent.gguf"))
    assert result.returncode == 2
    assert f"model path {tmp_path / 'absent.gguf'} does not exist" in result.stderr


def test_version():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.startswith("llmrl ")
