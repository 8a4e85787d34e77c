"""``distributed.device_state_dict``: what vLLM's GPU weight-transfer engines send, on every rank
and on the rank's own device (``full_state_dict`` gives rank 0 a CPU copy instead). The checks
(tests/support/device_state_checks.py) run here on the CPU and in tests/gpu on CUDA."""

from __future__ import annotations

from llmrl.models import tiny_model
from tests.support.device_state_checks import (
    check_fsdp_whole,
    check_merged_lora,
    check_own_tensors,
)


def test_a_plain_model_gives_its_own_tensors_without_a_copy(tokenizer):
    check_own_tensors(tiny_model(tokenizer, seed=1))


def test_a_lora_model_gives_the_merged_weights_under_the_base_names(tokenizer):
    check_merged_lora(tokenizer, "cpu")


def test_fsdp_gives_every_layer_whole(tokenizer):
    check_fsdp_whole(tokenizer, "cpu", "gloo")  # gloo on CPU
