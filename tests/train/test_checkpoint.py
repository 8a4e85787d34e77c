"""Checkpoints: atomic saves, retention, crash safety and recovery, side-effect-free readers,
exact resume, LoRA checkpoints."""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from llmrl.models import load_model, tiny_model
from llmrl.train import checkpoint_writer
from llmrl.train.checkpoint import (
    CheckpointPayload,
    CheckpointWriter,
    TrainState,
    best_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_train_state,
    resume_latest,
)


def _train_step(model, optimizer, scheduler=None, seed: int = 0) -> None:
    """One real optimisation step on random tokens (deterministic for ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=generator)
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if scheduler is not None:
        scheduler.step()
    model.eval()


def _logits(model) -> torch.Tensor:
    ids = torch.arange(10, 26).reshape(2, 8)
    with torch.no_grad():
        return model(input_ids=ids).logits


def _setup(tokenizer, seed: int = 1):
    model = tiny_model(tokenizer, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def _names(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def _writer(folder: Path, **retention) -> CheckpointWriter:
    """A recovered writer of ``folder``, as a folder's owner makes one."""
    writer = CheckpointWriter(folder, **retention)
    writer.recover()
    return writer


def _save(writer: CheckpointWriter, step: int, model, **fields) -> Path:
    return writer.save(CheckpointPayload(step=step, model=model, **fields))


