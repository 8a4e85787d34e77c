"""The experiment every run goes into: artifacts beside a SQLite store, the model-training kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from llmrl.tracking.experiments import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    artifact_location,
    get_or_create_experiment,
)


def test_artifacts_of_a_sqlite_store_stay_beside_it(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert artifact_location(uri, "llmrl") == str(tmp_path / "mlruns" / "llmrl")
    assert artifact_location("http://mlflow:5000", "llmrl") is None


def test_experiments_open_in_the_model_training_view(tmp_path: Path) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    created = get_or_create_experiment(client, "fresh")
    experiment = client.get_experiment(created)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    assert experiment.artifact_location == str(tmp_path / "mlruns" / "fresh")
    assert get_or_create_experiment(client, "fresh") == created
    # An experiment made elsewhere gets the tag when llmrl first uses it ...
    older = client.create_experiment("older")
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(older).tags
    assert get_or_create_experiment(client, "older") == older
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    # ... but a kind someone chose is kept, and a deleted experiment comes back.
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    client.delete_experiment(chosen)
    assert get_or_create_experiment(client, "chosen") == chosen
    restored = client.get_experiment(chosen)
    assert restored.lifecycle_stage == "active"
    assert restored.tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_a_kind_tag_set_by_another_process_meanwhile_is_kept(tmp_path: Path) -> None:
    """Processes starting together on an untagged experiment race to tag it; on PostgreSQL the
    losers' inserts fail on the tag's key (tests/services saw it). A loser goes on; a failure
    that left no tag (the server away) still raises."""
    from mlflow.exceptions import MlflowException

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    shared = client.create_experiment("shared")

    class LosesTheRace:
        """The real client, whose tag insert loses to another process (or fails outright)."""

        def __init__(self, other_wins: bool) -> None:
            self.other_wins = other_wins

        def __getattr__(self, name: str):
            return getattr(client, name)

        def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
            if self.other_wins:
                client.set_experiment_tag(experiment_id, key, value)
            raise MlflowException("duplicate key value violates unique constraint",
                                  error_code="BAD_REQUEST")  # fmt: skip

    with pytest.raises(MlflowException, match="duplicate key"):
        get_or_create_experiment(LosesTheRace(other_wins=False), "shared")
    assert get_or_create_experiment(LosesTheRace(other_wins=True), "shared") == shared
    assert client.get_experiment(shared).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
