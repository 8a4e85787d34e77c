"""The frozen reference model (KL to reference), where ``topology.reference.placement`` puts it.

- ``with_trainer``: every trainer rank holds a frozen copy and scores its own shard before the
  loss (:class:`ReferenceScorer` in :class:`~llmrl.runtime.trainer_rank.TrainerRank`);
- ``dedicated``: one :class:`ReferenceActor` on the reference's own GPUs scores the whole batch
  in the driver, before it is split over the ranks;
- ``none``: no reference (a config asking for one is rejected).

Either way the batch gains ``ref_log_probs`` (assistant tokens only), what
:class:`~llmrl.objectives.GRPOLoss` reads for its ``kl_to_ref`` term.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from llmrl.topology import Placement


class ReferenceScorer:
    """Scores batches with a frozen copy of the starting model.

    Args:
        model: the model spec the run starts from.
        dtype, device: where the copy lives.
        load_options: ``trust_remote_code`` / ``allow_pickled_weights`` (``ModelConfig``).
        packing: score packed sequences (``model.packing``, :mod:`llmrl.policies.packing`).
    """

    def __init__(
        self,
        *,
        model: str,
        dtype: str,
        device: str,
        load_options: dict[str, bool] | None = None,
        packing: bool = True,
    ) -> None:
        from llmrl.envs.transforms import RetrieveLogProb
        from llmrl.models import load_model, load_tokenizer
        from llmrl.policies import TransformersWrapper

        options = load_options or {}
        frozen = load_model(model, dtype=dtype, device=device, **options)
        frozen.requires_grad_(False).eval()
        tokenizer = load_tokenizer(model, trust_remote_code=options.get("trust_remote_code", False))
        self._retrieve = RetrieveLogProb(TransformersWrapper(frozen, tokenizer, packing=packing))

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` with ``ref_log_probs`` written."""
        return self._retrieve.on_step(batch)


class ReferenceActor:
    """A :class:`ReferenceScorer` as a Ray actor on the dedicated reference's GPUs."""

    def __init__(self, **kwargs: Any) -> None:
        """Takes :class:`ReferenceScorer`'s (keyword) arguments."""
        self._scorer = ReferenceScorer(**kwargs)

    def ready(self) -> bool:
        """True once the model is loaded."""
        return True

    def score(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` with ``ref_log_probs`` written."""
        return self._scorer(batch)


def start_reference_actor(
    *,
    placement: Placement,
    model: str,
    dtype: str,
    runtime_env: dict[str, Any] | None,
    load_options: dict[str, bool] | None = None,
    packing: bool = True,
) -> Any:
    """The dedicated reference actor on ``placement.reference``'s first bundle, with the
    resources of the placement's :class:`~llmrl.topology.roles.ReferenceRole` (one GPU)."""
    import ray

    spec, role = placement.specs.reference, placement.reference
    if spec is None or role is None:
        raise ValueError("the topology has no dedicated reference (reference.placement)")
    options = spec.actor_options(role.scheduling_strategy(0))
    if runtime_env:
        options["runtime_env"] = runtime_env
    actor = ray.remote(ReferenceActor).options(**options)
    return actor.remote(
        model=model, dtype=dtype, device="cuda", load_options=load_options, packing=packing
    )
