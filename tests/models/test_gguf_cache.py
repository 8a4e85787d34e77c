"""The GGUF -> safetensors cache: keys, atomic publication, crash safety and reuse.

Only one real conversion happens per session (the default model, in the session cache); every
other test uses a small fake ``.gguf`` file, its own ``LLMRL_CACHE`` and a patched ``_convert``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors import safe_open

from llmrl.core.errors import MissingExtraError
from llmrl.models import DEFAULT_MODEL, cache_root, ensure_converted, gguf_cache
from llmrl.models.gguf_cache import converted_dir_for
from llmrl.models.spec import resolve_spec


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty LLMRL_CACHE for one test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMRL_CACHE", str(cache))
    return cache


@pytest.fixture
def fake_gguf(tmp_path: Path) -> Path:
    file = tmp_path / "weights" / "fake-model.gguf"
    file.parent.mkdir()
    file.write_bytes(b"GGUF" + bytes(60))
    return file


@pytest.fixture(scope="module")
def real_converted(session_cache: Path) -> Path:
    """The default model converted for real, once per session, in the session cache."""
    target = ensure_converted(resolve_spec(DEFAULT_MODEL).location)
    assert target.parent == session_cache / "models"
    return target


def _entries(cache: Path) -> list[str]:
    models = cache / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def _fake_converter(calls: list[Path]):
    def convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        (out_dir / "config.json").write_text(json.dumps({"source": str(gguf_path)}))
        (out_dir / "model.safetensors").write_bytes(b"weights")

    return convert


def _hide_packages(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    """Make ``find_spec`` report ``missing`` as not installed, inside gguf_cache only."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        return None if name in missing else real(name, package)

    fake = SimpleNamespace(util=SimpleNamespace(find_spec=find_spec))
    monkeypatch.setattr(gguf_cache, "importlib", fake)


# (a) crash safety --------------------------------------------------------------------------------


def test_crash_mid_conversion_leaves_nothing_behind(
    own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Path] = []

    def crash(gguf_path: Path, out_dir: Path) -> None:
        seen.append(out_dir)
        (out_dir / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(gguf_cache, "_convert", crash)
    target = converted_dir_for(fake_gguf)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ensure_converted(fake_gguf)

    # The conversion was written to a hidden staging dir next to the target, not the target.
    (staging,) = seen
    assert staging.parent == target.parent
    assert staging.name.startswith(f".{target.name}.")
    assert staging.name.endswith(".tmp")
    assert not staging.exists()
    assert not target.exists()
    assert _entries(own_cache) == []

    # A later attempt converts from scratch rather than trusting leftovers.
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_converter(calls))
    assert ensure_converted(fake_gguf) == target
    assert len(calls) == 1


def test_fake_conversion_is_published_atomically(
    own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_converter(calls))

    target = ensure_converted(fake_gguf)

    assert target == converted_dir_for(fake_gguf)
    assert target.parent == own_cache / "models"
    assert target.name.startswith("fake-model-")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((target / "config.json").read_text()) == {"source": str(fake_gguf)}
    assert _entries(own_cache) == [target.name]  # staging dir renamed, not copied
    assert target.stat().st_mode & 0o777 == 0o755  # shared cache, not mkdtemp's 0o700

    # Reused on the next call: no second conversion.
    assert ensure_converted(str(fake_gguf)) == target
    assert len(calls) == 1


def test_a_cache_entry_without_weights_is_converted_again(
    own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_converter(calls))
    target = converted_dir_for(fake_gguf)
    target.mkdir(parents=True)
    (target / "tokenizer.json").write_text("{}")  # a tokenizer alone: no model to load

    assert ensure_converted(fake_gguf) == target
    assert len(calls) == 1
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert _entries(own_cache) == [target.name]  # the broken entry is gone


# (b) reuse of the real conversion ---------------------------------------------------------------


