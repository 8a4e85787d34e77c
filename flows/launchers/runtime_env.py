"""The user's own code on every process that runs it: :class:`RayRuntimeEnv`, the pipeline's
``runtime_env`` parameter, in Ray's own spelling (``pip``, ``py_modules``, ``working_dir``,
``env_vars``).

A user's package (their task class, their reward functions) runs in the prepare and eval
stages, in SFT's data loading, and in the GRPO stage's driver and env workers. Each launcher
carries the one setting to where that code runs:

- **RayJob** (``sft``, ``grpo``; the driver and every actor): the RayJob's ``runtimeEnvYAML``
  (Ray's ``runtime_env`` of the job) with llmrl's own variables added to its ``env_vars``. Ray
  installs ``pip`` on each node and ships ``py_modules`` and ``working_dir``. Local paths are
  read and uploaded by KubeRay's submitter pod (``ray job submit``), which then mounts the
  shared claim: put the code there (or in the image).
- **Job** (``prepare``, ``eval``; no Ray): an init container installs the ``pip`` packages
  (and ``py_modules`` wheels) into an ``emptyDir`` on top of the image's environment, never
  replacing what the image holds (:func:`pip_install_script`); ``py_modules`` folders and
  ``working_dir`` go on ``PYTHONPATH`` from where the pod sees them (the shared claim or the
  image); ``env_vars`` become the container's env. Remote URIs (``s3://.../pkg.zip``) only Ray
  can fetch: they are refused (:func:`job_code`).
- **local launcher**: ``py_modules`` folders and ``working_dir`` on the stage process's
  ``PYTHONPATH``, ``env_vars`` in its environment, and the whole runtime_env handed to the Ray
  the stage starts (``$LLMRL_RAY_RUNTIME_ENV``, :mod:`llmrl.runtime.ray_cluster`), so
  ``py_modules`` reach the actors the way they do on the cluster. ``pip``, wheels and remote
  URIs are refused (:func:`local_runtime_env`): install those into the environment.

The flow-run pod runs no user code (it reads configs and launches the stages), so it needs
none of this.

``env_vars`` never override a variable llmrl sets (MLflow, the result file, the platform's
``kubernetes.env``): a clash is refused, naming the variable. ``PYTHONPATH`` is llmrl's to
compose from ``py_modules`` and ``working_dir``.

For production, the code belongs in an image built ``FROM`` llmrl's (``docs/own-task.md``):
nothing is installed at start, and no runtime_env is needed.

Example::

    RayRuntimeEnv(py_modules=["/shared/code/my_pkg"], env_vars={"MY_API_URL": "http://svc"})
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

RUNTIME_ENV_FIELDS: tuple[str, ...] = ("pip", "py_modules", "working_dir", "env_vars")
"""The fields of Ray's ``runtime_env`` llmrl passes on (Ray's spelling)."""
REMOTE_SCHEMES: tuple[str, ...] = ("http", "https", "s3", "gs", "azure", "abfss", "file")
"""URI schemes Ray downloads ``py_modules`` (a .zip or .whl) and ``working_dir`` (a .zip) from."""
LOCAL_SCHEME = "local"
"""Ray's ``local:///path``: a folder already present on every node (nothing uploaded)."""
USER_PACKAGES_DIR = "/opt/llmrl/user-packages"
"""Where a Job's init container installs the ``pip`` packages (an ``emptyDir``)."""
USER_SITE_PACKAGES = f"{USER_PACKAGES_DIR}/site-packages"
"""The link to their ``site-packages`` folder that goes on the stage's ``PYTHONPATH``."""
PIP_INSTALL_CPUS, PIP_INSTALL_MEMORY_GB = 1.0, 2.0
"""Resources of that init container (pip resolving and unpacking wheels)."""
PYTHONPATH = "PYTHONPATH"

Kind = Literal["folder", "wheel", "remote"]


