"""``llmrl prepare``, run as the real console script in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    script = shutil.which("llmrl", path=str(Path(sys.executable).parent))
    assert script, "the llmrl console script is not installed in this environment"
    return subprocess.run(
        [script, *args], capture_output=True, text=True, cwd=cwd, env=dict(os.environ), timeout=120
    )


def test_prepare_prints_the_config_then_the_directory_last(tmp_path):
    config = tmp_path / "prepare.yaml"
    config.write_text("task: arithmetic\ngenerate:\n  train_size: 40\n  eval_size: 8\n")
    args = [
        "prepare",
        "--config",
        str(config),
        "--set",
        "output_dir=out",
        "--set",
        "generate.seed=3",
    ]
    result = _run(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    *config_lines, last = result.stdout.splitlines()
    printed = yaml.safe_load("\n".join(config_lines))
    assert printed["generate"] == {"train_size": 40, "eval_size": 8, "seed": 3, "options": {}}
    folder = tmp_path / last
    assert folder.parent == tmp_path / "out" and folder.name.startswith("arithmetic-")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["rows"] == {"train": 40, "eval": 8}
    assert "prepared arithmetic: 40 train, 8 eval rows; skipped: none" in result.stderr

    again = _run(*args, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == last
    assert "reused arithmetic" in again.stderr


def test_bad_config_exits_2_naming_the_dotted_field(tmp_path):
    config = tmp_path / "prepare.yaml"
    config.write_text(
        "task: arithmetic\nsplit:\n  eval_fraction: 1.5\ngenerate:\n  trian_size: 3\n"
    )
    result = _run("prepare", "--config", str(config), "--set", "max_rows=x", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{config}: split.eval_fraction: Input should be less than 1 (got 1.5)" in result.stderr
    assert f"{config}: unknown key 'generate.trian_size'" in result.stderr
    assert "--set max_rows=x: max_rows: Input should be a valid integer" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "data").exists()


def test_bad_data_file_exits_2_naming_file_row_and_field(tmp_path):
    rows = [
        {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"},
        {"question": "What is 2 + 2?", "answer": 4},
    ]
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = _run(
        "prepare",
        "--set",
        "task=gsm8k",
        "--set",
        f"source={source}",
        "--set",
        "output_dir=out",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert f"{source}: row 2: field 'answer': expected a string, got int" in result.stderr
    assert "Traceback" not in result.stderr
    assert os.listdir(tmp_path / "out") == []  # no output folder, no temporary folder
