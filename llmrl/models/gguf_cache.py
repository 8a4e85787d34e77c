"""Convert a GGUF checkpoint once into a safetensors directory in llmrl's cache.

transformers de-quantizes GGUF weights to float32 on every load, which takes ~20 s for SmolLM2.
Converting once into a regular Hugging Face directory makes later loads take a few seconds.
The conversion is written under a temporary name in the cache and renamed into place, so a
crash mid-conversion never leaves a directory that looks complete.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

from llmrl.core.errors import MissingExtraError
from llmrl.models.errors import ModelSpecError

logger = logging.getLogger(__name__)

CACHE_ENV = "LLMRL_CACHE"
# Bump when the conversion's output changes, so old cache entries are not reused.
CONVERSION_VERSION = 1


def cache_root() -> Path:
    """The llmrl cache folder: ``$LLMRL_CACHE``, else ``~/.cache/llmrl``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "llmrl"


def converted_dir_for(gguf_path: str | Path) -> Path:
    """The cache directory that holds (or will hold) the conversion of ``gguf_path``.

    The key covers the file's absolute path, size and modification time, so replacing the file
    gives a new entry rather than stale weights.
    """
    path = Path(gguf_path).resolve()
    stat = path.stat()
    fingerprint = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|v{CONVERSION_VERSION}"
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{path.stem}-{digest}"


def ensure_converted(gguf_path: str | Path) -> Path:
    """Return a safetensors model directory for ``gguf_path``, converting it on first use."""
    target = converted_dir_for(gguf_path)
    if target.is_dir():
        if _is_complete(target):
            return target
        # found without its config or weights (left by something other than this function,
        # which publishes whole conversions only): set it aside and convert again
        aside = target.with_name(f".{target.name}.broken-{os.getpid()}")
        logger.warning("%s lacks config.json or weights; converting again", target)
        os.rename(target, aside)
        shutil.rmtree(aside, ignore_errors=True)
    require_gguf_support()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
    try:
        started = time.perf_counter()
        logger.info("Converting %s to safetensors in %s (once)", gguf_path, target)
        try:
            _convert(Path(gguf_path), staging)
        except (ValueError, struct.error, EOFError) as error:  # the GGUF reader's complaints
            raise ModelSpecError(
                f"model file {gguf_path} is not a readable GGUF file ({error})"
            ) from None
        _publish(staging, target)
        logger.info("Converted in %.1f s", time.perf_counter() - started)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a model: its config and safetensors weights."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def require_gguf_support() -> None:
    """Raise :class:`MissingExtraError` unless the packages that read GGUF are installed."""
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise MissingExtraError(package, "local", "Loading a GGUF model")


def _convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_path.parent), gguf_path.name
    dequantized = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=filename, dtype=torch.float32
    )
    config = dequantized.config
    # A GGUF-loaded model carries a quantization config that makes save_pretrained refuse;
    # rebuild a plain model from the config and move the de-quantized weights into it.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(dequantized.state_dict())
    plain.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=filename).save_pretrained(out_dir)


def _publish(staging: Path, target: Path) -> None:
    """Atomically move the finished conversion into place; a concurrent winner is kept."""
    try:
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
        logger.info("Another process finished converting %s first; using it", target)