def _snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """``folder`` and every path under it: its bytes (None: a directory) and mtime."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in [folder, *sorted(folder.rglob("*"))]
    }


def test_round_trip_restores_weights_optimizer_scheduler_rng_and_state(
    tmp_path, tokenizer, monkeypatch
):
    model, optimizer, scheduler = _setup(tokenizer)
    for seed in range(2):
        _train_step(model, optimizer, scheduler, seed=seed)
    # Python's and numpy's generators are process-global: a thread left by an earlier test (an
    # HTTP client's retry jitter) may draw from them at any moment, so their round trip is
    # checked on the states save captured and resume restored, not on later draws.
    captured, restored = {}, {}

    def spy(record: dict, key: str, function):
        def call(*args, **kwargs):
            result = function(*args, **kwargs)
            record[key] = result if result is not None else args[0]
            return result

        return call

    monkeypatch.setattr(random, "getstate", spy(captured, "python", random.getstate))
    monkeypatch.setattr(random, "setstate", spy(restored, "python", random.setstate))
    monkeypatch.setattr(np.random, "get_state", spy(captured, "numpy", np.random.get_state))
    monkeypatch.setattr(np.random, "set_state", spy(restored, "numpy", np.random.set_state))
    writer = _writer(tmp_path)
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    path = _save(
        writer, 7, model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
        extra={"samples_seen": 16, "primer": {"epoch": 1}}, metrics={"loss": 2.5},
    )  # fmt: skip
    assert path == tmp_path / "step-000007"
    assert _names(path) == [
        "COMPLETE", "model", "trainer_state.json", "training_state.pt"
    ]  # fmt: skip
    expected_torch = torch.rand(4)

    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    fresh, fresh_optimizer, fresh_scheduler = _setup(tokenizer, seed=2)
    state = resume_latest(tmp_path, fresh, fresh_optimizer, fresh_scheduler)

    assert state == TrainState(
        step=7, extra={"samples_seen": 16, "primer": {"epoch": 1}}, metrics={"loss": 2.5}
    )
    assert torch.equal(torch.rand(4), expected_torch)
    assert restored["python"] == captured["python"]
    np_saved, np_restored = captured["numpy"], restored["numpy"]
    assert np_restored["bit_generator"] == np_saved["bit_generator"]
    assert np.array_equal(np_restored["state"]["key"], np_saved["state"]["key"])
    assert np_restored["state"]["pos"] == np_saved["state"]["pos"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    for param, fresh_param in zip(model.parameters(), fresh.parameters(), strict=True):
        original, restored = optimizer.state[param], fresh_optimizer.state[fresh_param]
        assert torch.equal(original["exp_avg"], restored["exp_avg"])
        assert torch.equal(original["exp_avg_sq"], restored["exp_avg_sq"])
    assert fresh_scheduler.last_epoch == scheduler.last_epoch == 2
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()

    # Training continues identically from the restored state.
    _train_step(model, optimizer, scheduler, seed=3)
    _train_step(fresh, fresh_optimizer, fresh_scheduler, seed=3)
    assert torch.equal(_logits(model), _logits(fresh))


def test_model_dir_loads_with_load_model(tmp_path, tokenizer):
    model, optimizer, _ = _setup(tokenizer)
    _train_step(model, optimizer)
    path = _save(_writer(tmp_path), 3, model, tokenizer=tokenizer)
    reloaded = load_model(path / "model")
    assert torch.equal(_logits(reloaded), _logits(model))
    assert (path / "model" / "model.safetensors").is_file()
    assert (path / "model" / "tokenizer_config.json").is_file()


def test_load_without_rng_leaves_rng_alone(tmp_path, tokenizer):
    model = tiny_model(tokenizer, seed=1)
    path = _save(_writer(tmp_path), 1, model)
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    load_checkpoint(path, restore_rng=False)
    assert torch.equal(torch.rand(2), expected)


def test_retention_keeps_last_k_and_best(tmp_path, tokenizer):
    model = tiny_model(tokenizer, seed=1)
    writer = _writer(tmp_path, keep_last=2, best_metric="reward", best_mode="max")
    for step, reward in [(10, 0.1), (20, 0.9), (30, 0.2), (40, 0.3), (50, 0.1)]:
        _save(writer, step, model, metrics={"reward": reward})
    assert _names(tmp_path) == ["step-000020", "step-000040", "step-000050"]
    assert best_checkpoint(tmp_path, "reward") == tmp_path / "step-000020"
    assert best_checkpoint(tmp_path, "reward", "min") == tmp_path / "step-000050"  # newer tie
    assert best_checkpoint(tmp_path, "loss") is None
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000050"
    assert list_checkpoints(tmp_path) == [tmp_path / n for n in _names(tmp_path)]

    minimising = _writer(tmp_path / "min", keep_last=1, best_metric="loss", best_mode="min")
    for step, loss in [(1, 3.0), (2, 1.0), (3, 2.0)]:
        _save(minimising, step, model, metrics={"loss": loss})
    assert _names(tmp_path / "min") == ["step-000002", "step-000003"]


def test_missing_best_metric_is_refused_before_writing(tmp_path, tokenizer):
    writer = _writer(tmp_path, best_metric="reward")
    with pytest.raises(ValueError, match="'reward'"):
        _save(writer, 1, tiny_model(tokenizer, seed=1), metrics={"loss": 1.0})
    assert _names(tmp_path) == []


@pytest.mark.parametrize("where", ["model", "training_state"])
def test_crash_during_save_keeps_previous_checkpoint(tmp_path, tokenizer, monkeypatch, where):
    model, optimizer, _ = _setup(tokenizer)
    writer = _writer(tmp_path, keep_last=1)
    previous = _save(writer, 1, model, tokenizer=tokenizer, optimizer=optimizer, extra={"n": 1})
    before = {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()}

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    if where == "model":
        monkeypatch.setattr(type(model), "save_pretrained", crash)
    else:
        monkeypatch.setattr(CheckpointWriter, "_write_training_state", crash)
    _train_step(model, optimizer)
    with pytest.raises(RuntimeError, match="disk full"):
        _save(writer, 2, model, tokenizer=tokenizer, optimizer=optimizer, extra={"n": 2})

    assert _names(tmp_path) == ["step-000001"]
    assert latest_checkpoint(tmp_path) == previous
    after = {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    assert after == before
    assert load_checkpoint(previous).extra == {"n": 1}


def test_latest_ignores_tmp_and_incomplete_dirs(tmp_path, tokenizer):
    good = _save(_writer(tmp_path), 1, tiny_model(tokenizer, seed=1), metrics={"loss": 1.0})
    (tmp_path / ".step-000009.tmp-abcd").mkdir()
    (tmp_path / ".step-000009.tmp-abcd" / "COMPLETE").write_text("")
    incomplete = tmp_path / "step-000005"
    incomplete.mkdir()
    (incomplete / "trainer_state.json").write_text('{"step": 5}')
    assert latest_checkpoint(tmp_path) == good
    assert list_checkpoints(tmp_path) == [good]
    with pytest.raises(ValueError, match=r"incomplete checkpoint .*step-000005.*did not finish"):
        load_checkpoint(incomplete)
    with pytest.raises(FileNotFoundError, match="step-000077"):
        load_checkpoint(tmp_path / "step-000077")


def test_recover_removes_stale_tmp_dirs(tmp_path, caplog):
    stale = tmp_path / ".step-000004.tmp-dead"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    os.utime(stale, (an_hour_ago, an_hour_ago))
    in_flight = tmp_path / ".step-000008.tmp-live"  # newer than this process: not ours to touch
    in_flight.mkdir()
    writer = CheckpointWriter(tmp_path)
    assert stale.exists()  # making a writer touches nothing
    with caplog.at_level(logging.WARNING, logger=checkpoint_writer.__name__):
        writer.recover()
    assert not stale.exists()
    assert in_flight.exists()
    assert ".step-000004.tmp-dead" in caplog.text


def test_crash_between_replace_renames_is_recovered(tmp_path, tokenizer):
    path = _save(_writer(tmp_path), 3, tiny_model(tokenizer, seed=1), extra={"v": 1})
    aside = tmp_path / ".step-000003.old-1234"
    os.rename(path, aside)  # as if the process died after moving the old one aside
    assert latest_checkpoint(tmp_path) == aside  # readers find it where it lies
    _writer(tmp_path)
    assert _names(tmp_path) == ["step-000003"]
    assert load_checkpoint(path).extra == {"v": 1}


def test_recover_drops_replaced_copies_it_cannot_restore(tmp_path, tokenizer):
    writer = _writer(tmp_path)
    _save(writer, 3, tiny_model(tokenizer, seed=1), extra={"v": 1})
    path = _save(writer, 4, tiny_model(tokenizer, seed=1), extra={"v": 2})
    shutil.copytree(path, tmp_path / ".step-000004.old-1234")  # died before deleting it
    shutil.copytree(path, tmp_path / ".step-000005.old-5678")
    os.remove(tmp_path / ".step-000005.old-5678" / "COMPLETE")  # never resumed from
    assert list_checkpoints(tmp_path) == [tmp_path / "step-000003", path]
    writer.recover()
    assert _names(tmp_path) == ["step-000003", "step-000004"]
    assert read_train_state(tmp_path / "step-000003").extra == {"v": 1}


def test_saving_an_existing_step_replaces_it(tmp_path, tokenizer):
    writer = _writer(tmp_path)
    first, second = tiny_model(tokenizer, seed=1), tiny_model(tokenizer, seed=2)
    _save(writer, 4, first, extra={"v": 1})
    path = _save(writer, 4, second, extra={"v": 2})
    assert _names(tmp_path) == ["step-000004"]
    restored = tiny_model(tokenizer, seed=3)
    assert load_checkpoint(path, restored).extra == {"v": 2}
    assert torch.equal(_logits(restored), _logits(second))


def test_lora_checkpoint_holds_merged_model_and_adapter(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    def lora(seed: int):
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        return get_peft_model(tiny_model(tokenizer, seed=seed), config)

    peft_model = lora(seed=1)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    _train_step(peft_model, optimizer)
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b)

    path = _save(_writer(tmp_path), 1, peft_model, tokenizer=tokenizer, optimizer=optimizer)
    assert (path / "adapter" / "adapter_model.safetensors").is_file()
    # Training continues on the adapter: the live model was not merged.
    assert any("lora_B" in n for n, _ in peft_model.named_parameters())

    saved_keys = load_file(path / "model" / "model.safetensors").keys()
    assert not any("lora" in key or "base_model" in key for key in saved_keys)
    plain = load_model(path / "model")
    assert type(plain).__name__ == "LlamaForCausalLM"
    # (W + s B A) x against W x + s B (A x): fp32 sums of <= 128 terms (hidden 64, MLP 128)
    # regrouped, on logits ~1: summation_atol(1, 128) = 8e-6 (measured 4.2e-7 on EPYC
    # AVX-512, 2026-11-27); leaving the adapter out moves them by 0.13
    torch.testing.assert_close(_logits(plain), _logits(peft_model), atol=1e-5, rtol=0)

    restored = lora(seed=1)
    restored_optimizer = torch.optim.AdamW(
        [p for p in restored.parameters() if p.requires_grad], lr=1e-2
    )
    resume_latest(tmp_path, restored, restored_optimizer)
    assert torch.equal(_logits(restored), _logits(peft_model))


def _interrupted_folder(folder: Path, tokenizer) -> Path:
    """A folder as crashes leave it: a complete checkpoint moved aside by a replacement, a
    stale partial save, a half-deleted pruned checkpoint; returns the checkpoint kept whole."""
    writer = _writer(folder, best_metric="loss")
    kept = _save(writer, 1, tiny_model(tokenizer, seed=1), extra={"v": 1}, metrics={"loss": 2})
    moved = _save(writer, 2, tiny_model(tokenizer, seed=1), extra={"v": 2}, metrics={"loss": 1})
    os.rename(moved, folder / ".step-000002.old-abcd")
    partial = folder / ".step-000003.tmp-dead" / "model"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"partial")
    shutil.copytree(kept, folder / ".step-000000.tmp-delete-beef")
    an_hour_ago = time.time() - 3600
    for entry in folder.iterdir():
        os.utime(entry, (an_hour_ago, an_hour_ago))
    return kept


def test_readers_leave_an_interrupted_folder_byte_identical(tmp_path, tokenizer):
    kept = _interrupted_folder(tmp_path, tokenizer)
    moved = tmp_path / ".step-000002.old-abcd"
    before = _snapshot(tmp_path)

    assert list_checkpoints(tmp_path) == [kept, moved]
    assert latest_checkpoint(tmp_path) == moved
    assert best_checkpoint(tmp_path, "loss", "min") == moved
    assert read_train_state(moved) == TrainState(step=2, extra={"v": 2}, metrics={"loss": 1})
    model = tiny_model(tokenizer, seed=5)
    assert load_checkpoint(kept, model=model, restore_rng=False).step == 1
    assert resume_latest(tmp_path, model).extra == {"v": 2}
    CheckpointWriter(tmp_path, keep_last=1)  # making a writer touches nothing either

    assert _snapshot(tmp_path) == before


def test_readers_and_a_new_writer_do_not_create_a_missing_folder(tmp_path, tokenizer):
    missing = tmp_path / "runs" / "checkpoints"
    assert list_checkpoints(missing) == []
    assert latest_checkpoint(missing) is None
    assert best_checkpoint(missing, "loss") is None
    assert resume_latest(missing, tiny_model(tokenizer, seed=1)) is None
    writer = CheckpointWriter(missing)
    assert not (tmp_path / "runs").exists()

    with pytest.raises(RuntimeError, match=r"call recover\(\) first"):
        _save(writer, 1, tiny_model(tokenizer, seed=1))
    assert not (tmp_path / "runs").exists()
    writer.recover()
    assert _names(missing) == []
    assert _save(writer, 1, tiny_model(tokenizer, seed=1)) == missing / "step-000001"


def test_recover_leaves_the_folder_as_readers_saw_it(tmp_path, tokenizer):
    kept = _interrupted_folder(tmp_path, tokenizer)
    seen = [read_train_state(path) for path in list_checkpoints(tmp_path)]
    _writer(tmp_path)
    assert _names(tmp_path) == [kept.name, "step-000002"]
    assert [read_train_state(path) for path in list_checkpoints(tmp_path)] == seen


def test_payload_with_a_gathered_optimizer_state_round_trips(tmp_path, tokenizer):
    model, optimizer, _ = _setup(tokenizer)
    _train_step(model, optimizer)
    gathered = optimizer.state_dict()
    path = _save(_writer(tmp_path), 1, model, optimizer_state=gathered)
    fresh, fresh_optimizer, _ = _setup(tokenizer, seed=2)
    load_checkpoint(path, fresh, fresh_optimizer, restore_rng=False)
    for param, fresh_param in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(
            optimizer.state[param]["exp_avg"], fresh_optimizer.state[fresh_param]["exp_avg"]
        )


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"step": "3"}, TypeError, r"step must be an int, got str"),
        ({"step": True}, TypeError, r"step must be an int, got bool"),
        ({"step": -1}, ValueError, r"step must be non-negative, got -1"),
        ({"model": {"w": 1}}, TypeError, r"model must be a transformers or peft model.*dict"),
        ({"optimizer": {"state": {}}}, TypeError, r"optimizer must be a torch.optim.Optimizer, "
         r"got dict; pass a state dict already gathered as optimizer_state="),
        ({"optimizer_state": [1]}, TypeError, r"optimizer_state must be a dict, got list"),
        ({"scheduler": 0.1}, TypeError, r"scheduler must have state_dict\(\), got float"),
        ({"model_state": [1]}, TypeError, r"model_state must be a dict, got list"),
        ({"metrics": [("loss", 1.0)]}, TypeError, r"metrics must be a dict, got list"),
    ],
)  # fmt: skip
def test_payload_type_errors_name_the_field(tokenizer, fields, error, message):
    model = tiny_model(tokenizer, seed=1)
    with pytest.raises(error, match=message):
        CheckpointPayload(**{"step": 1, "model": model, **fields})


def test_payload_takes_one_optimizer_form(tokenizer):
    model, optimizer, _ = _setup(tokenizer)
    with pytest.raises(ValueError, match=r"optimizer or optimizer_state .*not both"):
        CheckpointPayload(
            step=1, model=model, optimizer=optimizer, optimizer_state=optimizer.state_dict()
        )


def test_non_json_extra_is_refused_before_writing(tmp_path, tokenizer):
    writer = _writer(tmp_path)
    with pytest.raises(TypeError, match=r"extra/metrics of step 1 must be JSON-serialisable"):
        _save(writer, 1, tiny_model(tokenizer, seed=1), extra={"path": Path("x")})
    assert _names(tmp_path) == []
