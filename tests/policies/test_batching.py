"""RequestBatcher: batching, ordering, timeouts, failures and shutdown, with real threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from llmrl.policies.batching import BatchingClosedError, RequestBatcher

LONG = 60.0  # a timeout no test waits for: reaching it would trip pytest-timeout instead


class Recorder:
    """A ``process`` function that multiplies by 10 and records every batch it is given."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, batch: list[int]) -> list[int]:
        self.batches.append(list(batch))
        return [x * 10 for x in batch]

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


def wait_until(condition, deadline: float = 5.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.001)


@pytest.mark.timeout(30)
def test_many_threads_each_get_their_own_answer_and_requests_are_batched():
    process = Recorder()
    barrier = threading.Barrier(16)
    answers: dict[int, int] = {}
    errors: list[BaseException] = []

    with RequestBatcher(process, min_batch_size=4, max_batch_size=8, timeout=1.0) as batcher:

        def worker(i: int) -> None:
            try:
                barrier.wait()
                answers[i] = batcher(i, timeout=20)
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(25)

    assert errors == []
    assert answers == {i: i * 10 for i in range(16)}
    assert len(set(answers.values())) == 16
    assert sorted(x for b in process.batches for x in b) == list(range(16))
    assert all(size <= 8 for size in process.sizes)
    assert max(process.sizes) > 1
    assert batcher.batches_processed == len(process.batches)


@pytest.mark.timeout(30)
def test_max_batch_size_is_respected_exactly():
    process = Recorder()
    batcher = RequestBatcher(process, min_batch_size=4, max_batch_size=4, timeout=LONG)
    # A batch only starts with 4 pending (or on close) and never takes more than 4; the last 2
    # stay below min_batch_size until the draining close, so the split is always 4, 4, 2.
    futures = [batcher.submit(i) for i in range(10)]
    batcher.close(cancel_pending=False)
    assert process.sizes == [4, 4, 2]
    assert process.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [f.result(timeout=5) for f in futures] == [i * 10 for i in range(10)]
    assert batcher.batches_processed == 3


@pytest.mark.timeout(30)
def test_a_backlog_is_split_into_max_sized_batches_in_fifo_order():
    entered, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def process(batch: list[int]) -> list[int]:
        batches.append(list(batch))
        if len(batches) == 1:
            entered.set()
            assert release.wait(10)
        return [x + 100 for x in batch]

    with RequestBatcher(process, max_batch_size=4, timeout=LONG) as batcher:
        first = batcher.submit(0)
        assert entered.wait(5)  # the worker is busy with [0]; the next 9 queue up behind it
        rest = [batcher.submit(i) for i in range(1, 10)]
        assert batcher.pending == 9
        release.set()
        assert first.result(timeout=5) == 100
        assert [f.result(timeout=5) for f in rest] == [i + 100 for i in range(1, 10)]
    assert batches == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]


@pytest.mark.timeout(30)
def test_a_lone_request_is_served_after_the_timeout():
    process = Recorder()
    with RequestBatcher(process, min_batch_size=8, timeout=0.1) as batcher:
        start = time.monotonic()
        assert batcher(7, timeout=10) == 70
        elapsed = time.monotonic() - start
    assert 0.1 <= elapsed < 5.0  # it waited for more requests, but not forever
    assert process.batches == [[7]]


@pytest.mark.timeout(30)
def test_reaching_min_batch_size_does_not_wait_for_the_timeout():
    process = Recorder()
    with RequestBatcher(process, min_batch_size=2, timeout=LONG) as batcher:
        futures = [batcher.submit(1), batcher.submit(2)]
        assert [f.result(timeout=5) for f in futures] == [10, 20]
    assert process.batches == [[1, 2]]


