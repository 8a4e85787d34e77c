"""Config sections shared by the training stages: model, data, optimizer, LoRA, checkpoints,
tracking and generation. Each stage's config composes them (see ``sft.py``, ``grpo.py``,
``evaluate.py``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from llmrl.core.config_loading import (
    MAX_BATCH,
    MAX_LR,
    MAX_ROWS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
    ConfigModel,
)


class ModelConfig(ConfigModel):
    """Which model to start from and where it runs."""

    name: str = Field(
        "smollm2-135m-instruct",
        description="model spec: a known name, a local directory, a .gguf file or a hub id",
    )
    checkpoint: str | None = Field(
        None, description="start from this checkpoint's model/ directory instead of `name`"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="weights dtype (float32 on CPU)"
    )
    device: str = Field("cpu", description="torch device: cpu, cuda, cuda:1, ...")
    precision: Literal["mixed", "pure"] = Field(
        "mixed",
        description="how trainers hold a `dtype` below float32. mixed: float32 master weights "
        "and AdamW state, compute in `dtype` (autocast; FSDP2's MixedPrecisionPolicy), weights "
        "cast to `dtype` when pushed to the engines and saved; pure: parameters and AdamW state "
        "in `dtype` (half the memory, but updates under the dtype's resolution, about 0.4% of "
        "a weight in bfloat16, are rounded away: most of GRPO's)",
    )
    activation_checkpointing: bool | None = Field(
        None,
        description="trainers recompute each decoder layer's activations in backward instead "
        "of keeping them (about a third more compute, a fraction of the memory); "
        "null: on for CUDA devices, off on CPU",
    )
    log_prob_chunk_size: int | None = Field(
        1024,
        ge=1,
        description="trainers compute log-probs (and entropy) from the last hidden states this "
        "many positions at a time, so the [rows, positions, vocabulary] logits never exist at "
        "once (the backward recomputes each chunk's logits); null: all positions at once",
    )
    packing: bool = Field(
        True,
        description="trainers and reference scorers lay a micro-batch's sequences end to end "
        "into a few rows (position ids restarting at each sequence, attention kept within it) "
        "instead of padding every row to the longest: the same log-probs and gradients without "
        "computing the padding; a model whose attention cannot pack is scored padded, with the "
        "reason logged (docs/precision-and-memory.md)",
    )
    trust_remote_code: bool = Field(
        False,
        description="load a model whose folder (or hub repo) names its own Python code "
        "(`auto_map`). RISK: that code runs with this process's rights (files, credentials, "
        "network) as soon as the model loads; turn on only for code you have read or trust",
    )
    allow_pickled_weights: bool = Field(
        False,
        description="load weights stored as pickles (pytorch_model.bin, *.pt, *.pkl) when the "
        "model has no .safetensors. RISK: a crafted pickle can run code when it is read "
        "(torch's weights_only loader narrows this, not to zero); prefer converting to "
        "safetensors",
    )

    @property
    def load_options(self) -> dict[str, bool]:
        """The keyword arguments of :func:`llmrl.models.load_model` that this config sets
        (pass ``trust_remote_code`` alone to ``load_tokenizer``)."""
        return {
            "trust_remote_code": self.trust_remote_code,
            "allow_pickled_weights": self.allow_pickled_weights,
        }

    @property
    def spec(self) -> str:
        """What to load: the checkpoint when given, else the model name."""
        return self.checkpoint or self.name

    @property
    def checkpoints_activations(self) -> bool:
        """Whether trainers use activation checkpointing (``activation_checkpointing``, or on
        CUDA when it is null)."""
        if self.activation_checkpointing is None:
            return self.device.startswith("cuda")
        return self.activation_checkpointing

    def training_problems(self) -> list[str]:
        """Why a trainer cannot train this model as configured (empty when it can); each line
        starts with the field to change."""
        if self.dtype == "float16" and self.precision == "mixed":
            return [
                "model.dtype: float16 mixed precision needs loss scaling, which llmrl's trainers "
                "do not do (small gradients underflow float16's range); use bfloat16 (the same "
                "memory, float32's range) or float32"
            ]
        return []


class DataConfig(ConfigModel):
    """A prepared dataset (the output directory of ``llmrl prepare``)."""

    path: str = Field(description="directory written by `llmrl prepare` (holds manifest.json)")
    max_train_rows: int | None = Field(
        None, ge=1, le=MAX_ROWS, description="use at most this many train rows"
    )
    max_eval_rows: int | None = Field(
        None, ge=1, le=MAX_ROWS, description="use at most this many eval rows"
    )


Beta = Annotated[float, Field(ge=0, lt=1)]
"""An AdamW beta: a moving average's decay, in [0, 1)."""


class OptimizerConfig(ConfigModel):
    """AdamW with warmup and a decay schedule."""

    lr: float = Field(1e-5, gt=0, le=MAX_LR, description="peak learning rate, at most 1")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay, in [0, 1]")
    betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1)")
    grad_clip: float = Field(1.0, gt=0, description="clip the global gradient norm to this")
    warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="linear warmup from 0 to lr over these steps"
    )
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "cosine", description="decay after warmup, down to min_lr_ratio * lr at the last step"
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final lr as a fraction of lr")


