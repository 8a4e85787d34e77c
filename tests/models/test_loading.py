"""load_model / load_tokenizer from a known name, a GGUF path and a local directory.

The default model is converted once per session (session cache); every load here reads that
conversion, which takes about a second, so none of these tests is marked slow.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from llmrl.models import (
    DEFAULT_MODEL,
    ModelSpecError,
    as_dtype,
    gguf_cache,
    load_model,
    load_tokenizer,
    resolve_spec,
)
from llmrl.models.errors import UnsafeModelError
from llmrl.models.folder_checks import template_problem
from llmrl.models.gguf_cache import converted_dir_for

VOCAB = 49152
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol():
    """The real SmolLM2-135M-Instruct, loaded by name (converting it if this runs first)."""
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def tiny_dir(tiny, tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tiny model and SmolLM2's tokenizer, saved as a Hugging Face directory."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _prompt_ids(tokenizer) -> torch.Tensor:
    encoded = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return encoded["input_ids"]


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for name, tensor in state_a.items():
        assert tensor.dtype == state_b[name].dtype, name
        assert torch.equal(tensor, state_b[name]), name


# The real default model -------------------------------------------------------------------------


def test_default_model_by_name(smol, tokenizer) -> None:
    assert smol.training is False
    assert not any(module.training for module in smol.modules())
    assert smol.dtype == torch.float32
    assert smol.device.type == "cpu"
    assert smol.config.vocab_size == VOCAB == len(tokenizer)
    # an integer count against the 135M of the model's name: 1% tells it from other sizes
    assert sum(p.numel() for p in smol.parameters()) == pytest.approx(134.5e6, rel=0.01)

    ids = _prompt_ids(tokenizer)
    with torch.no_grad():
        logits = smol(ids).logits
    assert logits.shape == (1, ids.shape[1], VOCAB)
    assert torch.isfinite(logits).all()


def test_default_model_answers_sensibly(smol, tokenizer) -> None:
    ids = _prompt_ids(tokenizer)
    with torch.no_grad():
        generated = smol.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_default_spec_is_the_default_model(smol) -> None:
    _assert_same_weights(load_model(), smol)
    assert (
        load_tokenizer()("hello")["input_ids"]
        == load_tokenizer(DEFAULT_MODEL)("hello")["input_ids"]
    )


def test_tokenizer_by_name_has_chat_template(tokenizer) -> None:
    assert len(tokenizer) == VOCAB
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_gguf_path_reuses_the_named_cache_entry(
    smol, session_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf_path = resolve_spec(DEFAULT_MODEL).location
    converted = converted_dir_for(gguf_path)
    assert converted.is_dir()
    assert converted.parent == session_cache / "models"
    entries = sorted(p.name for p in converted.parent.iterdir())

    def must_not_run(*args: object) -> None:
        raise AssertionError("loading by path converted the GGUF a second time")

    monkeypatch.setattr(gguf_cache, "_convert", must_not_run)
    by_path = load_model(gguf_path)
    assert sorted(p.name for p in converted.parent.iterdir()) == entries
    _assert_same_weights(by_path, smol)
    assert (
        load_tokenizer(gguf_path)("hi there")["input_ids"]
        == load_tokenizer(DEFAULT_MODEL)("hi there")["input_ids"]
    )


# Local directories, dtypes and devices ----------------------------------------------------------


def test_local_directory_round_trip(tiny, tiny_dir: Path) -> None:
    loaded = load_model(str(tiny_dir))
    assert loaded.training is False
    _assert_same_weights(loaded, tiny)

    ids = torch.tensor([[1, 42, 4242, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, tiny(ids).logits)


def test_local_directory_tokenizer(tokenizer, tiny_dir: Path) -> None:
    loaded = load_tokenizer(tiny_dir)
    text = "Hello, world! <|im_start|>user\nÇa va? 1234<|im_end|>"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.pad_token_id == tokenizer.pad_token_id
    assert loaded.apply_chat_template(QUESTION, tokenize=False) == tokenizer.apply_chat_template(
        QUESTION, tokenize=False
    )


@pytest.mark.parametrize("dtype", ["bfloat16", torch.bfloat16])
def test_bfloat16_request(tiny, tiny_dir: Path, dtype: str | torch.dtype) -> None:
    loaded = load_model(tiny_dir, dtype=dtype)
    assert loaded.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.parameters())
    reference = tiny.state_dict()["model.embed_tokens.weight"].to(torch.bfloat16)
    assert torch.equal(loaded.state_dict()["model.embed_tokens.weight"], reference)
    with torch.no_grad():
        logits = loaded(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, VOCAB)


def test_device_argument(tiny_dir: Path) -> None:
    loaded = load_model(tiny_dir, device=torch.device("cpu"))
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}


@pytest.mark.parametrize("bad", ["int8", "nope", "long", "complex64", "e", ""])
def test_bad_dtype_names_the_dtype(tiny_dir: Path, bad: str) -> None:
    with pytest.raises(ValueError, match=rf"dtype {bad!r} is not a torch floating-point dtype"):
        load_model(tiny_dir, dtype=bad)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)],
)
def test_as_dtype_names(name: str, expected: torch.dtype) -> None:
    assert as_dtype(name) is expected
    assert as_dtype(expected) is expected


def test_bad_spec_fails_before_loading() -> None:
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_model("/nope/x.gguf")
    with pytest.raises(ModelSpecError, match="unknown model name"):
        load_tokenizer("no-such-model")


@pytest.mark.parametrize("bad", [torch.int8, torch.bool, torch.int64])
def test_non_float_torch_dtypes_are_rejected(bad: torch.dtype) -> None:
    with pytest.raises(ValueError, match="is not a torch floating-point dtype"):
        as_dtype(bad)


# Folders that would run code: refused before anything in them runs --------------------------
MARKER = "PWNED"


class _Payload:
    """Unpickling this runs ``open(path, "w")``: the marker file appears."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _config_only(folder: Path, **extra) -> Path:
    folder.mkdir()
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64,
              "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, **extra}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_pickled_weights_are_refused_and_never_unpickled(tmp_path: Path) -> None:
    folder = _config_only(tmp_path / "pickled")
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"weight": _Payload(tmp_path / MARKER)}, f, protocol=2)
    with pytest.raises(UnsafeModelError, match=r"pickled weights \(pytorch_model.bin\)") as error:
        load_model(folder)
    assert "model.allow_pickled_weights: true" in str(error.value)
    assert not (tmp_path / MARKER).exists(), "the pickle was not loaded"
    # allowed: transformers reads it with torch's weights_only unpickler, which refuses `open`
    with pytest.raises(Exception, match=r"(?i)weights_only|unpickl|unsupported"):
        load_model(folder, allow_pickled_weights=True)
    assert not (tmp_path / MARKER).exists()


