"""The colocated layout's orchestration (``llmrl/runtime/colocation.py``), run by the real
``GRPORuntime`` over recording engines: the order of sleep, train, wake, push and sample every
step and after a resume, the deadline of a hung sleep, and the two refusals (async mode, vLLM
without sleep mode).

The runtime is built by its own ``_start`` with the actor-starting boundaries replaced (placement,
engines, collector, trainer ranks): the engines are :class:`RecordingEngine` Ray actors keeping
vLLM's rules (no sampling while asleep, no push into sleeping weights), the trainer checks that
every engine sleeps before it steps, and everything lands in one journal. What runs as in a real
run: ``GRPORuntime.step`` / ``collect`` / ``train`` / ``push_weights``, ``grpo_step``, the
rollouts' thread in sync mode, the runtime's weight updater and the engines' sleep.
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from llmrl.config.grpo import TOPOLOGY_ENV
from llmrl.core.config_loading import ConfigError
from llmrl.core.deadlines import CallTimeout
from llmrl.data import Tokens
from llmrl.runtime import GRPORuntime, colocation, grpo_runtime, resolve_topology
from llmrl.runtime.engines import EngineSet
from llmrl.runtime.weights import TrainerRanksWeightUpdater
from llmrl.topology import Topology
from llmrl.transports.weights import VersionOnlyUpdater, WeightSyncStats
from tests.support.configs import tiny_grpo_config
from tests.support.paths import REPO
from tests.support.recording_engines import Journal, RecordingEngine, calls_in_order
from tests.support.topologies import chart_topology

ENGINES = 2
COLOCATED = {
    "colocated": True,
    "inference": {"backend": "vllm", "engines": ENGINES, "gpu_memory_utilization": 0.5},
    "trainer": {"gpus": ENGINES, "strategy": "ddp"},
    "env_workers": {"count": 2},
}


def step_calls(number: int) -> list[str]:
    """What step ``number`` does after its batch was sampled, up to the next step's batch."""
    return [
        "sleep level 1",
        f"train {number}",
        "wake weights",
        f"push v{number}",
        "wake kv_cache",
        f"sample v{number}",
    ]


class RecordingTrainers:
    """The trainer ranks: each step checks that every engine sleeps, then records it; a push
    loads the version into every engine; a save keeps the checkpoint's ``extra``."""

    def __init__(self, *, journal: Any, resume_from: str | None, **_: Any) -> None:
        self.journal, self.resume_from = journal, resume_from
        self.engines: list[Any] = []
        self.saved: dict[str, Any] = {}

    def connect_engines(self, *, vllm_engines: list[Any], **_: Any) -> None:
        self.engines = vllm_engines

    def train(self, batch: TensorDict, step: int) -> dict[str, float]:
        import ray

        sleeping = ray.get([engine.is_sleeping.remote() for engine in self.engines])
        assert all(sleeping), f"step {step} trains beside awake engines: {sleeping}"
        ray.get(self.journal.write.remote(None, f"train {step}"))
        return {"loss": 0.0, "skipped_updates": 0.0}

    def push_weights(self, version: int) -> WeightSyncStats:
        import ray

        checksums = tuple(ray.get([engine.load.remote(version) for engine in self.engines]))
        return WeightSyncStats(0.0, 8, version, checksums[0], checksums)

    def restore_engine(self, old: Any, new: Any) -> bool:
        return False

    def save(self, step: int, extra: dict[str, Any], metrics: dict[str, float]) -> str:
        self.saved = extra
        return f"checkpoints/step-{step:06d}"

    def shutdown(self) -> None:
        self.engines = []


