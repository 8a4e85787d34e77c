"""`GRPOTrainer` with truncated importance sampling (``loss.tis_cap``) and several optimizer steps
per batch: the PPO ratio's anchor is the batch's log-probs before the first update, scored once,
and every later update and minibatch reads that same anchor. With ``micro_batch_size`` the
update is the whole batch's, its gradients accumulated over micro-batches."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensordict import TensorDictBase

from llmrl.collectors import LLMCollector
from llmrl.config.grpo import GRPOConfig
from llmrl.data import LogProbs
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.models import load_model, load_tokenizer
from llmrl.objectives.consistency import ENGINE_KEY
from llmrl.policies import TransformersWrapper
from llmrl.train.audit import AuditError
from llmrl.train.grpo_trainer import ANCHOR_KEY, GRPOTrainer
from llmrl.train.micro_batches import sequence_lengths
from tests.support.configs import stage_config
from tests.support.stages import first_update_loss_atol
from tests.tolerances import log_prob_atol, max_abs


@pytest.fixture(scope="module")
def rollout(arithmetic_data: Path, tiny_model_dir: Path) -> TensorDictBase:
    """2 prompts x 2 responses sampled by the tiny model, with hand-set advantages."""
    task, _ = prepared_task(arithmetic_data)
    env = TaskEnv(task, task.generate(4, seed=0), batch_size=2, repeats=2, seed=0)
    policy = TransformersWrapper(
        load_model(tiny_model_dir),
        load_tokenizer(tiny_model_dir),
        generate_kwargs={"max_new_tokens": 5, "seed": 0},
    )
    batch = next(iter(LLMCollector(env, policy, dialog_turns_per_batch=4)))
    batch.set("advantage", torch.tensor([1.0, -1.0, 0.5, -0.5]))
    return batch


def _trainer(data: Path, model_dir: Path, **fields) -> GRPOTrainer:
    config = stage_config(
        GRPOConfig,
        f"data.path={data}",
        f"model.name={model_dir}",
        "optimizer.lr=0.01",  # big steps: the second update's ratio is far from 1
        "loss.tis_cap=2.0",
        **{"prompts_per_step": 2, "num_samples": 2, **fields},
    )
    model = load_model(model_dir)
    model.eval()
    return GRPOTrainer(config, model, load_tokenizer(model_dir), total_steps=4)


def _spy_loss(trainer: GRPOTrainer, monkeypatch, record) -> list:
    """``record(td, out)`` of every loss call, in order."""
    calls: list = []
    forward = trainer.loss_fn.forward

    def spy(td):
        out = forward(td)
        calls.append(record(td, out))
        return out

    monkeypatch.setattr(trainer.loss_fn, "forward", spy)
    return calls


def _record_loss_calls(trainer: GRPOTrainer, monkeypatch) -> list[tuple[list, float]]:
    """(anchor rows, kl_approx) of every loss call."""

    def anchor_and_kl(td, out):
        anchor = td.get(ANCHOR_KEY, None)
        rows = None if anchor is None else [r.clone() for r in anchor.as_list("full")]
        return rows, float(out.kl_approx)

    return _spy_loss(trainer, monkeypatch, anchor_and_kl)


def _log_prob_atol(model: torch.nn.Module, batch: TensorDictBase) -> float:
    """How far the sampler's fp32 log-probs (decode) may be from the trainer's (one pass) with
    the same weights: the same sums in another order, the longest over the vocabulary."""
    with torch.no_grad():
        sequences = batch["tokens"].as_list("full")
        max_logit = max(max_abs(model(input_ids=s[None]).logits) for s in sequences)
    return log_prob_atol(max_logit, model.config.vocab_size)


def _rows_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_every_update_reads_the_anchor_scored_before_the_first(
    rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    trainer = _trainer(arithmetic_data, tiny_model_dir, updates_per_step=2)
    before = trainer.loss_fn.anchor_log_probs(rollout).as_list("full")
    calls = _record_loss_calls(trainer, monkeypatch)
    trainer.train(rollout, minibatches=1)
    after = trainer.loss_fn.anchor_log_probs(rollout).as_list("full")
    assert len(calls) == 2
    (first_anchor, first_kl), (second_anchor, second_kl) = calls
    assert _rows_equal(first_anchor, before) and _rows_equal(second_anchor, before)
    assert not _rows_equal(after, before)  # the weights moved in between
    # update 1: the weights are the anchor's, the ratio is 1; update 2: it moved off 1 (with
    # the anchor re-read from the current weights it would be 1, and KL 0, every time). A
    # rounding gap d <= log_prob_atol (~3e-4) between anchor and update gives k3 ~ d^2 / 2
    assert first_kl == pytest.approx(0.0, abs=1e-6)
    assert second_kl > 1e-4


def test_a_later_minibatch_keeps_the_pre_update_anchor(
    rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    trainer = _trainer(arithmetic_data, tiny_model_dir, minibatch_size=2)
    before = trainer.loss_fn.anchor_log_probs(rollout).as_list("full")
    calls = _record_loss_calls(trainer, monkeypatch)
    trainer.train(rollout, minibatches=2)
    assert [len(rows) for rows, _ in calls] == [2, 2]
    assert _rows_equal(calls[0][0], before[:2])
    # scored before minibatch 1's optimizer step, not after it
    assert _rows_equal(calls[1][0], before[2:])
    assert calls[1][1] > 1e-4


def test_one_optimizer_step_per_batch_scores_no_extra_anchor(
    rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    trainer = _trainer(arithmetic_data, tiny_model_dir)
    assert not trainer.anchors_needed(1) and trainer.anchors_needed(2)
    calls = _record_loss_calls(trainer, monkeypatch)
    trainer.train(rollout, minibatches=1)
    assert [rows for rows, _ in calls] == [None]  # the loss's own forward is the anchor
    assert trainer.loss_fn.old_log_probs_key is None


def _scored_rows(trainer: GRPOTrainer, monkeypatch) -> list[int]:
    """The rows of every loss call."""
    return _spy_loss(trainer, monkeypatch, lambda td, out: td.batch_size[0])


def _assert_same_update(
    a: GRPOTrainer, b: GRPOTrainer, a_metrics: dict, b_metrics: dict, batch: TensorDictBase
):
    """The same loss, diagnostics and gradient norm (a wrong weighting of a micro-batch shows
    there: Adam's step hides a uniform scale), and weights within a tenth of the AdamW step (lr
    0.01): the summation order changes gradients by float rounding, which moves a weight whose
    gradient is within rounding of 0 by a fraction of lr (measured: up to 0.064 lr).

    The loss at the first update cancels to near 0, so it gets an absolute tolerance
    (``first_update_loss_atol``; the others are not near 0). The
    others are means over tokens (entropy ~11, ESS, KL) or the norm of ~3M gradient elements,
    whose independent roundings average out: measured <= 9.5e-7 on the entropy and 1.2e-7 of
    the norm (EPYC AVX-512, 2026-11-27), under rel=1e-5 by >= 10x."""
    assert set(a_metrics) == set(b_metrics)
    loss_rounding = first_update_loss_atol(batch)
    compared = {"loss", "grad_norm", "kl_approx", "entropy", "ESS", "clip_fraction"}
    for key in compared & set(a_metrics):
        tolerance = max(1e-7, loss_rounding) if key == "loss" else 1e-7
        assert a_metrics[key] == pytest.approx(b_metrics[key], rel=1e-5, abs=tolerance), key
    moved = dict(b.model.named_parameters())
    worst = max(
        float((p.detach() - moved[n].detach()).abs().max()) for n, p in a.model.named_parameters()
    )
    assert worst <= 0.1 * 0.01


@pytest.mark.parametrize(("size", "rows"), [(3, [2, 2]), (1, [1, 1, 1, 1]), (4, [4])])
def test_micro_batches_make_the_update_of_the_whole_batch(
    size, rows, rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    fields = {"loss.entropy_coeff": 0.01}  # one more term whose weighting must hold
    whole = _trainer(arithmetic_data, tiny_model_dir, **fields)
    micro = _trainer(arithmetic_data, tiny_model_dir, micro_batch_size=size, **fields)
    assert micro.micro_batches(4) == len(rows)
    scored = _scored_rows(micro, monkeypatch)
    micro_metrics = micro.train(rollout, minibatches=1)
    assert "entropy" in micro_metrics
    assert scored == rows  # one optimizer step, len(rows) forward/backward passes
    _assert_same_update(whole, micro, whole.train(rollout, minibatches=1), micro_metrics, rollout)
    assert micro.optimizer.state_dict()["state"][0]["step"] == 1


@pytest.mark.parametrize(
    ("fields", "rows", "other_rank", "passes"),
    [
        # another rank got 4 rows: with 1 row per pass, this rank makes 4 passes over its 2
        # rows, 2 of them stand-ins
        ({"micro_batch_size": 1}, 2, 4, [1, 1, 1, 1]),
        # another rank needs 3 token-budget passes: this one makes its 1 and 2 stand-ins
        ({"max_tokens_per_micro_batch": 10_000}, 4, 3, [4, 1, 1]),
    ],
    ids=["rows", "tokens"],
)
def test_a_rank_with_less_work_pads_its_micro_batches_with_weight_zero_stand_ins(
    fields, rows, other_rank, passes, rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    from llmrl.train import distributed

    monkeypatch.setattr(distributed, "all_reduce_max", lambda count: max(count, other_rank))
    batch = rollout[:rows]
    whole = _trainer(arithmetic_data, tiny_model_dir)
    micro = _trainer(arithmetic_data, tiny_model_dir, **fields)
    scored = _scored_rows(micro, monkeypatch)
    micro_metrics = micro.train(batch, minibatches=1)
    assert scored == passes  # the stand-ins score one row each, with weight 0
    _assert_same_update(whole, micro, whole.train(batch, minibatches=1), micro_metrics, batch)


def test_a_micro_batch_size_below_one_names_the_field(arithmetic_data, tiny_model_dir):
    from llmrl.config import ConfigError

    with pytest.raises(ConfigError, match="micro_batch_size"):
        _trainer(arithmetic_data, tiny_model_dir, micro_batch_size=0)


def test_micro_batch_size_and_a_token_budget_together_are_refused(arithmetic_data, tiny_model_dir):
    from llmrl.config import ConfigError

    with pytest.raises(ConfigError, match="micro_batch_size and max_tokens_per_micro_batch both"):
        _trainer(arithmetic_data, tiny_model_dir, micro_batch_size=2, max_tokens_per_micro_batch=99)


def _budgets(rollout: TensorDictBase) -> list[tuple[int, list[int]]]:
    """Token budgets and the rows of each pass they give (the rollout's 4 rows hold the same
    prompt length and responses of 1-5 tokens, so within a few tokens of each other)."""
    lengths = sequence_lengths(rollout)
    longest = max(lengths)
    assert 2 * min(lengths) > longest  # no two rows fit in `longest`; any two fit in 2x
    return [
        (min(lengths) - 1, [1, 1, 1, 1]),  # every row over the budget: each alone
        (longest, [1, 1, 1, 1]),
        (2 * longest, [2, 2]),
        (4 * longest, [4]),
    ]


def test_token_budget_micro_batches_make_the_update_of_the_whole_batch(
    rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    fields = {"loss.entropy_coeff": 0.01}
    whole = _trainer(arithmetic_data, tiny_model_dir, **fields)
    whole_metrics = whole.train(rollout, minibatches=1)
    for budget, rows in _budgets(rollout):
        micro = _trainer(
            arithmetic_data, tiny_model_dir, max_tokens_per_micro_batch=budget, **fields
        )
        scored = _scored_rows(micro, monkeypatch)
        metrics = micro.train(rollout, minibatches=1)
        assert scored == rows, budget
        _assert_same_update(whole, micro, whole_metrics, metrics, rollout)
        assert micro.optimizer.state_dict()["state"][0]["step"] == 1


@pytest.mark.parametrize("variant", ["grpo", "gspo", "cispo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "prompt_mean", "sum_norm"])
def test_packed_rows_make_the_update_of_padded_rows(
    variant, aggregation, rollout, arithmetic_data, tiny_model_dir, monkeypatch
):
    """Every loss variant and aggregation: packed and padded scoring give the same loss,
    diagnostics and update. (The rollout's rows share prompts, which the trainer would score
    once, unpacked; here the shared forward is priced out so that the packed one runs.)"""
    from llmrl.policies import packing, response_scoring

    monkeypatch.setattr(response_scoring, "shared_token_count", lambda *_: math.inf)
    packed_calls = []
    score_packed = packing.score_packed

    def counted(*args, **kwargs):
        packed_calls.append(len(args[1]))
        return score_packed(*args, **kwargs)

    monkeypatch.setattr(response_scoring, "score_packed", counted)
    fields = {"loss.variant": variant, "loss.aggregation": aggregation, "loss.entropy_coeff": 0.01}
    packed = _trainer(arithmetic_data, tiny_model_dir, **fields)
    padded = _trainer(arithmetic_data, tiny_model_dir, **{"model.packing": False, **fields})
    packed_metrics = packed.train(rollout, minibatches=1)
    assert packed_calls == [4]  # the loss's one forward, packed
    padded_metrics = padded.train(rollout, minibatches=1)
    assert packed_calls == [4]  # and none with packing off
    _assert_same_update(packed, padded, packed_metrics, padded_metrics, rollout)


# ------------------------------------------------ the consistency audit's log-prob gap
def _sampled_by(
    batch: TensorDictBase, engines: list[int], shift: float, shifted: set[int]
) -> TensorDictBase:
    """``batch`` as if ``engines`` sampled its rows, the sampler's log-probs of the rows in
    ``shifted`` ``shift`` nats higher than the model's."""
    rows = batch["log_probs"].as_list("response")
    out = batch.clone()
    out.set(
        "log_probs",
        LogProbs.from_sequences(
            response=[lp + shift if i in shifted else lp for i, lp in enumerate(rows)]
        ),
    )
    out.set(ENGINE_KEY, torch.tensor(engines))
    return out


