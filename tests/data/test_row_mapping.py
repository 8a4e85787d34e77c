"""`llmrl prepare` on a dataset in the user's shape: the prompt from a column, a template or a chat
column, the answer and SFT target, every other column kept for the reward; errors name file, row
and field; the manifest rebuilds the same task in later stages."""

from __future__ import annotations

import json

import pytest

from llmrl.config.prepare import PrepareConfig
from llmrl.core.config_loading import ConfigError
from llmrl.data.dataset_error import DatasetError
from llmrl.data.prepare import load_prepared, prepare_dataset
from llmrl.data.row_mapping import RowMapping
from llmrl.envs.tasks.prepared import prepared_task

REWARDS = "tests.support.user_rewards"


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_template_over_columns_keeps_every_other_column():
    mapping = RowMapping("units", prompt_template="Convert {value} {unit}.")
    problem = mapping.problem(
        {"value": 2, "unit": "km", "answer": 2000, "tier": "a"}, 4, "eval", "f"
    )
    assert problem.prompt == "Convert 2 km."
    assert problem.answer == "2000"
    assert problem.id == "units-eval-00004"
    assert problem.fields == {"value": 2, "unit": "km", "tier": "a"}


def test_a_chat_column_is_the_prompt_and_its_last_assistant_turn_the_target():
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    problem = RowMapping("chat").problem({"messages": chat, "answer": "6"}, 1, "train", "f")
    assert problem.messages == chat[:-1]
    assert problem.sft_target == "6"
    assert problem.prompt == "2+2?\n\nand 3+3?"
    assert problem.fields == {}


def test_columns_rename_the_roles_and_completion_is_the_target():
    mapping = RowMapping("q", columns={"prompt": "question", "answer": "gold"})
    problem = mapping.problem(
        {"question": "Why?", "gold": "because", "completion": "Because."}, 2, "train", "f"
    )
    assert (problem.prompt, problem.answer, problem.sft_target) == ("Why?", "because", "Because.")


@pytest.mark.parametrize(
    ("mapping", "row", "field", "says"),
    [
        (
            RowMapping("t"),
            {"question": "x"},
            "prompt",
            "missing: the prompt column; the row has question",
        ),
        (RowMapping("t", prompt_template="{a} {b}"), {"a": 1}, "b", "prompt_template uses {b}"),
        (RowMapping("t"), {"prompt": 3}, "prompt", "expected text, got int"),
        (RowMapping("t"), {"prompt": "x", "blob": {1, 2}}, "blob", "not a JSON value"),
        (RowMapping("t"), {"messages": [{"role": "bot", "content": "x"}]}, "messages", "message 0"),
        (RowMapping("t", columns={"answer": "gold"}), {"prompt": "x"}, "gold", "missing"),
    ],
)
def test_an_unmappable_row_names_file_row_and_field(mapping, row, field, says):
    with pytest.raises(DatasetError) as raised:
        mapping.problem(row, 7, "train", "rows.jsonl")
    message = str(raised.value)
    assert "rows.jsonl" in message and "row 7" in message and field in message and says in message


def test_prepare_with_reward_functions_and_rebuild_the_task(tmp_path):
    source = write_rows(
        tmp_path / "units.jsonl",
        [{"question": f"{n} m in cm?", "answer": n * 100, "unit": "cm"} for n in range(1, 41)],
    )
    config = PrepareConfig(
        reward=[f"{REWARDS}:exact", {"function": f"{REWARDS}:shortest", "weight": 0.5}],
        source=source,
        prompt_template="Convert: {question}",
        instructions="Answer with a number and a unit.",
        output_dir=tmp_path / "out",
    )
    prepared = prepare_dataset(config, progress=False)
    assert prepared.path.name.startswith("reward-functions-")
    train, evals = load_prepared(prepared.path)
    assert len(train) + len(evals) == 40 and evals  # a hash split, ~10% eval
    first = next(p for p in train + evals if p.fields["question"] == "1 m in cm?")
    assert (first.prompt, first.answer, first.fields["unit"]) == (
        "Convert: 1 m in cm?",
        "100",
        "cm",
    )
    task, manifest = prepared_task(prepared.path)
    assert manifest["task_options"]["functions"][1]["weight"] == 0.5
    assert task.instructions == "Answer with a number and a unit."
    assert task.score("100 cm", "100", unit="cm").reward == 1.5  # 1 * exact + 0.5 * shortest
    assert prepare_dataset(config, progress=False).reused


def test_a_row_error_names_the_file_row_and_column(tmp_path):
    source = write_rows(tmp_path / "rows.jsonl", [{"prompt": "a"}, {"prompt": ""}])
    config = PrepareConfig(reward=f"{REWARDS}:raises", source=source, output_dir=tmp_path)
    with pytest.raises(DatasetError, match=r"rows.jsonl.*row 2.*prompt.*empty"):
        prepare_dataset(config, progress=False)


def test_a_task_without_generate_needs_a_source(tmp_path):
    config = PrepareConfig(task=f"{REWARDS}:UnitTask", output_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"source: required: task .*UnitTask.* has no generate"):
        prepare_dataset(config, progress=False)


def test_the_config_refuses_before_anything_starts():
    with pytest.raises(ValueError, match=r"(?s)reward.0.function.*no_pkg.*ModuleNotFoundError"):
        PrepareConfig(reward="no_pkg.rewards:score", source="x.jsonl")
    with pytest.raises(ValueError, match=r"columns.question: not a role"):
        PrepareConfig(task=f"{REWARDS}:UnitTask", source="x.jsonl", columns={"question": "q"})
    with pytest.raises(ValueError, match="set `task` or `reward`, not both"):
        PrepareConfig(task="gsm8k", reward=f"{REWARDS}:exact")
    with pytest.raises(ValueError, match="prompt_template: only for your own tasks"):
        PrepareConfig(prompt_template="{x}")


def test_a_dataset_whose_package_is_gone_is_refused_naming_it(tmp_path):
    source = write_rows(tmp_path / "r.jsonl", [{"prompt": f"p{i}"} for i in range(20)])
    prepared = prepare_dataset(
        PrepareConfig(reward=f"{REWARDS}:exact", source=source, output_dir=tmp_path / "o"),
        progress=False,
    )
    manifest_file = prepared.path / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["task_options"]["functions"][0]["function"] = "gone_pkg.rewards:exact"
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"cannot load.*gone_pkg.*runtime_env"):
        prepared_task(prepared.path)
