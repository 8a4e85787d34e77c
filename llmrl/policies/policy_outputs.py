"""Write a policy's results into the output TensorDict, with the same containers for every
backend: ``history`` (history mode), ``text``, ``tokens``, ``masks``, ``log_probs`` (and, when
scoring and asked, ``logits`` and ``entropy``).

Ragged by default (each row keeps its own length); with ``pad_output=True`` the token-aligned
containers are padded (prompts left, responses right, see :mod:`llmrl.data.padding`) and
``masks`` marks the real positions.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase, lazy_stack

from llmrl.data import ChatHistory, History, LogProbs, Masks, Text, Tokens, pad_sequences
from llmrl.policies.io_spec import GeneratedSample, PolicyIOSpec, ScoreResult
from llmrl.policies.policy_inputs import PolicyInputs


def write_outputs(
    spec: PolicyIOSpec,
    td: TensorDictBase,
    inputs: PolicyInputs,
    samples: list[GeneratedSample] | None = None,
    scores: ScoreResult | None = None,
) -> TensorDictBase:
    """The output batch: ``[B]`` when scoring, ``[B, G]`` when sampling G > 1 per prompt.

    Keys, layout, sample count and decoding are ``spec``'s; ``samples`` (when sampling) or
    ``scores`` (when scoring) are the backend's results for the ``inputs`` read from ``td``."""
    if samples is not None:
        return _write_samples(spec, td, inputs, samples)
    assert scores is not None
    return _write_scores(spec, td, inputs, scores)


def _write_samples(
    spec: PolicyIOSpec,
    td: TensorDictBase,
    inputs: PolicyInputs,
    samples: list[GeneratedSample],
) -> TensorDictBase:
    group = spec.num_samples
    batch = td.batch_size[0]
    if len(samples) != batch * group:
        raise RuntimeError(
            f"backend returned {len(samples)} samples for {batch} prompts x {group} samples"
        )
    index = torch.arange(batch).repeat_interleave(group)
    out = td[index]
    assert inputs.prompt_tokens is not None and inputs.assistant_masks is not None
    prompts = [inputs.prompt_tokens[i] for i in index.tolist()]
    responses = [sample.tokens for sample in samples]
    prompt_assistant = [inputs.assistant_masks[i] for i in index.tolist()]
    response_assistant = [torch.ones_like(r, dtype=torch.bool) for r in responses]

    tokens = Tokens.from_sequences(prompt=prompts, response=responses)
    _set_token_aligned(spec, out, tokens, prompt_assistant, response_assistant)
    if spec.return_log_probs:
        log_probs = LogProbs.from_sequences(response=[s.log_probs for s in samples])
        _set_log_probs(spec, out, log_probs)

    texts = [spec.decode_response(sample) for sample in samples]
    prompt_text = [inputs.prompt_text[i] for i in index.tolist()] if inputs.prompt_text else None
    out.set(spec.keys["text"], Text.from_strings(prompt=prompt_text, response=texts))
    if inputs.prompt_history is not None:
        replies = [
            {
                "role": "assistant",
                "content": spec.decode_response(sample, content_only=True),
                "is_complete": sample.finished,
            }
            for sample in samples
        ]
        out.set(
            spec.keys["history"],
            ChatHistory.from_histories(
                inputs.prompt_history[index], History.from_messages(replies)
            ),
        )
    return out.unflatten(0, (batch, group)) if group > 1 else out


def _write_scores(
    spec: PolicyIOSpec, td: TensorDictBase, inputs: PolicyInputs, scores: ScoreResult
) -> TensorDictBase:
    out = td.clone(False)
    fulls = inputs.full_tokens
    assert fulls is not None
    prompts = inputs.prompt_tokens
    tokens = _split_like_prompts(Tokens, fulls, prompts)
    assistant = inputs.assistant_masks
    if prompts is not None and assistant is not None:
        split = [(a[: len(p)], a[len(p) :]) for a, p in zip(assistant, prompts, strict=True)]
        _set_token_aligned(spec, out, tokens, [s[0] for s in split], [s[1] for s in split])
    else:
        _set_token_aligned(spec, out, tokens, None, None, full_assistant=assistant)
    if spec.return_log_probs:
        log_probs = _per_token(scores.log_probs, fulls, prompts)
        _set_log_probs(spec, out, log_probs)
    if scores.entropy is not None:
        _set_log_probs(spec, out, _per_token(scores.entropy, fulls, prompts), "entropy")
    if scores.logits is not None:
        logits = [scores.logits[row, : len(full)] for row, full in enumerate(fulls)]
        out.set(
            "logits",
            pad_sequences(logits, "right", 0.0)[0] if spec.pad_output else lazy_stack(logits),
        )
    if inputs.full_text is not None and spec.input_mode != "text":
        out.set(spec.keys["text"], Text.from_strings(full=inputs.full_text))
    return out


