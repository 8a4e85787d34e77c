"""llmrl's overhead: a GRPO step's time minus the pure model compute of the same step.

One worker runs a production GRPO step (:meth:`GRPOTrainer.step`), then, on the same tokens,
the model compute that step cannot avoid: HF ``generate`` of the step's prompts (same order, same
seed, so the same samples) and one forward/backward over the prompt + response tokens it trained
on. Overhead = (step - generate - forward/backward) / step. The optimizer step is reported
separately: it is counted as overhead by this definition although it is model work too.

    python benchmarks/overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import sys

from harness import Contender, alternate, median_of, print_table, verdict
from workload import arithmetic_data, exported_model

TARGET = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    data, _ = arithmetic_data(args.prompts)
    options = {
        "kind": "overhead",
        "model": str(exported_model(args.model)),
        "data": str(data),
        "prompts": args.prompts,
        "samples": args.samples,
        "new_tokens": args.new_tokens,
        "lr": args.lr,
    }
    with Contender("llmrl", sys.executable, "llmrl_side.py", options) as worker:
        runs = alternate([worker], reps=args.reps)["llmrl"]

    fractions, rows = [], []
    for rep, run in enumerate(runs, 1):
        pure = run["pure"]["generate"] + run["pure"]["forward_backward"]
        fraction = (run["step_seconds"] - pure) / run["step_seconds"]
        fractions.append(fraction)
        rows.append(
            [
                str(rep),
                f"{run['step_seconds']:.2f}",
                f"{run['pure']['generate']:.2f}",
                f"{run['pure']['forward_backward']:.2f}",
                f"{run['phases']['optimizer']:.2f}",
                f"{run['tokens']:.0f}/{run['pure']['generated_tokens']}",
                f"{fraction:.1%}",
            ]
        )
    print(
        f"\noverhead: {args.prompts} prompts x G={args.samples}, <= {args.new_tokens} new tokens, "
        f"fp32, CPU, {worker.info['torch_threads']} threads"
    )
    print_table(
        rows,
        [
            "rep",
            "llmrl step s",
            "HF generate s",
            "fwd+bwd s",
            "optimizer s",
            "tokens llmrl/HF",
            "overhead",
        ],
    )
    median = statistics.median(fractions)
    optimizer = median_of(runs, "phases.optimizer") / median_of(runs, "step_seconds")
    print(f"\nllmrl overhead (median): {median:.1%}  {verdict(median, TARGET, False)}")
    print(f"of which the optimizer step (AdamW + grad clip): {optimizer:.1%} of the step")


if __name__ == "__main__":
    main()
