"""PolicyIOSpec: the policies' inputs and outputs from a spec alone, without a policy or model."""

from __future__ import annotations

import ast
import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History, Text, Tokens
from llmrl.policies import TransformersWrapper
from llmrl.policies.io_spec import GeneratedSample, PolicyIOSpec, ScoreResult
from llmrl.policies.policy_inputs import read_inputs
from llmrl.policies.policy_outputs import write_outputs

POLICIES = Path(__file__).resolve().parents[2] / "llmrl" / "policies"
CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour."}],
]


def _history_batch() -> TensorDict:
    history = History.from_chats(CHATS)
    return TensorDict({"history": ChatHistory(prompt=history, batch_size=[2])}, batch_size=[2])


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_defaults_come_from_the_mode_and_the_tokenizer(tokenizer):
    spec = PolicyIOSpec(tokenizer=tokenizer, input_mode="text", generate=False)
    assert spec.input_key == ("text", "full")
    assert dict(spec.keys) == {k: k for k in ("history", "text", "tokens", "masks", "log_probs")}
    assert spec.pad_token_id == tokenizer.pad_token_id
    assert spec.eos_token_ids == {tokenizer.eos_token_id}
    renamed = PolicyIOSpec(tokenizer=tokenizer, input_mode="tokens", keys={"tokens": "ids"})
    assert renamed.input_key == ("ids", "prompt") and renamed.keys["masks"] == "masks"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"input_mode": "images"}, r"input_mode must be one of \['history', 'text', 'tokens'\]"),
        ({"keys": {"logits": "x"}}, r"unknown output keys \['logits'\]"),
        ({"num_samples": 0}, "num_samples must be >= 1"),
    ],
)
def test_invalid_settings_are_refused(tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyIOSpec(tokenizer=tokenizer, **kwargs)


def test_the_spec_cannot_be_changed_after_it_is_built(tokenizer):
    keys = {"tokens": "ids"}
    spec = PolicyIOSpec(tokenizer=tokenizer, keys=keys)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.pad_output = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.keys["tokens"] = "other"  # type: ignore[index]
    keys["tokens"] = "changed"  # the caller's dict is copied, not shared
    assert spec.keys["tokens"] == "ids"


def test_sampled_outputs_from_a_hand_built_spec(tokenizer):
    spec = PolicyIOSpec(tokenizer=tokenizer, num_samples=2, keys={"tokens": "ids"})
    td = _history_batch()
    inputs = read_inputs(spec, td)
    assert inputs.prompt_text[0].endswith("<|im_start|>assistant\n")
    assert inputs.prompt_tokens[1].tolist() == _ids(tokenizer, inputs.prompt_text[1])
    eos = tokenizer.eos_token_id
    replies = ["Four", "Four.", "Blue", "Red"]
    samples = [
        GeneratedSample(
            tokens=torch.tensor([*_ids(tokenizer, reply), eos]),
            log_probs=torch.full((len(_ids(tokenizer, reply)) + 1,), -float(i)),
            finished=True,
        )
        for i, reply in enumerate(replies)
    ]
    out = write_outputs(spec, td, inputs, samples=samples)
    assert out.batch_size == torch.Size([2, 2]) and "tokens" not in out
    flat = out.reshape(-1)
    for row, reply in enumerate(replies):
        prompt = inputs.prompt_tokens[row // 2]
        assert flat["ids"].as_list("prompt")[row].tolist() == prompt.tolist()
        assert flat["ids"].as_list("response")[row].tolist() == samples[row].tokens.tolist()
        assert flat["masks"].as_list("assistant")[row][len(prompt) :].all()
        assert torch.equal(flat["log_probs"].as_list("response")[row], samples[row].log_probs)
        assert flat["text"][row].response == reply  # the special EOS token skipped
        assert flat["history"].full[row][-1].content == reply
    verbose = dataclasses.replace(spec, skip_special_tokens=False)
    assert verbose.decode_response(samples[0]) == "Four<|im_end|>"
    assert verbose.decode_response(samples[0], content_only=True) == "Four"


def test_scored_outputs_from_a_hand_built_spec_padded(tokenizer):
    spec = PolicyIOSpec(tokenizer=tokenizer, input_mode="tokens", generate=False, pad_output=True)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([8])]
    responses = [torch.tensor([9]), torch.tensor([10, 11, 12])]
    td = TensorDict({"tokens": Tokens.from_sequences(prompt=prompts, response=responses)}, [2])
    inputs = read_inputs(spec, td)
    assert [f.tolist() for f in inputs.full_tokens] == [[5, 6, 7, 9], [8, 10, 11, 12]]
    log_probs = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -4.0, -5.0, -6.0]])
    out = write_outputs(spec, td, inputs, scores=ScoreResult(log_probs=log_probs))
    assert out["tokens"].is_padded
    pad = spec.pad_token_id
    assert out["tokens"].response.tolist() == [[9, pad, pad], [10, 11, 12]]
    assert out["masks"].assistant.tolist() == [
        [False, False, False, True, False, False],
        [False, False, False, True, True, True],
    ]
    assert out["log_probs"].response.tolist() == [[-3.0, 0.0, 0.0], [-4.0, -5.0, -6.0]]
    assert "text" not in out  # tokens mode has no text to write back


