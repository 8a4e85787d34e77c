"""The API reference (docs-api/): its pages hold every name of ``llmrl.__all__`` and are what
docs-api/generate.py writes; MkDocs builds it with ``--strict``, so a docstring griffe cannot
parse, a cross-reference to nothing or a Sphinx role naming no object fails here, with the
build's output. The build takes seconds: griffe reads the source, nothing is imported."""

from __future__ import annotations

import importlib.util
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import llmrl

REPO = Path(__file__).resolve().parents[1]
API = REPO / "docs-api"
CONFIG = API / "mkdocs.yml"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_api_{name}", API / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(config: Path, site: Path) -> tuple[int, str]:
    """``mkdocs build --strict`` of ``config`` into ``site``: its exit code and output."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[int, str, Path]:
    site = tmp_path_factory.mktemp("api-docs")
    return (*build(CONFIG, site), site)


def test_the_reference_builds_strictly_without_a_warning(built):
    code, output, site = built
    assert code == 0, output
    assert "WARNING" not in output, output
    assert (site / "index.html").is_file()


def test_every_export_has_its_block_and_heading(built):
    """A ``:::`` block per name of ``llmrl.__all__``, at its defining module's path, rendered as
    a heading of that id: a new export cannot be left out."""
    _, _, site = built
    blocks = set()
    for page in (API / "pages").glob("*.md"):
        blocks |= set(re.findall(r"^::: (\S+)$", page.read_text(encoding="utf-8"), flags=re.M))
    wanted = {f"{llmrl._EXPORTS[name]}.{name}" for name in llmrl.__all__}
    assert blocks == wanted
    html = "".join(page.read_text(encoding="utf-8") for page in site.rglob("index.html"))
    assert [path for path in sorted(wanted) if f'id="{path}"' not in html] == []


def test_the_pages_are_what_generate_writes(tmp_path, monkeypatch):
    generate = _module("generate")
    assert generate.stale() == [], "run .venv/bin/python docs-api/generate.py"
    # a page left out, or one for a package that exports nothing, is stale
    monkeypatch.setattr(generate, "PAGES", tmp_path)
    shutil.copytree(API / "pages", tmp_path, dirs_exist_ok=True)
    (tmp_path / "objectives.md").unlink()
    (tmp_path / "widgets.md").write_text("# Widgets\n")
    assert generate.stale() == ["objectives.md", "widgets.md"]


def test_a_cross_reference_to_nothing_fails_the_build(tmp_path):
    """The same config on a copy of the pages plus one with a dangling reference: strict fails."""
    pages = tmp_path / "pages"
    shutil.copytree(API / "pages", pages)
    (pages / "broken.md").write_text("# Broken\n\nSee [`Gone`][llmrl.objectives.Gone].\n")
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    config["docs_dir"] = str(pages)
    (plugin,) = [entry for entry in config["plugins"] if isinstance(entry, dict)]
    python = plugin["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(REPO)]
    python["options"]["extensions"] = [str(API / "sphinx_roles.py")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    code, output = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert code != 0
    assert "llmrl.objectives.Gone" in output, output


@pytest.fixture(scope="module")
def roles():
    """docs-api/sphinx_roles.py run over llmrl as the build loads it."""
    import griffe

    extension = _module("sphinx_roles").SphinxRoles()
    loader = griffe.GriffeLoader(
        search_paths=[str(REPO)],
        allow_inspection=False,
        extensions=griffe.load_extensions(extension),
    )
    package = loader.load("llmrl")
    return extension, package


def test_sphinx_roles_become_links_to_rendered_objects_or_code(roles):
    _, package = roles
    loss = package["objectives.grpo.GRPOLoss"].docstring.value
    assert ":class:" not in loss and ":meth:" not in loss
    # a rendered target is a cross-reference, written with the name the role shows
    assert "[`GRPOLossOutput`][llmrl.objectives.grpo_objective.GRPOLossOutput]" not in loss
    assert "`GRPOLossOutput`" in loss  # not exported: code
    collector = package["collectors.llm_collector"].docstring.value
    assert "[`PolicyVersion`][llmrl.envs.transforms.policy_version.PolicyVersion]" in collector
    assert "llmrl.collectors.llm_collector.LLMCollector.update_policy_weights_" in collector
    # reST's "Example::" before a literal block, as Sphinx shows it
    tracker = package["tracking.tracker.Tracker"].docstring.value
    assert "Example::" not in tracker and "Example:\n" in tracker


def test_a_role_naming_no_object_in_a_rendered_docstring_is_a_warning(roles, caplog):
    extension, package = roles
    collector = package["collectors.llm_collector.LLMCollector"]
    match = re.search(r":class:`([^`]+)`", ":class:`~llmrl.collectors.Gone`")
    with caplog.at_level(logging.WARNING, logger="griffe"):
        assert extension.rewrite(collector, match, shown=True) == "`Gone`"
    assert "llmrl.collectors.Gone" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="griffe"):
        assert extension.rewrite(collector, match, shown=False) == "`Gone`"
    assert caplog.text == ""
