"""The bad-input corpus's data rows: dataset files ``llmrl prepare`` must refuse, and prepared
datasets (changed or broken after preparing) the stages must refuse."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.reliability.bad_input import PREPARED, Row, stage


def jsonl(*rows: object) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def parquet(columns: dict[str, list[Any]]) -> Callable[[Path], bytes]:
    def build(_prepared: Path) -> bytes:
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(pa.table(columns), sink)
        return sink.getvalue()

    return build


def huge_line(_prepared: Path) -> bytes:
    """A 50 MB JSONL row: the question alone is 50 million characters."""
    return (jsonl(GOOD) + json.dumps({"question": "x" * 50_000_000, "answer": "#### 1"})).encode()


GOOD = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
GOOD2 = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
GSM8K = ["prepare", "--set", "task=gsm8k", "--set", "output_dir=out"]


def gsm8k(source: str, *more: str) -> list[str]:
    """``llmrl prepare`` of task gsm8k from ``source`` into ``out/``."""
    return [*GSM8K, "--set", f"source={source}", *more]


TAMPERED_TRAIN = b'{"id": "a", "prompt": "1+1", "answer": "2"}\n{"id": 7}\n'
"""A prepared ``train.jsonl`` whose row 2 is not a problem."""


def manifest_for_tampered_train(prepared: Path) -> bytes:
    """The prepared manifest, with ``train.jsonl``'s sha256 and rows those of TAMPERED_TRAIN."""
    manifest = json.loads((prepared / "manifest.json").read_bytes())
    manifest["files"]["train.jsonl"]["sha256"] = hashlib.sha256(TAMPERED_TRAIN).hexdigest()
    manifest["rows"]["train"] = TAMPERED_TRAIN.count(b"\n")
    return json.dumps(manifest).encode()


def manifest_of_unknown_task(prepared: Path) -> bytes:
    """The prepared manifest, naming task 'chess'."""
    manifest = json.loads((prepared / "manifest.json").read_bytes())
    return json.dumps({**manifest, "task": "chess"}).encode()


