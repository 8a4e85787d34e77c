"""Rollout generation throughput: llmrl's engines (transformers, vLLM's CPU build) vs raw
Hugging Face ``generate`` vs TorchRL.

Five worker processes (llmrl's ``TransformersWrapper`` with its decode loop and with the
compiled static-KV decode, raw HF in the project's venv, llmrl's ``vLLMWrapper`` over vLLM's CPU
build in the stage environment ``.venv-stage``, TorchRL's ``TransformersWrapper`` in the peers'
venv) load the same exported model and sample
``samples`` responses for each of the same ``batch`` chats, ``new-tokens`` at most, fp32 on CPU,
with the same seed per repetition. llmrl and TorchRL also return sampling log-probs and decoded
text (what a rollout needs); raw HF returns ids. After a warm-up, repetitions alternate
between the contenders; the medians and ratios are printed, and what compiling cost: the
compiled side's extra first-call time, and after how many calls it pays for itself (if ever).
Start-up (model load, vLLM's engine start) is printed apart from the per-call times.

    python benchmarks/rollout.py                     # 8 chats x 4 samples, 64 new tokens
    python benchmarks/rollout.py --reps 3 --no-peers # llmrl vs raw HF (and vLLM) only
    python benchmarks/rollout.py --no-vllm           # without the stage environment
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
from workload import exported_model, rollout_chats

TARGET_VS_HF, TARGET_VS_TORCHRL = 1.2, 1.3
COMPILED = "llmrl compiled"  # the same wrapper with compile_decode=True
VLLM = "llmrl vLLM"  # vLLMWrapper over vLLM's CPU build, in the stage environment
STAGE_PYTHON = Path(__file__).resolve().parents[1] / ".venv-stage" / "bin" / "python"
PEER_NAMES = {
    "raw HF": "raw HF `generate`",
    "TorchRL": "TorchRL `TransformersWrapper`",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4, help="responses per chat")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-peers", action="store_true", help="skip TorchRL (no peers venv)")
    parser.add_argument(
        "--no-vllm", action="store_true", help="skip vLLM's CPU build (no `make stage-env`)"
    )
    args = parser.parse_args()

    options = {
        "model": str(exported_model(args.model)),
        "chats": rollout_chats(args.batch),
        "batch": args.batch,
        "samples": args.samples,
        "new_tokens": args.new_tokens,
    }
    specs = [
        ("llmrl", sys.executable, "llmrl_side.py", {"kind": "rollout"}),
        (COMPILED, sys.executable, "llmrl_side.py", {"kind": "rollout", "compile_decode": True}),
        ("raw HF", sys.executable, "llmrl_side.py", {"kind": "raw_hf"}),
    ]
    if not args.no_vllm:
        if not STAGE_PYTHON.is_file():
            parser.error(f"{STAGE_PYTHON} is missing: run `make stage-env`, or pass --no-vllm")
        specs.append((VLLM, str(STAGE_PYTHON), "vllm_side.py", {"kind": "rollout"}))
    if not args.no_peers:
        from peers import peers_python

        specs.append(("TorchRL", peers_python(), "torchrl_side.py", {"kind": "rollout"}))
    contenders = [Contender(n, py, script, {**options, **kind}) for n, py, script, kind in specs]
    try:
        results = alternate(contenders, reps=args.reps)
    finally:
        for contender in contenders:
            contender.close()
    report(args, contenders, results)


def report(args: argparse.Namespace, contenders: list[Contender], results: dict) -> None:
    print(
        f"\nrollout: {Path(args.model).name}, {args.batch} chats x {args.samples} samples, "
        f"<= {args.new_tokens} new tokens, sampling, fp32, CPU, "
        f"{contenders[0].info['torch_threads']} threads, median of {args.reps}"
    )
    rate = {}
    rows = []
    for contender in contenders:
        runs = results[contender.name]
        seconds, tokens = median_of(runs, "seconds"), median_of(runs, "tokens")
        rate[contender.name] = tokens / seconds
        rows.append(
            [
                contender.name,
                f"{seconds:.2f}",
                f"{max_of(runs):.0f}",
                f"{median_of(runs, 'cpu_seconds'):.2f}",
                f"{tokens:.0f}",
                f"{rate[contender.name]:.1f}",
            ]
        )
    print_table(rows, ["contender", "median s", "peak RSS MB", "CPU s", "tokens", "tokens/s"])
    startup = {c.name: c.info["setup_seconds"] for c in contenders}
    print(
        "start-up (apart from the calls above): "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in startup.items())
    )
    # the sides draw from different random streams, so their token counts differ: compare rates
    compiled_vs_loop = rate[COMPILED] / rate["llmrl"]
    compile_cost = compile_seconds(contenders, results)
    call_tokens = median_of(results["llmrl"], "tokens")
    saved_per_call = call_tokens / rate["llmrl"] - call_tokens / rate[COMPILED]
    payoff_calls = compile_cost / saved_per_call if saved_per_call > 0 else None
    payoff = (
        f"pays for itself after {payoff_calls:.1f} calls of this size"
        if payoff_calls is not None
        else "slower, so it never pays for itself here"
    )
    print(
        f"\ncompile_decode: {compiled_vs_loop:.3f}x the decode loop's tokens/s; compiling cost "
        f"{compile_cost:.1f} s once (first-call time beyond the loop's); {payoff}"
    )
    vs_hf = rate["llmrl"] / rate["raw HF"]
    print(f"ratio llmrl / raw HF (tokens/s): {vs_hf:.3f}  {verdict(vs_hf, TARGET_VS_HF, True)}")
    ratios = {"raw HF": vs_hf}
    if VLLM in rate:
        vllm_vs_llmrl = rate[VLLM] / rate["llmrl"]
        print(
            f"ratio vLLM CPU build / llmrl transformers engine (tokens/s): {vllm_vs_llmrl:.3f}; "
            f"vLLM starts in {startup[VLLM]:.1f} s against {startup['llmrl']:.1f} s"
        )
    if "TorchRL" in rate:
        vs_trl = rate["llmrl"] / rate["TorchRL"]
        print(
            f"ratio llmrl / TorchRL (tokens/s): {vs_trl:.3f}  "
            f"{verdict(vs_trl, TARGET_VS_TORCHRL, True)}"
        )
        ratios["TorchRL"] = vs_trl

    def tokens_per_s(name: str) -> dict:
        return measure(rate[name], "tok/s", f"{rate[name]:.1f} tok/s")

    what = (
        f"tokens/s, {args.batch} chats x {args.samples} samples, <= {args.new_tokens} new tokens, "
        "sampling + log-probs"
    )
    targets = {"raw HF": TARGET_VS_HF, "TorchRL": TARGET_VS_TORCHRL}
    figures = [
        figure(
            what,
            tokens_per_s("llmrl"),
            ratio,
            targets[peer],
            higher_is_better=True,
            peer=(PEER_NAMES[peer], tokens_per_s(peer)),
        )
        for peer, ratio in ratios.items()
    ]
    save_results(
        "rollout",
        figures,
        {
            c.name: summarize(
                c,
                results[c.name],
                tokens=median_of(results[c.name], "tokens"),
                tokens_per_s=rate[c.name],
            )
            for c in contenders
        },
        extra={
            "vllm_vs_transformers_engine": rate[VLLM] / rate["llmrl"] if VLLM in rate else None,
            "startup_seconds": startup,
            "compiled_vs_decode_loop": compiled_vs_loop,
            "compile_seconds": compile_cost,
            "compile_payoff_calls": payoff_calls,
        },
        args=args,
    )


def compile_seconds(contenders: list[Contender], results: dict) -> float:
    """What compiling cost: the compiled side's first call beyond its median call, less the
    same one-off excess of the decode loop (allocator and cache warm-up both pay)."""
    excess = {
        c.name: c.info["first_call_seconds"] - median_of(results[c.name], "seconds")
        for c in contenders
        if c.name in ("llmrl", COMPILED)
    }
    return excess[COMPILED] - excess["llmrl"]


if __name__ == "__main__":
    main()
