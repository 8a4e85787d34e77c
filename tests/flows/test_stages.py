"""The stage table and what flows/ derives from it."""

from __future__ import annotations

from flows.launchers import STAGE_COMMANDS, stage_arguments
from flows.stages import (
    COMMANDS,
    EVALUATED,
    RAY_STAGES,
    RUN_ORDER,
    SPECS,
    STAGE_SPECS,
    STARTABLE,
    TITLES,
    TOPOLOGY_STAGES,
    TRAINING_DRIVERS,
    command_of,
    output_of,
)


def test_the_graph() -> None:
    assert RUN_ORDER == ("prepare", "sft", "grpo", "eval-base", "eval-sft", "eval-grpo")
    assert {s.name: s.reads for s in STAGE_SPECS} == {
        "prepare": (),
        "sft": ("prepare",),
        "grpo": ("prepare", "sft"),
        "eval-base": ("prepare",),
        "eval-sft": ("prepare", "sft"),
        "eval-grpo": ("prepare", "grpo"),
    }
    assert {s.name: s.model_from for s in STAGE_SPECS if s.model_from} == {
        "grpo": "sft",
        "eval-sft": "sft",
        "eval-grpo": "grpo",
    }
    # Every stage reads only stages that run before it, and its model from one it reads.
    for index, spec in enumerate(STAGE_SPECS):
        assert set(spec.reads) <= set(RUN_ORDER[:index])
        assert spec.model_from is None or spec.model_from in spec.reads


def test_what_is_derived() -> None:
    assert COMMANDS == STAGE_COMMANDS == ("prepare", "sft", "grpo", "eval")
    assert (RAY_STAGES, TRAINING_DRIVERS, TOPOLOGY_STAGES) == (("sft", "grpo"), ("sft",), ("grpo",))
    assert STARTABLE == ("prepare", "sft", "grpo")
    assert EVALUATED == ("base", "sft", "grpo")
    assert TITLES == {"base": "base model", "sft": "after SFT", "grpo": "after GRPO"}
    assert [command_of(n) for n in ("eval-sft", "evaluate", "grpo")] == ["eval", "eval", "grpo"]
    assert SPECS["eval-grpo"].evaluates == "grpo"
    assert [output_of(c) for c in (*COMMANDS, "other")] == [
        "dataset",
        "model",
        "model",
        "report",
        "report",
    ]
    assert stage_arguments("eval", None, ["label=sft"])[:2] == ["eval", "--no-progress"]
