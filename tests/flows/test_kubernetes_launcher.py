"""KubernetesLauncher against a local fake Kubernetes API (tests/flows/fake_k8s_api.py)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from flows.launchers import (
    KubernetesLauncher,
    KubernetesSettings,
    RayRuntimeEnv,
    StageConfigError,
    StageFailedError,
    TransientStageError,
)
from llmrl.topology import InferenceSpec, Topology, TrainerSpec
from tests.flows.fake_k8s_api import FakeKubernetes
from tests.support.crd_schema import validate_custom_object
from tests.support.signals import send_ctrl_c

pytest.importorskip("kubernetes")

SUMMARY = {"label": "base", "accuracy": 0.25, "pass_at": {}, "num_problems": 8, "seconds": 3.0}
TOPOLOGY = Topology(
    inference=InferenceSpec(engines=2, tensor_parallel_size=2),
    trainer=TrainerSpec(gpus=2, strategy="fsdp"),
)


def _settings(**changes) -> KubernetesSettings:
    values = {
        "namespace": "llmrl",
        "image": "registry.example/llmrl:test",
        "watch_window_s": 1,
        "unschedulable_timeout_s": 0,
        "api_retry_s": 0,
        **changes,
    }
    return KubernetesSettings(**values)


def _launcher(
    fake: FakeKubernetes, runtime_env: RayRuntimeEnv | None = None, **changes
) -> KubernetesLauncher:
    """A launcher that, like the flow-run pod, has the fake's shared claim at shared_mount_path."""
    settings = _settings(shared_mount_path=str(fake.shared_dir), **changes)
    return KubernetesLauncher(
        settings, api_client=fake.api_client(), topology=TOPOLOGY, runtime_env=runtime_env
    )


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text("batch_size: 4\nmax_new_tokens: 8\n", encoding="utf-8")
    return path


def test_job_stage_creates_config_and_job_watches_and_reads_the_result_file(config_file) -> None:
    with FakeKubernetes("success", summary=SUMMARY) as fake:
        result = _launcher(fake).run(
            "eval", config_file, ["label=base"], {"MLFLOW_PARENT_RUN_ID": "p1"}, name="eval-base"
        )
    assert result.summary == SUMMARY
    assert result.details["kind"] == "Job"
    config_map, job = fake.created
    name = job["metadata"]["name"]
    assert name.startswith("llmrl-eval-base-")
    assert config_map["data"] == {"eval.yaml": config_file.read_text()}
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "llmrl", "eval", "--config", "/etc/llmrl/eval.yaml", "--no-progress", "--set", "label=base"
    ]  # fmt: skip
    assert {"name": "MLFLOW_PARENT_RUN_ID", "value": "p1"} in container["env"]
    # The stage wrote its result on the shared claim; the launcher read it and removed it.
    result_file = fake.shared_dir / "stage-results" / f"{name}.json"
    assert {"name": "LLMRL_RESULT_FILE", "value": str(result_file)} in container["env"]
    assert not result_file.exists()
    methods = [(method, path.rsplit("/", 2)[-2:]) for method, path in fake.requests]
    assert methods[:3] == [
        ("POST", ["llmrl", "configmaps"]),
        ("POST", ["llmrl", "jobs"]),
        ("PATCH", ["configmaps", name]),  # the job owns its config map
    ]
    assert any(method == "GET" and "/log" in path for method, path in fake.requests)
    assert fake.deletes() == []  # success: the TTL cleans up


def test_prepare_job_returns_the_dataset_directory() -> None:
    user_code = RayRuntimeEnv(py_modules=["/shared/code/my_pkg"])
    with FakeKubernetes("success", summary_path="/shared/data/arithmetic-0a1b") as fake:
        result = _launcher(fake, user_code).run("prepare", None, ["generate.train_size=10"], {})
    assert result.summary == {"path": "/shared/data/arithmetic-0a1b"}
    (job,) = fake.created  # no config file: no config map
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "--config" not in container["command"]
    assert {"name": "PYTHONPATH", "value": "/shared/code"} in container["env"]  # the user's code


