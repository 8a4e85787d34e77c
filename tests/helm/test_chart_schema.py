"""The helm/llmrl chart's values schema and topology guard: generated and current, draft-07,
and refusing every invalid topology the Python spec refuses, with the same message."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import jsonschema
import pytest

from deploy.chart_values import ChartValues
from llmrl.topology import Topology
from tests.helm.chart_objects import render
from tests.support.chart import CHART, VALUE_SETS
from tests.support.paths import REPO
from tests.support.topologies import INVALID as SPEC_INVALID

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

pytestmark = pytest.mark.integration  # the real Helm engine renders and lints the chart


@pytest.mark.parametrize("name", VALUE_SETS)
def test_values_validate_as_chart_values(chart, name):
    merged = chart.merge_values(VALUE_SETS[name])
    ChartValues.model_validate(merged)
    chart.validate_schema(VALUE_SETS[name])


def test_schema_is_current():
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chart_schema.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert chart_schema_text() == (CHART / "values.schema.json").read_text()


def chart_schema_text() -> str:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import chart_schema
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return chart_schema.render_schema()


def test_schema_check_detects_drift(tmp_path):
    stale = tmp_path / "values.schema.json"
    stale.write_text((CHART / "values.schema.json").read_text().replace('"vllm"', '"tgi"', 1))
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "chart_schema.py"),
            "--check",
            "--output",
            str(stale),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "is out of date" in result.stderr


def test_schema_is_draft07_without_refs():
    text = (CHART / "values.schema.json").read_text()
    schema = json.loads(text)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert "$ref" not in text and "$defs" not in text
    jsonschema.Draft7Validator.check_schema(schema)
    assert (
        schema["properties"]["topology"]["properties"]["inference"]["additionalProperties"] is False
    )


INVALID_TOPOLOGIES = [
    pytest.param(
        {
            "colocated": True,
            "inference": {"engines": 2, "tensor_parallel_size": 2},
            "trainer": {"gpus": 2, "strategy": "ddp"},
        },
        r"topology\.trainer\.gpus: colocated .* \(2 x 2 = 4\), got 2",
        id="colocated-mismatch-fail-guard",
    ),
    pytest.param(
        {"inference": {"tensor_parallel_size": 2, "gpus_per_engine": 1}},
        r"topology\.inference\.gpus_per_engine: .* must equal .*tensor_parallel_size \(2\), .*1",
        id="gpus-per-engine-fail-guard",
    ),
    pytest.param(
        {"inference": {"backend": "transformers", "tensor_parallel_size": 2}},
        r"/topology/inference/tensor_parallel_size",
        id="transformers-tp-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 4, "strategy": "single"}},
        r"/topology/trainer/gpus.*maximum",
        id="single-gpus-schema",
    ),
    pytest.param(
        {"reference": {"placement": "dedicated", "gpus": 0}},
        r"/topology/reference/gpus.*minimum",
        id="dedicated-reference-schema",
    ),
    pytest.param(
        {"inference": {"backend": "transformers", "gpus_per_engine": 2}},
        r"/topology/inference/gpus_per_engine.*one of 0, 1",
        id="transformers-gpus-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 0, "strategy": "ddp"}},
        r"/topology/trainer/gpus': minimum: got 0, want 2",
        id="ddp-needs-2-ranks-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 0, "ranks": 2, "strategy": "single"}},
        r"/topology/trainer/ranks.*one of 1",
        id="single-is-one-rank-schema",
    ),
    pytest.param(
        {"trainer": {"gpus": 2, "ranks": 4, "strategy": "fsdp"}},
        r"topology\.trainer\.ranks: each rank of a GPU trainer drives one GPU; must equal "
        r"trainer\.gpus \(2\) or be left out \(got 4\)",
        id="one-rank-per-gpu-fail-guard",
    ),
    pytest.param(
        {"trainer": {"ranks": 2, "strategy": "ddp"}},  # gpus stays at the chart's 1
        r"topology\.trainer\.ranks: .* set trainer\.gpus to 0 for CPU ranks",
        id="cpu-ranks-need-gpus-0-fail-guard",
    ),
    pytest.param(
        {"inference": {"engine": 2}},
        r"additional properties 'engine' not allowed",
        id="unknown-key-schema",
    ),
    pytest.param(
        {"inference": {"engines": 0}}, r"/topology/inference/engines.*minimum", id="bounds-schema"
    ),
]


@pytest.mark.parametrize(("topology", "message"), INVALID_TOPOLOGIES)
def test_invalid_topology_does_not_render(chart, topology, message):
    with pytest.raises(helm.HelmError, match=message):
        render(chart, {"topology": topology})
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        ChartValues.model_validate(chart.merge_values({"topology": topology}))


@pytest.fixture(scope="module")
def chart_without_schema(tmp_path_factory):
    """A copy of the chart without values.schema.json (as with --skip-schema-validation)."""
    copy_dir = tmp_path_factory.mktemp("chart") / "llmrl"
    shutil.copytree(CHART, copy_dir)
    (copy_dir / "values.schema.json").unlink()
    with helm.Chart.load(copy_dir) as loaded:
        yield loaded


@pytest.mark.parametrize(("topology", "message"), SPEC_INVALID)
def test_fail_guard_mirrors_every_topology_rule(chart_without_schema, topology, message):
    # The template guard alone (no schema) rejects what Topology rejects, with the same (first)
    # message, prefixed with "topology.": both come from llmrl/topology/rules.py.
    values = chart_without_schema.merge_values({"topology": topology})["topology"]
    with pytest.raises(ValueError, match=message) as refused:
        Topology.model_validate(values)
    first = refused.value.errors()[0]["ctx"]["error"].args[0].splitlines()[0]
    with pytest.raises(helm.HelmRenderError, match=re.escape(f"topology.{first}")):
        render(chart_without_schema, {"topology": topology})
