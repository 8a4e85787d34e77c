"""The pipeline's parameters: what a flow run is asked to do (the form of the Prefect UI's
"Run" dialog, the ``python -m flows`` options), and the names and tags derived from them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flows.launchers import KubernetesSettings, RayRuntimeEnv
from flows.stages import ALIASES, COMMANDS, RUN_ORDER, SPECS, STARTABLE, command_of


class PipelineParams(BaseModel):
    """The pipeline's parameters (the form of the Prefect UI's "Run" dialog).

    Paths are relative to the flow's working directory. ``overrides`` are ``--set`` values
    per stage, e.g. ``{"sft": ["steps=5", "optimizer.lr=1e-5"], "eval": ["batch_size=8"]}``.
    """

    model_config = ConfigDict(extra="forbid")

    prepare_config: str = Field("configs/prepare.yaml", description="config of `llmrl prepare`")
    sft_config: str = Field("configs/sft.yaml", description="config of `llmrl sft`")
    grpo_config: str = Field("configs/grpo.yaml", description="config of `llmrl grpo`")
    eval_config: str = Field("configs/eval.yaml", description="config of `llmrl eval`")
    overrides: dict[str, list[str]] = Field(
        default_factory=dict,
        description='per stage, "key=value" overrides (--set) of its config, e.g. '
        '{"sft": ["steps=5"]}; stages: prepare, sft, grpo, eval',
    )
    skip: list[str] = Field(
        default_factory=list,
        description="stages not to run: prepare, sft, grpo, eval (all three evaluations), "
        "eval-base, eval-sft, eval-grpo",
    )
    start_from: dict[str, str] = Field(
        default_factory=dict,
        description="use this instead of running the stage: prepare -> a prepared dataset "
        "directory, sft / grpo -> a checkpoint's model directory",
    )
    launcher: Literal["local", "kubernetes"] = Field(
        "local", description="where stages run: local subprocesses or Kubernetes Jobs/RayJobs"
    )
    work_dir: str = Field(
        "runs/pipeline",
        description="stage outputs and the finished-stage store (on Kubernetes: a path on the "
        "shared volume)",
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI; default: $MLFLOW_TRACKING_URI, else "
        "sqlite:///mlflow.db in the working directory",
    )
    mlflow_ui_url: str | None = Field(
        None,
        description="the MLflow UI's address for links (artifacts, summary); default: "
        "$LLMRL_MLFLOW_UI_URL, else the tracking URI when it is http(s), else "
        "http://127.0.0.1:5000 (`mlflow ui`)",
    )
    experiment: str = Field("llmrl", description="MLflow experiment of the parent and stage runs")
    retries: int = Field(2, ge=0, description="retries of a stage after a transient failure")
    retry_delay_s: float = Field(
        10.0, ge=0, description="first retry delay; doubles on each retry (exponential backoff)"
    )
    kubernetes: KubernetesSettings = Field(
        default_factory=KubernetesSettings, description="settings of the kubernetes launcher"
    )
    runtime_env: RayRuntimeEnv = Field(
        default_factory=RayRuntimeEnv,
        description="your own code (tasks, reward functions) for every stage process and Ray "
        "worker, as Ray's runtime_env: py_modules (package folders), working_dir, pip "
        "(kubernetes launcher only), env_vars; e.g. "
        '{"py_modules": ["/shared/code/my_pkg"]}',
    )

    @field_validator("overrides")
    @classmethod
    def _known_override_stages(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        normalized: dict[str, list[str]] = {}
        for stage, items in value.items():
            name = ALIASES.get(stage, stage)
            if name not in COMMANDS:
                raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(COMMANDS)}")
            bad = [item for item in items if "=" not in item]
            if bad:
                raise ValueError(f"{stage}: expected key=value overrides, got {bad}")
            normalized.setdefault(name, []).extend(items)
        return normalized

    @field_validator("skip")
    @classmethod
    def _known_skips(cls, value: list[str]) -> list[str]:
        names = [ALIASES.get(name, name) for name in value]
        known = tuple(dict.fromkeys((*COMMANDS, *RUN_ORDER)))
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"unknown stages {unknown}; expected some of {', '.join(known)}")
        return names

    @field_validator("start_from")
    @classmethod
    def _startable(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = [name for name in value if name not in STARTABLE]
        if unknown:
            raise ValueError(f"only {', '.join(STARTABLE)} can start from a path, got {unknown}")
        return value

    def config_path(self, stage: str) -> str:
        """The config file of a stage or its command (``eval-sft`` -> ``eval_config``)."""
        return getattr(self, f"{command_of(stage)}_config")

    def runs(self, name: str) -> bool:
        """Whether the pipeline runs stage ``name`` (one of :data:`~flows.stages.RUN_ORDER`)."""
        spec = SPECS[name]
        if name in self.start_from or name in self.skip or spec.command in self.skip:
            return False
        model = spec.model_from
        return not spec.evaluates or model is None or model in self.start_from or self.runs(model)

    def tracking_uri(self) -> str:
        """The MLflow URI the parent run and every stage use (SQLite paths made absolute)."""
        uri = self.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        uri = uri or "sqlite:///mlflow.db"
        prefix = "sqlite:///"
        if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
            uri = prefix + str(Path(uri.removeprefix(prefix)).resolve())
        return uri

    def setting(self, command: str, key: str) -> Any:
        """A dotted ``key`` of a command's config as the stage will see it: the config file's
        value, unless an override sets it (None when neither does or the file is unreadable)."""
        value = None
        for item in self.overrides.get(command, []):
            name, _, text = item.partition("=")
            if name.strip() == key:
                value = yaml.safe_load(text)
        if value is not None:
            return value
        try:
            config = yaml.safe_load(Path(self.config_path(command)).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            return None
        for part in key.split("."):
            config = config.get(part) if isinstance(config, dict) else None
        return config

    def tracking_params(self) -> dict[str, Any]:
        """The parameters the MLflow parent run records: all but the cluster settings, and
        of the runtime_env's ``env_vars`` (credentials, maybe) only the names."""
        params = self.model_dump(mode="json", exclude={"kubernetes"})
        params["runtime_env"]["env_vars"] = sorted(self.runtime_env.env_vars)
        return params

    def model_label(self) -> str:
        """The trained model in names and tags: the last part of the SFT config's model."""
        name = str(self.setting("sft", "model.name") or "model")
        return Path(name.rstrip("/")).name.removesuffix(".gguf") or "model"

    def task_label(self) -> str:
        """The task in names and tags: the prepare config's (or the given dataset's) task."""
        if "prepare" in self.start_from:  # a prepared folder is named <task>-<digest>
            return Path(self.start_from["prepare"]).name.rsplit("-", 1)[0] or "data"
        if self.setting("prepare", "reward") is not None:  # the user's reward functions
            return "reward-functions"
        task = str(self.setting("prepare", "task") or "task")
        return task.rsplit(":", 1)[-1].rsplit(".", 1)[-1]  # an import path: the class's name

    def run_tags(self) -> list[str]:
        """The tags of this pipeline's flow run and task runs."""
        model, task = self.model_label(), self.task_label()
        return [f"model:{model}", f"task:{task}", f"launcher:{self.launcher}"]
