"""The bad-input corpus: every row is a user mistake that must fail cleanly.

Each row writes its input files into an empty working directory, runs one command (the real
``llmrl`` CLI in process, a few as a real ``python -m llmrl.cli`` subprocess, or a library API)
and checks three things:

- it fails: exit code 2 for the CLI (a user error, no traceback), the row's exception for an API;
- the message holds every expected substring: the field, the file and, for data, the row/line;
- it leaves nothing behind: the working directory holds exactly the files the row wrote, with
  the same bytes (no output file, no temporary file, no half-written dataset or checkpoint).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmrl.cli import main
from tests.support.configs import BOMB

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "llmrl"
PREPARED = object()
"""A file value: copy the module's prepared arithmetic dataset folder here."""
Content = str | bytes | Callable[[Path], bytes] | object
"""A file's text, bytes, a function of the prepared dataset's folder that returns its bytes, or
:data:`PREPARED`."""


@dataclass(frozen=True)
class Api:
    """A library call that must raise ``error``; ``call`` gets a fixture getter."""

    call: Callable[[Callable[[str], Any]], object]
    error: type[BaseException]


@dataclass(frozen=True)
class Row:
    """One bad input: the files to write, the command, the substrings its error must contain."""

    id: str
    files: Mapping[str, Content]
    command: list[str] | Api
    expect: tuple[str, ...]
    subprocess: bool = False
    marks: tuple[Any, ...] = field(default=())


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


def stage(name: str, *more: str) -> list[str]:
    """``llmrl <stage>`` on the prepared dataset copied to ``data/``, tracking off."""
    return [name, "--no-progress", "--set", "data.path=data", "--set", "tracking.enabled=false",
            *more]  # fmt: skip


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


def policy(generate_kwargs: dict[str, Any], **more: Any) -> Api:
    """``TransformersWrapper(tiny, tokenizer, generate_kwargs=...)`` must refuse the kwargs."""
    from llmrl.policies.generation_kwargs import GenerationKwargsError

    def call(fixture: Callable[[str], Any]) -> object:
        from llmrl.policies import TransformersWrapper

        return TransformersWrapper(
            fixture("tiny"), fixture("tokenizer"), generate_kwargs=generate_kwargs, **more
        )

    return Api(call, GenerationKwargsError)


def topology(path: str) -> Api:
    """``load_config(Topology, path)`` must refuse the topology file."""
    from llmrl.config import ConfigError, load_config
    from llmrl.topology import Topology

    return Api(lambda _fixture: load_config(Topology, path), ConfigError)


HAS_HELM = importlib.util.find_spec("helm_python") is not None


def chart(values: dict[str, Any]) -> Api:
    """Rendering the Helm chart with ``values`` must fail (values schema or template guard)."""

    def call(_fixture: Callable[[str], Any]) -> object:
        import helm_python as helm

        with helm.Chart.load(CHART) as loaded:
            return loaded.render(values, name="llmrl", namespace="llmrl")

    if not HAS_HELM:
        return Api(call, Exception)
    import helm_python as helm

    return Api(call, helm.HelmError)


