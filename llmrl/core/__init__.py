"""Shared helpers every layer may use: the YAML config base, the fault hook of the crash tests,
Ray and port helpers, seeding, and the missing-extra error.

Layer 0 (shared helpers): imports no other llmrl package.

- :mod:`~llmrl.core.config_loading`: ``ConfigModel``, ``ConfigError``, YAML loading and overrides.
- :mod:`~llmrl.core.faults`: ``fault_point``, the kill switch crash tests set.
- :mod:`~llmrl.core.ray_helpers`: ``import_ray`` and ``free_port``.
- :mod:`~llmrl.core.seeding`: ``seed_everything``.
- :mod:`~llmrl.core.errors`: ``MissingExtraError``.
"""
