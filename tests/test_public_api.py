"""The names ``import llmrl`` exports: each resolves, lazily, to the object its module defines,
and importing the package imports no torch (the flow image has none and imports llmrl.config,
which runs llmrl/__init__.py first)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import llmrl

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", llmrl.__all__)
def test_every_exported_name_is_the_object_its_module_defines(name):
    module = importlib.import_module(llmrl._EXPORTS[name])
    value = getattr(llmrl, name)
    assert value is getattr(module, name)
    if inspect.isclass(value) or inspect.isfunction(value):  # defined there, not re-exported
        assert value.__module__ == module.__name__


def test_all_is_the_export_table_sorted_and_dir_lists_it():
    assert llmrl.__all__ == sorted(llmrl._EXPORTS)
    assert 30 <= len(llmrl.__all__) <= 60  # a researcher's surface, not every public name
    assert set(llmrl.__all__) <= set(dir(llmrl))


def test_an_unknown_name_raises_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'llmrl' has no attribute 'GRPOLos'"):
        _ = llmrl.GRPOLos
    assert not hasattr(llmrl, "no_such_name")
    with pytest.raises(ImportError, match="no_such_name"):
        exec("from llmrl import no_such_name", {})


def test_importing_llmrl_imports_no_torch_until_a_name_is_used():
    code = (
        "import sys\n"
        "import llmrl\n"
        "assert 'torch' not in sys.modules, 'import llmrl imported torch'\n"
        "assert len(dir(llmrl)) >= len(llmrl.__all__)\n"
        "llmrl.Topology, llmrl.GRPOConfig, llmrl.load_config\n"
        "assert 'torch' not in sys.modules, 'the configs and the topology imported torch'\n"
        "llmrl.GRPOLoss\n"
        "assert 'torch' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_type_checking_imports_are_the_export_table():
    """What an IDE sees (the ``if TYPE_CHECKING:`` block) is what ``__getattr__`` imports."""
    tree = ast.parse((REPO / "llmrl" / "__init__.py").read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    )
    imported = {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == llmrl._EXPORTS