def test_second_call_does_not_convert_again(
    real_converted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_run(gguf_path: Path, out_dir: Path) -> None:
        raise AssertionError("_convert ran although the conversion is cached")

    monkeypatch.setattr(gguf_cache, "_convert", must_not_run)
    before = _entries(real_converted.parent.parent)
    gguf_path = resolve_spec(DEFAULT_MODEL).location
    assert ensure_converted(gguf_path) == real_converted
    assert ensure_converted(Path(gguf_path)) == real_converted
    assert _entries(real_converted.parent.parent) == before


# (c) cache key ---------------------------------------------------------------------------------


def test_cache_key_tracks_mtime(own_cache: Path, fake_gguf: Path) -> None:
    original = converted_dir_for(fake_gguf)
    assert converted_dir_for(fake_gguf) == original  # deterministic
    assert converted_dir_for(str(fake_gguf)) == original

    stat = fake_gguf.stat()
    os.utime(fake_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    touched = converted_dir_for(fake_gguf)
    assert touched != original
    assert touched.parent == original.parent
    assert touched.name.startswith("fake-model-")

    os.utime(fake_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert converted_dir_for(fake_gguf) == original


def test_cache_key_tracks_size_and_path(own_cache: Path, fake_gguf: Path) -> None:
    original = converted_dir_for(fake_gguf)
    stat = fake_gguf.stat()

    fake_gguf.write_bytes(fake_gguf.read_bytes() + b"more")
    os.utime(fake_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime, new size
    assert converted_dir_for(fake_gguf) != original

    copy = fake_gguf.parent.parent / "elsewhere" / fake_gguf.name
    copy.parent.mkdir()
    copy.write_bytes(fake_gguf.read_bytes())
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert converted_dir_for(copy) != converted_dir_for(fake_gguf)


def test_cache_key_follows_symlinks(own_cache: Path, fake_gguf: Path) -> None:
    link = fake_gguf.parent / "link.gguf"
    link.symlink_to(fake_gguf)
    assert converted_dir_for(link) == converted_dir_for(fake_gguf)


def test_new_mtime_means_a_new_conversion(
    own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_converter(calls))
    first = ensure_converted(fake_gguf)
    stat = fake_gguf.stat()
    os.utime(fake_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    second = ensure_converted(fake_gguf)
    assert second != first
    assert len(calls) == 2
    assert _entries(own_cache) == sorted([first.name, second.name])


# (d) cache location ----------------------------------------------------------------------------


def test_llmrl_cache_is_respected(
    tmp_path: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMRL_CACHE", str(tmp_path / "custom"))
    assert cache_root() == tmp_path / "custom"
    assert converted_dir_for(fake_gguf).parent == tmp_path / "custom" / "models"


def test_llmrl_cache_expands_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LLMRL_CACHE", "~/llmrl-cache")
    assert cache_root() == tmp_path / "llmrl-cache"


@pytest.mark.parametrize("value", [None, ""])
def test_default_cache_is_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    if value is None:
        monkeypatch.delenv("LLMRL_CACHE")
    else:
        monkeypatch.setenv("LLMRL_CACHE", value)
    assert cache_root() == tmp_path / ".cache" / "llmrl"


def test_session_cache_is_the_active_cache(session_cache: Path) -> None:
    # The suite must never touch the user's ~/.cache/llmrl.
    assert cache_root() == session_cache
    assert cache_root() != Path.home() / ".cache" / "llmrl"


# (e) missing optional dependencies -------------------------------------------------------------


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_missing_package_raises_missing_extra(
    package: str, own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_converter(calls))
    _hide_packages(monkeypatch, package)

    with pytest.raises(MissingExtraError, match=r"pip install 'llmrl\[local\]'") as excinfo:
        ensure_converted(fake_gguf)
    assert f"'{package}'" in str(excinfo.value)
    assert excinfo.value.package == package
    assert excinfo.value.extra == "local"
    assert isinstance(excinfo.value, ImportError)
    assert calls == []
    assert _entries(own_cache) == []


def test_cached_conversion_does_not_need_gguf(
    own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_converter(calls))
    target = ensure_converted(fake_gguf)
    _hide_packages(monkeypatch, "gguf", "accelerate")
    assert ensure_converted(fake_gguf) == target
    assert len(calls) == 1


def test_require_gguf_support_passes_when_installed() -> None:
    gguf_cache.require_gguf_support()  # the test environment has the [local] extra


# (f) concurrent conversions -------------------------------------------------------------------


def test_concurrent_winner_is_kept(
    own_cache: Path, fake_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = converted_dir_for(fake_gguf)

    def convert_while_another_process_wins(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"loser")
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"winner")

    monkeypatch.setattr(gguf_cache, "_convert", convert_while_another_process_wins)
    assert ensure_converted(fake_gguf) == target
    assert (target / "model.safetensors").read_bytes() == b"winner"
    assert _entries(own_cache) == [target.name]  # the loser's staging dir is gone


def test_publish_keeps_existing_target(tmp_path: Path) -> None:
    staging, target = tmp_path / ".t.x.tmp", tmp_path / "t"
    staging.mkdir()
    (staging / "f").write_text("staging")
    target.mkdir()
    (target / "f").write_text("target")
    gguf_cache._publish(staging, target)
    assert (target / "f").read_text() == "target"


def test_publish_moves_staging_into_place(tmp_path: Path) -> None:
    staging, target = tmp_path / ".t.x.tmp", tmp_path / "t"
    staging.mkdir()
    (staging / "f").write_text("staging")
    gguf_cache._publish(staging, target)
    assert (target / "f").read_text() == "staging"
    assert not staging.exists()


def test_publish_reraises_when_there_is_no_winner(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        gguf_cache._publish(tmp_path / "no-such-staging", tmp_path / "t")
    assert not (tmp_path / "t").exists()


# (g) what the real conversion produces ---------------------------------------------------------


def test_converted_directory_contents(real_converted: Path) -> None:
    names = {p.name for p in real_converted.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(name.endswith(".gguf") for name in names)

    config = json.loads((real_converted / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == 49152
    assert config["architectures"] == ["LlamaForCausalLM"]

    with safe_open(str(real_converted / "model.safetensors"), framework="pt") as weights:
        keys = list(weights.keys())
        assert "model.embed_tokens.weight" in keys
        assert weights.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
        assert weights.get_slice("model.embed_tokens.weight").get_dtype() == "F32"

    tokenizer_config = json.loads((real_converted / "tokenizer_config.json").read_text())
    chat_template = tokenizer_config.get("chat_template") or (
        (real_converted / "chat_template.jinja").read_text()
        if (real_converted / "chat_template.jinja").exists()
        else ""
    )
    assert "<|im_start|>" in chat_template


def test_converted_directory_has_no_staging_leftovers(real_converted: Path) -> None:
    assert not [p for p in real_converted.parent.iterdir() if p.name.endswith(".tmp")]


def test_missing_extra_error_survives_pickling() -> None:
    # Ray and multiprocessing ship exceptions between processes by pickling them.
    import pickle

    error = MissingExtraError("gguf", "local", "Loading a GGUF model")
    restored = pickle.loads(pickle.dumps(error))
    assert str(restored) == str(error)
    assert (restored.package, restored.extra) == ("gguf", "local")
