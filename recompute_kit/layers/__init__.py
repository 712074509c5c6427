"""Reference transformer layers that honour Megatron-Core's recompute settings."""

from .attention import CoreAttention, SelfAttention
from .block import GPTModel, TransformerBlock, TransformerLayer
from .mlp import MLP

__all__ = [
    "MLP",
    "CoreAttention",
    "GPTModel",
    "SelfAttention",
    "TransformerBlock",
    "TransformerLayer",
]