@pytest.mark.timeout(30)
def test_a_failing_process_fails_its_whole_batch_and_the_worker_survives():
    def process(batch: list[int]) -> list[int]:
        if any(x < 0 for x in batch):
            raise ValueError(f"negative request in {batch}")
        return [x * 10 for x in batch]

    with RequestBatcher(process, min_batch_size=3, timeout=LONG) as batcher:
        failed = [batcher.submit(x) for x in (1, -2, 3)]
        for future in failed:
            exc = future.exception(timeout=5)
            assert type(exc) is ValueError
            assert str(exc) == "negative request in [1, -2, 3]"
        with pytest.raises(ValueError, match=r"negative request in \[1, -2, 3\]"):
            failed[0].result()
        later = [batcher.submit(x) for x in (4, 5, 6)]
        assert [f.result(timeout=5) for f in later] == [40, 50, 60]
        assert batcher.batches_processed == 2


@pytest.mark.timeout(30)
def test_wrong_number_of_results_is_a_runtime_error_for_every_caller():
    with RequestBatcher(lambda batch: batch[:-1], min_batch_size=3, timeout=LONG) as batcher:
        futures = [batcher.submit(x) for x in range(3)]
        for future in futures:
            with pytest.raises(
                RuntimeError, match="process returned 2 results for a batch of 3 requests"
            ):
                future.result(timeout=5)


@pytest.mark.timeout(30)
def test_close_fails_pending_requests_and_blocked_callers():
    process = Recorder()
    batcher = RequestBatcher(process, min_batch_size=100, max_batch_size=100, timeout=LONG)
    futures = [batcher.submit(i) for i in range(3)]
    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            batcher(99, timeout=20)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    wait_until(lambda: batcher.pending == 4)
    batcher.close()
    thread.join(10)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], BatchingClosedError)
    for future in futures:
        assert isinstance(future.exception(timeout=5), BatchingClosedError)
    assert process.batches == []
    assert batcher.pending == 0


def test_batching_closed_error_is_a_runtime_error():
    assert issubclass(BatchingClosedError, RuntimeError)


@pytest.mark.timeout(30)
def test_submit_and_call_after_close_raise():
    batcher = RequestBatcher(Recorder())
    assert batcher(1, timeout=5) == 10
    batcher.close()
    with pytest.raises(BatchingClosedError):
        batcher.submit(2)
    with pytest.raises(BatchingClosedError):
        batcher(3)


@pytest.mark.timeout(30)
def test_close_without_cancel_serves_pending_requests_first():
    process = Recorder()
    batcher = RequestBatcher(process, min_batch_size=100, max_batch_size=100, timeout=LONG)
    futures = [batcher.submit(i) for i in range(3)]
    batcher.close(cancel_pending=False)
    assert [f.result(timeout=5) for f in futures] == [0, 10, 20]
    assert process.batches == [[0, 1, 2]]
    with pytest.raises(BatchingClosedError):
        batcher.submit(4)


@pytest.mark.timeout(30)
def test_close_lets_the_running_batch_finish_and_cancels_the_queued_ones():
    entered, release = threading.Event(), threading.Event()

    def process(batch: list[int]) -> list[int]:
        entered.set()
        assert release.wait(10)
        return [x * 10 for x in batch]

    batcher = RequestBatcher(process, timeout=LONG)
    running = batcher.submit(1)
    assert entered.wait(5)
    queued = [batcher.submit(2), batcher.submit(3)]
    closer = threading.Thread(target=batcher.close)
    closer.start()
    for future in queued:  # failed right away, while the running batch is still in process
        assert isinstance(future.exception(timeout=5), BatchingClosedError)
    assert closer.is_alive()  # close() is joining the worker, which is still in process
    release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert running.result(timeout=5) == 10


@pytest.mark.timeout(30)
def test_close_is_idempotent_and_joins_the_named_daemon_worker():
    RequestBatcher(Recorder()).close()  # never started: nothing to join

    batcher = RequestBatcher(Recorder(), name="test-batcher-worker")
    assert batcher(1, timeout=5) == 10
    workers = [t for t in threading.enumerate() if t.name == "test-batcher-worker"]
    assert len(workers) == 1
    assert workers[0].daemon
    batcher.close()
    batcher.close()
    batcher.close(cancel_pending=False)
    assert not workers[0].is_alive()


