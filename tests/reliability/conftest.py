"""The reliability tests' fixtures: the bad-input corpus's prepared dataset and its empty
working directory (tests/reliability/test_bad_input*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.reliability.bad_input")


@pytest.fixture(scope="module")
def prepared_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared arithmetic dataset (6 train, 3 eval problems)."""
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    config = PrepareConfig(
        generate={"train_size": 6, "eval_size": 3}, output_dir=tmp_path_factory.mktemp("prepared")
    )
    return prepare_dataset(config, progress=False).path


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (the cwd), where MLflow's store and spool would also land."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("LLMRL_MLFLOW_SPOOL", str(folder / "spool"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    return folder