class RecordingCollector:
    """The collector: each batch is one generate call to every engine (replies in groups of
    the config's samples), pushes through the runtime's weight updater."""

    def __init__(self, *, policy_factory: list[Any], dialog_turns_per_batch: int, **_: Any):
        self.engines, self.rows = list(policy_factory), dialog_turns_per_batch
        self.inference_actors: list[Any] = []
        self.weight_updater: Any = VersionOnlyUpdater()
        self.batches = 0

    @property
    def policy_version(self) -> int:
        return self.weight_updater.version

    def __iter__(self):
        import ray

        while True:
            calls = [engine.generate.remote(self.rows // ENGINES) for engine in self.engines]
            replies = [reply for replies in ray.get(calls) for reply in replies]
            first_group, self.batches = self.batches * self.rows // 2, self.batches + 1
            yield TensorDict(
                {
                    "tokens": Tokens.from_sequences(
                        prompt=[torch.tensor([1, 2, 3])] * self.rows,
                        response=[torch.tensor(reply) for reply in replies],
                    ),
                    "reward": torch.arange(self.rows, dtype=torch.float) % 2,
                    "group_id": first_group + torch.arange(self.rows) // 2,
                    "policy_version": torch.full((self.rows,), self.policy_version),
                },
                batch_size=[self.rows],
            )

    def update_policy_weights_(self, weights: Any = None) -> WeightSyncStats:
        return self.weight_updater.push(weights, version=self.policy_version + 1)

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"policy_version": self.policy_version, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight_updater.version = int(state["policy_version"])
        self.batches = int(state["batches"])

    def shutdown(self) -> None:
        self.engines = []


class FakePlacement:
    """What the runtime reads of a placement when its roles are replaced."""

    specs = types.SimpleNamespace(
        inference=types.SimpleNamespace(count=ENGINES, tensor_parallel_size=1), reference=None
    )

    def remove(self) -> None:
        """Nothing was placed on Ray: nothing to remove."""


@pytest.fixture
def replaced_actors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runtime's actor-starting boundaries replaced; each one started is listed."""
    started: list[str] = []

    def place(topology: Topology, timeout_s: float) -> FakePlacement:
        started.append("placement")
        return FakePlacement()

    monkeypatch.setattr(grpo_runtime, "place_on_ray", place)
    monkeypatch.setattr(grpo_runtime, "inference_actor_options", lambda p: [{}] * ENGINES)
    monkeypatch.setattr(grpo_runtime, "env_worker_options", lambda p: [{}] * 2)
    monkeypatch.setattr(grpo_runtime, "RayLLMCollector", RecordingCollector)
    return started


@pytest.fixture
def colocated_run(local_ray, replaced_actors, monkeypatch, arithmetic_data, tiny_model_dir):
    """``start(*overrides, resume_from=, state=, hang_s=)``: a colocated GRPO runtime over
    recording engines (engine 1's sleep hanging ``hang_s`` seconds when set) and its journal;
    vLLM here is taken to have sleep mode (a GPU machine)."""
    monkeypatch.setattr(colocation, "sleep_mode_problem", lambda: None)
    runtimes: list[GRPORuntime] = []

    def start(*overrides: str, resume_from=None, state=None, hang_s=None):
        options = {"num_cpus": 0, "runtime_env": {"env_vars": {"PYTHONPATH": str(REPO)}}}
        journal = local_ray.remote(Journal).options(**options).remote()
        engine = local_ray.remote(RecordingEngine).options(**options)
        engines = [engine.remote(i, journal, hang_s if i == 1 else None) for i in range(ENGINES)]
        sets = EngineSet(factories=engines, vllm_engines=engines)
        monkeypatch.setattr(grpo_runtime, "start_engines", lambda **_: sets)
        trainers = functools.partial(RecordingTrainers, journal=journal)
        monkeypatch.setattr(grpo_runtime, "TrainerGroup", trainers)
        config = tiny_grpo_config(
            arithmetic_data, tiny_model_dir, "audit.enabled=false", *overrides, topology=COLOCATED
        )
        runtime = GRPORuntime(
            config=config,
            topology=resolve_topology(config),
            resume_from=resume_from,
            resume_state=state,
        )
        runtimes.append(runtime)
        return runtime, journal

    yield start
    for runtime in runtimes:
        runtime.shutdown()


def _calls(journal: Any) -> list[str]:
    import ray

    return calls_in_order(ray.get(journal.read.remote()), ENGINES)


@pytest.mark.integration
def test_every_step_sleeps_trains_wakes_pushes_and_samples_in_order_and_after_a_resume(
    colocated_run,
):
    runtime, journal = colocated_run()
    assert isinstance(runtime.collector.weight_updater, colocation.WakingWeightUpdater)
    steps = [runtime.step(number)[1] for number in (1, 2)]
    saved = runtime.save(2, {}, steps[-1])
    extra = runtime.trainers.saved
    runtime.collect(0)  # the next step's batch: sampled as soon as the push returned
    assert _calls(journal) == ["sample v0", *step_calls(1), *step_calls(2)]
    assert [m["policy_version"] for m in steps] == [1, 2]
    assert runtime.engine_sleep.asleep == set()
    runtime.shutdown()

    # resumed: fresh engines start awake, take the checkpoint's weights, then the same steps
    resumed, journal = colocated_run(resume_from=saved, state=extra)
    assert resumed.policy_version == 2
    steps = [resumed.step(number)[1] for number in (3, 4)]
    resumed.collect(0)
    assert _calls(journal) == ["push v2", "sample v2", *step_calls(3), *step_calls(4)]
    assert [m["policy_version"] for m in steps] == [3, 4]
    assert [m["staleness"] for m in steps] == [0, 0]


@pytest.mark.integration
def test_a_hung_sleep_stops_the_step_naming_the_engine_and_the_setting(colocated_run):
    runtime, journal = colocated_run("runtime.timeouts.engine_call_s=1", hang_s=30.0)
    with pytest.raises(CallTimeout) as caught:
        runtime.step(1)
    message = str(caught.value)
    assert message.startswith("vLLM engine 1 hung: sleep did not return within 1 s"), message
    assert "phase level 1, version 0, step 1" in message
    assert "bounded by runtime.timeouts.engine_call_s" in message
    assert caught.value.hung.index == 1
    assert "train 1" not in _calls_so_far(journal)


def _calls_so_far(journal: Any) -> list[str]:
    """The journal's events (engine 0's sleep recorded, engine 1's never)."""
    import ray

    return [event for _, event in ray.get(journal.read.remote())]


def _config(data: Path, model: Path, **fields: Any) -> Any:
    return tiny_grpo_config(data, model, "audit.enabled=false", **fields)


def test_async_mode_with_a_colocated_topology_is_refused_naming_both_settings(
    arithmetic_data, tiny_model_dir
):
    with pytest.raises(ConfigError) as caught:  # the config's validation, as the CLI loads it
        _config(arithmetic_data, tiny_model_dir, mode="async", topology=COLOCATED)
    message = str(caught.value)
    assert "mode: 'async' with topology.colocated" in message
    assert "an engine cannot sample while it sleeps" in message
    assert "max_staleness 1" in message
    assert "set mode: sync (or topology.colocated: false)" in message
    _config(arithmetic_data, tiny_model_dir, mode="sync", topology=COLOCATED)  # accepted


def test_the_charts_colocated_example_is_refused_for_an_async_config(
    arithmetic_data, tiny_model_dir, tmp_path, monkeypatch
):
    import yaml

    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({"topology": chart_topology("single-node-8gpu.yaml")}))
    monkeypatch.setenv(TOPOLOGY_ENV, str(path))
    config = _config(arithmetic_data, tiny_model_dir, mode="async", prompts_per_step=8)
    with pytest.raises(ConfigError, match=r"mode: 'async' with topology.colocated"):
        resolve_topology(config)
    sync = _config(arithmetic_data, tiny_model_dir, mode="sync", prompts_per_step=8)
    assert resolve_topology(sync).colocated


class CpuPlatform:
    """vLLM's CPU build's ``current_platform``, as far as the check reads it."""

    device_name = "cpu"

    def is_sleep_mode_available(self) -> bool:
        return False

    def is_unspecified(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return True


def test_a_colocated_runtime_is_refused_where_vllm_has_no_sleep_mode_before_any_actor(
    replaced_actors, monkeypatch, arithmetic_data, tiny_model_dir
):
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = CpuPlatform()
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    config = _config(arithmetic_data, tiny_model_dir, topology=COLOCATED)
    with pytest.raises(ConfigError) as caught:
        GRPORuntime(config=config, topology=config.topology)
    message = str(caught.value)
    assert "topology.colocated: vLLM's CPU build has no sleep mode" in message
    assert "it needs GPUs" in message
    assert "set topology.colocated: false" in message
    assert replaced_actors == []  # not even the placement
    # disaggregated, the same vLLM is no reason to refuse
    colocation.refuse_without_sleep_mode(Topology())


def test_a_disaggregated_layout_never_sleeps_its_engines(arithmetic_data, tiny_model_dir):
    config = _config(arithmetic_data, tiny_model_dir)
    engines = [object(), object()]  # any call on them would fail
    sleep = colocation.EngineSleep.of(config, Topology(), engines)
    sleep.sleep(3)
    sleep.wake("weights", 4)
    assert sleep.engines == [] and sleep.asleep == set()
    updater = sleep.weight_updater(ranks=object())
    assert type(updater) is TrainerRanksWeightUpdater
