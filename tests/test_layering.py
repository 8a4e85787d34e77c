"""The package layers of ``llmrl/``: every import runs downward, and no packages import each other.

``LAYERS`` lists the packages bottom up (``../shared/DESIGN.md``, "Layers"). A module may import
from its own package, from any package of a lower layer, and from a package of its own layer
as long as no cycle between packages closes. Every import counts, inside functions too, except
those under ``if TYPE_CHECKING:``. ``flows/`` sits above all of them and no package imports it.

Each package's ``__init__`` docstring names its layer, so a reader of the code sees where it
sits; the test keeps those lines true.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # (name, its packages), bottom up
    ("shared helpers", ("core",)),
    (
        "data, models, topology, tracking",
        ("models", "topology", "config", "data", "tracking", "eval"),
    ),
    ("policies, envs, objectives", ("policies", "scorers", "envs", "objectives")),
    ("collectors, transports, per-rank training", ("transports", "collectors", "train")),
    ("runtime", ("runtime",)),
    ("stages and CLI", ("stages", "cli")),
]
LAYER_OF = {package: index for index, (_, packages) in enumerate(LAYERS) for package in packages}


def _package(module: str) -> str | None:
    """The ``llmrl`` package (or top-level module) of a dotted module name, None outside llmrl."""
    parts = module.split(".")
    if parts[0] == "flows":
        return "flows"
    if parts[0] != "llmrl" or len(parts) == 1:
        return None
    return parts[1]


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """The ids of every node under an ``if TYPE_CHECKING:`` block."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def package_imports(root: Path) -> list[tuple[str, str, str]]:
    """``(importing package, imported package, file:line)`` for every cross-package import
    under ``root/llmrl``."""
    found = []
    for file in sorted((root / "llmrl").rglob("*.py")):
        relative = file.relative_to(root)
        module = ".".join(relative.with_suffix("").parts)
        if file.name == "__init__.py":
            module = module.rsplit(".", 1)[0]
        source = _package(module)
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = module.split(".")
                    if file.name != "__init__.py":
                        base = base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    targets = [".".join([*base, node.module] if node.module else base)]
                else:
                    targets = [node.module or ""]
            else:
                continue
            for target in targets:
                imported = _package(target)
                if imported and imported != source:
                    found.append((source, imported, f"{relative}:{node.lineno}"))
    return found


def layering_violations(root: Path) -> list[str]:
    """Every import that runs upward, names an unlisted package, imports ``flows``, or closes a
    cycle between packages of one layer; empty when the layering holds."""
    problems = []
    edges: dict[str, dict[str, str]] = {}
    for source, imported, where in package_imports(root):
        if imported == "flows":
            problems.append(f"{where}: llmrl.{source} imports flows (the top, above every package)")
            continue
        unknown = [p for p in (source, imported) if p not in LAYER_OF]
        if unknown:
            problems.append(f"{where}: package {unknown[0]!r} is in no layer: add it to LAYERS")
            continue
        if LAYER_OF[imported] > LAYER_OF[source]:
            problems.append(
                f"{where}: llmrl.{source} (layer {LAYER_OF[source]}) imports llmrl.{imported} "
                f"(layer {LAYER_OF[imported]}): an upward import"
            )
        edges.setdefault(source, {}).setdefault(imported, where)
    problems.extend(_cycles(edges))
    return problems


def _cycles(edges: dict[str, dict[str, str]]) -> list[str]:
    """One line per cycle between packages, naming an import of each hop."""
    found, done = [], set()
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, {})):
                if nxt == start:
                    cycle = [*path, start]
                    key = frozenset(cycle)
                    if key not in done:
                        done.add(key)
                        hops = ", ".join(
                            f"{a} -> {b} ({edges[a][b]})" for a, b in itertools.pairwise(cycle)
                        )
                        found.append(f"a cycle between packages: {hops}")
                elif nxt not in path and len(path) < len(edges):
                    stack.append((nxt, [*path, nxt]))
    return found


def test_every_import_in_llmrl_runs_downward_and_no_packages_form_a_cycle():
    assert layering_violations(REPO) == []


def test_every_package_is_in_a_layer_and_its_docstring_names_it():
    packages = {p.name for p in (REPO / "llmrl").iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (REPO / "llmrl").glob("*.py") if p.stem != "__init__"}
    assert packages | modules == set(LAYER_OF)
    for package in sorted(packages):
        init = REPO / "llmrl" / package / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        layer = LAYER_OF[package]
        assert docstring and f"Layer {layer} ({LAYERS[layer][0]})" in docstring, package


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / "llmrl" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_an_upward_import_inside_a_function_is_reported_with_its_file_and_line(tmp_path):
    _tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/seeding.py": "def f():\n    from llmrl.runtime import x\n",
            "runtime/__init__.py": "",
        },
    )
    assert layering_violations(tmp_path) == [
        "llmrl/core/seeding.py:2: llmrl.core (layer 0) imports llmrl.runtime (layer 4): "
        "an upward import"
    ]


def test_a_cycle_within_a_layer_is_reported_and_type_checking_imports_are_not(tmp_path):
    _tree(
        tmp_path,
        {
            "policies/__init__.py": "from llmrl.envs import a\n",
            "envs/__init__.py": "from . import b\nfrom ..objectives import c\n",
            "objectives/__init__.py": "from llmrl.policies import d\n",
            "data/__init__.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from llmrl.runtime import e\n"
            ),
        },
    )
    problems = layering_violations(tmp_path)
    assert problems == [
        "a cycle between packages: envs -> objectives (llmrl/envs/__init__.py:2), "
        "objectives -> policies (llmrl/objectives/__init__.py:1), "
        "policies -> envs (llmrl/policies/__init__.py:1)"
    ]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"stages/x.py": "import flows.pipeline\n"}, "imports flows"),
        ({"widgets/__init__.py": "from llmrl.core import y\n"}, "package 'widgets' is in no layer"),
    ],
)
def test_flows_and_unlisted_packages_are_refused(tmp_path, files, expected):
    _tree(tmp_path, {"core/__init__.py": "", "stages/__init__.py": "", **files})
    problems = layering_violations(tmp_path)
    assert len(problems) == 1 and expected in problems[0]
