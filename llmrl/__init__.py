"""llmrl."""
