"""LoRA adapters pushed alone: engines hold the base model, each push carries the adapter.

With ``lora.sync: adapter`` (:class:`~llmrl.config.common.LoraSettings`) the trainer's weights
differ from the base model only by the adapter, so a push need not carry the model:
:class:`AdapterWeightUpdater` puts the adapter's tensors (peft's names, in ``model.dtype``)
in the Ray object store once and every target loads them over the base it already holds:

- transformers engines: the inference actor's peft model swaps the adapter's tensors in place
  (:meth:`~llmrl.collectors.ray_actors.InferenceActor.load_adapter`);
- vLLM engines: the engine serves it as a new LoRA request per version and unloads the previous
  one (:meth:`~llmrl.policies.vllm_engine.VLLMEngine.load_adapter`); the inference actors in
  front (``fronts``) record the version.

Each target verifies the checksum before loading (a mismatch changes nothing) and returns the
checksum of the adapter it holds; a push reports the adapter's bytes and, for comparison, what
a merged push of the same model would have carried (``merged_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmrl.core.deadlines import Hung, wait_for
from llmrl.core.ray_helpers import import_ray
from llmrl.core.weights_checksum import weights_checksum
from llmrl.transports.weights import (
    PUSH_SETTING,
    Delivery,
    Weights,
    WeightUpdater,
    as_state_dict,
    state_dict_bytes,
)


class AdapterWeightUpdater(WeightUpdater):
    """Pushes a LoRA adapter to engines that hold the base model (see the module docstring).

    Args:
        targets: actors with ``load_adapter(named_tensors, lora_config, version, checksum)``:
            the inference actors (transformers) or the ``VLLMEngine`` actors (vLLM).
        lora_config: the adapter's shape (``LoraSettings.adapter_config()``).
        fronts: the inference actors in front of vLLM targets (their version is set).
        merged_bytes: what a push of the merged model would carry (reported beside).
        source: the adapter's tensors pushed by default.
    """

    def __init__(
        self,
        targets: Sequence[Any],
        *,
        lora_config: dict[str, Any],
        fronts: Sequence[Any] = (),
        merged_bytes: int = 0,
        source: Weights | None = None,
    ) -> None:
        super().__init__(source)
        if not targets:
            raise ValueError("AdapterWeightUpdater needs at least one engine")
        self.targets, self.fronts = list(targets), list(fronts)
        self.lora_config, self.merged_bytes = dict(lora_config), int(merged_bytes)
        self.latest: Any = None  # the last adapter pushed, in the object store
        self.latest_checksum = ""

    def _push(self, weights: Weights, version: int) -> Delivery:
        ray = import_ray("Pushing LoRA adapters to Ray actors")
        state = {name: t.detach().cpu().contiguous() for name, t in as_state_dict(weights).items()}
        checksum = weights_checksum(state)
        self.latest, self.latest_checksum = ray.put(list(state.items())), checksum
        loads = [
            target.load_adapter.remote(self.latest, self.lora_config, version, checksum)
            for target in self.targets
        ]
        held = self._await(loads, version, "load_adapter", "loading")
        if self.fronts:
            stamps = [front.set_version.remote(version) for front in self.fronts]
            self._await(stamps, version, "set_version", "stamping the version")
        return Delivery(state_dict_bytes(state), checksum, tuple(held), self.merged_bytes)

    def restore(self, old: Any, new: Any) -> bool:
        """Put the rebuilt inference actor ``new`` in the place of ``old``: a transformers
        engine loads the last adapter over its base, a vLLM front records the version (its
        engine kept the adapter)."""
        import_ray("Pushing LoRA adapters to Ray actors")
        self.targets = [new if actor == old else actor for actor in self.targets]
        self.fronts = [new if actor == old else actor for actor in self.fronts]
        if self.latest is None:
            return True
        if new in self.targets:
            call = new.load_adapter.remote(
                self.latest, self.lora_config, self.version, self.latest_checksum
            )
        else:
            call = new.set_version.remote(self.version)
        hung = Hung(
            role="inference engine",
            call="load_adapter (restore after a rebuild)",
            phase="loading",
            version=self.version,
            setting=PUSH_SETTING,
        )
        wait_for(call, self.push_timeout_s, hung)
        return True
