"""llmrl's images, built by ``make images``, run as the chart and the launcher run them
(``make test-images``; ``.ci/run`` runs it after ``make test-all``).

Each container comes from a rendered manifest: the chart's MLflow Deployment, the Prefect work
pool's flow-run Job template, and the Job and RayJobs the kubernetes launcher builds from the
chart's ConfigMap. It runs in its image with that manifest's user, read-only root where set,
volume mounts, environment and command (:mod:`tests.support.image_pods`). The test stands in for
the cluster: Secrets, the shared volume (a folder owned by the pods' fsGroup), Service names
(the MLflow server's address), and Ray: a RayJob's entrypoint runs in its head container and
starts its own Ray there (KubeRay's ``ray start`` on head and worker pods is not emulated).

- mlflow: the server on SQLite answers the chart's readiness path, serves a client, runs as the
  chart's user, and writes nothing outside its mounts (read-only root);
- cpu: ``llmrl prepare`` (a Job), then the SFT and GRPO RayJobs' entrypoints on a CPU topology
  (cpu-dev example values, a tiny random model on the shared volume), logging to the mlflow
  image's server;
- flow: ``prefect deploy`` of prefect.yaml from the image (the operator's deploy command) into
  a Prefect server, then the flow-run pod's ``prefect flow-run execute`` of a pipeline run
  whose stages are all skipped, then ``python -m flows`` likewise (the flow image has no
  torch: its stages run in the stage images, as Jobs and RayJobs), each completing against the
  mlflow image's server.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.launchers.manifests import build_job_manifest, build_rayjob_manifest
from tests.images.image_checks import image
from tests.support.chart import NAMESPACE, objects, of_kind, stage_inputs
from tests.support.chart_services import deployment
from tests.support.image_pods import ImageRoot, PodContainer, pod_argv, run_in_image
from tests.support.k8s_manifests import JOB_TEMPLATE, fill
from tests.support.paths import REPO
from tests.support.prefect_server import PrefectCli, client_env, sqlite_server
from tests.support.service_process import ServiceProcess, free_port

pytestmark = [pytest.mark.images, pytest.mark.integration]

UID = 10001
STAGE_TIMEOUT_S = 600
"""A stage on the tiny model takes well under a minute of CPU; Ray's start and torch's import in
a fresh image take tens of seconds on a loaded 2-core machine."""


def fs_group_folder(path: Path) -> Path:
    """``path`` created as the kubelet leaves a volume with ``fsGroup``: group 10001, setgid."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 0, UID)
    path.chmod(0o2775)
    return path


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    return objects(chart.render(values, name="llmrl", namespace=NAMESPACE))


def pod_of(item: dict[str, Any]) -> dict[str, Any]:
    return item["spec"]["template"]["spec"]


def process_uids(server: ServiceProcess) -> set[int]:
    """Real uids of the server's processes (the unshare wrapper, root, left out)."""
    import psutil

    children = psutil.Process(server.proc.pid).children(recursive=True)
    return {p.uids().real for p in children if p.name() not in ("unshare", "sh")}


# ------------------------------------------------------------------------------ mlflow


@pytest.fixture(scope="module")
def mlflow_server(chart, tmp_path_factory) -> Iterator[tuple[ServiceProcess, Path]]:
    """The chart's MLflow Deployment in the mlflow image, on SQLite in its /tmp emptyDir and
    artifacts under /tmp (no S3 here)."""
    port = free_port()
    values = {
        "mlflow": {
            "port": port,
            "artifacts": {
                "destination": "/tmp/artifacts",
                "credentialsSecret": "",
                "s3EndpointUrl": "",
            },
        }
    }
    item = deployment(render(chart, values), "llmrl-mlflow")
    pod = pod_of(item)
    scratch = tmp_path_factory.mktemp("mlflow-pod")
    tmp = fs_group_folder(scratch / "tmp")
    spec = PodContainer(
        pod["containers"][0],
        pod,
        volumes={"tmp": tmp},
        secrets={"llmrl-mlflow-db": {"uri": "sqlite:////tmp/mlflow.db"}},
    )
    probe = spec.container["readinessProbe"]["httpGet"]
    with ImageRoot(image("mlflow")) as root:
        server = ServiceProcess(
            pod_argv(spec, root, scratch),
            {"PATH": os.environ["PATH"]},
            port=port,
            health_url=f"http://127.0.0.1:{port}{probe['path']}",
            log_path=scratch / "mlflow.log",
            cwd=scratch,
            name="mlflow (image)",
        )
        server.start(timeout=180)
        try:
            yield server, tmp
        finally:
            server.stop()


