"""A GRPO config checked against its topology: each problem names the field to change."""

from __future__ import annotations

import pytest
import yaml

from llmrl.config.grpo import TOPOLOGY_ENV, GRPOConfig
from llmrl.core.config_loading import ConfigError
from llmrl.runtime import describe, resolve_topology
from llmrl.topology import Topology


def _config(**fields) -> GRPOConfig:
    return GRPOConfig.model_validate({"data": {"path": "d"}, **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"prompts_per_step": 3, "topology": {"env_workers": {"count": 2}}},
            "prompts_per_step: each of the 2 env workers (topology.env_workers.count) draws an "
            "equal share of a step's prompts; must be a multiple of 2, got 3",
        ),
        (
            {"topology": {"env_workers": {"count": 0}}},
            "topology.env_workers.count: the GRPO runtime runs the environments in env workers; "
            "must be >= 1",
        ),
        (
            {"reference": True, "topology": {"reference": {"placement": "none"}}},
            "topology.reference.placement: `reference: true` needs a reference model",
        ),
        (
            {
                "lora": {"enabled": True},
                "topology": {"trainer": {"gpus": 0, "ranks": 2, "strategy": "fsdp"}},
            },
            "lora.enabled: LoRA adapters are not sharded by llmrl's FSDP path",
        ),
        (
            {
                "runtime": {"compile_decode": True},
                "topology": {"inference": {"backend": "vllm", "gpus_per_engine": 1}},
            },
            "runtime.compile_decode: compiles the transformers engines' decode step; the vllm "
            "backend captures its own graphs (set it to false)",
        ),
    ],
)
def test_a_config_that_cannot_run_on_its_topology_is_refused(fields, message):
    with pytest.raises(ValueError, match="validation error") as raised:
        _config(**fields)
    assert message in str(raised.value)


def test_the_topology_comes_from_the_config_then_the_mounted_file_then_the_default(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(TOPOLOGY_ENV, raising=False)
    assert resolve_topology(_config()) == Topology.local_default()
    mounted = tmp_path / "topology.yaml"
    values = {"topology": {"trainer": {"gpus": 0, "ranks": 2, "strategy": "ddp"}}}
    mounted.write_text(yaml.safe_dump(values))  # a Helm values file, as the chart mounts it
    monkeypatch.setenv(TOPOLOGY_ENV, str(mounted))
    assert resolve_topology(_config()).trainer.world_size == 2
    given = _config(topology={"env_workers": {"count": 1}})
    assert resolve_topology(given).env_workers.count == 1  # the config wins


def test_a_mounted_topology_that_cannot_run_the_config_names_its_file(tmp_path, monkeypatch):
    mounted = tmp_path / "topology.yaml"
    mounted.write_text(yaml.safe_dump({"env_workers": {"count": 3}}))
    monkeypatch.setenv(TOPOLOGY_ENV, str(mounted))
    with pytest.raises(ConfigError) as raised:
        resolve_topology(_config(prompts_per_step=4))
    assert f"topology ({mounted}): prompts_per_step: each of the 3 env workers" in str(raised.value)


def test_describe_names_every_role():
    assert describe(Topology.local_default()) == (
        "1 transformers engine(s), 2 env worker(s), 1 trainer rank(s) (single, 0 GPU(s)), "
        "reference with_trainer, disaggregated"
    )
