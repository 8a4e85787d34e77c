"""Stage configs: defaults, YAML files, and config errors through the CLI (one message, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmrl.cli import main
from llmrl.config import ConfigError, load_config
from llmrl.config.evaluate import EvalConfig
from llmrl.config.grpo import GRPOConfig
from llmrl.config.sft import SFTConfig
from llmrl.stages.registry import STAGES
from tests.support.cli import run_cli
from tests.support.paths import REPO


def _fails(capsys: pytest.CaptureFixture, *args: str) -> str:
    """Run ``llmrl ARGS`` in this process; it must exit 2. Returns its stderr."""
    code = main(list(args))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("stage", ["sft", "grpo", "eval"])
def test_unknown_key_is_named(capsys, stage):
    err = _fails(capsys, stage, "--set", "data.path=x", "--set", "nope=1")
    assert f"llmrl {stage}: error: --set nope=1: unknown key 'nope'" in err


def test_unknown_nested_key_suggests_the_right_one(capsys):
    err = _fails(capsys, "grpo", "--set", "data.path=x", "--set", "loss.clip_epsilom=0.3")
    assert "unknown key 'loss.clip_epsilom'" in err and "did you mean 'clip_epsilon'?" in err


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_wrong_type_is_named(capsys, stage):
    err = _fails(capsys, stage, "--set", "data.path=x", "--set", "steps=abc")
    assert "--set steps=abc: steps: Input should be a valid integer" in err
    assert "(got 'abc')" in err


def test_several_problems_are_listed_at_once(capsys):
    err = _fails(capsys, "sft", "--set", "steps=0", "--set", "optimizer.lr=-1")
    lines = err.splitlines()
    assert any("config: data: Field required" in line for line in lines)
    assert any("--set steps=0: steps:" in line for line in lines)
    assert any("--set optimizer.lr=-1: optimizer.lr:" in line for line in lines)


def test_kl_to_ref_needs_a_reference(capsys):
    err = _fails(capsys, "grpo", "--set", "data.path=x", "--set", "loss.kl_to_ref_coeff=0.1")
    assert "loss.kl_to_ref_coeff > 0 needs `reference: true`" in err
    config = load_config(
        GRPOConfig, None, ["data.path=x", "loss.kl_to_ref_coeff=0.1", "reference=true"]
    )
    assert config.reference and config.loss.kl_to_ref_coeff == 0.1


def test_sft_reference_options_name_what_they_need(capsys):
    err = _fails(capsys, "sft", "--set", "data.path=x", "--set", "loss_function=minor_sft")
    assert "loss_function: 'minor_sft' compares the model with a frozen reference model" in err
    assert "set `reference: true` (or loss_function: sft)" in err
    err = _fails(capsys, "sft", "--set", "data.path=x", "--set", "kl_to_ref_coeff=0.1")
    assert "kl_to_ref_coeff > 0 needs `reference: true`" in err
    err = _fails(capsys, "sft", "--set", "data.path=x", "--set", "minor_sft_beta=0.5")
    assert "minor_sft_beta is MinorSFT's temperature; set loss_function: minor_sft" in err
    config = load_config(
        SFTConfig, None, ["data.path=x", "loss_function=minor_sft", "reference=true"]
    )
    assert config.beta == 0.1 and config.kl_to_ref_coeff == 0.0
    config = load_config(
        SFTConfig,
        None,
        ["data.path=x", "loss_function=minor_sft", "reference=true", "minor_sft_beta=0.5"],
    )
    assert config.beta == 0.5


def test_resample_rounds_need_drop_zero_std(capsys):
    err = _fails(capsys, "grpo", "--set", "data.path=x", "--set", "advantage.max_resample_rounds=2")
    assert "advantage: max_resample_rounds bounds the resampling of dynamic sampling" in err
    assert "set advantage.drop_zero_std: true" in err
    on = ["data.path=x", "advantage.drop_zero_std=true"]
    assert load_config(GRPOConfig, None, on).advantage.resample_rounds == 3
    config = load_config(GRPOConfig, None, [*on, "advantage.max_resample_rounds=0"])
    assert config.advantage.resample_rounds == 0
    assert load_config(GRPOConfig, None, ["data.path=x"]).advantage.resample_rounds == 0


def test_eval_pass_at_must_not_exceed_num_samples(capsys):
    err = _fails(capsys, "eval", "--set", "data.path=x", "--set", "num_samples=4",
                 "--set", "pass_at=[1, 8]")  # fmt: skip
    assert "pass_at [8] exceeds num_samples=4" in err
    err = _fails(capsys, "eval", "--set", "data.path=x", "--set", "pass_at=[0]")
    assert "pass_at: every k must be >= 1" in err
    assert load_config(EvalConfig, None, ["data.path=x", "pass_at=[8]"]).num_samples == 0


@pytest.mark.parametrize("stage", ["sft", "grpo", "eval"])
def test_missing_dataset_dir_is_a_clear_user_error(capsys, tmp_path, stage):
    missing = tmp_path / "nowhere"
    err = _fails(capsys, stage, "--no-progress", "--set", f"data.path={missing}")
    assert f"data.path: {missing} does not exist: not a prepared dataset" in err
    assert "run `llmrl prepare` first" in err


def test_a_directory_without_manifest_is_not_a_prepared_dataset(capsys, tmp_path):
    err = _fails(capsys, "sft", "--no-progress", "--set", f"data.path={tmp_path}")
    assert f"{tmp_path} has no manifest.json: not a prepared dataset" in err


def test_missing_config_file_is_named(capsys, tmp_path):
    err = _fails(capsys, "sft", "--config", str(tmp_path / "absent.yaml"))
    assert f"{tmp_path / 'absent.yaml'}: config file does not exist" in err


def test_bad_key_in_a_yaml_file_names_the_file(capsys, tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("data: {path: x}\noptimizer: {lr: 1.0e-5, warmup: 3}\n")
    err = _fails(capsys, "sft", "--config", str(path))
    assert f"{path}: unknown key 'optimizer.warmup'" in err
    assert "did you mean 'warmup_steps'?" in err


@pytest.mark.integration
def test_missing_dataset_dir_exits_2_in_a_real_process(tmp_path):
    result = run_cli(["grpo", "--no-progress", "--set", "data.path=nowhere"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "llmrl grpo: error: data.path: nowhere does not exist" in result.stderr


def test_stage_registry():
    assert {name: cls for name, (cls, _) in STAGES.items()} == {
        "sft": SFTConfig,
        "grpo": GRPOConfig,
        "eval": EvalConfig,
    }
    assert all(callable(run) for _, run in STAGES.values())


def test_stage_defaults_survive_a_partial_section():
    """Overriding one field of a section keeps the stage's own defaults for the others."""
    grpo = load_config(
        GRPOConfig,
        None,
        ["data.path=x", "optimizer.lr=1e-5", "checkpoint.keep_last=1", "generation.top_p=0.9"],
    )
    assert grpo.optimizer.lr == 1e-5 and grpo.optimizer.schedule == "constant"
    assert grpo.checkpoint.every == 25 and grpo.checkpoint.best_metric == "reward_mean"
    assert grpo.generation.max_new_tokens == 64 and grpo.generation.top_p == 0.9
    sft = load_config(SFTConfig, None, ["data.path=x", "optimizer.lr=1e-4", "checkpoint.every=3"])
    assert sft.optimizer.warmup_steps == 5 and sft.optimizer.lr == 1e-4
    assert sft.checkpoint.best_metric == "eval_loss" and sft.checkpoint.best_mode == "min"
    assert sft.checkpoint.every == 3
    # ... and an explicit value still wins over the stage default
    explicit = load_config(SFTConfig, None, ["data.path=x", "checkpoint.best_metric=null"])
    assert explicit.checkpoint.best_metric is None


