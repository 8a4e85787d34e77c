"""The deadline machinery every wait of the GRPO runtime shares (:mod:`llmrl.core.deadlines`)
and its settings (``runtime.timeouts``): the timeout's message names what hung, survives the
trip through Ray (pickling), gains the step where the runtime learns it without losing what the
waiting code knew, and torch.distributed's timeouts become one."""

from __future__ import annotations

import pickle
import time

import pytest
from pydantic import ValidationError

from llmrl.config.runtime_settings import RuntimeSettings, RuntimeTimeouts
from llmrl.core.deadlines import CallTimeout, Deadline, Hung, naming_timeouts

PUSH = Hung(
    role="inference engine",
    call="load_state_dict",
    index=1,
    phase="loading",
    version=3,
    setting="runtime.timeouts.weight_push_s",
)


def test_the_message_names_role_index_call_phase_version_and_setting():
    error = CallTimeout(PUSH, 5.0)
    assert isinstance(error, TimeoutError)
    assert str(error) == (
        "inference engine 1 hung: load_state_dict did not return within 5 s (phase loading, "
        "version 3; bounded by runtime.timeouts.weight_push_s)"
    )
    bare = CallTimeout(Hung(role="reference", call="score"), 0.25)
    assert str(bare) == "reference hung: score did not return within 0.25 s"


def test_a_timeout_survives_pickling_as_ray_sends_it():
    error = CallTimeout(PUSH, 5.0, note="also pending: inference engine 2")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CallTimeout and str(copy) == str(error)
    assert copy.hung == PUSH and copy.timeout_s == 5.0


def test_details_fill_what_is_unknown_and_keep_what_is_known():
    error = CallTimeout(PUSH, 5.0).with_details("not rebuilt", version=9, step=4, index=0)
    assert (error.hung.version, error.hung.step, error.hung.index) == (3, 4, 1)
    assert str(error).endswith(
        "(phase loading, version 3, step 4; bounded by runtime.timeouts.weight_push_s); not rebuilt"
    )
    twice = error.with_details("stopped")
    assert twice.note == "not rebuilt; stopped"


def test_each_call_of_a_fan_out_gets_its_index():
    assert [hung.who() for hung in PUSH.each(range(3))] == [
        "inference engine 0",
        "inference engine 1",
        "inference engine 2",
    ]


def test_torch_distributed_timeouts_become_call_timeouts_and_other_errors_pass():
    gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 2000ms")
    with pytest.raises(CallTimeout) as caught, naming_timeouts(PUSH, 2.0):
        raise gloo
    assert caught.value.__cause__ is gloo and caught.value.note == str(gloo)
    with pytest.raises(RuntimeError, match="Connection closed"), naming_timeouts(PUSH, 2.0):
        raise RuntimeError("Connection closed by peer")


def test_a_deadline_counts_down_to_zero():
    deadline = Deadline(0.05)
    first = deadline.left()
    assert 0 < first <= 0.05
    time.sleep(0.06)
    assert deadline.left() == 0.0


def test_the_timeouts_default_generously_and_an_env_worker_outlasts_its_engine_calls():
    timeouts = RuntimeSettings().timeouts
    assert timeouts == RuntimeTimeouts()
    assert timeouts.env_worker_s >= timeouts.engine_call_s >= 60  # a CPU generate fits
    with pytest.raises(ValidationError, match=r"env_worker_s \(5\) < engine_call_s \(10\)"):
        RuntimeTimeouts(engine_call_s=10, env_worker_s=5)
    with pytest.raises(ValidationError, match="weight_push_s"):
        RuntimeTimeouts(weight_push_s=0)