DATA_ROWS: list[Row] = [
    # ---------------------------------------------------------------- dataset files (prepare)
    Row("jsonl-invalid-json", {"train.jsonl": jsonl(GOOD) + '{"question": "x"\n'},
        gsm8k("train.jsonl"),
        ("llmrl prepare: error: train.jsonl: line 2: invalid JSON: Expecting ',' delimiter",),
        subprocess=True),
    Row("jsonl-truncated-last-line", {"train.jsonl": jsonl(GOOD, GOOD2) + '{"question": "Wh'},
        gsm8k("train.jsonl"), ("train.jsonl: line 3: invalid JSON: Unterminated string",)),
    Row("jsonl-line-not-an-object", {"train.jsonl": jsonl(GOOD, ["What is 1 + 1?", "2"])},
        gsm8k("train.jsonl"),
        ("train.jsonl: line 2: expected a JSON object per line, got a list",)),
    Row("jsonl-missing-column", {"train.jsonl": jsonl(GOOD, {"question": "What is 3 + 3?"})},
        gsm8k("train.jsonl"),
        ("train.jsonl: row 2: field 'answer': missing (the row's fields: question)",)),
    Row("jsonl-extra-columns-but-renamed-one-missing",
        {"train.jsonl": jsonl({"problem": "What is 1 + 1?", "answer": "#### 2", "notes": "x"})},
        gsm8k("train.jsonl", "--set", "columns={question: prompt}"),
        ("train.jsonl: row 1: field 'prompt': missing (the row's fields: answer, notes, problem)",
         "(task field 'question'; see `columns`)")),
    Row("jsonl-answer-is-a-number", {"train.jsonl": jsonl(GOOD, {"question": "2+2?", "answer": 4})},
        gsm8k("train.jsonl"),
        ("train.jsonl: row 2: field 'answer': expected a string, got int",)),
    Row("jsonl-question-is-null", {"train.jsonl": jsonl({"question": None, "answer": "#### 1"})},
        gsm8k("train.jsonl"),
        ("train.jsonl: row 1: field 'question': expected a string, got null",)),
    Row("jsonl-empty-question",
        {"train.jsonl": jsonl(GOOD, GOOD2, {"question": "", "answer": "#### 1"})},
        gsm8k("train.jsonl"), ("train.jsonl: row 3: field 'question': empty string",)),
    Row("jsonl-whitespace-answer", {"train.jsonl": jsonl(GOOD, {"question": "q", "answer": " \t"})},
        gsm8k("train.jsonl"), ("train.jsonl: row 2: field 'answer': whitespace only",)),
    Row("jsonl-answer-without-final-number",
        {"train.jsonl": jsonl(GOOD, {"question": "q", "answer": "it is two"})},
        gsm8k("train.jsonl"), ("train.jsonl: row 2: field 'answer': unparseable:",)),
    Row("jsonl-huge-row-50MB", {"train.jsonl": huge_line}, gsm8k("train.jsonl"),
        ("train.jsonl: row 2: field 'question': 50000000 characters, over the limit of 100000 "
         "(max_row_chars)",)),
    Row("jsonl-lone-surrogate",
        {"train.jsonl": jsonl(GOOD) + '{"question": "caf\\ud800?", "answer": "#### 1"}\n'},
        gsm8k("train.jsonl"),
        ("train.jsonl: row 2: field 'question': invalid Unicode: a lone surrogate \\ud800 at "
         "character 4",)),
    Row("jsonl-deep-nesting",
        {"train.jsonl": jsonl(GOOD) + '{"question": ' + "[" * 100_000 + "]" * 100_000 + "}\n"},
        gsm8k("train.jsonl"),
        ("train.jsonl: line 2: JSON nested 100001 levels deep, over the limit of 64",)),
    Row("json-deep-nesting", {"train.json": "[" * 100_000 + "]" * 100_000},
        gsm8k("train.json"), ("train.json: JSON nested 100000 levels deep, over the limit of 64",)),
    Row("jsonl-huge-field-name",
        {"train.jsonl": jsonl(GOOD, {"question\x1b[2J" + "q" * 10**6: "x", "answer": "#### 1"})},
        gsm8k("train.jsonl"), ("train.jsonl: row 2: field 'question': missing (the row's fields: "
                               "answer, question\\x1b[2Jqqq",)),
    Row("jsonl-non-utf8-bytes",
        {"train.jsonl": jsonl(GOOD).encode() + b'{"question": "caf\xe9?", "answer": "#### 1"}\n'},
        gsm8k("train.jsonl"),
        ("llmrl prepare: error: train.jsonl: line 2: not valid UTF-8 (byte 0xe9 at byte 18 of the "
         "line); re-encode the file as UTF-8",),
        subprocess=True),
    Row("jsonl-only-blank-lines", {"train.jsonl": "\n  \n"}, gsm8k("train.jsonl"),
        ("train.jsonl: no valid training rows (0 invalid rows skipped)",)),
    Row("jsonl-every-row-skipped",
        {"train.jsonl": jsonl({"question": "q"}, {"question": 1, "answer": "#### 1"})},
        gsm8k("train.jsonl", "--set", "on_invalid=skip"),
        ("train.jsonl: no valid training rows (2 invalid rows skipped)",)),
    Row("jsonl-bad-row-in-eval-source",
        {"train.jsonl": jsonl(GOOD), "test.jsonl": jsonl(GOOD2, {"question": "q", "answer": []})},
        gsm8k("train.jsonl", "--set", "eval_source=test.jsonl"),
        ("test.jsonl: row 2: field 'answer': expected a string, got list",)),
    Row("json-not-a-list", {"train.json": json.dumps(GOOD)}, gsm8k("train.json"),
        ("train.json: expected a JSON list of objects, got dict",
         "a file with one object per line should be named .jsonl")),
    Row("json-element-not-an-object", {"train.json": json.dumps([GOOD, "What is 2 + 2?"])},
        gsm8k("train.json"), ("train.json: row 2: expected a JSON object, got a string",)),
    Row("json-syntax-error",
        {"train.json": '[\n  {"question": "q", "answer": "#### 1"},\n  {,}\n]'},
        gsm8k("train.json"), ("train.json: line 3: invalid JSON: Expecting property name",)),
    Row("json-non-utf8-bytes", {"train.json": b'[\n{"question": "\xff", "answer": "#### 1"}\n]'},
        gsm8k("train.json"), ("train.json: line 2: not valid UTF-8 (byte 0xff",)),
    Row("parquet-corrupt", {"train.parquet": b"PAR1 this is not parquet"},
        gsm8k("train.parquet"), ("train.parquet: not a readable Parquet file",)),
    Row("parquet-wrong-type",
        {"train.parquet": parquet({"question": ["q1", "q2"], "answer": [1, 2]})},
        gsm8k("train.parquet"),
        ("train.parquet: row 1: field 'answer': expected a string, got int",)),
    Row("parquet-missing-column", {"train.parquet": parquet({"question": ["q1"]})},
        gsm8k("train.parquet"),
        ("train.parquet: row 1: field 'answer': missing (the row's fields: question)",)),
    Row("source-unsupported-format", {"train.csv": "question,answer\nq,#### 1\n"},
        gsm8k("train.csv"), ("train.csv: unsupported data format '.csv'; supported: .jsonl",)),
    Row("source-missing-file", {}, gsm8k("./nowhere.jsonl"),
        ("./nowhere.jsonl: data source does not exist",)),
    # ---------------------------------------------------------- prepared datasets (sft, eval)
    Row("prepared-manifest-not-json", {"data": PREPARED, "data/manifest.json": "{not json"},
        stage("sft"), ("llmrl sft: error: data/manifest.json: invalid manifest (JSONDecodeError",),
        subprocess=True),
    Row("prepared-manifest-wrong-shape", {"data": PREPARED, "data/manifest.json": "[1, 2]"},
        stage("eval"), ("data/manifest.json: invalid manifest (TypeError",)),
    Row("prepared-manifest-unknown-task",
        {"data": PREPARED, "data/manifest.json": manifest_of_unknown_task},
        stage("eval"),
        ("data/manifest.json: names no usable task (task: 'chess' is neither an import path",)),
    Row("prepared-file-changed", {"data": PREPARED, "data/eval.jsonl": "{}\n"}, stage("eval"),
        ("data/eval.jsonl: sha256 differs from manifest.json: the file changed after it was "
         "prepared",)),
    Row("prepared-row-wrong-shape",
        {"data": PREPARED, "data/train.jsonl": TAMPERED_TRAIN,
         "data/manifest.json": manifest_for_tampered_train},
        stage("sft"), ("data/train.jsonl: row 2: not a prepared problem (",)),
    Row("prepared-missing-dir", {}, stage("grpo"),
        ("data.path: data does not exist: not a prepared dataset; run `llmrl prepare` first",
         "(set by --set data.path=data)")),
]  # fmt: skip
