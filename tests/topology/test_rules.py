"""The topology's rule table: one topology per rule, the schema it yields, the generated chart
files (the chart's values schema and guard template) kept current."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from deploy.chart_files import generated_files, render_guard
from llmrl.topology import (
    MODEL_ROLES,
    InferenceSpec,
    ModelRoleSpec,
    ReferenceSpec,
    Topology,
    TrainerSpec,
)
from llmrl.topology.derived import MODEL_ROLE_DEFAULTS, ROLE_ENGINE_GPUS
from llmrl.topology.expressions import Compare, Const, Field, In, IsNull, NotInSchema
from llmrl.topology.optional import FilledField, Present
from llmrl.topology.rules import RULES, FirstOf, Rule, all_rules, problems

REPO = Path(__file__).resolve().parents[2]
SECTIONS = {"inference": InferenceSpec, "trainer": TrainerSpec, "reference": ReferenceSpec}
SECTIONS |= {role: ModelRoleSpec for role in MODEL_ROLES}
URL = "http://judge:8000"

BREAKS_ONE_RULE: list[dict[str, Any]] = [  # the i-th breaks the i-th rule of all_rules(), only
    {"inference": {"backend": "transformers", "tensor_parallel_size": 2}},
    {"inference": {"backend": "transformers", "gpus_per_engine": 2}},
    {"inference": {"tensor_parallel_size": 2, "gpus_per_engine": 1}},
    {"trainer": {"gpus": 2, "ranks": 4, "strategy": "fsdp"}},
    {"trainer": {"gpus": 2}},
    {"trainer": {"gpus": 0, "ranks": 2}},
    {"trainer": {"gpus": 1, "strategy": "ddp"}},
    {"trainer": {"gpus": 0, "ranks": 1, "strategy": "ddp"}},
    {"reference": {"placement": "dedicated"}},
    {"reference": {"gpus": 1}},
    {"colocated": True, "inference": {"backend": "transformers"}},
    {"colocated": True, "inference": {"engines": 2}},
    {"colocated": True, "inference": {"gpu_memory_utilization": 1.0}},
    {"inference": {"backend": "transformers"}, "weight_transport": "vllm"},
    {"weight_transport": "broadcast"},
    *(
        {role: data}
        for role in MODEL_ROLES
        for data in (  # each model role's rules, in order
            {},
            {"model": "m", "url": URL},
            {"model": "m", "served_model": "m"},
            {"url": URL, "engines": 2},
            {"url": URL, "tensor_parallel_size": 2},
            {"url": URL, "gpus_per_engine": 1},
            {"model": "m", "backend": "transformers", "tensor_parallel_size": 2},
            {"model": "m", "backend": "transformers", "gpus_per_engine": 2},
            {"model": "m", "tensor_parallel_size": 2, "gpus_per_engine": 1},
        )
    ),
]


def unchecked(data: dict[str, Any]) -> Topology:
    """A Topology of ``data`` whose sections are validated but not the rules across them."""
    sections = {
        name: SECTIONS[name].model_validate(data[name]) for name in SECTIONS if name in data
    }
    scalars = {key: value for key, value in data.items() if key not in SECTIONS}
    return Topology.model_construct(**sections, **scalars)


def has_clause(rule: Rule) -> bool:
    """Whether JSON Schema states the rule (else only the chart's guard template checks it)."""
    try:
        rule.when.schema(Topology.schema_defaults())
        rule.require.schema(Topology.schema_defaults())
    except NotInSchema:
        return False
    return True


@pytest.mark.parametrize(
    ("rule", "data"),
    zip(all_rules(), BREAKS_ONE_RULE, strict=True),
    ids=[f"{index}-{rule.field}" for index, rule in enumerate(all_rules())],
)
def test_each_rule_has_a_topology_that_breaks_it_alone(rule, data):
    topology = unchecked(data)
    assert [r for r in all_rules() if r.broken(topology)] == [rule]
    message = rule.problem(topology)
    assert message.startswith(f"{rule.field}: ")
    assert problems(topology) == [message]
    with pytest.raises(ValidationError) as caught:
        Topology.model_validate(data)
    assert caught.value.errors()[0]["ctx"]["error"].args == (message,)
    validator = jsonschema.Draft7Validator(Topology.model_json_schema())
    assert validator.is_valid(data) is not has_clause(rule)


def test_a_first_of_group_reports_its_first_broken_rule_only():
    (group,) = [entry for entry in RULES if isinstance(entry, FirstOf)]
    topology = unchecked({"trainer": {"gpus": 2, "ranks": 3, "strategy": "single"}})
    broken = [rule for rule in group.rules if rule.broken(topology)]
    assert len(broken) == 3  # ranks != gpus, single on 2 GPUs, single on 3 ranks
    assert problems(topology) == [broken[0].problem(topology)]
    assert problems(topology)[0].startswith("trainer.ranks: each rank of a GPU trainer")


def _grid() -> list[dict[str, Any]]:
    """Topologies over the values the rules turn on (None: the key left out)."""
    inference = itertools.product(
        ("vllm", "transformers"), (1, 2), (None, 0, 1, 2), (None, 0.5, 1.0)
    )
    rest = itertools.product((None, 0, 1, 2), (None, 1, 2), (None, "single", "ddp", "fsdp"))
    others = itertools.product((None, "dedicated", "none"), (None, 0, 1), (None, True))
    transports = (None, "vllm", "broadcast")
    combinations = itertools.product(inference, rest, others, transports)
    roles = _model_role_grid()
    found = []
    # every 17th of the 124,416 combinations: a spread sample that keeps the test to seconds
    for index, combination in enumerate(itertools.islice(combinations, 0, None, 17)):
        (backend, tp, gpe, memory), (gpus, ranks, strategy), (place, ref, col), transport = (
            combination
        )
        data = roles[index % len(roles)] | {
            "inference": {"backend": backend, "tensor_parallel_size": tp}
            | ({"gpus_per_engine": gpe} if gpe is not None else {})
            | ({"gpu_memory_utilization": memory} if memory is not None else {}),
            "trainer": {"gpus": gpus, "ranks": ranks, "strategy": strategy},
            "reference": {"placement": place, "gpus": ref},
            "colocated": col,
            "weight_transport": transport,
        }
        found.append(_without_nones(data))
    return found


def _model_role_grid() -> list[dict[str, Any]]:
    """Model roles over the values their rules turn on, one role set in each (and none)."""
    values = itertools.product(
        (None, "m"), (None, URL), (None, "m"), (None, "transformers"), (1, 2), (1, 2)
    )
    found: list[dict[str, Any]] = [{}]
    for role, combination in itertools.product(MODEL_ROLES, values):
        model, url, served, backend, engines, tp = combination
        for gpe in (None, 0, 1, 2):
            spec = {"model": model, "url": url, "served_model": served, "backend": backend}
            spec |= {"engines": engines, "tensor_parallel_size": tp, "gpus_per_engine": gpe}
            found.append({role: {key: value for key, value in spec.items() if value is not None}})
    return found


def _without_nones(data: dict[str, Any]) -> dict[str, Any]:
    return {
        key: _without_nones(value) if isinstance(value, dict) else value
        for key, value in data.items()
        if value is not None
    }


def test_the_json_schema_refuses_exactly_what_its_rules_refuse():
    # The schema's if/then clauses (generated from the rules) refuse a topology exactly when a
    # rule JSON Schema can state is broken; what it refuses, the model refuses too.
    validator = jsonschema.Draft7Validator(Topology.model_json_schema())
    stated = [rule for rule in all_rules() if has_clause(rule)]
    grid = _grid() + _model_role_grid()
    assert len(grid) > 7000
    for data in grid:
        topology = unchecked(data)
        in_schema = any(rule.broken(topology) for rule in stated)
        assert validator.is_valid(data) is not in_schema, data
        if in_schema:
            assert problems(topology), data


def _first_problem(data: dict[str, Any]) -> str | None:
    try:
        Topology.model_validate(data)
    except ValidationError as refused:
        return refused.errors()[0]["ctx"]["error"].args[0].splitlines()[0]
    return None


@pytest.mark.integration
def test_helm_refuses_what_the_model_refuses_with_the_same_message(tmp_path):
    # The real Helm engine renders the chart over the grid: with its values schema it refuses
    # exactly what Topology refuses; with the guard template alone (--skip-schema-validation),
    # it fails with Topology's first message, prefixed with "topology.".
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra)")
    guard_only = tmp_path / "llmrl"
    shutil.copytree(REPO / "helm" / "llmrl", guard_only)
    (guard_only / "values.schema.json").unlink()
    with helm.Chart.load(REPO / "helm" / "llmrl") as chart, helm.Chart.load(guard_only) as bare:
        # each render validates the whole schema: a sample of the grid, and of the model roles
        # alone (the rest valid, so each role's first problem is the one reported)
        for data in _grid()[::28] + _model_role_grid()[::8]:
            values = {"topology": data}
            expected = _first_problem(chart.merge_values(values)["topology"])
            for loaded in (chart, bare):
                try:
                    loaded.render(values, name="llmrl", namespace="llmrl")
                except helm.HelmError as error:
                    assert expected is not None, (data, str(error))
                    if loaded is bare:
                        assert f"topology.{expected}" in str(error), data
                else:
                    assert expected is None, data


