"""The GRPO runtime's settings (``runtime`` in the ``grpo`` config), and its deadlines.

Every wait of the runtime on another process has a deadline (:class:`RuntimeTimeouts`,
``runtime.timeouts``; the trainer ranks' collectives keep ``runtime.collective_timeout_s``).
On expiry the wait raises :class:`~llmrl.core.deadlines.CallTimeout` naming the role, its
index, the phase, the version and the step; an engine or an env worker that hung is killed and
rebuilt like one that died (within ``max_actor_restarts``), anything else stops the run with
that error (``docs/grpo-runtime.md``, "Deadlines").
"""

from __future__ import annotations

from pydantic import Field, model_validator

from llmrl.core.config_loading import MAX_BATCH, MAX_TIMEOUT_S, ConfigModel


class RuntimeTimeouts(ConfigModel):
    """How long the runtime waits for each kind of call before it names what hung. The
    defaults are far above a healthy call on a CPU machine and a GPU cluster; tighten them
    once a run's ``weight_sync_seconds`` and ``generation_seconds`` are known."""

    weight_push_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="one weight push, from rank 0's first byte to every engine's checksum "
        "reply (sending, loading, verifying); a push of SmolLM2 takes under a second on CPU, "
        "a 70B model's over NCCL tens of seconds",
    )
    engine_call_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="one call to an inference engine (an env worker's generate of its rows, "
        "the driver's version stamp or ping)",
    )
    env_worker_s: float = Field(
        1800.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="one collect call of an env worker: its share of a batch (several "
        "engine calls, tools and rewards); at least engine_call_s",
    )
    reference_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="one scoring call of the dedicated reference (a step's batch)",
    )
    startup_s: float = Field(
        1800.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="building an engine or an env worker (its model load), before its first "
        "call; also a rebuilt one",
    )

    @model_validator(mode="after")
    def _worker_outlasts_its_engine_calls(self) -> RuntimeTimeouts:
        if self.env_worker_s < self.engine_call_s:
            raise ValueError(
                f"env_worker_s ({self.env_worker_s:g}) < engine_call_s ({self.engine_call_s:g}):"
                " an env worker's collect makes engine calls, so its deadline would fire first "
                "and blame the worker for a hung engine; raise env_worker_s"
            )
        return self


class RuntimeSettings(ConfigModel):
    """How the GRPO runtime runs its roles on Ray (see :mod:`llmrl.runtime`)."""

    ray_address: str | None = Field(
        None,
        description="Ray cluster to join ('auto' inside a RayJob); None: $RAY_ADDRESS when set, "
        "else a local Ray started for the stage",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="torch CPU threads of each engine and trainer rank (None: torch's default; "
        "on a CPU machine, the cores: sampling and training take turns in sync mode)",
    )
    placement_timeout_s: float = Field(
        120.0, gt=0, le=MAX_TIMEOUT_S, description="how long to wait for the placement groups"
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="torch.distributed timeout of every collective: the trainer ranks' "
        "(gradients, FSDP gathers) and the weight broadcast group's (joining, each bucket); "
        "a peer that never joins or never sends ends the wait with an error naming the "
        "broadcast's phase, version and ranks",
    )
    timeouts: RuntimeTimeouts = Field(
        default_factory=RuntimeTimeouts,
        description="deadlines of weight pushes, engine, env worker and reference calls",
    )
    batching_timeout_s: float = Field(
        0.5,
        gt=0,
        le=MAX_TIMEOUT_S,
        description="how long an engine waits for the other env workers' requests of a step",
    )
    max_actor_restarts: int = Field(
        3,
        ge=0,
        le=MAX_BATCH,
        description="rebuilds allowed per inference engine or env worker that died or hung "
        "past its deadline",
    )
    compile_decode: bool | None = Field(
        None,
        description="transformers engines sample with a static KV cache and a torch.compile'd "
        "decode step: faster per token once compiled, but the first step with a new batch "
        "shape compiles (tens of seconds); None: on for engines on a GPU (several times "
        "faster there), off on a CPU (slower there); see benchmarks/README.md",
    )
    partial_rollouts: bool = Field(
        False,
        description="async mode: sample replies a segment at a time; a batch takes the groups "
        "that ended and replies still going carry over into the next one, across weight "
        "pushes (their tokens then hold two versions; the staleness bound counts a reply's "
        "oldest token). For skewed lengths: a batch no longer waits for its longest reply",
    )
    segment_tokens: int | None = Field(
        None,
        ge=1,
        description="partial rollouts: at most this many new tokens per row and engine call "
        "(each call prefills prompt + reply so far again); None: none for transformers "
        "engines, whose calls return as soon as the env workers have their groups, a quarter "
        "of generation.max_new_tokens (rounded up) for vLLM engines, which cannot return "
        "early but whose prefix cache serves the re-prefills",
    )

    def segment_length(self, max_new_tokens: int, backend: str) -> int | None:
        """The segment cap of partial rollouts for a budget of ``max_new_tokens`` on
        ``backend``'s engines (None: no cap; see ``segment_tokens``)."""
        if self.segment_tokens is not None:
            return self.segment_tokens
        return None if backend == "transformers" else -(-max_new_tokens // 4)