class LoraSettings(ConfigModel):
    """Optional LoRA adapters (peft); checkpoints hold the merged model and the adapter."""

    enabled: bool = Field(False, description="train LoRA adapters instead of all weights")
    r: int = Field(16, ge=1, le=MAX_BATCH, description="adapter rank")
    alpha: int = Field(
        32, ge=1, le=MAX_BATCH, description="adapter scaling numerator (scale = alpha / r)"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="names of the linear layers that get adapters",
    )
    sync: Literal["adapter", "merged"] = Field(
        "adapter",
        description=(
            "what a GRPO weight push carries to the inference engines: 'adapter' (the engines "
            "load the base model once and each push carries only the adapter's tensors, about "
            "1% of the model at rank 16; vLLM serves it as a LoRA request) or 'merged' (the "
            "whole model with the adapters merged in, every push)"
        ),
    )

    def adapter_config(self) -> dict[str, Any]:
        """The adapter's shape as engines take it (``load_adapter``'s ``lora_config``)."""
        return {
            "r": self.r,
            "lora_alpha": self.alpha,
            "target_modules": list(self.target_modules),
            "lora_dropout": self.dropout,
        }

    @property
    def pushes_adapter(self) -> bool:
        """Whether weight pushes carry the adapter alone (LoRA on, ``sync: adapter``)."""
        return self.enabled and self.sync == "adapter"


class CheckpointConfig(ConfigModel):
    """Where and how often checkpoints are written, and how a run resumes."""

    dir: str = Field("runs/checkpoints", description="checkpoint directory of this stage")
    every: int = Field(
        50, ge=1, le=MAX_STEPS, description="save every this many steps (and at the end)"
    )
    keep_last: int = Field(2, ge=1, le=MAX_BATCH, description="keep this many newest checkpoints")
    best_metric: str | None = Field(None, description="also keep the best checkpoint by this")
    best_mode: Literal["max", "min"] = Field("max", description="whether higher is better")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: continue from the newest complete checkpoint in `dir`"
    )


class TrackingConfig(ConfigModel):
    """MLflow tracking of this stage."""

    enabled: bool = Field(True, description="log to MLflow")
    experiment: str = Field("llmrl", description="MLflow experiment name")
    tracking_uri: str | None = Field(
        None, description="MLflow URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)"
    )
    parent_run_id: str | None = Field(
        None, description="nest this stage's run under this run (default: $MLFLOW_PARENT_RUN_ID)"
    )
    run_name: str | None = Field(None, description="MLflow run name (default: the stage name)")
    log_samples_every: int = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="log a table of sample generations every this many steps",
    )
    log_checkpoint_files: bool = Field(
        True,
        description="upload each checkpoint (weights and optimizer state) as MLflow artifacts; "
        "false: record its local path as a tag only (large models)",
    )


class GenerationSettings(ConfigModel):
    """Sampling settings (see llmrl.policies.GenerationKwargs)."""

    max_new_tokens: int = Field(
        128, ge=1, le=MAX_TOKENS, description="response length limit in tokens"
    )
    temperature: float = Field(1.0, gt=0, le=100, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling threshold")
    top_k: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="sample among the k most likely tokens"
    )

    def as_kwargs(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments for a policy's ``generate_kwargs``."""
        kwargs = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature}
        kwargs.update(top_p=self.top_p, **({"top_k": self.top_k} if self.top_k else {}))
        return {**kwargs, **extra}


class StageConfig(ConfigModel):
    """Fields every training stage has."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="the model")
    data: DataConfig = Field(description="the prepared dataset")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed for torch, sampling and data order")
    output_dir: str = Field("runs/stage", description="where the stage writes its outputs")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow")
    progress: bool = Field(True, description="show a progress bar")

    @model_validator(mode="before")
    @classmethod
    def _stage_section_defaults(cls, data: Any) -> Any:
        """A section given in part keeps this stage's own defaults for the rest: in a GRPO
        config ``optimizer: {lr: 1.0e-5}`` means GRPO's optimizer (constant schedule) with that
        lr, not :class:`OptimizerConfig`'s generic defaults (cosine)."""
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        for name, field in cls.model_fields.items():
            given = data.get(name)
            if not isinstance(given, dict) or field.default_factory is None:
                continue
            default = field.default_factory()
            if isinstance(default, BaseModel) and default.model_fields_set:
                merged[name] = {**default.model_dump(include=default.model_fields_set), **given}
        return merged

    @model_validator(mode="after")
    def _checkpoint_dir_under_output(self) -> StageConfig:
        checkpoint = getattr(self, "checkpoint", None)
        if checkpoint is not None and "dir" not in checkpoint.model_fields_set:
            checkpoint.dir = f"{self.output_dir}/checkpoints"
        return self