@pytest.mark.timeout(30)
def test_context_manager_closes_on_exit():
    with RequestBatcher(
        Recorder(), min_batch_size=100, max_batch_size=100, timeout=LONG
    ) as batcher:
        future = batcher.submit(1)
    assert isinstance(future.exception(timeout=5), BatchingClosedError)
    with pytest.raises(BatchingClosedError):
        batcher.submit(2)


@pytest.mark.timeout(30)
def test_cancelled_requests_are_skipped():
    process = Recorder()
    with RequestBatcher(process, min_batch_size=3, timeout=LONG) as batcher:
        dropped = batcher.submit(1)
        assert dropped.cancel()
        kept = [batcher.submit(2), batcher.submit(3)]
        assert [f.result(timeout=5) for f in kept] == [20, 30]
    assert process.batches == [[2, 3]]


@pytest.mark.timeout(30)
def test_call_timeout_raises_and_cancels_the_request():
    process = Recorder()
    batcher = RequestBatcher(process, min_batch_size=100, max_batch_size=100, timeout=LONG)
    with pytest.raises(FutureTimeoutError):
        batcher(1, timeout=0.05)
    batcher.close(cancel_pending=False)
    assert process.batches == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_batch_size": 0}, "min_batch_size must be >= 1, got 0"),
        ({"min_batch_size": -3}, "min_batch_size must be >= 1, got -3"),
        ({"min_batch_size": 4, "max_batch_size": 2}, "max_batch_size must be >= min_batch_size"),
        ({"max_batch_size": 0}, "max_batch_size must be >= min_batch_size"),
        ({"timeout": 0}, "timeout must be > 0, got 0"),
        ({"timeout": -1.5}, "timeout must be > 0, got -1.5"),
    ],
)
def test_invalid_arguments_are_rejected_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        RequestBatcher(Recorder(), **kwargs)
    assert str(info.value).startswith(message)


def test_equal_min_and_max_batch_size_is_valid():
    RequestBatcher(Recorder(), min_batch_size=4, max_batch_size=4).close()


@pytest.mark.timeout(30)
def test_close_tolerates_requests_the_caller_already_cancelled():
    batcher = RequestBatcher(Recorder(), min_batch_size=100, max_batch_size=100, timeout=LONG)
    dropped, kept = batcher.submit(1), batcher.submit(2)
    assert dropped.cancel()
    batcher.close()
    assert dropped.cancelled()
    assert isinstance(kept.exception(timeout=5), BatchingClosedError)


@pytest.mark.timeout(30)
def test_sizes_count_rows_a_full_batch_is_served_at_once_not_after_the_timeout():
    # the GRPO engine's case: it waits for a step's rows (min 8 here), two workers send 4 each
    process = Recorder()
    rows = len  # a request is a list of rows
    with RequestBatcher(process, min_batch_size=8, max_batch_size=8, timeout=LONG, size=rows) as b:
        first = b.submit([1, 2, 3, 4])
        time.sleep(0.05)
        assert not first.done(), "4 of 8 rows: the batcher must wait for more"
        second = b.submit([5, 6, 7, 8])
        # served now: waiting for the LONG timeout would trip pytest-timeout
        assert first.result(timeout=10) == [1, 2, 3, 4] * 10
        assert second.result(timeout=10) == [5, 6, 7, 8] * 10
    assert process.batches == [[[1, 2, 3, 4], [5, 6, 7, 8]]]


@pytest.mark.timeout(30)
def test_max_batch_size_caps_the_rows_of_a_batch_and_an_oversized_request_goes_alone():
    process = Recorder()
    batcher = RequestBatcher(process, min_batch_size=1, max_batch_size=6, timeout=LONG, size=len)
    with batcher._cond:  # queue all four before the worker looks
        futures = [batcher.submit(list(range(n))) for n in (4, 2, 7, 3)]
    assert [len(f.result(timeout=10)) for f in futures] == [40, 20, 70, 30]  # their own
    batcher.close()
    assert [[len(r) for r in batch] for batch in process.batches] == [[4, 2], [7], [3]]
