"""The two Ray actors of :class:`~llmrl.collectors.ray_collector.RayLLMCollector`.

- :class:`InferenceActor` hosts one policy and serves ``generate`` / ``score`` to env workers
  (a threaded actor: concurrent calls meet in the policy's request batcher), loads weights
  between calls, and reports its version and weight checksum;
- :class:`EnvWorker` owns one env and runs the single-process trajectory loop against a remote
  inference actor, sending finished trajectories through the rollout transport.

Who calls whom, and how a dead actor is rebuilt: :mod:`llmrl.collectors.ray_collector`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from llmrl.collectors.actor_faults import is_actor_death
from llmrl.collectors.llm_collector import Trajectory, TrajectoryRunner, find_version_transform
from llmrl.core.deadlines import CallTimeout, Hung, cause_of, wait_for
from llmrl.core.faults import hang_point
from llmrl.core.ray_helpers import import_ray
from llmrl.core.weights_checksum import verify_checksum, weights_checksum
from llmrl.objectives.consistency import ENGINE_KEY
from llmrl.transports.packed_weights import PackedStateDict
from llmrl.transports.rollouts import RolloutBatch, RolloutSender
from llmrl.transports.weights import held_weights

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from llmrl.envs.chat_env import ChatEnv
    from llmrl.transports.broadcast import GroupMembership

logger = logging.getLogger(__name__)

T = TypeVar("T")
ENGINE_CALL_SETTING = "runtime.timeouts.engine_call_s"


class InferenceActor:
    """Hosts one policy and serves it to env workers (run as a Ray actor).

    ``generate`` and ``score`` may run concurrently (the policy's request batching groups
    them); loading weights waits for calls in progress and holds new ones back meanwhile.

    Args:
        policy_factory: a picklable callable building the policy in the actor.
        version_key: where ``generate`` writes the policy version; None writes nothing.
        engine: this actor's index, written by ``generate`` at
            :data:`~llmrl.objectives.consistency.ENGINE_KEY` (which engine sampled each row,
            for the consistency audit); None writes nothing.
    """

    def __init__(
        self,
        *,
        policy_factory: Callable[[], Any],
        version_key: str | None = "policy_version",
        engine: int | None = None,
    ) -> None:
        self.policy = policy_factory()
        self.version_key = version_key
        self.engine = engine
        self.version = 0
        self.generate_calls = 0
        self._scorer: Any = None
        self._gate = threading.Condition()
        self._active = 0
        self._loading = False
        self._receiver: Any = None
        self._verified: str | None = None

    def ready(self) -> bool:
        """True once the policy is built (wait on it to surface construction errors)."""
        return True

    def generate(self, td: TensorDictBase) -> TensorDictBase:
        """The policy's output for a state batch, with ``policy_version`` written (and this
        engine's index: an earlier turn's, which a multi-turn state carries, is replaced)."""
        if self.engine is not None:  # requests batched together must hold the same keys
            td = td.exclude(ENGINE_KEY)
        with self._serving():
            out = self.policy(td)
            version = self.version
        with self._gate:
            self.generate_calls += 1
        if self.version_key is not None:
            out.set(self.version_key, torch.full(out.batch_size, version, dtype=torch.long))
        if self.engine is not None:
            out.set(ENGINE_KEY, torch.full(out.batch_size, self.engine, dtype=torch.long))
        return out

    def score(self, td: TensorDictBase) -> TensorDictBase:
        """Log-probs of ``("history", "full")`` under the hosted weights (a scoring twin of the
        policy, ``get_new_version(generate=False)``, without request batching)."""
        if self._scorer is None:
            self._scorer = self.policy.get_new_version(
                generate=False, min_batch_size=None, max_batch_size=None
            )
        with self._serving():
            return on_passing_thread(self._scorer, td)

    def load_state_dict(
        self,
        state_dict: dict[str, torch.Tensor] | PackedStateDict,
        version: int | None = None,
        checksum: str | None = None,
    ) -> str:
        """Load a trainer state dict (or its packed form) into the policy:
        ``model.load_state_dict`` for a transformers policy, ``load_weights`` for a vLLM one.

        With ``checksum`` (the sender's), the weights are checked first and refused on a
        mismatch (:class:`~llmrl.core.weights_checksum.WeightChecksumError`, nothing loaded).
        Returns the checksum of the weights the policy then holds (a transformers policy: its
        state dict under the names loaded; a vLLM one: the checksum its engines verified).
        """
        if isinstance(state_dict, PackedStateDict):
            state_dict = state_dict.unpack()
        received = on_passing_thread(verify_checksum, state_dict, checksum, "inference actor")
        return self._load(state_dict, version, received)

    def load_adapter(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        lora_config: dict[str, Any],
        version: int,
        checksum: str | None = None,
    ) -> str:
        """Swap the LoRA adapter the policy's model serves (a transformers policy over a peft
        model of ``lora_config``'s shape, :func:`~llmrl.models.adapters.with_lora_adapter`)
        for ``named_tensors``, once they match ``checksum`` (nothing changes otherwise), after
        the calls in progress; the checksum of the adapter the model then holds."""
        from llmrl.models.adapters import adapter_state, load_adapter_state

        state = dict(named_tensors)
        on_passing_thread(verify_checksum, state, checksum, "inference actor")
        with self._exclusive():
            hang_point("load_weights", version)  # $LLMRL_HANG_AT: tests' stuck loads
            model = self.policy.model
            on_passing_thread(load_adapter_state, model, state)
            self.version = int(version)
            return on_passing_thread(lambda: weights_checksum(adapter_state(model)))

    def join_weight_group(self, membership: GroupMembership) -> None:
        """Join the trainer's weight broadcast group (returns once every member has)."""
        from llmrl.transports.broadcast import BroadcastReceiver

        where = f"inference actor (broadcast rank {membership.rank})"
        self._receiver = BroadcastReceiver(membership.join(), where)

    def receive_weights(self) -> str:
        """Receive the next broadcast push (call it before the trainer sends), check it, load
        it; the checksum of the weights then held (as :meth:`load_state_dict`)."""
        if self._receiver is None:
            raise RuntimeError("receive_weights needs join_weight_group first")
        received = on_passing_thread(self._receiver.receive)
        return self._load(received.state, received.version, received.checksum)

    def _load(self, state_dict: dict[str, torch.Tensor], version: int | None, checksum: str) -> str:
        with self._exclusive():
            hang_point("load_weights", version or 0)  # $LLMRL_HANG_AT: tests' stuck loads
            if callable(getattr(self.policy, "load_weights", None)):
                self.policy.load_weights(state_dict.items(), version=version, checksum=checksum)
                held = self._verified = checksum  # verified by the engines before loading
            else:
                held = on_passing_thread(_load_into, self.policy.model, state_dict)
            if version is not None:
                self.version = int(version)
        return held

    def held_checksum(self) -> str | None:
        """The checksum of the weights the policy holds now: a transformers policy's whole
        state dict; for a vLLM policy, the checksum its engines last verified (None before)."""
        if callable(getattr(self.policy, "load_weights", None)):
            return self._verified
        return on_passing_thread(lambda: weights_checksum(self.policy.model.state_dict()))

    def set_version(self, version: int) -> None:
        """Record the version of weights loaded by other means (NCCL broadcasts)."""
        self.version = int(version)

    def info(self) -> dict[str, Any]:
        """``version``, ``generate_calls`` served, and ``model_calls``: the batches the
        policy's request batcher ran (fewer than calls when callers were served together;
        None without request batching)."""
        batcher = getattr(self.policy, "_batcher", None)
        return {
            "version": self.version,
            "generate_calls": self.generate_calls,
            "model_calls": None if batcher is None else batcher.batches_processed,
        }

    @contextmanager
    def _serving(self) -> Iterator[None]:
        with self._gate:
            self._gate.wait_for(lambda: not self._loading)
            self._active += 1
        try:
            yield
        finally:
            with self._gate:
                self._active -= 1
                self._gate.notify_all()

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._gate:
            self._gate.wait_for(lambda: not self._loading)
            self._loading = True
            self._gate.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._gate:
                self._loading = False
                self._gate.notify_all()


def _load_into(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> str:
    """Copy ``state_dict`` into ``model``; the checksum of what it then holds under those names."""
    with torch.no_grad():
        model.load_state_dict(state_dict)
    return weights_checksum(held_weights(model, state_dict))


def on_passing_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on a thread started for the call and joined (its exception re-raised).

    For torch work an inference actor does beside its policy's model calls (weight loads and
    checksums, scoring). Torch's OpenMP runtime (libgomp) keeps a team of threads for every
    thread that ever ran a parallel region, for as long as that thread lives, and once a
    process holds more such threads than it has CPUs, every team stops spin-waiting between
    parallel regions and sleeps instead. A Ray actor's method threads live as long as the
    actor: after one weight load on one of them the engine's decode (thousands of short
    regions) kept fewer of its cores busy, and took longer, for the rest of the run
    (benchmarks/README.md#where-the-runtimes-time-went-and-what-changed-2026-11-27). A thread
    that ends takes its team with it.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="llmrl-actor-torch")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class EnvWorker:
    """Owns one env and steps it with a remote inference actor (run as a Ray actor).

    Trajectory ids are ``worker_index + k * num_workers``: unique across workers.
    ``runner_factory`` builds the stepping loop (default :class:`TrajectoryRunner`; partial
    rollouts: :func:`~llmrl.collectors.partial_rollouts.partial_runner_factory`), whose
    ``stats``, if it keeps any, come back with each batch (``info["runner"]``).
    ``engine_call_s`` bounds each call to the inference actor (None: no bound).
    """

    def __init__(
        self,
        *,
        env_factory: Callable[[int], ChatEnv],
        worker_index: int,
        num_workers: int,
        inference_actor: Any,
        yield_completed_trajectories: bool = True,
        rollout_sender: RolloutSender | None = None,
        runner_factory: Callable[..., TrajectoryRunner] | None = None,
        engine_call_s: float | None = None,
    ) -> None:
        self.env = env_factory(worker_index)
        self.engine_call_s = engine_call_s
        self.worker_index = worker_index
        self.inference_actor = inference_actor
        self.rollout_sender = rollout_sender
        self.by_trajectory = yield_completed_trajectories
        self._reply_version = 0
        self._version = find_version_transform(self.env)
        if self._version is not None:  # the env stamps the version of the last reply
            self._version.follow(lambda: self._reply_version)
        self.runner = (runner_factory or TrajectoryRunner)(
            self.env,
            self._generate,
            traj_id_start=worker_index,
            traj_id_step=num_workers,
            keep_trajectories=yield_completed_trajectories,
        )

    def ready(self) -> bool:
        """True once the env is built."""
        return True

    def collect(self, n_turns: int, round_id: int = 0) -> RolloutBatch | None:
        """Step until at least ``n_turns`` transitions are ready (finished trajectories, or
        single transitions) and send them through the rollout sender as one
        :class:`~llmrl.transports.rollouts.RolloutBatch` (``source``: this worker's index,
        ``info``: ``{"turns", "trajectories", "exhausted", "state", "round"}``, ``state``
        being :meth:`state_dict` now, so what was produced and where to go on from travel
        together). Returns None once sent; without a sender, returns the batch.

        When the inference actor dies (or does not answer within ``engine_call_s``: then also
        ``info["inference_timeout"]``, the :class:`~llmrl.core.deadlines.CallTimeout`), the call
        sends early what is ready, with ``info["inference_error"]`` (its message); the rows
        waiting for a reply stay, and the next call asks the actor given by
        :meth:`set_inference_actor`.
        """
        units: list[Trajectory] = []
        ready = turns = trajectories = 0
        info: dict[str, Any] = {}
        while ready < n_turns and not self._exhausted():
            try:
                result = self.runner.step(rows_wanted=n_turns - ready)
            except Exception as error:
                hung = isinstance(error, CallTimeout) and cause_of(error) is error
                if not (hung or is_actor_death(error)):
                    raise
                info["inference_error"] = f"{type(error).__name__}: {error}"
                if hung:  # the driver kills and rebuilds the engine that hung
                    info["inference_timeout"] = error
                break
            new = result.units(self.by_trajectory)
            units.extend(new)
            ready += sum(len(unit) for unit in new)
            turns += len(result.transitions)
            trajectories += len(result.finished)
        info.update(
            turns=turns,
            trajectories=trajectories,
            exhausted=self._exhausted(),
            state=self.state_dict(),
            round=round_id,
            runner=dict(getattr(self.runner, "stats", {})),
        )
        batch = RolloutBatch(units, source=self.worker_index, info=info)
        if self.rollout_sender is None:
            return batch
        self.rollout_sender.send(batch)
        return None

    def close(self) -> None:
        """Close the env (its transforms' resources: MCP servers, sandboxes), if it can be."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()

    def set_inference_actor(self, inference_actor: Any) -> None:
        """Send the next policy calls to ``inference_actor`` (a rebuilt one)."""
        self.inference_actor = inference_actor

    def state_dict(self) -> dict[str, Any]:
        """The runner's state: next trajectory id and dataset position."""
        return self.runner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (trajectories in progress are dropped)."""
        self.runner.load_state_dict(state)

    def _exhausted(self) -> bool:
        return self.runner.exhausted and not self.runner.in_flight

    def _generate(self, state: TensorDictBase) -> TensorDictBase:
        ray = import_ray("Env workers")
        reply = self.inference_actor.generate.remote(state)
        if self.engine_call_s is None:
            out = ray.get(reply)
        else:  # the driver names the engine and the round
            hung = Hung(role="inference engine", call="generate", setting=ENGINE_CALL_SETTING)
            out = wait_for(reply, self.engine_call_s, hung)
        if self._version is not None and self._version.key in out.keys():  # noqa: SIM118
            # the env's own PolicyVersion stamps what the inference actor reported
            self._reply_version = int(out.get(self._version.key).reshape(-1)[0])
        return out
