"""How llmrl talks to an MLflow tracking server: one policy for the stages and the flow.

A dead server must cost seconds, never minutes: stages spool while it is away
(:mod:`llmrl.tracking.connection`), the flow fails the call and lets Prefect retry it. The policy:

- the server is probed at ``<uri>/health`` with a :data:`REQUEST_TIMEOUT_S` timeout before a
  run is opened or the flow touches its parent run (:func:`server_problem`,
  :func:`require_server`);
- a stage process (which owns its process) turns MLflow's own HTTP retries off and its request
  timeout down to the same value (:func:`configure_client_env`, defaults only: values already
  in the environment win). The flow never changes its process environment: the stage processes
  it starts inherit that environment unchanged, so the two cannot fight over these settings.

SQLite and file stores are local: nothing to probe, no HTTP settings.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Any

REQUEST_TIMEOUT_S = 5.0
"""Seconds an MLflow request (and the health probe) may take before the server counts as down."""


class TrackingUnavailableError(ConnectionError):
    """The MLflow tracking server did not answer; the message names it and why."""


def is_remote(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is an http(s) tracking server (not a local SQLite/file store)."""
    return tracking_uri.startswith(("http://", "https://"))


def client_env(tracking_uri: str) -> dict[str, str]:
    """The MLflow client settings of the policy, as environment variables."""
    env = {"MLFLOW_DISABLE_TELEMETRY": "true"}
    if is_remote(tracking_uri):
        env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        env["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(REQUEST_TIMEOUT_S))
    return env


def configure_client_env(tracking_uri: str) -> None:
    """Apply :func:`client_env` to this process as defaults (stage processes only)."""
    for key, value in client_env(tracking_uri).items():
        os.environ.setdefault(key, value)


def server_problem(tracking_uri: str, timeout: float | None = None) -> str | None:
    """None when an http(s) server answers ``/health`` (or the store is local), else why not."""
    if not is_remote(tracking_uri):
        return None
    if timeout is None:
        timeout = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or REQUEST_TIMEOUT_S)
    try:
        with urllib.request.urlopen(tracking_uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError:  # it answered: reachable (auth or proxy quirks)
        return None
    except (OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"


def require_server(tracking_uri: str) -> None:
    """Raise :class:`TrackingUnavailableError` when the server does not answer its probe."""
    problem = server_problem(tracking_uri, REQUEST_TIMEOUT_S)
    if problem is not None:
        raise TrackingUnavailableError(f"MLflow at {tracking_uri} is unreachable: {problem}")


def mlflow_client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` of ``tracking_uri`` (its registry too), after the server's probe.

    Raises:
        TrackingUnavailableError: an http(s) server that does not answer.
    """
    require_server(tracking_uri)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
