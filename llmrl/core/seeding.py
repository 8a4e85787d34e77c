"""Seeding: one call that seeds Python's and torch's global generators."""

from __future__ import annotations

import random

import torch


def seed_everything(seed: int) -> None:
    """Seed python's and torch's generators."""
    random.seed(seed)
    torch.manual_seed(seed)