def test_text_scoring_reads_prompt_and_response_separately(tokenizer):
    spec = PolicyIOSpec(tokenizer=tokenizer, input_mode="text", generate=False)
    td = TensorDict({"text": Text.from_strings(prompt=["2 + 2 ="], response=[" 4"])}, [1])
    inputs = read_inputs(spec, td)
    prompt, response = _ids(tokenizer, "2 + 2 ="), _ids(tokenizer, " 4")
    assert inputs.full_tokens[0].tolist() == prompt + response
    assert inputs.assistant_masks[0].tolist() == [False] * len(prompt) + [True] * len(response)


def test_a_policy_spec_follows_settings_changed_after_construction(tiny, tokenizer):
    policy = TransformersWrapper(tiny, tokenizer, num_samples=3, pad_output=True)
    spec = policy.io_spec
    assert (spec.num_samples, spec.pad_output, spec.input_key) == (3, True, ("history", "prompt"))
    assert spec.eos_token_ids == frozenset(policy.eos_token_ids)
    assert spec.skip_special_tokens == policy.generate_kwargs.skip_special_tokens
    scorer = policy.get_new_version(generate=False, log_probs_key="lp")
    assert scorer.io_spec.input_key == ("history", "full")
    assert scorer.io_spec.keys["log_probs"] == "lp" and not scorer.io_spec.generate
    other = copy.deepcopy(tokenizer)
    policy.tokenizer = other  # as SFTLoss swaps in its tokenizer
    assert policy.io_spec.tokenizer is other and spec.tokenizer is tokenizer


def _policy_imports(source: str) -> set[str]:
    """Every ``llmrl.policies`` module (or name from the package) ``source`` imports, including
    imports under ``if TYPE_CHECKING:`` and inside functions."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "llmrl.policies":
            found |= {f"llmrl.policies.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llmrl.policies"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("llmrl.policies")}
    return found


@pytest.mark.parametrize("name", ["io_spec", "policy_inputs", "policy_outputs"])
def test_inputs_and_outputs_import_no_policy_class(name):
    source = (POLICIES / f"{name}.py").read_text(encoding="utf-8")
    assert _policy_imports(source) <= {"llmrl.policies.io_spec", "llmrl.policies.policy_inputs"}


def test_the_import_check_sees_type_checking_and_function_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from llmrl.policies.base import LLMWrapperBase\n"
        "def f():\n    import llmrl.policies.vllm_wrapper\n"
        "from llmrl.policies import TransformersWrapper\n"
    )
    assert _policy_imports(source) == {
        "llmrl.policies.base",
        "llmrl.policies.vllm_wrapper",
        "llmrl.policies.TransformersWrapper",
    }
