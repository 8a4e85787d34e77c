"""prepare_dataset / load_prepared: generated and GSM8K data, reuse, bad rows, crashes, tampers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import llmrl.data.prepare as prepare_module
from llmrl.config import ConfigError, PrepareConfig
from llmrl.data.dataset_error import DatasetError, MissingDatasetsError
from llmrl.data.prepare import load_prepared, prepare_dataset
from llmrl.data.prepared_folder import SplitWriter

GSM8K = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "gsm8k"


def good_row(i: int) -> dict:
    return {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def gsm8k_config(tmp_path: Path, source: Path, **settings) -> PrepareConfig:
    return PrepareConfig(task="gsm8k", source=str(source), output_dir=tmp_path / "out", **settings)


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


@pytest.fixture
def gsm8k_slice(tmp_path) -> Path:
    """The first 40 rows of GSM8K's train file, copied into tmp_path."""
    source = GSM8K / "train.jsonl"
    if not source.is_file():
        pytest.skip(f"GSM8K test data not found at {source}")
    with source.open(encoding="utf-8") as lines:
        head = [next(lines) for _ in range(40)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(head), encoding="utf-8")
    return path


def test_arithmetic_end_to_end(tmp_path):
    config = PrepareConfig(generate={"train_size": 30, "eval_size": 10}, output_dir=tmp_path)
    prepared = prepare_dataset(config, progress=False)
    assert not prepared.reused
    assert prepared.path.parent == tmp_path
    assert prepared.path.name.startswith("arithmetic-") and len(prepared.path.name) == 27
    assert listing(prepared.path) == ["eval.jsonl", "manifest.json", "train.jsonl"]
    assert listing(tmp_path) == [prepared.path.name]  # no temporary folder left

    manifest = json.loads((prepared.path / "manifest.json").read_text())
    assert manifest == prepared.manifest
    assert manifest["task"] == "arithmetic" and manifest["rows"] == {"train": 30, "eval": 10}
    assert manifest["source"] is None and manifest["skipped"] == {}
    assert manifest["generated"]["class"] == "llmrl.envs.tasks.arithmetic.ArithmeticTask"
    assert manifest["config"]["generate"]["train_size"] == 30
    for name in ("train.jsonl", "eval.jsonl"):
        data = (prepared.path / name).read_bytes()
        assert manifest["files"][name]["sha256"] == hashlib.sha256(data).hexdigest()
    assert {"format_version", "digest", "created_at", "task_code_sha256"} <= set(manifest)

    train, eval_problems = load_prepared(prepared.path)
    assert len(train) == 30 and len(eval_problems) == 10
    first = json.loads((prepared.path / "train.jsonl").read_text().splitlines()[0])
    assert list(first) == ["id", "prompt", "answer", "sft_target", "meta"]
    assert train[0].prompt.startswith("What is ") and train[0].sft_target.endswith(train[0].answer)
    assert not {p.prompt for p in train} & {p.prompt for p in eval_problems}


def test_gsm8k_slice_with_eval_fraction(tmp_path, gsm8k_slice):
    config = gsm8k_config(tmp_path, gsm8k_slice, split={"eval_fraction": 0.25, "seed": 0})
    prepared = prepare_dataset(config, progress=False)
    manifest = prepared.manifest
    assert manifest["rows"]["train"] + manifest["rows"]["eval"] == 40
    assert manifest["rows"]["eval"] > 0 and manifest["rows"]["train"] > manifest["rows"]["eval"]
    assert manifest["source"]["sha256"] == hashlib.sha256(gsm8k_slice.read_bytes()).hexdigest()
    assert manifest["source"]["rows_read"] == 40 and manifest["skipped"] == {}
    train, eval_problems = load_prepared(prepared.path)
    assert train[0].id == "gsm8k-train-00001" and train[0].answer == "72"
    assert train[0].sft_target.endswith("#### 72") and "<<" not in train[0].sft_target
    assert all(p.id.startswith("gsm8k-eval-") for p in eval_problems)

    # The split hashes the question with the seed: reordering rows keeps every row's split.
    lines = gsm8k_slice.read_text(encoding="utf-8").splitlines(keepends=True)
    reordered = tmp_path / "reordered.jsonl"
    reordered.write_text("".join(reversed(lines)), encoding="utf-8")
    again = prepare_dataset(gsm8k_config(tmp_path, reordered, split={"eval_fraction": 0.25}))
    train2, eval2 = load_prepared(again.path)
    assert again.path != prepared.path
    assert {p.prompt for p in eval2} == {p.prompt for p in eval_problems}
    assert {p.prompt for p in train2} == {p.prompt for p in train}


def test_second_run_reuses_without_writing(tmp_path):
    config = PrepareConfig(generate={"train_size": 20, "eval_size": 5}, output_dir=tmp_path)
    first = prepare_dataset(config, progress=False)
    paths = [first.path, *first.path.iterdir()]
    before = {path: path.stat().st_mtime_ns for path in paths}
    second = prepare_dataset(config, progress=False)
    assert second.reused and second.path == first.path
    assert second.manifest == first.manifest
    assert {path: path.stat().st_mtime_ns for path in paths} == before
    assert listing(tmp_path) == [first.path.name]