def _chart_rows() -> list[Row]:
    """The chart's rows (skipped as a group when helm-python-sdk is not installed)."""
    cases = [
        ("chart-wrong-type", {"topology": {"trainer": {"gpus": "two"}}},
         ("at '/topology/trainer/gpus': got string, want integer",)),
        ("chart-unknown-key", {"storage": {"sise": "1Ti"}},
         ("at '/storage': additional properties 'sise' not allowed",)),
        ("chart-out-of-range", {"stagePods": {"shmFraction": 2}},
         ("at '/stagePods/shmFraction': maximum: got 2, want 1",)),
        ("chart-root-uid", {"podSecurity": {"runAsUser": 0}},
         ("at '/podSecurity/runAsUser': minimum: got 0, want 1",)),
        ("chart-bad-enum", {"image": {"pullPolicy": "Sometimes"}},
         ("at '/image/pullPolicy': value must be one of 'IfNotPresent', 'Always', 'Never'",)),
        ("chart-list-expected", {"imagePullSecrets": "regcred"},
         ("at '/imagePullSecrets': got string, want array",)),
        ("chart-negative-workers", {"topology": {"env_workers": {"count": -1}}},
         ("at '/topology/env_workers/count': minimum: got -1, want 0",)),
        ("chart-mlflow-nowhere", {"mlflow": {"enabled": False}},
         ("llmrl/templates/configmap-topology.yaml", "mlflow.externalUri: the tracking URI")),
        ("chart-colocated-topology",
         {"topology": {"colocated": True, "inference": {"engines": 2, "tensor_parallel_size": 2},
                       "trainer": {"gpus": 2, "strategy": "ddp"}}},
         ("topology.trainer.gpus: colocated inference and training share the same GPUs",
          "(2 x 2 = 4), got 2")),
    ]  # fmt: skip
    skip = pytest.mark.skipif(not HAS_HELM, reason="helm-python-sdk (dev extra) renders the chart")
    return [Row(name, {}, chart(values), expect, marks=(skip,)) for name, values, expect in cases]


