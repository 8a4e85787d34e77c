"""Model folders that would run code (pickled weights, custom code, a hostile chat template)
are refused cleanly, and nothing from the folder runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.bad_input import PREPARED, Row, assert_fails_cleanly, stage


def _evil_pickle(_prepared: Path) -> bytes:
    """A pickle that creates ``PWNED`` in the working directory when it is unpickled."""
    import pickle

    class Payload:
        def __reduce__(self):
            return (open, ("PWNED", "w"))

    return pickle.dumps({"weight": Payload()}, protocol=2)


def _tokenizer_file(name: str) -> Callable[[Path], bytes]:
    """A file of SmolLM2's tokenizer, as ``save_pretrained`` writes it (saved once)."""

    def read(_prepared: Path) -> bytes:
        import functools
        import tempfile

        @functools.cache
        def saved() -> Path:
            from llmrl.models import load_tokenizer

            folder = Path(tempfile.mkdtemp(prefix="llmrl-tokenizer-"))
            load_tokenizer().save_pretrained(folder)
            return folder

        return (saved() / name).read_bytes()

    return read


_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64,
          "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2}  # fmt: skip
MODEL_ROWS = [
    Row("model-pickled-weights",
        {"data": PREPARED, "evil/config.json": json.dumps(_LLAMA),
         "evil/tokenizer.json": _tokenizer_file("tokenizer.json"),
         "evil/pytorch_model.bin": _evil_pickle},
        stage("eval", "--set", "model.name=./evil"),
        ("llmrl eval: error: model directory", "holds pickled weights (pytorch_model.bin)",
         "set model.allow_pickled_weights: true"), subprocess=True),
    Row("model-custom-code",
        {"data": PREPARED, "evil/evil.py": "open('PWNED', 'w')\n",
         "evil/config.json": json.dumps({**_LLAMA, "auto_map": {"AutoConfig": "evil.Config"}})},
        stage("sft", "--set", "model.name=./evil"),
        ("asks to run its own Python code (auto_map in config.json: AutoConfig -> evil.Config)",
         "set model.trust_remote_code: true")),
    Row("model-hostile-chat-template",
        {"data": PREPARED, "evil/config.json": json.dumps(_LLAMA),
         "evil/tokenizer_config.json": json.dumps({"chat_template": (
             "{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}")})},
        stage("eval", "--set", "model.name=./evil"),
        ("the chat template in tokenizer_config.json reaches the Python internal attribute",
         "no setting allows it")),
]  # fmt: skip


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in MODEL_ROWS])
def test_model_folder_that_would_run_code_is_refused(row: Row, work: Path, prepared_dataset: Path,
                                                     request, capsys):  # fmt: skip
    assert_fails_cleanly(row, work, prepared_dataset, request, capsys)
    assert not (work / "PWNED").exists(), "nothing from the folder ran"
