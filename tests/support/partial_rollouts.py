"""What every GRPO runtime run with ``runtime.partial_rollouts`` must show, whatever its engine
backend (tests/runtime/test_partial_rollouts_runtime.py on transformers engines,
tests/vllm/test_partial_rollouts_runtime_vllm.py on vLLM's CPU build)."""

from __future__ import annotations

from typing import Any

from llmrl.collectors.partial_rollouts import TOKEN_VERSIONS


def check_partial_rollout_steps(
    steps: list[tuple[Any, dict[str, float]]],
    trained_versions: list[tuple[int, list[int]]],
    *,
    group_size: int,
    max_staleness: int,
) -> int:
    """Assert what partial rollouts promise on ``steps`` (each step's batch and metrics, with
    the runtime's ``trained_versions`` of the same steps): every step trained whole groups;
    every row's ``token_versions`` covers its response, never goes back, and its oldest is the
    row's ``policy_version``; no sample beyond ``max_staleness`` of its oldest token was
    trained; no reply was trained twice; replies were resumed. Returns how many trained
    replies hold tokens of more than one version (they spanned a weight push)."""
    assert [metrics["policy_version"] for _, metrics in steps] == list(range(1, len(steps) + 1))
    assert len(trained_versions) == len(steps)
    spanning, trained_ids = 0, []
    for (batch, metrics), (trainer_version, versions) in zip(steps, trained_versions, strict=True):
        groups = batch["group_id"].tolist()
        assert groups and all(groups.count(g) == group_size for g in groups), "a group split"
        for index in range(batch.batch_size[0]):
            row = batch[index]
            token_versions = row[TOKEN_VERSIONS]
            assert token_versions.numel() == row["tokens"].response.numel()
            assert int(row["policy_version"]) == int(token_versions.min())
            assert (token_versions.diff() >= 0).all()
            spanning += token_versions.unique().numel() > 1
        assert all(trainer_version - version <= max_staleness for version in versions)
        assert metrics["staleness"] <= max_staleness
        trained_ids += batch["traj_id"].tolist()
    assert len(trained_ids) == len(set(trained_ids)), "a reply trained twice"
    assert steps[-1][1]["collector/resumed_rows"] > 0
    return spanning