def test_null_fields_follow_one_semantics():
    ranks = Field("trainer.ranks", nullable=True)
    left_out = Topology()
    assert Compare("<=", ranks, Const(1)).evaluate(left_out) is False  # orderings: false
    assert Compare("!=", ranks, Const(1)).evaluate(left_out) is True
    assert IsNull(ranks).evaluate(left_out) and In(ranks, (1, None)).evaluate(left_out)
    # Go: a null field never passes an ordering (`int nil` is 0 in sprig) and fails `==`
    assert Compare("<=", ranks, Const(1)).go("$t") == (
        '(and (not (kindIs "invalid" $t.trainer.ranks)) (le (int $t.trainer.ranks) 1))'
    )
    assert Compare("!=", ranks, Const(1)).go("$t") == (
        '(or (kindIs "invalid" $t.trainer.ranks) (ne (int $t.trainer.ranks) 1))'
    )
    # JSON Schema: a left-out key is its default; an ordering excludes null by type
    assert Compare(">=", ranks, Const(2)).schema(left_out, "trainer.") == {
        "properties": {"ranks": {"minimum": 2, "type": "integer"}},
        "required": ["ranks"],
    }


def test_an_optional_section_is_read_only_when_set():
    left_out, judge = Topology(), Topology(judge={"url": URL, "engines": 1})
    assert Present("judge").evaluate(left_out) is False and Present("judge").evaluate(judge)
    # no rule of a model role reads into a role left out (its fields would raise)
    assert problems(left_out) == []
    # Go: a left-out key of a set role is its default; a role left out is never read into
    engines = FilledField("judge.engines", default=MODEL_ROLE_DEFAULTS["engines"])
    assert engines.go("$t") == (
        '(int (ternary 1 $t.judge.engines (kindIs "invalid" $t.judge.engines)))'
    )
    assert Present("judge").go("$t") == '(not (kindIs "invalid" $t.judge))'
    # JSON Schema: within the role's own schema, it is set; across sections, it is an object
    assert Present("judge").schema(left_out, "judge.") == {"type": "object"}
    assert Present("judge").schema(left_out)["required"] == ["judge"]
    with pytest.raises(NotInSchema):
        Present("judge").schema(left_out, "inference.")