ROWS: list[Row] = [
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
        ("data/manifest.json: names no usable task (unknown task 'chess'; known tasks:",)),
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
    # ------------------------------------------------------------------------------- configs
    Row("config-unknown-key", {"sft.yaml": "data: {path: data}\nstepz: 3\n"},
        ["sft", "--config", "sft.yaml"],
        ("llmrl sft: error: sft.yaml: unknown key 'stepz'", "did you mean 'steps'?"),
        subprocess=True),
    Row("config-nested-unknown-key", {"sft.yaml": "data: {path: data}\noptimizer: {warmup: 3}\n"},
        ["sft", "--config", "sft.yaml"],
        ("sft.yaml: unknown key 'optimizer.warmup'", "did you mean 'warmup_steps'?")),
    Row("config-wrong-type", {"sft.yaml": "data: {path: data}\nsteps: ten\n"},
        ["sft", "--config", "sft.yaml"],
        ("sft.yaml: steps: Input should be a valid integer, unable to parse string as an integer "
         "(got 'ten')",)),
    Row("config-negative-steps", {"grpo.yaml": "data: {path: data}\nsteps: -5\n"},
        ["grpo", "--config", "grpo.yaml"],
        ("grpo.yaml: steps: Input should be greater than or equal to 1 (got -5)",)),
    Row("config-zero-lr", {"sft.yaml": "data: {path: data}\noptimizer: {lr: 0}\n"},
        ["sft", "--config", "sft.yaml"],
        ("sft.yaml: optimizer.lr: Input should be greater than 0 (got 0)",)),
    Row("config-lr-infinite", {"data": PREPARED}, stage("sft", "--set", "optimizer.lr=.inf"),
        ("llmrl sft: error: --set optimizer.lr=.inf: optimizer.lr: Input should be a finite "
         "number (got inf)",), subprocess=True),
    Row("config-lr-nan", {"data": PREPARED}, stage("sft", "--set", "optimizer.lr=.nan"),
        ("--set optimizer.lr=.nan: optimizer.lr: Input should be a finite number (got nan)",)),
    Row("config-steps-1e30", {"data": PREPARED, "sft.yaml": "steps: 1.0e+30\n"},
        ["sft", "--config", "sft.yaml", "--no-progress", "--set", "data.path=data",
         "--set", "tracking.enabled=false"],
        ("sft.yaml: steps: Input is too large a number for this integer field (got 1e+30)",),
        subprocess=True),
    Row("config-steps-huge-int", {"data": PREPARED},
        stage("grpo", "--set", "steps=1000000000000000000000000000000"),
        ("steps: Input should be less than or equal to 10000000",)),
    Row("config-beta-out-of-range",
        {"sft.yaml": "data: {path: data}\noptimizer: {betas: [0.9, 1]}\n"},
        ["sft", "--config", "sft.yaml"],
        ("sft.yaml: optimizer.betas[1]: Input should be less than 1",)),
    Row("config-alias-bomb", {"prepare.yaml": BOMB}, ["prepare", "--config", "prepare.yaml"],
        ("prepare.yaml: line 1, column 1: invalid YAML: more than 100000 values once its",)),
    Row("config-deep-nesting", {"sft.yaml": "data: " + "[" * 100_000 + "]" * 100_000 + "\n"},
        ["sft", "--config", "sft.yaml"], ("sft.yaml: line 1, column 70: invalid YAML: nested more "
                                          "than 64 levels deep",)),
    Row("config-int-of-5000-digits", {"sft.yaml": "seed: " + "7" * 5000 + "\n"},
        ["sft", "--config", "sft.yaml"], ("sft.yaml: line 1, column 7: invalid YAML: an integer of "
                                          "5000 digits (at most 100); refused",)),
    Row("config-required-section-missing", {"eval.yaml": "label: base\n"},
        ["eval", "--config", "eval.yaml"], ("eval.yaml: data: Field required",)),
    Row("config-invalid-yaml", {"sft.yaml": "data: {path: data\nsteps: 3\n"},
        ["sft", "--config", "sft.yaml"], ("sft.yaml: line 2, column 6: invalid YAML:",)),
    Row("config-top-level-list", {"sft.yaml": "- steps: 3\n"}, ["sft", "--config", "sft.yaml"],
        ("sft.yaml: the top level must be a mapping of keys to values, got a list",)),
    Row("config-not-utf8", {"sft.yaml": b"label: caf\xe9\n"}, ["sft", "--config", "sft.yaml"],
        ("sft.yaml: config file is not UTF-8 text (invalid continuation byte)",)),
    Row("config-file-missing", {}, ["grpo", "--config", "grpo.yaml"],
        ("grpo.yaml: config file does not exist",)),
    Row("config-cross-field", {"grpo.yaml": "data: {path: data}\nloss: {kl_to_ref_coeff: 0.1}\n"},
        ["grpo", "--config", "grpo.yaml"],
        ("grpo.yaml: loss.kl_to_ref_coeff > 0 needs `reference: true`",)),
    Row("config-pass-at-over-samples",
        {"eval.yaml": "data: {path: x}\nnum_samples: 2\npass_at: [1, 5]\n"},
        ["eval", "--config", "eval.yaml"], ("eval.yaml: pass_at [5] exceeds num_samples=2",)),
    Row("config-prepare-eval-fraction", {"prepare.yaml": "split: {eval_fraction: 1.5}\n"},
        ["prepare", "--config", "prepare.yaml", "--set", "output_dir=out"],
        ("prepare.yaml: split.eval_fraction: Input should be less than 1 (got 1.5)",)),
    Row("config-prepare-source-for-generated-task", {"prepare.yaml": "source: train.jsonl\n"},
        ["prepare", "--config", "prepare.yaml", "--set", "output_dir=out"],
        ("prepare.yaml: source: task 'arithmetic' is generated and reads no source; remove it",)),
    Row("config-prepare-unknown-task-field",
        {"prepare.yaml": "task: gsm8k\nsource: train.jsonl\ncolumns: {hint: h}\n"},
        ["prepare", "--config", "prepare.yaml", "--set", "output_dir=out"],
        ("prepare.yaml: columns.hint: not a field of task 'gsm8k' (fields: question, answer)",)),
    Row("config-prepare-bad-generator-option",
        {"prepare.yaml": "generate: {train_size: 4, eval_size: 2, options: {digits: 9}}\n"},
        ["prepare", "--config", "prepare.yaml", "--set", "output_dir=out/nested"],
        ("generate.options: digits must be in 1..6, got 9 (set in prepare.yaml)",)),
    Row("config-device-unknown", {"data": PREPARED}, stage("eval", "--set", "model.device=tpu"),
        ("model.device: 'tpu' cannot be used on this machine (",
         "(set by --set model.device=tpu)")),
    Row("config-device-absent", {"data": PREPARED, "sft.yaml": "model: {device: 'cuda:7'}\n"},
        [*stage("sft"), "--config", "sft.yaml"],
        ("model.device: 'cuda:7' cannot be used on this machine (", "(set in sft.yaml)")),
    Row("config-model-path-missing", {"data": PREPARED},
        stage("sft", "--set", "model.name=./no-model"), ("model path no-model does not exist",)),
    # ---------------------------------------------------------------------- impossible topology
    Row("topology-single-with-4-gpus", {"topology.yaml": "trainer: {strategy: single, gpus: 4}\n"},
        topology("topology.yaml"),
        ("topology.yaml: trainer.gpus: strategy 'single' trains in one process on at most 1 GPU "
         "(got 4)",)),
    Row("topology-colocated-mismatch",
        {"topology.yaml": "colocated: true\ninference: {engines: 2, tensor_parallel_size: 2}\n"
                          "trainer: {strategy: ddp, gpus: 2}\n"},
        topology("topology.yaml"),
        ("topology.yaml: trainer.gpus: colocated inference and training share the same GPUs",
         "(2 x 2 = 4), got 2")),
    Row("topology-dedicated-reference-no-gpus",
        {"topology.yaml": "reference: {placement: dedicated}\n"}, topology("topology.yaml"),
        ("topology.yaml: reference.gpus: a dedicated reference model runs on its own GPUs",)),
    Row("topology-transformers-tensor-parallel",
        {"topology.yaml": "inference: {backend: transformers, tensor_parallel_size: 2}\n"},
        topology("topology.yaml"),
        ("topology.yaml: inference.tensor_parallel_size: the transformers backend",)),
    Row("topology-negative-engines", {"topology.yaml": "inference: {engines: -1}\n"},
        topology("topology.yaml"),
        ("topology.yaml: inference.engines: Input should be greater than or equal to 1 (got -1)",)),
    # ---------------------------------------------------------------------- generation kwargs
    Row("genkw-unknown-key", {}, policy({"temprature": 0.7}),
        ("unknown generation kwarg 'temprature'",)),
    Row("genkw-string-temperature", {}, policy({"temperature": "hot"}),
        ("temperature must be a finite number, got 'hot'",)),
    Row("genkw-nan-temperature", {}, policy({"temperature": float("nan")}),
        ("temperature must be a finite number, got nan",)),
    Row("genkw-top-p-over-1", {}, policy({"top_p": 1.5}), ("top_p must be in [0, 1], got 1.5",)),
    Row("genkw-zero-max-tokens", {}, policy({"max_tokens": 0}),
        ("max_new_tokens must be >= 1, got 0",)),
    Row("genkw-greedy-with-temperature", {}, policy({"do_sample": False, "temperature": 0.7}),
        ("do_sample=False (greedy) contradicts temperature=0.7",)),
    Row("genkw-do-sample-string", {}, policy({"do_sample": "yes"}),
        ("do_sample must be true or false, got 'yes'",)),
    Row("genkw-stop-not-a-list", {}, policy({"stop": 5}),
        ("stop_sequences must be a list of non-empty strings, got 5",)),
    Row("genkw-alias-conflict", {}, policy({"max_tokens": 8, "max_new_tokens": 16}),
        ("'max_new_tokens' and its alias both set, to different values",)),
    Row("genkw-num-samples-conflict", {}, policy({"n": 2}, num_samples=4),
        ("num_samples=4 contradicts generate_kwargs num_return_sequences=2",)),
    Row("genkw-config-temperature",
        {"grpo.yaml": "data: {path: data}\ngeneration: {temperature: 0}\n"},
        ["grpo", "--config", "grpo.yaml"],
        ("grpo.yaml: generation.temperature: Input should be greater than 0 (got 0)",)),
    Row("genkw-config-unknown-key", {"eval.yaml": "data: {path: data}\nsampling: {top_q: 0.9}\n"},
        ["eval", "--config", "eval.yaml"],
        ("eval.yaml: unknown key 'sampling.top_q'", "did you mean 'top_p'?")),
    # --------------------------------------------------------------------------- chart values
    *_chart_rows(),
    # ------------------------------------------------------------------------------ CLI flags
    Row("cli-unknown-command", {}, ["trian"], ("argument COMMAND: invalid choice: 'trian'",)),
    Row("cli-unknown-flag", {}, ["sft", "--steps", "3"],
        ("llmrl: error: unrecognized arguments: --steps 3",)),
    Row("cli-bad-log-level", {}, ["--log-level", "LOUD", "prepare"],
        ("argument --log-level: unknown level 'LOUD'; use one of DEBUG, INFO",), subprocess=True),
    Row("cli-set-without-equals", {}, ["sft", "--set", "steps"],
        ("--set steps: expected KEY=VALUE",)),
    Row("cli-set-empty-segment", {}, ["sft", "--set", "data..path=x"],
        ("--set data..path=x: empty key segment in 'data..path'",)),
    Row("cli-set-invalid-yaml", {}, ["sft", "--set", "data.path=x", "--set", "steps=[1"],
        ("--set steps=[1: the value '[1' is not valid YAML",)),
    Row("cli-set-into-a-string", {}, ["sft", "--set", "data.path=x", "--set", "data.path.sub=1"],
        ("--set data.path.sub=1: 'data.path' is a str ('x'), not a mapping of keys",)),
    Row("cli-set-unknown-key", {}, ["grpo", "--set", "data.path=x", "--set", "num_sample=8"],
        ("--set num_sample=8: unknown key 'num_sample'", "did you mean 'num_samples'?")),
    Row("cli-set-negative-steps", {}, ["sft", "--set", "data.path=x", "--set", "steps=-1"],
        ("--set steps=-1: steps: Input should be greater than or equal to 1 (got -1)",)),
    Row("cli-convert-missing-gguf", {}, ["convert-model", "./model.gguf"],
        ("llmrl convert-model: error: model path model.gguf does not exist",)),
    Row("cli-convert-not-gguf", {"model.gguf": b"GGML\x00\x01garbage"},
        ["convert-model", "model.gguf"],
        ("model.gguf is not a readable GGUF file (", "does not start with the GGUF magic bytes")),
    Row("cli-convert-unknown-name", {}, ["convert-model", "smollm3"],
        ("unknown model name 'smollm3': known names are [smollm2-135m-instruct]",)),
]  # fmt: skip


