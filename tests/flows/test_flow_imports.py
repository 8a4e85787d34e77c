"""The deployed flow runs without torch: what the Dockerfile's `flow` image relies on.

The flow-run pod only orchestrates (stages run in their own pods), so its image holds `llmrl`
without dependencies plus pyproject's `flow` extra. Two checks keep it that way:

* every module of flows/ imports in a subprocess where torch and the other stage-only packages
  are blocked (``sys.modules[name] = None``), and the kubernetes launcher reads its topology;
* every import written in flows/, function-level ones included, comes from the standard library,
  from llmrl/flows, or from a distribution that the `flow` extra installs (its dependency closure,
  read from the installed packages' metadata).

The llmrl modules the flows use (config, topology, tracking) are covered at import time by the
first check; their function-level imports of stage-only packages (Ray placement groups,
matplotlib plots, pandas tables) run in the stage pods, not in the flow.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("flows", "llmrl")
# Installed for the stage images only; the flow image has none of them.
STAGE_ONLY = (
    "torch",
    "tensordict",
    "transformers",
    "safetensors",
    "accelerate",
    "peft",
    "gguf",
    "ray",
    "vllm",
    "matplotlib",
    "pandas",
)


def _import_check_script() -> str:
    return textwrap.dedent(
        f"""
        import importlib, pkgutil, sys
        for name in {STAGE_ONLY!r}:
            sys.modules[name] = None  # `import name` raises ImportError
        import flows
        for module in pkgutil.walk_packages(flows.__path__, "flows."):
            importlib.import_module(module.name)
        from flows.launchers.kubernetes import load_topology
        load_topology(None)
        """
    )


def test_flow_modules_import_without_torch(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _import_check_script()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr


def test_the_import_check_fails_on_a_torch_import(tmp_path):
    """The same script with a module that imports torch must fail (the block works)."""
    script = _import_check_script() + "\nimport torch\n"
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert result.returncode != 0
    assert "torch" in result.stderr


# ------------------------------------------------------------------------ static check of flows/


def _runtime_nodes(tree: ast.AST):
    """The AST nodes that run: `if TYPE_CHECKING:` bodies left out."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield child
                yield from _runtime_nodes(child)
            continue
        yield node
        yield from _runtime_nodes(node)


def third_party_imports(root: Path) -> dict[str, str]:
    """Top-level third-party module -> the first file under ``root`` that imports it, at any
    level (function bodies included, ``TYPE_CHECKING`` blocks not)."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in FIRST_PARTY and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(root.parent)))
    return found


@cache
def _flow_closure() -> frozenset[str]:
    """Canonical names of the distributions the `flow` extra installs (from installed metadata)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in extras["optional-dependencies"]["flow"]]
    found: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        found.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for text in requires:
            child = Requirement(text)
            wanted = ["", *sorted(requirement.extras)]
            if child.marker is None or any(child.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(child)
    return frozenset(found)


def test_flows_import_only_what_the_flow_extra_installs():
    closure = _flow_closure()
    assert "torch" not in closure
    owners = packages_distributions()
    outside = {}
    for top, where in sorted(third_party_imports(REPO / "flows").items()):
        dists = {canonicalize_name(d) for d in owners.get(top, [])}
        if not dists & closure:
            outside[top] = f"imported in {where}; installed by {sorted(dists) or '?'}"
    assert outside == {}, "add these to the `flow` extra or keep them out of flows/"


def test_the_static_check_sees_function_level_imports(tmp_path):
    """A lazy `import torch` inside a function is found; a TYPE_CHECKING import is not."""
    package = tmp_path / "flows"
    package.mkdir()
    (package / "helper.py").write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from llmrl.config import load_config\n"
        "if TYPE_CHECKING:\n    import safetensors\n"
        "def f():\n    import torch.nn\n"
    )
    assert third_party_imports(package) == {"torch": "flows/helper.py"}


@pytest.mark.parametrize("name", ["prefect", "mlflow-skinny", "kubernetes", "fastapi"])
def test_the_flow_extra_installs_the_orchestration_packages(name):
    assert canonicalize_name(name) in _flow_closure()
