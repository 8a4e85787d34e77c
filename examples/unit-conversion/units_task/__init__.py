"""Unit conversion as an llmrl task (an example project: docs/own-task.md)."""
