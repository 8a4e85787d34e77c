"""tiny_model: a deterministic random Llama over SmolLM2's real vocabulary."""

from __future__ import annotations

import torch

from llmrl.models import tiny_model


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    state_a, state_b = a.state_dict(), b.state_dict()
    return state_a.keys() == state_b.keys() and all(
        torch.equal(tensor, state_b[name]) for name, tensor in state_a.items()
    )


def test_same_seed_same_weights_whatever_the_global_seed(tokenizer) -> None:
    torch.manual_seed(1)
    first = tiny_model(tokenizer, seed=7)
    torch.manual_seed(2)
    second = tiny_model(tokenizer, seed=7)
    assert _same_weights(first, second)


def test_different_seed_different_weights(tokenizer) -> None:
    a, b = tiny_model(tokenizer, seed=0), tiny_model(tokenizer, seed=1)
    assert not _same_weights(a, b)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(a.state_dict()[embed], b.state_dict()[embed])


def test_session_fixture_is_seed_zero(tiny, tokenizer) -> None:
    assert _same_weights(tiny, tiny_model(tokenizer))


def test_global_rng_untouched(tokenizer) -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    tiny_model(tokenizer, seed=99)
    assert torch.equal(torch.get_rng_state(), before)
    expected = torch.rand(3, generator=torch.Generator().manual_seed(1234))
    torch.manual_seed(1234)
    tiny_model(tokenizer)
    assert torch.equal(torch.rand(3), expected)


def test_vocabulary_and_special_tokens_follow_the_tokenizer(tiny, tokenizer) -> None:
    config = tiny.config
    assert config.vocab_size == len(tokenizer) == 49152
    assert tiny.get_input_embeddings().weight.shape == (49152, 64)
    assert tiny.get_output_embeddings().weight.shape == (49152, 64)
    assert config.pad_token_id == tokenizer.pad_token_id
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.bos_token_id == tokenizer.bos_token_id
    assert config.tie_word_embeddings is True
    lm_head = tiny.get_output_embeddings().weight
    assert lm_head.data_ptr() == tiny.get_input_embeddings().weight.data_ptr()


def test_eval_mode_and_forward_shape(tiny, tokenizer) -> None:
    assert tiny.training is False
    assert not any(module.training for module in tiny.modules())
    batch = tokenizer(
        ["a short one", "and a somewhat longer second prompt"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        logits = tiny(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], 49152)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # Eval mode: no dropout-like randomness between identical calls.
    with torch.no_grad():
        assert torch.equal(tiny(**batch).logits, logits)


def test_sizes_and_dtype_are_configurable(tokenizer) -> None:
    model = tiny_model(
        tokenizer,
        num_layers=3,
        hidden_size=32,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=48,
        dtype=torch.bfloat16,
    )
    config = model.config
    assert len(model.model.layers) == 3
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (
        32,
        2,
        1,
    )
    assert model.model.layers[0].mlp.up_proj.weight.shape == (48, 32)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.training is False
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 49152)


def test_default_tokenizer_is_smollm2(tokenizer) -> None:
    model = tiny_model(num_layers=1, hidden_size=16, num_heads=2, num_kv_heads=1)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_an_ending_model_ends_its_replies_at_the_set_rate(tokenizer):
    """Every step draws EOS with probability eos_prob, whatever came before: the first tokens
    of 512 replies, and the tokens after a non-EOS one, are EOS at that rate (6 binomial
    sigmas); the untied output layer is what sets it."""
    import torch

    from llmrl.models.tiny import ending_model
    from tests.tolerances import sampling_atol

    model = ending_model(tokenizer, eos_prob=0.2)
    assert not model.config.tie_word_embeddings
    prompts = torch.randint(3, 1000, (512, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        probs = model(input_ids=prompts).logits[:, -2:].float().softmax(-1)
    eos = probs[..., tokenizer.eos_token_id]
    # the probability itself, at every position: exact up to the other logits' spread
    assert (eos - 0.2).abs().max() < 0.01, (eos.min(), eos.max())
    draws = torch.multinomial(probs[:, -1], 1, generator=torch.Generator().manual_seed(1))
    rate = (draws.squeeze(-1) == tokenizer.eos_token_id).float().mean().item()
    assert abs(rate - 0.2) <= sampling_atol(0.2, 512)
