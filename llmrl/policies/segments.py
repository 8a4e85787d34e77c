"""Segmented sampling: a reply decoded a segment at a time, resumed from its prefix.

A policy with ``segment_tokens`` set decodes at most that many new tokens per row and call. A
row that neither ended nor reached ``max_new_tokens`` comes back with ``partial`` true; the
caller (:class:`~llmrl.collectors.partial_rollouts.PartialRolloutRunner`) sends it again with its
response so far attached (:func:`attach_prefixes`), and the policy continues from that prefix
with whatever weights it holds by then: a weight push lands between two segments, and a reply
that spans it holds tokens of two policy versions.

The output of a resumed row is the whole response, prefix included, written as if it had been
sampled in one call: the prefix's tokens keep the log-probs they were sampled with (under the
older weights), the new tokens carry the log-probs of the weights that drew them. Continuing a
prefix costs one prefill of prompt + prefix per segment: the price of a push that need not wait
for the longest reply in flight.

Keys a caller attaches (padded with 0 after each row's ``resume_length``):
``resume_tokens`` ``[B, P]``, ``resume_log_probs`` ``[B, P]``, ``resume_length`` ``[B]``.

**Returning early.** A caller that needs only some whole groups (rows sharing a ``group_id``)
attaches ``return_after_groups`` ``[B, 2]``: (its caller id, how many groups it wants). A
backend that can stop between decode steps (the transformers decode loop) then returns as soon
as every caller of the call has that many groups whose rows in the call all ended; the other
rows come back ``partial``. A reply is then cut only when its caller has what it needs, so it
is prefilled again once per batch it spans rather than once per segment: what segments cost on
an engine that keeps no KV cache between calls. A backend that cannot (vLLM's ``generate``)
ignores it and relies on ``segment_tokens``, whose re-prefills its prefix cache serves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

from llmrl.policies.generation_kwargs import GenerationKwargs
from llmrl.policies.io_spec import GeneratedSample

RESUME_TOKENS = "resume_tokens"
RESUME_LOG_PROBS = "resume_log_probs"
RESUME_LENGTH = "resume_length"
RESUME_KEYS = (RESUME_TOKENS, RESUME_LOG_PROBS, RESUME_LENGTH)
RETURN_AFTER_GROUPS = "return_after_groups"
"""``[B, 2]`` long: (caller id, whole groups it wants); see the module docstring."""
REQUEST_KEYS = (*RESUME_KEYS, RETURN_AFTER_GROUPS)
"""What a caller attaches and the policy's output drops."""
PARTIAL_KEY = "partial"
"""``[B]`` bool in a segmented policy's output: the row's reply goes on in another call."""


@dataclass(frozen=True)
class Prefix:
    """A reply so far: its token ids and their sampling log-probs (both ``[L]``)."""

    tokens: torch.Tensor
    log_probs: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.numel())


EMPTY = Prefix(torch.zeros(0, dtype=torch.long), torch.zeros(0))


def attach_prefixes(
    state: TensorDictBase, prefixes: list[Prefix], width: int | None = None
) -> TensorDictBase:
    """``state`` ``[B]`` with each row's prefix attached, padded to ``width`` (None: the
    longest); a copy, ``state`` is left as is."""
    rows = state.batch_size[0]
    if len(prefixes) != rows:
        raise ValueError(f"{len(prefixes)} prefixes for a state of {rows} rows")
    longest = max((len(p) for p in prefixes), default=0)
    width = longest if width is None else max(width, longest)
    tokens = torch.zeros(rows, width, dtype=torch.long)
    log_probs = torch.zeros(rows, width)
    for row, prefix in enumerate(prefixes):
        tokens[row, : len(prefix)] = prefix.tokens
        log_probs[row, : len(prefix)] = prefix.log_probs.float()
    lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long)
    return state.clone(False).update(
        {RESUME_TOKENS: tokens, RESUME_LOG_PROBS: log_probs, RESUME_LENGTH: lengths}
    )


def read_prefixes(td: TensorDictBase) -> list[Prefix] | None:
    """The prefixes attached to ``td`` ``[B]`` (None when there are none)."""
    if RESUME_LENGTH not in td.keys():  # noqa: SIM118
        return None
    lengths = td.get(RESUME_LENGTH).reshape(-1).tolist()
    tokens, log_probs = td.get(RESUME_TOKENS), td.get(RESUME_LOG_PROBS)
    return [
        Prefix(tokens[row, :length].long(), log_probs[row, :length].float())
        for row, length in enumerate(lengths)
    ]


