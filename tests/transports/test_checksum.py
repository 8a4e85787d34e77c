"""The weights checksum catches a single changed element of any dtype, a renamed, reshaped or
recast tensor; it ignores the state dict's order and how a tensor is laid out in memory."""

from __future__ import annotations

import pytest
import torch

from llmrl.core.weights_checksum import (
    BLOCK_WORDS,
    WeightChecksumError,
    tensor_fingerprint,
    verify_checksum,
    weights_checksum,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.uint8]


def state(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    large = torch.randn(3 * BLOCK_WORDS + 5, generator=g) * 50  # blocks, a rest and a tail
    return {"a.weight": large.to(dtype), "b.bias": (torch.randn(7, generator=g) * 50).to(dtype)}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_single_changed_element_is_caught(dtype):
    original = state(dtype)
    reference = weights_checksum(original)
    for name, index in [("a.weight", 0), ("a.weight", BLOCK_WORDS + 3), ("a.weight", -1)]:
        changed = {n: t.clone() for n, t in original.items()}
        flat = changed[name].view(-1)
        bits = flat.view(torch.uint8) if dtype != torch.uint8 else flat
        bits[index * flat.element_size() if index >= 0 else -1] ^= 1  # one bit of one element
        assert weights_checksum(changed) != reference, (dtype, index)


def test_names_shapes_and_dtypes_count_but_order_and_layout_do_not():
    original = state()
    reference = weights_checksum(original)
    assert weights_checksum(dict(reversed(list(original.items())))) == reference
    renamed = {"c.weight" if n == "a.weight" else n: t for n, t in original.items()}
    assert weights_checksum(renamed) != reference
    reshaped = {**original, "b.bias": original["b.bias"].reshape(7, 1)}
    assert weights_checksum(reshaped) != reference
    recast = {**original, "b.bias": original["b.bias"].double()}
    assert weights_checksum(recast) != reference
    matrix = torch.randn(6, 4)
    assert tensor_fingerprint(matrix.t().contiguous()) == tensor_fingerprint(matrix.t())
    stream = torch.zeros(4 * 7 + 4, dtype=torch.uint8)  # a view at an offset not 8-aligned
    stream[4:].copy_(original["b.bias"].view(torch.uint8))
    unaligned = stream[4:].view(torch.float32)
    assert tensor_fingerprint(unaligned) == tensor_fingerprint(original["b.bias"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numpy_and_torch_sums_agree(dtype):
    # CPU tensors are summed with numpy, GPU ones with torch: the fingerprint must not differ
    for tensor in [*state(dtype).values(), torch.zeros(0), torch.tensor(3, dtype=torch.int8)]:
        numpy_sum = tensor_fingerprint(tensor, backend="numpy")
        assert numpy_sum == tensor_fingerprint(tensor, backend="torch")


def test_tied_tensors_empty_and_scalars():
    embedding = torch.randn(10, 4)
    tied = {"embed.weight": embedding, "lm_head.weight": embedding}
    copied = {"embed.weight": embedding, "lm_head.weight": embedding.clone()}
    assert weights_checksum(tied) == weights_checksum(copied)
    assert tensor_fingerprint(torch.zeros(0, 3)) == 0
    assert tensor_fingerprint(torch.tensor(1.0)) != tensor_fingerprint(torch.tensor(2.0))


def test_verify_refuses_a_mismatch_naming_the_receiver():
    original = state()
    assert verify_checksum(original, None, "engine 0") == weights_checksum(original)
    with pytest.raises(WeightChecksumError, match=r"^engine 0: .* does not match the sender's"):
        verify_checksum(original, "0" * 64, "engine 0")
