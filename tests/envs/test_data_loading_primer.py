"""DataLoadingPrimer and DatasetChatEnv: batches, GRPO groups, epochs, resume."""

from __future__ import annotations

import pytest

from llmrl.envs import DataLoadingPrimer, DatasetChatEnv
from llmrl.envs.tasks import Problem

ROWS = [Problem(id=f"p{i}", prompt=f"question {i}", answer=str(i)) for i in range(5)]


def test_repeats_form_groups_that_keep_id_and_answer():
    primer = DataLoadingPrimer(ROWS, batch_size=2, repeats=3, shuffle=False)
    batch = primer.next_batch()
    assert batch.batch_size == (6,)
    assert batch["prompt_id"].tolist() == ["p0", "p0", "p0", "p1", "p1", "p1"]
    assert batch["answer"].tolist() == ["0", "0", "0", "1", "1", "1"]
    assert batch["group_id"].tolist() == [0, 0, 0, 1, 1, 1]
    assert batch["sample_index"].tolist() == [0, 1, 2, 0, 1, 2]
    assert primer.next_batch()["group_id"].tolist() == [2, 2, 2, 3, 3, 3], "group ids never repeat"


def test_epochs_reshuffle_deterministically_and_end():
    first = DataLoadingPrimer(ROWS, batch_size=5, seed=3, epochs=2)
    second = DataLoadingPrimer(ROWS, batch_size=5, seed=3, epochs=2)
    epoch0 = first.next_batch()["prompt_id"].tolist()
    epoch1 = first.next_batch()["prompt_id"].tolist()
    assert sorted(epoch0) == sorted(epoch1) == [f"p{i}" for i in range(5)]
    assert epoch0 != epoch1, "each epoch has its own order"
    assert second.next_batch()["prompt_id"].tolist() == epoch0, "same seed, same order"
    with pytest.raises(StopIteration, match="exhausted after 2 epoch"):
        first.next_batch()


def test_last_partial_batch_of_the_final_epoch():
    primer = DataLoadingPrimer(ROWS, batch_size=2, shuffle=False, epochs=1)
    sizes = [primer.next_batch().batch_size[0] for _ in range(3)]
    assert sizes == [2, 2, 1]


def test_state_dict_resumes_with_the_same_rows():
    primer = DataLoadingPrimer(ROWS, batch_size=2, seed=1)
    primer.next_batch()
    state = primer.state_dict()
    expected = [primer.next_batch()["prompt_id"].tolist() for _ in range(4)]
    resumed = DataLoadingPrimer(ROWS, batch_size=2, seed=1)
    resumed.load_state_dict(state)
    assert [resumed.next_batch()["prompt_id"].tolist() for _ in range(4)] == expected


def test_dataset_env_reset_uses_the_primer():
    env = DatasetChatEnv(ROWS, batch_size=2, repeats=2, shuffle=False, system_prompt="S")
    td = env.reset()
    chats = td["history"].prompt.to_chats()
    assert [c[1]["content"] for c in chats] == ["question 0"] * 2 + ["question 1"] * 2
    assert all(c[0] == {"role": "system", "content": "S", "is_complete": True} for c in chats)


def test_bad_rows_and_arguments():
    with pytest.raises(ValueError, match=r"dataset row 1: field\(s\) \['answer'\] missing"):
        DataLoadingPrimer(
            [{"id": "a", "prompt": "p", "answer": "1"}, {"id": "b", "prompt": "p"}], 1
        )
    with pytest.raises(ValueError, match="batch_size and repeats must be >= 1"):
        DataLoadingPrimer(ROWS, batch_size=0)
    with pytest.raises(ValueError, match="at least one row"):
        DataLoadingPrimer([], batch_size=1)
