"""The pipeline's ``runtime_env`` (the user's code for every stage): what it accepts, what it
refuses (naming the field), and how each launcher hands it on. The rendered RayJob and Job are
checked against the schemas in ``test_manifests.py``; the local Ray that ships ``py_modules``
to actors in ``tests/runtime/test_ray_cluster.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from flows.__main__ import build_parser, params_from_args
from flows.launchers import KubernetesLauncher, LocalLauncher, RayRuntimeEnv, StageConfigError
from flows.launchers.runtime_env import (
    cluster_runtime_env,
    job_code,
    local_runtime_env,
    merged_env,
    pip_install_script,
)
from flows.params import PipelineParams
from tests.support.topologies import SETTINGS


def test_unknown_fields_are_refused_naming_them() -> None:
    with pytest.raises(ValidationError, match=r"unknown runtime_env field\(s\) \['conda'\]"):
        RayRuntimeEnv.model_validate({"conda": "env.yaml", "py_modules": ["/x/pkg"]})
    with pytest.raises(ValidationError) as caught:
        PipelineParams.model_validate({"runtime_env": {"container": {"image": "x"}}})
    (error,) = caught.value.errors()
    assert error["loc"] == ("runtime_env",)
    assert (
        "['container']" in error["msg"]
        and "pip, py_modules, working_dir, env_vars" in (error["msg"])
    )
    with pytest.raises(
        ValidationError, match=r"runtime_env\.pip\n.*unknown pip field\(s\) \['pakages'\]"
    ):
        PipelineParams.model_validate({"runtime_env": {"pip": {"pakages": ["x"]}}})


@pytest.mark.parametrize(
    ("runtime_env", "message"),
    [
        ({"py_modules": ["ftp://host/pkg.zip"]}, r"py_modules\[0\]: 'ftp://host/pkg.zip': Ray"),
        ({"py_modules": ["/a", "s3://b/pkg.tar"]}, r"py_modules\[1\]: .* a \.zip or \.whl file"),
        ({"working_dir": "https://h/code.whl"}, r"working_dir: .* a \.zip file"),
        ({"working_dir": "/x/y.whl"}, r"working_dir '/x/y.whl': a folder or a \.zip"),
        ({"py_modules": ["local://relative/pkg"]}, r"local:// takes an absolute path"),
        ({"env_vars": {"PYTHONPATH": "/x"}}, r"PYTHONPATH is composed by llmrl"),
        ({"env_vars": {"A-B": "1"}}, r"'A-B' is not an environment variable name"),
        ({"pip": "requirements.txt"}, r"pip\n.*as a list"),
    ],
)
def test_locations_and_names_are_checked(runtime_env: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RayRuntimeEnv.model_validate(runtime_env)


def test_ray_spelling_with_llmrl_env_added_and_clashes_refused() -> None:
    runtime_env = RayRuntimeEnv.model_validate(
        {
            "pip": {"packages": ["my-rewards==1.2"], "pip_check": True},
            "py_modules": ["/shared/code/my_pkg", "s3://bucket/extra.zip"],
            "working_dir": "/shared/code",
            "env_vars": {"MY_API": "http://svc"},
        }
    )
    assert runtime_env.to_ray({"MLFLOW_TRACKING_URI": "http://mlflow"}) == {
        "pip": {"packages": ["my-rewards==1.2"], "pip_check": True},
        "py_modules": ["/shared/code/my_pkg", "s3://bucket/extra.zip"],
        "working_dir": "/shared/code",
        "env_vars": {"MLFLOW_TRACKING_URI": "http://mlflow", "MY_API": "http://svc"},
    }
    assert runtime_env.has_local_paths()
    assert not RayRuntimeEnv(py_modules=["local:///opt/code/pkg"]).has_local_paths()
    assert RayRuntimeEnv().to_ray() == {} and RayRuntimeEnv().is_empty
    with pytest.raises(ValueError, match=r"env_vars: MLFLOW_RUN_ID is set by llmrl"):
        RayRuntimeEnv(env_vars={"MLFLOW_RUN_ID": "x"}).to_ray({"MLFLOW_RUN_ID": "y"})
    with pytest.raises(ValueError, match=r"env_vars: A, HF_TOKEN are set by llmrl"):
        merged_env({"A": "1", "HF_TOKEN": "t"}, {"A": "2"}, reserved=["HF_TOKEN"])


def test_jobs_get_pip_requirements_and_import_paths() -> None:
    runtime_env = RayRuntimeEnv(
        pip=["my-rewards==1.2"],
        py_modules=[
            "/shared/code/my_pkg",
            "local:///opt/code/other",
            "/shared/w/x-1-py3-none-any.whl",
        ],
        working_dir="/shared/project",
    )
    assert job_code(runtime_env) == (
        ["my-rewards==1.2", "/shared/w/x-1-py3-none-any.whl"],
        ["/shared/code", "/opt/code", "/shared/project"],
    )
    with pytest.raises(ValueError, match=r"py_modules\[0\]: 's3://b/p.zip' is a URI only Ray"):
        job_code(RayRuntimeEnv(py_modules=["s3://b/p.zip"]))
    with pytest.raises(ValueError, match=r"working_dir: 'code' must be an absolute path"):
        cluster_runtime_env(RayRuntimeEnv(working_dir="code"))


def test_the_kubernetes_launcher_refuses_what_cannot_reach_a_stage() -> None:
    for runtime_env, message in [
        (RayRuntimeEnv(py_modules=["my_pkg"]), r"py_modules\[0\]: 'my_pkg' must be an absolute"),
        (RayRuntimeEnv(py_modules=["gs://b/pkg.zip"]), r"prepare and eval stages run as plain"),
    ]:
        with pytest.raises(StageConfigError, match=message) as caught:
            KubernetesLauncher(SETTINGS, api_client=object(), runtime_env=runtime_env)
        assert caught.value.stage == "kubernetes"


def test_the_local_launcher_takes_folders_only(tmp_path: Path) -> None:
    (tmp_path / "my_pkg").mkdir()
    local = local_runtime_env(RayRuntimeEnv(py_modules=["my_pkg"], working_dir="."), tmp_path)
    assert local.py_modules == [str(tmp_path / "my_pkg")]
    assert local.working_dir == str(tmp_path)
    for runtime_env, message in [
        (RayRuntimeEnv(pip=["my-rewards"]), r"runtime_env\.pip: the local launcher runs"),
        (RayRuntimeEnv(py_modules=["x.whl"]), r"py_modules\[0\]: 'x.whl': the local launcher"),
        (RayRuntimeEnv(py_modules=["missing"]), r"py_modules\[0\]: .*/missing does not exist"),
    ]:
        with pytest.raises(StageConfigError, match=message):
            LocalLauncher(cwd=tmp_path, runtime_env=runtime_env)


def test_the_local_launcher_hands_the_code_to_the_stage(tmp_path: Path) -> None:
    package = tmp_path / "code" / "userpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 42\n", encoding="utf-8")
    body = """
        import json, os, userpkg
        summary = {"value": userpkg.VALUE, "api": os.environ["MY_API"],
                   "ray": json.loads(os.environ["LLMRL_RAY_RUNTIME_ENV"])}
        with open(os.environ["LLMRL_RESULT_FILE"], "w") as out:
            json.dump(summary, out)
    """
    command = [sys.executable, "-c", "\n".join(line[8:] for line in body.splitlines())]
    runtime_env = RayRuntimeEnv(py_modules=["code/userpkg"], env_vars={"MY_API": "http://svc"})
    launcher = LocalLauncher(command, cwd=tmp_path, runtime_env=runtime_env)
    result = launcher.run("prepare", None, [], env={"MLFLOW_TRACKING_URI": "sqlite:///m.db"})
    assert result.summary == {
        "value": 42,
        "api": "http://svc",
        "ray": {"py_modules": [str(package)], "env_vars": {"MY_API": "http://svc"}},
    }
    clash = LocalLauncher(command, runtime_env=RayRuntimeEnv(env_vars={"MLFLOW_RUN_ID": "x"}))
    with pytest.raises(StageConfigError, match=r"eval-base: runtime_env\.env_vars: MLFLOW_RUN_ID"):
        clash.run("eval", None, [], env={"MLFLOW_RUN_ID": "abc"}, name="eval-base")


def test_the_pipeline_takes_it_from_the_command_line(tmp_path: Path) -> None:
    spec = tmp_path / "runtime_env.yaml"
    spec.write_text("env_vars: {MY_API: 'http://svc', TOKEN: secret}\n", encoding="utf-8")
    args = build_parser().parse_args(["--runtime-env", str(spec), "--py-module", "code/my_pkg"])
    params = params_from_args(args)
    assert params.runtime_env == RayRuntimeEnv(
        py_modules=["code/my_pkg"], env_vars={"MY_API": "http://svc", "TOKEN": "secret"}
    )
    inline = build_parser().parse_args(["--runtime-env", '{"working_dir": "/w"}'])
    assert params_from_args(inline).runtime_env == RayRuntimeEnv(working_dir="/w")
    # MLflow records the variables' names, never their values (tokens)
    assert params.tracking_params()["runtime_env"]["env_vars"] == ["MY_API", "TOKEN"]
    assert "kubernetes" not in params.tracking_params()


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python wheel of one module ``name`` (written by hand: no build backend)."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": metadata + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def test_the_init_container_script_adds_only_what_the_image_lacks(tmp_path: Path) -> None:
    """The Job's init container script, run here against this environment (the "image"):
    the user's package and its missing dependency land in the prefix, what is installed
    (PyYAML) is used from the environment, and a requirement that would replace an installed
    version fails instead."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "userpkg", "1.0", ("userdep", "pyyaml"))
    _wheel(wheels, "userdep", "0.3")
    _wheel(wheels, "pyyaml", "0.1")  # an older PyYAML the constraint must keep out
    _wheel(wheels, "needsold", "1.0", ("pyyaml<1",))
    pip = {"pip_install_options": ["--no-index", "--find-links", str(wheels)]}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def install(requirement: str, root: Path) -> subprocess.CompletedProcess[str]:
        runtime_env = RayRuntimeEnv(pip={"packages": [requirement], **pip})
        script = pip_install_script(runtime_env, [requirement], root=str(root))
        root.mkdir()
        return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)

    done = install("userpkg", tmp_path / "ok")
    assert done.returncode == 0, done.stderr
    site = tmp_path / "ok" / "site-packages"
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == [
        "userdep",
        "userpkg",
    ]
    probe = (
        "import json, userpkg, userdep, yaml; print(json.dumps([userpkg.VERSION, yaml.__file__]))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(site)}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    version, yaml_file = json.loads(shown.stdout)
    assert version == "1.0" and not yaml_file.startswith(str(tmp_path))
    refused = install("needsold", tmp_path / "refused")
    assert refused.returncode != 0
    assert "pyyaml" in refused.stdout.lower() + refused.stderr.lower()