class PythonToolSettings(ConfigModel):
    """The Python interpreter tool (:class:`llmrl.envs.PythonInterpreter`): the model's
    ```python blocks run in a sandbox and their output comes back as a ``tool`` message."""

    enabled: bool = Field(False, description="give the model the Python tool")
    timeout_s: float = Field(
        5.0, gt=0, le=3600, description="wall-clock limit of one python block, in seconds"
    )
    memory_mb: int = Field(256, ge=64, description="address-space limit of one python block")
    max_output_chars: int = Field(
        4000, ge=1, description="stdout/stderr kept from a block (the tool message's size)"
    )
    max_blocks: int = Field(8, ge=1, description="python blocks run per reply, at most")
    os_sandbox: Literal["required", "optional"] = Field(
        "required",
        description="the operating-system boundary around each block (bubblewrap: its own "
        "user, mount, PID and network namespaces on a minimal read-only filesystem). "
        "'required': a block fails with an error saying how to get one when bubblewrap is "
        "missing or user namespaces are refused; 'optional': such blocks run with only "
        "rlimits, seccomp and the audit hook (which modules reading files in C, such as "
        "sqlite or readline, get past), with a warning logged at each run",
    )


class MCPServerSettings(ConfigModel):
    """One MCP server (see :mod:`llmrl.envs.transforms.mcp_tools`): a stdio server started as
    ``command`` + ``args`` (with ``env`` and ``cwd``), or a streamable HTTP server at ``url``."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="the server's name (unique; in error messages and logs)",
    )
    command: str | None = Field(None, description="stdio: the executable that runs the server")
    args: list[str] = Field(default_factory=list, description="stdio: its arguments")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="stdio: extra environment variables (the server sees only HOME, PATH, "
        "USER, ... of ours plus these)",
    )
    cwd: str | None = Field(None, description="stdio: its working directory")
    url: str | None = Field(None, description="streamable HTTP: the server's endpoint URL")
    timeout_s: float = Field(
        30.0, gt=0, le=3600, description="wall-clock limit of one tool call, in seconds"
    )

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerSettings:
        if self.command is None and self.url is None:
            raise ValueError(
                f"server {self.name!r} needs `command` (a stdio server) or `url` "
                "(a streamable HTTP server)"
            )
        if self.command is not None and self.url is not None:
            raise ValueError(
                f"server {self.name!r} has both `command` and `url`: give one (stdio or HTTP)"
            )
        if self.url is not None:
            stdio_only = [k for k in ("args", "env", "cwd") if getattr(self, k)]
            if stdio_only:
                raise ValueError(
                    f"server {self.name!r}: `{'`, `'.join(stdio_only)}` only apply to a stdio "
                    "server (`command`), not to `url`"
                )
            if not self.url.startswith(("http://", "https://")):
                raise ValueError(
                    f"server {self.name!r}: `url` must start with http:// or https://, "
                    f"got {self.url!r}"
                )
        return self


class MCPToolSettings(ConfigModel):
    """Tools of MCP servers (:class:`llmrl.envs.transforms.MCPToolTransform`): the model calls
    them as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and each result comes
    back as a ``tool`` message."""

    enabled: bool = Field(False, description="give the model the tools of `servers`")
    servers: list[MCPServerSettings] = Field(
        default_factory=list, description="the MCP servers (tool names must be unique)"
    )
    max_calls: int = Field(4, ge=1, le=MAX_BATCH, description="tool calls run per reply, at most")
    max_output_chars: int = Field(
        4000, ge=1, le=MAX_TOKENS, description="a tool result is cut to this size"
    )
    start_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="limit for a server to start and list its tools"
    )
    max_restarts: int = Field(
        3, ge=0, le=MAX_BATCH, description="restarts of a crashed server per env worker, at most"
    )

    @model_validator(mode="after")
    def _servers(self) -> MCPToolSettings:
        if self.enabled and not self.servers:
            raise ValueError("`servers` is empty: give at least one server when `enabled`")
        seen: dict[str, int] = {}
        for index, server in enumerate(self.servers):
            if server.name in seen:
                raise ValueError(
                    f"servers[{seen[server.name]}] and servers[{index}] are both named "
                    f"{server.name!r}; server names must be unique"
                )
            seen[server.name] = index
        return self


class ToolSettings(ConfigModel):
    """Tools the model may call during an episode (multi-turn: each tool call and its result
    take a turn, and the episode ends with a reply that calls no tool)."""

    python: PythonToolSettings = Field(
        default_factory=PythonToolSettings, description="the Python interpreter"
    )
    mcp: MCPToolSettings = Field(
        default_factory=MCPToolSettings,
        description="tools of MCP servers (may be on together with `python`)",
    )
    max_turns: int = Field(
        3,
        ge=2,
        le=MAX_BATCH,
        description="assistant replies per episode, at most (tool calls and the final answer); "
        "an episode still calling a tool at the last turn is truncated",
    )

    @property
    def enabled(self) -> bool:
        """Whether any tool is on (episodes may then take several turns)."""
        return self.python.enabled or self.mcp.enabled
