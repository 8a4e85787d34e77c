"""``lora.sync: adapter`` on the transformers engine: the inference actor holds the base model in
peft LoRA layers of the trainer's shape, and each push swaps only the adapter's tensors.

The engine and the trainer run the same peft layers on the same CPU kernels in the same dtype
(float32), on identical weights once the adapter is loaded: their log-probs agree bit for bit
(a tolerance of 0), and any stale or missing adapter tensor shows (the adapters here move the
log-probs by > 1e-3).
"""

from __future__ import annotations

import pytest
import torch

from llmrl.collectors.ray_actors import InferenceActor
from llmrl.config.common import LoraSettings
from llmrl.config.grpo import GRPOConfig
from llmrl.core.weights_checksum import WeightChecksumError, weights_checksum
from llmrl.models.adapters import adapter_state
from llmrl.runtime.engines import TransformersEngine
from llmrl.train.lora import apply_lora
from tests.support.configs import stage_config

LORA = LoraSettings(enabled=True, r=4, alpha=8)
SEQUENCE = torch.tensor([[1, 9690, 198, 504, 3458, 28, 253, 9516, 30, 216]])


def log_probs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=SEQUENCE).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, SEQUENCE[0, 1:, None])[:, 0]


@pytest.fixture(scope="module")
def trainer(tiny):
    import copy

    return apply_lora(copy.deepcopy(tiny), LORA)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    factory = TransformersEngine(
        model=str(tiny_model_dir),
        dtype="float32",
        device="cpu",
        generate_kwargs={"max_new_tokens": 4},
        batch_rows=1,
        lora=LORA.adapter_config(),
    )
    return InferenceActor(policy_factory=factory)


def optimizer_step(model: torch.nn.Module, seed: int) -> None:
    """Move every adapter tensor as a training step would (B starts at zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


def test_after_every_push_the_engine_scores_exactly_like_the_trainer(engine, trainer, tiny):
    base = log_probs(tiny)
    assert torch.equal(log_probs(engine.policy.model), base), "before a push: the base"
    for version in (1, 2, 3):
        optimizer_step(trainer, seed=version)
        adapter = adapter_state(trainer)
        assert all(".lora_A." in n or ".lora_B." in n for n in adapter)
        held = engine.load_adapter(list(adapter.items()), LORA.adapter_config(), version)
        assert held == weights_checksum(adapter), "the engine holds what was sent"
        assert engine.version == version
        expected = log_probs(trainer)
        assert (expected - base).abs().max() > 1e-3, "the adapter matters"
        assert torch.equal(log_probs(engine.policy.model), expected)


def test_a_checksum_mismatch_or_another_shape_is_refused_and_changes_nothing(engine, trainer):
    before = log_probs(engine.policy.model)
    adapter = adapter_state(trainer)
    changed = {name: tensor + 1 for name, tensor in adapter.items()}
    with pytest.raises(WeightChecksumError, match="does not match the sender's"):
        engine.load_adapter(
            list(changed.items()), LORA.adapter_config(), 9, weights_checksum(adapter)
        )
    wider = {n: torch.zeros(8, t.shape[1]) if ".lora_A." in n else t for n, t in adapter.items()}
    with pytest.raises(ValueError, match=r"shape \(8, 64\).*another lora.r"):
        engine.load_adapter(list(wider.items()), LORA.adapter_config(), 9)
    with pytest.raises(ValueError, match="1 unknown"):
        engine.load_adapter([*adapter.items(), ("extra.lora_A.weight", torch.ones(1))], {}, 9)
    assert torch.equal(log_probs(engine.policy.model), before) and engine.version != 9


def test_adapter_sync_is_the_default_and_refuses_what_cannot_carry_it(arithmetic_data):
    config = stage_config(GRPOConfig, f"data.path={arithmetic_data}", "lora.enabled=true")
    assert config.lora.sync == "adapter" and config.lora.pushes_adapter
    merged = stage_config(GRPOConfig, f"data.path={arithmetic_data}", "lora.sync=merged")
    assert not merged.lora.pushes_adapter, "LoRA off: nothing to push alone"
    transformers = "topology.inference.backend=transformers"
    for override, message in (
        ("topology.weight_transport=broadcast", "weight_transport 'broadcast' carries whole"),
        ("runtime.compile_decode=true", "compile_decode: the compiled decode runs the plain"),
    ):
        with pytest.raises(Exception, match=message):
            stage_config(
                GRPOConfig,
                f"data.path={arithmetic_data}",
                "lora.enabled=true",
                transformers,
                override,
            )
    stage_config(GRPOConfig, f"data.path={arithmetic_data}", "lora.enabled=true", transformers)