def _per_token(
    values: torch.Tensor, fulls: list[torch.Tensor], prompts: list[torch.Tensor] | None
) -> LogProbs:
    """Right-padded ``[N, L]`` per-token values (log-probs, entropies) as a ragged
    :class:`LogProbs`, split into prompt and response when the prompts are known."""
    rows = [values[row, : len(full)] for row, full in enumerate(fulls)]
    return _split_like_prompts(LogProbs, rows, prompts)


def _split_like_prompts(
    container: type, fulls: list[torch.Tensor], prompts: list[torch.Tensor] | None
) -> Any:
    """A ragged token-aligned ``container`` of the ``fulls`` rows, with ``prompt`` and
    ``response`` fields cut at each prompt's length when the prompts are known."""
    if prompts is None:
        return container.from_sequences(full=fulls)
    cut = [len(p) for p in prompts]
    return container.from_sequences(
        prompt=[f[:c] for f, c in zip(fulls, cut, strict=True)],
        response=[f[c:] for f, c in zip(fulls, cut, strict=True)],
        full=fulls,
    )


def _set_token_aligned(
    spec: PolicyIOSpec,
    out: TensorDictBase,
    tokens: Tokens,
    prompt_assistant: list[torch.Tensor] | None,
    response_assistant: list[torch.Tensor] | None,
    full_assistant: list[torch.Tensor] | None = None,
) -> None:
    """Set ``tokens`` and ``masks``, padded or ragged as ``spec.pad_output`` asks."""
    if spec.pad_output:
        padded, masks = tokens.pad(spec.pad_token_id)
        if prompt_assistant is not None and response_assistant is not None:
            masks.assistant = torch.cat(
                [
                    pad_sequences(prompt_assistant, "left", False)[0],
                    pad_sequences(response_assistant, "right", False)[0],
                ],
                dim=1,
            )
        elif full_assistant is not None:
            masks.assistant = pad_sequences(full_assistant, "right", False)[0]
        out.set(spec.keys["tokens"], padded)
        out.set(spec.keys["masks"], masks)
        return
    out.set(spec.keys["tokens"], tokens)
    out.set(
        spec.keys["masks"],
        _ragged_masks(tokens, prompt_assistant, response_assistant, full_assistant),
    )


def _ragged_masks(
    tokens: Tokens,
    prompt_assistant: list[torch.Tensor] | None,
    response_assistant: list[torch.Tensor] | None,
    full_assistant: list[torch.Tensor] | None,
) -> Masks:
    fields = {
        name: tokens.as_list(name) for name in ("prompt", "response", "full") if tokens.has(name)
    }
    rows = []
    for row in range(tokens.batch_size[0]):
        valid = {
            name: torch.ones_like(seqs[row], dtype=torch.bool) for name, seqs in fields.items()
        }
        if prompt_assistant is not None and response_assistant is not None:
            valid["assistant"] = torch.cat([prompt_assistant[row], response_assistant[row]])
        elif full_assistant is not None:
            valid["assistant"] = full_assistant[row]
        rows.append(Masks(**valid))
    return lazy_stack(rows)


def _set_log_probs(
    spec: PolicyIOSpec, out: TensorDictBase, log_probs: LogProbs, key: str | None = None
) -> None:
    """Set per-token values (padded with 0 or ragged, as ``spec.pad_output`` asks) at ``key``
    (default the log-probs key)."""
    if spec.pad_output:
        log_probs, _ = log_probs.pad(0.0)
    out.set(key or spec.keys["log_probs"], log_probs)
