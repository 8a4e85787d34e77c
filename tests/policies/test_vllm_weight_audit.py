"""The worker extension's audit: the checksum of what a model's ``load_weights`` was given.

Runs without vLLM: a stand-in worker holds a model whose ``load_weights`` consumes its pairs as
vLLM's models do (a generator, read once).
"""

from __future__ import annotations

import pytest
import torch

from llmrl.core.weights_checksum import weights_checksum
from llmrl.policies.vllm_worker_extension import WeightAuditWorkerExtension


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
        return set(self.loaded)


class Runner:
    def __init__(self, model: Model) -> None:
        self.model = model

    def get_model(self) -> Model:
        return self.model


class Worker(WeightAuditWorkerExtension):
    def __init__(self) -> None:
        self.model_runner = Runner(Model())


def test_the_audit_checksums_exactly_what_the_model_loaded():
    worker = Worker()
    model = worker.model_runner.get_model()
    first = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    second = {"c": torch.zeros(2)}
    worker.begin_weight_audit()
    model.load_weights(iter(first.items()))  # chunks, as NCCL's packed consumer calls it
    model.load_weights(iter(second.items()))
    assert worker.end_weight_audit() == weights_checksum({**first, **second})
    assert "load_weights" not in vars(model), "the recorder is removed"
    model.load_weights(iter({"d": torch.ones(1)}.items()))  # not recorded any more
    worker.begin_weight_audit()
    changed = {**first, "a": first["a"] + 1e-3}
    model.load_weights(changed.items())
    assert worker.end_weight_audit() == weights_checksum(changed) != weights_checksum(first)


def test_an_audit_that_was_never_begun_is_an_error_and_a_second_begin_restarts():
    worker = Worker()
    with pytest.raises(RuntimeError, match="without begin_weight_audit"):
        worker.end_weight_audit()
    model = worker.model_runner.get_model()
    worker.begin_weight_audit()
    model.load_weights([("x", torch.ones(2))])
    worker.begin_weight_audit()  # a push that failed half-way left an audit open
    model.load_weights([("y", torch.ones(3))])
    assert worker.end_weight_audit() == weights_checksum({"y": torch.ones(3)})
    assert model.loaded.keys() == {"x", "y"}, "loads go through to the model"
