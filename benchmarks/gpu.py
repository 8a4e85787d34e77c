"""llmrl on one GPU, side by side: decode against raw ``generate``, a GRPO step against TRL's.

Random-weight models built from a config (the GPU machine has no hub and no GGUF package): a
Qwen2 shaped like Qwen2.5-0.5B over SmolLM2's vocabulary (its tokenizer, saved by
``make gpu-wheels`` to ``.gpu-bundle/tokenizer``, or given with ``--tokenizer``), bfloat16.

1. **Decode**, 64 prompts x 256 new tokens, sampling at temperature 1: llmrl's
   ``TransformersWrapper`` with its defaults (on CUDA: the compiled static-KV decode; the first
   call compiles, untimed) against raw ``model.generate`` on the same bfloat16 model, the
   repetitions alternating. Tokens/s (tokens up to each row's first EOS).
2. **One GRPO step**, 16 prompts x G=4 x 256 new tokens, reward = the share of vowels in the
   response text (any function of the text that varies between samples: random weights never
   solve a task): llmrl samples with a bfloat16 engine copy, scores the rewards, computes
   group advantages (``MCAdvantage``), trains with ``GRPOTrainer`` (``model.dtype: bfloat16``,
   default ``precision: mixed``: float32 masters and AdamW state, bfloat16 autocast;
   activation checkpointing on, the CUDA default; chunked log-probs) and pushes the weights
   back to the engine (``TrainingPrecision.export``). TRL's ``GRPOTrainer`` runs in its own
   process (``bf16=True`` over float32 weights, gradient checkpointing on: its defaults), same
   model, prompts, lengths, reward, lr, beta 0. Step time and peak GPU memory
   (``torch.cuda.max_memory_allocated`` over the step) of each.

3. **Packed against padded training**, the same model and settings, on the skewed-lengths batch
   of ``benchmarks/skewed.py`` (16 prompts x G=4, three in four responses short, one in four at
   256 tokens): the training phase (loss forward, backward, AdamW) with ``model.packing`` on and
   off, alternating on one trainer, its time and peak GPU memory, and the share of the scoring
   forward's positions that are padding. Target: at most 0.7x the padded time where padding is
   at least 40% of the padded batch.

``--smoke``: a tiny Llama and tiny sizes, on CPU too (``tests/benchmarks/test_gpu_smoke.py``);
its figures check the script, not llmrl. TRL runs with ``--trl-python`` (default: this Python)
when ``trl`` imports there, and is reported as skipped otherwise.

    python benchmarks/gpu.py --results-dir "$OUT"      # about 4-6 minutes on an H100
    python benchmarks/gpu.py --smoke --results-dir /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from harness import RESULTS_DIR, WORK_DIR, figure, measure, peak_rss_mb, print_table, save_results
from workload import rollout_chats

REPO = Path(__file__).resolve().parents[1]
BUNDLED_TOKENIZER = REPO / ".gpu-bundle" / "tokenizer"
# the targets on one H100: decode >= 5x raw generate, the GRPO step <= 0.5x TRL's time,
# its peak memory <= TRL's with gradient checkpointing on (TRL's default)
TARGET_DECODE = 5.0  # llmrl tokens/s / raw generate's
TARGET_STEP = 0.5  # llmrl GRPO step time / TRL's
TARGET_MEMORY = 1.0  # llmrl peak GPU memory / TRL's
TARGET_PACKED = 0.7  # packed training phase / padded, where padding is >= 40% of the batch
VOWELS = frozenset("aeiouAEIOU")
PHASES = ("generation", "training", "weight sync")  # llmrl's step, timed and measured apart

# Qwen2.5-0.5B's shape (vocabulary: the tokenizer's)
QWEN_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
}
# the smoke run's tiny shape (llmrl.models.tiny_model's)
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def text_reward(text: str) -> float:
    """The reward both sides use: the share of vowels among the response's characters."""
    return sum(c in VOWELS for c in text) / max(len(text), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model and sizes (CPU ok)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="saved tokenizer folder")
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--trl-python", default=sys.executable, help="a Python with trl")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL's GRPO step")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 2)")
    parser.add_argument(
        "--eager-decode",
        action="store_true",
        help="llmrl samples with its eager decode loop instead of the compiled static-KV decode "
        "(what the compiled decode's CUDA graphs and static cache cost in memory)",
    )
    parser.add_argument("--trl-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker is not None:
        return trl_worker(json.loads(args.trl_worker.read_text()))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    smoke = args.smoke
    sizes = {
        "decode_prompts": 4 if smoke else 64,
        "prompts": 2 if smoke else 16,
        "samples": 2 if smoke else 4,
        "new_tokens": 8 if smoke else 256,
        "lr": 1e-6,
        "reps": args.reps or (1 if smoke else 2),
        "compile_decode": False if args.eager_decode else None,  # None: the default (CUDA: on)
    }
    if device == "cpu" and not smoke:
        sys.exit("no CUDA device: run with --smoke on a CPU")
    workdir = Path(tempfile.mkdtemp(prefix="llmrl-gpu-bench-", dir=_mkdir(WORK_DIR)))
    model_dir = save_model_folder(workdir, args.tokenizer, TINY if smoke else QWEN_05B, smoke)
    results_dir = args.results_dir or (WORK_DIR / "smoke" if smoke else RESULTS_DIR)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"device {device} ({name}), sizes {sizes}", flush=True)

    decode = measure_decode(model_dir, device, sizes)
    llmrl_step = measure_llmrl_grpo(model_dir, device, sizes)
    packing = measure_packing(model_dir, device, sizes)
    trl_step, trl_skipped = None, None
    if args.no_trl:
        trl_skipped = "--no-trl"
    elif not _imports(args.trl_python, "trl"):
        trl_skipped = f"trl is not importable by {args.trl_python}"
    else:
        trl_step = run_trl_worker(args.trl_python, model_dir, device, sizes, workdir)
    if trl_skipped:
        print(f"TRL's GRPO step skipped: {trl_skipped}", flush=True)
    report(sizes, device, decode, llmrl_step, trl_step, trl_skipped, results_dir, args, packing)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _imports(python: str, module: str) -> bool:
    done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    return done.returncode == 0


