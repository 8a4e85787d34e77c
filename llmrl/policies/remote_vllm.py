"""`RemoteVLLMEngine`: a vLLM server in another process (``vllm serve``), used by URL.

It speaks :class:`~llmrl.policies.vllm_engine.VLLMEngine`'s plain-data API (``generate``,
``prompt_log_probs``) over vLLM's OpenAI-compatible ``/v1/completions`` endpoint, so
:class:`~llmrl.policies.vLLMWrapper` and the eval stage (``engine_url``) use a served model
exactly like an engine of their own. Prompts travel as token ids and answers come back as token
ids (vLLM's ``return_token_ids``), so nothing is re-tokenized on the way; log-probs are the
server's raw ones (vLLM's default ``logprobs_mode``), the quantity llmrl's engines report.

Each prompt is one request (its own ``seed``), sent ``max_parallel`` at a time: the server
batches concurrent requests itself.

Example:
    engine = RemoteVLLMEngine("http://localhost:8000")   # `vllm serve MODEL --port 8000`
    policy = vLLMWrapper(engine, tokenizer, generate_kwargs={"max_new_tokens": 64})
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llmrl.policies.vllm_engine import Sample

URL_SCHEMES = ("http://", "https://")


class RemoteEngineError(RuntimeError):
    """The server could not be reached or answered with an error; the message names the URL."""


class RemoteVLLMEngine:
    """A ``vllm serve`` process used through its OpenAI-compatible API.

    Args:
        url: the server's base URL (``http://host:port``; a trailing ``/v1`` is accepted).
        model: the served model name; None takes the only (or first) one ``/v1/models`` lists.
        timeout_s: seconds one request may take.
        max_parallel: requests in flight at once.
        api_key: sent as a bearer token (``vllm serve --api-key``).

    Raises:
        RemoteEngineError: the server does not answer ``/v1/models`` or serves no model.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        timeout_s: float = 600.0,
        max_parallel: int = 64,
        api_key: str | None = None,
    ) -> None:
        import httpx

        if not url.startswith(URL_SCHEMES):
            raise ValueError(f"engine URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)
        self.max_parallel = max_parallel
        self.model = model or self._served_model()

    def _served_model(self) -> str:
        listed = [entry["id"] for entry in self._request("GET", "/v1/models").get("data", [])]
        if not listed:
            raise RemoteEngineError(f"{self.url} serves no model (/v1/models is empty)")
        return listed[0]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as error:
            raise RemoteEngineError(f"{self.url}{path}: {type(error).__name__}: {error}") from error
        if response.status_code >= 400:
            raise RemoteEngineError(
                f"{self.url}{path} answered {response.status_code}: {response.text[:500]}"
            )
        return response.json()

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/completions", {"model": self.model, **body})

    def _map(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(bodies) <= 1:
            return [self._complete(body) for body in bodies]
        with ThreadPoolExecutor(min(self.max_parallel, len(bodies))) as pool:
            return list(pool.map(self._complete, bodies))

    # ------------------------------------------------------------------ the engine API
    def generate(
        self,
        prompts: list[list[int]],
        sampling: dict[str, Any],
        return_log_probs: bool = True,
        seeds: list[int] | None = None,
    ) -> list[list[Sample]]:
        """Like :meth:`VLLMEngine.generate`: ``sampling`` holds ``vllm.SamplingParams``
        keyword arguments (``GenerationKwargs.to_vllm()``), sent as request fields."""
        bodies = []
        for index, prompt in enumerate(prompts):
            body = {
                **{key: value for key, value in sampling.items() if value is not None},
                "prompt": [int(t) for t in prompt],
                "return_token_ids": True,
                "logprobs": 0 if return_log_probs else None,
            }
            if seeds is not None:
                body["seed"] = int(seeds[index])
            bodies.append(body)
        results = []
        for answer in self._map(bodies):
            samples = []
            for choice in sorted(answer["choices"], key=lambda c: c["index"]):
                tokens = [int(t) for t in choice["token_ids"]]
                log_probs = None
                if return_log_probs:
                    log_probs = [float(v) for v in choice["logprobs"]["token_logprobs"]]
                    if len(log_probs) != len(tokens):
                        raise RemoteEngineError(
                            f"{self.url} returned {len(log_probs)} log-probs for "
                            f"{len(tokens)} sampled tokens"
                        )
                samples.append((tokens, log_probs, choice["finish_reason"] == "stop"))
            results.append(samples)
        return results

    def prompt_log_probs(self, sequences: list[list[int]]) -> list[list[float]]:
        """Like :meth:`VLLMEngine.prompt_log_probs`: ``[0.0, lp(t1 | t0), ...]`` per sequence."""
        kept = [i for i, sequence in enumerate(sequences) if sequence]
        bodies = [
            {
                "prompt": [int(t) for t in sequences[i]],
                "max_tokens": 1,
                "temperature": 1.0,
                "prompt_logprobs": 0,
            }
            for i in kept
        ]
        results: list[list[float]] = [[] for _ in sequences]
        for index, answer in zip(kept, self._map(bodies), strict=True):
            results[index] = _prompt_log_probs(
                sequences[index], answer["choices"][0].get("prompt_logprobs"), self.url
            )
        return results

    def close(self) -> None:
        """Close the HTTP connections (the server keeps running)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"RemoteVLLMEngine({self.url!r}, model={self.model!r})"


def _prompt_log_probs(sequence: Sequence[int], entries: Any, url: str) -> list[float]:
    """``[0.0, lp(t1 | t0), ...]`` from the server's ``prompt_logprobs`` (a list whose first
    entry is null, then one ``{token id: {"logprob": ...}}`` per position)."""
    if entries is None or len(entries) != len(sequence):
        got = None if entries is None else len(entries)
        raise RemoteEngineError(f"{url} returned {got} prompt log-probs for {len(sequence)} tokens")
    values = [0.0]
    for position in range(1, len(sequence)):
        entry = entries[position]
        values.append(float(entry[str(int(sequence[position]))]["logprob"]))
    return values
