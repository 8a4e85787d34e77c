"""Row readers (JSONL, JSON, Parquet, datasets folders); each bad input named by file and line."""

from __future__ import annotations

import importlib.util
import json
import pickle

import pytest

import llmrl.data.file_readers as file_readers
import llmrl.data.json_rows as json_rows
from llmrl.data.dataset_error import DatasetError, MissingDatasetsError
from llmrl.data.datasets import read_rows
from llmrl.data.row_fields import require_text_fields
from llmrl.data.sources import count_rows, fingerprint, resolve_source

HAS_DATASETS = importlib.util.find_spec("datasets") is not None
ROWS = [
    {"question": "What is 2 + 2?", "answer": "#### 4"},
    {"question": "Zoë's 3 × 3?", "answer": "#### 9", "extra": 1},
]


def test_jsonl_rows_are_numbered_by_line_and_blank_lines_count(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [json.dumps(ROWS[0]), "", "   ", json.dumps(ROWS[1], ensure_ascii=False)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert list(read_rows(path)) == [(1, ROWS[0]), (4, ROWS[1])]
    assert count_rows(resolve_source(path)) == 2


def test_jsonl_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(ROWS[0]).encode() + b"\n")
    assert list(read_rows(path)) == [(1, ROWS[0])]


def test_columns_keep_only_the_named_fields(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert [row for _, row in read_rows(path, columns=["answer", "missing"])] == [
        {"answer": "#### 4"},
        {"answer": "#### 9"},
    ]


def test_json_list_of_objects(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps(ROWS, indent=2))
    assert list(read_rows(path)) == [(1, ROWS[0]), (2, ROWS[1])]


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "data.parquet"
    table = pa.table({"question": [r["question"] for r in ROWS], "answer": ["#### 4", "#### 9"]})
    pq.write_table(table, path, row_group_size=1)
    assert list(read_rows(path)) == [
        (1, ROWS[0]),
        (2, {k: ROWS[1][k] for k in ("question", "answer")}),
    ]
    assert list(read_rows(path, columns=["answer", "absent"])) == [
        (1, {"answer": "#### 4"}),
        (2, {"answer": "#### 9"}),
    ]
    assert count_rows(resolve_source(path)) == 2


def test_invalid_json_line_names_file_line_and_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + '{"question": "x", answer}\n')
    with pytest.raises(DatasetError) as excinfo:
        list(read_rows(path))
    assert str(excinfo.value) == (
        f"{path}: line 2: invalid JSON: Expecting property name enclosed in double quotes "
        "(column 19)"
    )
    assert (excinfo.value.file, excinfo.value.line) == (str(path), 2)


@pytest.mark.parametrize(
    ("line", "kind"), [("[1, 2]", "a list"), ('"text"', "a string"), ("3", "a number")]
)
def test_a_line_that_is_not_an_object(tmp_path, line, kind):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(
        DatasetError, match=f"^{path}: line 2: expected a JSON object per line, got {kind}$"
    ):
        list(read_rows(path))


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        json.dumps(ROWS[0]).encode() + b"\n" + '{"question": "caf\xe9"}\n'.encode("latin-1")
    )
    with pytest.raises(DatasetError) as excinfo:
        list(read_rows(path))
    assert str(excinfo.value).startswith(f"{path}: line 2: not valid UTF-8 (byte 0xe9")
    assert "re-encode the file as UTF-8" in str(excinfo.value)


def test_non_utf8_json_file_names_the_line(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'[\n{"question": "ok"},\n{"question": "caf\xe9"}\n]\n')
    with pytest.raises(DatasetError, match=f"^{path}: line 3: not valid UTF-8"):
        list(read_rows(path))


