"""The model roles of a topology (teacher, judge, reward_model): validation naming the field,
their totals, role specs, pod groups and placement plans (no Ray)."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from llmrl.config import ConfigError, load_config
from llmrl.topology import MODEL_ROLES, ModelRoleSpec, Topology
from llmrl.topology.placement import plan_groups, requested_resources
from llmrl.topology.roles import ModelRole, PodGroup, role_specs

URL = "http://judge.llm.svc:8000"
CPU = {  # the local default's roles on CPU
    "inference": {"backend": "transformers", "cpus_per_engine": 0.5, "memory_gb": 2},
    "trainer": {"gpus": 0, "cpus": 0.5, "memory_gb": 4},
    "env_workers": {"count": 1, "cpus_each": 0.5, "memory_gb": 1},
}
ROLES = Topology.model_validate(
    {
        "teacher": {"model": "t", "tensor_parallel_size": 2, "cpus_per_engine": 6, "memory_gb": 80},
        "judge": {"url": URL, "served_model": "judge-32b"},
        "reward_model": {
            "model": "rm",
            "backend": "transformers",
            "engines": 2,
            "gpus_per_engine": 1,
            "cpus_per_engine": 2,
            "memory_gb": 16,
        },
    }
)


@pytest.mark.parametrize(
    ("role", "data", "message"),
    [
        ("judge", {}, r"judge\.model: required unless url is set"),
        (
            "teacher",
            {"model": "m", "url": URL},
            r"teacher\.model: set exactly one of model and url",
        ),
        ("judge", {"model": "m", "served_model": "m"}, r"judge\.served_model: names the model of"),
        ("judge", {"url": URL, "engines": 2}, r"judge\.engines: a served endpoint .* \(got 2\)"),
        (
            "reward_model",
            {"url": URL, "gpus_per_engine": 2},
            r"reward_model\.gpus_per_engine: a served endpoint \(url\) places no engines, so it "
            r"gets no GPUs; must be 0 or left out \(got 2\)",
        ),
        (
            "teacher",
            {"url": URL, "tensor_parallel_size": 4},
            r"teacher\.tensor_parallel_size: a served endpoint .* must be 1 \(got 4\)",
        ),
        (
            "judge",
            {"model": "m", "backend": "transformers", "tensor_parallel_size": 2},
            r"judge\.tensor_parallel_size: the transformers backend .* must be 1 \(got 2\)",
        ),
        (
            "judge",
            {"model": "m", "backend": "transformers", "gpus_per_engine": 2},
            r"judge\.gpus_per_engine: the transformers backend .* must be 0 or 1 \(got 2\)",
        ),
    ],
)
def test_each_model_role_rule_fails_naming_the_roles_field(role, data, message):
    with pytest.raises(ValidationError, match=message):
        Topology.model_validate({role: data})
    # the chart's values schema refuses it too (the rules' if/then clauses)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({role: data}, Topology.model_json_schema())


def test_a_rule_on_the_derived_gpus_is_left_to_the_model_and_the_guard():
    data = {"teacher": {"model": "m", "tensor_parallel_size": 2, "gpus_per_engine": 1}}
    message = (
        r"teacher\.gpus_per_engine: .* must equal teacher\.tensor_parallel_size \(2\), .*got 1"
    )
    with pytest.raises(ValidationError, match=message):
        Topology.model_validate(data)
    jsonschema.validate(data, Topology.model_json_schema())  # JSON Schema cannot derive


@pytest.mark.parametrize("url", ["judge:8000", "ftp://judge", "HTTP//judge", ""])
def test_a_url_must_be_http_and_the_error_names_it(tmp_path, url):
    with pytest.raises(ValidationError) as caught:
        Topology.model_validate({"judge": {"url": url}})
    (error,) = caught.value.errors()
    assert error["loc"] == ("judge", "url")
    assert "must start with http:// or https://" in error["msg"]
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        jsonschema.validate({"judge": {"url": url}}, Topology.model_json_schema())
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump({"judge": {"url": url}}))
    with pytest.raises(ConfigError) as loaded:
        load_config(Topology, path)
    assert loaded.value.problems[0].startswith(f"{path}: judge.url: must start with http://")


def test_valid_model_roles_pass_both_the_model_and_the_schema():
    for data in (
        {"judge": {"url": "https://judge.example.com/v1"}},
        {"judge": {"url": URL, "served_model": "j", "gpus_per_engine": 0}},
        {"teacher": {"model": "m", "backend": "transformers", "gpus_per_engine": 1}},
        {"reward_model": {"model": "m", "gpus_per_engine": 0, "dtype": "float32"}},
        ROLES.model_dump(mode="json"),
    ):
        Topology.model_validate(data)
        jsonschema.validate(data, Topology.model_json_schema())


def test_model_roles_are_the_set_ones_in_order_and_url_ones_place_nothing():
    assert Topology().model_roles() == {}
    assert list(ROLES.model_roles()) == list(MODEL_ROLES)
    assert list(ROLES.placed_model_roles()) == ["teacher", "reward_model"]
    assert ROLES.judge.remote and not ROLES.teacher.remote
    assert (ROLES.judge.served_model, ROLES.teacher.dtype) == ("judge-32b", "bfloat16")
    base = Topology()
    # the teacher: 1 engine of TP 2; the reward model: 2 transformers engines of 1 GPU each
    assert ROLES.model_role_gpus == 2 + 2
    assert ROLES.total_gpus == base.total_gpus + 4
    assert ROLES.total_cpus == base.total_cpus + 6 + 2 * 2
    assert ROLES.total_memory_gb == base.total_memory_gb + 80 + 2 * 16
    served = Topology.model_validate({"judge": {"url": URL, "memory_gb": 500}})
    assert (served.total_gpus, served.total_cpus, served.total_memory_gb) == (
        base.total_gpus,
        base.total_cpus,
        base.total_memory_gb,
    )


def test_each_placed_model_role_is_engines_of_its_own():
    specs = role_specs(ROLES)
    assert list(specs.models) == ["teacher", "reward_model"]  # a url role has no spec
    teacher, reward = specs.models["teacher"], specs.models["reward_model"]
    assert isinstance(teacher, ModelRole) and teacher.name == "teacher"
    # a vLLM engine of TP 2: its front actor leaves the bundles to the engine's TP workers
    assert (teacher.count, teacher.cpus, teacher.gpus, teacher.server_gpus) == (1, 0.0, 0.0, 0.0)
    assert (teacher.backend, teacher.tensor_parallel_size, teacher.device) == ("vllm", 2, "cuda")
    assert teacher.pod == PodGroup(
        name="teacher",
        replicas=1,
        cpus=6,
        gpus=2,
        memory_gb=80,
        scheduling=ROLES.teacher.scheduling,
    )
    # a transformers engine on one GPU: its front actor holds the bundle
    assert reward.actor_options("bundle") == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "scheduling_strategy": "bundle",
    }
    assert (reward.pod.name, reward.pod.replicas, reward.device) == ("reward-model", 2, "cuda")
    one_gpu = role_specs(Topology.model_validate({"judge": {"model": "m"}})).models["judge"]
    assert (one_gpu.server_gpus, one_gpu.cpus) == (1.0, 0.0)  # the vLLM engine actor's GPU
    names = [pod.name for pod in specs.pod_groups()]
    assert names == ["inference", "trainer", "env-workers", "teacher", "reward-model"]


def test_the_plan_adds_a_strict_pack_group_per_model_role_engine():
    plan = plan_groups(ROLES)
    unchanged = plan_groups(Topology())
    assert plan.groups[: len(unchanged.groups)] == unchanged.groups
    added = [(g.label, g.bundles, g.strategy) for g in plan.groups[len(unchanged.groups) :]]
    assert added == [
        ("teacher[0]", ({"GPU": 1.0, "CPU": 3.0},) * 2, "STRICT_PACK"),
        ("reward_model[0]", ({"GPU": 1.0, "CPU": 2.0},), "STRICT_PACK"),
        ("reward_model[1]", ({"GPU": 1.0, "CPU": 2.0},), "STRICT_PACK"),
    ]
    roles = {role.role: role for role in plan.roles}
    assert roles["teacher[0]"].bundle_indices == (0, 1)
    assert not any(name.startswith("judge") for name in roles)
    assert requested_resources(plan.groups) == {
        "GPU": ROLES.total_gpus,
        "CPU": ROLES.total_cpus,
    }


def test_a_cpu_topology_with_a_transformers_judge_fits_two_cores():
    topology = Topology.model_validate(
        CPU | {"judge": {"model": "m", "backend": "transformers", "cpus_per_engine": 0.5}}
    )
    assert (topology.total_gpus, topology.total_cpus) == (0, 2.0)
    judge = role_specs(topology).models["judge"]
    assert (judge.cpus, judge.gpus, judge.device, judge.server_gpus) == (0.5, 0.0, "cpu", 0.0)
    labels = [group.label for group in plan_groups(topology).groups]
    assert labels == ["inference[0]", "trainer", "env_workers", "judge[0]"]


def test_a_model_role_spec_alone_has_the_engine_fields_and_defaults():
    spec = ModelRoleSpec(model="m")
    assert (spec.backend, spec.engines, spec.engine_gpus, spec.dtype) == ("vllm", 1, 1, "bfloat16")
    assert spec.url is None and spec.served_model is None and not spec.remote
    assert ModelRoleSpec(model="m", backend="transformers").engine_gpus == 0
