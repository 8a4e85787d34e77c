"""The peers' virtual environment (TRL, TorchRL), kept apart from the project's.

TorchRL 0.14 pins ``tensordict < 0.15`` while llmrl needs 0.15, so the peers never go into
``.venv``. :func:`peers_python` creates ``benchmarks/.peers-venv`` on first use: the same torch
as the project's venv first (so pip cannot swap it for a CUDA build), recorded as a constraint,
then ``benchmarks/peers-requirements.txt``. A stamp holding the requirements' hash makes later
calls instant and re-installs when the requirements change.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import venv
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "peers-requirements.txt"
VENV = HERE / ".peers-venv"


def peers_python() -> Path:
    """The peers' interpreter, creating and filling their venv when needed."""
    python = VENV / "bin" / "python"
    torch_pin = f"torch=={torch.__version__}"
    wanted = hashlib.sha256((REQUIREMENTS.read_text() + torch_pin).encode()).hexdigest()
    stamp = VENV / ".installed"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"creating the peers' venv in {VENV} (TRL, TorchRL; a few minutes)", flush=True)
    if not python.exists():
        venv.create(VENV, with_pip=True)
    constraint = VENV / "torch-constraint.txt"
    constraint.write_text(torch_pin + "\n")
    _pip(python, "install", "--quiet", torch_pin)
    _pip(python, "install", "--quiet", "-c", str(constraint), "-r", str(REQUIREMENTS))
    stamp.write_text(wanted)
    return python


def _pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", *args]
    if subprocess.call(command) != 0:
        sys.exit(f"failed: {' '.join(command)}")
