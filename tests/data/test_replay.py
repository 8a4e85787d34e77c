"""ReplayBuffer: epochs without replacement, uniform sampling, FIFO capacity, write transforms,
iteration, ragged rows."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from llmrl.data import Tokens
from llmrl.data.replay import EmptyBufferError, ReplayBuffer


def _rows(start: int, count: int) -> TensorDict:
    ids = torch.arange(start, start + count)
    return TensorDict({"id": ids, "reward": ids.float() / 10}, batch_size=[count])


def _ids(batch) -> list[int]:
    return batch.get("id").tolist()


def test_without_replacement_covers_every_row_once_per_epoch():
    buffer = ReplayBuffer(seed=0)
    assert buffer.extend(_rows(0, 10)) == 10
    assert len(buffer) == 10
    for _ in range(3):  # three epochs
        seen = _ids(buffer.sample(4)) + _ids(buffer.sample(4)) + _ids(buffer.sample(4))
        assert sorted(seen) == list(range(10)), "the last batch of an epoch is smaller"
    assert buffer.epochs == 3


def test_sampling_order_is_reproducible_from_the_seed_and_shuffled():
    def order(seed: int) -> list[int]:
        buffer = ReplayBuffer(seed=seed)
        buffer.extend(_rows(0, 20))
        return _ids(buffer.sample(20))

    assert order(3) == order(3)
    assert order(3) != order(4)
    assert order(3) != list(range(20))


def test_with_replacement_draws_uniformly_from_stored_rows():
    buffer = ReplayBuffer(sampler="with_replacement", seed=0)
    buffer.extend(_rows(0, 5))
    batch = buffer.sample(200)
    assert batch.batch_size == (200,)
    counts = torch.bincount(batch.get("id"), minlength=5)
    assert (counts > 0).all(), "every row is drawn sometimes"
    assert set(_ids(batch)) <= set(range(5))


def test_capacity_drops_the_oldest_rows_first():
    buffer = ReplayBuffer(capacity=6, seed=0)
    buffer.extend(_rows(0, 4))
    buffer.extend(_rows(4, 4))
    assert len(buffer) == 6
    assert sorted(_ids(buffer.sample(6))) == [2, 3, 4, 5, 6, 7]


def test_rows_dropped_during_an_epoch_are_skipped():
    buffer = ReplayBuffer(capacity=4, seed=0)
    buffer.extend(_rows(0, 4))
    first = _ids(buffer.sample(1))
    buffer.extend(_rows(4, 2))  # drops rows 0 and 1
    rest = _ids(buffer.sample(10))
    assert not set(rest) & {0, 1}
    assert sorted(first + rest) == sorted(set(first + rest)), "no row twice in an epoch"
    # the next epoch covers exactly the rows stored now
    assert sorted(_ids(buffer.sample(10))) == [2, 3, 4, 5]


def test_write_transform_runs_first_and_none_stores_nothing():
    seen = []

    def keep_when_complete(td):
        seen.append(td.batch_size[0])
        if td.batch_size[0] < 3:
            return None  # e.g. a group is not complete yet
        out = td.clone()
        out.set("advantage", td.get("reward") - td.get("reward").mean())
        return out

    buffer = ReplayBuffer(transform=keep_when_complete)
    assert buffer.extend(_rows(0, 2)) == 0
    assert len(buffer) == 0
    assert buffer.extend(_rows(0, 4)) == 4
    assert seen == [2, 4]
    batch = buffer.sample(4)
    # a sum of 4 fp32 rewards minus their mean, values <= 1: a few roundings, ~1e-7 (measured
    # 1.5e-8); a row kept from an incomplete group moves the sum by O(1)
    assert torch.allclose(batch.get("advantage").sum(), torch.tensor(0.0), atol=1e-6)


def test_iteration_is_one_pass_in_batches():
    buffer = ReplayBuffer(batch_size=3, seed=1)
    buffer.extend(_rows(0, 7))
    batches = list(buffer)
    assert [b.batch_size[0] for b in batches] == [3, 3, 1]
    assert sorted(i for b in batches for i in _ids(b)) == list(range(7))
    assert [b.batch_size[0] for b in buffer.iter_batches(4)] == [4, 3]
    uniform = ReplayBuffer(sampler="with_replacement", batch_size=3)
    uniform.extend(_rows(0, 7))
    assert [b.batch_size[0] for b in uniform] == [3, 3, 3]


def test_empty_buffer_errors_and_empty():
    buffer = ReplayBuffer()
    with pytest.raises(EmptyBufferError, match="empty"):
        buffer.sample(2)
    with pytest.raises(ValueError, match="batch size"):
        list(buffer)
    buffer.extend(_rows(0, 3))
    buffer.empty()
    assert len(buffer) == 0
    with pytest.raises(EmptyBufferError):
        buffer.sample(1)
    buffer.extend(_rows(10, 2))
    assert sorted(_ids(buffer.sample(2))) == [10, 11]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="sampler"):
        ReplayBuffer(sampler="prioritized")
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)
    with pytest.raises(TypeError, match="TensorDict"):
        ReplayBuffer().extend([1, 2])


def test_ragged_rows_survive_storage_and_sampling():
    responses = [torch.tensor([1]), torch.tensor([2, 3, 4]), torch.tensor([5, 6])]
    prompts = [torch.tensor([9, 9]), torch.tensor([8]), torch.tensor([7, 7, 7])]
    td = TensorDict(
        {
            "tokens": Tokens.from_sequences(prompt=prompts, response=responses),
            "id": torch.arange(3),
        },
        batch_size=[3],
    )
    buffer = ReplayBuffer(seed=0)
    buffer.extend(td)
    buffer.extend(td[1])  # a single row [] too
    batch = buffer.sample(4)
    tokens = batch.get("tokens")
    for row_id, response, full in zip(
        _ids(batch), tokens.as_list("response"), tokens.as_list("full"), strict=True
    ):
        assert response.tolist() == responses[row_id].tolist()
        assert full.tolist() == torch.cat([prompts[row_id], responses[row_id]]).tolist()