def test_rayjob_stage_runs_to_success_and_reads_the_result_file() -> None:
    summary = {"step": 2, "final_checkpoint": "/shared/sft/model", "train_loss": 1.5}
    user_code = RayRuntimeEnv(py_modules=["/shared/code/my_pkg"], env_vars={"MY_API": "x"})
    with FakeKubernetes("success", summary=summary) as fake:
        result = _launcher(fake, user_code).run("sft", None, ["steps=2"], {}, name="sft")
    # The entrypoint (on the trainer pod, which mounts the claim) wrote the file it was given in
    # the job's runtime env.
    assert result.summary == summary
    (rayjob,) = fake.created
    assert rayjob["kind"] == "RayJob"
    assert rayjob["spec"]["entrypoint"] == "llmrl sft --no-progress --set steps=2"
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    env_vars = runtime_env["env_vars"]
    assert env_vars["LLMRL_RESULT_FILE"].startswith(f"{fake.shared_dir}/stage-results/")
    assert env_vars["MY_API"] == "x" and runtime_env["py_modules"] == ["/shared/code/my_pkg"]
    paths = [path for _, path in fake.requests]
    assert "/apis/ray.io/v1/namespaces/llmrl/rayjobs" in paths


def test_oom_killed_pod_fails_with_its_reason_and_is_deleted(config_file) -> None:
    with FakeKubernetes("oom") as fake, pytest.raises(StageFailedError) as caught:
        _launcher(fake).run("eval", config_file, [], {}, name="eval-sft")
    message = str(caught.value)
    assert "OOMKilled" in message
    assert "exit code 137" in message
    assert "raise the memory" in message
    name = fake.created[1]["metadata"]["name"]
    assert f"/apis/batch/v1/namespaces/llmrl/jobs/{name}" in fake.deletes()
    assert f"/api/v1/namespaces/llmrl/configmaps/{name}" in fake.deletes()


def test_oom_killed_ray_worker_fails_the_rayjob() -> None:
    with FakeKubernetes("oom") as fake, pytest.raises(StageFailedError, match="OOMKilled"):
        _launcher(fake).run("grpo", None, [], {})
    name = fake.created[0]["metadata"]["name"]
    assert f"/apis/ray.io/v1/namespaces/llmrl/rayjobs/{name}" in fake.deletes()


def test_unschedulable_pod_fails_with_the_scheduler_message() -> None:
    with FakeKubernetes("unschedulable") as fake, pytest.raises(StageFailedError) as caught:
        _launcher(fake).run("grpo", None, [], {})
    message = str(caught.value)
    assert "Unschedulable" in message
    assert "Insufficient nvidia.com/gpu" in message
    assert "node selectors and tolerations" in message
    assert len(fake.deletes()) == 1


def test_unschedulable_is_tolerated_for_the_configured_time() -> None:
    with FakeKubernetes("unschedulable") as fake:
        start = time.monotonic()
        with pytest.raises(StageFailedError, match="Unschedulable"):
            _launcher(fake, unschedulable_timeout_s=2).run("prepare", None, [], {})
    assert time.monotonic() - start >= 2


def test_image_pull_backoff_fails_fast_with_its_reason() -> None:
    with FakeKubernetes("imagepull") as fake, pytest.raises(StageFailedError) as caught:
        _launcher(fake).run("prepare", None, [], {})
    assert "ImagePullBackOff" in str(caught.value)
    assert 'Back-off pulling image "llmrl:missing"' in str(caught.value)


def test_exit_code_2_is_a_config_error_for_jobs_and_rayjobs(config_file) -> None:
    for stage in ("eval", "sft"):
        with FakeKubernetes("config_error") as fake, pytest.raises(StageConfigError) as caught:
            _launcher(fake).run(stage, config_file, ["max_new_tokens=0"], {})
        assert "max_new_tokens: Input should be greater than or equal to 1" in str(caught.value)


