"""Fixtures of the training-stage tests: a tiny model directory, a small prepared arithmetic
dataset, a SQLite MLflow store, and helpers to build stage configs and read runs back.

Every test runs in its own temporary working directory (so ``runs/``, ``mlflow.db`` and the
tracking spool never land in the repository), with MLflow's system-metrics sampling off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tolerances import rounding_atol
from tests.tracking.conftest import mlflow_server  # noqa: F401 (a real server, reused)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer, tiny) -> Path:
    """The session's tiny random Llama saved with SmolLM2's tokenizer (a ``model.name``)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def arithmetic_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared arithmetic dataset: 40 train and 10 eval problems (the ``data.path``)."""
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    config = PrepareConfig(
        generate={"train_size": 40, "eval_size": 10},
        output_dir=tmp_path_factory.mktemp("prepared"),
    )
    return prepare_dataset(config, progress=False).path


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite MLflow store for the session (creating its tables takes seconds), with the
    ``llmrl`` experiment's artifacts in a temporary folder."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("llmrl", artifact_location=(root / "artifacts").as_uri())
    return uri


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test in its own working directory, spool and MLflow environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLMRL_MLFLOW_SPOOL", str(tmp_path / "spool"))
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_PARENT_RUN_ID"):
        monkeypatch.delenv(name, raising=False)


def first_update_loss_atol(batch) -> float:
    """How far two computations of a batch's first-update loss may differ. That loss is a token
    mean of ``-A`` (ratio exactly 1) whose terms cancel to near 0, so only an absolute bound
    counts: summed in another order (per rank, across ranks, micro-batch by micro-batch), its
    ``n`` float32 terms of up to ``max|A|`` round at worst ``n`` times in one direction."""
    tokens = sum(len(r) for r in batch["tokens"].as_list("response"))
    magnitude = float(batch["advantage"].abs().max())
    return rounding_atol(magnitude, torch.float32, roundings=tokens)


def stage_config(config_cls: type, *overrides: str, **fields: Any) -> Any:
    """A stage config as the CLI builds it: ``--set``-style ``overrides`` (``"a.b=1"``) and
    keyword ``fields`` (top-level values, e.g. ``steps=3``) on top of the defaults."""
    from llmrl.config import load_config

    sets = [*overrides, *(f"{key}={json.dumps(value)}" for key, value in fields.items())]
    return load_config(config_cls, None, ["progress=false", *sets])


def metric_steps(uri: str, run_id: str, key: str) -> list[int]:
    """The steps at which ``key`` was logged in the run, in logging order."""
    from mlflow import MlflowClient

    return [m.step for m in MlflowClient(uri).get_metric_history(run_id, key)]


def metric_values(uri: str, run_id: str, key: str) -> list[float]:
    """The values of ``key`` by step."""
    from mlflow import MlflowClient

    history = MlflowClient(uri).get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def trainer_state(checkpoint: str | Path) -> dict:
    """A checkpoint's ``trainer_state.json`` (``<ckpt>`` or ``<ckpt>/model``)."""
    folder = Path(checkpoint)
    if folder.name == "model":
        folder = folder.parent
    return json.loads((folder / "trainer_state.json").read_text())


def run_id_of(checkpoint: str | Path) -> str:
    """The MLflow run id a stage stored in a checkpoint (``<ckpt>`` or ``<ckpt>/model``)."""
    return trainer_state(checkpoint)["extra"]["mlflow_run_id"]


def artifact_paths(uri: str, run_id: str, path: str | None = None) -> list[str]:
    """Every artifact file of the run under ``path``, recursively."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    found = []
    for item in client.list_artifacts(run_id, path):
        found += artifact_paths(uri, run_id, item.path) if item.is_dir else [item.path]
    return found


def cli_env(tmp_path: Path, mlflow_uri: str | None = None) -> dict[str, str]:
    """The environment of an ``llmrl`` subprocess: this session's cache, the given store."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LLMRL_MLFLOW_SPOOL": str(tmp_path / "spool")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if mlflow_uri is not None:
        env["MLFLOW_TRACKING_URI"] = mlflow_uri
    return env


def run_cli(
    args: list[str], tmp_path: Path, mlflow_uri: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python -m llmrl.cli ARGS`` in ``tmp_path``; returns the completed process (text)."""
    return subprocess.run(
        [sys.executable, "-m", "llmrl.cli", *args],
        cwd=tmp_path,
        env=cli_env(tmp_path, mlflow_uri),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(
    args: list[str],
    tmp_path: Path,
    log: Path,
    mlflow_uri: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``python -m llmrl.cli ARGS`` in ``tmp_path``, stdout and stderr into ``log``;
    ``env`` adds to :func:`cli_env`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "llmrl.cli", *args],
            cwd=tmp_path,
            env={**cli_env(tmp_path, mlflow_uri), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_until(process: subprocess.Popen, done: Any, log: Path, timeout: float = 240) -> None:
    """Poll until ``done()`` is true; fails with ``log`` when the process exits or time is up."""
    deadline = time.monotonic() + timeout
    while not done():
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"timed out waiting:\n{log.read_text()}"
        time.sleep(0.05)


def assert_generates(model_dir: str | Path) -> None:
    """``model_dir`` loads as a plain Llama (no LoRA layers left) and greedily generates."""
    import torch
    from tensordict import TensorDict
    from transformers import LlamaForCausalLM

    from llmrl.data import ChatHistory, History
    from llmrl.models import load_model, load_tokenizer
    from llmrl.policies import TransformersWrapper

    model = load_model(model_dir)
    assert type(model) is LlamaForCausalLM
    assert not any("lora" in name for name, _ in model.named_parameters())
    policy = TransformersWrapper(
        model, load_tokenizer(model_dir), generate_kwargs={"max_new_tokens": 4, "do_sample": False}
    )
    prompt = History.from_chats([[{"role": "user", "content": "What is 2 + 3?"}]])
    state = TensorDict({"history": ChatHistory(prompt=prompt, batch_size=[1])}, batch_size=[1])
    with torch.no_grad():
        out = policy(state)
    responses = out["tokens"].as_list("response")
    assert len(responses) == 1 and len(responses[0]) >= 1
