"""`RayObjectStoreWeightUpdater`: weights to Ray inference actors through the object store."""

from __future__ import annotations

from typing import Any

from llmrl.core.deadlines import Hung, wait_for
from llmrl.core.ray_helpers import import_ray
from llmrl.core.weights_checksum import weights_checksum
from llmrl.transports.packed_weights import PackedStateDict
from llmrl.transports.weights import (
    PUSH_SETTING,
    Delivery,
    Weights,
    WeightUpdater,
    as_state_dict,
)


class RayObjectStoreWeightUpdater(WeightUpdater):
    """Weights to Ray inference actors through the object store (one ``ray.put``).

    Args:
        inference_actors: actor handles of :class:`~llmrl.collectors.ray_actors.
            InferenceActor` (``load_state_dict(weights, version, checksum)``, which verifies,
            loads and returns the checksum of what it then holds) or of
            :class:`~llmrl.policies.vllm_engine.VLLMEngine` (``load_weights``, which verifies
            the checksum, loads through vLLM and resets the prefix cache).
        source: the trainer model pushed by default.

    InferenceActors get a :class:`~llmrl.transports.packed_weights.PackedStateDict` (numpy
    arrays, read without a copy; tied tensors once). Bytes count what is put in the object
    store (once, whatever the actor count). The last pushed state dict stays there
    (``latest``, an object reference, with its version and checksum) so that :meth:`restore`
    can load it into an actor rebuilt after a crash.
    """

    def __init__(self, inference_actors: list[Any], source: Weights | None = None) -> None:
        super().__init__(source)
        if not inference_actors:
            raise ValueError("RayObjectStoreWeightUpdater needs at least one inference actor")
        self.inference_actors = list(inference_actors)
        self.latest: Any = None
        self.latest_checksum = ""

    def restore(self, old: Any, new: Any) -> bool:
        """Put the actor ``new`` in the place of ``old`` (a dead one) and load the last pushed
        weights and version into it (an InferenceActor; nothing to load before a push).
        Handles are compared by actor id: ``old`` may be a copy received from another
        process."""
        import_ray("Pushing weights to Ray actors")  # the extra is named before any call
        self.inference_actors = [new if actor == old else actor for actor in self.inference_actors]
        if self.latest is not None:
            index = next((i for i, a in enumerate(self.inference_actors) if a == new), None)
            load = new.load_state_dict.remote(self.latest, self.version, self.latest_checksum)
            wait_for(load, self.push_timeout_s, self._restoring(index))
        return True

    def _restoring(self, index: int | None) -> Hung:
        return Hung(
            role="inference engine",
            index=index,
            call="load_state_dict (restore after a rebuild)",
            phase="loading",
            version=self.version,
            setting=PUSH_SETTING,
        )

    def _push(self, weights: Weights, version: int) -> Delivery:
        ray = import_ray("Pushing weights to Ray actors")
        state = {name: tensor.detach().cpu() for name, tensor in as_state_dict(weights).items()}
        checksum = weights_checksum(state)
        packed, as_pairs = None, None
        calls = []
        nbytes = 0
        for actor in self.inference_actors:
            if hasattr(actor, "load_state_dict"):  # an InferenceActor: numpy, zero-copy reads
                if packed is None:
                    packed = PackedStateDict.pack(state)
                    nbytes += packed.nbytes
                    self.latest, self.latest_checksum = ray.put(packed), checksum
                calls.append(actor.load_state_dict.remote(self.latest, version, checksum))
            else:  # a VLLMEngine actor
                if as_pairs is None:
                    as_pairs = ray.put(list(state.items()))
                    nbytes += sum(t.numel() * t.element_size() for t in state.values())
                calls.append(actor.load_weights.remote(as_pairs, version, checksum))
        # an InferenceActor returns the checksum of what it holds; a VLLMEngine the bytes it
        # loaded, after verifying the tensors against `checksum` (vLLM's fused parameters
        # cannot be fingerprinted under the trainer's names): it reports the verified one
        results = self._await(calls, version, "load_state_dict / load_weights", "loading")
        engines = tuple(r if isinstance(r, str) else checksum for r in results)
        return Delivery(nbytes, checksum, engines)
