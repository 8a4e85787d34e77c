"""The llmrl pipeline as a Prefect flow: prepare -> SFT -> GRPO -> evaluation -> summary.

The flow is the storyboard; each stage is one task (a scene) that runs the stage's ``llmrl``
command through a launcher (:mod:`flows.launchers`: a local subprocess or a Kubernetes
Job/RayJob). Nothing here touches a tensor: stages hand each other paths (the prepared dataset,
checkpoints' model directories) and one-line JSON summaries.

Run order: ``prepare``, ``sft``, ``grpo``, then ``eval-base``, ``eval-sft``, ``eval-grpo`` (the
held-out accuracy of the base model, after SFT and after GRPO). ``skip`` leaves stages out (and
the evaluation of a model that was not trained); ``start_from`` uses a given dataset directory or
checkpoint instead of running a stage.

**Tracking.** The flow creates one MLflow parent run and passes ``MLFLOW_PARENT_RUN_ID`` and
``MLFLOW_TRACKING_URI`` to every stage, whose own runs nest under it (tag
``mlflow.parentRunId``). The parent gets the before/after accuracies and stage times.

**Finished stages are not run twice.** Each stage's result is stored as
``<work_dir>/stages/<stage>-<key>.json`` where ``key`` hashes the stage name, its config file's
text, its overrides and the results of the stages it reads from. A re-run with the same inputs
loads the file instead of running the stage ("skipping <stage>: finished in a previous run");
changing any input changes the key, and everything downstream follows. A stage that did not
finish has no file: it runs again, in the same ``output_dir`` (``<work_dir>/<stage>-<key>``), and
resumes from its own checkpoints and MLflow run, which moves under the new parent run (tag
``llmrl.previous_parent_run_id``). A flow process that is killed takes its local stage process
with it (:mod:`flows.launchers.local`), so the re-run never races the old one.

**Failures.** :class:`~flows.launchers.TransientStageError` (launcher API, tracking server) is
retried with exponential backoff; a bad config (:class:`~flows.launchers.StageConfigError`, exit
code 2) or a failed stage fails the flow at once with the stage's own message.

**Artifacts** on the flow run: a progress bar updated as stages start and end, a markdown
summary (stage times, metrics, MLflow links) and a table of the evaluation results.

Example::

    from flows.pipeline import PipelineParams, pipeline

    summary = pipeline(PipelineParams(overrides={"sft": ["steps=5"]}))
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff
from pydantic import BaseModel, ConfigDict, Field, field_validator

from flows.launchers import (
    KubernetesLauncher,
    KubernetesSettings,
    Launcher,
    LocalLauncher,
    StageFailedError,
    TransientStageError,
)
from flows.summary import RUN_ORDER, build_summary, render_markdown

STAGES: tuple[str, ...] = ("prepare", "sft", "grpo", "eval")
"""The pipeline's stages, named like their ``llmrl`` commands (``evaluate`` is accepted too)."""
_ALIASES = {"evaluate": "eval"}


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
    experiment: str = Field("llmrl", description="MLflow experiment of the parent and stage runs")
    retries: int = Field(2, ge=0, description="retries of a stage after a transient failure")
    retry_delay_s: float = Field(
        10.0, ge=0, description="first retry delay; doubles on each retry (exponential backoff)"
    )
    kubernetes: KubernetesSettings = Field(
        default_factory=KubernetesSettings, description="settings of the kubernetes launcher"
    )

    @field_validator("overrides")
    @classmethod
    def _known_override_stages(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        normalized: dict[str, list[str]] = {}
        for stage, items in value.items():
            name = _ALIASES.get(stage, stage)
            if name not in STAGES:
                raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
            bad = [item for item in items if "=" not in item]
            if bad:
                raise ValueError(f"{stage}: expected key=value overrides, got {bad}")
            normalized.setdefault(name, []).extend(items)
        return normalized

    @field_validator("skip")
    @classmethod
    def _known_skips(cls, value: list[str]) -> list[str]:
        names = [_ALIASES.get(name, name) for name in value]
        unknown = [name for name in names if name not in (*STAGES, *RUN_ORDER)]
        if unknown:
            raise ValueError(
                f"unknown stages {unknown}; expected some of {', '.join((*STAGES, *RUN_ORDER))}"
            )
        return names

    @field_validator("start_from")
    @classmethod
    def _startable(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = [name for name in value if name not in ("prepare", "sft", "grpo")]
        if unknown:
            raise ValueError(f"only prepare, sft and grpo can start from a path, got {unknown}")
        return value

    def config_path(self, stage: str) -> str:
        """The config file of a stage command."""
        return {
            "prepare": self.prepare_config,
            "sft": self.sft_config,
            "grpo": self.grpo_config,
            "eval": self.eval_config,
        }[stage]

    def runs(self, name: str) -> bool:
        """Whether the pipeline runs stage ``name`` (one of :data:`RUN_ORDER`)."""
        if name in self.start_from:
            return False
        if name.startswith("eval-"):
            model = name.removeprefix("eval-")
            trained = model == "base" or model in self.start_from or model not in self.skip
            return "eval" not in self.skip and name not in self.skip and trained
        return name not in self.skip

    def tracking_uri(self) -> str:
        """The MLflow URI the parent run and every stage use (SQLite paths made absolute)."""
        uri = self.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        uri = uri or "sqlite:///mlflow.db"
        prefix = "sqlite:///"
        if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
            uri = prefix + str(Path(uri.removeprefix(prefix)).resolve())
        return uri


# ------------------------------------------------------------------------ stage calls and store


@dataclass(frozen=True)
class StageCall:
    """Everything a stage task needs: the command, its inputs, and where its result is stored."""

    name: str
    stage: str
    config_path: str | None
    overrides: tuple[str, ...]
    key: str
    store_dir: str


def stage_key(
    name: str, config_text: str, overrides: list[str], upstream: Mapping[str, Any]
) -> str:
    """The hash that identifies a stage's inputs: name, config text, overrides, upstream results."""
    identity = {"stage": name, "config": config_text, "overrides": overrides, "upstream": upstream}
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def plan_stage(params: PipelineParams, name: str, done: Mapping[str, dict]) -> StageCall:
    """The call of stage ``name`` given the results of the stages before it (``done``).

    Upstream results become overrides (``data.path``, ``model.checkpoint``); then come the
    stage's own output directory and MLflow run name, then the user's overrides (which win).
    """
    stage = "eval" if name.startswith("eval-") else name
    work_dir = Path(params.work_dir).resolve()
    upstream_names = {"prepare": [], "sft": ["prepare"], "grpo": ["prepare", "sft"]}.get(
        name, ["prepare", name.removeprefix("eval-")]
    )
    upstream = {n: done[n]["summary"] for n in upstream_names if n in done}
    derived: list[str] = []
    if "prepare" in upstream and stage != "prepare":
        derived.append(f"data.path={upstream['prepare']['path']}")
    source = {"grpo": "sft", "eval-sft": "sft", "eval-grpo": "grpo"}.get(name)
    if source in upstream:
        derived.append(f"model.checkpoint={upstream[source]['final_checkpoint']}")
    if stage == "eval":
        derived.append(f"label={name.removeprefix('eval-')}")
    user = list(params.overrides.get(stage, []))
    config_path = params.config_path(stage)
    config_file = Path(config_path)
    config_text = config_file.read_text(encoding="utf-8") if config_file.is_file() else ""
    key = stage_key(name, config_text, [*derived, *user], upstream)
    if stage == "prepare":
        placement = [f"output_dir={work_dir / 'data'}"]
    else:
        placement = [
            f"output_dir={work_dir / f'{name}-{key}'}",
            f"tracking.experiment={params.experiment}",
            f"tracking.run_name={name}",
        ]
    return StageCall(
        name=name,
        stage=stage,
        config_path=config_path,
        overrides=(*derived, *placement, *user),
        key=key,
        store_dir=str(work_dir / "stages"),
    )


class StageStore:
    """Results of finished stages: ``<store_dir>/<stage>-<key>.json``, written atomically."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, name: str, key: str) -> Path:
        return self.root / f"{name}-{key}.json"

    def load(self, name: str, key: str) -> dict[str, Any] | None:
        """The stored record, or None when the stage has not finished with these inputs."""
        path = self.path(name, key)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def save(self, name: str, key: str, record: dict[str, Any]) -> Path:
        path = self.path(name, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
        os.replace(temporary, path)
        return path


# ------------------------------------------------------------------------ tracking


@dataclass(frozen=True)
class Tracking:
    """The pipeline's MLflow parent run."""

    uri: str
    experiment: str
    experiment_id: str
    parent_run_id: str

    def link(self, run_id: str | None) -> str | None:
        """The MLflow UI address of a run (``mlflow ui``'s default address for local stores)."""
        if not run_id:
            return None
        base = self.uri if self.uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def stage_env(self, work_dir: str) -> dict[str, str]:
        """What every stage needs to nest its run under the parent."""
        return {
            "MLFLOW_TRACKING_URI": self.uri,
            "MLFLOW_PARENT_RUN_ID": self.parent_run_id,
            "MLFLOW_EXPERIMENT_NAME": self.experiment,
            "LLMRL_MLFLOW_SPOOL": str(Path(work_dir).resolve() / "mlflow-spool"),
        }


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only :class:`TransientStageError`."""
    error = getattr(state, "data", None)
    return isinstance(error, TransientStageError)


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store
    (``<db folder>/mlruns/<experiment>``), not in the working directory as MLflow would; None
    (the server's default) for other stores."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    return str(Path(uri.removeprefix(prefix)).resolve().parent / "mlruns" / experiment)


def _mlflow_client(uri: str) -> Any:
    if uri.startswith(("http://", "https://")):  # fail within seconds, the task retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


@task(name="open-tracking", cache_policy=NO_CACHE, retry_condition_fn=retry_transient)
def open_tracking(params: PipelineParams) -> Tracking:
    """Create the MLflow parent run of this pipeline run (and the experiment if needed)."""
    from mlflow.entities import Param

    uri = params.tracking_uri()
    run_name = f"pipeline-{flow_run.get_name() or 'local'}"
    try:
        client = _mlflow_client(uri)
        experiment = client.get_experiment_by_name(params.experiment)
        if experiment is None:
            location = artifact_location(uri, params.experiment)
            experiment_id = client.create_experiment(params.experiment, location)
        else:
            experiment_id = experiment.experiment_id
        tags = {
            "llmrl.stage": "pipeline",
            "prefect.flow_run_id": str(flow_run.get_id() or ""),
            "prefect.flow_run_name": str(flow_run.get_name() or ""),
            "llmrl.work_dir": str(Path(params.work_dir).resolve()),
        }
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
        flat = _flatten(params.model_dump(mode="json", exclude={"kubernetes"}))
        client.log_batch(run.info.run_id, params=[Param(k, v[:6000]) for k, v in flat.items()])
    except Exception as error:
        raise TransientStageError("tracking", f"MLflow at {uri} failed: {error}") from error
    get_run_logger().info("MLflow parent run %s in experiment %r", run.info.run_id, experiment_id)
    return Tracking(uri, params.experiment, experiment_id, run.info.run_id)


@task(name="close-tracking", cache_policy=NO_CACHE)
def close_tracking(
    tracking: Tracking, status: str, metrics: Mapping[str, float] | None = None
) -> None:
    """Log the pipeline's metrics on the parent run and end it with ``status``."""
    from mlflow.entities import Metric

    client = _mlflow_client(tracking.uri)
    now = int(datetime.now(timezone.utc).timestamp() * 1000)
    if metrics:
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
        client.log_batch(tracking.parent_run_id, metrics=batch)
    client.set_terminated(tracking.parent_run_id, status)


def find_stage_run(tracking: Tracking, name: str) -> str | None:
    """The id of the MLflow run stage ``name`` nested under the parent run, if there is one."""
    try:
        client = _mlflow_client(tracking.uri)
        runs = client.search_runs(
            [tracking.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{tracking.parent_run_id}'",
            order_by=["attributes.start_time DESC"],
        )
    except Exception:  # a missing link must not fail a finished stage
        return None
    return next((run.info.run_id for run in runs if run.info.run_name == name), None)


# ------------------------------------------------------------------------ tasks


@task(
    name="stage",
    task_run_name="{call.name}",
    cache_policy=NO_CACHE,
    retry_condition_fn=retry_transient,
)
def run_stage(
    call: StageCall, launcher: Launcher, env: Mapping[str, str], tracking: Tracking | None
) -> dict[str, Any]:
    """Run one stage, unless the store holds its result for the same inputs."""
    logger = get_run_logger()
    store = StageStore(call.store_dir)
    record = store.load(call.name, call.key)
    if record is not None:
        logger.info(
            "skipping %s: finished in a previous run (%s)",
            call.name,
            store.path(call.name, call.key),
        )
        return {**record, "status": "skipped"}
    result = launcher.run(call.stage, call.config_path, call.overrides, env, name=call.name)
    run_id = find_stage_run(tracking, call.name) if tracking and call.stage != "prepare" else None
    record = {
        "name": call.name,
        "stage": call.stage,
        "key": call.key,
        "summary": result.summary,
        "seconds": result.seconds,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "config_path": call.config_path,
        "overrides": list(call.overrides),
        "mlflow_run_id": run_id,
    }
    store.save(call.name, call.key, record)
    return {**record, "status": "ran"}


@task(name="summary", cache_policy=NO_CACHE)
def summarize(
    params: PipelineParams, tracking: Tracking, records: Mapping[str, dict]
) -> dict[str, Any]:
    """Publish the markdown summary and the evaluation table; return the pipeline's summary."""
    summary = build_summary(params, tracking, records, flow_run.get_name() or "local")
    create_markdown_artifact(
        render_markdown(summary),
        key="llmrl-pipeline-summary",
        description="stage times, metrics before/after, MLflow runs",
    )
    create_table_artifact(
        summary["evaluation"] or [{"model": "-", "accuracy": None}],
        key="llmrl-evaluation",
        description="held-out accuracy of the base model, after SFT and after GRPO",
    )
    return summary


class _Progress:
    """The flow run's progress artifact: done stages out of planned ones."""

    def __init__(self, planned: list[str]) -> None:
        self.total = max(len(planned), 1)
        self.done = 0
        self.id = create_progress_artifact(
            0.0, key="llmrl-pipeline-progress", description=f"0/{self.total}: starting"
        )

    def update(self, what: str, finished: bool = False) -> None:
        self.done += int(finished)
        text = f"{self.done}/{self.total}: {what}"
        update_progress_artifact(self.id, 100.0 * self.done / self.total, description=text)


def make_launcher(params: PipelineParams) -> Launcher:
    """The launcher ``params.launcher`` names."""
    if params.launcher == "kubernetes":
        return KubernetesLauncher(params.kubernetes)
    return LocalLauncher()


# ------------------------------------------------------------------------ the flow


@flow(name="llmrl-pipeline", log_prints=True)
def pipeline(params: PipelineParams = PipelineParams()) -> dict[str, Any]:  # noqa: B008
    """prepare -> sft -> grpo -> evaluate (base, after SFT, after GRPO) -> summary."""
    logger = get_run_logger()
    launcher = make_launcher(params)
    tracking = open_tracking.with_options(
        retries=params.retries, retry_delay_seconds=exponential_backoff(params.retry_delay_s)
    )(params)
    env = tracking.stage_env(params.work_dir)
    stage = run_stage.with_options(
        retries=params.retries,
        retry_delay_seconds=exponential_backoff(params.retry_delay_s),
        retry_jitter_factor=0.2,
    )
    planned = [name for name in RUN_ORDER if params.runs(name)]
    progress = _Progress(planned)
    records: dict[str, dict] = {}
    current = "start"
    try:
        for name, path in params.start_from.items():
            records[name] = given_result(name, path)
            logger.info("%s: using %s instead of running it", name, path)
        for name in planned:
            current = name
            progress.update(f"running {name}")
            records[name] = stage(plan_stage(params, name, records), launcher, env, tracking)
            progress.update(f"{name} {records[name]['status']}", finished=True)
        summary = summarize(params, tracking, records)
    except BaseException as error:
        _record_failure(progress, tracking, current, error)
        raise
    close_tracking(tracking, "FINISHED", summary["metrics"])
    return summary


def _record_failure(
    progress: _Progress, tracking: Tracking, stage: str, error: BaseException
) -> None:
    """Mark the progress artifact and the MLflow parent run failed (best effort: the stage's
    own error is what the flow must report)."""
    status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
    try:
        progress.update(f"failed at {stage}: {type(error).__name__}")
        close_tracking(tracking, status)
    except Exception as problem:
        get_run_logger().warning("could not record the failure of %s: %s", stage, problem)


def given_result(name: str, path: str) -> dict[str, Any]:
    """The record of a stage replaced by ``start_from``: a dataset directory or a checkpoint."""
    if not Path(path).exists():
        raise StageFailedError(name, f"start_from path {path} does not exist")
    summary = {"path": path} if name == "prepare" else {"final_checkpoint": path}
    return {"name": name, "summary": summary, "seconds": 0.0, "status": "given"}


# ------------------------------------------------------------------------ summary (formatting)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if not isinstance(value, str) else value
    return flat
