"""MLflow runs read back (metric histories, artifact files) and runs a test logs itself, shaped
like a pipeline's: a parent run with held-out accuracies and a GRPO run with its reward per step
(``tests/tracking`` and ``tests/flows`` compare them)."""

from __future__ import annotations

import time

from mlflow import MlflowClient
from mlflow.entities import Metric

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metric_steps(uri: str, run_id: str, key: str) -> list[int]:
    """The steps at which ``key`` was logged in the run, in logging order."""
    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, key)]


def metric_values(uri: str, run_id: str, key: str) -> list[float]:
    """The values of ``key`` by step."""
    history = MlflowClient(uri).get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def artifact_paths(uri: str, run_id: str, path: str | None = None) -> list[str]:
    """Every artifact file of the run under ``path``, recursively."""
    client = MlflowClient(uri)
    found = []
    for item in client.list_artifacts(run_id, path):
        found += artifact_paths(uri, run_id, item.path) if item.is_dir else [item.path]
    return found


class Runs:
    """Logs pipeline-like runs: a parent with accuracies, a GRPO run with reward per step."""

    def __init__(self, uri: str) -> None:
        self.client = MlflowClient(uri)

    def run(self, experiment: str, name: str, stage: str, parent: str | None = None) -> str:
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        tags = {"llmrl.stage": stage, **({"mlflow.parentRunId": parent} if parent else {})}
        run = self.client.create_run(experiment_id, run_name=name, tags=tags)
        time.sleep(0.01)  # distinct start times: "newest first" is well defined
        return run.info.run_id

    def metrics(self, run_id: str, key: str, values: list[float], first_step: int = 1) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(key, v, now, first_step + i) for i, v in enumerate(values)]
        self.client.log_batch(run_id, metrics=batch)

    def pipeline(self, experiment: str, name: str, rewards: list[float], acc: dict) -> str:
        parent = self.run(experiment, name, "pipeline")
        if rewards:
            grpo = self.run(experiment, "grpo", "grpo", parent=parent)
            self.metrics(grpo, "reward_mean", rewards)
        for model, value in acc.items():
            self.metrics(parent, f"accuracy_{model}", [value], first_step=0)
        return parent
