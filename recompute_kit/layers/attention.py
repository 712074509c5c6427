"""Self-attention with MHA/GQA and two core-attention backends.

Shapes follow nanoGPT: activations are [batch, seq, hidden]; per-head tensors [batch, heads,
seq, head_dim]. `CoreAttention` is the unit that `core_attn` recompute checkpoints: it takes
q, k, v and returns the per-head context, exactly the region Megatron's `core_attention` covers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import RecomputePolicy
from ..config import ModelConfig


class CoreAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + causal mask) with dropout, times v.

    backend 'unfused' spells the math out like Megatron's unfused path, so the scores, the
    softmax output, the dropout mask and the dropped probabilities ([b, a, s, s] each, the
    paper's 5as^2b term) are real tensors saved for backward. GQA K/V are expanded to all heads
    first, as Megatron does. Any other backend calls scaled_dot_product_attention (flash on
    CUDA), which never materialises the s x s matrices.
    """

    def __init__(self, num_heads: int, num_groups: int, dropout: float, backend: str):
        super().__init__()
        self.num_heads = num_heads
        self.num_groups = num_groups
        self.dropout = dropout
        self.backend = "unfused" if backend == "unfused" else "sdpa"

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        dropout = self.dropout if self.training else 0.0
        if self.backend == "sdpa":
            return _sdpa(q, k, v, dropout, gqa=self.num_groups != self.num_heads)
        if self.num_groups != self.num_heads:
            repeat = self.num_heads // self.num_groups
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        seq = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores + _causal_mask(seq, scores.dtype, scores.device)  # add: saves nothing
        probs = torch.softmax(scores, dim=-1)
        probs = F.dropout(probs, dropout, self.training)
        return torch.matmul(probs, v)


def _causal_mask(seq: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.full((seq, seq), float("-inf"), dtype=dtype, device=device).triu(1)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, dropout: float, gqa: bool) -> Tensor:
    if gqa:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, enable_gqa=True
        )
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)


class SelfAttention(nn.Module):
    """QKV projection, core attention (optionally recomputed), output projection."""

    def __init__(self, config: ModelConfig, policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        self.num_heads = config.num_attention_heads
        self.num_groups = config.kv_groups
        self.head_dim = config.head_dim
        qkv_size = (self.num_heads + 2 * self.num_groups) * self.head_dim
        self.linear_qkv = nn.Linear(config.hidden_size, qkv_size)
        self.core_attention = CoreAttention(
            self.num_heads, self.num_groups, config.attention_dropout, config.attention_backend
        )
        self.linear_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        a, g, d = self.num_heads, self.num_groups, self.head_dim
        q, k, v = self.linear_qkv(x).split([a * d, g * d, g * d], dim=-1)
        q = q.view(b, s, a, d).transpose(1, 2).contiguous()
        k = k.view(b, s, g, d).transpose(1, 2).contiguous()
        v = v.view(b, s, g, d).transpose(1, 2).contiguous()
        context = self.policy.checkpoint(
            "core_attn", self.core_attention, q, k, v, training=self.training
        )
        context = context.transpose(1, 2).reshape(b, s, a * d)
        return self.linear_proj(context)
