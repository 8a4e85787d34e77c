"""Log-probs (and entropy) of given targets without the ``[rows, positions, vocab]`` logits.

A training forward needs only ``log softmax(logits)[target]`` per position (and, for an entropy
bonus, the entropy), yet ``model(...).logits`` materialises every position's fp32 logits and
autograd keeps them for backward: with Qwen's 151,936-token vocabulary, 64 x 256 positions are
10 GB. Here the output layer runs over chunks of positions, so at most ``chunk_size x vocab``
logits exist at once, in forward and in backward.

- :func:`chunked_log_probs`: the computation on final hidden states ``[M, H]`` and the output
  layer's weight. Its backward recomputes each chunk's logits (one extra ``[chunk, H] x [H, V]``
  matmul per chunk: about a third more output-layer FLOPs); with ``M <= chunk_size`` it is
  plain autograd, so small batches pay nothing extra.
- :func:`log_prob_head`: the model's output layer temporarily returns these values instead of
  logits, so the model is still called through its own ``__call__`` (DDP's hooks and FSDP2's
  unsharded parameters, valid only inside the root forward, keep working).
- :func:`forward_log_probs`: one forward of a model, returning the log-probs (and entropy) of
  the targets at the positions its output layer sees; ``chunk_size=None`` takes the plain
  ``.logits`` path.

Example:
    targets = F.pad(input_ids[:, 1:], (0, 1))  # position t predicts token t + 1
    log_probs, entropy = forward_log_probs(
        model, targets, chunk_size=1024, with_entropy=True, input_ids=input_ids
    )
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmrl.models.layers import unwrapped

DEFAULT_LOG_PROB_CHUNK_SIZE = 1024
"""Positions per output-layer chunk: 1024 x 151,936 fp32 logits are 0.6 GB, a few of which
exist at once; the matmuls stay large enough to run at full speed."""


def log_probs_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 ``log softmax(logits)[target]`` per position, and the entropy when asked."""
    log_probs, _, entropy = _stats(logits.float(), targets, with_entropy)
    return log_probs, entropy


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_size: int,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[M]`` fp32 log-probs of ``targets`` (and entropies) under the logits
    ``hidden @ weight.T + bias``, computed ``chunk_size`` positions at a time.

    The logits are computed in the autocast dtype when autocast is on for the device (as a plain
    ``nn.Linear`` would), else in the weight's dtype; softmax statistics are fp32 (fp64 for fp64
    logits). The backward keeps only ``hidden``, ``weight``, ``targets`` and per-position fp32
    values, and recomputes each chunk's logits.
    """
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = weight.dtype
    with torch.autocast(device_type, enabled=False):
        if hidden.shape[0] <= chunk_size:  # one chunk: plain autograd, no recompute
            log_probs, _, entropy = _linear_stats(
                hidden, weight, bias, targets, dtype, with_entropy
            )
            return log_probs, entropy
        return _ChunkedLogProbs.apply(
            hidden, weight, bias, targets, chunk_size, with_entropy, dtype
        )


def _linear_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    dtype: torch.dtype,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    bias = bias.to(dtype) if bias is not None else None
    logits = F.linear(hidden.to(dtype), weight.to(dtype), bias)
    return _stats(logits.to(_stats_dtype(dtype)), targets, with_entropy)


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32, or fp64 for fp64 logits."""
    return torch.promote_types(dtype, torch.float32)


