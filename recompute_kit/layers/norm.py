"""LayerNorm and RMSNorm, chosen by ModelConfig.normalization.

Both are single autograd nodes that save the input and fp32 statistics, like fused GPU kernels,
on every device: the memory a CPU run measures is the memory a GPU run keeps.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # fp32 for 16-bit inputs


class _RMSNormFunction(torch.autograd.Function):
    """One autograd node, like a fused RMSNorm kernel: saves the input and the fp32 rstd.

    (The composite `F.rms_norm` saves several intermediates and sends the input's gradient along
    three paths, so its summation order - and the last bit of the gradient - would depend on
    whether the norm was recomputed.)
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        x32 = x.to(_compute_dtype(x))
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        dtype = rstd.dtype
        x_hat = x.to(dtype) * rstd
        grad_weight = (grad.to(dtype) * x_hat.to(x.dtype).to(dtype)).sum(
            tuple(range(grad.dim() - 1))
        )
        grad_x_hat = grad.to(dtype) * weight.to(dtype)
        grad_x = rstd * (grad_x_hat - x_hat * (grad_x_hat * x_hat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


class _LayerNormFunction(torch.autograd.Function):
    """LayerNorm as one autograd node that saves the input and fp32 mean/rstd on every device
    (PyTorch's CPU kernel keeps the statistics in the input dtype, CUDA in fp32: this makes CPU
    and meta runs account for memory exactly as a GPU run does)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        x32 = x.to(_compute_dtype(x))
        mean = x32.mean(-1, keepdim=True)
        rstd = torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return ((x32 - mean) * rstd).to(x.dtype) * weight + bias

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight, mean, rstd = ctx.saved_tensors
        dtype = rstd.dtype
        x_hat = (x.to(dtype) - mean) * rstd
        batch_dims = tuple(range(grad.dim() - 1))
        grad_weight = (grad.to(dtype) * x_hat.to(x.dtype).to(dtype)).sum(batch_dims)
        grad_bias = grad.to(dtype).sum(batch_dims)
        g = grad.to(dtype) * weight.to(dtype)
        grad_x = rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), None


class LayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: Tensor) -> Tensor:
        return _LayerNormFunction.apply(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Llama-style, no bias)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: Tensor) -> Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def make_norm(normalization: str, hidden_size: int) -> nn.Module:
    if normalization == "RMSNorm":
        return RMSNorm(hidden_size)
    return LayerNorm(hidden_size)


class LayerNormUnit(nn.Module):
    """A transformer layer's norm, as a recompute unit.

    With `layernorm` recompute its output is discarded once the consumer saved it; the layer
    calls `discard_output(t)` with a tensor whose gradient arrives before the consumer's
    backward needs the output. `offload_unit` names it for fine-grained offloading
    (`attn_norm`, `mlp_norm`).
    """

    def __init__(self, normalization: str, hidden_size: int, policy, offload_unit: str):
        super().__init__()
        self.norm = make_norm(normalization, hidden_size)
        self.policy = policy
        self.offload_unit = offload_unit
        self._pending = None

    def forward(self, x: Tensor) -> Tensor:
        self._pending = self.policy.discarding("layernorm")
        with self.policy.offload(self.offload_unit):
            return self._pending.run(self.norm, x)

    def discard_output(self, hook_tensor: Tensor) -> None:
        if self._pending is not None:
            self._pending.discard_output_and_register_recompute(hook_tensor)
            self._pending = None