def save_model_folder(workdir: Path, tokenizer_dir: Path | None, shape: dict, smoke: bool) -> Path:
    """A folder with the tokenizer and the model's config (no weights: each side builds the
    model from the config with seed 0, the same weights)."""
    from transformers import AutoTokenizer, LlamaConfig, Qwen2Config

    from llmrl.models import load_tokenizer

    if tokenizer_dir is None and (BUNDLED_TOKENIZER / "tokenizer_config.json").is_file():
        tokenizer_dir = BUNDLED_TOKENIZER
    # a tokenizer-only folder (no config.json, which llmrl's model specs need)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir) if tokenizer_dir else load_tokenizer()
    config_class = LlamaConfig if smoke else Qwen2Config
    config = config_class(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    folder = workdir / "model"
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_model(folder: Path, dtype: torch.dtype, device: str) -> Any:
    """The random-weight model of ``folder``'s config (seed 0), in ``dtype`` on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return model.to(device=device, dtype=dtype).eval()


def _chats_batch(prompts: int) -> Any:
    from tensordict import TensorDict

    from llmrl.data import ChatHistory, History

    history = History.from_chats(rollout_chats(prompts))
    return TensorDict(
        {"history": ChatHistory(prompt=history, batch_size=[prompts])}, batch_size=[prompts]
    )


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_decode(model_dir: Path, device: str, sizes: dict) -> dict[str, Any]:
    """Tokens/s of llmrl's default sampling and of raw ``generate`` on one bfloat16 model."""
    from llmrl.data import History, pad_sequences
    from llmrl.models import load_tokenizer
    from llmrl.policies import TransformersWrapper

    tokenizer = load_tokenizer(str(model_dir))
    model = build_model(model_dir, torch.bfloat16, device)
    prompts, new_tokens = sizes["decode_prompts"], sizes["new_tokens"]
    batch = _chats_batch(prompts)
    policy = TransformersWrapper(
        model,
        tokenizer,
        generate_kwargs={"max_new_tokens": new_tokens},
        compile_decode=sizes["compile_decode"],
    )
    ids = History.from_chats(rollout_chats(prompts)).apply_chat_template(
        tokenizer, add_generation_prompt=True
    )
    input_ids, mask = pad_sequences(ids.as_list("input_ids"), "left", tokenizer.pad_token_id)
    input_ids, mask = input_ids.to(device), mask.long().to(device)

    versions: list[Any] = []  # each call's policy version: the first one holds compile_seconds

    def llmrl_run(seed: int) -> int:
        kwargs = {"max_new_tokens": new_tokens, "seed": seed}
        versions.append(policy.get_new_version(generate_kwargs=kwargs))
        out = versions[-1](batch)
        return sum(len(r) for r in out.reshape(-1)["tokens"].as_list("response"))

    @torch.no_grad()
    def raw_run(seed: int) -> int:
        torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
        generated = sequences[:, input_ids.shape[1] :]
        ended = (generated == tokenizer.eos_token_id).int()
        return int(torch.where(ended.any(1), ended.argmax(1) + 1, generated.shape[1]).sum())

    started = time.perf_counter()
    with torch.no_grad():
        llmrl_run(10_000)  # the first call compiles the decode step (CUDA)
    first_call = time.perf_counter() - started
    raw_run(10_000)  # warm-up
    runs: dict[str, list[tuple[int, float]]] = {"llmrl": [], "raw generate": []}
    for rep in range(sizes["reps"]):
        for name, run in (("llmrl", llmrl_run), ("raw generate", raw_run)):
            _synchronize(device)
            tick = time.perf_counter()
            with torch.no_grad():
                tokens = run(rep)
            _synchronize(device)
            runs[name].append((tokens, time.perf_counter() - tick))
        print(f"decode rep {rep + 1}: {runs}", flush=True)
    result = {
        name: {
            "tokens_per_second": sum(t for t, _ in values) / sum(s for _, s in values),
            "tokens": sum(t for t, _ in values) / len(values),
            "seconds": sum(s for _, s in values) / len(values),
        }
        for name, values in runs.items()
    }
    result["llmrl"]["first_call_seconds"] = first_call
    result["llmrl"]["compiled"] = versions[0].compile_seconds is not None
    _release(device)  # the model goes with this frame
    return result


def _release(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def grpo_config(model_dir: Path, device: str, sizes: dict) -> Any:
    from llmrl.config.grpo import GRPOConfig

    scratch = tempfile.mkdtemp(prefix="llmrl-gpu-grpo-")
    return GRPOConfig.model_validate(
        {
            "model": {"name": str(model_dir), "dtype": "bfloat16", "device": device},
            "data": {"path": scratch},  # not read: the prompts are the workload's
            "steps": 1000,
            "prompts_per_step": sizes["prompts"],
            "num_samples": sizes["samples"],
            "generation": {"max_new_tokens": sizes["new_tokens"], "temperature": 1.0},
            "optimizer": {"lr": sizes["lr"], "schedule": "constant"},
            "checkpoint": {"dir": f"{scratch}/checkpoints", "resume": "never"},
            "tracking": {"enabled": False},
            "output_dir": scratch,
            "progress": False,
        }
    )


def measure_llmrl_grpo(model_dir: Path, device: str, sizes: dict) -> dict[str, Any]:
    """llmrl's GRPO step (see the module docstring): median seconds, phases, peak memory."""
    from llmrl.config.common import LoraSettings
    from llmrl.models import load_tokenizer
    from llmrl.objectives import build_advantage
    from llmrl.policies import TransformersWrapper
    from llmrl.train.grpo_trainer import GRPOTrainer
    from llmrl.train.peak_memory import peak_memory_mb, reset_peak_memory
    from llmrl.train.precision import TrainingPrecision
    from llmrl.train.trainable_model import make_trainable

    config = grpo_config(model_dir, device, sizes)
    precision = TrainingPrecision.of(config.model)
    tokenizer = load_tokenizer(str(model_dir))
    trainable = make_trainable(
        build_model(model_dir, torch.float32, device), config.model, LoraSettings()
    )
    engine = build_model(model_dir, precision.dtype, device)
    engine.load_state_dict(precision.export(trainable.state_dict()))
    sampler = TransformersWrapper(
        engine,
        tokenizer,
        num_samples=config.num_samples,
        generate_kwargs=config.generation.as_kwargs(),
        compile_decode=sizes["compile_decode"],
    )
    advantage = build_advantage(config, trajectory_key=None)
    trainer = GRPOTrainer(config, trainable, tokenizer, total_steps=config.steps)
    prompts = _chats_batch(config.prompts_per_step)
    groups = iter(range(1_000_000))  # a fresh group id per prompt of every step

    def step(seed: int) -> dict[str, float]:
        # each phase's peak is measured on its own (the step's peak is their maximum), and the
        # memory held when the step starts (masters, AdamW state, the engine copy, caches) apart
        phases: dict[str, float] = {"resident MiB": _allocated_mb(device)}
        reset_peak_memory(device)
        tick = time.perf_counter()
        kwargs = config.generation.as_kwargs(seed=seed)
        with torch.no_grad():
            out = sampler.get_new_version(generate_kwargs=kwargs)(prompts).reshape(-1)
        texts = tokenizer.batch_decode(out["tokens"].as_list("response"), skip_special_tokens=True)
        out["reward"] = torch.tensor([[text_reward(t)] for t in texts])
        ids = [next(groups) for _ in range(config.prompts_per_step)]
        out["group_id"] = torch.tensor(ids).repeat_interleave(config.num_samples)
        batch = advantage(out)
        _synchronize(device)
        phases["generation"] = time.perf_counter() - tick
        phases["generation peak MiB"] = peak_memory_mb(device)
        reset_peak_memory(device)
        tick = time.perf_counter()
        metrics = trainer.train(batch, 1) if batch is not None else {}
        _synchronize(device)
        phases["training"] = time.perf_counter() - tick
        phases["training peak MiB"] = peak_memory_mb(device)
        reset_peak_memory(device)
        tick = time.perf_counter()
        with torch.no_grad():
            engine.load_state_dict(precision.export(trainable.state_dict()))
        _synchronize(device)
        phases["weight sync"] = time.perf_counter() - tick
        phases["weight sync peak MiB"] = peak_memory_mb(device)
        trained = 0 if batch is None else batch.batch_size[0]
        return {**phases, "trained_rows": trained, **metrics}

    step(10_000)  # warm-up: compiles the decode step for this batch
    steps = []
    for rep in range(sizes["reps"]):
        tick = time.perf_counter()
        result = step(rep)
        result["seconds"] = time.perf_counter() - tick
        result["peak_memory_mb"] = max(result[f"{p} peak MiB"] for p in PHASES)
        steps.append(result)
        print(f"llmrl GRPO step {rep + 1}: {result['seconds']:.2f} s", flush=True)
    _release(device)
    return _step_summary(steps, (*PHASES, "resident MiB", *(f"{p} peak MiB" for p in PHASES)))


def measure_packing(model_dir: Path, device: str, sizes: dict) -> dict[str, dict[str, Any]]:
    """The skewed training phase packed and padded (see the module docstring): one trainer
    whose scoring switches between the two, alternating after a warm-up each; per side the
    median seconds, the peak memory over its steps and the padding share of its layout."""
    from skewed import computed_positions, skewed_batch

    from llmrl.config.common import LoraSettings
    from llmrl.models import load_tokenizer
    from llmrl.train.grpo_trainer import GRPOTrainer
    from llmrl.train.peak_memory import peak_memory_mb, reset_peak_memory
    from llmrl.train.trainable_model import make_trainable

    config = grpo_config(model_dir, device, sizes)
    tokenizer = load_tokenizer(str(model_dir))
    trainable = make_trainable(
        build_model(model_dir, torch.float32, device), config.model, LoraSettings()
    )
    chats = rollout_chats(config.prompts_per_step)
    batch = skewed_batch(
        trainable, tokenizer, chats, config.num_samples, sizes["new_tokens"], 0, device
    )
    trainer = GRPOTrainer(config, trainable, tokenizer, total_steps=config.steps)
    shares_prompts = not config.model.checkpoints_activations  # checkpointing: one pass
    sides: dict[str, dict[str, Any]] = {}
    runs: dict[str, list[tuple[float, float]]] = {"packed": [], "padded": []}
    for rep in range(sizes["reps"] + 1):  # the first round is the warm-up
        for name in runs:
            trainer.loss_fn.actor.packing = name == "packed"
            reset_peak_memory(device)
            tick = time.perf_counter()
            trainer.train(batch, 1)
            _synchronize(device)
            seconds = time.perf_counter() - tick
            if rep:
                runs[name].append((seconds, peak_memory_mb(device) or peak_rss_mb()))
                print(f"llmrl {name} training {rep}: {seconds:.2f} s", flush=True)
    for name, measured in runs.items():
        positions = computed_positions(batch, name == "packed", shares_prompts)
        sides[name] = {
            "seconds": statistics.median(s for s, _ in measured),
            "peak_memory_mb": max(m for _, m in measured),
            "padding_share": 1 - positions["tokens"] / positions["computed"],
            "computed_positions": positions["computed"],
        }
    _release(device)
    return sides


def _allocated_mb(device: str) -> float:
    """MiB held by live tensors on ``device`` right now (CUDA; 0 elsewhere)."""
    return torch.cuda.memory_allocated(device) / 2**20 if device == "cuda" else 0.0


def _step_summary(steps: list[dict[str, float]], phases: tuple[str, ...]) -> dict[str, Any]:
    """Medians of a side's timed steps; peak memory: their maximum."""
    import statistics

    return {
        "seconds": statistics.median(s["seconds"] for s in steps),
        "peak_memory_mb": max(s["peak_memory_mb"] for s in steps),
        "phases": {p: statistics.median(s.get(p, 0.0) for s in steps) for p in phases},
        "steps": len(steps),
    }


def run_trl_worker(
    python: str, model_dir: Path, device: str, sizes: dict, workdir: Path
) -> dict[str, Any]:
    """TRL's GRPO step in its own process (its own peak memory); returns its summary."""
    options = workdir / "trl-options.json"
    options.write_text(json.dumps({"model": str(model_dir), "device": device, **sizes}))
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run(
        [python, __file__, "--trl-worker", str(options)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@trl ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"TRL worker failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
    return json.loads(lines[-1][len("@@trl ") :])


def trl_worker(options: dict[str, Any]) -> None:
    """In TRL's process: ``warm-up + reps`` steps of TRL's ``GRPOTrainer``, each timed and its
    peak memory taken by a callback; prints one ``@@trl {json}`` line."""
    import datasets
    import transformers
    import trl
    from transformers import AutoTokenizer, TrainerCallback

    device, cuda = options["device"], options["device"] == "cuda"
    model_dir = Path(options["model"])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = build_model(model_dir, torch.float32, device)
    steps: list[dict[str, float]] = []
    timing: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            _synchronize(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            torch.manual_seed(state.global_step)
            timing["started"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            _synchronize(device)
            steps.append(
                {
                    "seconds": time.perf_counter() - timing["started"],
                    "peak_memory_mb": _peak_mb(cuda),
                }
            )

    def reward(completions: list, **_: Any) -> list[float]:
        return [text_reward(c[0]["content"]) for c in completions]

    rows = [{"prompt": chat} for chat in rollout_chats(options["prompts"])]
    sys.path.insert(0, str(Path(__file__).parent / "workers"))
    from trl_side import grpo_config as trl_grpo_config

    args = trl_grpo_config(
        options,
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=True,
        max_steps=1 + options["reps"],
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    trainer.train()
    summary = _step_summary(steps[1:], ())  # the first step is the warm-up
    summary["info"] = {"trl": trl.__version__, "transformers": transformers.__version__}
    print("@@trl " + json.dumps(summary), flush=True)


def _peak_mb(cuda: bool) -> float:
    """TRL's process (no llmrl imports: the peers' venv has its own tensordict): CUDA's peak
    allocated MiB since the step began, or the process's peak RSS so far on a CPU."""
    return torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()


def report(
    sizes: dict,
    device: str,
    decode: dict[str, Any],
    llmrl_step: dict[str, Any],
    trl_step: dict[str, Any] | None,
    trl_skipped: str | None,
    results_dir: Path,
    args: argparse.Namespace,
    packing: dict[str, dict[str, Any]],
) -> None:
    """Print the three tables and their ratios; save ``gpu.json``."""
    ours, raw = decode["llmrl"], decode["raw generate"]
    what = f"{sizes['decode_prompts']} prompts x {sizes['new_tokens']} new tokens, bf16, {device}"
    print(f"\nDecode, {what}; llmrl's first call (compiling) {ours['first_call_seconds']:.1f} s")
    print_table(
        [
            [name, f"{v['tokens_per_second']:.0f}", f"{v['seconds']:.2f}"]
            for name, v in decode.items()
        ],
        ["contender", "tokens/s", "s per call"],
    )
    decode_ratio = ours["tokens_per_second"] / raw["tokens_per_second"]
    print(f"ratio llmrl / raw generate (tokens/s): {decode_ratio:.2f}")
    figures = [
        figure(
            f"decode tokens/s, {what}",
            measure(ours["tokens_per_second"], "tok/s"),
            decode_ratio,
            TARGET_DECODE,
            higher_is_better=True,
            peer=("raw HF `generate`", measure(raw["tokens_per_second"], "tok/s")),
        )
    ]
    step_what = (
        f"one GRPO step, {sizes['prompts']} prompts x G={sizes['samples']} x "
        f"{sizes['new_tokens']} new tokens, bf16 mixed, {device}"
    )
    sides = {"llmrl": llmrl_step, **({"TRL": trl_step} if trl_step else {})}
    print(f"\n{step_what}")
    print_table(
        [[n, f"{s['seconds']:.2f}", f"{s['peak_memory_mb']:.0f}"] for n, s in sides.items()],
        ["contender", "step s", "peak MiB"],
    )
    print(f"llmrl phases: {llmrl_step['phases']}")

    def shown(side: dict[str, Any]) -> dict[str, Any]:
        return measure(
            side["seconds"], "s", f"{side['seconds']:.2f} s ({side['peak_memory_mb']:.0f} MiB peak)"
        )

    if trl_step is not None:
        step_ratio = llmrl_step["seconds"] / trl_step["seconds"]
        memory_ratio = llmrl_step["peak_memory_mb"] / trl_step["peak_memory_mb"]
        print(f"ratio llmrl / TRL: step time {step_ratio:.3f}, peak memory {memory_ratio:.3f}")
        figures.append(
            figure(
                step_what,
                shown(llmrl_step),
                step_ratio,
                TARGET_STEP,
                higher_is_better=False,
                peer=("TRL `GRPOTrainer`", shown(trl_step)),
            )
        )
        figures.append(
            figure(
                "peak GPU memory of that step",
                measure(llmrl_step["peak_memory_mb"], "MiB"),
                memory_ratio,
                TARGET_MEMORY,
                higher_is_better=False,
                peer=("TRL `GRPOTrainer`", measure(trl_step["peak_memory_mb"], "MiB")),
            )
        )
    figures.append(report_packing(sizes, device, packing))
    contenders = {
        "llmrl packed training": {"medians": packing["packed"]},
        "llmrl padded training": {"medians": packing["padded"]},
        "llmrl decode": {"medians": decode["llmrl"]},
        "raw generate": {"medians": decode["raw generate"]},
        "llmrl GRPO step": {"medians": llmrl_step},
        "TRL GRPO step": {"medians": trl_step, "skipped": trl_skipped},
    }
    save_results(
        "gpu",
        figures,
        contenders,
        extra={"device": device, "sizes": sizes, "trl_skipped": trl_skipped},
        results_dir=results_dir,
        args=args,
    )


def report_packing(sizes: dict, device: str, packing: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print the packed/padded table and ratio; return its figure."""
    what = (
        f"packed vs padded training phase, {sizes['prompts']} prompts x G={sizes['samples']}, "
        f"skewed responses <= {sizes['new_tokens']} tokens, bf16 mixed, {device}"
    )
    print(f"\n{what}")
    print_table(
        [
            [
                name,
                f"{side['seconds']:.2f}",
                f"{side['peak_memory_mb']:.0f}",
                f"{side['padding_share']:.0%}",
            ]
            for name, side in packing.items()
        ],
        ["training", "s", "peak MiB", "padding"],
    )
    packed, padded = packing["packed"], packing["padded"]
    ratio = packed["seconds"] / padded["seconds"]
    print(f"ratio packed / padded (training phase): {ratio:.3f}")
    return figure(
        f"{what}, padding {padded['padding_share']:.0%} of the padded batch",
        measure(packed["seconds"], "s"),
        ratio,
        TARGET_PACKED if padded["padding_share"] >= 0.4 else None,
        higher_is_better=False,
        peer=("llmrl padded", measure(padded["seconds"], "s")),
    )


if __name__ == "__main__":
    main()
