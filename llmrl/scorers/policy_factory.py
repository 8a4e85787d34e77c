"""`ScoringPolicyFactory`: the policy of a model role (teacher, judge), built where it runs.

A model role (``topology.teacher``, ``topology.judge``) either runs a model of its own or uses
a served one; the factory is the picklable recipe, handed to a Ray actor (or called in the
caller's process for a URL), that builds the :class:`~llmrl.policies.LLMWrapperBase` the
role's scorer drives:

- ``backend="transformers"``: a :class:`~llmrl.policies.TransformersWrapper` over the model
  loaded by :func:`llmrl.models.load_model` (frozen, eval mode) on ``device``;
- ``backend="vllm"``: a :class:`~llmrl.policies.vLLMWrapper` over a
  :class:`~llmrl.policies.vllm_engine.VLLMEngine` in this process (in the role's Ray actor when
  it runs in one; tensor parallel above one GPU through vLLM's Ray executor);
- ``url``: a :class:`~llmrl.policies.vLLMWrapper` over the ``vllm serve`` process at ``url``
  (:class:`~llmrl.policies.remote_vllm.RemoteVLLMEngine`); nothing is loaded but the tokenizer.

Example:
    >>> factory = ScoringPolicyFactory(url="http://judge:8000", tokenizer="smollm2-135m-instruct")
    >>> factory.name, factory.tokenizer_spec
    ('http://judge:8000', 'smollm2-135m-instruct')
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from llmrl.policies.remote_vllm import URL_SCHEMES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llmrl.policies import LLMWrapperBase
    from llmrl.topology.model_roles import ModelRoleSpec

Backend = Literal["transformers", "vllm"]
BACKENDS: tuple[str, ...] = ("transformers", "vllm")


@dataclass(frozen=True, kw_only=True)
class ScoringPolicyFactory:
    """Builds a model role's policy (picklable; see the module docstring).

    Args:
        model: the model spec the role runs (a known name, a directory, a GGUF file or a hub
            id); exactly one of ``model`` and ``url``.
        url: ``http(s)://host:port`` of a ``vllm serve`` process serving the role's model.
        served_model: the model name at ``url`` (None: the first one the server lists).
        tokenizer: the tokenizer's model spec; None: ``model``, else ``served_model`` (a URL
            role whose served name is no loadable spec needs it).
        backend: ``transformers`` or ``vllm`` (ignored with ``url``).
        dtype, device: where the transformers model lives; vLLM takes ``dtype`` and its own
            devices.
        tensor_parallel_size, gpu_memory_utilization, cpu_kv_cache_gb, enforce_eager,
            max_model_len: the vLLM engine's settings (:class:`VLLMEngine`).
        seed: the vLLM engine's seed (scoring and greedy answers draw nothing).
        threads: torch CPU threads of the process (None: leave torch's choice).
        load_options: ``trust_remote_code`` / ``allow_pickled_weights`` (``ModelConfig``).
    """

    model: str | None = None
    url: str | None = None
    served_model: str | None = None
    tokenizer: str | None = None
    backend: Backend = "transformers"
    dtype: str = "float32"
    device: str = "cpu"
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    cpu_kv_cache_gb: float = 1.0
    enforce_eager: bool | None = None
    max_model_len: int | None = None
    seed: int = 0
    threads: int | None = None
    load_options: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.model is None) == (self.url is None):
            raise ValueError(
                "a scoring policy needs exactly one of model (a model of its own) and url "
                f"(a served one); got model={self.model!r}, url={self.url!r}"
            )
        if self.url is not None and not self.url.startswith(URL_SCHEMES):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")

    @classmethod
    def from_role(
        cls,
        role: ModelRoleSpec,
        *,
        tokenizer: str | None = None,
        seed: int = 0,
        threads: int | None = None,
        max_model_len: int | None = None,
        load_options: dict[str, bool] | None = None,
    ) -> ScoringPolicyFactory:
        """The factory of one engine of a topology's model role (``topology.judge`` ...): its
        model or url, backend, dtype and vLLM settings; a transformers engine with a GPU
        (``engine_gpus``) runs on ``cuda``. The other arguments are the run's."""
        return cls(
            model=role.model,
            url=role.url,
            served_model=role.served_model,
            tokenizer=tokenizer,
            backend=role.backend,
            dtype=role.dtype,
            device="cuda" if role.url is None and role.engine_gpus > 0 else "cpu",
            tensor_parallel_size=role.tensor_parallel_size,
            gpu_memory_utilization=role.gpu_memory_utilization,
            cpu_kv_cache_gb=role.cpu_kv_cache_gb,
            enforce_eager=role.enforce_eager,
            max_model_len=max_model_len,
            seed=seed,
            threads=threads,
            load_options=dict(load_options or {}),
        )

    @property
    def name(self) -> str:
        """The role's model, as messages name it: the model spec, or the URL."""
        return self.model if self.model is not None else str(self.url)

    @property
    def tokenizer_spec(self) -> str:
        """The model spec the tokenizer is loaded from (see ``tokenizer``)."""
        spec = self.tokenizer or self.model or self.served_model
        if spec is None:
            raise ValueError(
                f"the model served at {self.url} needs its tokenizer: set tokenizer (a model "
                "spec with the served model's tokenizer) or served_model"
            )
        return spec

    def load_tokenizer(self) -> PreTrainedTokenizerBase:
        """The role's tokenizer (prompts are tokenized here whatever the backend)."""
        from llmrl.models import load_tokenizer

        trust = bool(self.load_options.get("trust_remote_code", False))
        return load_tokenizer(self.tokenizer_spec, trust_remote_code=trust)

    def __call__(self) -> LLMWrapperBase:
        """The role's policy, its model loaded (or its server reached) in this process."""
        if self.threads:
            torch.set_num_threads(self.threads)
        tokenizer = self.load_tokenizer()
        if self.url is not None:
            return self._remote(tokenizer)
        if self.backend == "vllm":
            return self._vllm(tokenizer)
        return self._transformers(tokenizer)

    def _transformers(self, tokenizer: PreTrainedTokenizerBase) -> LLMWrapperBase:
        from llmrl.models import load_model
        from llmrl.policies import TransformersWrapper

        assert self.model is not None
        model = load_model(self.model, dtype=self.dtype, device=self.device, **self.load_options)
        model.requires_grad_(False).eval()
        return TransformersWrapper(model, tokenizer)

    def _vllm(self, tokenizer: PreTrainedTokenizerBase) -> LLMWrapperBase:
        from llmrl.policies.vllm_engine import VLLMEngine
        from llmrl.policies.vllm_wrapper import vLLMWrapper

        assert self.model is not None
        engine = VLLMEngine(
            self.model,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            dtype=self.dtype,
            seed=self.seed,
            enforce_eager=self.enforce_eager,
            cpu_kv_cache_gb=self.cpu_kv_cache_gb,
            max_model_len=self.max_model_len,
            # vLLM reads safetensors only: allow_pickled_weights has nothing to switch
            trust_remote_code=bool(self.load_options.get("trust_remote_code", False)),
        )
        return vLLMWrapper(engine, tokenizer)

    def _remote(self, tokenizer: PreTrainedTokenizerBase) -> LLMWrapperBase:
        from llmrl.policies.remote_vllm import RemoteVLLMEngine
        from llmrl.policies.vllm_wrapper import vLLMWrapper

        assert self.url is not None
        return vLLMWrapper(RemoteVLLMEngine(self.url, model=self.served_model), tokenizer)


def close_policy(policy: LLMWrapperBase) -> None:
    """Stop what a factory's policy started: its request batcher, and the engines it holds in
    this process (a vLLM engine's processes, a remote engine's connections). Ray actor engines
    belong to whoever started them and are left alone."""
    policy.close()
    ray = sys.modules.get("ray")
    for engine in getattr(policy, "engines", []):
        if ray is not None and isinstance(engine, ray.actor.ActorHandle):
            continue
        close: Any = getattr(engine, "close", None)
        if callable(close):
            close()