def test_changed_config_or_source_gives_a_new_folder(tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", [good_row(i) for i in range(1, 11)])
    base = prepare_dataset(gsm8k_config(tmp_path, source), progress=False).path
    seeded = prepare_dataset(gsm8k_config(tmp_path, source, split={"seed": 1}), progress=False)
    assert seeded.path != base and not seeded.reused
    write_jsonl(source, [good_row(i) for i in range(1, 12)])
    changed = prepare_dataset(gsm8k_config(tmp_path, source), progress=False)
    assert changed.path not in (base, seeded.path)
    assert changed.manifest["source"]["rows_read"] == 11
    # output_dir is not part of the identity: the same inputs get the same name elsewhere.
    moved = gsm8k_config(tmp_path, source).model_copy(update={"output_dir": tmp_path / "other"})
    assert prepare_dataset(moved, progress=False).path.name == changed.path.name


BAD_ROWS = [
    ({"answer": "#### 1"}, "question", "missing_field", "missing (the row's fields: answer)"),
    ({"question": "Q?", "answer": 17}, "answer", "wrong_type", "expected a string, got int"),
    ({"question": "", "answer": "#### 1"}, "question", "empty", "empty string"),
    ({"question": " \t ", "answer": "#### 1"}, "question", "empty", "whitespace only"),
    ({"question": "Q?", "answer": "it is 5"}, "answer", "unparseable", "unparseable: no '####"),
    ({"question": "Q" * 100_001, "answer": "#### 1"}, "question", "too_long", "100001 characters"),
]


@pytest.mark.parametrize(("bad", "field", "reason", "problem"), BAD_ROWS)
def test_bad_row_is_an_error_naming_file_row_and_field(tmp_path, bad, field, reason, problem):
    source = write_jsonl(tmp_path / "rows.jsonl", [good_row(1), good_row(2), good_row(3), bad])
    with pytest.raises(DatasetError) as excinfo:
        prepare_dataset(gsm8k_config(tmp_path, source), progress=False)
    error = excinfo.value
    assert (error.file, error.row, error.field, error.reason) == (str(source), 4, field, reason)
    assert str(error).startswith(f"{source}: row 4: field '{field}': {problem}")
    assert listing(tmp_path / "out") == []  # nothing half-written


def test_bad_rows_are_skipped_and_counted(tmp_path):
    rows = [good_row(1), *[bad for bad, *_ in BAD_ROWS], good_row(2), good_row(3)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    prepared = prepare_dataset(gsm8k_config(tmp_path, source, on_invalid="skip"), progress=False)
    manifest = prepared.manifest
    assert manifest["skipped"] == {
        "empty": 2,
        "missing_field": 1,
        "too_long": 1,
        "unparseable": 1,
        "wrong_type": 1,
    }
    assert manifest["rows"]["train"] + manifest["rows"]["eval"] == 3
    assert manifest["source"]["rows_read"] == 9


def test_all_rows_invalid_is_an_error(tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", [{"question": "Q?", "answer": "none"}])
    with pytest.raises(DatasetError, match="no valid training rows"):
        prepare_dataset(gsm8k_config(tmp_path, source, on_invalid="skip"), progress=False)
    assert listing(tmp_path / "out") == []


def test_columns_rename_source_fields(tmp_path):
    rows = [{"problem_text": r["question"], "solution": r["answer"]} for r in map(good_row, [1, 2])]
    source = write_jsonl(tmp_path / "renamed.jsonl", [*rows, {"problem_text": "Q?"}])
    columns = {"question": "problem_text", "answer": "solution"}
    with pytest.raises(DatasetError) as excinfo:
        prepare_dataset(gsm8k_config(tmp_path, source, columns=columns), progress=False)
    assert str(excinfo.value).startswith(
        f"{source}: row 3: field 'solution': missing (the row's fields: problem_text) "
        "(task field 'answer'; see `columns`)"
    )
    write_jsonl(source, rows)
    config = gsm8k_config(tmp_path, source, columns=columns, split={"eval_fraction": 0})
    train, _ = load_prepared(prepare_dataset(config, progress=False).path)
    assert [p.answer for p in train] == ["2", "4"]


def test_separate_eval_source_and_max_rows(tmp_path):
    train_file = write_jsonl(tmp_path / "train.jsonl", [good_row(i) for i in range(1, 21)])
    eval_file = write_jsonl(tmp_path / "test.jsonl", [good_row(i) for i in range(100, 106)])
    config = gsm8k_config(tmp_path, train_file, eval_source=str(eval_file), max_rows=15)
    prepared = prepare_dataset(config, progress=False)
    assert prepared.manifest["rows"] == {"train": 15, "eval": 6}
    assert prepared.manifest["eval_source"]["spec"] == str(eval_file)
    _, eval_problems = load_prepared(prepared.path)
    assert [p.id for p in eval_problems][:2] == ["gsm8k-eval-00001", "gsm8k-eval-00002"]


def test_progress_bar_for_large_sources(tmp_path, capsys):
    source = write_jsonl(tmp_path / "big.jsonl", [good_row(i) for i in range(1, 1202)])
    prepared = prepare_dataset(gsm8k_config(tmp_path, source), progress=True)
    assert "prepare big.jsonl" in capsys.readouterr().err
    assert sum(prepared.manifest["rows"].values()) == 1201


def test_crash_while_writing_leaves_nothing(tmp_path, monkeypatch):
    def fail(path, manifest):
        assert (path.parent / "train.jsonl").stat().st_size > 0  # the data files are written
        raise OSError("disk full")

    monkeypatch.setattr(prepare_module, "write_manifest", fail)
    config = PrepareConfig(generate={"train_size": 20, "eval_size": 5}, output_dir=tmp_path)
    with pytest.raises(OSError, match="disk full"):
        prepare_dataset(config, progress=False)
    assert listing(tmp_path) == []


def test_interrupt_mid_file_leaves_nothing(tmp_path, monkeypatch):
    original = SplitWriter.write
    calls = []

    def write(self, split, problem):
        calls.append(split)
        if len(calls) == 5:
            raise KeyboardInterrupt
        original(self, split, problem)

    monkeypatch.setattr(SplitWriter, "write", write)
    source = write_jsonl(tmp_path / "rows.jsonl", [good_row(i) for i in range(1, 11)])
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(gsm8k_config(tmp_path, source), progress=False)
    assert listing(tmp_path / "out") == []


def test_tampered_output_is_detected_and_rebuilt(tmp_path):
    config = PrepareConfig(generate={"train_size": 10, "eval_size": 4}, output_dir=tmp_path)
    prepared = prepare_dataset(config, progress=False)
    eval_file = prepared.path / "eval.jsonl"
    eval_file.write_text(eval_file.read_text().replace('"answer": "', '"answer": "1'))
    with pytest.raises(DatasetError) as excinfo:
        load_prepared(prepared.path)
    assert str(excinfo.value).startswith(f"{eval_file}: sha256 differs from manifest.json")

    rebuilt = prepare_dataset(config, progress=False)
    assert not rebuilt.reused and rebuilt.path == prepared.path
    assert len(load_prepared(rebuilt.path)[1]) == 4
    assert listing(tmp_path) == [prepared.path.name]

    (prepared.path / "train.jsonl").unlink()
    with pytest.raises(DatasetError, match=r"train\.jsonl: missing from the prepared dataset"):
        load_prepared(prepared.path)
    shutil.rmtree(prepared.path)
    prepared.path.mkdir()
    with pytest.raises(DatasetError, match=r"not a prepared dataset: manifest\.json is missing"):
        load_prepared(prepared.path)


def test_bad_generate_options_name_the_setting(tmp_path):
    config = PrepareConfig(generate={"options": {"digitz": 3}}, output_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"generate\.options: .*digitz.*accepted: num_operands"):
        prepare_dataset(config, progress=False)
    config = PrepareConfig(generate={"options": {"digits": 0}}, output_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"generate\.options: digits must be in 1\.\.6"):
        prepare_dataset(config, progress=False)
    assert listing(tmp_path) == []


def test_task_instructions_reach_sft_chats_and_the_env_system_prompt(tmp_path):
    from llmrl.envs.task_env import TaskEnv
    from llmrl.envs.tasks.prepared import prepared_task
    from llmrl.stages.sft import chat_examples

    short = "Answer as '#### <number>'."
    options = {"operators": "+-", "instructions": short}
    config = PrepareConfig(
        generate={"train_size": 4, "eval_size": 2, "options": options}, output_dir=tmp_path
    )
    prepared = prepare_dataset(config, progress=False)
    task, manifest = prepared_task(prepared.path)
    assert manifest["generated"]["options"]["instructions"] == short
    train, _ = load_prepared(prepared.path)
    assert [chat[0] for chat in chat_examples(train, task)] == [
        {"role": "system", "content": short}
    ] * len(train)
    state = TaskEnv(task, train, batch_size=2, repeats=1, seed=0).reset()
    for history in state["history"].prompt.unbind(0):
        assert history[0].role == "system" and history[0].content == short
    default = PrepareConfig(generate={"train_size": 4, "eval_size": 2}, output_dir=tmp_path)
    assert prepared_task(prepare_dataset(default, progress=False).path)[0].instructions.startswith(
        "Solve the problem step by step"
    )


@pytest.mark.usefixtures("without_datasets")
def test_hub_source_without_datasets_fails_before_any_work(tmp_path):
    with pytest.raises(MissingDatasetsError, match="pip install datasets"):
        prepare_dataset(gsm8k_config(tmp_path, Path("openai/gsm8k")), progress=False)
    assert not (tmp_path / "out").exists()


def test_eval_split_of_a_file_fails_before_reading(tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", [good_row(1)])
    with pytest.raises(DatasetError, match=r"eval_split 'test' given, but a \.jsonl file has no"):
        prepare_dataset(gsm8k_config(tmp_path, source, eval_split="test"), progress=False)
    assert not (tmp_path / "out").exists()
