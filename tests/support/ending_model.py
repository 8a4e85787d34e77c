"""A tiny Llama folder whose replies end with EOS at a set rate (:func:`llmrl.models.tiny.
ending_model`): ragged, skewed lengths from any engine that loads a Hugging Face folder
(transformers, vLLM's CPU build)."""

from __future__ import annotations

from pathlib import Path

from llmrl.models.tiny import ending_model


def save_ending_model(folder: Path, tokenizer, eos_prob: float, seed: int = 0) -> Path:
    """:func:`~llmrl.models.tiny.ending_model` saved with ``tokenizer`` in ``folder`` (a
    ``model.name``)."""
    ending_model(tokenizer, eos_prob, seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
