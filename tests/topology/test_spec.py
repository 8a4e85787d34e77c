"""Topology: every validation rule by its message, totals, the local default, YAML round trip."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from llmrl.config import ConfigError, dump_config, load_config
from llmrl.topology import InferenceSpec, Topology, TrainerSpec
from tests.support.chart import CHART
from tests.support.topologies import INVALID, chart_topology


@pytest.mark.parametrize(("data", "message"), INVALID)
def test_each_rule_fails_with_a_message_naming_the_field(data, message):
    with pytest.raises(ValidationError, match=message):
        Topology.model_validate(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"inference": {"engines": 0}}, "greater than or equal to 1"),
        ({"inference": {"tensor_parallel_size": 0}}, "greater than or equal to 1"),
        ({"inference": {"gpu_memory_utilization": 0}}, "greater than 0"),
        ({"inference": {"gpu_memory_utilization": 1.5}}, "less than or equal to 1"),
        ({"inference": {"backend": "tgi"}}, "'vllm' or 'transformers'"),
        ({"trainer": {"gpus": -1}}, "greater than or equal to 0"),
        ({"trainer": {"strategy": "zero3"}}, "'single', 'ddp' or 'fsdp'"),
        ({"env_workers": {"count": -1}}, "greater than or equal to 0"),
        ({"env_workers": {"cpus_each": 0}}, "greater than 0"),
        ({"reference": {"placement": "elsewhere"}}, "'with_trainer', 'dedicated' or 'none'"),
    ],
)
def test_field_bounds(data, message):
    with pytest.raises(ValidationError, match=message):
        Topology.model_validate(data)


def test_several_problems_are_reported_together():
    with pytest.raises(ValidationError) as caught:
        Topology.model_validate(
            {"trainer": {"strategy": "fsdp", "gpus": 1}, "reference": {"placement": "dedicated"}}
        )
    text = str(caught.value)
    assert "trainer.gpus:" in text and "reference.gpus:" in text


def test_gpus_per_engine_is_derived_from_the_backend():
    assert InferenceSpec(tensor_parallel_size=4).engine_gpus == 4
    assert InferenceSpec(backend="transformers").engine_gpus == 0
    assert InferenceSpec(tensor_parallel_size=2, gpus_per_engine=2).engine_gpus == 2
    assert InferenceSpec(backend="transformers", gpus_per_engine=1).engine_gpus == 1
    spec = InferenceSpec()
    spec.tensor_parallel_size = 8  # unset gpus_per_engine follows the new size
    assert spec.engine_gpus == 8


@pytest.mark.parametrize(
    ("trainer", "world_size"),
    [
        ({}, 1),  # one GPU, one rank
        ({"gpus": 0}, 1),
        ({"gpus": 8, "strategy": "fsdp"}, 8),  # one rank per GPU
        ({"gpus": 4, "ranks": 4, "strategy": "ddp"}, 4),
        ({"gpus": 0, "ranks": 2, "strategy": "ddp"}, 2),  # CPU ranks
        ({"gpus": 0, "ranks": 1}, 1),
    ],
)
def test_trainer_world_size(trainer, world_size):
    assert Topology.model_validate({"trainer": trainer}).trainer.world_size == world_size


def test_valid_combinations():
    Topology.model_validate({"trainer": {"strategy": "ddp", "gpus": 2}})
    Topology.model_validate({"trainer": {"strategy": "ddp", "gpus": 0, "ranks": 2}})
    Topology.model_validate({"inference": {"backend": "transformers", "gpus_per_engine": 1}})
    Topology.model_validate({"reference": {"placement": "dedicated", "gpus": 1}})
    Topology.model_validate({"reference": {"placement": "none"}})
    Topology.model_validate({"env_workers": {"count": 0}})
    Topology.model_validate(
        {
            "colocated": True,
            "inference": {"engines": 4, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.4},
            "trainer": {"gpus": 8, "strategy": "fsdp"},
        }
    )


def test_local_default_fits_a_two_core_machine():
    topology = Topology.local_default()
    assert topology.total_cpus <= 2
    assert topology.total_gpus == 0
    assert topology.inference.backend == "transformers"
    assert topology.inference.engine_gpus == 0
    assert topology.trainer.gpus == 0 and topology.trainer.strategy == "single"
    assert topology.reference.placement == "with_trainer"
    assert topology.env_workers.count == 2 and topology.env_workers.cpus_each == 0.5


@pytest.mark.parametrize(
    ("example", "gpus", "cpus", "memory_gb"),
    [
        (None, 3, 20.0, 136.0),  # 2 engines x 1 GPU + 1 trainer GPU
        ("single-node-8gpu.yaml", 8, 80.0, 800.0),  # colocated: the trainer's 8 GPUs
        ("two-node-disaggregated.yaml", 16, 144.0, 1600.0),  # 4 x TP2 + 8 trainer GPUs
        ("cpu-dev.yaml", 0, 3.0, 12.0),
        ("cpu-ddp.yaml", 0, 4.0, 14.0),  # 2 CPU ranks share the trainer's 2 cores
        ("model-roles.yaml", 8, 72.0, 768.0),  # + a TP2 teacher; the judge is served (url)
    ],
)
def test_totals_of_the_chart_topologies(example, gpus, cpus, memory_gb):
    topology = Topology.model_validate(chart_topology(example))
    assert topology.total_gpus == gpus
    # float64 sums of a few decimal amounts (e.g. 0.5 CPU): ~1e-16 relative, within approx's rel
    assert topology.total_cpus == pytest.approx(cpus)
    assert topology.total_memory_gb == pytest.approx(memory_gb)


def test_a_dedicated_reference_adds_its_resources():
    shared = Topology(trainer=TrainerSpec(gpus=2, strategy="ddp"))
    dedicated = Topology.model_validate(
        {
            "trainer": {"gpus": 2, "strategy": "ddp"},
            "reference": {"placement": "dedicated", "gpus": 1},
        }
    )
    assert dedicated.total_gpus == shared.total_gpus + 1
    assert dedicated.total_cpus == shared.total_cpus + dedicated.reference.cpus
    colocated = Topology.model_validate(
        {
            "colocated": True,
            "inference": {"engines": 2, "gpu_memory_utilization": 0.5},
            "trainer": {"gpus": 2, "strategy": "ddp"},
            "reference": {"placement": "dedicated", "gpus": 1},
        }
    )
    assert colocated.total_gpus == 3


def test_yaml_round_trip_through_load_config(tmp_path):
    topology = Topology.model_validate(chart_topology("two-node-disaggregated.yaml"))
    path = tmp_path / "topology.yaml"
    path.write_text(dump_config(topology))
    assert load_config(Topology, path) == topology
    assert load_config(Topology, path, ["env_workers.count=3"]).env_workers.count == 3


def test_load_config_reports_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "colocated": True,
                "inference": {"engines": 2, "tensor_parallel_size": 2},
                "trainer": {"gpus": 2, "strategy": "ddp"},
            }
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_config(Topology, path)
    assert caught.value.problems == [
        f"{path}: trainer.gpus: colocated inference and training share the same GPUs, so it must "
        "equal inference.engines * inference.tensor_parallel_size (2 x 2 = 4), got 2"
    ]
    path.write_text("inference:\n  engine: 2\n")
    with pytest.raises(ConfigError, match=r"unknown key 'inference\.engine'.*'engines'"):
        load_config(Topology, path)


@pytest.mark.parametrize(
    "data",
    [
        {"inference": {"backend": "transformers", "tensor_parallel_size": 2}},
        {"inference": {"backend": "transformers", "gpus_per_engine": 2}},
        {"trainer": {"gpus": 2}},
        {"trainer": {"gpus": 0, "ranks": 2}},
        {"trainer": {"strategy": "fsdp", "gpus": 1}},
        {"trainer": {"strategy": "ddp"}},
        {"trainer": {"strategy": "ddp", "gpus": 0}},
        {"trainer": {"strategy": "ddp", "gpus": 0, "ranks": 1}},
        {"reference": {"placement": "dedicated"}},
        {"reference": {"gpus": 1}},
        {"colocated": True, "inference": {"backend": "transformers"}},
    ],
)
def test_json_schema_rejects_what_the_model_rejects(data):
    # The if/then clauses of the JSON schema (Helm's values.schema.json) mirror the simple rules.
    with pytest.raises(ValidationError):
        Topology.model_validate(data)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, Topology.model_json_schema())


@pytest.mark.parametrize(
    "data",
    [
        {"trainer": {"strategy": "ddp", "gpus": 0, "ranks": 2}},
        {"trainer": {"strategy": "fsdp", "gpus": 8}},
        {"trainer": {"strategy": "single", "gpus": 1, "ranks": 1}},
        {"inference": {"backend": "transformers", "gpus_per_engine": 1}},
    ],
)
def test_json_schema_accepts_what_the_model_accepts(data):
    Topology.model_validate(data)
    jsonschema.validate(data, Topology.model_json_schema())


@pytest.mark.parametrize(
    "example", [None, *sorted(path.name for path in (CHART / "examples").glob("*.yaml"))]
)
def test_json_schema_accepts_the_chart_topologies(example):
    data = chart_topology(example)
    Topology.model_validate(data)
    jsonschema.validate(data, Topology.model_json_schema())
    jsonschema.validate(
        Topology.local_default().model_dump(mode="json"), Topology.model_json_schema()
    )


def test_a_vllm_engine_on_cpu_needs_no_gpu():
    from llmrl.topology.placement import plan_groups

    topology = Topology(
        inference={"backend": "vllm", "gpus_per_engine": 0, "cpus_per_engine": 0.5},
        trainer={"gpus": 0, "ranks": 2, "strategy": "ddp", "cpus": 1.0},
    )
    assert topology.inference.engine_gpus == 0 and topology.total_gpus == 0
    groups = plan_groups(topology).groups
    assert groups[0].label == "inference[0]" and groups[0].bundles == ({"CPU": 0.5},)
