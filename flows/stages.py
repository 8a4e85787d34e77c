"""The stage graph of the pipeline, declared once: :data:`STAGE_SPECS`.

Each row is one stage the pipeline can run (a step of the flow), in run order: its name, the
``llmrl`` command it runs, the stages whose results it reads, where its model comes from, what it
produces, and how it is placed on a cluster. Everything else in :mod:`flows` is derived from this
table: the commands a launcher accepts, the run order, which stages can be replaced by a path
(``start_from``), the evaluated models, and the Kubernetes placement sets below.

=========  =======  ===================  ==========  ========  ======  ==============
name       command  reads                model_from  produces  on_ray  notes
=========  =======  ===================  ==========  ========  ======  ==============
prepare    prepare  -                    -           dataset   no
sft        sft      prepare              (config)    model     yes     driver trains
grpo       grpo     prepare, sft         sft         model     yes     uses topology
eval-base  eval     prepare              (config)    report    no      evaluates base
eval-sft   eval     prepare, sft         sft         report    no      evaluates sft
eval-grpo  eval     prepare, grpo        grpo        report    no      evaluates grpo
=========  =======  ===================  ==========  ========  ======  ==============

A stage reads the results of the ``reads`` stages that ran (or were given): ``data.path`` from
``prepare``'s dataset, ``model.checkpoint`` from ``model_from``'s final checkpoint; without them
it uses its config's values (``sft`` from the config's model, ``grpo`` too when SFT is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Output = Literal["dataset", "model", "report"]


@dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline (a row of :data:`STAGE_SPECS`).

    - ``name``: the stage in the flow (task run, MLflow run, ``skip``, finished-stage store);
    - ``command``: the ``llmrl`` subcommand it runs, whose config file it uses;
    - ``reads``: the stages whose results it reads (its inputs, part of its key);
    - ``model_from``: the stage whose final checkpoint is its model (None: its config's model);
    - ``produces``: ``dataset`` (a prepared folder: summary ``path``), ``model`` (a checkpoint:
      ``final_checkpoint``) or ``report`` (an evaluation's accuracy);
    - ``evaluates``: for an evaluation, the model it measures (``base``, ``sft``, ``grpo``);
    - ``title``: how reports name that model;
    - ``on_ray``: the command runs as a KubeRay ``RayJob`` (else a one-pod ``Job``);
    - ``driver_trains``: a Ray command whose driver is the training process itself (it runs on
      the trainer group, not the head);
    - ``uses_topology``: a Ray command that places the whole GPU topology (engines, env workers,
      reference), not only the trainer.
    """

    name: str
    command: str
    reads: tuple[str, ...] = ()
    model_from: str | None = None
    produces: Output = "report"
    evaluates: str | None = None
    title: str | None = None
    on_ray: bool = False
    driver_trains: bool = False
    uses_topology: bool = False

    @property
    def startable(self) -> bool:
        """Whether ``start_from`` can replace it with a path (a dataset or a checkpoint)."""
        return self.produces in ("dataset", "model")


STAGE_SPECS: tuple[StageSpec, ...] = (
    StageSpec("prepare", "prepare", produces="dataset"),
    StageSpec("sft", "sft", ("prepare",), produces="model", on_ray=True, driver_trains=True),
    StageSpec("grpo", "grpo", ("prepare", "sft"), "sft", "model", on_ray=True, uses_topology=True),
    StageSpec("eval-base", "eval", ("prepare",), evaluates="base", title="base model"),
    StageSpec("eval-sft", "eval", ("prepare", "sft"), "sft", evaluates="sft", title="after SFT"),
    StageSpec(
        "eval-grpo", "eval", ("prepare", "grpo"), "grpo", evaluates="grpo", title="after GRPO"
    ),
)
"""The pipeline's stages in run order (see the module docstring)."""

SPECS: dict[str, StageSpec] = {spec.name: spec for spec in STAGE_SPECS}
""":data:`STAGE_SPECS` by name."""
RUN_ORDER: tuple[str, ...] = tuple(SPECS)
"""Every stage the pipeline can run, in the order it runs them."""
COMMANDS: tuple[str, ...] = tuple(dict.fromkeys(spec.command for spec in STAGE_SPECS))
"""The ``llmrl`` subcommands the stages run (each has a config file): prepare, sft, grpo, eval."""
ALIASES: dict[str, str] = {"evaluate": "eval"}
"""Other names users give a command."""
EVALUATED: tuple[str, ...] = tuple(s.evaluates for s in STAGE_SPECS if s.evaluates)
"""Models evaluated on the held-out split, in order: the base model, after SFT, after GRPO."""
TITLES: dict[str, str] = {s.evaluates: s.title or s.evaluates for s in STAGE_SPECS if s.evaluates}
"""How reports name an evaluated model: ``{"base": "base model", "sft": "after SFT", ...}``."""
STARTABLE: tuple[str, ...] = tuple(spec.name for spec in STAGE_SPECS if spec.startable)
"""Stages ``start_from`` can replace with a path: prepare, sft, grpo."""


def _commands(flag: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.command for s in STAGE_SPECS if getattr(s, flag)))


RAY_STAGES: tuple[str, ...] = _commands("on_ray")
"""Commands that run as a KubeRay ``RayJob``; the others run as a one-pod ``Job``."""
TRAINING_DRIVERS: tuple[str, ...] = _commands("driver_trains")
"""Ray commands whose driver is the training process (on the trainer group, with its GPUs)."""
TOPOLOGY_STAGES: tuple[str, ...] = _commands("uses_topology")
"""Ray commands that place every role of the topology; the others get the trainer group only."""


def output_of(command: str) -> Output:
    """What a command produces (the first stage running it tells): ``prepare`` -> dataset; an
    unknown command a report."""
    command = command_of(command)
    return next((s.produces for s in STAGE_SPECS if s.command == command), "report")


def command_of(name: str) -> str:
    """The ``llmrl`` command of a stage or command name (aliases resolved): ``eval-sft`` ->
    ``eval``, ``evaluate`` -> ``eval``."""
    name = ALIASES.get(name, name)
    return SPECS[name].command if name in SPECS else name
