"""Run a stage on Kubernetes: a KubeRay ``RayJob`` for the GPU stages (``sft``, ``grpo``), a
plain ``batch/v1`` ``Job`` for the one-pod stages (``prepare``, ``eval``).

For one stage run, :class:`KubernetesLauncher`:

1. creates a ConfigMap with the stage's config file, mounted at ``/etc/llmrl/<stage>.yaml``;
2. creates the Job or RayJob (built by :mod:`flows.launchers.manifests`) and makes it the
   ConfigMap's owner, so deleting it removes the ConfigMap too
   (:mod:`flows.launchers.k8s_objects`);
3. watches it until its status says it ended, failing at once on a pod that cannot work, and
   shows the driver pod's log in the task's logger (:mod:`flows.launchers.k8s_watch`);
4. decides success or failure from the Job's conditions or the RayJob's ``jobStatus`` /
   ``jobDeploymentStatus`` (:mod:`flows.launchers.k8s_status`), and reads a succeeded stage's
   result from its result file.

**Results through the shared volume.** The stage writes its result to
``<shared_mount_path>/stage-results/<run>.json`` (``$LLMRL_RESULT_FILE``, see
:mod:`flows.launchers.base`) on the shared claim, which every stage pod mounts, and so does the
flow-run pod this launcher runs in (the work pool's job template mounts ``shared_claim`` at the
same ``shared_mount_path``; the pipeline's ``work_dir`` is on it too). A container's
termination message (``terminationMessagePath``, read back from
``status.containerStatuses[].state.terminated.message``) cannot do this for a RayJob: its
entrypoint runs on a Ray node (the head, or the trainer pod for ``sft``) as a child of Ray's job
supervisor, not as any container's main process, and the one container whose end matches the
job's, KubeRay's submitter, runs ``ray job submit``, so its termination message is KubeRay's
(``FallbackToLogsOnError`` would only bring back the log's tail, and only on failure). One
mechanism serves both kinds; the log is never parsed. The launcher creates the folder before it
creates anything, so a process that does not see the shared volume fails at once.

The user's code (the pipeline's ``runtime_env``) goes into every RayJob's ``runtimeEnvYAML``
and every Job's pod (:mod:`flows.launchers.runtime_env`); what cannot reach a stage is refused
when the launcher is made, before anything is created.

When the task is cancelled it deletes what it created; after a failure too, unless
``delete_on_failure`` is off. After a success ``ttlSecondsAfterFinished`` cleans up. API errors
429/5xx and an unreachable API are :class:`TransientStageError` (the flow retries); while
watching, they are retried in place for ``api_retry_s`` first. ``kubernetes`` is imported only
when a launcher talks to a cluster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from flows.launchers.base import (
    StageConfigError,
    StageError,
    StageFailedError,
    StageResult,
    read_stage_result,
    result_file_env,
    stage_logger,
    tail_text,
)
from flows.launchers.k8s_objects import RAYJOBS, StageObjects
from flows.launchers.k8s_status import failure
from flows.launchers.k8s_watch import LogFollower, RunWatcher
from flows.launchers.manifests import (
    LABEL_FLOW_RUN,
    RAY_STAGES,
    build_job_manifest,
    build_rayjob_manifest,
    job_resources,
    requested_gpus,
    resource_name,
)
from flows.launchers.runtime_env import RayRuntimeEnv, cluster_runtime_env, job_code
from flows.launchers.settings import KubernetesSettings, effective_settings

if TYPE_CHECKING:
    from llmrl.topology import SchedulingSpec, Topology

# ------------------------------------------------------------------------ the launcher


class KubernetesLauncher:
    """Runs stages as Kubernetes Jobs and KubeRay RayJobs and waits for them.

    ``api_client`` is a ``kubernetes.client.ApiClient`` (default: in-cluster config, else
    ``~/.kube/config``); ``topology`` defaults to ``settings.topology``'s file, else
    ``Topology()``; ``runtime_env`` is the user's code and variables for every stage.

    Raises:
        StageConfigError: the settings file is not valid, or ``runtime_env`` cannot reach the
            stages (a relative path; a URI only Ray can fetch, for the Jobs); names the field.

    Example::

        launcher = KubernetesLauncher(KubernetesSettings(namespace="llmrl", image="llmrl:0.1"))
        result = launcher.run("sft", "configs/sft.yaml", ["steps=100"], env={...}, name="sft")
    """

    def __init__(
        self,
        settings: KubernetesSettings | None = None,
        *,
        api_client: Any = None,
        topology: Topology | None = None,
        flow_run_id: str | None = None,
        runtime_env: RayRuntimeEnv | None = None,
    ) -> None:
        try:
            self.settings = effective_settings(settings or KubernetesSettings())
        except ValueError as error:
            raise StageConfigError("kubernetes", str(error)) from None
        try:
            self.runtime_env = cluster_runtime_env(runtime_env or RayRuntimeEnv())
            job_code(self.runtime_env)  # the Jobs (prepare, eval) can take it
        except ValueError as error:
            raise StageConfigError("kubernetes", str(error)) from None
        self._api_client = api_client
        self._topology = topology
        self._flow_run_id = flow_run_id

    # -- public

    def run(
        self,
        stage: str,
        config_path: str | Path | None,
        overrides: Sequence[str],
        env: Mapping[str, str],
        *,
        name: str | None = None,
    ) -> StageResult:
        """Run the stage on the cluster; see :meth:`flows.launchers.base.Launcher.run`."""
        label = name or stage
        resource = resource_name(label)
        result_file = self.settings.results_dir / f"{resource}.json"
        env = {**env, **result_file_env(result_file)}
        try:
            manifest = self._manifest(stage, resource, overrides, env, bool(config_path))
        except ValueError as error:  # the runtime_env's env_vars clash with llmrl's
            raise StageConfigError(label, str(error)) from None
        self._check_gpus(label, manifest)
        self._make_results_dir(label)
        objects = StageObjects(
            api_client=self.api(), settings=self.settings, label=label, stage=stage,
            name=resource, kind="rayjob" if stage in RAY_STAGES else "job", logger=stage_logger(),
        )  # fmt: skip
        config_text = Path(config_path).read_text(encoding="utf-8") if config_path else None
        start = time.monotonic()
        try:
            summary, follower = self._launch_and_wait(objects, manifest, config_text, result_file)
        finally:
            result_file.unlink(missing_ok=True)
        seconds = time.monotonic() - start
        objects.logger.info("%s: finished in %.1f s", label, seconds)
        details = {"kind": manifest["kind"], "name": resource, "namespace": objects.namespace}
        return StageResult(summary, tail_text(follower.lines), seconds, details)

    def _launch_and_wait(
        self,
        objects: StageObjects,
        manifest: dict[str, Any],
        config_text: str | None,
        result_file: Path,
    ) -> tuple[dict[str, Any], LogFollower]:
        """Create the run's objects, wait until it succeeds, read its result: the result and
        the followed log. A failed run (or one without a usable result), a cancelled or an
        interrupted one is deleted (a failed one unless ``delete_on_failure`` is off) and its
        error raised."""
        logger, label = objects.logger, objects.label
        follower = LogFollower(objects)
        try:
            if config_text is not None:
                objects.create_config_map(config_text, self.flow_run_id)
            objects.create(manifest)
            logger.info("%s: created %s %s/%s", label, manifest["kind"], objects.namespace,
                        objects.name)  # fmt: skip
            outcome = RunWatcher(objects, follower=follower).wait()
            follower.join()
            if outcome.state != "succeeded":
                raise failure(label, objects.kind, outcome, follower.tail(list(outcome.pods)))
            summary = read_stage_result(label, result_file)
            if objects.kind == "rayjob":  # its Ray cluster is gone already (TTL 0): delete it
                objects.delete()
        except StageError:
            if self.settings.delete_on_failure:
                objects.delete()
            else:
                logger.warning("%s: kept %s/%s for inspection", label, objects.kind, objects.name)
            raise
        except BaseException:
            logger.warning("%s: cancelled; deleting %s %s", label, objects.kind, objects.name)
            objects.delete()
            raise
        return summary, follower

    def _manifest(
        self,
        stage: str,
        resource: str,
        overrides: Sequence[str],
        env: Mapping[str, str],
        has_config: bool,
    ) -> dict[str, Any]:
        """The RayJob (a Ray stage) or Job of one run; ``has_config``: a ConfigMap named
        ``resource`` holds the stage's config file."""
        config_map = resource if has_config else None
        if stage in RAY_STAGES:
            return build_rayjob_manifest(
                stage, resource, self.settings, self.topology, overrides=overrides, env=env,
                config_map=config_map, flow_run_id=self.flow_run_id, runtime_env=self.runtime_env,
            )  # fmt: skip
        return build_job_manifest(
            stage, resource, self.settings, overrides=overrides, env=env, config_map=config_map,
            scheduling=self._job_scheduling(stage),
            resources=job_resources(stage, self.settings, self.topology),
            flow_run_id=self.flow_run_id, runtime_env=self.runtime_env,
        )  # fmt: skip

    def _make_results_dir(self, label: str) -> None:
        """Create the folder on the shared claim where stages write their results (this
        process must see the volume to read them).

        Raises:
            StageConfigError: no shared claim, or its folder cannot be created here.
        """
        settings = self.settings
        if not settings.shared_claim:
            raise StageConfigError(
                label, "kubernetes.shared_claim is empty: stages hand their results back "
                "through a file on the shared claim",
            )  # fmt: skip
        folder = settings.results_dir
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StageConfigError(
                label, f"cannot create {folder}, where stages write their results ({error}): run "
                f"the flow where the claim {settings.shared_claim} is mounted at "
                f"{settings.shared_mount_path} (the work pool's flow-run pods are)",
            ) from None  # fmt: skip

    @property
    def flow_run_id(self) -> str | None:
        """The Prefect flow run this launcher works for (label ``llmrl.io/flow-run``): the one
        given, else the current flow run's, else None."""
        if self._flow_run_id is None:
            try:
                from prefect.runtime import flow_run
            except ImportError:  # pragma: no cover - prefect is in the same extra as flows
                return None
            self._flow_run_id = flow_run.id or None
        return self._flow_run_id

    def _check_gpus(self, label: str, manifest: dict[str, Any]) -> None:
        """Refuse a stage that would ask for more GPUs than the topology has: the cluster is
        sized for the topology, so its pods would stay Unschedulable."""
        gpus, budget = requested_gpus(manifest), self.topology.total_gpus
        if gpus > budget:
            raise StageConfigError(
                label,
                f"the {manifest['kind']} requests {gpus} GPU(s) but the topology has {budget}; "
                "lower kubernetes.jobs.<stage>.gpus (or leave it null to follow the topology), "
                "or give the topology more GPUs",
            )

    @property
    def topology(self) -> Topology:
        """The topology RayJobs are built from (see :func:`load_topology`)."""
        if self._topology is None:
            self._topology = load_topology(self.settings.topology)
        return self._topology

    def _job_scheduling(self, stage: str) -> SchedulingSpec | None:
        """GPU jobs go where the trainer goes, CPU jobs where the env workers go."""
        gpus = job_resources(stage, self.settings, self.topology).gpus
        topology = self.topology
        return topology.trainer.scheduling if gpus else topology.env_workers.scheduling

    def api(self) -> Any:
        """The ``kubernetes.client.ApiClient`` (loaded from the environment on first use)."""
        if self._api_client is None:
            try:
                from kubernetes import client, config
            except ImportError as error:  # pragma: no cover - depends on the environment
                raise StageFailedError(
                    "kubernetes", "the kubernetes launcher needs `pip install 'llmrl[k8s]'`"
                ) from error
            try:
                config.load_incluster_config()
            except config.ConfigException:
                try:
                    config.load_kube_config()
                except (config.ConfigException, OSError) as error:
                    raise StageFailedError(
                        "kubernetes",
                        f"no cluster to talk to: not in a pod, and no usable kubeconfig ({error})",
                    ) from None
            self._api_client = client.ApiClient()
        return self._api_client


