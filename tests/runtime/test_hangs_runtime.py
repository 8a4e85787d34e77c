"""The GRPO runtime on a local Ray with an engine that hangs inside ``load_weights`` during the
push of version 2 (``LLMRL_HANG_AT``, :func:`llmrl.core.faults.hang_point`) and no restart
left: rank 0's deadline on the engines (``runtime.timeouts.weight_push_s``) ends the push, the
driver gets that :class:`~llmrl.core.deadlines.CallTimeout` through Ray, and the step stops
with it, naming the role, the engine, the phase, the version and the step; the checkpoint
written before the hang is complete and loads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmrl.core.deadlines import CallTimeout
from llmrl.core.faults import HANG_ENV
from llmrl.models import load_model
from llmrl.runtime import GRPORuntime, resolve_topology
from llmrl.runtime.ray_cluster import actor_runtime_env
from llmrl.train.checkpoint import list_checkpoints, load_checkpoint
from tests.support.configs import tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PUSH_S = 5.0


def test_an_engine_hung_in_a_push_stops_the_run_naming_it_and_the_checkpoint_before_loads(
    local_ray, arithmetic_data, tiny_model_dir, monkeypatch, tmp_path
):
    checkpoints = tmp_path / "checkpoints"
    monkeypatch.setenv(HANG_ENV, "load_weights:2")  # forwarded to every actor (LLMRL_*)
    config = tiny_grpo_config(
        arithmetic_data,
        tiny_model_dir,
        "runtime.max_actor_restarts=0",
        f"runtime.timeouts.weight_push_s={PUSH_S}",
        f"checkpoint.dir={checkpoints}",
    )
    runtime = GRPORuntime(
        config=config, topology=resolve_topology(config), runtime_env=actor_runtime_env()
    )
    try:
        _, metrics = runtime.step(1)  # its push makes version 1
        saved = runtime.save(1, {}, metrics)
        start = time.monotonic()
        with pytest.raises(CallTimeout) as caught:
            runtime.step(2)  # its push of version 2 hangs in engine 0
        seconds = time.monotonic() - start
    finally:
        runtime.shutdown()

    assert seconds >= PUSH_S
    assert str(caught.value) == (
        "inference engine 0 hung: load_state_dict / load_weights did not return within 5 s "
        "(phase loading, version 2, step 2; bounded by runtime.timeouts.weight_push_s); not "
        "rebuilt: max_actor_restarts=0 spent on inference actor 0"
    )
    # the checkpoint of step 1 is whole (written atomically, before the hang) and loads
    assert list_checkpoints(checkpoints) == [Path(saved)]
    loaded = load_checkpoint(saved, model=load_model(tiny_model_dir))
    assert loaded.step == 1
