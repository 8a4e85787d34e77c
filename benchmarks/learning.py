"""Learning per wall-clock second: llmrl vs TRL GRPO on the arithmetic task (long; not in CI).

Both start from the same SFT checkpoint (made by ``llmrl sft`` with ``configs/sft.yaml`` unless
``--sft`` names one), train on the same prepared arithmetic train split with the same GRPO
settings for the same wall-time budget, one after the other (never at the same time), and save
their model at 60% and 100% of the budget. llmrl's evaluator then scores every saved model and
the starting checkpoint on the same held-out problems (greedy). Target: llmrl at 60% of the
budget is at least as accurate as TRL at 100%.

    python benchmarks/learning.py --budget-minutes 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness import WORK_DIR, Contender, figure, measure, print_table, save_results, summarize
from peers import peers_python
from workload import grpo_arguments, grpo_options

MARKS = (0.6, 1.0)
REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grpo_arguments(parser, prompts=4, new_tokens=48)
    parser.add_argument("--sft", help="SFT model folder to start from (default: run llmrl sft)")
    parser.add_argument("--budget-minutes", type=float, default=20.0)
    parser.add_argument("--eval-rows", type=int, default=100)
    args = parser.parse_args()

    workload = grpo_options(args, rows=None)
    data = Path(workload["data"])
    start = Path(args.sft) if args.sft else sft_checkpoint(Path(workload["model"]), data)
    out_dir = WORK_DIR / "learning"
    options = {
        **workload,
        "kind": "learning",
        "model": str(start),
        "budget_seconds": args.budget_minutes * 60,
        "marks": list(MARKS),
        "out_dir": str(out_dir),
        "gradient_checkpointing": True,
    }
    saved, summaries = {}, {}
    for name, python, script in (
        ("llmrl", sys.executable, "llmrl_side.py"),
        ("TRL", peers_python(), "trl_side.py"),
    ):
        print(f"training {name} for {args.budget_minutes:g} minutes", flush=True)
        with Contender(name, python, script, options) as worker:
            result = worker.run(seed=0)
        saved[name] = result["saved"]
        summaries[name] = summarize(worker, [result])

    start_accuracy = accuracy(start, data, args.eval_rows)
    rows = [["SFT start", "0", "0", f"{start_accuracy:.3f}"]]
    for name, marks in saved.items():
        for key, where in marks.items():
            acc = accuracy(Path(where["path"]), data, args.eval_rows)
            where["accuracy"] = acc
            rows.append(
                [
                    f"{name} @ {key} budget",
                    str(where["step"]),
                    f"{where['seconds']:.0f}",
                    f"{acc:.3f}",
                ]
            )
    print(
        f"\nlearning: arithmetic, {args.prompts} prompts x G={args.samples}, "
        f"<= {args.new_tokens} tokens, lr {args.lr}, budget {args.budget_minutes:g} min, "
        f"held-out accuracy on {args.eval_rows} problems (greedy)"
    )
    print_table(rows, ["model", "steps", "seconds", "accuracy"])
    llmrl_early, trl_full = saved["llmrl"]["0.6"]["accuracy"], saved["TRL"]["1"]["accuracy"]
    met = "meets" if llmrl_early >= trl_full else "MISSES"
    print(
        f"\nllmrl at 0.6x the time: {llmrl_early:.3f} vs TRL at 1x: {trl_full:.3f}  "
        f"{met} target (llmrl reaches TRL's accuracy in <= 0.6x the time)"
    )

    # the target as a figure: llmrl's accuracy at 0.6x the time minus TRL's at 1x, >= 0
    for name, marks in saved.items():
        summaries[name]["medians"]["saved"] = marks
    save_results(
        "learning",
        [
            figure(
                f"held-out accuracy at equal wall time ({args.budget_minutes:g} min each), "
                f"from one SFT checkpoint ({start_accuracy:.3f})",
                measure(llmrl_early, "accuracy", f"{llmrl_early:.3f} at 0.6x the time"),
                llmrl_early - trl_full,
                0.0,
                higher_is_better=True,
                peer=("TRL", measure(trl_full, "accuracy", f"{trl_full:.3f} at 1x")),
                ratio_text=f"{llmrl_early - trl_full:+.3f}",
                target_text="llmrl reaches TRL's accuracy in <= 0.6x the time",
                note="one seed",
            )
        ],
        summaries,
        extra={"model": str(start), "sft_accuracy": start_accuracy},
        args=args,
    )


def sft_checkpoint(model: Path, data: Path) -> Path:
    """The model after ``llmrl sft --config configs/sft.yaml`` (run once, then reused)."""
    out = WORK_DIR / "sft"
    final = out / "final-model"
    if (final / "config.json").is_file():
        return final
    command = [
        sys.executable,
        "-m",
        "llmrl.cli",
        "sft",
        "--config",
        str(REPO / "configs" / "sft.yaml"),
        "--set",
        f"model.name={model}",
        "--set",
        f"data.path={data}",
        "--set",
        f"output_dir={out}",
        "--set",
        f"checkpoint.dir={out / 'checkpoints'}",
        "--set",
        "tracking.enabled=false",
    ]
    print("running llmrl sft for the starting checkpoint", flush=True)
    lines = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    summary = json.loads(lines.strip().splitlines()[-1])
    Path(summary["final_checkpoint"]).rename(final)
    return final


def accuracy(model: Path, data: Path, rows: int) -> float:
    """Greedy held-out accuracy by llmrl's evaluator (the same code for every model)."""
    from llmrl.config.evaluate import EvalConfig
    from llmrl.train.evaluate import evaluate

    config = EvalConfig.model_validate(
        {
            "model": {"name": str(model)},
            "data": {"path": str(data), "max_eval_rows": rows},
            "max_new_tokens": 48,
            "output_dir": str(WORK_DIR / "learning-eval" / model.name),
            "tracking": {"enabled": False},
            "progress": False,
        }
    )
    return evaluate(config).accuracy


if __name__ == "__main__":
    main()