def test_custom_code_is_refused_and_never_imported(tmp_path: Path, tiny_dir: Path) -> None:
    folder = tmp_path / "custom"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(tmp_path / MARKER)!r}, 'w')\n")
    with pytest.raises(UnsafeModelError, match=r"asks to run its own Python code \(auto_map in"):
        load_model(folder)
    with pytest.raises(UnsafeModelError, match=r"set model\.trust_remote_code: true"):
        load_tokenizer(folder)
    assert not (tmp_path / MARKER).exists(), "evil.py was not imported"


HOSTILE_TEMPLATES = {
    "globals": "{{ cycler.__init__.__globals__.os.system('touch " + MARKER + "') }}",
    "joiner": "{{ joiner.__init__.__globals__ }}",
    "namespace": "{% set ns = namespace.__init__ %}{{ ns }}",
    "subclasses": "{{ ().__class__.__base__.__subclasses__() }}",
    "attr-filter": "{{ ''|attr('__class__') }}",
    "computed-attr": "{{ ''|attr('_' * 2 ~ 'class' ~ '_' * 2) }}",
    "item": "{{ messages['__class__'] }}",
    "lipsum": "{{ lipsum.func_globals }}",
    "generator": "{% for m in messages %}{{ loop.gi_frame }}{% endfor %}",
    "mutate": "{% set x = [] %}{{ x.append(1) }}",
    "power": "{{ 'a' * 9 ** 99 }}",
    "generation-tag": "{% generation %}{{ self.__init__ }}{% endgeneration %}",
}


@pytest.mark.parametrize("template", HOSTILE_TEMPLATES.values(), ids=HOSTILE_TEMPLATES.keys())
def test_a_hostile_chat_template_is_refused(tmp_path: Path, tiny_dir: Path, template) -> None:
    folder = tmp_path / "templated"
    shutil.copytree(tiny_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**settings, "chat_template": template})
    )
    with pytest.raises(UnsafeModelError, match=r"the chat template in tokenizer_config.json"):
        load_tokenizer(folder)
    with pytest.raises(UnsafeModelError, match="no setting allows it"):
        load_model(folder)
    assert not list(tmp_path.rglob(MARKER))


def test_usual_chat_templates_pass(tokenizer) -> None:
    qwen_like = (
        "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
        "{%- for message in messages[::-1] %}{%- set ns.last_query_index = loop.index0 %}"
        "{%- endfor %}{% generation %}{{ message.content|trim }}{% endgeneration %}"
        "{{ cycler('a', 'b').next() }}{{ tools|tojson(indent=2) }}"
        "{{ raise_exception('no') if false }}"
    )
    assert template_problem(tokenizer.chat_template) is None, "SmolLM2's"
    assert template_problem(qwen_like) is None
    assert "not valid Jinja" in template_problem("{% for %}")
