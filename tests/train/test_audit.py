"""The consistency audit's numbers and checks: the log-prob gap and KL of hand-computed rows, per
engine and over two gloo ranks; the token round trip on tokens that merge when re-encoded; the
weight checksums of a push; errors that name the step, the engine and the gap; the config's
thresholds validated naming the field."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from llmrl.config import ConfigError, load_config
from llmrl.config.grpo import AuditSettings, GRPOConfig
from llmrl.objectives.consistency import ENGINE_KEY, logprob_gap_rows
from llmrl.train.audit import AuditError, LogProbGapTally, StepAudit, round_trip_mismatches

# two rows of 3 positions; the masked-out ones hold values that must not count
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 100.0, -100.0]])
SAMPLER = torch.tensor([[-1.5, -2.0, -0.25], [-1.0, -50.0, 7.0]])
MASK = torch.tensor([[True, True, True], [True, False, False]])


def k3(d: float) -> float:
    return math.exp(d) - 1 - d


# by hand: row 0's gaps d = trainer - sampler = [0.5, 0, -0.25]; row 1's: [-2.0]. In float32
# the gaps, sums and maxes of these dyadic values are exact, and k3 = expm1(d) - d rounds once
# or twice (~1 ulp of values <= 1.7: <= 4e-7 of the smallest k3 sum, 0.18), within approx's
# default rel=1e-6; a masked value that leaks moves a result by >= 0.25.
ROW_0 = [0.75, 0.5, k3(0.5) + k3(0.0) + k3(-0.25), 3.0]
ROW_1 = [2.0, 2.0, k3(-2.0), 1.0]


def test_gap_rows_are_the_hand_computed_sums_max_and_k3():
    rows = logprob_gap_rows(TRAINER, SAMPLER, MASK)
    assert rows.tolist() == [pytest.approx(ROW_0), pytest.approx(ROW_1)]
    assert logprob_gap_rows(TRAINER, SAMPLER, torch.zeros_like(MASK)).abs().sum() == 0


def _tally(settings: AuditSettings | None = None, step: int = 7) -> LogProbGapTally:
    tally = LogProbGapTally(settings or AuditSettings(), step)
    batch = TensorDict({ENGINE_KEY: torch.tensor([0, 1])}, batch_size=[2])
    tally.add(logprob_gap_rows(TRAINER, SAMPLER, MASK), batch)
    return tally


def test_the_gap_is_reported_per_engine_and_over_all_tokens():
    tally = _tally(AuditSettings(max_logprob_gap_mean=None))
    tally.check()
    metrics = tally.metrics
    assert metrics["audit/engine_0/logprob_gap_mean"] == pytest.approx(0.75 / 3)
    assert metrics["audit/engine_0/logprob_gap_max"] == pytest.approx(0.5)
    assert metrics["audit/engine_0/kl"] == pytest.approx(ROW_0[2] / 3)
    assert metrics["audit/engine_1/logprob_gap_mean"] == pytest.approx(2.0)
    assert metrics["audit/engine_1/kl"] == pytest.approx(k3(-2.0))
    # over both: token-weighted means, the largest gap
    assert metrics["audit/logprob_gap_mean"] == pytest.approx(2.75 / 4)
    assert metrics["audit/logprob_gap_max"] == pytest.approx(2.0)
    assert metrics["audit/kl"] == pytest.approx((ROW_0[2] + ROW_1[2]) / 4)
    assert metrics["audit/logprob_tokens"] == 4.0
    assert metrics["audit/trainer_seconds"] >= 0


def test_rows_without_an_engine_are_engine_0_and_one_engine_reports_no_engine_metrics():
    tally = LogProbGapTally(AuditSettings(max_logprob_gap_mean=None), 1)
    tally.add(logprob_gap_rows(TRAINER[:1], SAMPLER[:1], MASK[:1]), TensorDict(batch_size=[1]))
    tally.check()
    assert tally.metrics["audit/logprob_gap_mean"] == pytest.approx(0.25)
    assert not any(name.startswith("audit/engine_") for name in tally.metrics)


@pytest.mark.parametrize(
    ("settings", "engine", "words"),
    [
        (AuditSettings(max_logprob_gap_mean=1.0), 1, "2 nats on average over its 1 sampled"),
        (
            AuditSettings(max_logprob_gap_mean=None, max_logprob_gap_max=0.4),
            0,
            "0.5 nats at one token over its 3 sampled",
        ),
    ],
)
def test_a_gap_over_a_threshold_raises_naming_the_step_the_engine_and_the_gap(
    settings, engine, words
):
    tally = _tally(settings)
    with pytest.raises(AuditError) as caught:
        tally.check()
    error = caught.value
    assert f"step 7: engine {engine}'s sampling log-probs differ" in str(error)
    assert words in str(error)
    assert error.step == 7 and error.engine == engine
    assert error.metrics["audit/logprob_gap_max"] == pytest.approx(2.0)
    # it crosses Ray from a trainer rank: pickled with its fields
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.step, again.engine, again.metrics) == (
        str(error),
        7,
        engine,
        error.metrics,
    )


def _rank(rank: int, port: int, results) -> None:
    """Rank ``rank`` of two holds row ``rank`` (engine ``rank``); both reduce."""
    from llmrl.train import distributed

    distributed.init_group(rank, 2, "127.0.0.1", port, 60)
    try:
        tally = LogProbGapTally(AuditSettings(max_logprob_gap_mean=None), 1)
        rows = logprob_gap_rows(TRAINER, SAMPLER, MASK)[rank : rank + 1]
        engines = torch.tensor([rank])
        # rank 1 also holds a second row of engine 0 with a larger gap
        if rank == 1:
            rows = torch.cat([rows, torch.tensor([[3.0, 3.0, 0.5, 1.0]])])
            engines = torch.tensor([1, 0])
        tally.add(rows, TensorDict({ENGINE_KEY: engines}, batch_size=[len(engines)]))
        tally.check()
        results[rank] = tally.metrics
    finally:
        distributed.leave_group()


def test_two_ranks_reduce_to_the_whole_batch_numbers():
    import torch.multiprocessing as mp

    from llmrl.core.ray_helpers import free_port

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(free_port(), results), nprocs=2, join=True)
        first, second = results[0], results[1]
    assert first == {**second, "audit/trainer_seconds": first["audit/trainer_seconds"]}
    # engine 0: rank 0's row and rank 1's extra row; max of the maxes, token-weighted means
    assert first["audit/engine_0/logprob_gap_mean"] == pytest.approx((0.75 + 3.0) / 4)
    assert first["audit/engine_0/logprob_gap_max"] == pytest.approx(3.0)
    assert first["audit/engine_0/kl"] == pytest.approx((ROW_0[2] + 0.5) / 4)
    assert first["audit/engine_1/logprob_gap_mean"] == pytest.approx(2.0)
    assert first["audit/logprob_tokens"] == 5.0


def test_tokens_that_merge_when_encoded_again_are_counted(tokenizer):
    hello = tokenizer.encode("hello", add_special_tokens=False)
    split = tokenizer.encode("hel", add_special_tokens=False) + tokenizer.encode(
        "lo", add_special_tokens=False
    )
    assert len(hello) == 1 and len(split) == 2  # "hel" + "lo" is sampled; "hello" comes back
    answer = tokenizer.encode("56 - 13 = 43\n#### 43<|im_end|>", add_special_tokens=False)
    assert round_trip_mismatches(tokenizer, [answer, split, hello, split]) == [1, 3]

    batch = TensorDict(
        {
            "tokens": _tokens([answer, split, hello, split]),
            ENGINE_KEY: torch.tensor([0, 1, 0, 1]),
        },
        batch_size=[4],
    )
    metrics = StepAudit(AuditSettings(), tokenizer).token_round_trip(batch, 3)
    assert metrics["audit/token_roundtrip_mismatches"] == 2.0
    assert metrics["audit/token_roundtrip_mismatch_fraction"] == 0.5
    strict = StepAudit(AuditSettings(max_roundtrip_mismatch_fraction=0.25), tokenizer)
    with pytest.raises(AuditError, match=r"step 3: 2 of 4 sampled responses \(50.0%\)") as caught:
        strict.token_round_trip(batch, 3)
    assert "row 1, engine 1" in str(caught.value) and caught.value.engine == 1


def _tokens(responses: list[list[int]]):
    from llmrl.data import Tokens

    return Tokens.from_sequences(
        prompt=[torch.tensor([1])] * len(responses),
        response=[torch.tensor(r) for r in responses],
    )


def test_an_engine_whose_checksum_is_not_the_trainers_stops_the_run():
    push = SimpleNamespace(version=4, checksum="abc", engine_checksums=("abc", "abd", "abc"))
    audit = StepAudit(AuditSettings(), tokenizer=None)
    with pytest.raises(AuditError) as caught:
        audit.weight_checksums(push, 4)
    message = str(caught.value)
    assert "step 4: after pushing version 4, engine 1 holds weights with checksum abd" in message
    assert "not the trainer's abc (1 of 3 engines differ" in message
    assert caught.value.metrics == {
        "audit/weight_checksum_mismatches": 1.0,
        "audit/weight_checksums_checked": 3.0,
    }
    logged = StepAudit(AuditSettings(stop_on_checksum_mismatch=False), tokenizer=None)
    assert logged.weight_checksums(push, 4)["audit/weight_checksum_mismatches"] == 1.0
    intact = SimpleNamespace(version=4, checksum="abc", engine_checksums=("abc",))
    assert audit.weight_checksums(intact, 4)["audit/weight_checksum_mismatches"] == 0.0
    # a push without checksums (a sampler sharing the trainer's model) checks nothing
    for push in (None, SimpleNamespace(version=1, checksum="", engine_checksums=())):
        assert audit.weight_checksums(push, 1)["audit/weight_checksums_checked"] == 0.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("audit.max_logprob_gap_mean=-1", "audit.max_logprob_gap_mean: Input should be greater"),
        ("audit.max_logprob_gap_max=0", "audit.max_logprob_gap_max: Input should be greater"),
        (
            "audit.max_roundtrip_mismatch_fraction=2",
            "audit.max_roundtrip_mismatch_fraction: Input should be less than or equal to 1",
        ),
        ("audit.stop_on_checksum_mismatch=maybe", "audit.stop_on_checksum_mismatch: Input"),
        ("audit.max_gap=1", "unknown key 'audit.max_gap'"),
    ],
)
def test_audit_thresholds_are_validated_naming_the_field(override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(GRPOConfig, None, ["data.path=x", override])
    assert message in caught.value.problems[0]


def test_audit_defaults():
    audit = load_config(GRPOConfig, None, ["data.path=x"]).audit
    assert audit.enabled and audit.stop_on_checksum_mismatch
    assert audit.max_logprob_gap_mean == 0.1
    assert audit.max_logprob_gap_max is None and audit.max_roundtrip_mismatch_fraction is None


def test_the_stage_stops_with_the_error_and_fails_its_run_with_the_numbers(
    arithmetic_data, mlflow_uri, monkeypatch, caplog
):
    from contextlib import nullcontext

    from mlflow import MlflowClient

    from llmrl.envs.tasks.prepared import prepared_task
    from llmrl.stages import grpo as stage
    from tests.support.configs import stage_config
    from tests.support.mlflow_runs import metric_values

    _, manifest = prepared_task(arithmetic_data)
    error = AuditError("consistency audit, step 1: engine 0's ...", 1, 0, {"audit/kl": 0.7})

    class Runtime:  # the runtime's step raises what a rank's audit raised
        def __init__(self, *args, **kwargs) -> None:
            self.manifest, self.train_rows, self.counters = manifest, [{}], {}

        def runtime_params(self) -> dict:
            return {}

        def step(self, number: int):
            raise error

        def shutdown(self) -> None:
            pass

    monkeypatch.setattr(stage, "GRPORuntime", Runtime)
    monkeypatch.setattr(stage, "ray_session", lambda address: nullcontext())
    config = stage_config(  # an experiment of its own: the store is shared with other tests
        GRPOConfig,
        f"data.path={arithmetic_data}",
        f"tracking.tracking_uri={mlflow_uri}",
        "tracking.experiment=audit-stops-the-stage",
    )
    with pytest.raises(AuditError) as caught, caplog.at_level("ERROR", logger=stage.__name__):
        stage.run_grpo(config)
    assert caught.value is error
    assert "GRPO stopped by the consistency audit: consistency audit, step 1: engine 0" in (
        caplog.text
    )
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name(config.tracking.experiment)
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"
    assert metric_values(mlflow_uri, run.info.run_id, "audit/kl") == [0.7]
