"""Training on one rank: the model a trainer holds, its precision, optimizer, LoRA adapters,
torch.distributed wrapping, the frozen reference, the GRPO trainer and crash-safe checkpoints.

Layer 3 (collectors, transports, per-rank training): imports layers 0-2.

The stages that drive these pieces are in :mod:`llmrl.stages`.
"""
