"""A model role's servers on a local Ray, and the client that calls them: concurrent callers
batched into one scorer call, the reward model scoring in its actor what its own forward
computes, deadlines and bounded retries, and a killed server rebuilt."""

from __future__ import annotations

import pickle
import threading

import pytest

from llmrl.scorers.client import ModelClient
from llmrl.scorers.errors import ModelCallError
from llmrl.scorers.policy_factory import ScoringPolicyFactory
from llmrl.scorers.reward_model import RewardModelFactory
from llmrl.scorers.server import start_model_servers
from tests.support.ray_local import actor_runtime_env
from tests.support.reward_models import own_scores, score_requests
from tests.support.scripted_scorers import BrokenFactory, LengthScorerFactory, request

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def actor_options(local_ray, session_cache):
    """One server's Ray options: a tenth of a CPU, the session's cache and the repository."""
    return {"num_cpus": 0.1, "runtime_env": actor_runtime_env(session_cache)}


def _servers(factory, actor_options, count=1, **options):
    options = {"max_restarts": 1, "max_task_retries": 1, **options}
    return start_model_servers(
        "reward_model", factory, actor_options=[actor_options] * count, **options
    )


def _in_threads(call, arguments: list) -> list:
    """``call(argument)`` from one thread per argument, all started together."""
    results: list = [None] * len(arguments)
    barrier = threading.Barrier(len(arguments))

    def run(index: int) -> None:
        barrier.wait()
        results[index] = call(arguments[index])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(arguments))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_callers_reach_the_reward_model_as_one_call_scoring_its_own_forward(
    actor_options, tiny_classifier_dir, tokenizer
):
    import ray

    factory = RewardModelFactory(engine=ScoringPolicyFactory(model=str(tiny_classifier_dir)))
    [server] = _servers(factory, actor_options, batch_rows=5, batching_timeout_s=30)
    client = ModelClient(role="reward_model", servers=[server], timeout_s=60, max_retries=0)
    pairs = [("2+2?", "4"), ("3+3?", "six"), ("Hi", "Hello there"), ("1+1?", "2"), ("Go", "ok")]
    requests = score_requests(pairs)
    # three env workers: 2 + 2 + 1 rows; the batch waits for its 5 rows, not for 30 s
    parts = _in_threads(client, [requests[:2], requests[2:4], requests[4:]])
    expected = own_scores(tiny_classifier_dir, tokenizer, pairs)
    assert [score for part in parts for score in part] == pytest.approx(expected, abs=1e-5)
    got = ray.get(server.metrics.remote())
    assert (got["requests"], got["rows"], got["batches"], got["failures"]) == (3, 5, 1, 0)
    assert 0 < got["latency_s_max"] <= got["latency_s_total"] < 30
    assert client.metrics()["requests"] == 3 and client.metrics()["failures"] == 0


def test_a_batch_holds_at_most_batch_rows_and_callers_get_their_own_rows(actor_options):
    import ray

    [server] = _servers(LengthScorerFactory(), actor_options, batch_rows=4, batching_timeout_s=5)
    client = ModelClient(role="reward_model", servers=[server], timeout_s=60)
    calls = [[request("x" * (10 * i + j)) for j in range(2)] for i in range(4)]
    parts = _in_threads(client, calls)
    assert parts == [[10.0 * i, 10.0 * i + 1] for i in range(4)]
    got = ray.get(server.metrics.remote())
    assert (got["requests"], got["rows"], got["batches"]) == (4, 8, 2)


def test_a_slow_server_times_out_is_retried_then_fails_with_the_role_server_and_cause(
    actor_options,
):
    servers = _servers(LengthScorerFactory(delay_s=3), actor_options, count=2)
    client = ModelClient(role="judge", servers=servers, timeout_s=0.5, max_retries=1)
    with pytest.raises(ModelCallError) as failed:
        client([request("4")])
    assert str(failed.value) == (
        "judge: the call to server 1 failed after 2 attempts: no answer within timeout_s=0.5 s"
    )
    assert (failed.value.role, failed.value.server, failed.value.attempts) == ("judge", 1, 2)
    metrics = client.metrics()
    assert (metrics["requests"], metrics["failures"], metrics["retries"]) == (1, 1, 1)
    assert metrics["latency_s_total"] >= 1.0
    patient = ModelClient(role="judge", servers=servers, timeout_s=30, max_retries=0)
    assert patient([request("four")]) == [4.0]


def test_a_killed_server_is_rebuilt_and_the_next_call_succeeds(actor_options):
    import ray

    [server] = _servers(LengthScorerFactory(), actor_options, max_restarts=2)
    client = ModelClient(role="reward_model", servers=[server], timeout_s=120, max_retries=1)
    assert client([request("abc")]) == [3.0]
    ray.kill(server, no_restart=False)
    copy = pickle.loads(pickle.dumps(client))  # an env worker's client: the same handles
    assert copy([request("abcd")]) == [4.0]
    assert ray.get(server.metrics.remote())["requests"] == 1  # a new actor counts afresh
    assert copy.metrics()["failures"] == 0


def test_a_server_that_cannot_build_its_scorer_is_named(actor_options):
    cause = "ActorDiedError: FileNotFoundError: no model at /nowhere"
    with pytest.raises(RuntimeError, match=rf"^reward_model server 0 did not start: {cause}$"):
        _servers(BrokenFactory(), actor_options, max_restarts=0)


def test_a_url_role_scores_in_the_callers_process_with_the_same_deadline():
    client = ModelClient(role="reward_model", factory=LengthScorerFactory(delay_s=1.0),
                         timeout_s=0.2, max_retries=2)  # fmt: skip
    with pytest.raises(ModelCallError, match=r"server scripted-length failed after 3 attempts"):
        client([request("ab")])
    assert client.metrics()["retries"] == 2
    quick = pickle.loads(pickle.dumps(ModelClient(role="judge", factory=LengthScorerFactory())))
    assert quick([request("ab"), request("abc")]) == [2.0, 3.0]
    quick.close()
