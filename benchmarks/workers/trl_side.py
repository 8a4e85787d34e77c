"""Benchmark worker in the peers' venv: TRL's ``GRPOTrainer``.

Kind ``grpo_step`` (default): one optimizer step per request. ``trainer.train()`` runs in a
background thread; a callback holds it at the start of every step until the driver asks for
one and reports when the step ends, so each request times exactly one GRPO iteration (generate
G completions per prompt, rewards, advantages, loss, backward, optimizer step). Where the time
goes is measured by timing ``model.generate``, TRL's per-token
log-prob forward, ``accelerator.backward`` and the optimizer step.

The reward is llmrl's own scorer for the task (``llmrl/envs/tasks`` is plain Python; it is
imported here without the rest of llmrl, whose tensordict pin differs from TorchRL's).

Kind ``learning``: train for a wall-time budget, saving the model at fractions of it.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any

import torch
from harness import serve

REPO = Path(__file__).resolve().parents[2]


def task_scorer(task: str, options: dict[str, Any]) -> Any:
    """llmrl's task object (its ``score``), loaded from ``llmrl/envs/tasks`` alone."""
    for name in ("llmrl", "llmrl.envs", "llmrl.envs.tasks"):
        package = types.ModuleType(name)
        package.__path__ = [str(REPO / name.replace(".", "/"))]
        sys.modules.setdefault(name, package)
    module = importlib.import_module(f"llmrl.envs.tasks.{task}")
    classes = [v for v in vars(module).values() if isinstance(v, type) and getattr(v, "name", "")]
    task_class = next(c for c in classes if c.name == task and c.__module__ == module.__name__)
    return task_class(**options)


class _Timers:
    """Seconds per phase of the current step."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    def wrap(self, phase: str, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - started

        return timed


def build_trainer(
    options: dict[str, Any], callbacks: list, rewards: list[float] | None = None
) -> Any:
    """TRL's ``GRPOTrainer`` over the workload's chats, rewarded by llmrl's task scorer; each
    reward call's mean is appended to ``rewards`` when given."""
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(options["model"])
    model = AutoModelForCausalLM.from_pretrained(options["model"], dtype=torch.float32)
    scorer = task_scorer(options["task"], options["task_options"])

    def reward(completions: list, answer: list, **_: Any) -> list[float]:
        values = [
            scorer.score(c[0]["content"], a).reward
            for c, a in zip(completions, answer, strict=True)
        ]
        if rewards is not None:
            rewards.append(sum(values) / len(values))
        return values

    rows = [
        {"prompt": c, "answer": a}
        for c, a in zip(options["chats"], options["answers"], strict=True)
    ]
    args = grpo_config(options, gradient_checkpointing=options["gradient_checkpointing"])
    return trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def grpo_config(options: dict[str, Any], **overrides: Any) -> Any:
    """TRL's ``GRPOConfig`` of the workload (``prompts`` x ``samples`` completions per optimizer
    step, ``new_tokens``, ``lr``; temperature 1, no top-p, beta 0, constant lr, grad clip 1, no
    saving or logging), on CPU in float32 unless ``overrides`` say otherwise."""
    import trl

    settings = {
        "output_dir": tempfile.mkdtemp(prefix="trl-bench-"),
        "use_cpu": True,
        "bf16": False,
        "per_device_train_batch_size": options["prompts"] * options["samples"],
        "gradient_accumulation_steps": 1,
        "num_generations": options["samples"],
        "max_completion_length": options["new_tokens"],
        "temperature": 1.0,
        "top_p": 1.0,
        "beta": 0.0,
        "learning_rate": options["lr"],
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "max_grad_norm": 1.0,
        "max_steps": 100_000,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 100_000,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 0,
    }
    return trl.GRPOConfig(**{**settings, **overrides})


def setup(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    import transformers
    import trl

    info = {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gradient_checkpointing": options["gradient_checkpointing"],
    }
    if options.get("kind") == "learning":
        return info, _learning(options)
    return info, _stepping(options)


def _stepping(options: dict[str, Any]) -> Any:
    """One optimizer step per request, timed by phase."""
    from transformers import TrainerCallback

    timers = _Timers()
    requested, finished = threading.Semaphore(0), threading.Semaphore(0)
    state: dict[str, Any] = {}

    class StepGate(TrainerCallback):
        """Holds the loop until a step is requested; seeds and times it."""

        def on_step_begin(self, args, train_state, control, **kwargs):
            requested.acquire()
            timers.phases.clear()
            torch.manual_seed(state["seed"])
            state["started"] = time.perf_counter()

        def on_pre_optimizer_step(self, args, train_state, control, **kwargs):
            state["optimizer_started"] = time.perf_counter()

        def on_optimizer_step(self, args, train_state, control, **kwargs):
            timers.phases["optimizer"] = time.perf_counter() - state["optimizer_started"]

        def on_step_end(self, args, train_state, control, **kwargs):
            state["seconds"] = time.perf_counter() - state["started"]
            finished.release()

    trainer = build_trainer(options, [StepGate()])
    model = trainer.model
    model.generate = timers.wrap("generation", model.generate)
    trainer._get_per_token_logps_and_entropies = timers.wrap(
        "loss forward", trainer._get_per_token_logps_and_entropies
    )
    trainer.accelerator.backward = timers.wrap("backward", trainer.accelerator.backward)
    threading.Thread(target=_train, args=(trainer, state), daemon=True).start()

    def run(seed: int) -> dict[str, Any]:
        state["seed"] = seed
        requested.release()
        while not finished.acquire(timeout=1.0):
            if "error" in state:
                raise RuntimeError(state["error"])
        phases = dict(timers.phases)
        phases["other"] = state["seconds"] - sum(phases.values())
        return {"phases": phases, "step_seconds": state["seconds"]}

    return run


def _learning(options: dict[str, Any]) -> Any:
    """Train for ``budget_seconds`` of wall time (from the first step), saving the model when
    each fraction in ``marks`` of the budget has passed; ``curve`` holds each step's end time
    and batch reward."""
    from transformers import TrainerCallback

    budget, marks = options["budget_seconds"], sorted(options["marks"])
    saved: dict[str, Any] = {}
    rewards: list[float] = []
    curve: list[tuple[float, int, float]] = []

    class Budget(TrainerCallback):
        def on_train_begin(self, args, train_state, control, **kwargs):
            saved["started"] = time.perf_counter()

        def on_step_end(self, args, train_state, control, model=None, **kwargs):
            elapsed = time.perf_counter() - saved["started"]
            curve.append((elapsed, train_state.global_step, rewards[-1]))
            for mark in marks:
                key = f"{mark:g}"
                if key not in saved and elapsed >= mark * budget:
                    folder = Path(options["out_dir"]) / f"trl-at-{key}"
                    model.save_pretrained(folder)
                    trainer.processing_class.save_pretrained(folder)
                    saved[key] = {
                        "path": str(folder),
                        "step": train_state.global_step,
                        "seconds": elapsed,
                    }
            control.should_training_stop = elapsed >= budget

    trainer = build_trainer(options, [Budget()], rewards)

    def run(seed: int) -> dict[str, Any]:
        trainer.train()
        return {"saved": {k: v for k, v in saved.items() if k != "started"}, "curve": curve}

    return run


def _train(trainer: Any, state: dict[str, Any]) -> None:
    try:
        trainer.train()
    except Exception as error:  # surfaced to the driver by run()
        state["error"] = repr(error)


if __name__ == "__main__":
    serve(setup)
    os._exit(0)  # the training thread is parked in a callback; do not wait for it
