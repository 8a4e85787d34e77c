"""Errors raised while resolving and loading models."""

from __future__ import annotations


class ModelSpecError(ValueError):
    """A model spec names nothing llmrl can load (unknown name, missing file, bad format)."""


class UnsafeModelError(ModelSpecError):
    """A model folder would run code it carries (custom Python code, pickled weights, a chat
    template reaching past its sandbox); the message names the ``model.*`` setting that allows
    it, where one does."""
