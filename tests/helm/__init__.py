"""Tests of the helm/llmrl chart, rendered offline with the real Helm engine."""
