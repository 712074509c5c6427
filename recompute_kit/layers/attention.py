"""Self-attention: MHA/GQA and DeepSeek-style multi-latent attention (MLA).

Shapes follow nanoGPT: activations are [batch, seq, hidden]; per-head tensors [batch, heads,
seq, head_dim]. Each recompute unit is a module that applies the policy itself, so what it saves
is attributed to it: `CoreAttention` (`core_attn`) takes q, k, v and returns the per-head
context, exactly the region Megatron's `core_attention` covers; `MLAUpProjection`
(`mla_up_proj`) turns the MLA latents into per-head q, k, v.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import RecomputePolicy
from ..config import ModelConfig
from . import ops
from .norm import make_norm


class CoreAttention(nn.Module):
    """softmax(q k^T / sqrt(d) + causal mask) with dropout, times v.

    backend 'unfused' spells the math out like Megatron's unfused path, so the softmax output,
    the dropout mask and the dropped probabilities ([b, a, s, s] each, the paper's 5as^2b term)
    are real tensors saved for backward. GQA K/V are expanded to all heads first, as Megatron
    does. Any other backend calls scaled_dot_product_attention (flash on CUDA), which never
    materialises the s x s matrices.
    """

    def __init__(
        self, num_heads: int, num_groups: int, dropout: float, backend: str, policy: RecomputePolicy
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_groups = num_groups
        self.dropout = dropout
        self.backend = "unfused" if backend == "unfused" else "sdpa"
        self.policy = policy

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with self.policy.offload("core_attn"):
            return self.policy.checkpoint("core_attn", self.attend, q, k, v, training=self.training)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        dropout = self.dropout if self.training else 0.0
        if self.backend == "sdpa":
            return _sdpa(q, k, v, dropout, gqa=self.num_groups != self.num_heads)
        if self.num_groups != self.num_heads:
            repeat = self.num_heads // self.num_groups
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        seq = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores + causal_mask(seq, scores.dtype, scores.device)  # add: saves nothing
        probs = torch.softmax(scores, dim=-1)
        probs = ops.dropout(probs, dropout, self.training)
        return torch.matmul(probs, v)


_causal_masks: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}


def causal_mask(seq: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """[seq, seq]: 0 on and below the diagonal, -inf above. Built once per (seq, dtype, device)
    and shared by every layer and call, like Megatron's precomputed attention mask. It is a
    constant, not an activation: it is built outside any active dispatch mode (the memory
    tracker), so a measurement never counts it, whether or not an earlier run built it."""
    key = (seq, dtype, device)
    if key not in _causal_masks:
        with torch.utils._python_dispatch._disable_current_modes(), torch.no_grad():
            mask = torch.full((seq, seq), float("-inf"), dtype=dtype, device=device)
            _causal_masks[key] = mask.triu(1)
    return _causal_masks[key]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, dropout: float, gqa: bool) -> Tensor:
    if q.is_meta:
        return _FlashShapes.apply(q, k, v)
    if gqa:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, is_causal=True, enable_gqa=True
        )
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)


class _FlashShapes(torch.autograd.Function):
    """Shape-only stand-in for a GPU flash-attention kernel on the meta device (PyTorch's meta
    SDPA takes the math path and would save s x s tensors): it saves what the kernel saves -
    q, k, v (GQA un-expanded), the output and the fp32 log-sum-exp - and its backward allocates
    dq, dk, dv. No numbers flow on meta, so none are computed."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # type: ignore[override]
        out = q.new_empty(*q.shape[:-1], v.shape[-1])
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


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
            self.num_heads,
            self.num_groups,
            config.attention_dropout,
            config.attention_backend,
            policy,
        )
        self.linear_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        a, g, d = self.num_heads, self.num_groups, self.head_dim
        with self.policy.offload("qkv_linear"):
            qkv = self.linear_qkv(x)
        q, k, v = qkv.split([a * d, g * d, g * d], dim=-1)
        q = q.view(b, s, a, d).transpose(1, 2).contiguous()
        k = k.view(b, s, g, d).transpose(1, 2).contiguous()
        v = v.view(b, s, g, d).transpose(1, 2).contiguous()
        context = self.core_attention(q, k, v)
        context = context.transpose(1, 2).reshape(b, s, a * d)
        with self.policy.offload("attn_proj"):
            return self.linear_proj(context)


