"""Learning per wall-clock second: llmrl vs TRL GRPO on the arithmetic task (long; not in CI).

Both start from the same SFT checkpoint (made by ``llmrl sft`` with ``configs/sft.yaml`` unless
``--sft`` names one), train on the same prepared arithmetic train split with the same GRPO
settings for the same wall-time budget, one after the other (never at the same time), and save
their model at every fifth of the budget (``MARKS``). llmrl's evaluator then scores every saved
model and the starting checkpoint on the same held-out problems (greedy), and each gain is
paired over those problems with a 95% interval. Target: llmrl at 60% of the budget is at least
as accurate as TRL at 100%. The curves (each step's batch reward, and the
held-out accuracy at every saved fraction, against wall time) go to
``results/learning.png`` and ``results/learning.json``.

    python benchmarks/learning.py --budget-minutes 10
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

from llmrl.eval.paired import paired_gain

MARKS = (0.2, 0.4, 0.6, 0.8, 1.0)
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grpo_arguments(parser, prompts=8, new_tokens=24)
    parser.set_defaults(samples=8, lr=5e-6)  # the make run GRPO settings (configs/grpo.yaml)
    parser.add_argument("--sft", help="SFT model folder to start from (default: run llmrl sft)")
    parser.add_argument("--budget-minutes", type=float, default=10.0)
    parser.add_argument("--eval-rows", type=int, default=200)
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
    saved, summaries, curves = {}, {}, {}
    for name, python, script in (
        ("llmrl", sys.executable, "llmrl_side.py"),
        ("TRL", peers_python(), "trl_side.py"),
    ):
        print(f"training {name} for {args.budget_minutes:g} minutes", flush=True)
        with Contender(name, python, script, options) as worker:
            result = worker.run(seed=0)
        saved[name] = result["saved"]
        curves[name] = result["curve"]
        summaries[name] = summarize(worker, [result])

    start_outcomes = outcomes(start, data, args.eval_rows)
    start_accuracy = sum(start_outcomes.values()) / len(start_outcomes)
    rows = [["SFT start", "0", "0", f"{start_accuracy:.3f}", ""]]
    answered = {}
    for name, marks in saved.items():
        for key, where in marks.items():
            answered[name, key] = outcomes(Path(where["path"]), data, args.eval_rows)
            gain = paired_gain(start_outcomes, answered[name, key])
            where.update(accuracy=gain.accuracy_after, gain_over_sft=gain.as_dict())
            rows.append(
                [
                    f"{name} @ {key} budget",
                    str(where["step"]),
                    f"{where['seconds']:.0f}",
                    f"{gain.accuracy_after:.3f}",
                    f"{gain.gain:+.3f} [{gain.ci_low:+.3f}, {gain.ci_high:+.3f}]",
                ]
            )
    print(
        f"\nlearning: arithmetic, {args.prompts} prompts x G={args.samples}, "
        f"<= {args.new_tokens} tokens, lr {args.lr}, budget {args.budget_minutes:g} min, "
        f"held-out accuracy on {args.eval_rows} problems (greedy)"
    )
    print_table(rows, ["model", "steps", "seconds", "accuracy", "gain over SFT [95% CI]"])
    llmrl_early, trl_full = saved["llmrl"]["0.6"]["accuracy"], saved["TRL"]["1"]["accuracy"]
    versus = paired_gain(answered["TRL", "1"], answered["llmrl", "0.6"])
    met = "meets" if llmrl_early >= trl_full else "MISSES"
    print(
        f"\nllmrl at 0.6x the time: {llmrl_early:.3f} vs TRL at 1x: {trl_full:.3f} "
        f"(paired {versus.gain:+.3f} [{versus.ci_low:+.3f}, {versus.ci_high:+.3f}])  "
        f"{met} target (llmrl reaches TRL's accuracy in <= 0.6x the time)"
    )

    picture = plot_curves(curves, saved, start_accuracy, args)
    print(f"curves: {picture}")

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
                note=f"one seed; paired 95% interval [{versus.ci_low:+.3f}, {versus.ci_high:+.3f}]",
            )
        ],
        summaries,
        extra={"model": str(start), "sft_accuracy": start_accuracy, "curves": curves},
        args=args,
    )


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(values))
    ]


def plot_curves(
    curves: dict[str, list[list[float]]],
    saved: dict[str, dict[str, dict]],
    start_accuracy: float,
    args: argparse.Namespace,
) -> Path:
    """Two panels against wall-clock minutes: each side's batch reward (a 5-step moving
    average) and its held-out accuracy at the saved fractions (from the SFT start)."""
    from llmrl.tracking.plots import Panel, render_panels

    rewards = {
        name: list(
            zip(
                [t / 60 for t, _, _ in curve],
                moving_average([r for _, _, r in curve], 5),
                strict=True,
            )
        )
        for name, curve in curves.items()
    }
    accuracy = {
        name: [(0.0, start_accuracy)]
        + [(where["seconds"] / 60, where["accuracy"]) for where in marks.values()]
        for name, marks in saved.items()
    }
    title = f"{args.prompts} prompts x G={args.samples}, lr {args.lr}"
    return render_panels(
        [
            Panel(f"batch reward (5-step mean), {title}", rewards, "minutes", "reward"),
            Panel(
                f"held-out accuracy ({args.eval_rows} problems, greedy)",
                accuracy,
                "minutes",
                "accuracy",
            ),
        ],
        RESULTS_DIR / "learning.png",
        width=6.0,
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


def outcomes(model: Path, data: Path, rows: int) -> dict[str, bool]:
    """Per held-out problem id, whether ``model`` answered it right (greedy), by llmrl's
    evaluator: the same code and the same problems for every model."""
    from llmrl.config.evaluate import EvalConfig
    from llmrl.stages.evaluate import evaluate

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
    return evaluate(config).outcomes


if __name__ == "__main__":
    main()
