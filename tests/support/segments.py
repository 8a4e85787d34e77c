"""Segmented sampling driven to the end: a policy built with ``segment_tokens`` called again and
again on its rows, each resumed from its reply so far, as the partial rollouts' runner does
(for the segment tests on the transformers backend and on vLLM's CPU build)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase

from llmrl.policies.segments import EMPTY, PARTIAL_KEY, RESUME_KEYS, Prefix, attach_prefixes


def resume_until_done(
    policy: Callable[[TensorDictBase], TensorDictBase],
    state: TensorDictBase,
    between: Callable[[int], None] | None = None,
) -> tuple[list[TensorDictBase], list[list[int]]]:
    """Call ``policy`` on ``state`` ``[B]`` until no row is partial; every row's last output and
    the length of its reply before each call (the segment boundaries). ``between(call)`` runs
    after each call (a weight change)."""
    rows = state.batch_size[0]
    prefixes, outputs = [EMPTY] * rows, [None] * rows
    boundaries: list[list[int]] = [[] for _ in range(rows)]
    going = list(range(rows))
    call = 0
    while going:
        for row in going:
            boundaries[row].append(len(prefixes[row]))
        out = policy(attach_prefixes(state[torch.tensor(going)], [prefixes[r] for r in going]))
        assert not set(RESUME_KEYS) & set(out.keys()), "the prefixes are not echoed back"
        tokens, log_probs = out["tokens"].as_list("response"), out["log_probs"].as_list("response")
        still = []
        for index, row in enumerate(going):
            outputs[row] = out[index]
            prefixes[row] = Prefix(tokens[index], log_probs[index])
            if bool(out[PARTIAL_KEY][index]):
                still.append(row)
        call += 1
        if between is not None:
            between(call)
        going = still
    return outputs, boundaries
