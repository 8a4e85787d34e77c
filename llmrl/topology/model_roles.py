"""The model roles of a topology: a ``teacher``, a ``judge`` and a ``reward_model``.

Each is optional (``Topology.teacher`` ... null: not used) and is either

- engines of its own (``model``): ``engines`` engines of the role's model, each placed on Ray
  like an inference engine (one ``STRICT_PACK`` placement group per engine, a KubeRay worker
  group ``teacher``, ``judge`` or ``reward-model`` on Kubernetes), with the same engine fields
  and rules as :class:`~llmrl.topology.spec.InferenceSpec`; or
- a served endpoint (``url``): the base URL of a ``vllm serve`` (``served_model`` names its
  model; null: the only one it serves). Nothing is placed, so no engines or GPUs are asked for.

Every rule is a row of :data:`llmrl.topology.rules.RULES` (its message names the field, e.g.
``judge.model: required unless url is set: ...``); the url's scheme is checked here.

Example::

    Topology(
        teacher=ModelRoleSpec(model="Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=2),
        judge=ModelRoleSpec(url="http://judge.llm.svc:8000", served_model="judge-32b"),
    )
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmrl.topology.derived import MODEL_ROLES
from llmrl.topology.sections import EngineSpec, with_rules

__all__ = ["MODEL_ROLES", "URL_SCHEMES", "ModelRoleSpec"]

URL_SCHEMES: tuple[str, ...] = ("http://", "https://")
"""How a model role's ``url`` must start."""
Dtype = Literal["float32", "bfloat16", "float16"]


class ModelRoleSpec(EngineSpec):
    """A model role: engines of its own model (``model``), or a served endpoint (``url``).

    The engine fields are the inference engines' (:class:`~llmrl.topology.sections.EngineSpec`);
    with ``url`` they are left at their defaults (one engine, no GPUs given).

    Example::

        ModelRoleSpec(model="HuggingFaceTB/SmolLM2-135M-Instruct", backend="transformers")
        ModelRoleSpec(url="http://judge:8000", served_model="judge")
    """

    # The rules are the same rows for every role: the first role's, relative to its section.
    model_config = with_rules(MODEL_ROLES[0])

    model: str | None = Field(
        None,
        description=(
            "the model the role runs on engines of its own, as a stage's model.name (a model "
            "name, folder or GGUF file); required unless url is set"
        ),
    )
    url: str | None = Field(
        None,
        pattern=r"^https?://",
        description=(
            "base URL (http:// or https://) of a served endpoint (vllm serve) the role calls "
            "instead of engines of its own; nothing is placed for it"
        ),
    )
    served_model: str | None = Field(
        None,
        description="the model's name on the url's server; null: the only model it serves",
    )
    dtype: Dtype = Field("bfloat16", description="dtype of the role's own engines' weights")

    @field_validator("url", mode="before")
    @classmethod
    def _http_url(cls, url: object) -> object:
        if isinstance(url, str) and not url.startswith(URL_SCHEMES):
            raise ValueError(
                f"must start with http:// or https:// (the base URL of a vllm serve, e.g. "
                f"http://judge:8000), got {url!r}"
            )
        return url

    @property
    def remote(self) -> bool:
        """Whether the role calls a served endpoint (``url``) rather than placing engines."""
        return self.url is not None