def test_mlflow_image_serves_the_chart_deployment_on_sqlite(mlflow_server) -> None:
    server, tmp = mlflow_server
    with urllib.request.urlopen(server.health_url, timeout=10) as response:
        assert response.status == 200
    assert process_uids(server) == {UID}, "the server must run as the chart's runAsUser"

    import mlflow

    client = mlflow.MlflowClient(f"http://127.0.0.1:{server.port}")
    experiment = client.create_experiment("image-check")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "loss", 0.25, step=3)
    [metric] = client.get_metric_history(run.info.run_id, "loss")
    assert (metric.value, metric.step) == (0.25, 3)
    # The store lands on the chart's emptyDir, owned by the pod's user (nothing else writable).
    assert (tmp / "mlflow.db").stat().st_uid == UID


# ------------------------------------------------------------------------------- cpu


@pytest.fixture(scope="module")
def cpu_release(chart) -> tuple[Any, Any]:
    """The launcher's settings and topology from the chart's cpu-dev example, on the cpu image."""
    values = yaml.safe_load((REPO / "helm" / "llmrl" / "examples" / "cpu-dev.yaml").read_text())
    repository, _, tag = image("cpu").rpartition(":")
    values["image"] = {"repository": repository, "tag": tag, "pullPolicy": "Never"}
    # In the cluster each role has its own pod's cores; here every role shares one Ray in one
    # container on a 2-core machine: the example's 3 cores of roles fit in 2 with one env
    # worker and half a core for the engine.
    values["topology"]["inference"]["cpus_per_engine"] = 0.5
    values["topology"]["env_workers"]["count"] = 1
    return stage_inputs(render(chart, values))


@pytest.fixture(scope="module")
def shared_volume(tmp_path_factory, tiny, tokenizer) -> Path:
    """The shared PVC: the tiny random model (SmolLM2's tokenizer) under ``models/tiny``."""
    shared = fs_group_folder(tmp_path_factory.mktemp("shared"))
    model = shared / "models" / "tiny"
    tiny.save_pretrained(model)
    tokenizer.save_pretrained(model)
    subprocess.run(["chown", "-R", f"0:{UID}", str(shared)], check=True)
    subprocess.run(["chmod", "-R", "g+rwX", str(shared)], check=True)
    return shared


def run_stage(
    manifest: dict[str, Any],
    *,
    shared: Path,
    config: str,
    stage: str,
    tracking_uri: str,
    scratch: Path,
) -> subprocess.CompletedProcess:
    """The stage's pod from ``manifest`` (a Job's only pod, or a RayJob's head with the
    entrypoint as its command) in the cpu image, its ConfigMap holding ``config``."""
    if manifest["kind"] == "Job":
        pod = pod_of(manifest)
        container, argv = pod["containers"][0], None
    else:
        head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        pod, container = head, head["containers"][0]
        argv = shlex.split(manifest["spec"]["entrypoint"])
    configs = scratch / "stage-config"
    configs.mkdir(parents=True, exist_ok=True)
    (configs / f"{stage}.yaml").write_text(config)
    configs.chmod(0o755)
    spec = PodContainer(
        container,
        pod,
        volumes={"shared": shared, "stage-config": configs},
        # the Service name of the chart's MLflow resolves in the cluster only
        extra_env={"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"},
        argv=argv,
    )
    with ImageRoot(container["image"]) as root:
        return run_in_image(spec, root, scratch, timeout=STAGE_TIMEOUT_S)


def test_cpu_image_runs_prepare_sft_and_grpo_as_the_launcher_builds_them(
    cpu_release, shared_volume, mlflow_server, tmp_path
) -> None:
    settings, topology = cpu_release
    server, _ = mlflow_server
    uri = f"http://127.0.0.1:{server.port}"
    run_dir = f"{settings.shared_mount_path}/runs/image-check"
    model = f"model.name={settings.shared_mount_path}/models/tiny"
    tracking = ["tracking.experiment=image-check"]
    stages = {
        "prepare": [
            "generate.train_size=12", "generate.eval_size=4", f"output_dir={run_dir}/data",
        ],
        "sft": [
            model, "steps=2", "batch_size=2", "eval_every=2", "checkpoint.every=2",
            f"output_dir={run_dir}/sft", *tracking,
        ],
        "grpo": [
            model, "steps=1", "prompts_per_step=2", "num_samples=2",
            "generation.max_new_tokens=8", "checkpoint.every=1", f"output_dir={run_dir}/grpo",
            *tracking,
        ],
    }  # fmt: skip
    shared_run = shared_volume / "runs" / "image-check"
    for stage, overrides in stages.items():
        name = f"llmrl-{stage}-image"
        if stage == "prepare":
            manifest = build_job_manifest(
                stage, name, settings, overrides=overrides, config_map=name
            )
        else:
            # the prepared dataset: the one folder prepare wrote under its output_dir
            (prepared,) = (shared_run / "data").iterdir()
            data = f"data.path={run_dir}/data/{prepared.name}"
            manifest = build_rayjob_manifest(
                stage, name, settings, topology, overrides=[*overrides, data], config_map=name
            )
        config = (REPO / "configs" / f"{stage}.yaml").read_text()
        scratch = tmp_path / stage
        scratch.mkdir()
        done = run_stage(
            manifest, shared=shared_volume, config=config, stage=stage, tracking_uri=uri,
            scratch=scratch,
        )  # fmt: skip
        (scratch / f"{stage}.log").write_text(done.stdout)
        assert done.returncode == 0, f"{stage} in the cpu image:\n{done.stdout[-6000:]}"

    (prepared,) = (shared_run / "data").iterdir()
    assert json.loads((prepared / "manifest.json").read_text())["rows"]["train"] == 12
    # Written by the pods' user on the shared volume, group-shared for the next stage's pod.
    assert (shared_run / "sft").stat().st_uid == UID
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("image-check")
    runs = {
        r.data.tags.get("mlflow.runName"): r for r in client.search_runs([experiment.experiment_id])
    }
    sft = next(r for name, r in runs.items() if name and name.startswith("sft"))
    assert [m.step for m in client.get_metric_history(sft.info.run_id, "loss")] == [1, 2]
    grpo = next(r for name, r in runs.items() if name and name.startswith("grpo"))
    assert grpo.info.status == "FINISHED"
    assert client.get_metric_history(grpo.info.run_id, "reward_mean")


