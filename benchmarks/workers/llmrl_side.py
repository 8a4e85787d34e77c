"""Benchmark worker in the project's venv: llmrl itself, and raw Hugging Face as the floor.

Kinds (``options["kind"]``):

* ``rollout``: llmrl ``TransformersWrapper`` sampling ``samples`` responses per chat, with
  sampling log-probs (what a rollout needs); ``compile_decode`` picks the compiled static-KV
  decode. Setup makes one untimed call and reports its time as ``first_call_seconds``.
* ``raw_hf``: ``model.generate`` on the same chats, pre-tokenized and left-padded, ids only.
* ``grpo_step``: ``steps_per_rep`` GRPO iterations (default 1) of :class:`inprocess.InProcessGRPO`
  (collect, rewards, advantages, loss, backward, optimizer, weight sync).
* ``overhead``: one such step, then the pure model compute of the same step on the same tokens
  (HF ``generate`` of the same prompts with the same seed + one forward/backward).
* ``learning``: in-process GRPO steps for a wall-time budget, saving the model at fractions of it.
* ``skewed_training``: the training phase of one GRPO step (loss forward, backward, AdamW) on
  the skewed-lengths batch of ``benchmarks/skewed.py``, packed or padded (``packing``).
* ``grpo_runtime``: ``steps_per_rep`` steps of :class:`llmrl.runtime.GRPORuntime` (the stage's
  own path: engine, env workers and trainer rank as Ray actors), ``mode`` sync or async (with
  ``partial_rollouts`` or not), on a local Ray started for each request.

``grpo_step``, ``overhead`` and ``learning`` time the per-rank algorithm
(:class:`~llmrl.train.grpo_trainer.GRPOTrainer`) with an in-process sampler sharing the trained
model: what the algorithm costs, without placement, transport or a second model copy. The
runtime's own cost (Ray actors, moving batches and weights between processes, async overlap) is
measured by ``runtime.py`` with the ``grpo_runtime`` kind, against the in-process step.
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any

import torch
from harness import serve
from tensordict import TensorDict
from workload import rollout_runner


def setup(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    torch.manual_seed(0)
    kind = options["kind"]
    info = {"torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    if kind in ("rollout", "raw_hf"):
        return info, _generation(options, info)
    if kind == "learning":
        return info, _learning(options)
    if kind == "grpo_runtime":
        return _grpo_runtime(options, info)
    if kind == "skewed_training":
        return info, _skewed_training(options, info)
    return info, _grpo(options, with_pure_compute=kind == "overhead")


def _generation(options: dict[str, Any], info: dict[str, Any]):
    from llmrl.data import ChatHistory, History, pad_sequences
    from llmrl.models import load_model, load_tokenizer
    from llmrl.policies import TransformersWrapper

    torch.set_grad_enabled(False)
    tokenizer = load_tokenizer(options["model"])
    model = load_model(options["model"])
    batch, samples, new_tokens = options["batch"], options["samples"], options["new_tokens"]
    history = History.from_chats(options["chats"])
    if options["kind"] == "rollout":
        td = TensorDict({"history": ChatHistory(prompt=history, batch_size=[batch])}, [batch])
        policy = TransformersWrapper(
            model,
            tokenizer,
            num_samples=samples,
            generate_kwargs={"max_new_tokens": new_tokens},
            compile_decode=options.get("compile_decode", False),
        )
        run = rollout_runner(policy, td, new_tokens)

        # the first call pays one-off costs (with compile_decode: compiling the decode step)
        started = time.perf_counter()
        run(seed=99_999)
        info["first_call_seconds"] = time.perf_counter() - started
        return run

    prompt_ids = history.apply_chat_template(tokenizer, add_generation_prompt=True).as_list(
        "input_ids"
    )
    input_ids, mask = pad_sequences(prompt_ids, "left", tokenizer.pad_token_id)

    def run(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=mask.long(),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            num_return_sequences=samples,
            pad_token_id=tokenizer.pad_token_id,
        )
        return {"tokens": _response_tokens(sequences[:, input_ids.shape[1] :], tokenizer)}

    return run


def _response_tokens(generated: torch.Tensor, tokenizer: Any) -> int:
    """Tokens up to and including each row's first EOS (what a rollout keeps)."""
    ended = (generated == tokenizer.eos_token_id).int()
    first_eos = torch.where(ended.any(1), ended.argmax(1) + 1, generated.shape[1])
    return int(first_eos.sum())


