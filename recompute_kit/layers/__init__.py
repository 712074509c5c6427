"""Reference transformer layers that honour Megatron-Core's recompute settings."""

from .attention import CoreAttention, MLASelfAttention, SelfAttention
from .block import GPTModel, TransformerBlock, TransformerLayer
from .mlp import MLP
from .moe import MoELayer

__all__ = [
    "MLP",
    "CoreAttention",
    "GPTModel",
    "MLASelfAttention",
    "MoELayer",
    "SelfAttention",
    "TransformerBlock",
    "TransformerLayer",
]
