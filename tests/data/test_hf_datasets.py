"""`llmrl prepare` through the real `datasets` library: save_to_disk folders, reader: datasets.

Every dataset here is written by the test itself; the network is blocked for the whole module.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")

from llmrl.config import PrepareConfig  # noqa: E402
from llmrl.data.dataset_error import DatasetError  # noqa: E402
from llmrl.data.datasets import read_rows  # noqa: E402
from llmrl.data.hf_datasets import environment_is_offline  # noqa: E402
from llmrl.data.prepare import load_prepared, prepare_dataset  # noqa: E402
from llmrl.data.prepare_sources import DATASETS_CACHE  # noqa: E402


def good_row(i: int) -> dict:
    return {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}


ROWS = [good_row(i) for i in range(1, 13)]


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """Any connection attempt fails the test; the default caches point at a folder we inspect."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    default = tmp_path / "home" / ".cache" / "huggingface"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", default / "datasets")
    monkeypatch.setattr(datasets.config, "HF_CACHE_HOME", str(default))


def write_jsonl(path: Path, rows: list[dict], blank_after: int | None = None) -> Path:
    lines = [json.dumps(row) + "\n" for row in rows]
    if blank_after is not None:
        lines.insert(blank_after, "\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


def prepared_rows(tmp_path: Path, name: str, source: Path | str, **settings) -> list[list[str]]:
    config = PrepareConfig(task="gsm8k", source=str(source), output_dir=tmp_path / name, **settings)
    prepared = prepare_dataset(config, progress=False)
    return [
        (prepared.path / split).read_text(encoding="utf-8").splitlines()
        for split in ("train.jsonl", "eval.jsonl")
    ]


def test_save_to_disk_dataset_prepares_like_the_plain_reader(tmp_path):
    plain = prepared_rows(tmp_path, "plain", write_jsonl(tmp_path / "rows.jsonl", ROWS))
    datasets.Dataset.from_list(ROWS).save_to_disk(tmp_path / "saved")
    saved = prepared_rows(tmp_path, "saved", tmp_path / "saved")
    assert saved == plain
    assert len(plain[0]) + len(plain[1]) == len(ROWS) and plain[1]  # both splits used


def test_dataset_dict_splits(tmp_path):
    folder = tmp_path / "dict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS[:8]),
            "test": datasets.Dataset.from_list(ROWS[8:]),
        }
    ).save_to_disk(folder)
    config = PrepareConfig(
        task="gsm8k", source=str(folder), eval_split="test", output_dir=tmp_path / "out"
    )
    prepared = prepare_dataset(config, progress=False)
    assert prepared.manifest["rows"] == {"train": 8, "eval": 4}
    train, eval_problems = load_prepared(prepared.path)
    assert train[0].prompt == ROWS[0]["question"] and eval_problems[0].answer == "18"
    assert prepared.manifest["eval_source"]["split"] == "test"


def test_a_missing_split_lists_the_available_ones(tmp_path):
    folder = tmp_path / "dict"
    datasets.DatasetDict(
        {
            "validation": datasets.Dataset.from_list(ROWS[:2]),
            "test": datasets.Dataset.from_list(ROWS[2:4]),
        }
    ).save_to_disk(folder)
    config = PrepareConfig(task="gsm8k", source=str(folder), output_dir=tmp_path / "out")
    with pytest.raises(DatasetError) as caught:
        prepare_dataset(config, progress=False)
    message = str(caught.value)
    assert message.startswith(f"{folder}: it has no split 'train'; its splits are test, validation")
    assert "source_split" in message
    with pytest.raises(DatasetError, match="no split was named; its splits are test, validation"):
        list(read_rows(folder))


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet"])
def test_reader_datasets_gives_the_same_prepared_rows(tmp_path, kind):
    if kind == "jsonl":
        source = write_jsonl(tmp_path / "rows.jsonl", ROWS, blank_after=3)  # line != row index
    elif kind == "json":
        source = tmp_path / "rows.json"
        source.write_text(json.dumps(ROWS), encoding="utf-8")
    else:
        source = tmp_path / "rows.parquet"
        datasets.Dataset.from_list(ROWS).to_parquet(source)
    plain = prepared_rows(tmp_path, "plain", source)
    via_datasets = prepared_rows(tmp_path, "hf", source, reader="datasets")
    assert via_datasets == plain
    assert (tmp_path / "hf" / DATASETS_CACHE).is_dir()  # the Arrow cache sits in output_dir
    assert not (tmp_path / "plain" / DATASETS_CACHE).exists()
    assert not (tmp_path / "home").exists()  # nothing in the default (home) cache


