"""`FrozenReference`: the starting model's log-probs, whatever training did since; with LoRA the
trained model with its adapters off (no second copy), without it a frozen copy."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History
from llmrl.models import load_model, load_tokenizer
from llmrl.policies import TransformersWrapper
from llmrl.train.frozen_reference import FrozenReference

CHATS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "#### 5"}],
    [{"role": "user", "content": "What is 7 * 6?"}, {"role": "assistant", "content": "42"}],
]


def _batch() -> TensorDict:
    history = ChatHistory(full=History.from_chats(CHATS), batch_size=[2])
    return TensorDict({"history": history}, batch_size=[2])


def _log_probs(model: torch.nn.Module, tokenizer) -> list[torch.Tensor]:
    scorer = TransformersWrapper(
        model, tokenizer, generate=False, pad_output=False, return_log_probs=True
    )
    with torch.no_grad():
        return scorer(_batch()).get("log_probs").as_list("full")


def _perturb(model: torch.nn.Module, only: str = "") -> None:
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if only in name:
                parameter.add_(0.05 * torch.randn_like(parameter))


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """The same weights through the same forward: bitwise equal log-probs; 1e-6 is ~1 ulp at
    |log p| ~ 10. Perturbed adapters (0.05 randn) move them by far more."""
    return all(torch.allclose(x, y, rtol=0, atol=1e-6) for x, y in zip(a, b, strict=True))


def test_with_lora_the_reference_is_the_model_with_its_adapters_off(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    tokenizer = load_tokenizer(tiny_model_dir)
    start = _log_probs(load_model(tiny_model_dir).eval(), tokenizer)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(load_model(tiny_model_dir), config).eval()
    reference = FrozenReference(model, tokenizer, str(tiny_model_dir), "float32", "cpu")
    assert reference.model is model  # no second copy
    _perturb(model, only="lora_B")  # "training": the adapters move
    trained = _log_probs(model, tokenizer)
    assert not _equal(trained, start)

    scored = reference(_batch()).get("ref_log_probs").as_list("full")
    assert _equal(scored, start)
    assert _equal(_log_probs(model, tokenizer), trained)  # the adapters are on again


def test_without_lora_the_reference_is_a_frozen_copy_of_the_starting_model(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_model(tiny_model_dir).eval()
    start = _log_probs(model, tokenizer)
    reference = FrozenReference(model, tokenizer, str(tiny_model_dir), "float32", "cpu")
    assert reference.model is not model
    assert not any(p.requires_grad for p in reference.model.parameters())
    _perturb(model)

    scored = reference(_batch()).get("ref_log_probs").as_list("full")
    assert _equal(scored, start)
    assert not _equal(_log_probs(model, tokenizer), start)
