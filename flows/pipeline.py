"""The llmrl pipeline as a Prefect flow: prepare -> SFT -> GRPO -> evaluation -> summary.

The flow is the storyboard; each stage is one task (a scene) that runs the stage's ``llmrl``
command through a launcher (:mod:`flows.launchers`: a local subprocess or a Kubernetes
Job/RayJob). Nothing here touches a tensor: stages hand each other paths (the prepared dataset,
checkpoints' model directories) and one-line JSON summaries.

The stages and what they read from each other are the table of :mod:`flows.stages`. Run order:
``prepare``, ``sft``, ``grpo``, then ``eval-base``, ``eval-sft``, ``eval-grpo`` (the held-out
accuracy of the base model, after SFT and after GRPO). ``skip`` leaves stages out (and the
evaluation of a model that was not trained); ``start_from`` uses a given dataset directory or
checkpoint instead of running a stage.

**Tracking** goes through :mod:`llmrl.tracking` (the one MLflow adapter): the flow opens one
MLflow parent run (:class:`~llmrl.tracking.PipelineRun`) and passes ``MLFLOW_PARENT_RUN_ID`` and
``MLFLOW_TRACKING_URI`` to every stage, whose own runs nest under it (tag
``mlflow.parentRunId``). The parent gets the before/after accuracies (``accuracy_<model>``), the
gains between models with their paired 95% intervals and McNemar p-values
(``gain/<after>_over_<before>`` and its ``_ci_low``, ``_ci_high``, ``_p_mcnemar``; see
:mod:`flows.summary`), the stage times, the summary as artifacts (``pipeline_summary.md``,
``evaluation.json`` with the accuracy per problem kind), the tags
``prefect.flow_run_id`` / ``prefect.flow_run_url`` (this flow run in the Prefect UI) and
``llmrl.run.<stage>`` (the run of each stage's result); the flow run gets a link artifact to the
parent run in the MLflow UI (``mlflow_ui_url``).

**Names and tags.** A flow run is named ``<model>-<task>-<YYYYmmdd-HHMM>`` (the SFT config's
model, the prepare config's task, overrides included) and tagged ``model:<model>``,
``task:<task>``, ``launcher:<launcher>``; its task runs carry the same tags.

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
code 2) or a failed stage fails the flow at once with the stage's own message. A cancelled or
crashed flow run on the ``kubernetes`` launcher deletes the Jobs and RayJobs it launched.

**Artifacts** on the flow run: a progress bar updated as stages start and end, a markdown
summary (held-out accuracy with each gain's paired 95% interval and McNemar p, accuracy per
problem kind, stage times, MLflow links) and the held-out table.

Example::

    from flows.pipeline import PipelineParams, pipeline

    summary = pipeline(PipelineParams(overrides={"sft": ["steps=5"]}))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, tags, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff

from flows.launchers import (
    KubernetesLauncher,
    Launcher,
    LocalLauncher,
    StageFailedError,
    TransientStageError,
)
from flows.params import PipelineParams
from flows.stages import RUN_ORDER, SPECS
from flows.summary import build_summary, evaluation_records, render_markdown
from llmrl.core.atomic_files import write_text_atomic
from llmrl.tracking import PipelineRun
from llmrl.tracking.pipeline_run import stage_run_tag

LOCAL_PREFECT_UI = "http://127.0.0.1:4200"
"""Where ``prefect server start`` serves the UI of a local (ephemeral API) flow run."""


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

    Upstream results (the stage's ``reads``) become overrides (``data.path``,
    ``model.checkpoint``); then come the stage's own output directory and MLflow run name, then
    the user's overrides (which win).
    """
    spec = SPECS[name]
    work_dir = Path(params.work_dir).resolve()
    upstream = {n: done[n]["summary"] for n in spec.reads if n in done}
    derived: list[str] = []
    for source in spec.reads:
        if source not in upstream:
            continue
        if SPECS[source].produces == "dataset":
            derived.append(f"data.path={upstream[source]['path']}")
        elif source == spec.model_from:
            derived.append(f"model.checkpoint={upstream[source]['final_checkpoint']}")
    if spec.evaluates:
        derived.append(f"label={spec.evaluates}")
    user = list(params.overrides.get(spec.command, []))
    config_path = params.config_path(name)
    config_file = Path(config_path)
    config_text = config_file.read_text(encoding="utf-8") if config_file.is_file() else ""
    key = stage_key(name, config_text, [*derived, *user], upstream)
    if spec.produces == "dataset":  # content-addressed folders: one place for every run
        placement = [f"output_dir={work_dir / 'data'}"]
    else:
        placement = [
            f"output_dir={work_dir / f'{name}-{key}'}",
            f"tracking.experiment={params.experiment}",
            f"tracking.run_name={name}",
        ]
    return StageCall(
        name=name,
        stage=spec.command,
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
        return write_text_atomic(self.path(name, key), json.dumps(record, indent=2, default=str))


# ------------------------------------------------------------------------ tracking


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only :class:`TransientStageError`."""
    error = getattr(state, "data", None)
    return isinstance(error, TransientStageError)


def flow_run_url(flow_run_id: str | None) -> str | None:
    """This flow run in the Prefect UI (``$PREFECT_UI_URL``, else a local ``prefect server``)."""
    if not flow_run_id:
        return None
    from prefect.utilities.urls import url_for

    return url_for("flow-run", obj_id=flow_run_id, default_base_url=LOCAL_PREFECT_UI)


@task(name="open-tracking", cache_policy=NO_CACHE, retry_condition_fn=retry_transient)
def open_tracking(params: PipelineParams) -> PipelineRun:
    """Create the MLflow parent run of this pipeline run (and the experiment if needed), tagged
    with this flow run, and link it from the flow run (a link artifact)."""
    uri = params.tracking_uri()
    run_id = str(flow_run.get_id() or "")
    prefect_tags = {
        "prefect.flow_run_id": run_id,
        "prefect.flow_run_name": str(flow_run.get_name() or ""),
        "prefect.flow_run_url": flow_run_url(run_id) or "",
        "llmrl.work_dir": str(Path(params.work_dir).resolve()),
    }
    try:
        parent = PipelineRun.open(
            uri,
            params.experiment,
            run_name=f"pipeline-{flow_run.get_name() or 'local'}",
            tags={k: v for k, v in prefect_tags.items() if v},
            params=params.tracking_params(),
            ui_url=params.mlflow_ui_url,
        )
    except Exception as error:
        raise TransientStageError("tracking", f"MLflow at {uri} failed: {error}") from error
    get_run_logger().info("MLflow parent run %s: %s", parent.run_id, parent.link(parent.run_id))
    create_link_artifact(
        parent.link(parent.run_id) or "",
        link_text=f"MLflow run {parent.run_id} (experiment {params.experiment})",
        key="llmrl-mlflow-run",
        description="the pipeline's MLflow parent run; its stages are nested under it",
    )
    return parent


@task(name="close-tracking", cache_policy=NO_CACHE)
def close_tracking(
    parent: PipelineRun, status: str, metrics: Mapping[str, float] | None = None
) -> None:
    """Log the pipeline's metrics on the parent run and end it with ``status``."""
    parent.close(status, metrics)


def note_stage_run(parent: PipelineRun | None, name: str, record: dict[str, Any]) -> str | None:
    """The MLflow run of a stage's result: the one the record names (a finished stage), else
    the run nested under the parent with the stage's name; the parent is tagged with it
    (``llmrl.run.<stage>``). Best effort: a missing link must not fail a finished stage."""
    if parent is None:
        return None
    try:
        run_id = record.get("mlflow_run_id") or parent.find_child(name)
        if run_id:
            parent.set_tags({stage_run_tag(name): run_id})
        return run_id
    except Exception as error:
        get_run_logger().warning("%s: no MLflow run found (%s)", name, error)
        return None


# ------------------------------------------------------------------------ tasks


@task(
    name="stage",
    task_run_name="{call.name}",
    cache_policy=NO_CACHE,
    retry_condition_fn=retry_transient,
)
def run_stage(
    call: StageCall, launcher: Launcher, env: Mapping[str, str], tracking: PipelineRun | None
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
        note_stage_run(tracking, call.name, record)
        return {**record, "status": "skipped"}
    result = launcher.run(call.stage, call.config_path, call.overrides, env, name=call.name)
    record = {
        "name": call.name,
        "stage": call.stage,
        "key": call.key,
        "summary": result.summary,
        "seconds": result.seconds,
        "finished_at": datetime.now(timezone.utc).isoformat(),
        "config_path": call.config_path,
        "overrides": list(call.overrides),
    }
    record["mlflow_run_id"] = note_stage_run(tracking, call.name, record)
    store.save(call.name, call.key, record)
    return {**record, "status": "ran"}


SUMMARY_ARTIFACT = "pipeline_summary.md"
"""The parent run's copy of the markdown summary."""
EVALUATION_ARTIFACT = "evaluation.json"
"""The parent run's evaluation data: per model its accuracy and accuracy per problem kind, and
the gains between models with their intervals and McNemar p-values."""


@task(name="summary", cache_policy=NO_CACHE)
def summarize(
    params: PipelineParams, tracking: PipelineRun, records: Mapping[str, dict]
) -> dict[str, Any]:
    """Publish the markdown summary and the evaluation table (on the flow run and the MLflow
    parent run); return the pipeline's summary."""
    summary = build_summary(params, tracking, records, flow_run.get_name() or "local")
    markdown = render_markdown(summary)
    create_markdown_artifact(
        markdown,
        key="llmrl-pipeline-summary",
        description="held-out accuracy with paired 95% intervals of the gains, per-kind "
        "accuracy, stage times, MLflow runs",
    )
    create_table_artifact(
        evaluation_records(summary) or [{"model": "-", "accuracy": None}],
        key="llmrl-evaluation",
        description="held-out accuracy of the base model, after SFT and after GRPO: gains with "
        "paired 95% intervals and McNemar p, correct/total per problem kind",
    )
    log_summary_artifacts(tracking, summary, markdown)
    return summary


def log_summary_artifacts(tracking: PipelineRun, summary: Mapping[str, Any], markdown: str) -> None:
    """Store the summary on the MLflow parent run: :data:`SUMMARY_ARTIFACT` (the markdown) and
    :data:`EVALUATION_ARTIFACT`. Best effort: the metrics still go with the run's closing."""
    evaluation = {key: summary[key] for key in ("evaluation", "gains", "kinds")}
    try:
        tracking.log_text(markdown, SUMMARY_ARTIFACT)
        tracking.log_dict(evaluation, EVALUATION_ARTIFACT)
    except Exception as error:
        get_run_logger().warning("could not store the summary on the MLflow run: %s", error)


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
        return KubernetesLauncher(params.kubernetes, runtime_env=params.runtime_env)
    return LocalLauncher(runtime_env=params.runtime_env)


# ------------------------------------------------------------ flow run: name, tags, hooks


def flow_run_params() -> PipelineParams:
    """This flow run's :class:`PipelineParams` (its defaults when none were passed)."""
    given = flow_run.get_parameters().get("params")
    return PipelineParams.model_validate(given) if given is not None else PipelineParams()


def name_flow_run() -> str:
    """The flow run's name: ``<model>-<task>-<YYYYmmdd-HHMM>``."""
    params = flow_run_params()
    return f"{params.model_label()}-{params.task_label()}-{datetime.now():%Y%m%d-%H%M}"


def tag_flow_run(params: PipelineParams) -> list[str]:
    """Add the run's tags (:meth:`PipelineParams.run_tags`) to this flow run; return them."""
    from prefect import get_client

    run_tags = params.run_tags()
    run_id = flow_run.get_id()
    if run_id:
        existing = list(flow_run.get_tags() or [])
        with get_client(sync_client=True) as client:
            client.update_flow_run(run_id, tags=list(dict.fromkeys([*existing, *run_tags])))
    return run_tags


def delete_cluster_resources(flow: Any, run: Any, state: Any) -> None:
    """``on_cancellation`` / ``on_crashed`` hook: on the ``kubernetes`` launcher, delete the
    Jobs and RayJobs this flow run launched (they would hold their GPUs otherwise)."""
    params = PipelineParams.model_validate((run.parameters or {}).get("params") or {})
    if params.launcher != "kubernetes":
        return
    from prefect.logging.loggers import flow_run_logger

    from flows.launchers.kubernetes import delete_flow_run_resources

    deleted = delete_flow_run_resources(params.kubernetes, str(run.id))
    flow_run_logger(run, flow).warning(
        "flow run %s: %s; deleted %s", run.id, state.name, ", ".join(deleted) or "nothing"
    )


# ------------------------------------------------------------------------ the flow


@flow(
    name="llmrl-pipeline",
    flow_run_name=name_flow_run,
    log_prints=True,
    on_cancellation=[delete_cluster_resources],
    on_crashed=[delete_cluster_resources],
)
def pipeline(params: PipelineParams = PipelineParams()) -> dict[str, Any]:  # noqa: B008
    """prepare -> sft -> grpo -> evaluate (base, after SFT, after GRPO) -> summary."""
    logger = get_run_logger()
    with tags(*tag_flow_run(params)):
        launcher = make_launcher(params)
        tracking = open_tracking.with_options(
            retries=params.retries, retry_delay_seconds=exponential_backoff(params.retry_delay_s)
        )(params)
        env = tracking.stage_env(Path(params.work_dir) / "mlflow-spool")
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
    progress: _Progress, tracking: PipelineRun, stage: str, error: BaseException
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
    produces = SPECS[name].produces
    summary = {"path": path} if produces == "dataset" else {"final_checkpoint": path}
    return {"name": name, "summary": summary, "seconds": 0.0, "status": "given"}
