"""Writes the API reference's pages (docs-api/pages/) from ``llmrl.__all__``.

One page per llmrl package, one ``:::`` block (mkdocstrings) per public name, at the path of the
module that defines it (``llmrl._EXPORTS``), and an index linking every name. Run it after
adding or removing an export::

    .venv/bin/python docs-api/generate.py           # rewrite the pages
    .venv/bin/python docs-api/generate.py --check   # exit 1 when they are out of date

tests/test_api_reference.py runs the check and builds the pages --strict.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PAGES = ROOT / "pages"
REPO = ROOT.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # this checkout's llmrl, whatever is installed

import llmrl  # noqa: E402  (cheap: each name is imported on first access, none is here)

# The packages in the order of a loop's parts, each with its page's title.
PACKAGES: dict[str, str] = {
    "data": "The chat data model",
    "models": "Models and tokenizers",
    "policies": "Policies",
    "envs": "Environments, transforms and tasks",
    "collectors": "Collectors",
    "objectives": "Losses and advantages",
    "transports": "Weight sync",
    "train": "Training on one rank",
    "runtime": "GRPO in one process",
    "config": "Stage configs",
    "core": "Config loading",
    "topology": "Topology",
    "tracking": "Tracking",
}

GENERATED = "<!-- written by docs-api/generate.py from llmrl.__all__: do not edit -->"


def grouped() -> dict[str, list[tuple[str, str]]]:
    """``package -> [(name, its object's full path)]`` for every name of ``llmrl.__all__``,
    packages in ``PACKAGES`` order, names in the order ``llmrl._EXPORTS`` lists them."""
    groups: dict[str, list[tuple[str, str]]] = {package: [] for package in PACKAGES}
    for name in sorted(llmrl.__all__, key=list(llmrl._EXPORTS).index):
        module = llmrl._EXPORTS[name]
        package = module.split(".")[1]
        if package not in groups:
            raise SystemExit(f"{name} ({module}): add its package {package!r} to PACKAGES")
        groups[package].append((name, f"{module}.{name}"))
    return {package: names for package, names in groups.items() if names}


def pages() -> dict[str, str]:
    """Every page's file name and text."""
    groups = grouped()
    rows = [
        f"| [{PACKAGES[package]}]({package}.md) | "
        + ", ".join(f"[`{name}`][{path}]" for name, path in names)
        + " |"
        for package, names in groups.items()
    ]
    index = [
        "# llmrl API reference",
        "",
        GENERATED,
        "",
        "Every name `import llmrl` exports (`llmrl.__all__`), from its docstring. Each is",
        "importable from the package (`from llmrl import GRPOLoss, MCAdvantage`) and lives in the",
        "module its heading's path names. A loop built from them: `docs/grpo-loop-torchrl.md`.",
        "",
        "| page | names |",
        "| --- | --- |",
        *rows,
        "",
    ]
    result = {"index.md": "\n".join(index)}
    for package, names in groups.items():
        lines = [f"# {PACKAGES[package]}: `llmrl.{package}`", "", GENERATED, ""]
        for _, path in names:
            lines += [f"::: {path}", ""]
        result[f"{package}.md"] = "\n".join(lines)
    return result


def stale() -> list[str]:
    """The pages that differ from what :func:`pages` writes, and the ones it would not write."""
    wanted = pages()
    found = {path.name for path in PAGES.glob("*.md")}
    differ = [
        name
        for name, text in wanted.items()
        if not (PAGES / name).is_file() or (PAGES / name).read_text(encoding="utf-8") != text
    ]
    return sorted(set(differ) | (found - set(wanted)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        if out_of_date:
            print(f"stale API pages: {', '.join(out_of_date)}; run docs-api/generate.py")
        return 1 if out_of_date else 0
    PAGES.mkdir(exist_ok=True)
    for stray in PAGES.glob("*.md"):
        stray.unlink()
    for name, text in pages().items():
        (PAGES / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
