"""Tests of the cluster topology (llmrl.topology): validation, totals, Ray placement."""