def test_configured_cache_dir(tmp_path):
    source = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    cache = tmp_path / "arrow-cache"
    prepared_rows(tmp_path, "a", source, reader="datasets", cache_dir=cache)
    assert cache.is_dir() and any(cache.iterdir())
    assert not (tmp_path / "a" / DATASETS_CACHE).exists()
    # The cache location does not change the prepared folder; the reader does (it is recorded).
    plain = prepare_dataset(
        PrepareConfig(task="gsm8k", source=str(source), output_dir=tmp_path / "a"), progress=False
    )
    via_other_cache = prepare_dataset(
        PrepareConfig(
            task="gsm8k",
            source=str(source),
            output_dir=tmp_path / "a",
            reader="datasets",
            cache_dir=tmp_path / "elsewhere",
        ),
        progress=False,
    )
    assert via_other_cache.reused and via_other_cache.path != plain.path


def bad_rows() -> list[dict]:
    rows = [dict(row) for row in ROWS[:6]]
    rows[4]["answer"] = "no final line here"  # row 5: unparseable answer
    return rows


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "save_to_disk"])
def test_a_bad_row_names_file_row_and_field(tmp_path, kind):
    rows = bad_rows()
    if kind == "jsonl":
        source, settings = write_jsonl(tmp_path / "rows.jsonl", rows), {"reader": "datasets"}
    elif kind == "parquet":
        source, settings = tmp_path / "rows.parquet", {"reader": "datasets"}
        datasets.Dataset.from_list(rows).to_parquet(source)
    else:
        source, settings = tmp_path / "saved", {}
        datasets.Dataset.from_list(rows).save_to_disk(source)
    config = PrepareConfig(
        task="gsm8k", source=str(source), output_dir=tmp_path / "out", **settings
    )
    with pytest.raises(DatasetError) as caught:
        prepare_dataset(config, progress=False)
    assert str(caught.value).startswith(f"{source}: row 5: field 'answer': unparseable: ")
    assert (caught.value.row, caught.value.field) == (5, "answer")
    if kind != "save_to_disk":  # the plain reader says the same
        plain = PrepareConfig(task="gsm8k", source=str(source), output_dir=tmp_path / "out2")
        with pytest.raises(DatasetError) as plain_caught:
            prepare_dataset(plain, progress=False)
        assert str(plain_caught.value) == str(caught.value)


def test_wrong_type_and_null_fields_name_the_row(tmp_path):
    rows = [dict(row) for row in ROWS[:4]]
    rows[2]["answer"] = 7  # a number where text is expected
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    config = PrepareConfig(
        task="gsm8k", source=str(source), reader="datasets", output_dir=tmp_path / "out"
    )
    with pytest.raises(DatasetError, match=r"rows\.jsonl: row 3: field 'answer': expected a str"):
        prepare_dataset(config, progress=False)
    # Arrow cannot tell a missing field from a null one: both name file, row and field.
    del rows[2]["answer"]
    write_jsonl(source, rows)
    with pytest.raises(DatasetError, match=r"rows\.jsonl: row 3: field 'answer': expected a str"):
        prepare_dataset(config, progress=False)


def test_a_hub_id_fails_at_once_without_the_network(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default caches (the fixture) are empty
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as make run and tests/conftest.py set it
    before = dict(os.environ)
    config = PrepareConfig(task="gsm8k", source="nobody/no-such-dataset", output_dir="out")
    with pytest.raises(DatasetError) as caught:
        prepare_dataset(config, progress=False)
    message = str(caught.value)
    assert message.startswith("nobody/no-such-dataset: a Hugging Face hub id that is not in")
    assert "environment is offline (HF_HUB_OFFLINE" in message
    assert "save_to_disk('data/no-such-dataset')" in message
    assert dict(os.environ) == before  # the offline switch is undone


def test_only_an_offline_environment_keeps_hub_ids_off_the_network(monkeypatch):
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert not environment_is_offline()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "true")
    assert environment_is_offline()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    assert not environment_is_offline()


def test_not_a_saved_dataset_folder(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("hi")
    with pytest.raises(DatasetError, match="not a datasets save_to_disk directory"):
        list(read_rows(tmp_path / "folder"))