def test_json_errors(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('[\n{"a": 1},\n{"a": }\n]')
    with pytest.raises(DatasetError, match=f"^{broken}: line 3: invalid JSON: Expecting value"):
        list(read_rows(broken))
    not_list = tmp_path / "object.json"
    not_list.write_text('{"a": 1}')
    with pytest.raises(
        DatasetError, match=f"^{not_list}: expected a JSON list of objects, got dict"
    ):
        list(read_rows(not_list))
    not_object = tmp_path / "items.json"
    not_object.write_text('[{"a": 1}, 5]')
    with pytest.raises(
        DatasetError, match=f"^{not_object}: row 2: expected a JSON object, got a number"
    ):
        list(read_rows(not_object))


def test_unknown_extension_lists_the_supported_formats(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("question,answer\n")
    with pytest.raises(DatasetError) as excinfo:
        list(read_rows(path))
    message = str(excinfo.value)
    assert message.startswith(f"{path}: unsupported data format '.csv'; supported: .jsonl")
    assert ".parquet" in message and "hub id" in message


def test_missing_local_file_is_not_mistaken_for_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for spec in ("data/gsm8k", "absent.jsonl", "./x/y", str(tmp_path / "a" / "b")):
        with pytest.raises(DatasetError, match="data source does not exist"):
            resolve_source(spec)
    assert resolve_source("openai/gsm8k").kind == "hub"


def test_bad_parquet_file(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_text("not parquet")
    with pytest.raises(DatasetError, match=f"^{path}: not a readable Parquet file"):
        list(read_rows(path))


def test_a_file_has_no_splits(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(DatasetError, match=r"split 'test' given, but a \.jsonl file has no splits"):
        list(read_rows(path, split="test"))


@pytest.mark.usefixtures("without_datasets")
def test_datasets_directory_without_the_package_says_how_to_install_it(tmp_path):
    with pytest.raises(MissingDatasetsError, match="pip install datasets"):
        list(read_rows(tmp_path))
    error = pickle.loads(pickle.dumps(MissingDatasetsError("x/y")))
    assert "pip install datasets" in str(error)


@pytest.mark.skipif(not HAS_DATASETS, reason="needs the optional datasets package")
def test_datasets_save_to_disk_directory(tmp_path):
    import datasets

    folder = tmp_path / "saved"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS[:1]),
            "test": datasets.Dataset.from_list(ROWS[:1]),
        }
    ).save_to_disk(folder)
    assert list(read_rows(folder, split="test")) == [(1, ROWS[0])]
    with pytest.raises(DatasetError, match="no split was named; its splits are test, train"):
        list(read_rows(folder))


def test_fingerprint_follows_the_bytes(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n")
    first = fingerprint(resolve_source(path))
    assert first == fingerprint(resolve_source(path))
    path.write_text(json.dumps(ROWS[1]) + "\n")
    assert fingerprint(resolve_source(path)) != first
    hub = resolve_source("owner/name")
    assert fingerprint(hub, revision="abc") != fingerprint(hub, revision="def")


@pytest.mark.parametrize(
    ("row", "field", "reason", "problem"),
    [
        ({"q": "x"}, "a", "missing_field", "missing (the row's fields: q)"),
        ({"q": "x", "a": 4}, "a", "wrong_type", "expected a string, got int"),
        ({"q": None, "a": "4"}, "q", "wrong_type", "expected a string, got null"),
        ({"q": "", "a": "4"}, "q", "empty", "empty string"),
        ({"q": " \n\t", "a": "4"}, "q", "empty", "whitespace only"),
        ({"q": "x" * 11, "a": "4"}, "q", "too_long", "11 characters, over the limit of 10"),
    ],
)
def test_require_text_fields(row, field, reason, problem):
    columns = {"question": "q", "answer": "a"}
    with pytest.raises(DatasetError) as excinfo:
        require_text_fields(row, columns, file="f.jsonl", row_number=17, max_chars=10)
    error = excinfo.value
    assert (error.file, error.row, error.field, error.reason) == ("f.jsonl", 17, field, reason)
    assert str(error).startswith(f"f.jsonl: row 17: field '{field}': {problem}")
    assert "see `columns`" in str(error)


def test_require_text_fields_returns_task_fields():
    values = require_text_fields(
        {"question": "q?", "answer": "a", "x": 1},
        {"question": "question", "answer": "answer"},
        file="f",
        row_number=1,
        max_chars=10,
    )
    assert values == {"question": "q?", "answer": "a"}


def test_dataset_error_message_and_pickling():
    error = DatasetError(
        "expected a string, got int", file="data/train.jsonl", row=17, field="answer"
    )
    assert str(error) == "data/train.jsonl: row 17: field 'answer': expected a string, got int"
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.field == "answer" and copy.row == 17


# ------------------------------------------------------------------- bounded row reading


def test_a_line_over_the_row_limit_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(file_readers, "MAX_ROW_BYTES", 1000)
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": "ok"}\n' + json.dumps({"q": "x" * 5000}) + '\n{"q": "after"}\n')
    rows = read_rows(path)
    assert next(rows) == (1, {"q": "ok"})
    with pytest.raises(DatasetError) as raised:
        next(rows)
    assert str(raised.value).startswith(f"{path}: line 2: the line is over 1000 bytes")
    assert raised.value.reason == "too_long"


def test_json_nesting_is_measured_without_recursion():
    assert json_rows.json_depth('{"a": [1, {"b": "[[[{{"}], "c": "\\\\\\"["}') == 3
    assert json_rows.json_depth("[" * 1_000_000) == 1_000_000  # no RecursionError
    assert json_rows.json_depth('"' + "[" * 10) == 10  # an unclosed string: brackets count


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"q": ' + "[" * 65 + "]" * 65 + "}", "line 1: JSON nested 66 levels deep"),
        ('{"q": "\\ud83d"}', "row 1: field 'q': invalid Unicode: a lone surrogate \\ud83d"),
        ('{"q": ["ok", {"k": "\\udfff!"}]}', "row 1: field 'q': invalid Unicode"),
        ('{"\\ud800": "value"}', "row 1: field '\\ud800': invalid Unicode"),
    ],
)
def test_bad_json_lines_name_file_row_and_field(tmp_path, line, expected):
    path = tmp_path / "rows.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DatasetError) as raised:
        list(read_rows(path))
    assert str(raised.value).startswith(f"{path}: {expected}")


def test_surrogate_pairs_and_deep_but_allowed_rows_still_read(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": "\\ud83d\\ude00", "n": ' + "[" * 63 + "]" * 63 + "}\n")
    assert [row["q"] for _, row in read_rows(path)] == ["\U0001f600"]


def test_user_text_in_errors_is_cut_and_its_control_characters_escaped():
    error = DatasetError("bad value " + "v" * 50_000_000, file="a.jsonl", row=2, field="\x1b[2J")
    assert len(str(error)) < 1_100
    assert str(error).startswith("a.jsonl: row 2: field '\\x1b[2J': bad value vvv")
    assert str(error).endswith("vvv... (50000010 characters in all)")
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_counting_rows_never_holds_a_huge_line(tmp_path):
    # a file of one 96 MiB line: counted 1 MiB at a time, the process's peak memory grows by
    # about a chunk, not by the line (reading the line whole would add 96 MiB)
    from llmrl.data.sources import DataSource, count_rows
    from llmrl.train.peak_memory import peak_memory_mb, reset_peak_memory

    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as out:
        out.write(b'{"a": 1}\n\n')
        for _ in range(96):
            out.write(b"x" * (1 << 20))
        out.write(b"\n  \n{}")
    reset_peak_memory("cpu")
    before = peak_memory_mb("cpu")
    assert count_rows(DataSource(kind="jsonl", location=str(path), spec=str(path))) == 3
    assert peak_memory_mb("cpu") - before < 32