ONE_LINE = {"config-lr-infinite", "config-lr-nan", "config-steps-1e30", "config-steps-huge-int"}
"""Rows whose error is one line naming the field (no second problem, no traceback)."""


@pytest.fixture(scope="module")
def prepared_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared arithmetic dataset (6 train, 3 eval problems)."""
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    config = PrepareConfig(
        generate={"train_size": 6, "eval_size": 3}, output_dir=tmp_path_factory.mktemp("prepared")
    )
    return prepare_dataset(config, progress=False).path


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (the cwd), where MLflow's store and spool would also land."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("LLMRL_MLFLOW_SPOOL", str(folder / "spool"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder / 'mlflow.db'}")
    return folder


def write_inputs(folder: Path, files: Mapping[str, Content], prepared: Path) -> None:
    for name, content in files.items():
        path = folder / name
        if content is PREPARED:
            shutil.copytree(prepared, path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        data = content(prepared) if callable(content) else content
        path.write_bytes(data.encode() if isinstance(data, str) else data)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones included) by its sha256.

    Folders are left out: ``llmrl prepare`` creates its ``output_dir`` root before it reads a row
    and keeps it, empty, after a failure (tests/test_cli_prepare.py relies on that); any file in
    it, a temporary folder's included, shows up here.
    """
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if not path.is_dir()
    }


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    return code, capsys.readouterr().err


