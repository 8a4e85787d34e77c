"""Datasets as run inputs: a prepared folder's splits, with name, source, digest and context."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from llmrl.tracking import Tracker, prepared_inputs

MANIFEST = {
    "digest": "0123456789abcdef",
    "task": "arithmetic",
    "rows": {"train": 20, "eval": 10},
    "files": {
        "train.jsonl": {"sha256": "aa" * 32, "rows": 20},
        "eval.jsonl": {"sha256": "bb" * 32, "rows": 10},
    },
}


def test_a_prepared_folder_gives_one_input_per_split_read(tmp_path: Path) -> None:
    folder = tmp_path / "arithmetic-0123456789abcdef"
    refs = prepared_inputs(folder, MANIFEST, {"eval.jsonl": "evaluation"})
    assert [(r.name, r.source, r.digest, r.context, r.rows) for r in refs] == [
        ("arithmetic-0123456789abcdef/eval", str(folder / "eval.jsonl"), "b" * 16,
         "evaluation", 10),
    ]  # fmt: skip


def test_inputs_show_on_the_run(sqlite_uri: str, tmp_path: Path) -> None:
    folder = tmp_path / "arithmetic-0123456789abcdef"
    contexts = {"train.jsonl": "training", "eval.jsonl": "evaluation"}
    with Tracker("sft", tracking_uri=sqlite_uri, log_system_metrics=False) as t:
        t.log_inputs(prepared_inputs(folder, MANIFEST, contexts))
    inputs = MlflowClient(sqlite_uri).get_run(t.run_id).inputs.dataset_inputs
    seen = {}
    for item in inputs:
        tags = {tag.key: tag.value for tag in item.tags}
        seen[item.dataset.name] = (
            item.dataset.digest,
            item.dataset.source,
            tags["mlflow.data.context"],
            tags["rows"],
        )
    assert seen["arithmetic-0123456789abcdef/train"][0] == "a" * 16
    assert str(folder / "train.jsonl") in seen["arithmetic-0123456789abcdef/train"][1]
    assert seen["arithmetic-0123456789abcdef/train"][2:] == ("training", "20")
    assert seen["arithmetic-0123456789abcdef/eval"][2:] == ("evaluation", "10")