def test_failures_can_keep_their_resources_for_inspection() -> None:
    with FakeKubernetes("oom") as fake, pytest.raises(StageFailedError):
        _launcher(fake, delete_on_failure=False).run("prepare", None, [], {})
    assert fake.deletes() == []


def test_api_errors_are_transient_and_leave_nothing_behind(config_file) -> None:
    with FakeKubernetes("api_error") as fake, pytest.raises(TransientStageError, match="503"):
        _launcher(fake).run("sft", config_file, [], {})
    name = fake.created[0]["metadata"]["name"]  # the config map was created first
    assert fake.deletes() == [f"/api/v1/namespaces/llmrl/configmaps/{name}"]


def test_unreachable_api_is_transient(tmp_path) -> None:
    from kubernetes import client

    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    settings = _settings(shared_mount_path=str(tmp_path))
    launcher = KubernetesLauncher(settings, api_client=api, topology=TOPOLOGY)
    with pytest.raises(TransientStageError, match="unreachable"):
        launcher.run("prepare", None, [], {})


@pytest.mark.parametrize("stage", ["grpo", "eval"])
def test_cancellation_deletes_what_was_created(stage: str, config_file, default_sigint) -> None:
    with FakeKubernetes("hang") as fake:
        launcher = _launcher(fake)

        def cancel_when_running() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if any(p["status"]["phase"] == "Running" for p in fake.pods()):
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            send_ctrl_c()  # Ctrl-C, or Prefect cancelling the task

        threading.Thread(target=cancel_when_running, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            launcher.run(stage, config_file, [], {})
        kind = {"grpo": "apis/ray.io/v1/namespaces/llmrl/rayjobs"}.get(
            stage, "apis/batch/v1/namespaces/llmrl/jobs"
        )
        name = fake.created[1]["metadata"]["name"]
        assert sorted(fake.deletes()) == sorted(
            [f"/{kind}/{name}", f"/api/v1/namespaces/llmrl/configmaps/{name}"]
        )
        assert fake.pods() == []  # the fake's garbage collection removed the pods


def test_topology_comes_from_a_file_the_environment_or_the_defaults(tmp_path, monkeypatch) -> None:
    from flows.launchers.kubernetes import load_topology

    monkeypatch.delenv("LLMRL_TOPOLOGY", raising=False)
    assert load_topology(None) == Topology()
    plain = tmp_path / "topology.yaml"
    plain.write_text("trainer: {gpus: 2, strategy: ddp}\n", encoding="utf-8")
    assert load_topology(str(plain)).trainer.gpus == 2
    values = tmp_path / "values.yaml"  # a Helm values file
    values.write_text("image: {repository: x}\ntopology:\n  env_workers: {count: 7}\n")
    assert load_topology(str(values)).env_workers.count == 7
    monkeypatch.setenv("LLMRL_TOPOLOGY", str(plain))  # the work pool's mounted ConfigMap
    assert load_topology(None).trainer.strategy == "ddp"
    monkeypatch.setenv("LLMRL_TOPOLOGY", str(tmp_path / "not-mounted.yaml"))
    assert load_topology(None) == Topology()
    with pytest.raises(StageConfigError, match="does not exist"):
        load_topology(str(tmp_path / "missing.yaml"))
    plain.write_text("trainer: {gpus: 2, strategy: single}\n", encoding="utf-8")
    with pytest.raises(StageConfigError, match=r"trainer\.gpus"):
        load_topology(str(plain))


@pytest.mark.parametrize(
    ("stage", "fake_options", "problem"),
    [
        ("eval", {"write_result": False}, "does not exist"),
        ("sft", {"result_text": "{not json"}, "is not JSON"),
        ("prepare", {"result_text": '["a list"]'}, "holds a list, not a JSON object"),
    ],
)
def test_a_missing_or_corrupt_result_file_fails_naming_the_file(
    stage: str, fake_options: dict, problem: str
) -> None:
    # The log still ends with the summary line, as llmrl prints it: it is never read.
    with FakeKubernetes("success", summary=SUMMARY, **fake_options) as fake:
        with pytest.raises(StageFailedError) as caught:
            _launcher(fake).run(stage, None, [], {})
        name = fake.created[0]["metadata"]["name"]
        result_file = fake.shared_dir / "stage-results" / f"{name}.json"
        assert not result_file.exists()  # removed after reading
        kind = "rayjobs" if stage == "sft" else "jobs"
        assert any(path.endswith(f"/{kind}/{name}") for path in fake.deletes())  # a failure
    printed = fake.summary_path if stage == "prepare" else json.dumps(SUMMARY)
    assert any(printed in lines for lines in fake.logs.values())
    message = str(caught.value)
    assert f"result file {result_file} {problem}" in message
    assert "LLMRL_RESULT_FILE" in message


def test_a_result_written_off_the_shared_claim_never_reaches_the_launcher() -> None:
    # The pods mount another claim at shared_mount_path: the stage's file is not where the
    # launcher looks, as on a cluster whose flow-run pod and stage pods mount different claims.
    fake = FakeKubernetes("success", summary=SUMMARY, shared_claim="another-claim")
    with fake, pytest.raises(StageFailedError, match=r"result file .*\.json does not exist"):
        _launcher(fake).run("eval", None, [], {})


def test_without_a_shared_volume_the_launcher_refuses_before_creating_anything(tmp_path) -> None:
    in_the_way = tmp_path / "not-a-folder"
    in_the_way.write_text("")
    with FakeKubernetes("success") as fake:
        with pytest.raises(StageConfigError, match=r"kubernetes\.shared_claim is empty"):
            _launcher(fake, shared_claim=None).run("eval", None, [], {})
        launcher = KubernetesLauncher(
            _settings(shared_mount_path=str(in_the_way)), api_client=fake.api_client()
        )
        with pytest.raises(StageConfigError) as caught:
            launcher.run("eval", None, [], {})
        assert f"cannot create {in_the_way}/stage-results" in str(caught.value)
        assert "claim llmrl-shared is mounted" in str(caught.value)
        assert fake.created == []


def test_user_env_vars_that_clash_with_llmrls_are_refused_before_creating_anything() -> None:
    user_code = RayRuntimeEnv(env_vars={"MLFLOW_PARENT_RUN_ID": "mine"})
    with FakeKubernetes("success") as fake:
        for stage in ("grpo", "eval"):
            with pytest.raises(StageConfigError) as caught:
                _launcher(fake, user_code).run(stage, None, [], {"MLFLOW_PARENT_RUN_ID": "p1"})
            assert caught.value.stage == stage
            assert "runtime_env.env_vars: MLFLOW_PARENT_RUN_ID is set by llmrl" in str(caught.value)
        assert fake.created == []


@pytest.mark.parametrize("stage", ["grpo", "eval"])
def test_a_run_that_failed_per_its_status_names_the_job_and_its_message(stage: str) -> None:
    with FakeKubernetes("crash") as fake:
        with pytest.raises(StageFailedError) as caught:
            _launcher(fake, delete_on_failure=False).run(stage, None, [], {})
        (created,) = fake.created
        name = created["metadata"]["name"]
        stored = fake.get("rayjobs" if stage == "grpo" else "jobs", "llmrl", name)
    message = str(caught.value)
    if stage == "grpo":
        assert (
            f"RayJob {name} Failed (job FAILED): AppFailed: "
            "Job entrypoint command failed with exit code 1"
        ) in message
        if fake.kuberay_version:  # the status the fake serves is one the CRD allows
            assert validate_custom_object(stored, fake.kuberay_version) == []
    else:
        assert (
            f"Job {name} failed: BackoffLimitExceeded: Job has reached the specified backoff limit"
        ) in message
    assert "RuntimeError: boom" in message  # the driver's log, for the user
    assert not isinstance(caught.value, StageConfigError)