def _config(options: dict[str, Any], **fields: Any) -> Any:
    """The GRPO config of the workload (``max_train_rows``: all rows when absent); ``fields``
    override top-level settings (``mode``, ``runtime``, ``topology``)."""
    from llmrl.config.grpo import GRPOConfig

    scratch = tempfile.mkdtemp(prefix="llmrl-bench-")
    return GRPOConfig.model_validate(
        {
            "model": {"name": options["model"], "packing": options.get("packing", True)},
            "data": {"path": options["data"], "max_train_rows": options.get("max_train_rows")},
            "steps": 1000,  # the schedule's length; the benchmark runs a few
            "prompts_per_step": options["prompts"],
            "num_samples": options["samples"],
            "generation": {"max_new_tokens": options["new_tokens"], "temperature": 1.0},
            "optimizer": {"lr": options["lr"], "schedule": "constant"},
            "micro_batch_size": options.get("micro_batch_size"),
            "max_tokens_per_micro_batch": options.get("max_tokens_per_micro_batch"),
            "checkpoint": {"dir": f"{scratch}/checkpoints", "resume": "never"},
            "tracking": {"enabled": False},
            "output_dir": scratch,
            "progress": False,
            **fields,
        }
    )


def _grpo(options: dict[str, Any], with_pure_compute: bool):
    """``steps_per_rep`` in-process GRPO steps per request (one for ``overhead``)."""
    from inprocess import InProcessGRPO

    grpo = InProcessGRPO(_config({**options, "max_train_rows": options["prompts"]}))
    model_time = ModelTime(grpo.model) if with_pure_compute else None
    steps = 1 if with_pure_compute else options.get("steps_per_rep", 1)
    counter = iter(range(1, 1_000_000))

    def run(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        if model_time is not None:
            model_time.reset()
        all_metrics, walls = [], []
        for _ in range(steps):
            tick = time.perf_counter()
            batch, metrics = grpo.step(next(counter))
            all_metrics.append(metrics)
            walls.append(time.perf_counter() - tick)
        result = _step_result(all_metrics, walls)
        if model_time is not None:
            result["model"] = dict(model_time.seconds)
            result["pure"] = _pure_compute(grpo, batch, seed)
        return result

    return run


def _skewed_training(options: dict[str, Any], info: dict[str, Any]):
    """One training phase per request on the skewed batch (built once, untimed): the
    trainer's phases, and the positions its scoring forward computes (``padding_share``)."""
    from skewed import computed_positions, skewed_batch

    from llmrl.models import load_tokenizer
    from llmrl.train.grpo_trainer import GRPOTrainer
    from llmrl.train.trainable_model import load_trainable_model

    config = _config({**options, "max_train_rows": options["prompts"]}, audit={"enabled": False})
    model = load_trainable_model(config.model, config.lora)
    tokenizer = load_tokenizer(config.model.spec)
    chats = options["chats"][: options["prompts"]]
    batch = skewed_batch(model, tokenizer, chats, options["samples"], options["new_tokens"], 0)
    trainer = GRPOTrainer(config, model, tokenizer, total_steps=1000)
    positions = computed_positions(batch, config.model.packing, share_prompts=True)
    info["padding_share"] = 1 - positions["tokens"] / positions["computed"]
    info["computed_positions"] = positions["computed"]

    def run(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        metrics = trainer.train(batch, minibatches=1)
        phases = {
            "loss forward": metrics["loss_forward_seconds"],
            "backward": metrics["backward_seconds"],
            "optimizer": metrics["optimizer_seconds"],
        }
        return {"phases": phases, "training": sum(phases.values()), "loss": metrics["loss"]}

    return run


def _grpo_runtime(options: dict[str, Any], info: dict[str, Any]):
    """Per request: a local Ray and a :class:`~llmrl.runtime.GRPORuntime` started (untimed:
    ``startup_seconds``), ``steps_per_rep`` steps (``mode``: sync or async; every engine and rank
    actor with ``threads`` torch threads), then the runtime and Ray stopped.

    Nothing of the runtime outlives its request: its rollouts collect ahead in a background
    thread, which would run while the other contenders are timed, and two idle clusters beside
    the in-process model do not fit in memory next to other work. The first step of a request
    is its warm-up (left out of the steady state by :func:`_step_result`). The seed is not used
    (the engines sample with their own generators).
    """
    from llmrl.runtime import GRPORuntime, describe, resolve_topology
    from llmrl.runtime.ray_cluster import actor_runtime_env, ray_session
    from llmrl.topology import Topology

    config = _config(
        {**options, "max_train_rows": options.get("max_train_rows", options["prompts"])},
        mode=options["mode"],
        max_staleness=options.get("max_staleness", 1),
        topology=Topology.local_default(),
        runtime={
            "torch_threads": options["threads"],
            "partial_rollouts": options.get("partial_rollouts", False),
        },
    )
    topology = resolve_topology(config)
    steps = options.get("steps_per_rep", 1)
    info.update(topology=describe(topology), mode=config.mode, engine_threads=options["threads"])

    def run(seed: int) -> dict[str, Any]:
        started = time.perf_counter()
        with ray_session(None):
            runtime = GRPORuntime(config=config, topology=topology, runtime_env=actor_runtime_env())
            try:
                startup = time.perf_counter() - started
                all_metrics, walls = [], []
                for number in range(1, steps + 1):
                    tick = time.perf_counter()
                    all_metrics.append(runtime.step(number)[1])
                    walls.append(time.perf_counter() - tick)
            finally:
                runtime.shutdown()
        result = _step_result(all_metrics, walls)
        result["startup_seconds"] = startup
        return result

    return info, run


def _step_result(all_metrics: list[dict[str, Any]], walls: list[float]) -> dict[str, Any]:
    """One request's steps. With more than one step the first is the request's warm-up, and
    the figures are means over the others (the steady state): ``step_seconds`` (wall),
    tokens, reward, ``training`` (all of ``training_seconds``: advantage, batch transport, the
    rank's phases) and the phases (``other``: the rest of the wall time)."""
    steady = slice(1, None) if len(walls) > 1 else slice(None)
    chosen, walls = all_metrics[steady], walls[steady]

    def mean(key: str) -> float:
        return sum(m.get(key, 0.0) for m in chosen) / len(chosen)

    step_seconds = sum(walls) / len(walls)
    phases = {
        "generation": mean("generation_seconds"),
        "loss forward": mean("loss_forward_seconds"),
        "backward": mean("backward_seconds"),
        "optimizer": mean("optimizer_seconds"),
        "weight sync": mean("weight_sync_seconds"),
    }
    phases["other"] = step_seconds - sum(phases.values())
    resumed = all_metrics[-1].get("collector/resumed_rows", 0.0)
    return {
        # the trainer waits for a batch, and for the push to reach the engines between batches
        "idle_seconds": phases["generation"] + phases["weight sync"],
        "resumed_rows": resumed / len(all_metrics),
        "steps": len(all_metrics),
        "step_seconds": step_seconds,
        "tokens": mean("response_tokens"),
        "reward_mean": mean("reward_mean"),
        "staleness": mean("staleness"),
        "training": mean("training_seconds"),
        "phases": phases,
    }


class ModelTime:
    """Seconds spent inside the model during a step: ``generate`` calls, forward calls made
    outside ``generate`` (prompt-cache prefill, the loss's scoring pass)."""

    def __init__(self, model: Any) -> None:
        self.seconds: dict[str, float] = {}
        self._inside_generate = False
        self._forward_started = 0.0
        generate = model.generate

        def timed_generate(*args: Any, **kwargs: Any) -> Any:
            started, self._inside_generate = time.perf_counter(), True
            try:
                return generate(*args, **kwargs)
            finally:
                self._inside_generate = False
                self._add("generate", time.perf_counter() - started)

        model.generate = timed_generate
        model.register_forward_pre_hook(self._before_forward)
        model.register_forward_hook(self._after_forward)

    def reset(self) -> None:
        self.seconds = {"generate": 0.0, "forward": 0.0}

    def _before_forward(self, *_: Any) -> None:
        self._forward_started = time.perf_counter()

    def _after_forward(self, *_: Any) -> None:
        if not self._inside_generate:
            self._add("forward", time.perf_counter() - self._forward_started)

    def _add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def _learning(options: dict[str, Any]):
    """In-process GRPO steps until ``budget_seconds`` have passed since the first, saving the
    model when each fraction in ``marks`` of the budget is reached; ``curve`` holds each step's
    end time and batch reward."""
    from pathlib import Path

    from inprocess import InProcessGRPO

    grpo = InProcessGRPO(_config(options))
    budget, marks = options["budget_seconds"], sorted(options["marks"])

    def run(seed: int) -> dict[str, Any]:
        saved: dict[str, Any] = {}
        curve: list[tuple[float, int, float]] = []  # (seconds, step, batch reward mean)
        started, step, elapsed = time.perf_counter(), 0, 0.0
        while elapsed < budget:
            step += 1
            _, metrics = grpo.step(step)
            elapsed = time.perf_counter() - started
            curve.append((elapsed, step, float(metrics["reward_mean"])))
            for mark in marks:
                key = f"{mark:g}"
                if key not in saved and elapsed >= mark * budget:
                    folder = Path(options["out_dir"]) / f"llmrl-at-{key}"
                    grpo.model.save_pretrained(folder)
                    grpo.tokenizer.save_pretrained(folder)
                    saved[key] = {"path": str(folder), "step": step, "seconds": elapsed}
        return {"saved": saved, "curve": curve}

    return run


def _pure_compute(grpo: Any, batch: Any, seed: int) -> dict[str, float]:
    """HF generate of the batch's prompts (same seed, same order) and one forward/backward of
    the prompt + response tokens the step trained on (output layer over the response columns,
    ``logits_to_keep``); plain transformers calls, no llmrl code on the timed path."""
    from llmrl.data import pad_sequences

    model, tokenizer = grpo.model, grpo.tokenizer
    generation = grpo.config.generation
    prompts = [torch.as_tensor(p) for p in batch["tokens"].as_list("prompt")]
    responses = [torch.as_tensor(r) for r in batch["tokens"].as_list("response")]
    input_ids, mask = pad_sequences(prompts, "left", tokenizer.pad_token_id)
    started = time.perf_counter()
    with torch.no_grad():
        torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=mask.long(),
            do_sample=True,
            temperature=generation.temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=generation.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    generate_seconds = time.perf_counter() - started
    generated = _response_tokens(sequences[:, input_ids.shape[1] :], tokenizer)

    prompt_ids, prompt_mask = pad_sequences(prompts, "left", tokenizer.pad_token_id)
    response_ids, response_mask = pad_sequences(responses, "right", tokenizer.pad_token_id)
    ids = torch.cat([prompt_ids, response_ids], 1)
    mask = torch.cat([prompt_mask, response_mask], 1).long()
    width = response_ids.shape[1]
    started = time.perf_counter()
    logits = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        logits_to_keep=width + 1,
    ).logits[:, :-1]
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, response_ids[..., None])
    loss = -(log_probs.squeeze(-1) * response_mask).sum() / response_mask.sum()
    loss.backward()
    forward_backward_seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return {
        "generate": generate_seconds,
        "forward_backward": forward_backward_seconds,
        "generated_tokens": generated,
    }


if __name__ == "__main__":
    sys.exit(serve(setup))
