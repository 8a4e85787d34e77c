"""What a pipeline flow run leaves in MLflow, read back: its stage runs nested under the parent,
the datasets they logged and the models they registered (``tests/flows/test_pipeline.py`` under
Prefect's harness on SQLite, ``tests/services`` through a deployment on PostgreSQL), and the
short pipeline both run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

EVALUATED = ("eval-base", "eval-sft", "eval-grpo")
CHILD_RUNS = {"prepare", "sft", "grpo", *EVALUATED}
TRAINED = ("sft", "grpo")


def short_overrides(model_dir: Path) -> dict[str, list[str]]:
    """Overrides of ``configs/*.yaml`` for a pipeline of seconds per stage on the model in
    ``model_dir``: prepare 20/10 rows, SFT 2 steps, GRPO 2 steps of 2 prompts x 2 samples and
    8 new tokens, evaluation on 5 rows."""
    model = f"model.name={model_dir}"
    return {
        "prepare": ["generate.train_size=20", "generate.eval_size=10"],
        "sft": [model, "steps=2", "batch_size=2", "eval_every=1", "checkpoint.every=2"],
        "grpo": [
            model,
            "steps=2",
            "prompts_per_step=2",
            "num_samples=2",
            "generation.max_new_tokens=8",
            "checkpoint.every=2",
        ],
        "eval": [model, "max_new_tokens=8", "batch_size=5", "data.max_eval_rows=5"],
    }


def child_runs(client: Any, experiment: str, parent_id: str) -> dict[str, Any]:
    """The runs of ``experiment`` nested under ``parent_id``, by run name."""
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], max_results=1000)
    return {
        run.info.run_name: run
        for run in runs
        if run.data.tags.get("mlflow.parentRunId") == parent_id
    }


def assert_dataset_inputs(client: Any, children: dict[str, Any], dataset: Path) -> None:
    """Each stage run logged the prepared ``dataset``'s splits it read, with their context:
    prepare and SFT both splits, GRPO the train split, each evaluation the eval split."""
    contexts = {"prepare": {"train", "eval"}, "sft": {"train", "eval"}, "grpo": {"train"}}
    contexts |= {name: {"eval"} for name in EVALUATED}
    for name, expected in contexts.items():
        inputs = client.get_run(children[name].info.run_id).inputs.dataset_inputs
        assert {i.dataset.name for i in inputs} == {f"{dataset.name}/{s}" for s in expected}, name
        for item in inputs:
            assert str(dataset) in item.dataset.source
            context = {t.key: t.value for t in item.tags}["mlflow.data.context"]
            assert context == ("training" if item.dataset.name.endswith("train") else "evaluation")


def assert_registered_models(
    client: Any, children: dict[str, Any], experiment: str, checkpoints: dict[str, Path]
) -> None:
    """SFT and GRPO each registered one version of ``<experiment>-<stage>``: from its stage
    run, with the model's files, logged from ``checkpoints[stage]``; evaluation none."""
    import mlflow

    for name in TRAINED:
        (version,) = client.search_model_versions(f"name = '{experiment}-{name}'")
        assert version.run_id == children[name].info.run_id
        files = mlflow.artifacts.list_artifacts(
            client.get_model_version_download_uri(version.name, version.version),
            tracking_uri=client.tracking_uri,  # a served mlflow-artifacts: URI needs the server
        )
        assert {"config.json", "model.safetensors", "MLmodel"} <= {Path(f.path).name for f in files}
        (output,) = client.get_run(version.run_id).outputs.model_outputs
        logged = client.get_logged_model(output.model_id)
        assert logged.tags["llmrl.checkpoint"] == str(checkpoints[name].resolve())
    assert not client.search_model_versions(f"name = '{experiment}-eval'")
