"""`PartialRolloutRunner`: replies sampled a segment at a time, so a batch never waits for the
longest one, and replies in flight go on across weight pushes.

Without it an env worker's batch of prompts x G replies is one policy call: it ends when its
longest reply ends, and a weight push waits for it. With skewed lengths (most replies short, a
few at the token budget) the engine then spends most of the call decoding a handful of rows.

Here each policy call decodes at most ``segment_tokens`` tokens per row (a policy built with
``segment_tokens``, :mod:`llmrl.policies.segments`). Rows whose reply ended go to the env for
their reward; rows still going stay in the runner's pool with their reply so far, and the next
call resumes them from that prefix, next to fresh prompts drawn to keep the pool full. A batch
is cut as soon as enough *whole groups* have finished (a group's G replies are released
together, so advantages always see complete groups); the long replies carry over into the next
batch. Between two batches the weights may be pushed: a reply resumed after a push continues
under the new weights, and its tokens carry two versions.

Versions: every reply gets ``token_versions`` (``[L]``, the version that sampled each token)
and ``policy_version`` = its *oldest* token's version, so the staleness bound
(:class:`~llmrl.collectors.AsyncRollouts`, which refuses groups beyond it) counts a sample's
oldest token. The loss needs nothing more: it already takes each token's own sampling log-prob.
A reply whose oldest token is already more than ``max_age`` versions behind the engine is
restarted from its prompt (its tokens could only be refused later): ``restarted_rows``. With
sampling one batch ahead of training (``AsyncRollouts(lead=1)``) a batch is trained one version
after the engine sampled its last tokens, so the runtime sets ``max_age = max_staleness - 1``.

Single-turn episodes only (each reply ends its trajectory); the stage refuses partial rollouts
with tools. A checkpoint keeps the dataset position, not the replies in flight: after a resume
the prompts whose groups were in flight are not drawn again (as with any trajectory in
progress, :class:`~llmrl.collectors.llm_collector.TrajectoryRunner`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDictBase

from llmrl.collectors.llm_collector import StepResult, Trajectory, TrajectoryRunner
from llmrl.policies.segments import (
    EMPTY,
    PARTIAL_KEY,
    RETURN_AFTER_GROUPS,
    Prefix,
    attach_prefixes,
)

if TYPE_CHECKING:
    from llmrl.envs.chat_env import ChatEnv

POOL_RESETS = 2
"""Env resets' worth of rows an env worker keeps in flight (see :class:`PartialRolloutRunner`)."""

TOKEN_VERSIONS = "token_versions"
"""Per reply, ``[L]``: the policy version that sampled each of its tokens."""


