"""Tiny random sequence classifiers (reward models) over SmolLM2's tokenizer, for fast tests,
and their own forward on hand-built token ids."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def tiny_classifier(
    tokenizer: PreTrainedTokenizerBase, num_labels: int = 1, seed: int = 0
) -> PreTrainedModel:
    """A 2-layer random ``LlamaForSequenceClassification`` over ``tokenizer``'s vocabulary,
    shaped so vLLM's CPU attention accepts it (head size 64), in eval mode."""
    from transformers import LlamaForSequenceClassification

    from llmrl.models import tiny_model

    shape = {"hidden_size": 128, "intermediate_size": 128, "num_heads": 2, "num_kv_heads": 1}
    config = tiny_model(tokenizer, **shape).config  # the suite's tiny Llama, head size 64
    config.num_labels = num_labels
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
    return model.eval()


def save_classifier(
    folder: Path, tokenizer: PreTrainedTokenizerBase, num_labels: int = 1, seed: int = 0
) -> Path:
    """``folder`` with a :func:`tiny_classifier` and the tokenizer saved in it."""
    tiny_classifier(tokenizer, num_labels, seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@torch.no_grad()
def own_logits(folder: Path | str, sequences: list[list[int]]) -> list[list[float]]:
    """The classifier's own forward, one unpadded sequence at a time: its logits per row."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    return [model(torch.tensor([s])).logits[0].tolist() for s in sequences]


def chat_ids(
    tokenizer: PreTrainedTokenizerBase, system: str, prompt: str, response: str
) -> list[int]:
    """Hand-built token ids of a (system, user prompt, assistant response) chat in SmolLM2's
    chat format: the text a reward model with SmolLM2's tokenizer reads for that request."""
    text = "".join(
        f"<|im_start|>{role}\n{content}<|im_end|>\n"
        for role, content in (("system", system), ("user", prompt), ("assistant", response))
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


SYSTEM = "You grade answers."


def score_requests(pairs: list[tuple[str, str]], system: str = SYSTEM) -> list[dict]:
    """Score requests of (user prompt, response) pairs, each chat with the system prompt."""
    return [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": p}],
            "response": r,
            "reference": None,
        }
        for p, r in pairs
    ]


def own_scores(folder: Path | str, tokenizer: PreTrainedTokenizerBase, pairs) -> list[float]:
    """A one-label classifier's own logit of each (prompt, response) pair of
    :func:`score_requests`, from hand-built token ids (:func:`chat_ids`)."""
    ids = [chat_ids(tokenizer, SYSTEM, prompt, response) for prompt, response in pairs]
    return [row[0] for row in own_logits(folder, ids)]