def test_the_model_roles_defaults_are_the_specs_and_their_gpus_derive_alike():
    fields = ModelRoleSpec.model_fields
    assert {name: fields[name].default for name in MODEL_ROLE_DEFAULTS} == MODEL_ROLE_DEFAULTS
    judges = [
        {"model": "m"},
        {"model": "m", "tensor_parallel_size": 4},
        {"model": "m", "backend": "transformers"},
        {"url": URL, "gpus_per_engine": 0},
    ]
    gpus = []
    for data in judges:
        topology = Topology.model_validate({"judge": data})
        assert ROLE_ENGINE_GPUS["judge"].evaluate(topology) == topology.judge.engine_gpus
        gpus.append(topology.judge.engine_gpus)
    assert gpus == [1, 4, 0, 0]


def test_the_guard_fails_with_every_rule_message():
    guard = render_guard()
    for rule in all_rules():
        assert f'"topology.{rule.field}: ' in guard
    assert guard.count("{{- fail ") == len(list(all_rules()))
    assert guard.startswith("{{/*\nGenerated from llmrl/topology/rules.py by make chart-schema")


@pytest.mark.parametrize("path", sorted(generated_files(), key=str), ids=str)
def test_generated_chart_files_are_current(path):
    committed = (REPO / path).read_text(encoding="utf-8")
    assert committed == generated_files()[path], f"{path} is stale: run make chart-schema"
