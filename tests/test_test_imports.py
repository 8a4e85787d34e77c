"""The tests' own layering: a test module imports helpers from its own folder, from
``tests/support`` or from a shared module at ``tests/`` (``tolerances.py``), never from a
``test_*`` module or another folder's conftest: fixtures shared across folders live in
``tests/conftest.py``, where pytest finds them without an import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SUPPORT = TESTS / "support"
SHARED_FIXTURES = "shared fixtures belong in tests/conftest.py"
SHARED_HELPERS = "shared helpers belong in tests/support"


def _imported_modules(path: Path, source: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every ``tests.*`` module ``source`` imports (relative imports
    resolved against ``path``; ``from tests.pkg import module`` names the module)."""
    found = []
    package = ["tests", *path.relative_to(TESTS).parent.parts]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            for alias in node.names:
                submodule = TESTS.joinpath(*module.split(".")[1:], f"{alias.name}.py")
                named = f"{module}.{alias.name}" if submodule.is_file() else module
                found.append((node.lineno, named))
    return [(line, name) for line, name in found if name == "tests" or name.startswith("tests.")]


def import_violations(path: Path, source: str) -> list[str]:
    """Why each of ``source``'s imports of the tests package breaks the rules (``path``: where
    the module lives, under ``tests/``)."""
    folder = path.parent
    problems = []
    for line, name in _imported_modules(path, source):
        parts = name.split(".")
        target_folder = TESTS.joinpath(*parts[1:])  # a package (``tests.flows``) is its folder
        if not target_folder.is_dir():
            target_folder = target_folder.parent
        where = f"{path.relative_to(TESTS.parent)}:{line}: {name}"
        if parts[-1].startswith("test_"):
            problems.append(f"{where}: imports a test module")
        elif parts[-1] == "conftest" and target_folder != folder:
            problems.append(f"{where}: imports another folder's conftest ({SHARED_FIXTURES})")
        elif parts[-1] != "conftest" and target_folder not in (folder, SUPPORT, TESTS):
            problems.append(f"{where}: imports another folder's helper ({SHARED_HELPERS})")
    return problems


def test_no_module_imports_a_test_module_or_another_folders_conftest():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        found += import_violations(path, path.read_text(encoding="utf-8"))
    assert found == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("flows/test_a.py", "from tests.topology.test_spec import chart_topology", "a test module"),
        ("runtime/test_a.py", "from tests.train.conftest import REPO", "another folder's conftest"),
        ("flows/test_a.py", "from tests.conftest import send_ctrl_c", "another folder's conftest"),
        ("objectives/test_a.py", "import tests.objectives.test_grpo", "a test module"),
        ("topology/test_a.py", "from .test_spec import INVALID", "a test module"),
        ("helm/test_a.py", "from tests.flows import rbac", "another folder's helper"),
        (
            "reliability/test_a.py",
            "from tests.flows.rbac import without",
            "another folder's helper",
        ),
        ("support/chart.py", "from tests.helm.test_chart import objects", "a test module"),
        ("flows/test_a.py", "from tests.flows.rbac import without", None),
        ("flows/test_a.py", "from . import rbac", None),
        ("gpu/test_a.py", "from tests.gpu.conftest import requires_cuda", None),
        ("runtime/test_a.py", "from tests.support.configs import stage_config", None),
        ("helm/test_a.py", "from tests.support import crd_schema", None),
        ("train/test_a.py", "from tests.tolerances import rounding_atol", None),
        ("train/test_a.py", "from llmrl.config import load_config", None),
    ],
)
def test_the_rules_catch_each_kind_of_import(module, source, expected):
    found = import_violations(TESTS / module, source)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and f"imports {expected}" in found[0]