def segment_config(
    config: GenerationKwargs, prefixes: list[Prefix], segment_tokens: int
) -> GenerationKwargs:
    """The settings of one segment: at most ``segment_tokens`` new tokens, and never more than
    the longest remaining budget (``max_new_tokens`` minus the shortest prefix); a seeded
    call resuming replies draws with a seed moved by the tokens it resumes."""
    if config.num_return_sequences != 1:
        raise ValueError(
            "segmented sampling continues each row's own reply; it samples one response per "
            f"row (num_samples=1, G from the env's repeats), got {config.num_return_sequences}"
        )
    budget = config.max_new_tokens
    shortest = min((len(p) for p in prefixes), default=0)
    if shortest >= budget:
        raise ValueError(f"a resumed reply already holds {shortest} >= {budget} tokens")
    segment = config.replace(max_new_tokens=min(segment_tokens, budget - shortest))
    resumed = sum(len(p) for p in prefixes)
    if config.seed is None or not resumed:
        return segment
    # a seeded call draws from a generator of its own: without this, every segment of a
    # resumed reply would reuse the first segment's uniforms
    return segment.replace(seed=(config.seed * 1_000_003 + resumed) % 2**63)


def continuation_prompts(prompts: list[torch.Tensor], prefixes: list[Prefix]) -> list[torch.Tensor]:
    """What the backend decodes after: each prompt followed by its reply so far."""
    return [
        torch.cat([prompt, prefix.tokens.to(prompt.dtype)])
        for prompt, prefix in zip(prompts, prefixes, strict=True)
    ]


def join_segments(
    prefixes: list[Prefix], samples: list[GeneratedSample], budget: int
) -> tuple[list[GeneratedSample], list[bool]]:
    """Each whole reply (prefix, then the segment, cut at ``budget`` tokens) and whether it goes
    on: neither ended nor at the budget."""
    joined, partial = [], []
    for prefix, sample in zip(prefixes, samples, strict=True):
        room = budget - len(prefix)
        new_tokens = sample.tokens[:room]
        cut = sample.tokens.numel() > room  # the row's budget ran out inside the segment
        new_log_probs = None if sample.log_probs is None else sample.log_probs[:room]
        log_probs = (
            None
            if new_log_probs is None
            else torch.cat([prefix.log_probs.to(new_log_probs.dtype), new_log_probs])
        )
        finished = sample.finished and not cut
        tokens = torch.cat([prefix.tokens.to(new_tokens.dtype), new_tokens])
        joined.append(GeneratedSample(tokens=tokens, log_probs=log_probs, finished=finished))
        partial.append(not finished and tokens.numel() < budget)
    return joined, partial


def align_prefixes(requests: list[TensorDictBase]) -> list[TensorDictBase]:
    """Requests of several callers made concatenable: when any carries prefixes, every one
    does (empty where it had none), padded to one width; when any wants groups, every one
    says so (none wanted where it did not)."""
    if not any(RESUME_LENGTH in r.keys() for r in requests):  # noqa: SIM118
        return requests
    readable = [r.unsqueeze(0) if r.batch_dims == 0 else r for r in requests]
    prefixes = [read_prefixes(r) or [EMPTY] * r.batch_size[0] for r in readable]
    width = max((len(p) for rows in prefixes for p in rows), default=0)
    wanting = any(RETURN_AFTER_GROUPS in r.keys() for r in readable)  # noqa: SIM118
    aligned = []
    for request, rows, original in zip(readable, prefixes, requests, strict=True):
        attached = attach_prefixes(request.exclude(*RESUME_KEYS), rows, width=width)
        if wanting and RETURN_AFTER_GROUPS not in attached.keys():  # noqa: SIM118
            attached.set(RETURN_AFTER_GROUPS, torch.tensor([[-1, 0]]).expand(len(rows), 2))
        aligned.append(attached[0] if original.batch_dims == 0 else attached)
    return aligned


class GroupsEnded:
    """The early-return rule of a call: true once every caller has its wanted number of groups
    whose rows in the call all ended (see the module docstring).

    Args:
        callers, groups: ``[N]`` each row's caller id and group id.
        wanted: whole groups each caller wants.
    """

    def __init__(self, callers: torch.Tensor, groups: torch.Tensor, wanted: dict[int, int]) -> None:
        # what each caller needs, fixed for the call (the rule is asked after every step):
        # its rows, their group ids, and how many groups it holds
        self.callers = []
        for caller, want in wanted.items():
            if want > 0:
                rows = callers == caller
                held = int(groups[rows].unique().numel())
                self.callers.append((rows, groups[rows], held, want))

    def __call__(self, ended: torch.Tensor) -> bool:
        """Whether to return now, given which rows ended (``[N]`` bool)."""
        ended = ended.cpu()
        for rows, groups, held, want in self.callers:
            still_open = groups[~ended[rows]].unique().numel()
            if held - still_open < want:
                return False
        return True


def early_return(td: TensorDictBase) -> GroupsEnded | None:
    """The early-return rule ``td`` ``[B]`` asks for (None: return when every row is done)."""
    if RETURN_AFTER_GROUPS not in td.keys() or "group_id" not in td.keys():  # noqa: SIM118
        return None
    asked = td.get(RETURN_AFTER_GROUPS).reshape(-1, 2)
    callers = asked[:, 0]
    wanted = {int(c): int(w) for c, w in zip(callers.tolist(), asked[:, 1].tolist(), strict=True)}
    if not any(w > 0 for w in wanted.values()):
        return None
    return GroupsEnded(callers, td.get("group_id").reshape(-1), wanted)