# ------------------------------------------------------------------------------ flow


def test_flow_image_deploys_and_runs_the_flow_run_pod(chart, mlflow_server, tmp_path) -> None:
    server, _ = mlflow_server
    flow_image = image("flow")
    prefect_server = sqlite_server(tmp_path / "prefect")
    prefect_server.start(timeout=180)
    try:
        api = prefect_server.url + "/api"
        operator = PrefectCli(api, client_env(api, tmp_path / "operator"))
        operator.ok(
            "work-pool", "create", "llmrl-k8s", "--type", "kubernetes",
            "--base-job-template", str(JOB_TEMPLATE),
        )  # fmt: skip
        template = json.loads(JOB_TEMPLATE.read_text())["job_configuration"]["job_manifest"]
        items = render(chart, {})
        (config_map,) = of_kind(items, "ConfigMap")
        topology = tmp_path / "topology"
        topology.mkdir()
        for key, text in config_map["data"].items():
            (topology / key).write_text(text)
        shared = fs_group_folder(tmp_path / "shared")
        job = fill(template, {"image": flow_image, "shared_mount_path": "/shared"})
        pod = job["spec"]["template"]["spec"]

        def in_flow_pod(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
            spec = PodContainer(
                pod["containers"][0], pod,
                volumes={"shared": shared, "topology": topology}, extra_env=env, argv=argv,
            )  # fmt: skip
            with ImageRoot(flow_image) as root:
                return run_in_image(spec, root, tmp_path, timeout=STAGE_TIMEOUT_S)

        prefect_env = {"PREFECT_API_URL": api, "LLMRL_IMAGE": flow_image.removesuffix("-flow")}
        deployed = in_flow_pod(
            ["prefect", "--no-prompt", "deploy", "--name", "default"], prefect_env
        )
        assert deployed.returncode == 0, deployed.stdout[-6000:]
        [found] = operator.post("/deployments/filter", {"limit": 10})
        assert found["work_pool_name"] == "llmrl-k8s"
        assert found["job_variables"]["image"] == flow_image

        params = {
            "launcher": "kubernetes",
            "work_dir": "/shared/runs/pipeline",
            "mlflow_tracking_uri": f"http://127.0.0.1:{server.port}",
            "experiment": "image-flow",
            "skip": ["prepare", "sft", "grpo", "eval"],
            "kubernetes": {"image": flow_image.removesuffix("-flow"), "namespace": "llmrl"},
        }
        flow_run = operator.post(
            f"/deployments/{found['id']}/create_flow_run", {"parameters": {"params": params}}
        )
        executed = in_flow_pod(["prefect", "flow-run", "execute", flow_run["id"]], prefect_env)
        assert executed.returncode == 0, executed.stdout[-6000:]
        state = operator.get(f"/flow_runs/{flow_run['id']}")["state"]["type"]
        assert state == "COMPLETED", executed.stdout[-6000:]
        # The same pipeline from the command line, `python -m flows`, in the same pod (its own
        # ephemeral Prefect under PREFECT_HOME=/tmp/prefect).
        skip = [word for stage in ("prepare", "sft", "grpo", "eval") for word in ("--skip", stage)]
        cli = in_flow_pod(
            ["python", "-m", "flows", *skip, "--work-dir", "/shared/runs/cli",
             "--mlflow-tracking-uri", f"http://127.0.0.1:{server.port}",
             "--experiment", "image-flow-cli"],
            {},
        )  # fmt: skip
        assert cli.returncode == 0, cli.stdout[-6000:]
    finally:
        prefect_server.stop()

    import mlflow

    client = mlflow.MlflowClient(f"http://127.0.0.1:{server.port}")
    for name in ("image-flow", "image-flow-cli"):
        experiment = client.get_experiment_by_name(name)
        assert experiment is not None, f"{name}: no parent run in the image's MLflow"
        [parent] = client.search_runs([experiment.experiment_id])
        assert parent.info.status == "FINISHED"
