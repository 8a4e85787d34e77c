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


class ReferenceScorer:
    """Scores batches with a frozen copy of the starting model.

    Args:
        model: the model spec the run starts from.
        dtype, device: where the copy lives.
    """

    def __init__(self, model: str, dtype: str, device: str) -> None:
        from llmrl.envs.transforms import RetrieveLogProb
        from llmrl.models import load_model, load_tokenizer
        from llmrl.policies import TransformersWrapper

        frozen = load_model(model, dtype=dtype, device=device).requires_grad_(False).eval()
        self._retrieve = RetrieveLogProb(TransformersWrapper(frozen, load_tokenizer(model)))

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` with ``ref_log_probs`` written."""
        return self._retrieve.on_step(batch)


class ReferenceActor:
    """A :class:`ReferenceScorer` as a Ray actor on the dedicated reference's GPUs."""

    def __init__(self, model: str, dtype: str, device: str) -> None:
        self._scorer = ReferenceScorer(model, dtype, device)

    def ready(self) -> bool:
        """True once the model is loaded."""
        return True

    def score(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` with ``ref_log_probs`` written."""
        return self._scorer(batch)


def start_reference_actor(
    placement: Any, model: str, dtype: str, runtime_env: dict[str, Any] | None
) -> Any:
    """The dedicated reference actor on ``placement.reference``'s first bundle (one GPU)."""
    import ray

    options: dict[str, Any] = {
        "num_cpus": 0,
        "num_gpus": 1,
        "scheduling_strategy": placement.reference.scheduling_strategy(0),
    }
    if runtime_env:
        options["runtime_env"] = runtime_env
    return ray.remote(ReferenceActor).options(**options).remote(model, dtype, "cuda")