def run_subprocess(argv: list[str], folder: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "llmrl.cli", *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id, marks=r.marks) for r in ROWS])
def test_bad_input_fails_cleanly(row: Row, work: Path, prepared_dataset: Path, request, capsys):
    write_inputs(work, row.files, prepared_dataset)
    before = snapshot(work)
    if isinstance(row.command, Api):
        with pytest.raises(row.command.error) as raised:
            row.command.call(request.getfixturevalue)
        message = str(raised.value)
    else:
        if row.subprocess:
            code, message = run_subprocess(row.command, work)
        else:
            code, message = run_in_process(row.command, capsys)
        assert code == 2, message
        assert "Traceback" not in message
    for expected in row.expect:
        assert expected in message, f"{expected!r} not in:\n{message}"
    assert len(message) < 5_000, "user input echoed at length"  # 50 MB rows included
    if row.id in ONE_LINE:
        assert message.strip().count("\n") == 0, message
    assert snapshot(work) == before, "the failed command left files behind or changed its input"


def test_the_corpus_covers_every_category():
    assert len(ROWS) >= 40
    assert len({row.id for row in ROWS}) == len(ROWS)
    prefixes = {row.id.split("-", 1)[0] for row in ROWS}
    assert prefixes >= {"jsonl", "json", "parquet", "prepared", "config", "topology", "genkw",
                        "chart", "cli"}  # fmt: skip
    assert sum(row.subprocess for row in ROWS) >= 4


