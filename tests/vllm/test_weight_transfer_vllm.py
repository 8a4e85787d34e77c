"""One call sequence into vLLM for every weight backend (``llmrl.transports.vllm``).

``VLLMWeightUpdater`` drives vLLM's trainer-side weight-transfer engine of a backend (``nccl``,
``ipc`` or llmrl's ``llmrl_file``) through ``EngineClient``; only ``llmrl_file`` runs on vLLM's
CPU build, and these tests run it: the calls each engine receives, in order; a real engine
actor after two pushes (its log-probs, its version, the checksum it verified); NCCL's rank
offsets per engine; and a push that outlives its deadline.
"""

from __future__ import annotations

import time

import pytest
import torch

from llmrl.core.deadlines import CallTimeout
from llmrl.core.weights_checksum import weights_checksum
from llmrl.transports.vllm import VLLMWeightUpdater
from tests.support.ray_local import actor_runtime_env
from tests.vllm.conftest import assert_close_rows, hf_log_probs, perturbed

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def actors(session_cache):
    """Ray options of this module's actors: no CPU held, the repository importable."""
    return {"num_cpus": 0, "runtime_env": actor_runtime_env(session_cache)}


PROBE = [1, 9690, 198, 504, 3458, 28, 253, 9516, 30, 216, 33, 34]


class RecordingEngine:
    """The client calls of ``VLLMEngine``, recorded (with the file each update names, read
    back); ``update_weights`` sleeps ``stall_s`` first (:meth:`stall`)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.stall_s = 0.0

    def stall(self, seconds: float) -> None:
        self.stall_s = seconds

    def begin_weight_audit(self) -> None:
        self.calls.append(("begin_weight_audit",))

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.calls.append(("init_weight_transfer_engine", init_info))

    def start_weight_update(self) -> None:
        self.calls.append(("start_weight_update",))

    def update_weights(self, update_info: dict) -> None:
        from safetensors.torch import load_file

        time.sleep(self.stall_s)
        tensors = load_file(update_info["path"])
        self.calls.append(("update_weights", sorted(tensors), update_info["sha256"]))
        self.received = tensors

    def finish_weight_update(self) -> None:
        self.calls.append(("finish_weight_update",))

    def end_weight_audit(self) -> str:
        self.calls.append(("end_weight_audit",))
        return weights_checksum(self.received)

    def set_weight_version(self, version: int) -> None:
        self.calls.append(("set_weight_version", version))

    def recorded(self) -> list[tuple]:
        return self.calls


class Front:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def set_version(self, version: int) -> None:
        self.versions.append(version)

    def recorded(self) -> list[int]:
        return self.versions


def test_every_push_is_one_call_sequence_on_every_engine(local_ray, actors, tmp_path):
    ray = local_ray
    engines = [ray.remote(RecordingEngine).options(**actors).remote() for _ in range(2)]
    front = ray.remote(Front).options(**actors).remote()
    updater = VLLMWeightUpdater(engines, backend="llmrl_file", fronts=[front], folder=str(tmp_path))
    embedding = torch.arange(12.0).reshape(4, 3)
    state = {"embed.weight": embedding, "head.weight": embedding, "norm.weight": torch.ones(3)}
    first = updater.push(state)
    second = updater.push({**state, "norm.weight": torch.full((3,), 2.0)})

    sent = {"embed.weight": embedding, "norm.weight": torch.ones(3)}  # the tied head once
    assert (first.version, second.version) == (1, 2)
    assert first.bytes == (12 + 3) * 4 and first.checksum == weights_checksum(sent)
    assert first.engine_checksums == (first.checksum,) * 2, "what each engine loaded"
    assert second.engine_checksums == (second.checksum,) * 2 != first.engine_checksums
    for engine in engines:
        calls = ray.get(engine.recorded.remote())
        names = ["embed.weight", "norm.weight"]
        push = [
            ("begin_weight_audit",),
            ("start_weight_update",),
            ("update_weights", names),
            ("finish_weight_update",),
            ("end_weight_audit",),
        ]
        expected = [("init_weight_transfer_engine", {}), *push, ("set_weight_version", 1)]
        expected += [*push, ("set_weight_version", 2)]
        assert [call[:2] for call in calls] == expected, "joined once, then the same calls"
    assert ray.get(front.recorded.remote()) == [1, 2]
    assert list(tmp_path.iterdir()) == [], "each push's file is deleted"


def test_a_push_past_its_deadline_names_the_call_and_the_setting(local_ray, actors, tmp_path):
    ray = local_ray
    engine = ray.remote(RecordingEngine).options(**actors).remote()
    updater = VLLMWeightUpdater([engine], backend="llmrl_file", folder=str(tmp_path))
    updater.push({"w": torch.zeros(2)}, version=3)  # joined, within the default deadline
    ray.get(engine.stall.remote(30.0))
    updater.push_timeout_s = 2.0
    start = time.monotonic()
    with pytest.raises(CallTimeout) as caught:
        updater.push({"w": torch.ones(2)}, version=4)
    assert time.monotonic() - start < 2.0 + 3.0
    message = str(caught.value)
    assert "update_weights" in message and "phase loading" in message
    assert "version 4" in message and "runtime.timeouts.weight_push_s" in message
    assert updater.version == 3, "a failed push makes no version"
    ray.kill(engine)


def test_nccl_ranks_are_offset_per_engine():
    from llmrl.policies.vllm_transfer import EngineClient

    client = EngineClient(["a", "b", "c"], ranks_per_engine=2, wait=lambda *a: [])
    info = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 7}
    offsets = [client._engine_init(info, index)["rank_offset"] for index in range(3)]
    assert offsets == [1, 3, 5], "engine i's TP workers take ranks 1 + 2i and 2 + 2i"
    assert client._engine_init({"packed": True}, 2) == {"packed": True}, "ipc: no ranks"
    assert VLLMWeightUpdater(["a", "b", "c"], backend="nccl", ranks_per_engine=2).world_size == 7
    with pytest.raises(ValueError, match="must be one of llmrl_file, nccl, ipc"):
        VLLMWeightUpdater(["a"], backend="gloo")


def test_pushes_into_a_vllm_engine_actor_make_it_score_like_the_trainer(
    local_ray, actors, vllm_tiny_dir, tiny_hf, tmp_path
):
    from llmrl.policies.vllm_engine import VLLMEngine

    ray = local_ray
    engine = (
        ray.remote(VLLMEngine)
        .options(**actors)
        .remote(vllm_tiny_dir, dtype="float32", max_model_len=256, weight_backend="llmrl_file")
    )
    updater = VLLMWeightUpdater([engine], backend="llmrl_file", folder=str(tmp_path))
    try:
        before = torch.tensor(ray.get(engine.prompt_log_probs.remote([PROBE]))[0])
        assert_close_rows([hf_log_probs(tiny_hf, PROBE)], [before])
        for version, seed in ((1, 11), (2, 12)):
            trainer = perturbed(tiny_hf, 0.05, seed=seed)
            stats = updater.push(trainer.state_dict(), version=version)
            assert stats.engine_checksums == (stats.checksum,), "verified = sent"
            assert ray.get(engine.weight_version.remote()) == str(version)
            after = torch.tensor(ray.get(engine.prompt_log_probs.remote([PROBE]))[0])
            assert_close_rows([hf_log_probs(trainer, PROBE)], [after])
            assert (after - before).abs().max() > 1e-2, "the push moved the engine"
            before = after
        tied = sum(p.numel() for p in tiny_hf.parameters()) * 4
        assert stats.bytes == tied, "the tied output head is sent once"
    finally:
        ray.kill(engine)
