"""LoRA adapters pushed alone into vLLM's CPU build (``VLLMEngine.load_adapter``).

One engine (a tiny random Llama, fp32, LoRA on q/k/v/o at rank 8) serves the base model, then
three adapters in turn. After each push its prompt log-probs and its sampled log-probs equal the
trainer's peft model's (transformers, fp32); vLLM holds one adapter, under a new id per version;
the version is the engine's; a checksum mismatch or an adapter the engine cannot serve is
refused and the previous adapter stays served.

Tolerance: fp32 log-probs of vLLM's CPU kernels against torch's differ by summation order only.
Measured here: 9.5e-7 for the base model and for every adapter (the LoRA term adds two short
dot products per projection, ``x @ A`` over 128 and ``(x A) @ B`` over r = 8, rounding
~sqrt(128) * 6e-8 * |x| each, below the logit's own). TOL = 2e-5 leaves 20x for other CPUs'
oneDNN kernels; a missing, stale or unscaled adapter moves them by tenths of a nat (asserted:
every push moves them by more than 1000 * TOL).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from llmrl.core.weights_checksum import WeightChecksumError, weights_checksum
from llmrl.policies.vllm_lora import VLLMAdapterSlot, lora_engine_options, write_peft_adapter
from tests.vllm.conftest import assert_close_rows, hf_log_probs

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

TOL = 2e-5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
LORA = {"r": 8, "lora_alpha": 16, "target_modules": TARGETS, "lora_dropout": 0.0}
SEQUENCES = [
    [1, 9690, 198, 504, 3458, 28, 253, 9516, 30, 216, 33, 34],
    list(range(100, 160)),
]


@pytest.fixture(scope="module")
def lora_engine(vllm_tiny_dir):
    """The module's one engine: the tiny model, fp32, LoRA of rank <= 8 on q/k/v/o."""
    from llmrl.policies.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        vllm_tiny_dir, dtype="float32", max_model_len=512, seed=0, **lora_engine_options(8, TARGETS)
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def peft_model(vllm_tiny_dir):
    """The trainer's side: the same tiny model in transformers with a peft LoRA (fp32)."""
    from peft import LoraConfig, get_peft_model

    from llmrl.models import load_model

    base = load_model(vllm_tiny_dir, dtype=torch.float32).eval()
    return get_peft_model(base, LoraConfig(**LORA)).eval()


def train_step(model, seed: int) -> list[tuple[str, torch.Tensor]]:
    """New non-zero adapter weights (B starts at zero in peft), as peft's state dict lists."""
    from peft import get_peft_model_state_dict

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return [(name, t.detach().clone()) for name, t in get_peft_model_state_dict(model).items()]


def trainer_log_probs(model, adapter: bool = True) -> list[torch.Tensor]:
    if adapter:
        return [hf_log_probs(model, s) for s in SEQUENCES]
    with model.disable_adapter():
        return [hf_log_probs(model, s) for s in SEQUENCES]


def biggest_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def test_each_pushed_adapter_is_served_exactly(lora_engine, peft_model):
    assert lora_engine.weight_version() in (None, "default")  # vLLM 0.32's before any push
    assert lora_engine.adapter.request is None
    assert lora_engine.adapter.loaded() == []
    served = lora_engine.prompt_log_probs(SEQUENCES)
    assert_close_rows(trainer_log_probs(peft_model, adapter=False), served, atol=TOL)

    ids, before = [], [torch.tensor(s) for s in served]
    for version in (1, 2, 3):
        named = train_step(peft_model, seed=version)
        previous = lora_engine.adapter.request
        verified = lora_engine.load_adapter(named, LORA, version, weights_checksum(dict(named)))
        assert verified == weights_checksum(dict(named))
        request = lora_engine.adapter.request
        ids.append(request.lora_int_id)
        assert lora_engine.weight_version() == str(version)
        assert lora_engine.adapter.loaded() == [request.lora_int_id]
        if previous is not None:  # unloaded, its folder gone
            assert not Path(previous.lora_path).exists()
        served = lora_engine.prompt_log_probs(SEQUENCES)
        assert_close_rows(trainer_log_probs(peft_model), served, atol=TOL)
        assert biggest_gap([torch.tensor(s) for s in served], before) > 1000 * TOL
        before = [torch.tensor(s) for s in served]
        assert_samples_are_the_trainers(lora_engine, peft_model)
    assert len(set(ids)) == 3, f"one vLLM adapter id per version, got {ids}"

    stale = train_step(peft_model, seed=4)  # the trainer moves on, the push is corrupted
    with pytest.raises(WeightChecksumError):
        lora_engine.load_adapter(stale, LORA, 4, checksum=weights_checksum({"x": torch.ones(1)}))
    assert lora_engine.weight_version() == "3"
    assert lora_engine.adapter.loaded() == [ids[-1]]
    assert_close_rows(before, lora_engine.prompt_log_probs(SEQUENCES), atol=TOL)
    assert len(list(Path(lora_engine.adapter.request.lora_path).parent.iterdir())) == 1


