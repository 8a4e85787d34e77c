"""How far SFT moves the weights in float32, mixed bfloat16 and pure bfloat16, side by side.

The same tiny random Llama (SmolLM2's tokenizer), the same prepared arithmetic data, the same
seed and 40 SFT steps at lr 1e-5 (constant schedule) through the stage users run
(``llmrl.stages.sft.run_sft``), three times: ``model.dtype: float32``; ``bfloat16`` with
``precision: mixed`` (the default: float32 masters and AdamW state, bfloat16 autocast); and
``precision: pure`` (bfloat16 parameters and AdamW state). Each run's final checkpoint is loaded
back as its trainer holds the weights (mixed: the float32 masters, which the checkpoint keeps
beside the bfloat16 ``model/``) and compared with the start (pure: the start rounded to
bfloat16, as that trainer held it). Printed: the L2 distance moved, the fraction of weight
elements changed, and each bfloat16 run's ratios to float32.

Target: mixed moves the weights >= 0.5x as far as float32 (pure bfloat16 measured 0.12x before
mixed precision existed: updates under ~0.4% of a weight are rounded away).

    python benchmarks/precision.py
    python benchmarks/precision.py --steps 10 --results-dir /tmp/results
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from harness import WORK_DIR, figure, measure, print_table, save_results

TARGET = 0.5  # mixed bfloat16's L2 distance moved / float32's
RUNS = {  # name: (model.dtype, model.precision)
    "float32": ("float32", "mixed"),
    "mixed bf16": ("bfloat16", "mixed"),
    "pure bf16": ("bfloat16", "pure"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", type=Path, default=None, help="default: results/")
    args = parser.parse_args()

    start_dir = start_model(args)
    data = arithmetic_data(rows=args.steps * args.batch_size)
    moved = {}
    for name, (dtype, precision) in RUNS.items():
        started = time.perf_counter()
        moved[name] = sft_moves(args, start_dir, data, dtype, precision)
        moved[name]["seconds"] = time.perf_counter() - started
        print(f"{name}: {moved[name]}", flush=True)
    report(args, moved)


def start_model(args: argparse.Namespace) -> Path:
    """The tiny random Llama every run starts from, saved with SmolLM2's tokenizer."""
    from llmrl.models import load_tokenizer, tiny_model

    folder = WORK_DIR / f"precision-llama-{args.layers}x{args.hidden_size}-seed{args.seed}"
    if not (folder / "config.json").is_file():
        tokenizer = load_tokenizer()
        model = tiny_model(
            tokenizer,
            num_layers=args.layers,
            hidden_size=args.hidden_size,
            intermediate_size=4 * args.hidden_size,
            seed=args.seed,
        )
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


def arithmetic_data(rows: int) -> Path:
    """A prepared arithmetic dataset with ``rows`` training problems (generated once)."""
    from llmrl.config import PrepareConfig
    from llmrl.data.prepare import prepare_dataset

    config = PrepareConfig(
        generate={"train_size": rows, "eval_size": 8}, output_dir=WORK_DIR / "precision-data"
    )
    return prepare_dataset(config, progress=False).path


def sft_moves(
    args: argparse.Namespace, start_dir: Path, data: Path, dtype: str, precision: str
) -> dict[str, float]:
    """Run SFT as configured and measure how far it moved the weights from the start."""
    from llmrl.config import load_config
    from llmrl.config.common import LoraSettings
    from llmrl.config.sft import SFTConfig
    from llmrl.models import load_model
    from llmrl.stages.sft import run_sft
    from llmrl.train.checkpoint import load_checkpoint
    from llmrl.train.trainable_model import make_trainable

    with tempfile.TemporaryDirectory(prefix="llmrl-precision-") as scratch:
        config = load_config(
            SFTConfig,
            None,
            [
                f"model.name={start_dir}",
                f"model.dtype={dtype}",
                f"model.precision={precision}",
                f"data.path={data}",
                f"steps={args.steps}",
                f"batch_size={args.batch_size}",
                f"seed={args.seed}",
                f"optimizer.lr={args.lr}",
                "optimizer.warmup_steps=0",
                "optimizer.schedule=constant",
                f"eval_every={args.steps}",
                "eval_batches=1",
                f"checkpoint.every={args.steps}",
                "checkpoint.keep_last=1",
                f"output_dir={scratch}",
                "tracking.enabled=false",
                "progress=false",
            ],
        )

        def as_trained() -> torch.nn.Module:  # the weights as this trainer holds them
            return make_trainable(load_model(start_dir), config.model, LoraSettings())

        before = {n: p.detach().float().clone() for n, p in as_trained().named_parameters()}
        result = run_sft(config)
        final = as_trained()
        checkpoint = Path(result.final_checkpoint).parent
        load_checkpoint(checkpoint, model=final, restore_rng=False)
        after = {n: p.detach().float() for n, p in final.named_parameters()}
    squared = sum(float(((after[n] - before[n]) ** 2).sum()) for n in before)
    changed = sum(int((after[n] != before[n]).sum()) for n in before)
    total = sum(t.numel() for t in before.values())
    return {
        "l2_moved": squared**0.5,
        "fraction_changed": changed / total,
        "train_loss": result.train_loss,
    }


def report(args: argparse.Namespace, moved: dict[str, dict[str, float]]) -> None:
    """Print the side-by-side table and the ratios; save ``results/precision.json``."""
    fp32 = moved["float32"]
    print(
        f"\n{args.steps} SFT steps at lr {args.lr} (constant), batch {args.batch_size}, tiny "
        f"Llama {args.layers} layers x {args.hidden_size}, SmolLM2 vocabulary, CPU, seed "
        f"{args.seed}"
    )
    rows = []
    for name, values in moved.items():
        rows.append(
            [
                name,
                f"{values['l2_moved']:.4g}",
                f"{values['l2_moved'] / fp32['l2_moved']:.3f}x",
                f"{100 * values['fraction_changed']:.2f}%",
                f"{values['fraction_changed'] / fp32['fraction_changed']:.3f}x",
                f"{values['train_loss']:.4f}",
                f"{values['seconds']:.1f}",
            ]
        )
    header = ["run", "L2 moved", "/ fp32", "elements changed", "/ fp32", "last loss", "s"]
    print_table(rows, header)
    figures = []
    for name, target in (("mixed bf16", TARGET), ("pure bf16", None)):
        ratio = moved[name]["l2_moved"] / fp32["l2_moved"]
        print(f"ratio {name} / float32 (L2 moved): {ratio:.3f}")
        figures.append(
            figure(
                f"SFT, {args.steps} steps at lr {args.lr}: L2 distance the weights moved, "
                f"{name} against float32",
                measure(moved[name]["l2_moved"], "L2", f"{moved[name]['l2_moved']:.4g}"),
                ratio,
                target,
                higher_is_better=True,
                peer=("float32", measure(fp32["l2_moved"], "L2", f"{fp32['l2_moved']:.4g}")),
                ratio_text=f"{ratio:.3f}x",
            )
        )
    contenders = {
        name: {"medians": {"seconds": values["seconds"]}, **values}
        for name, values in moved.items()
    }
    save_results("precision", figures, contenders, results_dir=args.results_dir, args=args)


if __name__ == "__main__":
    main()
