"""One full GRPO iteration: llmrl vs TRL's ``GRPOTrainer``, configured identically.

Both sides start from the same exported model and the same arithmetic prompts (8 by default),
sample G = 4 completions per prompt (at most 64 new tokens, temperature 1, no top-k/top-p),
score them with the same reward (llmrl's arithmetic scorer), compute group-relative advantages,
the clipped loss (beta = 0: no reference model; one update per batch, so no old-log-prob pass),
backward, clip the gradient norm to 1, take an AdamW step at the same learning rate, and make
the new weights the sampler's. Each contender is a worker process (TRL in the peers' venv); the
steps alternate between them after a warm-up step each. Printed: median step time, where it
goes (generation / loss forward / backward / optimizer / other), and the ratio.

TRL runs with its defaults for everything not named above; its default turns gradient
checkpointing on, which trades backward time for memory. ``--trl-variants`` adds a TRL
contender with gradient checkpointing off (the same compute as llmrl's step).

    python benchmarks/grpo_step.py
    python benchmarks/grpo_step.py --reps 3 --trl-variants
"""

from __future__ import annotations

import argparse
import sys

from harness import (
    Contender,
    alternate,
    figure,
    max_of,
    measure,
    median_of,
    print_table,
    save_results,
    summarize,
    verdict,
)
from peers import peers_python
from workload import grpo_arguments, grpo_options

TARGET = 0.6  # llmrl step time / TRL step time
PHASES = ("generation", "loss forward", "backward", "optimizer", "weight sync", "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grpo_arguments(parser, prompts=8, new_tokens=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--trl-variants", action="store_true", help="also TRL without gradient checkpointing"
    )
    args = parser.parse_args()

    options = grpo_options(args, rows=args.prompts)
    peers = peers_python()
    contenders = [
        Contender("llmrl", sys.executable, "llmrl_side.py", {**options, "kind": "grpo_step"})
    ]
    contenders.append(
        Contender("TRL", peers, "trl_side.py", {**options, "gradient_checkpointing": True})
    )
    if args.trl_variants:
        contenders.append(
            Contender(
                "TRL (no grad ckpt)",
                peers,
                "trl_side.py",
                {**options, "gradient_checkpointing": False},
            )
        )
    try:
        results = alternate(contenders, reps=args.reps)
    finally:
        for contender in contenders:
            contender.close()

    print(
        f"\nGRPO step: {args.prompts} prompts x G={args.samples}, <= {args.new_tokens} new tokens, "
        f"lr {args.lr}, fp32, CPU, {contenders[0].info['torch_threads']} threads, "
        f"median of {args.reps} steps after 1 warm-up; TRL {contenders[1].info['trl']}"
    )
    rows = []
    for contender in contenders:
        runs = results[contender.name]
        row = [contender.name, f"{median_of(runs, 'seconds'):.2f}", f"{max_of(runs):.0f}"]
        row += [f"{median_of(runs, 'phases.' + phase):.2f}" for phase in PHASES]
        rows.append(row)
    print_table(rows, ["contender", "step s", "peak RSS MB", *PHASES])
    llmrl = median_of(results["llmrl"], "seconds")
    figures = []
    for contender in contenders[1:]:
        peer = median_of(results[contender.name], "seconds")
        ratio = llmrl / peer
        print(
            f"ratio llmrl / {contender.name} (step time): {ratio:.3f}  "
            f"{verdict(ratio, TARGET, higher_is_better=False)}"
        )
        figures.append(
            figure(
                f"one GRPO iteration, {args.prompts} prompts x G={args.samples}, "
                f"<= {args.new_tokens} new tokens, beta 0",
                measure(llmrl, "s", f"{llmrl:.1f} s"),
                ratio,
                TARGET,
                higher_is_better=False,
                peer=(
                    contender.name.replace("TRL", "TRL `GRPOTrainer`", 1),
                    measure(peer, "s", f"{peer:.1f} s"),
                ),
            )
        )
    save_results(
        "grpo_step",
        figures,
        {
            c.name: summarize(
                c,
                results[c.name],
                **{p: median_of(results[c.name], "phases." + p) for p in PHASES},
            )
            for c in contenders
        },
        args=args,
    )


if __name__ == "__main__":
    main()