def load_topology(path: str | None) -> Topology:
    """The :class:`~llmrl.topology.Topology` in ``path`` (a topology YAML, or a Helm values file
    with a ``topology`` section); without a path, ``$LLMRL_TOPOLOGY`` if that file exists (the
    work pool mounts the chart's topology ConfigMap there), else ``Topology()``.

    Raises:
        StageConfigError: the file is missing or is not a valid topology.
    """
    from pydantic import ValidationError

    from llmrl.config import ConfigError, load_config
    from llmrl.topology import Topology

    if not path:
        path = os.environ.get("LLMRL_TOPOLOGY")
        if not path or not Path(path).is_file():
            return Topology()
    if not Path(path).is_file():
        raise StageConfigError("topology", f"{path}: topology file does not exist")
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("topology"), dict):
            return Topology.model_validate(data["topology"])
        return load_config(Topology, path)
    except (ConfigError, ValidationError, yaml.YAMLError) as error:
        raise StageConfigError("topology", f"{path}: {error}") from None


def delete_flow_run_resources(
    settings: KubernetesSettings, flow_run_id: str, *, api_client: Any = None
) -> list[str]:
    """Delete every Job and RayJob a flow run launched (label ``llmrl.io/flow-run``); their pods
    and ConfigMaps go with them (garbage collection). The flow's cancellation and crash hooks
    call it; the owner reference to the flow-run pod covers a flow-run pod that was killed.

    Returns ``["<kind>/<name>", ...]`` of what was deleted. Errors are API errors, raised.
    """
    from kubernetes import client

    launcher = KubernetesLauncher(settings, api_client=api_client, flow_run_id=flow_run_id)
    api = launcher.api()
    namespace = launcher.settings.namespace
    selector = f"{LABEL_FLOW_RUN}={flow_run_id}"
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    deleted: list[str] = []
    rayjobs = custom.list_namespaced_custom_object(
        **RAYJOBS, namespace=namespace, label_selector=selector
    )
    for item in rayjobs.get("items") or []:
        name = item["metadata"]["name"]
        _ignore_missing(
            custom.delete_namespaced_custom_object,
            **RAYJOBS, namespace=namespace, name=name, propagation_policy="Background",
        )  # fmt: skip
        deleted.append(f"RayJob/{name}")
    for job in batch.list_namespaced_job(namespace, label_selector=selector).items:
        name = job.metadata.name
        _ignore_missing(
            batch.delete_namespaced_job, name, namespace, propagation_policy="Background"
        )
        deleted.append(f"Job/{name}")
    return deleted


def _ignore_missing(delete: Any, *args: Any, **kwargs: Any) -> None:
    """Call ``delete``; an object already gone (404) is what we wanted."""
    from kubernetes.client.exceptions import ApiException

    try:
        delete(*args, **kwargs)
    except ApiException as error:
        if error.status != 404:
            raise
