"""The workload every contender runs: one exported model, the same prompts, the same lengths.

Runs in the project's venv (the drivers). The default model is exported once to
``benchmarks/.work/model`` as a plain Hugging Face folder (weights + tokenizer) that llmrl,
raw transformers, TRL and TorchRL all load with ``from_pretrained``; the GRPO workload is the
arithmetic task prepared by ``llmrl prepare`` under ``benchmarks/.work/data``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import WORK_DIR

PREPARE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "prepare.yaml"

# Rollout prompts: varied lengths, single-turn chats.
QUESTIONS = [
    "What is 17 + 25?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "Explain what a prime number is.",
    "How many legs does a spider have?",
    "What is the capital of Japan?",
    "Give me a synonym for 'happy'.",
    "Why is the sky blue?",
]


def rollout_chats(batch: int) -> list[list[dict[str, str]]]:
    """``batch`` single-turn chats, cycling through :data:`QUESTIONS`."""
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(batch)]


def rollout_runner(policy: Any, td: Any, new_tokens: int) -> Callable[[int], dict[str, Any]]:
    """``run(seed)``: one rollout call of ``policy`` on the batch ``td`` (``new_tokens`` at most,
    seeded), timed once untimed first by the caller; returns the response tokens drawn. Both
    llmrl engines (``llmrl_side.py``, ``vllm_side.py``) are measured through it."""

    def run(seed: int) -> dict[str, Any]:
        kwargs = {"max_new_tokens": new_tokens, "seed": seed}
        out = policy.get_new_version(generate_kwargs=kwargs)(td)
        return {"tokens": sum(len(r) for r in out.reshape(-1)["tokens"].as_list("response"))}

    return run


def exported_model(spec: str) -> Path:
    """``spec`` loaded by llmrl and saved as a Hugging Face folder all contenders can read."""
    from llmrl.models import load_model, load_tokenizer

    folder = WORK_DIR / "model" / spec.replace("/", "--")
    if (folder / "config.json").is_file():
        return folder
    staging = folder.with_name(folder.name + ".tmp")
    load_model(spec).save_pretrained(staging)
    load_tokenizer(spec).save_pretrained(staging)
    staging.rename(folder)
    return folder


def arithmetic_data(rows: int | None) -> tuple[Path, dict]:
    """The prepared arithmetic dataset (generated once) and the GRPO workload over its first
    ``rows`` training problems (all when None): their chats (system = the task's
    instructions), answers, and the task's constructor options (so TRL's reward function is
    llmrl's scorer)."""
    from llmrl.config.prepare import PrepareConfig
    from llmrl.core.config_loading import load_config
    from llmrl.data.prepare import load_prepared, prepare_dataset
    from llmrl.envs.tasks.prepared import prepared_task

    # the pipeline's task mix (configs/prepare.yaml), so benchmarks train what `make run` trains
    config = load_config(PrepareConfig, PREPARE_CONFIG, [f"output_dir={WORK_DIR / 'data'}"])
    prepared = prepare_dataset(config, progress=False)
    folder = prepared.path  # reused when already prepared
    task, manifest = prepared_task(folder)
    train, _ = load_prepared(folder)
    problems = train[:rows]
    workload = {
        "task": manifest["task"],
        "task_options": (manifest.get("generated") or {}).get("options", {}),
        "chats": [
            [
                {"role": "system", "content": task.instructions},
                {"role": "user", "content": problem.prompt},
            ]
            for problem in problems
        ],
        "answers": [problem.answer for problem in problems],
    }
    return folder, workload


def grpo_arguments(parser: argparse.ArgumentParser, prompts: int, new_tokens: int) -> None:
    """The GRPO workload's command-line knobs (model, prompts, group size, lengths, lr)."""
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="group size G")
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--lr", type=float, default=1e-6)


def grpo_options(args: argparse.Namespace, rows: int | None) -> dict:
    """Worker options of the GRPO workload over the first ``rows`` train problems (all when
    None): the exported model, the prepared data, the settings and the TRL-side chats."""
    data, workload = arithmetic_data(rows)
    return {
        "model": str(exported_model(args.model)),
        "data": str(data),
        "prompts": args.prompts,
        "samples": args.samples,
        "new_tokens": args.new_tokens,
        "lr": args.lr,
        **workload,
    }
