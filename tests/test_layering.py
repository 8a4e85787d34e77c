"""The package layers of ``llmrl/``: every import runs downward, and no packages import each other.

``LAYERS`` lists the packages bottom up (``../shared/DESIGN.md``, "Layers"). A module may import
from its own package, from any package of a lower layer, and from a package of its own layer
as long as no cycle between packages closes. Every import counts, inside functions too, except
those under ``if TYPE_CHECKING:``. ``flows/`` and ``deploy/`` (the chart's values model and
generated files) sit above all of them and no package imports them. Nor may two modules of
``llmrl`` import each other, directly or around a longer loop, even inside a function: a
deferred import that hides such a loop is refused like a module-level one.

Each package's ``__init__`` docstring names its layer, so a reader of the code sees where it
sits; the test keeps those lines true.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
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
ABOVE_THE_LIBRARY = ("flows", "deploy")
"""Top-level packages that import llmrl and that nothing in llmrl imports."""
LAYER_OF = {package: index for index, (_, packages) in enumerate(LAYERS) for package in packages}


def _package(module: str) -> str | None:
    """The ``llmrl`` package (or top-level module) of a dotted module name, None outside llmrl."""
    parts = module.split(".")
    if parts[0] in ABOVE_THE_LIBRARY:
        return parts[0]
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


def _imports(root: Path) -> Iterator[tuple[str, Path, ast.stmt, str]]:
    """``(importing module, its file relative to root, import node, imported module)`` for every
    import under ``root/llmrl`` (``TYPE_CHECKING`` blocks aside; relative imports resolved);
    ``from m import a, b`` names ``m`` once."""
    for file in sorted((root / "llmrl").rglob("*.py")):
        relative = file.relative_to(root)
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield module, relative, node, alias.name
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = module.split(".")
                    if file.name != "__init__.py":
                        base = base[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    yield module, relative, node, ".".join([*base, node.module or ""]).strip(".")
                else:
                    yield module, relative, node, node.module or ""


def package_imports(root: Path) -> list[tuple[str, str, str]]:
    """``(importing package, imported package, file:line)`` for every cross-package import
    under ``root/llmrl``."""
    found = []
    for module, relative, node, target in _imports(root):
        source, imported = _package(module), _package(target)
        if imported and imported != source:
            found.append((source, imported, f"{relative}:{node.lineno}"))
    return found


def layering_violations(root: Path) -> list[str]:
    """Every import that runs upward, names an unlisted package, imports ``flows``, or closes a
    cycle between packages of one layer; empty when the layering holds."""
    problems = []
    edges: dict[str, dict[str, str]] = {}
    for source, imported, where in package_imports(root):
        if imported in ABOVE_THE_LIBRARY:
            problems.append(
                f"{where}: llmrl.{source} imports {imported} (the top, above every package)"
            )
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


def module_cycles(root: Path) -> list[list[str]]:
    """Each set of ``llmrl`` modules that import one another around a loop (sorted), with every
    import counted (inside functions too; ``TYPE_CHECKING`` aside). ``from pkg import name``
    is an import of the module ``pkg.name`` when there is one, else of ``pkg``."""
    files = {
        ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        for f in (root / "llmrl").rglob("*.py")
    }
    edges: dict[str, set[str]] = {}
    for module, _, node, target in _imports(root):
        if isinstance(node, ast.ImportFrom):  # an imported name may be a module of its own
            names = [f"{target}.{alias.name}" for alias in node.names]
            targets = [name if name in files else target for name in names]
        else:
            targets = [target]
        edges.setdefault(module, set()).update(t for t in targets if t in files and t != module)
    # strongly connected components (Tarjan), iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(files):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return cycles


def test_no_modules_of_llmrl_import_each_other():
    """The topology's sections imported its spec inside a function while the spec imported the
    sections (found by a review of 5340e0d); any such loop is refused."""
    assert module_cycles(REPO) == []


def test_a_loop_hidden_in_a_function_is_a_cycle(tmp_path):
    _tree(
        tmp_path,
        {
            "topology/__init__.py": "",
            "topology/spec.py": "from llmrl.topology.sections import S\n",
            "topology/sections.py": "def f():\n    from llmrl.topology.spec import T\n",
            "topology/rules.py": "from llmrl.topology import spec\n",
        },
    )
    assert module_cycles(tmp_path) == [["llmrl.topology.sections", "llmrl.topology.spec"]]


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
        ({"topology/x.py": "from deploy.chart_values import ChartValues\n"}, "imports deploy"),
        ({"widgets/__init__.py": "from llmrl.core import y\n"}, "package 'widgets' is in no layer"),
    ],
)
def test_flows_and_unlisted_packages_are_refused(tmp_path, files, expected):
    _tree(tmp_path, {"core/__init__.py": "", "stages/__init__.py": "", **files})
    problems = layering_violations(tmp_path)
    assert len(problems) == 1 and expected in problems[0]