# --------------------------------------------------------------------------------------------
# Multi-latent attention (DeepSeek-V2/V3)
# --------------------------------------------------------------------------------------------


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables kept as buffers (state, not activations); apply() rotates the last dim."""

    def __init__(self, dim: int, max_positions: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def apply(self, x: Tensor) -> Tensor:
        """x [..., s, dim] -> rotated by position (the tables only scale: nothing else saved)."""
        seq = x.shape[-2]
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)
        return x * cos + _rotate_half(x) * sin


class MLAUpProjection(nn.Module):
    """Latents -> per-head q [b,a,s,qk+rope], k [b,a,s,qk+rope], v [b,a,s,v] (fresh storage).

    The latent norms are part of the unit, as in TransformerEngine's fused norm+linear. With
    `mla_up_proj` recompute the expanded q/k/v - the largest tensors of MLA - are discarded once
    core attention has saved them and rebuilt from the latents in backward.
    """

    def __init__(self, config: ModelConfig, policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        a = self.num_heads = config.num_attention_heads
        self.qk_head_dim, self.rope_dim = config.qk_head_dim, config.qk_pos_emb_head_dim
        self.v_head_dim = config.v_head_dim
        self.q_lora_rank = config.q_lora_rank
        q_dim = self.qk_head_dim + self.rope_dim
        if self.q_lora_rank:
            self.q_layernorm = make_norm(config.normalization, self.q_lora_rank)
            self.linear_q_up_proj = nn.Linear(self.q_lora_rank, a * q_dim, bias=False)
        else:
            self.linear_q_proj = nn.Linear(config.hidden_size, a * q_dim, bias=False)
        self.kv_layernorm = make_norm(config.normalization, config.kv_lora_rank)
        self.linear_kv_up_proj = nn.Linear(
            config.kv_lora_rank, a * (self.qk_head_dim + self.v_head_dim), bias=False
        )
        self.rotary = RotaryEmbedding(self.rope_dim, config.seq_length)
        self._pending = None

    def forward(self, q_latent: Tensor, kv_latent: Tensor, k_rope: Tensor):
        self._pending = self.policy.discarding("mla_up_proj")
        return self._pending.run(self.up_project, q_latent, kv_latent, k_rope)

    def discard_output(self, hook_tensor: Tensor) -> None:
        if self._pending is not None:
            self._pending.discard_output_and_register_recompute(hook_tensor)
            self._pending = None

    def up_project(self, q_latent: Tensor, kv_latent: Tensor, k_rope: Tensor):
        b, s, _ = kv_latent.shape
        a, d_nope, d_rope = self.num_heads, self.qk_head_dim, self.rope_dim
        if self.q_lora_rank:
            q = self.linear_q_up_proj(self.q_layernorm(q_latent))
        else:
            q = self.linear_q_proj(q_latent)
        q = q.view(b, s, a, d_nope + d_rope).transpose(1, 2)
        q_nope, q_rope = q.split([d_nope, d_rope], dim=-1)
        kv = self.linear_kv_up_proj(self.kv_layernorm(kv_latent))
        kv = kv.view(b, s, a, d_nope + self.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([d_nope, self.v_head_dim], dim=-1)
        k_rope = self.rotary.apply(k_rope.unsqueeze(1)).expand(b, a, s, d_rope)
        q = torch.cat((q_nope, self.rotary.apply(q_rope)), dim=-1)
        k = torch.cat((k_nope, k_rope), dim=-1)
        return q, k, v.contiguous()


class MLASelfAttention(nn.Module):
    """Multi-latent attention: low-rank (latent) Q and KV projections with a decoupled RoPE key.

    hidden -> q latent (q_lora_rank, optional) and kv latent (kv_lora_rank) + one shared RoPE key
    per token; `up_proj` expands them to per-head Q (nope + rope), K (nope + shared rope) and V.
    """

    def __init__(self, config: ModelConfig, policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        self.num_heads = a = config.num_attention_heads
        self.q_lora_rank, self.kv_lora_rank = config.q_lora_rank, config.kv_lora_rank
        self.rope_dim, self.v_head_dim = config.qk_pos_emb_head_dim, config.v_head_dim
        h = config.hidden_size
        if self.q_lora_rank:
            self.linear_q_down_proj = nn.Linear(h, self.q_lora_rank, bias=False)
        self.linear_kv_down_proj = nn.Linear(h, self.kv_lora_rank + self.rope_dim, bias=False)
        self.up_proj = MLAUpProjection(config, policy)
        self.core_attention = CoreAttention(
            a, a, config.attention_dropout, config.attention_backend, policy
        )
        self.linear_proj = nn.Linear(a * self.v_head_dim, h, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        with self.policy.offload("qkv_linear"):
            q_latent = self.linear_q_down_proj(x) if self.q_lora_rank else x
            kv_latent, k_rope = self.linear_kv_down_proj(x).split(
                [self.kv_lora_rank, self.rope_dim], dim=-1
            )
        q, k, v = self.up_proj(q_latent, kv_latent, k_rope)
        context = self.core_attention(q, k, v)
        self.up_proj.discard_output(context)
        context = context.transpose(1, 2).reshape(b, s, self.num_heads * self.v_head_dim)
        with self.policy.offload("attn_proj"):
            return self.linear_proj(context)
