"""The dense feed-forward block: fc1, GeLU or SwiGLU, fc2."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import RecomputePolicy


def swiglu(x: Tensor) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def activation_fn(use_swiglu: bool):
    return swiglu if use_swiglu else F.gelu


class MLP(nn.Module):
    """fc1 -> activation -> fc2. With SwiGLU, fc1 produces gate and up halves (2 x ffn).

    `recompute_unit` is the module name under which the policy may checkpoint it: `mlp` for a
    layer's dense MLP, `shared_experts` for an MoE layer's shared experts.
    """

    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        use_swiglu: bool,
        policy: RecomputePolicy,
        recompute_unit: str = "mlp",
    ):
        super().__init__()
        fc1_out = 2 * ffn_hidden_size if use_swiglu else ffn_hidden_size
        self.linear_fc1 = nn.Linear(hidden_size, fc1_out)
        self.activation = activation_fn(use_swiglu)
        self.linear_fc2 = nn.Linear(ffn_hidden_size, hidden_size)
        self.policy = policy
        self.recompute_unit = recompute_unit

    def forward(self, x: Tensor) -> Tensor:
        return self.policy.checkpoint(
            self.recompute_unit, self.feed_forward, x, training=self.training
        )

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(self.activation(self.linear_fc1(x)))
