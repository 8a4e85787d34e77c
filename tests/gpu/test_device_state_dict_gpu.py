"""``distributed.device_state_dict`` on CUDA: what vLLM's ``nccl`` and ``ipc`` weight-transfer
engines send from the GPU is on the rank's GPU, with no copy of a plain model (bf16), LoRA
adapters merged under the base names, and under FSDP2 over NCCL every layer whole. The same
checks as the CPU's (tests/support/device_state_checks.py)."""

from __future__ import annotations

import pytest
import torch

from llmrl.models import tiny_model
from tests.gpu.conftest import requires_cuda
from tests.support.device_state_checks import (
    check_fsdp_whole,
    check_merged_lora,
    check_own_tensors,
)

pytestmark = [pytest.mark.gpu, requires_cuda]


def test_a_plain_model_gives_its_own_gpu_tensors(tokenizer):
    check_own_tensors(tiny_model(tokenizer, seed=1).to("cuda", torch.bfloat16))


def test_a_lora_model_gives_the_merged_weights_on_the_gpu(tokenizer):
    check_merged_lora(tokenizer, "cuda")


def test_fsdp_gives_every_layer_whole_on_the_gpu(tokenizer):
    check_fsdp_whole(tokenizer, "cuda", "nccl")
