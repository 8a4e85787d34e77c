"""pad_sequences / unpad_sequences against hand-written tensors."""

from __future__ import annotations

import pytest
import torch

from llmrl.data import pad_sequences, unpad_sequences

ROWS = [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([], dtype=torch.long)]


def test_left_padding():
    padded, mask = pad_sequences(ROWS, "left", -1)
    assert padded.tolist() == [[1, 2, 3], [-1, -1, 4], [-1, -1, -1]]
    assert mask.tolist() == [[True, True, True], [False, False, True], [False, False, False]]


def test_right_padding():
    padded, mask = pad_sequences(ROWS, "right", 9)
    assert padded.tolist() == [[1, 2, 3], [4, 9, 9], [9, 9, 9]]
    assert mask.tolist() == [[True, True, True], [True, False, False], [False, False, False]]


@pytest.mark.parametrize("side", ["left", "right"])
def test_round_trip_is_lossless_even_when_real_values_equal_the_pad_value(side):
    rows = [torch.tensor([2, 5, 2]), torch.tensor([2]), torch.tensor([7, 2])]  # 2 is also pad
    padded, mask = pad_sequences(rows, side, 2)
    back = unpad_sequences(padded, mask)
    assert [r.tolist() for r in back] == [[2, 5, 2], [2], [7, 2]]


def test_trailing_dims_are_kept():
    rows = [torch.ones(2, 3), torch.zeros(1, 3)]
    padded, mask = pad_sequences(rows, "right", 0.5)
    assert padded.shape == (2, 2, 3)
    assert padded[1, 1].tolist() == [0.5, 0.5, 0.5]
    assert [r.shape for r in unpad_sequences(padded, mask)] == [(2, 3), (1, 3)]


def test_errors():
    with pytest.raises(ValueError, match="padding side must be 'left' or 'right', got 'up'"):
        pad_sequences(ROWS, "up", 0)
    with pytest.raises(ValueError, match="at least one sequence"):
        pad_sequences([], "left", 0)
    with pytest.raises(ValueError, match=r"mask shape \[2, 2\] does not match .* \[3, 3\]"):
        unpad_sequences(torch.zeros(3, 3), torch.ones(2, 2, dtype=torch.bool))
