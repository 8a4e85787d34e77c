"""Generation throughput: llmrl's TransformersWrapper vs raw Hugging Face ``generate``.

Both contenders sample from the same model, the same left-padded prompts, with the same seed
each repetition, so they draw exactly the same tokens: the ratio of their times is the ratio of
their throughputs. The wrapper does everything a rollout needs on top (chat templating, sampling
log-probs, decoding, output containers); raw HF gets pre-tokenized prompts and returns ids.
Runs alternate (wrapper, HF, wrapper, HF, ...) after one warm-up each.

    python benchmarks/rollout.py                       # SmolLM2-135M, batch 8, 64 new tokens
    python benchmarks/rollout.py --batch 8 --samples 4 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict

from llmrl.data import ChatHistory, History, pad_sequences
from llmrl.models import load_model, load_tokenizer
from llmrl.policies import TransformersWrapper

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


def _prompts(batch: int) -> History:
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(batch)]
    return History.from_chats(chats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1, help="responses per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model)
    history = _prompts(args.batch)
    td = TensorDict({"history": ChatHistory(prompt=history, batch_size=[args.batch])}, [args.batch])
    policy = TransformersWrapper(
        model,
        tokenizer,
        num_samples=args.samples,
        generate_kwargs={"max_new_tokens": args.new_tokens},
    )
    prompt_ids = history.apply_chat_template(tokenizer, add_generation_prompt=True).as_list(
        "input_ids"
    )
    input_ids, mask = pad_sequences(prompt_ids, "left", tokenizer.pad_token_id)

    def run_wrapper(seed: int) -> int:
        out = policy.get_new_version(
            generate_kwargs={"max_new_tokens": args.new_tokens, "seed": seed}
        )(td)
        return sum(len(r) for r in out.reshape(-1)["tokens"].as_list("response"))

    def run_hf(seed: int) -> int:
        torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=input_ids,
            attention_mask=mask.long(),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=args.new_tokens,
            num_return_sequences=args.samples,
            pad_token_id=tokenizer.pad_token_id,
        )
        generated = sequences[:, input_ids.shape[1] :]
        ended = (generated == tokenizer.eos_token_id).int()
        first_eos = torch.where(ended.any(1), ended.argmax(1) + 1, generated.shape[1])
        return int(first_eos.sum())

    timings: dict[str, list[float]] = {"llmrl TransformersWrapper": [], "raw HF generate": []}
    cpu: dict[str, list[float]] = {name: [] for name in timings}
    tokens: dict[str, list[int]] = {name: [] for name in timings}
    contenders = list(zip(timings, (run_wrapper, run_hf), strict=True))
    for name, run in contenders:  # warm-up
        run(seed=1234)
        print(f"warm-up done: {name}", flush=True)
    for rep in range(args.reps):
        for name, run in contenders:
            started, cpu_started = time.perf_counter(), time.process_time()
            tokens[name].append(run(seed=rep))
            timings[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
        print(f"rep {rep + 1}/{args.reps} done", flush=True)

    print(
        f"\nmodel {args.model}, batch {args.batch} x {args.samples} samples, "
        f"{args.new_tokens} new tokens, sampling, fp32, {torch.get_num_threads()} threads"
    )
    print(f"{'contender':28s} {'median s':>9s} {'CPU s':>7s} {'tokens':>7s} {'tokens/s':>9s}")
    rates = {}
    for name in timings:
        median = statistics.median(timings[name])
        count = statistics.median(tokens[name])
        rates[name] = count / median
        cpu_median = statistics.median(cpu[name])
        print(f"{name:28s} {median:9.2f} {cpu_median:7.2f} {count:7.0f} {rates[name]:9.1f}")
    if tokens["llmrl TransformersWrapper"] != tokens["raw HF generate"]:
        print("warning: the contenders generated different token counts")
    ratio = rates["llmrl TransformersWrapper"] / rates["raw HF generate"]
    cpu_ratio = statistics.median(cpu["raw HF generate"]) / statistics.median(
        cpu["llmrl TransformersWrapper"]
    )
    print(f"\nratio llmrl / raw HF (tokens/s, wall): {ratio:.3f}   (target >= 0.97)")
    print(f"ratio llmrl / raw HF (tokens per CPU second): {cpu_ratio:.3f}")


if __name__ == "__main__":
    main()