def _stats(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs, logsumexp and entropy ``lse - sum p z`` of fp32 logits ``z``."""
    lse = logits.logsumexp(-1)
    log_probs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        entropy = lse - ((logits - lse.unsqueeze(-1)).exp() * logits).sum(-1)
    return log_probs, lse, entropy


class _ChunkedLogProbs(torch.autograd.Function):
    """Chunked forward and backward of :func:`chunked_log_probs` (autocast off; casts explicit).

    With ``p = softmax(z)`` the gradients per logit ``z_j`` are::

        d log_prob / d z_j = [j == target] - p_j
        d entropy / d z_j  = -p_j (log p_j + entropy)

    (from ``entropy = lse - sum_k p_k z_k`` and ``d p_k / d z_j = p_k ([k == j] - p_j)``).
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        chunk_size: int,
        with_entropy: bool,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = hidden.shape[0]
        log_probs = torch.empty(rows, dtype=_stats_dtype(dtype), device=hidden.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else None
        for start in range(0, rows, chunk_size):
            part = slice(start, start + chunk_size)
            log_probs[part], lse[part], chunk_entropy = _linear_stats(
                hidden[part], weight, bias, targets[part], dtype, with_entropy
            )
            if entropy is not None:
                entropy[part] = chunk_entropy
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.chunk_size, ctx.compute_dtype = chunk_size, dtype
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        none = (None,) * 4
        if grad_log_probs is None and grad_entropy is None:
            return (None, None, None, *none)
        dtype = ctx.compute_dtype
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            grad_hidden = torch.empty_like(hidden) if need_hidden else None
            # fp32 accumulators over chunks, cast to the parameters' dtype at the end
            grad_weight = torch.zeros_like(weight, dtype=lse.dtype) if need_weight else None
            grad_bias = torch.zeros_like(bias, dtype=lse.dtype) if need_bias else None
            for start in range(0, hidden.shape[0], ctx.chunk_size):
                part = slice(start, start + ctx.chunk_size)
                log_p = F.linear(h[part], w, b).to(lse.dtype) - lse[part].unsqueeze(1)
                p = log_p.exp()
                grad_logits = torch.zeros_like(p)
                if grad_log_probs is not None:
                    g = grad_log_probs[part].unsqueeze(1)
                    grad_logits -= p * g
                    grad_logits.scatter_add_(1, targets[part].unsqueeze(1), g)
                if grad_entropy is not None:
                    log_p += entropy[part].unsqueeze(1)
                    grad_logits -= p * log_p * grad_entropy[part].unsqueeze(1)
                del p, log_p
                if grad_bias is not None:
                    grad_bias += grad_logits.sum(0)
                grad_logits = grad_logits.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[part] = grad_logits @ w
                if grad_weight is not None:
                    grad_weight.add_(grad_logits.T @ h[part])
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            *none,
        )


@contextmanager
def log_prob_head(
    model: nn.Module,
    targets: torch.Tensor,
    chunk_size: int,
    with_entropy: bool = False,
    keep: torch.Tensor | None = None,
) -> Iterator[None]:
    """While inside, ``model(...).logits`` holds ``[..., 2]`` values per kept position
    (``[..., 0]`` the log-prob of its target, ``[..., 1]`` its entropy; ``[..., 1]`` wide
    without entropy) instead of ``[..., vocab]`` logits.

    ``targets`` must have the shape of the positions the output layer receives: with
    ``logits_to_keep=k``, the last ``k``. With ``keep`` (a bool mask of that shape too) the
    output layer runs on the ``True`` positions only and ``.logits`` is ``[kept, 2]`` (packed
    rows, whose scored positions are scattered over every row, :mod:`llmrl.policies.packing`).
    Only the calling thread sees the replacement (another thread sampling from the same model
    meanwhile gets logits). Models that scale or cap their logits after the output layer
    (Gemma 2, Cohere) are refused: score them with
    ``chunk_size=None``.
    """
    head = _output_layer(model)
    thread = threading.get_ident()
    with _SWITCH_LOCK:
        switch = head.__dict__.get("forward")
        if not isinstance(switch, _HeadSwitch):
            switch = _HeadSwitch(head)
        if thread in switch.active:
            raise RuntimeError("log_prob_head is already active on this model in this thread")
        switch.active[thread] = (targets, chunk_size, with_entropy, keep)
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            del switch.active[thread]
            if not switch.active:
                switch.remove()


def forward_log_probs(
    model: nn.Module,
    targets: torch.Tensor,
    *,
    chunk_size: int | None,
    with_entropy: bool = False,
    keep: torch.Tensor | None = None,
    **inputs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``model(**inputs)`` reduced to fp32 log-probs of ``targets`` (and entropies), one per
    position the output layer sees (``targets`` has their shape, see :func:`log_prob_head`), or
    ``[kept]`` values of the ``keep`` positions only when a mask is given.

    ``chunk_size=None`` computes them from the model's full ``.logits`` instead.
    """
    if chunk_size is None:
        logits = model(**inputs).logits
        if keep is not None:
            logits, targets = logits[keep], targets[keep]
        return log_probs_from_logits(logits, targets, with_entropy)
    with log_prob_head(model, targets, chunk_size, with_entropy, keep):
        values = model(**inputs).logits
    return values[..., 0], values[..., 1] if with_entropy else None


_SWITCH_LOCK = threading.Lock()


class _HeadSwitch:
    """Installed as an output layer's ``forward``: threads inside :func:`log_prob_head` get
    log-probs, others the layer's own forward."""

    def __init__(self, head: nn.Linear) -> None:
        self.head = head
        self.shadowed = head.__dict__.get("forward")  # an instance-level forward (hooks), if any
        self.original = head.forward
        self.active: dict[int, tuple[torch.Tensor, int, bool, torch.Tensor | None]] = {}
        head.forward = self

    def remove(self) -> None:
        if self.shadowed is None:
            del self.head.forward
        else:
            self.head.forward = self.shadowed

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        settings = self.active.get(threading.get_ident())
        if settings is None:
            return self.original(hidden, *args, **kwargs)
        targets, chunk_size, with_entropy, keep = settings
        if hidden.shape[:-1] != targets.shape:
            raise ValueError(
                f"log_prob_head got hidden states {list(hidden.shape)} for targets "
                f"{list(targets.shape)}; pass one target per position the output layer sees "
                "(mind logits_to_keep)"
            )
        if keep is not None:  # the scored positions only: [kept, H]
            hidden, targets = hidden[keep], targets[keep]
        shape = targets.shape
        log_probs, entropy = chunked_log_probs(
            hidden.reshape(-1, hidden.shape[-1]),
            self.head.weight,
            self.head.bias,
            targets.reshape(-1),
            chunk_size,
            with_entropy,
        )
        values = [log_probs] if entropy is None else [log_probs, entropy]
        return torch.stack(values, -1).view(*shape, len(values))


def _output_layer(model: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` output layer of a causal LM, through DDP / DataParallel /
    ``torch.compile`` wrappers (peft models forward ``get_output_embeddings`` themselves)."""
    model = unwrapped(model)
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, name, None):
            raise ValueError(
                f"the model transforms its logits after the output layer ({name}); score it "
                "with log_prob_chunk_size=None"
            )
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"chunked log-probs need an nn.Linear output layer, got {type(head).__name__}; "
            "score with log_prob_chunk_size=None"
        )
    return head
