"""The bad-input corpus's settings rows: config files and ``--set`` values, impossible
topologies, generation kwargs, Helm chart values and CLI flags, each of which must be refused."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from tests.reliability.bad_input import PREPARED, Api, Row, stage
from tests.support.configs import BOMB
from tests.support.paths import REPO

CHART = REPO / "helm" / "llmrl"


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


SETTINGS_ROWS: list[Row] = [
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
