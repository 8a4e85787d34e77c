"""One trial of the learning search (``docs/learning.md``): GRPO from an SFT model, in one process.

The GRPO loop is the library's (:func:`llmrl.runtime.grpo_loop.train_grpo` over
:class:`~llmrl.runtime.grpo_loop.InProcessGRPO`: the stage's parts and step, without Ray). At
step 0 and at every step of ``--eval-at`` the live model answers the prepared eval split
greedily, as the evaluation stage does, and each mark's paired gain over step 0 (the SFT model)
is printed with its 95% interval, per kind too. GRPO seconds exclude the evaluations. Each
trial appends one JSON line to ``--out``. Two trials can share the 2 cores (``--threads 1``
each): a trial's accuracy at a given step does not depend on its speed, only its seconds do.

    python benchmarks/learning_search.py --sft runs/sft/checkpoint-30/model \
        --data data/prepared/arithmetic-21c3657f08aceb9d --steps 32 --eval-at 16,24,32 \
        --set optimizer.lr=1e-5 --name lr-1e-5
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from llmrl.config.grpo import GRPOConfig
from llmrl.core.config_loading import load_config
from llmrl.data.prepare import load_prepared
from llmrl.data.problem import Problem
from llmrl.envs.task_env import TaskEnv
from llmrl.envs.tasks import Task
from llmrl.envs.tasks.prepared import prepared_task
from llmrl.eval.kinds import accuracy_by_kind, problem_kind
from llmrl.eval.paired import paired_gain
from llmrl.policies import TransformersWrapper
from llmrl.runtime.grpo_loop import InProcessGRPO, train_grpo
from llmrl.stages.evaluate import answer_all

REPO = Path(__file__).resolve().parents[1]


def greedy_outcomes(
    grpo: InProcessGRPO, task: Task, problems: list[Problem], new_tokens: int
) -> dict[str, bool]:
    """Per eval problem id: whether the live model's greedy answer is right (batches of 100, as
    ``configs/eval.yaml``)."""
    env = TaskEnv(task, problems, 100, 1, shuffle=False, epochs=1)
    policy = TransformersWrapper(
        grpo.model,
        grpo.tokenizer,
        generate_kwargs={"max_new_tokens": new_tokens, "do_sample": False},
    )
    with torch.no_grad():
        answers = answer_all(env, policy, 1, False, "eval")
    return {pid: got[0][0] for pid, got in answers.items()}


def mark_of(
    name: str,
    step: int,
    seconds: float,
    rewards: list[float],
    start: dict[str, bool],
    now: dict[str, bool],
    kinds: dict[str, str],
) -> dict:
    """The trial's record at ``step`` (printed too): accuracy, paired gain over the start with
    its 95% interval, per kind, the mean batch reward of the last 8 steps."""
    gain = paired_gain(start, now, names=("sft", f"step {step}"))
    by_kind = accuracy_by_kind((kinds[pid], right) for pid, right in now.items())
    mark = {
        "step": step,
        "seconds": round(seconds, 1),
        "accuracy": gain.accuracy_after,
        "gain": gain.gain,
        "ci": [gain.ci_low, gain.ci_high],
        "by_kind": {k: round(v["accuracy"], 3) for k, v in by_kind.items()},
        "reward_mean_last8": sum(rewards[-8:]) / len(rewards[-8:]),
    }
    print(
        f"[{name}] step {step} ({seconds:.0f} s): accuracy "
        f"{gain.accuracy_after:.3f}, gain {gain.gain:+.3f} [{gain.ci_low:+.3f}, "
        f"{gain.ci_high:+.3f}], by kind {mark['by_kind']}, "
        f"reward {mark['reward_mean_last8']:.3f}",
        flush=True,
    )
    return mark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", required=True, help="the SFT model folder GRPO starts from")
    parser.add_argument("--data", required=True, help="the prepared dataset folder")
    parser.add_argument("--config", default=str(REPO / "configs" / "grpo.yaml"))
    parser.add_argument("--set", action="append", default=[], help="a config override")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--eval-at", default="8,16,24", help="steps to evaluate after")
    parser.add_argument("--eval-rows", type=int, default=400)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="trial")
    parser.add_argument(
        "--out", default=str(REPO / "benchmarks" / "results" / "learning-search.jsonl")
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    overrides = [f"model.name={args.sft}", f"data.path={args.data}", f"steps={args.steps}"]
    config = load_config(GRPOConfig, args.config, [*overrides, *args.set])
    grpo = InProcessGRPO(config)
    task, _ = prepared_task(config.data.path)
    problems = load_prepared(config.data.path)[1][: args.eval_rows]
    kinds = {p.id: problem_kind(task, p) for p in problems}
    new_tokens = config.generation.max_new_tokens
    marks = sorted(int(m) for m in args.eval_at.split(","))

    start = greedy_outcomes(grpo, task, problems, new_tokens)
    start_accuracy = sum(start.values()) / len(start)
    trial = {"name": args.name, "set": args.set, "steps": args.steps, "marks": []}
    trial["start_accuracy"] = start_accuracy
    start_kinds = accuracy_by_kind((kinds[pid], right) for pid, right in start.items())
    trial["start_by_kind"] = {k: round(v["accuracy"], 3) for k, v in start_kinds.items()}
    print(
        f"[{args.name}] step 0: accuracy {start_accuracy:.3f}, by kind {trial['start_by_kind']}",
        flush=True,
    )
    trained_seconds, rewards = 0.0, []

    def after_step(step: int, metrics: dict[str, float]) -> None:
        nonlocal trained_seconds
        trained_seconds += metrics["step_seconds"]
        rewards.append(float(metrics.get("reward_mean", float("nan"))))
        print(
            f"[{args.name}] step {step}: reward {rewards[-1]:.3f}, sampling "
            f"{metrics.get('generation_seconds', 0.0):.1f} s, training "
            f"{metrics.get('training_seconds', 0.0):.1f} s ({trained_seconds:.0f} s in all)",
            flush=True,
        )
        if step in marks:
            now = greedy_outcomes(grpo, task, problems, new_tokens)
            mark = mark_of(args.name, step, trained_seconds, rewards, start, now, kinds)
            trial["marks"].append(mark)

    train_grpo(grpo, args.steps, after_step)
    with open(args.out, "a") as out:
        out.write(json.dumps(trial) + "\n")


if __name__ == "__main__":
    main()
