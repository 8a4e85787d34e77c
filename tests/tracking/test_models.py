"""The final model of a stage: uploaded once into a logged model of the stage's run, registered
as one version per run, and loadable back from the registry (SQLite store, tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.tracking import Tracker, registered_name


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny, tokenizer) -> Path:
    """The tiny random Llama and SmolLM2's tokenizer as a Hugging Face model directory."""
    path = tmp_path_factory.mktemp("final") / "model"
    tiny.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_final_model_is_registered_once_per_run_and_loads_back(
    tmp_path: Path, model_dir: Path, tiny
) -> None:
    import mlflow
    import torch
    from transformers import AutoModelForCausalLM

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    name = registered_name("models-test", "sft")
    assert name == "models-test-sft"
    with Tracker("sft", experiment="models-test", tracking_uri=uri, log_system_metrics=False) as t:
        assert t.log_model(model_dir, name) == f"{name}/1"
        assert t.log_model(model_dir, name) == f"{name}/1"  # a resumed stage: no second version
    with Tracker("sft", experiment="models-test", tracking_uri=uri, log_system_metrics=False) as u:
        assert u.log_model(model_dir, name) == f"{name}/2"  # the next run: the next version

    client = MlflowClient(uri)
    versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: v.version)
    assert [(int(v.version), v.run_id) for v in versions] == [(1, t.run_id), (2, u.run_id)]
    assert client.get_run(t.run_id).data.tags["llmrl.registered_model"] == f"{name}/1"
    (output,) = client.get_run(t.run_id).outputs.model_outputs
    logged = client.get_logged_model(output.model_id)
    assert logged.source_run_id == t.run_id
    assert logged.tags["llmrl.checkpoint"] == str(model_dir)
    # Stored once, beside the SQLite store, with the files of the checkpoint's model directory.
    files = {a.path for a in client.list_logged_model_artifacts(output.model_id)}
    assert files == {p.name for p in model_dir.iterdir()} | {"MLmodel"}
    assert versions[0].source.startswith(str(tmp_path / "mlruns" / "models-test"))

    source = client.get_model_version_download_uri(name, "1")
    folder = mlflow.artifacts.download_artifacts(source, dst_path=str(tmp_path / "download"))
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    for (key, value), expected in zip(
        loaded.state_dict().items(), tiny.state_dict().values(), strict=True
    ):
        assert torch.equal(value, expected), key


def test_a_missing_model_directory_is_a_warning_not_a_crash(tmp_path: Path, caplog) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with Tracker("grpo", experiment="m", tracking_uri=uri, log_system_metrics=False) as t:
        assert t.log_model(tmp_path / "nowhere", "m-grpo") is None
    assert "not registered" in caplog.text
    assert MlflowClient(uri).search_registered_models() == []
    tags = MlflowClient(uri).get_run(t.run_id).data.tags
    assert tags["llmrl.checkpoint"] == str(tmp_path / "nowhere")