def assert_samples_are_the_trainers(engine, model) -> None:
    """Sampling passes the adapter too: the trainer's forward gives the sampled log-probs."""
    prompt = SEQUENCES[0]
    [[(tokens, log_probs, _)]] = engine.generate(
        [prompt], {"max_tokens": 8, "n": 1, "temperature": 1.0, "seed": 0}, True
    )
    trainer = hf_log_probs(model, prompt + tokens)[-len(tokens) :]
    assert_close_rows([trainer], [log_probs], atol=TOL)


def test_adapters_it_cannot_serve_are_refused_and_change_nothing(lora_engine, peft_model):
    named = train_step(peft_model, seed=11)
    state = (lora_engine.weight_version(), lora_engine.adapter.loaded())
    served = lora_engine.prompt_log_probs(SEQUENCES)
    with pytest.raises(ValueError, match="max_lora_rank 8"):
        lora_engine.load_adapter(named, {**LORA, "r": 16}, 20)
    with pytest.raises(ValueError, match="also targets \\['gate_proj'\\]"):
        lora_engine.load_adapter(named, {**LORA, "target_modules": [*TARGETS, "gate_proj"]}, 21)
    assert (lora_engine.weight_version(), lora_engine.adapter.loaded()) == state
    assert_close_rows(served, lora_engine.prompt_log_probs(SEQUENCES), atol=0.0)


def test_the_adapter_folder_is_what_peft_loads(tmp_path, peft_model, vllm_tiny_dir):
    from peft import PeftModel, get_peft_model_state_dict

    from llmrl.models import load_model

    named = dict(train_step(peft_model, seed=7))
    write_peft_adapter(tmp_path / "adapter", named, LORA)
    base = load_model(vllm_tiny_dir, dtype=torch.float32).eval()
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    reloaded = get_peft_model_state_dict(loaded)
    assert sorted(reloaded) == sorted(named)
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in named.items())
    assert loaded.peft_config["default"].lora_alpha == 16
    with pytest.raises(ValueError, match="lacks \\['lora_alpha'\\]"):
        write_peft_adapter(tmp_path / "bad", named, {"r": 8, "target_modules": TARGETS})


class RefusingEngine:
    """A ``vllm.LLM`` stand-in whose engine loads the first adapter and refuses the rest."""

    def __init__(self) -> None:
        self.removed: list[int] = []
        lora_config = SimpleNamespace(max_lora_rank=8, target_modules=None)
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(lora_config=lora_config),
            add_lora=self.add_lora,
            remove_lora=self.removed.append,
        )

    def add_lora(self, request) -> bool:
        if request.lora_int_id > 1:
            raise RuntimeError("refused")
        return True


def test_a_refused_load_keeps_the_previous_adapter_and_its_folder():
    slot = VLLMAdapterSlot(llm=RefusingEngine(), label="fake")
    tensors = {"base_model.model.x.lora_A.weight": torch.ones(2, 2)}
    first = slot.load(tensors, LORA, version=1)
    with pytest.raises(RuntimeError, match="refused"):
        slot.load(tensors, LORA, version=2)
    assert slot.request is first and Path(first.lora_path).is_dir()
    assert [p.name for p in Path(first.lora_path).parent.iterdir()] == ["v1-id1"]
    assert slot.llm.removed == []
    slot.close()
    assert not Path(first.lora_path).exists()


def test_adapter_folders_go_with_the_slot():
    """Shared memory outlives a process: a slot never closed still deletes its folders."""
    import gc

    slot = VLLMAdapterSlot(llm=RefusingEngine(), label="fake")
    request = slot.load({"base_model.model.x.lora_A.weight": torch.ones(2)}, LORA, version=1)
    assert Path(request.lora_path).is_dir()
    del slot
    gc.collect()
    assert not Path(request.lora_path).parent.exists()


def test_engine_options_round_the_rank_up_to_one_vllm_accepts():
    assert lora_engine_options(8, TARGETS)["max_lora_rank"] == 8
    assert lora_engine_options(12, TARGETS)["max_lora_rank"] == 16
    assert lora_engine_options(16, ["q_proj"]) == {
        "enable_lora": True,
        "max_lora_rank": 16,
        "lora_target_modules": ["q_proj"],
    }
    with pytest.raises(ValueError, match="exceeds"):
        lora_engine_options(1024, TARGETS)