def test_the_audit_measures_the_sampler_against_the_trainer_before_the_update(
    rollout, arithmetic_data, tiny_model_dir
):
    trainer = _trainer(arithmetic_data, tiny_model_dir)
    atol = _log_prob_atol(trainer.model, rollout)  # before the update moves the weights
    metrics = trainer.train(rollout, minibatches=1)
    tokens = sum(len(r) for r in rollout["tokens"].as_list("response"))
    assert metrics["audit/logprob_tokens"] == tokens
    # the sampler held the trainer's weights, in float32: they differ by rounding only, the
    # same sums in another order (log_prob_atol, ~3e-4; k3 ~ d^2 / 2); a sampler with other
    # weights or a temperature is >= 0.01 off
    assert metrics["audit/logprob_gap_max"] <= atol
    assert metrics["audit/logprob_gap_mean"] <= atol and 0 <= metrics["audit/kl"] <= atol**2 / 2
    off = _trainer(arithmetic_data, tiny_model_dir, **{"audit.enabled": False})
    assert not any(name.startswith("audit/") for name in off.train(rollout, minibatches=1))


@pytest.mark.parametrize("minibatches", [1, 2])
def test_a_gap_over_the_threshold_stops_before_an_optimizer_step_uses_it(
    minibatches, rollout, arithmetic_data, tiny_model_dir
):
    trainer = _trainer(
        arithmetic_data,
        tiny_model_dir,
        minibatch_size=4 // minibatches,
        **{"audit.max_logprob_gap_mean": 0.2},
    )
    batch = _sampled_by(rollout, [0, 0, 1, 1], 0.5, {2, 3})  # engine 1 is 0.5 nats off
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with pytest.raises(AuditError) as caught:
        trainer.train(batch, minibatches=minibatches, step=5)
    assert "step 5: engine 1's sampling log-probs differ from the trainer's by 0.5 nats on " in (
        str(caught.value)
    )
    # 0.5 plus the rounding gap of the sampler's log-probs (see above: <= log_prob_atol) and
    # one rounding of log p + 0.5 (|log p| < 16: <= 2^-20)
    atol = _log_prob_atol(trainer.model, rollout) + 2**-20
    assert caught.value.metrics["audit/engine_1/logprob_gap_mean"] == pytest.approx(0.5, abs=atol)
    steps = [s["step"] for s in trainer.optimizer.state_dict()["state"].values()]
    moved = any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    if minibatches == 1:  # the whole batch is checked before the one optimizer step
        assert steps == [] and not moved
    else:  # engine 0's minibatch was trained on; engine 1's (from the anchors) stopped it
        assert {int(s) for s in steps} == {1} and moved
