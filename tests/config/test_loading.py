"""load_config / dump_config: YAML + --set overrides, and every problem reported by file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import Field

from llmrl.config import ConfigError, ConfigModel, PrepareConfig, dump_config, load_config

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
    assert any(p.startswith("--set task=chess: task: Input should be 'arithmetic'") for p in listed)
    assert (
        "--set split.eval_fraction=1: split.eval_fraction: Input should be less than 1 (got 1)"
        in listed
    )
    assert any(
        p.startswith("--set on_invalid=drop: on_invalid: Input should be 'error'") for p in listed
    )
    assert any(p.startswith("--set generate.train_size=0: generate.train_size:") for p in listed)
