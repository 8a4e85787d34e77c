"""What a stage run leaves on the cluster, and when: GPUs released at once, nothing left running
after the flow run is cancelled or killed (the fake API of tests/flows/fake_k8s_api.py), and the
stage pods' settings the chart hands the launcher."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.launchers import KubernetesLauncher, KubernetesSettings, StageConfigError
from flows.launchers.kubernetes import delete_flow_run_resources
from flows.launchers.settings import OWNER_NAME_ENV, OWNER_UID_ENV, SETTINGS_ENV, PodResources
from llmrl.topology import InferenceSpec, Topology, TrainerSpec
from tests.flows.fake_k8s_api import FakeKubernetes

pytest.importorskip("kubernetes")

SUMMARY = {"step": 2, "final_checkpoint": "/shared/ckpt/model"}
GPU_TOPOLOGY = Topology(
    inference=InferenceSpec(engines=1, tensor_parallel_size=1),
    trainer=TrainerSpec(gpus=1, strategy="single"),
)


def _settings(fake: FakeKubernetes | None = None, **changes: Any) -> KubernetesSettings:
    """Test settings; with ``fake``, its shared claim is at ``shared_mount_path`` (as in the
    flow-run pod), where the stages' result files arrive."""
    values = {"watch_window_s": 1, "unschedulable_timeout_s": 0, "api_retry_s": 0, **changes}
    if fake is not None:
        values["shared_mount_path"] = str(fake.shared_dir)
    return KubernetesSettings(**values)


def _stored(fake: FakeKubernetes, kind: str) -> list[dict[str, Any]]:
    with fake.lock:
        return [obj for (k, _, _), obj in fake.objects.items() if k == kind]


def _run_in_thread(launcher: KubernetesLauncher, stage: str, config: Path | None):
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = launcher.run(stage, config, [], {})
        except BaseException as error:  # the test inspects it
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_finished_ray_stage_releases_its_cluster_and_is_deleted(tmp_path) -> None:
    config = tmp_path / "grpo.yaml"
    config.write_text("steps: 2\n")
    with FakeKubernetes("success", summary=SUMMARY) as fake:
        launcher = KubernetesLauncher(
            _settings(fake), api_client=fake.api_client(), topology=GPU_TOPOLOGY
        )
        result = launcher.run("grpo", config, [], {})
        rayjob = next(obj for obj in fake.created if obj.get("kind") == "RayJob")
        # KubeRay tears the Ray cluster (the GPUs) down the moment the job ends ...
        assert rayjob["spec"]["ttlSecondsAfterFinished"] == 0
        assert rayjob["spec"]["shutdownAfterJobFinishes"] is True
        # ... and the launcher deletes the RayJob once it has read the summary; its ConfigMap
        # and pods go with it.
        assert result.summary == SUMMARY
        name = rayjob["metadata"]["name"]
        assert f"/apis/ray.io/v1/namespaces/llmrl/rayjobs/{name}" in fake.deletes()
        assert _stored(fake, "rayjobs") == [] and _stored(fake, "configmaps") == []
        assert _stored(fake, "pods") == []


def _flow_run_pod(fake: FakeKubernetes, monkeypatch) -> dict[str, Any]:
    """The flow-run pod, as the Prefect worker's Job made it; its name and uid reach the
    launcher through the downward API (k8s/prefect-work-pool-job-template.json)."""
    pod = fake.seed(
        "pods",
        "llmrl",
        {"metadata": {"name": "llmrl-pipeline-abcde-xyz"}, "status": {"phase": "Running"}},
    )
    monkeypatch.setenv(OWNER_NAME_ENV, pod["metadata"]["name"])
    monkeypatch.setenv(OWNER_UID_ENV, pod["metadata"]["uid"])
    return pod


def test_stage_objects_carry_the_flow_run_and_its_pod_as_owner(tmp_path, monkeypatch) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text("batch_size: 2\n")
    with FakeKubernetes("success", summary={"accuracy": 0.5}) as fake:
        pod = _flow_run_pod(fake, monkeypatch)
        launcher = KubernetesLauncher(
            _settings(fake), api_client=fake.api_client(), topology=GPU_TOPOLOGY, flow_run_id="fr-1"
        )
        launcher.run("eval", config, [], {})
    config_map, job = fake.created[:2]
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "llmrl-pipeline-abcde-xyz",
        "uid": pod["metadata"]["uid"],
        "controller": False,
        "blockOwnerDeletion": False,
    }
    assert job["metadata"]["ownerReferences"] == [owner]
    assert job["metadata"]["labels"]["llmrl.io/flow-run"] == "fr-1"
    assert config_map["metadata"]["labels"]["llmrl.io/flow-run"] == "fr-1"
    # The ConfigMap is owned by the flow-run pod from its creation, then also by its Job.
    assert config_map["metadata"]["ownerReferences"] == [owner]
    assert (
        job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        == "1"
    )  # eval's GPUs follow the topology (it has some)


