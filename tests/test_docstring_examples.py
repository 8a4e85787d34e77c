"""The library's docstring examples that do not run still match the code they show.

``>>>`` examples run as doctests (the root ``conftest.py``). The others are ``::`` blocks that
need a model, Ray, vLLM or a server. Each Python block is parsed and every call the test can
resolve is bound against the real signature: a class or function named in the module (or
imported by the block), and a method of a variable the block assigned from such a class
(``trainer = GRPOTrainer(...)`` then ``trainer.train(...)``). A missing required argument, an
unknown keyword or too many positional arguments fails here, naming the module and the line.
Blocks that are not Python (formulas, YAML, shell) are left alone.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO

LIBRARY = REPO / "llmrl"
NOT_IMPORTABLE_HERE = {  # vLLM: .venv-stage only
    LIBRARY / "policies" / "vllm_file_engine.py",
    LIBRARY / "policies" / "vllm_transfer.py",
}


def literal_blocks(docstring: str) -> list[str]:
    """The indented blocks after a line ending with ``::`` (reST literal blocks)."""
    lines, blocks, index = docstring.splitlines(), [], 0
    while index < len(lines):
        if not lines[index].rstrip().endswith("::"):
            index += 1
            continue
        body, index = [], index + 1
        while index < len(lines) and (not lines[index].strip() or lines[index].startswith(" ")):
            body.append(lines[index])
            index += 1
        blocks.append(textwrap.dedent("\n".join(body)).strip())
    return blocks


def python_blocks(path: Path) -> list[tuple[str, str]]:
    """(where, code) of every ``::`` block of ``path``'s docstrings that parses as Python."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for code in literal_blocks(ast.get_docstring(node, clean=True) or ""):
            if ">>>" in code:
                continue  # a doctest: it runs
            try:
                ast.parse(code)
            except SyntaxError:
                continue  # formulas, YAML, shell
            found.append((f"{path.relative_to(REPO)} ({getattr(node, 'name', 'module')})", code))
    return found


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _resolve(expr: ast.expr, names: dict[str, Any], classes: dict[str, type]) -> Any:
    """The object a call's target names, or None where the test cannot tell."""
    if isinstance(expr, ast.Name):
        return names.get(expr.id)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        owner = classes.get(expr.value.id) or names.get(expr.value.id)
        if inspect.isclass(owner) or inspect.ismodule(owner):
            return getattr(owner, expr.attr, None)
    return None


def _bind(target: Any, call: ast.Call, bound_method: bool) -> None:
    signature = inspect.signature(target)
    if bound_method:  # looked up on the class: ``self`` comes from the instance
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    args = [object()] * len(call.args)
    kwargs = {keyword.arg: object() for keyword in call.keywords}
    signature.bind(*args, **kwargs)


def call_errors(module: Any, code: str) -> list[str]:
    """What binding the block's resolvable calls against their signatures refuses."""
    names, classes, errors = dict(vars(module)), {}, []
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llmrl"):
            imported = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(imported, alias.name)
    for node in ast.walk(tree):  # variables assigned from a class: their methods are known
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = _resolve(node.value.func, names, classes)
            if inspect.isclass(made) and isinstance(node.targets[0], ast.Name):
                classes[node.targets[0].id] = made
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(
            keyword.arg is None for keyword in node.keywords
        ):
            continue  # *args / **kwargs: nothing to count
        target = _resolve(node.func, names, classes)
        if target is None or not callable(target):
            continue
        through_instance = (
            isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in classes
            and inspect.isfunction(target)
        )
        try:
            _bind(target, node, through_instance)
        except TypeError as error:
            errors.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {error}")
        except ValueError:
            continue  # a builtin without a signature
    return errors


EXAMPLES = [
    pytest.param(path, where, code, id=where)
    for path in sorted(LIBRARY.rglob("*.py"))
    if path not in NOT_IMPORTABLE_HERE
    for where, code in python_blocks(path)
]


def test_the_library_has_examples_to_check():
    assert len(EXAMPLES) >= 20


@pytest.mark.parametrize(("path", "where", "code"), EXAMPLES)
def test_example_calls_match_the_signatures(path: Path, where: str, code: str):
    module = importlib.import_module(_module_name(path))
    assert call_errors(module, code) == [], f"{where}: the example's calls do not fit the code"


def test_a_missing_argument_is_caught():
    """The check itself: ``GRPOTrainer``'s old example (``train`` without ``minibatches``)."""
    module = importlib.import_module("llmrl.train.grpo_trainer")
    stale = (
        "trainer = GRPOTrainer(config, model, tokenizer, total_steps=50)\n"
        "metrics = trainer.train(shard, step=1)\n"
    )
    (error,) = call_errors(module, stale)
    assert error.startswith("line 2: trainer.train(...)") and "minibatches" in error
    unknown = "GRPOTrainer(config, model, tokenizer, total_step=50)"
    assert "total_step" in call_errors(module, unknown)[0]
    current = stale.replace("train(shard, step=1)", "train(shard, minibatches=1, step=1)")
    assert call_errors(module, current) == []
