"""The dense feed-forward block: fc1, GeLU or SwiGLU, fc2."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def swiglu(x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def activation_fn(use_swiglu: bool):
    return swiglu if use_swiglu else F.gelu


class MLP(nn.Module):
    """fc1 -> activation -> fc2. With SwiGLU, fc1 produces gate and up halves (2 x ffn)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, use_swiglu: bool):
        super().__init__()
        fc1_out = 2 * ffn_hidden_size if use_swiglu else ffn_hidden_size
        self.linear_fc1 = nn.Linear(hidden_size, fc1_out)
        self.activation = activation_fn(use_swiglu)
        self.linear_fc2 = nn.Linear(ffn_hidden_size, hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(self.activation(self.linear_fc1(x)))