# ------------------------------------------------------- model folders that would run code
def _evil_pickle(_prepared: Path) -> bytes:
    """A pickle that creates ``PWNED`` in the working directory when it is unpickled."""
    import pickle

    class Payload:
        def __reduce__(self):
            return (open, ("PWNED", "w"))

    return pickle.dumps({"weight": Payload()}, protocol=2)


def _tokenizer_file(name: str) -> Callable[[Path], bytes]:
    """A file of SmolLM2's tokenizer, as ``save_pretrained`` writes it (saved once)."""

    def read(_prepared: Path) -> bytes:
        import functools
        import tempfile

        @functools.cache
        def saved() -> Path:
            from llmrl.models import load_tokenizer

            folder = Path(tempfile.mkdtemp(prefix="llmrl-tokenizer-"))
            load_tokenizer().save_pretrained(folder)
            return folder

        return (saved() / name).read_bytes()

    return read


_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64,
          "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2}  # fmt: skip
MODEL_ROWS = [
    Row("model-pickled-weights",
        {"data": PREPARED, "evil/config.json": json.dumps(_LLAMA),
         "evil/tokenizer.json": _tokenizer_file("tokenizer.json"),
         "evil/pytorch_model.bin": _evil_pickle},
        stage("eval", "--set", "model.name=./evil"),
        ("llmrl eval: error: model directory", "holds pickled weights (pytorch_model.bin)",
         "set model.allow_pickled_weights: true"), subprocess=True),
    Row("model-custom-code",
        {"data": PREPARED, "evil/evil.py": "open('PWNED', 'w')\n",
         "evil/config.json": json.dumps({**_LLAMA, "auto_map": {"AutoConfig": "evil.Config"}})},
        stage("sft", "--set", "model.name=./evil"),
        ("asks to run its own Python code (auto_map in config.json: AutoConfig -> evil.Config)",
         "set model.trust_remote_code: true")),
    Row("model-hostile-chat-template",
        {"data": PREPARED, "evil/config.json": json.dumps(_LLAMA),
         "evil/tokenizer_config.json": json.dumps({"chat_template": (
             "{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}")})},
        stage("eval", "--set", "model.name=./evil"),
        ("the chat template in tokenizer_config.json reaches the Python internal attribute",
         "no setting allows it")),
]  # fmt: skip


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in MODEL_ROWS])
def test_model_folder_that_would_run_code_is_refused(row: Row, work: Path, prepared_dataset: Path,
                                                     request, capsys):  # fmt: skip
    test_bad_input_fails_cleanly(row, work, prepared_dataset, request, capsys)
    assert not (work / "PWNED").exists(), "nothing from the folder ran"