def test_eval_samples_as_long_as_the_greedy_pass_unless_told():
    config = load_config(EvalConfig, None, ["data.path=x", "max_new_tokens=48"])
    assert config.sampling.max_new_tokens == 48
    config = load_config(
        EvalConfig, None, ["data.path=x", "max_new_tokens=48", "sampling.max_new_tokens=96"]
    )
    assert config.sampling.max_new_tokens == 96
    assert EvalConfig.model_validate(config.model_dump()) == config


def test_defaults_and_checkpoint_dir_under_output_dir():
    sft = load_config(SFTConfig, None, ["data.path=x"])
    assert sft.output_dir == "runs/sft" and sft.checkpoint.dir == "runs/sft/checkpoints"
    assert sft.optimizer.lr == 2e-5 and sft.optimizer.warmup_steps == 5
    grpo = load_config(GRPOConfig, None, ["data.path=x", "output_dir=out"])
    assert grpo.checkpoint.dir == "out/checkpoints"
    assert grpo.optimizer.lr == 1e-6 and grpo.optimizer.schedule == "constant"
    assert grpo.generation.max_new_tokens == 64 and grpo.mode == "sync"
    own = load_config(GRPOConfig, None, ["data.path=x", "checkpoint.dir=ckpts"])
    assert own.checkpoint.dir == "ckpts"
    assert EvalConfig.model_validate({"data": {"path": "x"}}).pass_at == [1]


