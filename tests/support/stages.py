"""What a training stage leaves behind, read back: the metrics a GRPO step logs, a checkpoint's
trainer state and MLflow run id, a saved model that still generates; and how far two
computations of a first-update loss may differ."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.tolerances import rounding_atol

ROLLOUT_METRICS = (
    "reward_mean",
    "reward_std",
    "accuracy",
    "format_rate",
    "response_length_mean",
    "response_tokens",
    "tokens_per_second",
    "generation_seconds",
    "training_seconds",
    "weight_sync_seconds",
    "dropped_zero_std_groups",
    "underfilled_steps",
    "sampling_rounds",
    "resampled_groups",
    "zero_std_groups",
    "informative_group_fraction",
    "trained_groups",
    "surplus_groups",
    "skipped_steps",
    "policy_version",
    "staleness",
)
"""The rollout metrics a GRPO step logs, every step."""


def first_update_loss_atol(batch) -> float:
    """How far two computations of a batch's first-update loss may differ. That loss is a token
    mean of ``-A`` (ratio exactly 1) whose terms cancel to near 0, so only an absolute bound
    counts: summed in another order (per rank, across ranks, micro-batch by micro-batch), its
    ``n`` float32 terms of up to ``max|A|`` round at worst ``n`` times in one direction."""
    tokens = sum(len(r) for r in batch["tokens"].as_list("response"))
    magnitude = float(batch["advantage"].abs().max())
    return rounding_atol(magnitude, torch.float32, roundings=tokens)


def trainer_state(checkpoint: str | Path) -> dict:
    """A checkpoint's ``trainer_state.json`` (``<ckpt>`` or ``<ckpt>/model``)."""
    folder = Path(checkpoint)
    if folder.name == "model":
        folder = folder.parent
    return json.loads((folder / "trainer_state.json").read_text())


def run_id_of(checkpoint: str | Path) -> str:
    """The MLflow run id a stage stored in a checkpoint (``<ckpt>`` or ``<ckpt>/model``)."""
    return trainer_state(checkpoint)["extra"]["mlflow_run_id"]


def assert_generates(model_dir: str | Path) -> None:
    """``model_dir`` loads as a plain Llama (no LoRA layers left) and greedily generates."""
    from tensordict import TensorDict
    from transformers import LlamaForCausalLM

    from llmrl.data import ChatHistory, History
    from llmrl.models import load_model, load_tokenizer
    from llmrl.policies import TransformersWrapper

    model = load_model(model_dir)
    assert type(model) is LlamaForCausalLM
    assert not any("lora" in name for name, _ in model.named_parameters())
    policy = TransformersWrapper(
        model, load_tokenizer(model_dir), generate_kwargs={"max_new_tokens": 4, "do_sample": False}
    )
    prompt = History.from_chats([[{"role": "user", "content": "What is 2 + 3?"}]])
    state = TensorDict({"history": ChatHistory(prompt=prompt, batch_size=[1])}, batch_size=[1])
    with torch.no_grad():
        out = policy(state)
    responses = out["tokens"].as_list("response")
    assert len(responses) == 1 and len(responses[0]) >= 1