class PartialRolloutRunner(TrajectoryRunner):
    """A :class:`TrajectoryRunner` over a segmented policy (see the module docstring).

    Args:
        env, policy, traj_id_start, traj_id_step: as for :class:`TrajectoryRunner`;
            ``policy`` must be segmented and stamp ``policy_version`` on its replies.
        group_size: replies per prompt (the env's ``repeats``): a group is released when all
            of them ended.
        max_age: replies whose oldest token is further behind the engine are restarted.
        pool_resets: env resets' worth of rows kept in flight. With 2, a call holds twice the
            groups its caller needs and returns once the first of them ended; the others
            carry over with their head start (1: the call waits for every group it holds).
        group_key, version_key: where rows carry their group id and their reply's version.
    """

    def __init__(
        self,
        env: ChatEnv,
        policy: Callable[[TensorDictBase], TensorDictBase],
        *,
        group_size: int,
        max_age: int,
        pool_resets: int = POOL_RESETS,
        traj_id_start: int = 0,
        traj_id_step: int = 1,
        group_key: str = "group_id",
        version_key: str = "policy_version",
    ) -> None:
        super().__init__(env, policy, traj_id_start, traj_id_step, keep_trajectories=True)
        self.caller_id = traj_id_start  # env worker i starts its ids at i: unique per worker
        self.group_size = group_size
        self.max_age = max_age
        self.group_key, self.version_key = group_key, version_key
        self.stats = {"resumed_rows": 0, "restarted_rows": 0, "segments": 0}
        self._replies: dict[int, tuple[Prefix, torch.Tensor]] = {}  # traj id -> prefix, versions
        self._groups: dict[int, list[Trajectory]] = {}  # group id -> its ended replies
        self.pool_resets = pool_resets
        self._fresh_rows = 0  # rows an env reset draws

    @property
    def waiting(self) -> int:
        """Replies that ended and wait for the rest of their group."""
        return sum(len(members) for members in self._groups.values())

    def reset(self) -> None:
        """Drop the replies in flight and the groups waiting (the next step resets the env)."""
        super().reset()
        self._replies, self._groups = {}, {}

    def step(self, rows_wanted: int | None = None) -> StepResult:
        """One segment for every row in the pool (topped up with fresh prompts first); the
        groups whose last reply ended in it, as finished trajectories. ``rows_wanted``: the
        rows the caller still needs; the policy may return as soon as that many groups ended
        (:mod:`llmrl.policies.segments`, "Returning early")."""
        self._top_up()
        state = self.state
        if state is None:
            return StepResult()
        ids = state.get("traj_id").reshape(-1).tolist()
        prefixes = [self._replies.get(traj, (EMPTY, None))[0] for traj in ids]
        self.stats["resumed_rows"] += sum(len(p) > 0 for p in prefixes)
        self.stats["segments"] += 1
        request = attach_prefixes(state, prefixes)
        if rows_wanted is not None:
            groups = -(-max(rows_wanted, 1) // self.group_size)
            wanted = torch.tensor([[self.caller_id, groups]]).expand(len(ids), 2)
            request.set(RETURN_AFTER_GROUPS, wanted.clone())
        out = self.policy(request)
        if PARTIAL_KEY not in out.keys():  # noqa: SIM118
            raise ValueError(
                "partial rollouts need a segmented policy (built with segment_tokens): its "
                f"replies say which go on ({PARTIAL_KEY!r}); this one's did not"
            )
        going = out.get(PARTIAL_KEY).reshape(-1).tolist()
        versions = self._token_versions(out, ids)
        result = StepResult()
        ended = [row for row, partial in enumerate(going) if not partial]
        if ended:
            self._finish(out, ended, ids, versions, result)
        kept = [row for row, partial in enumerate(going) if partial]
        self.state = state[torch.tensor(kept)] if kept else None
        self._remember(out, kept, ids, versions)
        return result

    def _top_up(self) -> None:
        """Draw fresh prompts while fewer rows than ``pool_resets`` env resets' are in flight."""
        while not self.exhausted and (
            self.state is None or self.in_flight < self.pool_resets * self._fresh_rows
        ):
            fresh = self._reset_env()
            if fresh is None:
                return
            self._fresh_rows = fresh.batch_size[0]
            self.state = fresh if self.state is None else torch.cat([self.state, fresh])

    def _token_versions(self, out: TensorDictBase, ids: list[int]) -> list[torch.Tensor]:
        """Each row's token versions: its prefix's, then the replying version for the rest."""
        replied = out.get(self.version_key).reshape(-1).tolist()
        lengths = [len(r) for r in out.get("tokens").as_list("response")]
        versions = []
        for traj, version, length in zip(ids, replied, lengths, strict=True):
            before = self._replies.get(traj, (EMPTY, torch.zeros(0, dtype=torch.long)))[1]
            new = torch.full((length - before.numel(),), int(version), dtype=torch.long)
            versions.append(torch.cat([before, new]))
        return versions

    def _finish(
        self,
        out: TensorDictBase,
        rows: list[int],
        ids: list[int],
        versions: list[torch.Tensor],
        result: StepResult,
    ) -> None:
        """The env scores the ended replies; each joins its group, released once whole."""
        replies = out[torch.tensor(rows)].exclude(PARTIAL_KEY)
        replies.set(
            self.version_key,
            torch.tensor([int(versions[row].min()) for row in rows], dtype=torch.long),
        )
        transition = self.env.step(replies)
        done = transition.get("done").reshape(-1).tolist()
        if not all(done):
            raise ValueError(
                "partial rollouts run single-turn episodes (each reply ends its trajectory); "
                "this env went on after a reply (tools on?)"
            )
        groups = transition.get(self.group_key).reshape(-1).tolist()
        for index, row in enumerate(rows):
            self._replies.pop(ids[row], None)
            transition_row = transition[index]
            transition_row.set(TOKEN_VERSIONS, versions[row])
            result.transitions.append(transition_row)
            members = self._groups.setdefault(int(groups[index]), [])
            members.append([transition_row])
            if len(members) == self.group_size:
                result.finished.extend(self._groups.pop(int(groups[index])))

    def _remember(
        self, out: TensorDictBase, rows: list[int], ids: list[int], versions: list[torch.Tensor]
    ) -> None:
        """Keep each going reply's prefix and versions for the next segment; a reply whose
        oldest token is beyond the staleness bound starts again from its prompt."""
        if not rows:
            return
        newest = int(out.get(self.version_key).reshape(-1).max())
        tokens = out.get("tokens").as_list("response")
        log_probs = out.get("log_probs").as_list("response")
        for row in rows:
            if int(versions[row].min()) < newest - self.max_age:
                self._replies.pop(ids[row], None)
                self.stats["restarted_rows"] += 1
                continue
            prefix = Prefix(tokens[row].clone(), log_probs[row].detach().float().clone())
            self._replies[ids[row]] = (prefix, versions[row])


def partial_runner_factory(group_size: int, max_age: int) -> Callable[..., PartialRolloutRunner]:
    """``factory(env, policy, traj_id_start=, traj_id_step=, keep_trajectories=)`` -> a
    :class:`PartialRolloutRunner`: what an env worker builds its runner with."""

    def build(env: ChatEnv, policy: Any, **kwargs: Any) -> PartialRolloutRunner:
        kwargs.pop("keep_trajectories", None)
        return PartialRolloutRunner(env, policy, group_size=group_size, max_age=max_age, **kwargs)

    return build
