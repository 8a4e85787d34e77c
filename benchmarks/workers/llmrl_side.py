"""Benchmark worker in the project's venv: llmrl itself, and raw Hugging Face as the floor.

Kinds (``options["kind"]``):

* ``rollout``: llmrl ``TransformersWrapper`` sampling ``samples`` responses per chat, with
  sampling log-probs (what a rollout needs).
* ``raw_hf``: ``model.generate`` on the same chats, pre-tokenized and left-padded, ids only.
* ``grpo_step``: one :meth:`GRPOTrainer.step` (collect, rewards, advantages, loss, backward,
  optimizer, weight sync) -- the production GRPO iteration.
* ``overhead``: a GRPO step, then the pure model compute of the same step on the same tokens
  (HF ``generate`` of the same prompts with the same seed + one forward/backward).
* ``learning``: GRPO steps for a wall-time budget, saving the model at fractions of it.
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any

import torch
from harness import serve
from tensordict import TensorDict


def setup(options: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    torch.manual_seed(0)
    kind = options["kind"]
    info = {"torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    if kind in ("rollout", "raw_hf"):
        return info, _generation(options)
    if kind == "learning":
        return info, _learning(options)
    return info, _grpo(options, with_pure_compute=kind == "overhead")


def _generation(options: dict[str, Any]):
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
            model, tokenizer, num_samples=samples, generate_kwargs={"max_new_tokens": new_tokens}
        )

        def run(seed: int) -> dict[str, Any]:
            kwargs = {"max_new_tokens": new_tokens, "seed": seed}
            out = policy.get_new_version(generate_kwargs=kwargs)(td)
            return {"tokens": sum(len(r) for r in out.reshape(-1)["tokens"].as_list("response"))}

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


def _trainer(options: dict[str, Any]) -> Any:
    """llmrl's GRPO trainer for the workload (``max_train_rows``: all rows when absent)."""
    from llmrl.config.grpo import GRPOConfig
    from llmrl.train.grpo_trainer import GRPOTrainer

    scratch = tempfile.mkdtemp(prefix="llmrl-bench-")
    config = GRPOConfig.model_validate(
        {
            "model": {"name": options["model"]},
            "data": {"path": options["data"], "max_train_rows": options.get("max_train_rows")},
            "steps": 1000,  # the schedule's length; the benchmark runs a few
            "prompts_per_step": options["prompts"],
            "num_samples": options["samples"],
            "generation": {"max_new_tokens": options["new_tokens"], "temperature": 1.0},
            "optimizer": {"lr": options["lr"], "schedule": "constant"},
            "checkpoint": {"dir": f"{scratch}/checkpoints", "resume": "never"},
            "tracking": {"enabled": False},
            "output_dir": scratch,
            "progress": False,
        }
    )
    return GRPOTrainer(config)


def _grpo(options: dict[str, Any], with_pure_compute: bool):
    trainer = _trainer({**options, "max_train_rows": options["prompts"]})
    model_time = ModelTime(trainer.model) if with_pure_compute else None

    def run(seed: int) -> dict[str, Any]:
        torch.manual_seed(seed)
        if model_time is not None:
            model_time.reset()
        started = time.perf_counter()
        batch, metrics = trainer.step()
        step_seconds = time.perf_counter() - started
        result = {
            "tokens": metrics["response_tokens"],
            "reward_mean": metrics["reward_mean"],
            "phases": {
                "generation": metrics["generation_seconds"],
                "loss forward": metrics.get("loss_forward_seconds", 0.0),
                "backward": metrics.get("backward_seconds", 0.0),
                "optimizer": metrics.get("optimizer_seconds", 0.0),
                "weight sync": metrics["weight_sync_seconds"],
            },
        }
        result["phases"]["other"] = step_seconds - sum(result["phases"].values())
        if model_time is not None:
            result["step_seconds"] = step_seconds
            result["model"] = dict(model_time.seconds)
            result["pure"] = _pure_compute(trainer, batch, seed)
        return result

    return run


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
    """GRPO steps until ``budget_seconds`` have passed since the first, saving the model when
    each fraction in ``marks`` of the budget is reached."""
    from pathlib import Path

    trainer = _trainer(options)
    budget, marks = options["budget_seconds"], sorted(options["marks"])

    def run(seed: int) -> dict[str, Any]:
        saved: dict[str, Any] = {}
        started, step = time.perf_counter(), 0
        while time.perf_counter() - started < budget:
            trainer.step()
            step += 1
            elapsed = time.perf_counter() - started
            for mark in marks:
                key = f"{mark:g}"
                if key not in saved and elapsed >= mark * budget:
                    folder = Path(options["out_dir"]) / f"llmrl-at-{key}"
                    trainer.model.save_pretrained(folder)
                    trainer.tokenizer.save_pretrained(folder)
                    saved[key] = {"path": str(folder), "step": step, "seconds": elapsed}
        return {"saved": saved}

    return run


def _pure_compute(trainer: Any, batch: Any, seed: int) -> dict[str, float]:
    """HF generate of the batch's prompts (same seed, same order) and one forward/backward of
    the prompt + response tokens the step trained on (output layer over the response columns,
    ``logits_to_keep``); plain transformers calls, no llmrl code on the timed path."""
    from llmrl.data import pad_sequences

    model, tokenizer = trainer.model, trainer.tokenizer
    generation = trainer.config.generation
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