@pytest.mark.parametrize(
    ("name", "config_cls"), [("sft", SFTConfig), ("grpo", GRPOConfig), ("eval", EvalConfig)]
)
def test_shipped_yaml_configs_load(name, config_cls):
    config = load_config(config_cls, REPO / "configs" / f"{name}.yaml", ["data.path=x"])
    assert config.model.name == "smollm2-135m-instruct" and config.data.path == "x"
    if name != "eval":
        assert config.checkpoint.dir == f"runs/{name}/checkpoints"


def test_config_error_is_a_value_error_with_problems():
    with pytest.raises(ConfigError) as caught:
        load_config(GRPOConfig, None, ["data.path=x", "num_samples=1"])
    assert isinstance(caught.value, ValueError)
    assert caught.value.problems == [
        "--set num_samples=1: num_samples: Input should be greater than or equal to 2 (got 1)"
    ]


def test_relative_paths_stay_as_given():
    config = load_config(SFTConfig, None, ["data.path=data/prepared/x"])
    assert Path(config.data.path) == Path("data/prepared/x")


# ------------------------------------------------ loss variants and advantage estimators
def test_loss_variant_and_advantage_estimator_are_chosen_in_the_config():
    default = load_config(GRPOConfig, None, ["data.path=x"])
    assert default.loss.variant == "grpo" and default.advantage.estimator == "grpo"
    assert default.advantage.kl_in_reward_coeff == 0.0
    config = load_config(
        GRPOConfig,
        None,
        [
            "data.path=x",
            "loss.variant=gspo",
            "loss.clip_epsilon=[3.0e-4, 4.0e-4]",
            "advantage.estimator=reinforce_pp",
            "advantage.kl_in_reward_coeff=0.01",
            "reference=true",
        ],
    )
    assert config.loss.variant == "gspo" and config.advantage.kl_in_reward_coeff == 0.01


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.variant=ppo"], "loss.variant: Input should be 'grpo', 'gspo' or 'cispo'"),
        (
            ["advantage.estimator=grpo_pp"],
            "advantage.estimator: Input should be 'grpo', 'rloo' or 'reinforce_pp'",
        ),
        (
            ["advantage.estimator=rloo", "advantage.scale=none"],
            "advantage: scale: none is an option of estimator grpo; estimator rloo has its own "
            "scaling",
        ),
        (
            ["advantage.kl_in_reward_coeff=0.1", "reference=true"],
            "advantage: kl_in_reward_coeff is REINFORCE++'s KL in the reward; set "
            "advantage.estimator: reinforce_pp",
        ),
        (
            ["advantage.estimator=reinforce_pp", "advantage.kl_in_reward_coeff=0.1"],
            "advantage.kl_in_reward_coeff > 0 needs the reference model's log-probs; set "
            "`reference: true`",
        ),
        (["advantage.kl_in_reward_coeff=-1"], "advantage.kl_in_reward_coeff: Input should be "),
        (
            ["advantage.estimator=rloo", "num_samples=1"],
            "--set num_samples=1: num_samples: Input should be greater than or equal to 2",
        ),
    ],
)
def test_variant_and_estimator_errors_name_the_field(capsys, overrides, message):
    sets = [arg for override in overrides for arg in ("--set", override)]
    err = _fails(capsys, "grpo", "--set", "data.path=x", *sets)
    assert message in err


def test_kl_in_reward_needs_a_dedicated_reference():
    from llmrl.config.grpo import topology_problems
    from llmrl.topology import Topology
    from llmrl.topology.spec import ReferenceSpec

    config = load_config(
        GRPOConfig,
        None,
        [
            "data.path=x",
            "advantage.estimator=reinforce_pp",
            "advantage.kl_in_reward_coeff=0.1",
            "reference=true",
        ],
    )
    local = Topology.local_default()  # the reference scores in the trainer ranks
    problems = topology_problems(config, local)
    assert any(
        p.startswith("advantage.kl_in_reward_coeff: REINFORCE++'s KL in the reward needs")
        and "set topology.reference.placement: dedicated" in p
        for p in problems
    ), problems
    dedicated = local.model_copy(update={"reference": ReferenceSpec(placement="dedicated", gpus=1)})
    assert not any(p.startswith("advantage.") for p in topology_problems(config, dedicated))