class PipOptions(BaseModel):
    """Ray's mapping form of ``pip``."""

    model_config = ConfigDict(extra="forbid")

    packages: list[str] = Field(min_length=1, description="requirement specifiers")
    pip_check: bool = Field(False, description="run `pip check` after installing")
    pip_version: str | None = Field(
        None, description="pip version Ray installs first (Ray only; Jobs use the image's pip)"
    )
    pip_install_options: list[str] | None = Field(
        None, description="extra `pip install` options, e.g. ['--index-url', 'https://...']"
    )


class RayRuntimeEnv(BaseModel):
    """The user's code and settings for every process of a run (Ray's ``runtime_env`` keys).

    - ``py_modules``: folders of Python packages (``/shared/code/my_pkg``), wheels (``.whl``),
      or on a Ray cluster remote ``.zip``/``.whl`` URIs; ``local:///path`` for a folder every
      node already has.
    - ``working_dir``: a folder (or a remote ``.zip``) that becomes the workers' working
      directory and is importable.
    - ``pip``: requirement specifiers (a list, or Ray's ``{packages: [...], pip_check, ...}``).
    - ``env_vars``: environment variables of every stage process and actor.

    Example::

        RayRuntimeEnv.model_validate({"py_modules": ["/shared/code/my_pkg"]}).to_ray()
        # {'py_modules': ['/shared/code/my_pkg']}
    """

    model_config = ConfigDict(extra="forbid")

    pip: list[str] | PipOptions | None = Field(
        None,
        description="pip requirements installed for the stage processes and Ray workers "
        "(kubernetes launcher only; locally, install them into the environment)",
    )
    py_modules: list[str] = Field(
        default_factory=list,
        description="folders of Python packages (or wheels, or remote .zip/.whl URIs on Ray) "
        "shipped to every stage process and Ray worker",
    )
    working_dir: str | None = Field(
        None, description="a folder (or remote .zip on Ray) that workers run in and import from"
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables of every stage process and Ray worker (never "
        "overriding llmrl's own)",
    )

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(RUNTIME_ENV_FIELDS))
            if unknown:
                raise ValueError(
                    f"unknown runtime_env field(s) {unknown}; llmrl passes Ray's "
                    f"{', '.join(RUNTIME_ENV_FIELDS)}"
                )
        return data

    @field_validator("pip", mode="before")
    @classmethod
    def _pip_packages(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                "give the requirements as a list (a requirements file would be read where the "
                "job is submitted, not where you are)"
            )
        if isinstance(value, list) and not value:
            return None
        if isinstance(value, Mapping):
            unknown = sorted(set(value) - set(PipOptions.model_fields))
            if unknown:
                raise ValueError(
                    f"unknown pip field(s) {unknown}; Ray's pip takes "
                    f"{', '.join(PipOptions.model_fields)}"
                )
            return PipOptions.model_validate(value)
        return value

    @field_validator("py_modules")
    @classmethod
    def _py_modules(cls, value: list[str]) -> list[str]:
        for index, entry in enumerate(value):
            _check_location(entry, f"py_modules[{index}]", (".zip", ".whl"))
        return value

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, value: str | None) -> str | None:
        if value is not None:
            _check_location(value, "working_dir", (".zip",))
            if location_kind(value) == "wheel":
                raise ValueError(f"working_dir {value!r}: a folder or a .zip, not a wheel")
        return value

    @field_validator("env_vars")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name or "=" in name or not name.replace("_", "a").isalnum():
                raise ValueError(f"env_vars: {name!r} is not an environment variable name")
            if name == PYTHONPATH:
                raise ValueError(
                    "env_vars: PYTHONPATH is composed by llmrl from py_modules and "
                    "working_dir; list your folders there"
                )
        return value

    # -- views

    @property
    def is_empty(self) -> bool:
        """Whether it asks for nothing."""
        return not (self.pip or self.py_modules or self.working_dir or self.env_vars)

    @property
    def pip_packages(self) -> list[str]:
        """The requirement specifiers of ``pip`` (either form)."""
        if self.pip is None:
            return []
        return list(self.pip.packages if isinstance(self.pip, PipOptions) else self.pip)

    def code_locations(self) -> list[tuple[str, str]]:
        """``(field, location)`` of every ``py_modules`` entry and of ``working_dir``."""
        found = [(f"py_modules[{i}]", entry) for i, entry in enumerate(self.py_modules)]
        if self.working_dir:
            found.append(("working_dir", self.working_dir))
        return found

    def has_local_paths(self) -> bool:
        """Whether Ray's submitting client must read (and upload) a path of its own disk."""
        return any(_is_plain_path(location) for _, location in self.code_locations())

    def to_ray(self, extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Ray's ``runtime_env`` mapping (empty fields left out), with ``extra_env`` (llmrl's
        own variables) added to ``env_vars``.

        Raises:
            ValueError: a variable of ``env_vars`` is one of ``extra_env``'s (named).
        """
        env_vars = merged_env(self.env_vars, extra_env or {})
        out: dict[str, Any] = {}
        if self.pip is not None:
            out["pip"] = (
                self.pip.model_dump(exclude_none=True)
                if isinstance(self.pip, PipOptions)
                else list(self.pip)
            )
        if self.py_modules:
            out["py_modules"] = list(self.py_modules)
        if self.working_dir:
            out["working_dir"] = self.working_dir
        if env_vars:
            out["env_vars"] = env_vars
        return out


def merged_env(
    user: Mapping[str, str], own: Mapping[str, str], reserved: Iterable[str] = ()
) -> dict[str, str]:
    """llmrl's variables ``own`` plus the user's ``env_vars``.

    Raises:
        ValueError: a user's variable is one of ``own`` or ``reserved`` (variables the pods
            get otherwise: the HF token, a role's env); never overridden, named.
    """
    clash = sorted(set(user) & {*own, *reserved})
    if clash:
        raise ValueError(
            f"runtime_env.env_vars: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} "
            "set by llmrl or the platform's kubernetes settings and cannot be overridden"
        )
    return {**own, **user}


def location_kind(location: str) -> Kind:
    """A ``py_modules`` / ``working_dir`` entry: a ``folder`` (a path or ``local://``), a
    ``wheel`` (a local ``.whl``) or a ``remote`` URI Ray downloads."""
    scheme = urlparse(location).scheme
    if scheme and scheme != LOCAL_SCHEME:
        return "remote"
    return "wheel" if location.endswith(".whl") else "folder"


def location_path(location: str) -> str:
    """The file-system path of a local entry (``local:///x`` -> ``/x``)."""
    if urlparse(location).scheme == LOCAL_SCHEME:
        return urlparse(location).path
    return location


def cluster_runtime_env(runtime_env: RayRuntimeEnv) -> RayRuntimeEnv:
    """``runtime_env`` checked for the kubernetes launcher.

    Raises:
        ValueError: a local path that is not absolute (there is no working directory of yours
            on the cluster), naming the field.
    """
    for field, location in runtime_env.code_locations():
        if location_kind(location) != "remote" and not location_path(location).startswith("/"):
            raise ValueError(
                f"runtime_env.{field}: {location!r} must be an absolute path where the pods see "
                "it (on the shared claim, or in the image)"
            )
    return runtime_env


def job_code(runtime_env: RayRuntimeEnv) -> tuple[list[str], list[str]]:
    """What a one-pod stage Job (no Ray) needs: ``(pip requirements, PYTHONPATH entries)``.

    ``py_modules`` wheels join the pip requirements; a folder's parent goes on ``PYTHONPATH``
    (so ``import my_pkg`` finds ``/shared/code/my_pkg``), ``working_dir`` itself too.

    Raises:
        ValueError: a remote URI (only Ray downloads those), naming the field.
    """
    requirements = runtime_env.pip_packages
    paths: list[str] = []
    for field, location in runtime_env.code_locations():
        kind = location_kind(location)
        if kind == "remote":
            raise ValueError(
                f"runtime_env.{field}: {location!r} is a URI only Ray can fetch, and the prepare "
                "and eval stages run as plain Jobs: put the code on the shared claim, give it "
                "as pip requirements, or build an image FROM llmrl's (docs/own-task.md)"
            )
        path = location_path(location)
        if kind == "wheel":
            requirements.append(path)
        elif field == "working_dir":
            paths.append(path)
        else:
            paths.append(str(PurePosixPath(path).parent))
    return requirements, list(dict.fromkeys(paths))


def local_runtime_env(runtime_env: RayRuntimeEnv, cwd: str | Path | None = None) -> RayRuntimeEnv:
    """``runtime_env`` for the local launcher: local paths made absolute (from ``cwd``, default
    this process's directory) and checked.

    Raises:
        ValueError: ``pip``, a wheel or a remote URI (the stage processes run in this Python
            environment: install those into it), or a folder that does not exist; names the
            field.
    """
    if runtime_env.pip is not None:
        raise ValueError(
            "runtime_env.pip: the local launcher runs the stages in this Python environment; "
            "install the packages into it (pip install -e ./my_pkg) or give the package's "
            "folder in py_modules"
        )
    base = Path(cwd) if cwd is not None else Path.cwd()
    update: dict[str, Any] = {"py_modules": []}
    for field, location in runtime_env.code_locations():
        kind = location_kind(location)
        if kind != "folder":
            raise ValueError(
                f"runtime_env.{field}: {location!r}: the local launcher takes folders; install "
                "a wheel or a remote package into this Python environment"
            )
        path = (base / location_path(location)).resolve()
        if not path.exists():
            raise ValueError(f"runtime_env.{field}: {path} does not exist")
        if field == "working_dir":
            update["working_dir"] = str(path)
        else:
            update["py_modules"].append(str(path))
    return runtime_env.model_copy(update=update)


def pip_install_script(
    runtime_env: RayRuntimeEnv, requirements: list[str], root: str = USER_PACKAGES_DIR
) -> str:
    """The shell script of a Job's init container: install ``requirements`` into ``root``
    (:data:`USER_PACKAGES_DIR`) on top of the image's environment.

    ``pip install --prefix`` sees what the image holds, and a constraint file of exactly those
    versions (``pip list --format=freeze``) keeps pip from replacing any of them (a requirement
    that needs another version fails the pod, naming it); only what is missing is installed.
    ``<root>/site-packages`` (:data:`USER_SITE_PACKAGES`) then links to the prefix's
    ``site-packages`` folder, which the stage container has on its ``PYTHONPATH``.
    """
    options, check = [], False
    if isinstance(runtime_env.pip, PipOptions):
        options, check = runtime_env.pip.pip_install_options or [], runtime_env.pip.pip_check
    site_link = shlex.quote(f"{root}/site-packages")
    root = shlex.quote(root)
    site = (
        "import sys, sysconfig; print(sysconfig.get_path('purelib', "
        "vars={'base': sys.argv[1], 'platbase': sys.argv[1]}))"
    )
    lines = [
        "set -eu",
        f"python -m pip list --format=freeze > {root}/installed.txt",
        "python -m pip install --no-cache-dir --disable-pip-version-check "
        f"--prefix {root}/prefix -c {root}/installed.txt " + shlex.join([*options, *requirements]),
        f'ln -sfn "$(python -c {shlex.quote(site)} {root}/prefix)" {site_link}',
    ]
    if check:
        lines.append(f"PYTHONPATH={site_link} python -m pip check")
    return "\n".join(lines)


def _check_location(location: str, field: str, remote_suffixes: tuple[str, ...]) -> None:
    if not isinstance(location, str) or not location.strip():
        raise ValueError(f"{field}: expected a path or URI, got {location!r}")
    parsed = urlparse(location)
    if parsed.scheme == LOCAL_SCHEME:
        if parsed.netloc or not parsed.path.startswith("/"):
            raise ValueError(
                f"{field}: {location!r}: local:// takes an absolute path (local:///abs/path)"
            )
        return
    if not parsed.scheme:
        return
    if parsed.scheme not in REMOTE_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in (*REMOTE_SCHEMES, LOCAL_SCHEME))
        raise ValueError(f"{field}: {location!r}: Ray fetches only {schemes} URIs")
    if not parsed.path.endswith(remote_suffixes):
        raise ValueError(
            f"{field}: {location!r}: a URI must name a {' or '.join(remote_suffixes)} file"
        )


def _is_plain_path(location: str) -> bool:
    return not urlparse(location).scheme
