"""How long loading the default model takes: first load (GGUF conversion) vs. cached loads.

Each measurement runs in a fresh Python process with ``LLMRL_CACHE`` pointed at a new temporary
folder, and times only the load call (imports are done before the clock starts):

1. first ``load_model("smollm2-135m-instruct")``: converts the GGUF into the cache, then loads;
2. second load from that cache (repeated, median reported);
3. for reference, transformers reading the GGUF itself (de-quantizing on every load).

Run with: ``python benchmarks/model_load.py``
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

from harness import figure, measure, peak_rss_mb, save_results

REPEATS = 3

LLMRL_LOAD = """
import time
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmrl.models import load_model
started = time.perf_counter()
load_model("smollm2-135m-instruct")
print(time.perf_counter() - started)
"""

GGUF_LOAD = """
import time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
from llmrl.models import resolve_spec
gguf = Path(resolve_spec("smollm2-135m-instruct").location)
started = time.perf_counter()
AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
print(time.perf_counter() - started)
"""


def timed(code: str, cache: str) -> float:
    """Run ``code`` in a fresh interpreter with ``LLMRL_CACHE=cache``; return its printed time."""
    env = {**os.environ, "LLMRL_CACHE": cache, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        sys.exit(f"benchmark step failed:\n{result.stderr}")
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="llmrl-bench-") as cache:
        first = timed(LLMRL_LOAD, cache)
        cached = statistics.median(timed(LLMRL_LOAD, cache) for _ in range(REPEATS))
    with tempfile.TemporaryDirectory(prefix="llmrl-bench-") as cache:
        gguf = timed(GGUF_LOAD, cache)

    rows = [
        ("first load (converts GGUF)", first),
        (f"cached load (median of {REPEATS})", cached),
        ("transformers from GGUF", gguf),
    ]
    print(f"{'case':<34} {'seconds':>8} {'vs first':>9}")
    for name, seconds in rows:
        print(f"{name:<34} {seconds:>8.2f} {seconds / first:>9.2f}")
    print(f"cached / first = {cached / first:.3f} ({first / cached:.1f}x faster once cached)")

    def timing(value: float) -> dict:
        return measure(value, "s", f"{value:.2f} s")

    save_results(
        "model_load",
        [
            figure(
                "load smollm2-135m-instruct: cached load / first load (GGUF conversion)",
                timing(cached),
                cached / first,
                None,
                higher_is_better=False,
                peer=("llmrl first load", timing(first)),
            )
        ],
        {
            name: {
                "info": {},
                "reps": REPEATS if name.startswith("cached") else 1,
                "medians": {"seconds": value},
                "peak_rss_mb": None,  # one process per load: see extra
                "peak_rss_children_mb": None,
            }
            for name, value in rows
        },
        extra={"largest_load_process_peak_rss_mb": peak_rss_mb(children=True)},
    )


if __name__ == "__main__":
    main()
