"""The colocated layout's orchestration: vLLM engines asleep while the trainer ranks step.

With ``topology.colocated`` the inference engines and the trainer ranks share GPUs
(:mod:`llmrl.topology.placement`), so they take turns with the GPUs' memory. The engines are
built with vLLM's sleep mode (``enable_sleep_mode``), and every step of the GRPO runtime runs,
in this order::

    sample                  engines awake: the step's batch (GRPORuntime.collect)
    sleep(level=1)          every engine: weights offloaded to CPU, KV cache freed
    train                   the trainer ranks step with the GPUs' memory (GRPORuntime.train)
    wake_up(["weights"])    every engine: its weights back on the GPU, no KV cache yet
    push                    the trainer's weights into them (vLLM's ``ipc`` engine)
    wake_up(["kv_cache"])   every engine: its KV cache allocated again
    sample                  the next step's batch

:meth:`EngineSleep.sleep` is the first thing :meth:`~llmrl.runtime.GRPORuntime.train` does;
the two wakes wrap the ranks' push in :class:`WakingWeightUpdater`, inside the rollouts' push
(:meth:`~llmrl.collectors.AsyncRollouts.update_policy_weights_`), so the next batch, which
sync mode starts as soon as that push returns, always meets awake engines. The driver keeps
which memory is asleep: a wake of memory that is awake calls nothing, so the push that gives
the engines a resumed run's weights (engines start awake) and a push retried after a rebuilt
inference actor only wake what still sleeps, and a step that trained nothing (every row
dropped) pushes without sleeping.

Level 1, not 2: the engine keeps a copy of every tensor it holds (in CPU memory, a copy of
its weights per engine), so a wake restores it exactly, buffers a push does not carry
included, and the push only overwrites the weights; level 2 would drop them and leave an
engine whose push failed with no weights at all.

Each fan-out to the engines (all engines at once) is bounded by
``runtime.timeouts.engine_call_s``; an engine that does not answer in time stops the run with
a :class:`~llmrl.core.deadlines.CallTimeout` naming it (``vLLM engine <i>``), the call, the
memory or level, the version and the setting. A hung engine is not rebuilt: it holds GPU
memory the trainer ranks share.

Refusals: ``mode: async`` (an engine cannot sample while it sleeps: the config's validation,
:func:`~llmrl.config.grpo.topology_problems`), and a vLLM build without sleep mode (its CPU
build): :func:`refuse_without_sleep_mode`, before any actor starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrl.config.grpo import GRPOConfig
from llmrl.core.config_loading import ConfigError
from llmrl.core.deadlines import Hung, wait_for
from llmrl.runtime.trainer_group import TrainerGroup
from llmrl.runtime.weights import TrainerRanksWeightUpdater
from llmrl.topology import Topology
from llmrl.transports.weights import Delivery, Weights

SLEEP_LEVEL = 1
"""vLLM's sleep level of colocated engines: weights offloaded to CPU, KV cache freed."""
ENGINE_CALL_SETTING = "runtime.timeouts.engine_call_s"
"""The config field bounding each sleep and wake."""
WEIGHTS, KV_CACHE = "weights", "kv_cache"
"""vLLM's memory tags, woken one at a time."""


class EngineSleep:
    """Puts the colocated vLLM engines to sleep and wakes them (see the module docstring).

    Args:
        engines: the ``VLLMEngine`` actors; empty when the layout is not colocated (then
            every call does nothing).
        timeout_s: the deadline of each call to all engines (``runtime.timeouts.
            engine_call_s``).

    Attributes:
        asleep: the memory tags asleep on every engine (empty: awake).
    """

    def __init__(self, *, engines: Sequence[Any], timeout_s: float) -> None:
        self.engines = list(engines)
        self.timeout_s = float(timeout_s)
        self.asleep: set[str] = set()

    @classmethod
    def of(cls, config: GRPOConfig, topology: Topology, engines: Sequence[Any]) -> EngineSleep:
        """The runtime's: ``engines`` when ``topology`` is colocated (else none), each call
        bounded by ``config``'s ``runtime.timeouts.engine_call_s``."""
        timeout_s = config.runtime.timeouts.engine_call_s
        return cls(engines=engines if topology.colocated else [], timeout_s=timeout_s)

    def sleep(self, version: int) -> None:
        """Every engine offloads its weights (``version``) and frees its KV cache; nothing when
        they already sleep."""
        if self.engines and not self.asleep:
            self._on_every_engine("sleep", version, f"level {SLEEP_LEVEL}", level=SLEEP_LEVEL)
            self.asleep = {WEIGHTS, KV_CACHE}

    def wake(self, tag: str, version: int) -> None:
        """Every engine wakes its memory ``tag`` (``"weights"`` or ``"kv_cache"``) for the push
        of ``version``; nothing when that memory is awake."""
        if tag in self.asleep:
            self._on_every_engine("wake_up", version, tag, tags=[tag])
            self.asleep.discard(tag)

    def _on_every_engine(self, call: str, version: int, phase: str, **kwargs: Any) -> None:
        """``call`` on every engine at once, within one ``engine_call_s``."""
        refs = [getattr(engine, call).remote(**kwargs) for engine in self.engines]
        hung = Hung(
            role="vLLM engine", call=call, phase=phase, version=version, setting=ENGINE_CALL_SETTING
        )
        wait_for(refs, self.timeout_s, hung.each(range(len(refs))))

    def weight_updater(self, ranks: TrainerGroup) -> TrainerRanksWeightUpdater:
        """The runtime's weight updater over ``ranks``: their push, between the two wakes when
        colocated."""
        if not self.engines:
            return TrainerRanksWeightUpdater(ranks=ranks)
        return WakingWeightUpdater(ranks=ranks, engines=self)


class WakingWeightUpdater(TrainerRanksWeightUpdater):
    """The trainer ranks' push into colocated engines: their weights woken before it, their
    KV cache after it (see the module docstring)."""

    def __init__(self, *, ranks: TrainerGroup, engines: EngineSleep) -> None:
        super().__init__(ranks=ranks)
        self.engines = engines

    def _push(self, weights: Weights | None, version: int) -> Delivery:
        self.engines.wake(WEIGHTS, version)
        delivery = super()._push(weights, version)
        self.engines.wake(KV_CACHE, version)
        return delivery


def sleep_mode_problem() -> str | None:
    """Why vLLM in this process has no sleep mode (its CPU build), None when it has one or
    cannot tell: no vLLM here, or a GPU build on a machine without GPUs (a driver on a CPU
    node), where the engines' own nodes decide."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    if current_platform.is_sleep_mode_available() or current_platform.is_unspecified():
        return None
    build = "CPU" if current_platform.is_cpu() else str(current_platform.device_name)
    return f"vLLM's {build} build has no sleep mode"


def refuse_without_sleep_mode(topology: Topology) -> None:
    """Refuse a colocated ``topology`` where vLLM cannot sleep (:func:`sleep_mode_problem`):
    the runtime calls it before it starts any actor.

    Raises:
        ConfigError: naming ``topology.colocated`` and what to set instead.
    """
    problem = sleep_mode_problem() if topology.colocated else None
    if problem:
        raise ConfigError(
            [
                f"topology.colocated: {problem}, and the colocated layout puts the vLLM engines "
                "to sleep while the trainer ranks step on the same GPUs: it needs GPUs (vLLM's "
                "CUDA build); set topology.colocated: false (engines and trainer ranks on "
                "devices of their own)"
            ]
        )
