"""Write pyproject.toml's requirements as pip requirement files, one per group (images' build).

    python requirements.py PYPROJECT OUT_DIR

``core.txt`` holds ``project.dependencies``; ``<extra>.txt`` each optional-dependencies extra.
An extra that names llmrl's own extras (``llmrl[stage]``) gets their requirements in place of
that line: the image installs requirements before llmrl itself, from an index that has no llmrl.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

SELF = re.compile(r"^\s*(?P<name>[A-Za-z0-9._-]+)\s*\[(?P<extras>[^\]]+)\]\s*$")


def requirement_groups(project: dict) -> dict[str, list[str]]:
    """``{group: requirements}`` with llmrl's self-references expanded (recursively)."""
    extras: dict[str, list[str]] = project.get("optional-dependencies", {})
    name = project["name"].lower()

    def expand(group: str, seen: tuple[str, ...]) -> list[str]:
        if group in seen:
            raise ValueError(f"extra {group!r} names itself through {' -> '.join(seen)}")
        found: list[str] = []
        for requirement in extras[group]:
            match = SELF.match(requirement)
            if match and match["name"].lower().replace("_", "-") == name:
                for extra in (e.strip() for e in match["extras"].split(",")):
                    if extra not in extras:
                        raise ValueError(f"extra {group!r} names unknown extra {name}[{extra}]")
                    found += [r for r in expand(extra, (*seen, group)) if r not in found]
            elif requirement not in found:
                found.append(requirement)
        return found

    return {"core": list(project["dependencies"]), **{g: expand(g, ()) for g in extras}}


def main(pyproject: str, out_dir: str) -> None:
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for group, requirements in requirement_groups(project).items():
        (out / f"{group}.txt").write_text("".join(r + "\n" for r in requirements))


if __name__ == "__main__":
    main(*sys.argv[1:])
