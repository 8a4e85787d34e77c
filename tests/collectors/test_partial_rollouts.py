"""Partial rollouts (llmrl.collectors.partial_rollouts): replies sampled a segment at a time,
carried across weight changes with per-token versions, released in whole groups, nothing lost
or duplicated; and the staleness bound on a reply's oldest token (AsyncRollouts)."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from llmrl.collectors import AsyncRollouts
from llmrl.collectors.partial_rollouts import TOKEN_VERSIONS, PartialRolloutRunner
from llmrl.envs import ArithmeticEnv
from llmrl.policies import TransformersWrapper
from tests.tolerances import log_prob_atol, max_abs

BUDGET, SEGMENT, GROUP = 10, 3, 2


class _VersionedEngine:
    """A segmented policy over its own copy of a model, stamping the version it holds (what an
    inference actor does); :meth:`push` perturbs the weights and bumps the version, keeping
    every version's weights for the checks."""

    def __init__(self, model, tokenizer) -> None:
        self.model = copy.deepcopy(model)
        self.policy = TransformersWrapper(
            self.model,
            tokenizer,
            generate_kwargs={"max_new_tokens": BUDGET, "seed": 0},
            segment_tokens=SEGMENT,
        )
        self.version = 0
        self.weights = {0: copy.deepcopy(self.model.state_dict())}

    def __call__(self, state):
        out = self.policy(state)
        return out.set("policy_version", torch.full(out.batch_size, self.version))

    def push(self) -> None:
        noise = torch.Generator().manual_seed(self.version)
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=noise))
        self.version += 1
        self.weights[self.version] = copy.deepcopy(self.model.state_dict())


def _run(engine, steps: int, max_age: int = 10):
    env = ArithmeticEnv(batch_size=2, repeats=GROUP, num_problems=50, seed=3)
    runner = PartialRolloutRunner(env, engine, group_size=GROUP, max_age=max_age)
    released = []
    for _ in range(steps):
        result = runner.step()
        released += [row for trajectory in result.finished for row in trajectory]
        engine.push()  # a push between every two segments
    return runner, released


def test_replies_span_pushes_with_each_versions_log_probs(eos_model, tokenizer):
    engine = _VersionedEngine(eos_model, tokenizer)
    runner, released = _run(engine, steps=8)
    assert released, "some groups ended"
    spanning = 0
    scorer = copy.deepcopy(eos_model)
    for row in released:
        versions = row[TOKEN_VERSIONS]
        response = row["tokens"].response
        assert versions.numel() == response.numel()
        assert (versions.diff() >= 0).all()
        assert int(row["policy_version"]) == int(versions.min())  # the oldest token counts
        # a segment per version: tokens of version v were sampled in the v-th call from
        # the row's first one, SEGMENT of them (or fewer in its last)
        counts = torch.bincount(versions - versions.min()).tolist()
        assert all(c == SEGMENT for c in counts[:-1]) and 0 < counts[-1] <= SEGMENT
        spanning += len(counts) > 1
        full, prompt = row["tokens"].full, row["tokens"].prompt.numel()
        sampled = row["log_probs"].response
        for version in versions.unique().tolist():
            scorer.load_state_dict(engine.weights[version])
            with torch.no_grad():
                logits = scorer(input_ids=full[None]).logits[0].float()
            expected = logits.log_softmax(-1)[prompt - 1 : -1].gather(-1, full[prompt:, None])
            at = versions == version
            atol = log_prob_atol(max_abs(logits), scorer.config.vocab_size)
            torch.testing.assert_close(sampled[at], expected.squeeze(-1)[at], atol=atol, rtol=0)
    assert spanning > 0, "some reply spans a push"
    assert runner.stats["resumed_rows"] > 0 and runner.stats["restarted_rows"] == 0


def test_groups_are_released_whole_and_nothing_is_lost_or_duplicated(eos_model, tokenizer):
    engine = _VersionedEngine(eos_model, tokenizer)
    runner, released = _run(engine, steps=10)
    ids = [int(row["traj_id"]) for row in released]
    assert len(ids) == len(set(ids)), "a reply released twice"
    groups: dict[int, list[int]] = {}
    for row in released:
        groups.setdefault(int(row["group_id"]), []).append(int(row["traj_id"]))
    assert all(len(members) == GROUP for members in groups.values())
    # every reply drawn is released, in flight, or waiting for its group: none is lost
    in_flight = [] if runner.state is None else runner.state["traj_id"].tolist()
    waiting = [int(t[0]["traj_id"]) for members in runner._groups.values() for t in members]
    assert sorted(ids + in_flight + waiting) == list(range(runner.next_traj_id))
    assert set(in_flight).isdisjoint(ids) and set(waiting).isdisjoint(ids)


def test_a_reply_beyond_the_staleness_bound_restarts_from_its_prompt(eos_model, tokenizer):
    engine = _VersionedEngine(eos_model, tokenizer)
    runner, released = _run(engine, steps=8, max_age=0)
    assert runner.stats["restarted_rows"] > 0
    # the age is checked after each segment: a reply that just got too old restarts, one that
    # ended in that segment is kept, so released replies span at most max_age + 1 versions
    spans = [int(row[TOKEN_VERSIONS].max() - row[TOKEN_VERSIONS].min()) for row in released]
    assert spans and max(spans) <= 1


def test_a_policy_that_does_not_segment_is_refused(eos_model, tokenizer):
    """A callable that ignores the attached prefixes (not an llmrl policy) says nothing of
    which replies go on: refused, rather than taking every reply as ended."""
    env = ArithmeticEnv(batch_size=1, repeats=GROUP, num_problems=5)
    policy = TransformersWrapper(eos_model, tokenizer, generate_kwargs={"max_new_tokens": 4})

    def stamped(state):
        return (
            policy(state)
            .exclude("partial")
            .set("policy_version", torch.zeros(state.batch_size, dtype=torch.long))
        )

    runner = PartialRolloutRunner(env, stamped, group_size=GROUP, max_age=1)
    with pytest.raises(ValueError, match="segment_tokens"):
        runner.step()


class _CarriedCollector:
    """Yields 2 groups x 2 rows whose first group holds a reply carried from ``carried_from``."""

    def __init__(self, carried_from: int) -> None:
        self.policy_version, self.carried_from = 5, carried_from

    def __iter__(self):
        while True:
            versions = [self.carried_from, self.policy_version] + [self.policy_version] * 2
            yield TensorDict(
                {"policy_version": torch.tensor(versions), "group_id": torch.tensor([7, 7, 8, 8])},
                [4],
            )

    def update_policy_weights_(self, weights=None) -> None:
        self.policy_version += 1

    def metrics(self) -> dict:
        return {}


@pytest.mark.parametrize(("carried_from", "refused"), [(3, 0), (2, 1)])
def test_a_group_with_a_row_older_than_the_bound_is_refused(carried_from, refused):
    """Trainer at version 5, max_staleness 2: a row of version 3 is at the bound, of 2 beyond
    it; its whole group goes, the other stays."""
    rollouts = AsyncRollouts(_CarriedCollector(carried_from), max_staleness=2, refuse_stale=True)
    batch = next(iter(rollouts))
    rollouts.shutdown()
    assert batch["group_id"].tolist() == [7, 7, 8, 8][2 * refused :]
    metrics = rollouts.metrics()
    assert metrics["collector/stale_groups_refused"] == refused
    assert metrics["collector/stale_rows_refused"] == 2 * refused
