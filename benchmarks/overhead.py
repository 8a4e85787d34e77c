"""llmrl's overhead: the part of a GRPO step that is not model compute.

One worker runs production GRPO steps (:meth:`GRPOTrainer.step`) and measures, inside each step,
the time spent in the model itself: ``model.generate``, the model's other forward calls (the
shared-prompt prefill and the loss's scoring pass), the backward pass and the optimizer step.
llmrl's overhead = (step - model time) / step: environments, chat templating, decoding,
containers, rewards, advantages, the loss arithmetic and weight sync.

For context the worker then runs the plain-transformers equivalent of the same step on the same
tokens: HF ``generate`` of the step's prompts (same order and seed, so the same samples) and one
forward/backward of prompt + response with the output layer over the responses. llmrl's step can
be faster than that baseline: it computes each shared prompt once.

    python benchmarks/overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import sys

from harness import (
    Contender,
    alternate,
    figure,
    measure,
    print_table,
    save_results,
    summarize,
    verdict,
)
from workload import grpo_arguments, grpo_options

TARGET = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grpo_arguments(parser, prompts=8, new_tokens=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    options = {**grpo_options(args, rows=args.prompts), "kind": "overhead"}
    with Contender("llmrl", sys.executable, "llmrl_side.py", options) as worker:
        runs = alternate([worker], reps=args.reps)["llmrl"]

    fractions, rows = [], []
    for rep, run in enumerate(runs, 1):
        model = (
            run["model"]["generate"]
            + run["model"]["forward"]
            + run["phases"]["backward"]
            + run["phases"]["optimizer"]
        )
        fraction = (run["step_seconds"] - model) / run["step_seconds"]
        fractions.append(fraction)
        baseline = run["pure"]["generate"] + run["pure"]["forward_backward"]
        rows.append(
            [
                str(rep),
                f"{run['step_seconds']:.2f}",
                f"{model:.2f}",
                f"{fraction:.1%}",
                f"{run['pure']['generate']:.2f}",
                f"{run['pure']['forward_backward']:.2f}",
                f"{run['step_seconds'] / baseline:.3f}",
                f"{run['tokens']:.0f}/{run['pure']['generated_tokens']}",
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
            "in model s",
            "overhead",
            "HF generate s",
            "HF fwd+bwd s",
            "step / HF",
            "tokens llmrl/HF",
        ],
    )
    median = statistics.median(fractions)
    ratio = statistics.median(
        r["step_seconds"] / (r["pure"]["generate"] + r["pure"]["forward_backward"]) for r in runs
    )
    print(f"\nllmrl overhead (median): {median:.1%}  {verdict(median, TARGET, False)}")
    print(f"llmrl step / plain transformers generate + forward/backward (median): {ratio:.3f}")

    step = statistics.median(r["step_seconds"] for r in runs)
    baseline = statistics.median(
        r["pure"]["generate"] + r["pure"]["forward_backward"] for r in runs
    )
    save_results(
        "overhead",
        [
            figure(
                "step time outside the model (generate, forward, backward, optimizer)",
                measure(median, "fraction of the step", f"{median:.1%} of the step"),
                median,
                TARGET,
                higher_is_better=False,
                ratio_text=f"{median:.1%}",
                target_text=f"<= {TARGET:.0%}",
            ),
            figure(
                "llmrl step / plain transformers `generate` + forward/backward on the same tokens",
                measure(step, "s", f"{step:.1f} s"),
                ratio,
                None,
                higher_is_better=False,
                peer=("plain transformers", measure(baseline, "s", f"{baseline:.1f} s")),
            ),
        ],
        {
            "llmrl": summarize(
                worker,
                runs,
                step_seconds=step,
                overhead=median,
                plain_transformers_seconds=baseline,
                step_over_plain=ratio,
            )
        },
        args=args,
    )


if __name__ == "__main__":
    main()
