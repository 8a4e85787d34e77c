"""The trained model is built as the config says: its load options reach the loader."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.common import LoraSettings, ModelConfig
from llmrl.models import UnsafeModelError, tiny_model
from llmrl.train.trainable_model import load_trainable_model


def test_pickled_weights_load_only_when_the_config_allows_them(tmp_path, tokenizer):
    folder = tmp_path / "pickled"
    model = tiny_model(tokenizer, num_layers=1)
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # an older checkpoint's format
    tokenizer.save_pretrained(folder)
    assert list(folder.glob("*.bin")) and not list(folder.glob("*.safetensors"))

    with pytest.raises(UnsafeModelError, match="allow_pickled_weights"):
        load_trainable_model(ModelConfig(name=str(folder)), LoraSettings())
    config = ModelConfig(name=str(folder), allow_pickled_weights=True, dtype="bfloat16")
    model = load_trainable_model(config, LoraSettings())
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the masters