def test_dr_grpo_settings_build_unscaled_group_advantages():
    from llmrl.objectives import MCAdvantage, build_advantage

    config = load_config(
        GRPOConfig,
        None,
        ["data.path=x", "loss.aggregation=sum_norm", "advantage.scale=none"],
    )
    advantage = build_advantage(config)
    assert type(advantage) is MCAdvantage and advantage.scale == "none"


def test_the_stage_builds_the_selected_loss_and_estimator(tiny_model_dir):
    """The trainer ranks (``GRPOTrainer``) build ``loss.variant``'s class; the runtime, the
    in-process composition and the GPU benchmark build ``advantage.estimator``'s with
    ``build_advantage``."""
    from llmrl.models import load_model, load_tokenizer
    from llmrl.objectives import (
        CISPOLoss,
        GRPOLoss,
        MCAdvantage,
        RLOOAdvantage,
        build_advantage,
    )
    from llmrl.runtime import driver_parts, grpo_loop, grpo_runtime
    from llmrl.train.grpo_trainer import GRPOTrainer

    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)

    def built(*overrides: str):
        config = load_config(
            GRPOConfig, None, ["data.path=x", f"model.name={tiny_model_dir}", *overrides]
        )
        return GRPOTrainer(config, model, tokenizer, total_steps=1).loss_fn, build_advantage(config)

    loss, advantage = built("loss.variant=cispo", "advantage.estimator=rloo")
    assert type(loss) is CISPOLoss and type(advantage) is RLOOAdvantage
    assert loss.clip_epsilon == (0.2, 0.2) and advantage.num_samples == 4
    loss, advantage = built(
        "loss.aggregation=sum_norm", "generation.max_new_tokens=48", "advantage.scale=none"
    )
    assert type(loss) is GRPOLoss and loss.max_length_norm == 48  # Dr. GRPO's constant
    # the defaults: GRPO exactly as before
    loss, advantage = built()
    assert type(loss) is GRPOLoss and type(advantage) is MCAdvantage
    assert (loss.aggregation, loss.max_length_norm, loss.tis_cap) == ("token_mean", None, None)
    assert (advantage.scale, advantage.eps, advantage.drop_zero_std) == ("group", 1e-6, False)
    # both compositions build theirs with the one builder, which builds it with this one
    assert driver_parts.build_advantage is build_advantage
    assert grpo_runtime.build_driver_parts is grpo_loop.build_driver_parts
    assert grpo_loop.build_driver_parts is driver_parts.build_driver_parts


def test_runtime_passes_the_dedicated_reference_to_reinforce_pp(monkeypatch):
    """With ``advantage.kl_in_reward_coeff > 0`` the runtime hands ``build_advantage`` a scorer
    that calls the dedicated reference actor; otherwise none."""
    from functools import partial
    from types import SimpleNamespace

    from llmrl.runtime import grpo_runtime
    from llmrl.runtime.grpo_runtime import GRPORuntime

    waits = []  # the fake actor's "remote" returns values; the wait records its bound

    def wait_for(ref, seconds, hung):
        waits.append((seconds, hung.role, hung.setting))
        return ref

    monkeypatch.setattr(grpo_runtime, "wait_for", wait_for)
    actor = SimpleNamespace(score=SimpleNamespace(remote=lambda batch: ("scored", batch)))
    kl = load_config(
        GRPOConfig,
        None,
        [
            "data.path=x",
            "advantage.estimator=reinforce_pp",
            "advantage.kl_in_reward_coeff=0.1",
            "reference=true",
            "runtime.timeouts.reference_s=42",
        ],
    )

    def runtime(reference, config):
        parts = SimpleNamespace(reference=reference, config=config, policy_version=3)
        parts._score_with_reference = partial(GRPORuntime._score_with_reference, parts)
        return parts

    score = GRPORuntime._reference_scorer(runtime(actor, kl))
    assert score("batch") == ("scored", "batch")
    assert waits == [(42.0, "reference", "runtime.timeouts.reference_s")]
    plain = load_config(GRPOConfig, None, ["data.path=x", "reference=true"])
    assert GRPORuntime._reference_scorer(runtime(actor, plain)) is None
    assert GRPORuntime._reference_scorer(runtime(None, kl)) is None
