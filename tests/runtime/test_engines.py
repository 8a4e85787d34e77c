"""Where the runtime puts its inference actors: an engine's own bundle (disaggregated) or the
trainer's bundles, half of each (colocated), and its env workers; what a transformers engine
builds."""

from __future__ import annotations

import torch

from llmrl.runtime.engines import TransformersEngine, inference_actor_options, start_engines
from llmrl.runtime.env_workers import env_worker_options
from llmrl.topology import Placement, Topology
from tests.support.chats import history_batch


class _Role:
    """A stand-in for a reserved role: names the bundle an actor would be scheduled on."""

    def __init__(self, name: str) -> None:
        self.name = name

    def scheduling_strategy(self, index: int = 0) -> str:
        return f"{self.name}[{index}]"


def _placement(topology: Topology, inference: list[str]) -> Placement:
    return Placement(
        topology=topology,
        inference=[_Role(name) for name in inference],
        trainer=_Role("trainer"),
        reference=None,
        env_workers=_Role("env_workers"),
    )


def test_disaggregated_engines_take_their_own_bundles():
    topology = Topology.model_validate(
        {"inference": {"backend": "transformers", "engines": 2, "cpus_per_engine": 1.5}}
    )
    options = inference_actor_options(_placement(topology, ["engine0", "engine1"]))
    assert options == [
        {"num_cpus": 1.5, "num_gpus": 0.0, "scheduling_strategy": "engine0[0]"},
        {"num_cpus": 1.5, "num_gpus": 0.0, "scheduling_strategy": "engine1[0]"},
    ]


def test_a_transformers_engine_on_a_gpu_holds_it():
    topology = Topology.model_validate(
        {"inference": {"backend": "transformers", "gpus_per_engine": 1, "cpus_per_engine": 2}}
    )
    (options,) = inference_actor_options(_placement(topology, ["engine0"]))
    assert options["num_gpus"] == 1.0 and options["num_cpus"] == 2


def test_colocated_engines_share_the_trainer_bundles_half_and_half():
    topology = Topology.model_validate(
        {
            "inference": {"backend": "vllm", "engines": 2, "gpu_memory_utilization": 0.4},
            "trainer": {"gpus": 2, "strategy": "ddp", "cpus": 8},
            "colocated": True,
        }
    )
    # colocated: engine i's role is the trainer group's bundle i (plan_groups)
    options = inference_actor_options(_placement(topology, ["shared0", "shared1"]))
    # the front actor takes half of the rank's CPU share; the vLLM engine actor holds the GPU
    assert [o["num_cpus"] for o in options] == [2.0, 2.0]
    assert [o["scheduling_strategy"] for o in options] == ["shared0[0]", "shared1[0]"]


def test_env_workers_take_a_bundle_each_of_their_group():
    topology = Topology.model_validate({"env_workers": {"count": 3, "cpus_each": 1.5}})
    options = env_worker_options(_placement(topology, ["engine0"]))
    assert options == [
        {"num_cpus": 1.5, "num_gpus": 0.0, "scheduling_strategy": f"env_workers[{i}]"}
        for i in range(3)
    ]
    none = Topology.model_validate({"env_workers": {"count": 0}})
    assert env_worker_options(_placement(none, ["engine0"])) == []


def test_transformers_engines_build_request_batching_policies():
    topology = Topology.local_default()
    options = {
        "generate_kwargs": {"max_new_tokens": 4},
        "batch_rows": 16,
        "batching_timeout_s": 0.25,
        "threads": 2,
    }
    engines = start_engines(
        placement=_placement(topology, ["engine0"]), model="tiny", dtype="float32", **options
    )
    assert engines.vllm_engines == []
    # a CPU engine (the local default's role spec), with the stage's options passed through
    assert engines.factories == [
        TransformersEngine(model="tiny", dtype="float32", device="cpu", **options)
    ]


def test_a_transformers_engine_serves_the_step_rows_in_one_call(tiny_model_dir):
    policy = _engine(tiny_model_dir, {"max_new_tokens": 4}, batch_rows=8)()
    assert policy.batching["min_batch_size"] == 8 and policy.batching["max_batch_size"] == 8
    assert not any(p.requires_grad for p in policy.model.parameters())
    assert not policy.compile_decode


def test_each_engine_samples_from_its_own_seed_with_the_stage_decode_setting():
    topology = Topology.model_validate({"inference": {"backend": "transformers", "engines": 3}})
    engines = start_engines(
        placement=_placement(topology, ["engine0", "engine1", "engine2"]),
        model="tiny",
        dtype="float32",
        generate_kwargs={},
        batch_rows=4,
        batching_timeout_s=0.25,
        threads=None,
        runtime_env=None,
        seed=7,
        compile_decode=True,
    )
    assert [factory.seed for factory in engines.factories] == [7, 8, 9]
    assert all(factory.compile_decode for factory in engines.factories)


def _engine(model_dir, generate_kwargs: dict, **options) -> TransformersEngine:
    """A CPU float32 engine over the tiny model."""
    return TransformersEngine(
        model=str(model_dir),
        dtype="float32",
        device="cpu",
        generate_kwargs=generate_kwargs,
        **options,
    )


def _two_steps(tiny_model_dir, seed: int | None) -> list[list[int]]:
    """The tokens a freshly built engine samples in two calls (two GRPO steps)."""
    kwargs = {"max_new_tokens": 6, "do_sample": True, "temperature": 1.0}
    policy = _engine(tiny_model_dir, kwargs, batch_rows=3, seed=seed)()
    return [
        [t for row in policy(history_batch())["tokens"].as_list("response") for t in row.tolist()]
        for _ in range(2)
    ]


def test_a_seeded_engine_draws_the_same_samples_when_rebuilt(tiny_model_dir):
    torch.manual_seed(123)  # what the caller's process did before does not matter
    first = _two_steps(tiny_model_dir, seed=5)
    torch.manual_seed(456)
    assert _two_steps(tiny_model_dir, seed=5) == first
    assert first[0] != first[1]  # one stream: the second step is a new draw, not a replay
    assert _two_steps(tiny_model_dir, seed=6) != first
