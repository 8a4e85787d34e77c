"""A model served by another process: a real ``vllm serve`` (vLLM's CPU build) on localhost,
used by URL through the policy API and by the eval stage (``engine_url``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from llmrl.config.evaluate import EvalConfig
from llmrl.policies import TransformersWrapper, vLLMWrapper
from llmrl.policies.remote_vllm import RemoteEngineError, RemoteVLLMEngine
from llmrl.stages.evaluate import evaluate
from tests.support.chats import history_batch
from tests.support.configs import stage_config
from tests.support.vllm_server import free_port, served_model
from tests.vllm.conftest import (
    assert_close_rows,
    assert_trainer_reproduces_sampled_log_probs,
    hf_log_probs,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("isolated_stage"),
]


@pytest.fixture(scope="module")
def server_url(model_dir, tmp_path_factory) -> Iterator[str]:
    """``vllm serve`` of SmolLM2 (fp32, eager) on a free port; its log is shown on failure."""
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    arguments = ("--dtype", "float32", "--max-model-len", "1024", "--enforce-eager")
    with served_model(model_dir, log, *arguments, "--served-model-name", "smollm2") as url:
        yield url


def test_the_policy_api_samples_and_scores_through_the_server(server_url, hf_model, tokenizer):
    policy = vLLMWrapper(
        server_url, tokenizer, num_samples=2, generate_kwargs={"max_new_tokens": 12, "seed": 0}
    )
    [engine] = policy.engines
    assert isinstance(engine, RemoteVLLMEngine) and engine.model == "smollm2"
    out = policy(history_batch())
    assert out.batch_size == torch.Size([3, 2])
    flat = out.reshape(-1)
    assert_trainer_reproduces_sampled_log_probs(hf_model, flat)
    full = flat["tokens"].as_list("full")
    scored = policy.get_new_version(generate=False, input_mode="tokens", num_samples=None)(flat)
    assert_close_rows(
        [hf_log_probs(hf_model, s.tolist()) for s in full], scored["log_probs"].as_list("full")
    )
    # the same seed draws the same samples again: seeds travel with each request
    again = policy(history_batch())
    assert [r.tolist() for r in again.reshape(-1)["tokens"].as_list("response")] == [
        r.tolist() for r in flat["tokens"].as_list("response")
    ]


def test_greedy_answers_from_the_server_equal_the_local_models(server_url, hf_model, tokenizer):
    greedy = {"max_new_tokens": 16, "do_sample": False}
    remote = vLLMWrapper(server_url, tokenizer, generate_kwargs=greedy)(history_batch())
    local = TransformersWrapper(hf_model, tokenizer, generate_kwargs=greedy)(history_batch())
    assert [r.tolist() for r in remote["tokens"].as_list("response")] == [
        r.tolist() for r in local["tokens"].as_list("response")
    ]
    assert [str(m[-1].content) for m in remote["history"].full] == [
        str(m[-1].content) for m in local["history"].full
    ]


def test_an_unreachable_or_wrong_server_names_the_url(server_url):
    port = free_port()
    with pytest.raises(RemoteEngineError, match=rf"http://127\.0\.0\.1:{port}/v1/models"):
        RemoteVLLMEngine(f"http://127.0.0.1:{port}", timeout_s=5)
    wrong = RemoteVLLMEngine(server_url, model="no-such-model")
    with pytest.raises(RemoteEngineError, match=r"/v1/completions answered 404"):
        wrong.generate([[1, 2, 3]], {"max_tokens": 2, "n": 1})
    with pytest.raises(ValueError, match="must start with http"):
        RemoteVLLMEngine("localhost:8000")


def test_an_evaluation_served_by_another_process_matches_the_local_one(
    server_url,
    model_dir,
    arithmetic_data,
):
    def run(label: str, *extra: str) -> tuple[float, list[dict]]:
        config = stage_config(
            EvalConfig,
            f"data.path={arithmetic_data}",
            f"model.name={model_dir}",
            "data.max_eval_rows=6",
            "tracking.enabled=false",
            *extra,
            output_dir=label,
            label=label,
            max_new_tokens=24,
            batch_size=6,
        )
        report = evaluate(config)
        rows = [json.loads(line) for line in Path(label, "results.jsonl").read_text().splitlines()]
        return report.accuracy, rows

    local = run("local")
    served = run("served", f"engine_url={server_url}", "engine_model=smollm2")
    assert served[0] == local[0]
    strip = [("id", "prompt", "answer", "correct", "response")]
    assert [{k: r[k] for k in strip[0]} for r in served[1]] == [
        {k: r[k] for k in strip[0]} for r in local[1]
    ]
    assert len(served[1]) == 6
