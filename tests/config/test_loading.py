"""load_config / dump_config: YAML + --set overrides, and every problem reported by file and key."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from llmrl.config import ConfigError, ConfigModel, PrepareConfig, dump_config, load_config
from llmrl.config.evaluate import EvalConfig
from llmrl.config.grpo import GRPOConfig
from llmrl.config.sft import SFTConfig
from tests.support.configs import BOMB

REPO = Path(__file__).resolve().parents[2]


class Inner(ConfigModel):
    """A nested section."""

    depth: int = Field(1, ge=0, description="a bounded int")
    names: list[str] = Field(default_factory=list, description="a list")


class Outer(ConfigModel):
    """A section holding another."""

    inner: Inner = Field(default_factory=Inner, description="the nested section")
    ratio: float = Field(0.5, ge=0, lt=1, description="a fraction")


class Root(ConfigModel):
    """A small config with three levels."""

    name: str = Field("run", description="a string")
    enabled: bool = Field(False, description="a flag")
    outer: Outer = Field(default_factory=Outer, description="a section")
    extra: dict[str, int] = Field(default_factory=dict, description="a free mapping")
    maybe: int | None = Field(None, description="optional")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def problems(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    assert str(excinfo.value) == "\n".join(excinfo.value.problems)
    return excinfo.value.problems


def test_reads_yaml_and_keeps_defaults(tmp_path):
    path = write(tmp_path, "name: exp\nouter:\n  inner:\n    depth: 3\n")
    config = load_config(Root, path)
    assert config.name == "exp" and config.outer.inner.depth == 3 and config.outer.ratio == 0.5


def test_empty_file_and_no_file_give_the_defaults(tmp_path):
    assert load_config(Root, write(tmp_path, "")) == Root()
    assert load_config(Root, write(tmp_path, "# only a comment\n")) == Root()
    assert load_config(Root, None) == Root()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nmae: x\n", "unknown key 'nmae' (allowed here: enabled, extra, maybe, name, outer)"),
        ("outer:\n  ratoi: 0.1\n", "unknown key 'outer.ratoi' (allowed here: inner, ratio)"),
        ("outer:\n  inner:\n    deep: 2\n", "unknown key 'outer.inner.deep'"),
    ],
)
def test_unknown_keys_at_every_depth(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, path)
    [problem] = problems(excinfo)
    assert problem.startswith(f"{path}: {expected}")


def test_unknown_key_suggests_the_close_name(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'depth'"):
        load_config(Root, write(tmp_path, "outer: {inner: {dpeth: 2}}\n"))


def test_every_problem_is_listed_with_its_dotted_path(tmp_path):
    path = write(
        tmp_path,
        "enabled: maybe\nouter:\n  ratio: 1.5\n  inner:\n    depth: -1\n    names: [a, [b]]\n"
        "extra: {k: x}\nbogus: 1\n",
    )
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, path)
    listed = problems(excinfo)
    assert f"{path}: enabled: Input should be a valid boolean" in "\n".join(listed)
    assert f"{path}: outer.ratio: Input should be less than 1 (got 1.5)" in listed
    assert f"{path}: outer.inner.depth: Input should be greater than or equal to 0 (got -1)" in (
        listed
    )
    assert any(
        p.startswith(f"{path}: outer.inner.names[1]: Input should be a valid string")
        for p in listed
    )
    assert any(p.startswith(f"{path}: extra.k: Input should be a valid integer") for p in listed)
    assert any(p.startswith(f"{path}: unknown key 'bogus'") for p in listed)
    assert len(listed) == 6


def test_overrides_parse_yaml_values_and_create_nested_keys(tmp_path):
    path = write(tmp_path, "name: exp\n")
    config = load_config(
        Root,
        path,
        [
            "enabled=true",
            "outer.inner.depth=3",
            "outer.ratio=0.25",
            "outer.inner.names=[a, b]",
            "extra.k=7",
            "name=other run",
            "maybe=null",
        ],
    )
    assert config.enabled is True
    assert config.outer.inner.depth == 3 and config.outer.inner.names == ["a", "b"]
    assert config.outer.ratio == 0.25 and config.extra == {"k": 7}
    assert config.name == "other run" and config.maybe is None


def test_override_of_a_null_section_replaces_it(tmp_path):
    config = load_config(Root, write(tmp_path, "outer:\n"), ["outer.ratio=0.1"])
    assert config.outer.ratio == 0.1


def test_later_overrides_win():
    assert load_config(Root, None, ["name=a", "name=b"]).name == "b"


def test_unknown_override_key_fails_like_an_unknown_yaml_key(tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, write(tmp_path, ""), ["outer.inner.deep=2", "nope.x=1"])
    listed = problems(excinfo)
    assert "--set outer.inner.deep=2: unknown key 'outer.inner.deep'" in listed[0]
    assert "--set nope.x=1: unknown key 'nope'" in listed[1]


def test_invalid_override_value_names_the_override():
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, None, ["outer.ratio=2"])
    assert problems(excinfo) == [
        "--set outer.ratio=2: outer.ratio: Input should be less than 1 (got 2)"
    ]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("outer.ratio", "--set outer.ratio: expected KEY=VALUE"),
        ("=3", "--set =3: expected KEY=VALUE"),
        ("outer..ratio=1", "--set outer..ratio=1: empty key segment"),
        ("name=[a", "--set name=[a: the value '[a' is not valid YAML"),
        ("name.x=1", "--set name.x=1: 'name' is a str ('run'), not a mapping"),
    ],
)
def test_bad_override_syntax_names_the_override(tmp_path, override, expected):
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, write(tmp_path, "name: run\n"), [override])
    assert problems(excinfo)[0].startswith(expected)


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, "name: exp\nouter:\n  ratio: [0.1\n  inner: 3\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, path)
    [problem] = problems(excinfo)
    assert problem.startswith(f"{path}: line ")
    assert "invalid YAML" in problem
    line = int(problem.split("line ")[1].split(",")[0])
    assert line in (3, 4)


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match=r"top level must be a mapping.*got a list"):
        load_config(Root, write(tmp_path, "- a\n- b\n"))


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as excinfo:
        load_config(Root, path)
    assert problems(excinfo) == [f"{path}: config file does not exist"]


def test_validate_assignment():
    config = Root()
    with pytest.raises(ValueError, match="less than 1"):
        config.outer.ratio = 3


def test_dump_is_yaml_of_the_resolved_config():
    config = load_config(Root, None, ["outer.inner.names=[x]"])
    dumped = yaml.safe_load(dump_config(config))
    assert dumped == config.model_dump(mode="json")
    assert load_config(Root, None, [f"outer={dumped['outer']}"]) == config


def test_every_config_field_is_documented():
    from llmrl.config import GenerateConfig, SplitConfig

    for model in (PrepareConfig, GenerateConfig, SplitConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


@pytest.mark.parametrize("name", ["prepare.yaml", "prepare-gsm8k.yaml"])
def test_shipped_prepare_configs_load_and_their_dump_reloads(tmp_path, name):
    config = load_config(PrepareConfig, REPO / "configs" / name)
    assert load_config(PrepareConfig, write(tmp_path, dump_config(config))) == config


def test_shipped_prepare_config_is_the_default_with_the_pipelines_mix():
    # `make run` trains additions and subtractions and evaluates on 400 problems
    # (docs/learning.md); everything else is the default of `llmrl prepare` without --config
    shipped = load_config(PrepareConfig, REPO / "configs" / "prepare.yaml")
    assert shipped.generate.options == {"operators": "+-"}
    assert shipped.generate.eval_size == 400
    overrides = ['generate.options={operators: "+-"}', "generate.eval_size=400"]
    assert load_config(PrepareConfig, None, overrides) == shipped


def test_prepare_config_cross_field_problems_name_the_fields(tmp_path):
    path = write(
        tmp_path,
        "task: gsm8k\ngenerate: {train_size: 3}\ncolumns: {question: q, nope: n}\n"
        "eval_source: e.jsonl\nsplit: {eval_fraction: 0.2}\n",
    )
    with pytest.raises(ConfigError) as excinfo:
        load_config(PrepareConfig, path)
    listed = problems(excinfo)
    assert listed[0].startswith(f"{path}: source: required for task 'gsm8k'")
    assert listed[1].startswith(f"{path}: generate: only for generated tasks")
    assert (
        listed[2] == f"{path}: columns.nope: not a field of task 'gsm8k' (fields: question, answer)"
    )
    assert listed[3].startswith(f"{path}: split.eval_fraction: not used when eval_source")


def test_prepare_config_generated_task_rejects_source_settings():
    with pytest.raises(ConfigError) as excinfo:
        load_config(PrepareConfig, None, ["source=data.jsonl", "split.seed=2"])
    listed = problems(excinfo)
    assert listed[0].startswith("--set source=data.jsonl: source: task 'arithmetic' is generated")
    assert listed[1].startswith("--set split.seed=2: split: task 'arithmetic' is generated")


def test_prepare_config_value_errors():
    with pytest.raises(ConfigError) as excinfo:
        load_config(
            PrepareConfig,
            None,
            ["task=chess", "split.eval_fraction=1", "on_invalid=drop", "generate.train_size=0"],
        )
    listed = problems(excinfo)
    assert any(
        p.startswith("--set task=chess: task: 'chess' is not a built-in task") for p in listed
    )
    assert (
        "--set split.eval_fraction=1: split.eval_fraction: Input should be less than 1 (got 1)"
        in listed
    )
    assert any(
        p.startswith("--set on_invalid=drop: on_invalid: Input should be 'error'") for p in listed
    )
    assert any(p.startswith("--set generate.train_size=0: generate.train_size:") for p in listed)


# ------------------------------------------------------------------------ bounded parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BOMB, "line 1, column 1: invalid YAML: more than 100000 values once its aliases are"),
        ("a: " + "[" * 5000 + "]" * 5000, "invalid YAML: nested more than 64 levels deep"),
        ("a: &a [*a]\n", "an alias inside the value it names (infinitely nested); refused"),
        ("a: &a 1\nb: [" + ", ".join(["*a"] * 101) + "]\n", "more than 100 aliases; refused"),
        ("seed: " + "9" * 5000 + "\n", "line 1, column 7: invalid YAML: an integer of 5000 digits"),
    ],
    ids=["alias-bomb", "deep-nesting", "recursive-alias", "many-aliases", "huge-int"],
)
def test_hostile_yaml_is_refused_naming_the_file_and_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(PrepareConfig, path)
    assert raised.value.problems == [f"{path}: {raised.value.problems[0].split(': ', 1)[1]}"]
    assert expected in str(raised.value)


def test_a_config_file_over_the_size_limit_is_not_parsed(tmp_path):
    path = write(tmp_path, "name: run\n" + "#" * (1 << 20))
    with pytest.raises(ConfigError, match=r"config file is over 1048576 bytes"):
        load_config(Root, path)


def test_the_alias_bomb_is_refused_with_bounded_memory():
    """In a fresh interpreter: peak RSS after the refusal minus after the imports (the bomb
    expanded reaches gigabytes; refused while composing, it stays a few hundred nodes)."""
    code = (
        "import resource, sys\n"
        "from llmrl.config import ConfigError, PrepareConfig, load_config\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    load_config(PrepareConfig, sys.argv[1])\n"
        "except ConfigError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('accepted')\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), BOMB)
        done = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 50_000  # KiB: 50 MB, where the expanded bomb takes > 2.5 GB


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("optimizer.lr=.inf", "optimizer.lr: Input should be a finite number (got inf)"),
        ("optimizer.lr=.nan", "optimizer.lr: Input should be a finite number (got nan)"),
        ("optimizer.lr=-.inf", "optimizer.lr: Input should be a finite number (got -inf)"),
        ("optimizer.lr=3.0", "optimizer.lr: Input should be less than or equal to 1 (got 3.0)"),
        ("optimizer.betas=[0.9, 1.0]", "optimizer.betas[1]: Input should be less than 1"),
        ("optimizer.weight_decay=.nan", "optimizer.weight_decay: Input should be a finite number"),
        ("optimizer.grad_clip=.inf", "optimizer.grad_clip: Input should be a finite number"),
        ("steps=1000000000000000000000000000000", "steps: Input should be less than or equal to "
         "10000000 (got 1000000000000000000000000000000)"),
        ("steps=1.0e+30", "steps: Input is too large a number for this integer field"),
        ("steps=1e30", "steps: Input should be a valid integer"),
        ("batch_size=10000000", "batch_size: Input should be less than or equal to 1000000"),
        ("max_length=.inf", "max_length: Input should be a finite number"),
        ("seed=-1", "seed: Input should be greater than or equal to 0"),
        ("kl_to_ref_coeff=.nan", "kl_to_ref_coeff: Input should be a finite number"),
    ],
)  # fmt: skip
def test_numbers_are_finite_and_in_range_with_the_field_named(override, expected):
    with pytest.raises(ConfigError) as raised:
        load_config(SFTConfig, None, ["data.path=x", override])
    assert len(raised.value.problems) == 1
    assert raised.value.problems[0].startswith(f"--set {override}: ")
    assert expected in raised.value.problems[0]


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("num_samples=100000000", "num_samples"),
        ("prompts_per_step=100000000", "prompts_per_step"),
        ("generation.max_new_tokens=100000000", "generation.max_new_tokens"),
        ("generation.temperature=.nan", "generation.temperature"),
        ("runtime.collective_timeout_s=.inf", "runtime.collective_timeout_s"),
        ("runtime.placement_timeout_s=1.0e+9", "runtime.placement_timeout_s"),
        ("loss.clip_epsilon=.nan", "loss.clip_epsilon"),
        ("topology.trainer.memory_gb=.inf", "topology.trainer.memory_gb"),
        ("topology.env_workers.count=10000000", "topology.env_workers.count"),
    ],
)
def test_grpo_numbers_are_bounded(override, field):
    with pytest.raises(ConfigError) as raised:
        load_config(GRPOConfig, None, ["data.path=x", override])
    assert f"--set {override}: {field}" in str(raised.value)


def test_the_defaults_and_shipped_configs_stay_valid():
    for model in (SFTConfig, GRPOConfig, EvalConfig):
        load_config(model, None, ["data.path=x"])
    load_config(PrepareConfig, None)
    shipped = {
        "sft": SFTConfig,
        "grpo": GRPOConfig,
        "grpo-distributed": GRPOConfig,
        "grpo-judge": GRPOConfig,
        "grpo-partial": GRPOConfig,
        "grpo-vllm-cpu": GRPOConfig,
        "opd": GRPOConfig,
        "eval": EvalConfig,
        "prepare": PrepareConfig,
        "prepare-gsm8k": PrepareConfig,
    }
    for name, model in shipped.items():
        overrides = [] if model is PrepareConfig else ["data.path=x"]
        load_config(model, REPO / "configs" / f"{name}.yaml", overrides)  # fmt: skip