def test_a_killed_flow_run_pod_takes_its_running_stage_with_it(monkeypatch) -> None:
    """The flow-run pod is deleted (cancelled flow run: the worker deletes its Job; crashed:
    the Job's TTL): the garbage collector deletes the RayJob it owns, whose Ray cluster goes."""
    with FakeKubernetes("hang") as fake:
        pod = _flow_run_pod(fake, monkeypatch)
        launcher = KubernetesLauncher(
            _settings(fake), api_client=fake.api_client(), topology=GPU_TOPOLOGY
        )
        thread, outcome = _run_in_thread(launcher, "grpo", None)
        _wait_for(lambda: len(_stored(fake, "rayjobs")) == 1)
        (rayjob,) = _stored(fake, "rayjobs")
        assert rayjob["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        assert fake.delete_object("pods", "llmrl", pod["metadata"]["name"])
        thread.join(timeout=120)
        assert "was deleted" in str(outcome["error"])
        assert _stored(fake, "rayjobs") == [] and _stored(fake, "pods") == []


def test_cancel_hook_deletes_only_the_flow_runs_stages(tmp_path) -> None:
    with FakeKubernetes("hang") as fake:
        client = fake.api_client()
        ours = KubernetesLauncher(_settings(fake), api_client=client, topology=GPU_TOPOLOGY,
                                  flow_run_id="fr-ours")  # fmt: skip
        theirs = KubernetesLauncher(_settings(fake), api_client=client, topology=GPU_TOPOLOGY,
                                    flow_run_id="fr-theirs")  # fmt: skip
        ours_thread, ours_outcome = _run_in_thread(ours, "grpo", None)
        theirs_thread, theirs_outcome = _run_in_thread(theirs, "eval", None)
        _wait_for(lambda: len(_stored(fake, "rayjobs")) == 1 and len(_stored(fake, "jobs")) == 1)
        deleted = delete_flow_run_resources(_settings(), "fr-ours", api_client=client)
        assert len(deleted) == 1 and deleted[0].startswith("RayJob/llmrl-grpo-")
        ours_thread.join(timeout=120)
        assert "was deleted" in str(ours_outcome["error"])
        assert _stored(fake, "rayjobs") == []
        assert len(_stored(fake, "jobs")) == 1  # the other flow run's stage keeps running
        assert theirs_thread.is_alive() and not theirs_outcome
        their_job = _stored(fake, "jobs")[0]["metadata"]["name"]
        deleted = delete_flow_run_resources(_settings(), "fr-theirs", api_client=client)
        assert deleted == [f"Job/{their_job}"]
        theirs_thread.join(timeout=120)
        assert "was deleted" in str(theirs_outcome["error"])


def test_a_stage_asking_for_more_gpus_than_the_topology_is_refused() -> None:
    cpu_only = Topology.local_default()
    assert cpu_only.total_gpus == 0
    with FakeKubernetes("success") as fake:
        settings = _settings(fake, jobs={"eval": PodResources(cpus=2, memory_gb=4, gpus=1)})
        launcher = KubernetesLauncher(settings, api_client=fake.api_client(), topology=cpu_only)
        with pytest.raises(StageConfigError, match=r"requests 1 GPU\(s\) but the topology has 0"):
            launcher.run("eval", None, [], {})
        assert fake.requests == []  # refused before anything was created
        # Left open (null), eval's GPUs follow the topology: 0 here, and the stage runs.
        open_gpus = _settings(fake, jobs={"eval": PodResources(cpus=2, memory_gb=4, gpus=None)})
        KubernetesLauncher(open_gpus, api_client=fake.api_client(), topology=cpu_only).run(
            "eval", None, [], {}
        )
        limits = fake.created[-1]["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert "nvidia.com/gpu" not in limits["limits"]


def test_settings_come_from_the_chart_file_and_parameters_win(tmp_path, monkeypatch) -> None:
    chart_file = tmp_path / "kubernetes.yaml"
    chart_file.write_text(
        yaml.safe_dump(
            {
                "namespace": "team-a",
                "image": "registry/llmrl:1.0",
                "priority_class_name": "gpu-high",
                "kueue_queue": "gpu-queue",
                "roles": {"trainer": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}},
            }
        )
    )
    monkeypatch.setenv(SETTINGS_ENV, str(chart_file))
    launcher = KubernetesLauncher(KubernetesSettings(image="registry/llmrl:dev"))
    settings = launcher.settings
    assert settings.image == "registry/llmrl:dev"  # given in the flow run's parameters
    assert (settings.namespace, settings.priority_class_name) == ("team-a", "gpu-high")
    assert settings.kueue_queue == "gpu-queue"
    assert settings.role("trainer").env == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    assert settings.role("inference").env == []


def test_a_bad_settings_file_names_the_file_and_the_field(tmp_path, monkeypatch) -> None:
    chart_file = tmp_path / "kubernetes.yaml"
    chart_file.write_text("roles:\n  trainers: {}\n")
    monkeypatch.setenv(SETTINGS_ENV, str(chart_file))
    with pytest.raises(StageConfigError) as caught:
        KubernetesLauncher(KubernetesSettings())
    message = str(caught.value)
    assert str(chart_file) in message and "LLMRL_KUBERNETES_SETTINGS" in message
    assert "unknown pod role(s) ['trainers']" in message
    monkeypatch.setenv(SETTINGS_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(StageConfigError, match=r"missing\.yaml.*cannot read"):
        KubernetesLauncher(KubernetesSettings())
