"""First-fit decreasing: bins checked by hand."""

from __future__ import annotations

import pytest

from llmrl.data.bin_packing import first_fit_decreasing


def test_the_largest_items_open_bins_and_smaller_ones_fill_them():
    # 9 opens bin 0 (free 1); 6 opens bin 1 (free 4); 5 opens bin 2 (free 5); 4 joins bin 1
    # (free 0); 3 joins bin 2 (free 2); 1 joins bin 0 (free 0); 1 joins bin 2 (free 1)
    sizes = [4, 9, 1, 6, 3, 5, 1]
    assert first_fit_decreasing(sizes, 10) == [[1, 2], [0, 3], [4, 5, 6]]


def test_every_bin_fits_and_every_item_is_placed_once():
    sizes = [(7 * i) % 23 + 1 for i in range(40)]
    bins = first_fit_decreasing(sizes, 24)
    assert sorted(i for members in bins for i in members) == list(range(40))
    assert all(sum(sizes[i] for i in members) <= 24 for members in bins)
    # a lower bound on any packing: the total size over the capacity
    assert len(bins) <= -(-sum(sizes) // 24) * 11 / 9 + 1


def test_an_item_over_the_capacity_gets_a_bin_of_its_own():
    assert first_fit_decreasing([3, 12, 2], 5) == [[1], [0, 2]]


def test_equal_items_keep_their_input_order():
    assert first_fit_decreasing([2, 2, 2, 2], 4) == [[0, 1], [2, 3]]


def test_nothing_to_pack_gives_no_bins():
    assert first_fit_decreasing([], 4) == []


@pytest.mark.parametrize(
    ("sizes", "capacity", "message"), [([1], 0, "capacity"), ([-1], 3, "item 0")]
)
def test_bad_sizes_are_named(sizes, capacity, message):
    with pytest.raises(ValueError, match=message):
        first_fit_decreasing(sizes, capacity)
