"""Mixture-of-experts layer: router, dropless dispatch, grouped experts, shared experts, combine.

Per token the router picks `topk` experts; the token is copied once per pick (the top-k
expansion), the copies are sorted by expert, all experts run as one grouped GEMM over their
contiguous slices (offsets computed on the device: no host sync), and the results are summed
back per token.

Recompute units, as in Megatron-Core:
* `moe`            - normal checkpoint of the whole layer (router, dispatch, experts, combine);
* `shared_experts` - normal checkpoint of the shared-expert MLP;
* `moe_act`        - output-discarding checkpoint of the expert activation (between fc1 and
                     fc2), whose output is refilled when fc2's output gradient arrives.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import register_flop_formula

from ..checkpoint import RecomputePolicy
from ..config import ModelConfig
from .mlp import MLP, activation_fn


class Router(nn.Module):
    """Scores each token against every expert and keeps the top k.

    softmax: top-k of the logits, then softmax over the k kept (Megatron's default, no
    pre-softmax). sigmoid: sigmoid scores, top-k, normalised to sum to one (DeepSeek-V3).
    Returns (probs [T, k], expert indices [T, k]).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.topk = config.moe_router_topk
        self.num_experts = config.num_moe_experts or 1
        self.score_function = config.moe_router_score_function
        self.aux_loss_coeff = config.moe_aux_loss_coeff
        self.weight = nn.Parameter(torch.randn(self.num_experts, config.hidden_size) * 0.02)

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        logits = F.linear(tokens, self.weight)
        if self.score_function == "sigmoid":
            scores = torch.sigmoid(logits)
            top_scores, indices = torch.topk(scores, self.topk, dim=-1)
            probs = top_scores / top_scores.sum(dim=-1, keepdim=True)
        else:
            top_logits, indices = torch.topk(logits, self.topk, dim=-1)
            probs = torch.softmax(top_logits, dim=-1)
        if self.training and self.aux_loss_coeff > 0:
            probs = _AttachAuxLoss.apply(probs, self._load_balancing_loss(logits, indices))
        return probs, indices

    def _load_balancing_loss(self, logits: Tensor, indices: Tensor) -> Tensor:
        """Switch-style loss: E * sum_e (fraction of picks to e) * (mean score of e)."""
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        # Picks per expert as a scatter-add (bincount's output size depends on the data).
        ids = indices.flatten()
        picks = scores.new_zeros(self.num_experts).scatter_add_(0, ids, scores.new_ones(ids.shape))
        fraction = picks / indices.numel()
        return self.aux_loss_coeff * self.num_experts * (fraction * scores.mean(0)).sum()


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on `x` whose backward also sends gradient 1 into `aux_loss` (Megatron's
    MoEAuxLossAutoScaler): the auxiliary loss trains the router without touching the LM loss."""

    @staticmethod
    def forward(ctx, x: Tensor, aux_loss: Tensor) -> Tensor:  # type: ignore[override]
        ctx.aux_like = (aux_loss.shape, aux_loss.dtype, aux_loss.device)
        return x

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        shape, dtype, device = ctx.aux_like
        return grad, torch.ones(shape, dtype=dtype, device=device)


class _SumIntoRows(torch.autograd.Function):
    """out[index[i]] += source[i]. Saves only the index (autograd's index_add would also keep
    `source`, the [T*k, h] expert output, just to read its shape)."""

    @staticmethod
    def forward(ctx, source: Tensor, index: Tensor, num_rows: int) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(index)
        out = source.new_zeros(num_rows, source.shape[-1])
        return out.index_add_(0, index, source)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


def expert_offsets(expert_of_pick: Tensor, num_experts: int) -> Tensor:
    """End offset of each expert's slice in the expert-sorted picks, int32 [E], computed on the
    device (a scatter-add of ones, then a cumsum): no host sync, and a shape that does not
    depend on the data (unlike bincount's), so it compiles into one graph."""
    ones = torch.ones_like(expert_of_pick, dtype=torch.int32)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=expert_of_pick.device)
    return counts.scatter_add_(0, expert_of_pick, ones).cumsum(0, dtype=torch.int32)


@functools.cache
def grouped_mm_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Whether this build runs torch._grouped_mm for `dtype` on `device_type` (probed once on
    a tiny problem, unseen by FLOP counters and memory trackers). Meta tensors never need it:
    their results are shapes only."""
    if device_type == "meta":
        return True
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        with _disable_current_modes():
            a = torch.ones(8, 8, dtype=dtype, device=device_type)
            b = torch.ones(2, 8, 8, dtype=dtype, device=device_type)
            offs = torch.tensor([3, 8], dtype=torch.int32, device=device_type)
            torch._grouped_mm(a, b, offs=offs)
            torch._grouped_mm(a.t(), a, offs=offs)  # the weight-gradient form
    except (RuntimeError, NotImplementedError):
        return False
    return True


@register_flop_formula(torch.ops.aten._grouped_mm)
def _grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of torch._grouped_mm for torch.utils.flop_counter (it has no formula of its own):
    [M, K] x [E, K, N] is 2·M·K·N (each row meets one expert); [K, M] x [M, N] -> [E, K, N]
    (the weight gradient) is 2·K·M·N."""
    if len(b_shape) == 3:
        (m, k), n = a_shape, b_shape[-1]
        return 2 * m * k * n
    (k, m), n = a_shape, b_shape[-1]
    return 2 * k * m * n


def _rows_aligned(tokens: Tensor, weight: Tensor) -> bool:
    """torch._grouped_mm needs every row stride to be a multiple of 16 bytes."""
    size = tokens.element_size()
    return all(dim * size % 16 == 0 for dim in (tokens.shape[-1], weight.shape[-1]))


_warned_loop: set[tuple[str, torch.dtype]] = set()


def _say_loop_fallback(device_type: str, dtype: torch.dtype) -> None:
    if (device_type, dtype) not in _warned_loop:
        _warned_loop.add((device_type, dtype))
        warnings.warn(
            f"torch._grouped_mm is not available for {dtype} on {device_type} (or rows not "
            "16-byte aligned): MoE experts run "
            "as a per-expert loop, which syncs with the host once per grouped matmul",
            stacklevel=3,
        )


def _expert_slices(offsets: Tensor) -> list[tuple[int, int]]:
    ends = offsets.tolist()  # the loop fallback's host sync
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _grouped_mm(tokens: Tensor, weight: Tensor, offsets: Tensor, grouped: bool) -> Tensor:
    """tokens [N, in] sorted by expert, weight [E, in, out] -> [N, out]."""
    if tokens.is_meta:
        return tokens.new_empty(tokens.shape[0], weight.shape[-1])
    if grouped:
        return torch._grouped_mm(tokens, weight, offs=offsets)
    out = tokens.new_empty(tokens.shape[0], weight.shape[-1])
    for e, (start, end) in enumerate(_expert_slices(offsets)):
        torch.mm(tokens[start:end], weight[e], out=out[start:end])
    return out


def _grouped_weight_grad(tokens: Tensor, grad: Tensor, offsets: Tensor, grouped: bool) -> Tensor:
    """Per expert, its tokens^T [in, n_e] times its output gradient [n_e, out] -> [E, in, out]
    (zeros for an expert that got no tokens)."""
    num_experts = offsets.shape[0]
    if tokens.is_meta:
        return tokens.new_empty(num_experts, tokens.shape[-1], grad.shape[-1])
    if grouped:
        return torch._grouped_mm(tokens.t(), grad, offs=offsets)
    out = tokens.new_zeros(num_experts, tokens.shape[-1], grad.shape[-1])
    for e, (start, end) in enumerate(_expert_slices(offsets)):
        if end > start:
            torch.mm(tokens[start:end].t(), grad[start:end], out=out[e])
    return out


def _accumulate_weight_grad(
    tokens: Tensor, grad: Tensor, offsets: Tensor, grouped: bool, main_grad: Tensor
) -> None:
    """main_grad[e] += tokens_e^T grad_e, without a whole [E, in, out] temporary where it can:
    per expert on CPU (whose offsets need no device sync) and in the loop, nothing on meta
    (shapes only). The CUDA grouped kernel has no accumulate form: its [E, in, out] result is
    added and freed (a transient of E·in·out elements)."""
    if tokens.is_meta:
        return
    if grouped and tokens.device.type != "cpu":
        main_grad.add_(torch._grouped_mm(tokens.t(), grad, offs=offsets))
        return
    for e, (start, end) in enumerate(_expert_slices(offsets)):
        if end > start:
            # (addmm with out=, not addmm_: FLOP counters know the out-of-place op)
            torch.addmm(main_grad[e], tokens[start:end].t(), grad[start:end], out=main_grad[e])


class _GroupedMatmul(torch.autograd.Function):
    """Grouped GEMM with a hand-written backward, so that it saves exactly what the per-expert
    loop saved: the sorted tokens (the weight is a parameter). The offsets ([E] int32, 4·E
    bytes) ride on ctx, as Megatron's GroupedMLP keeps tokens_per_expert, and are not counted
    as a saved activation.

    Weight gradient: when the weight already has a .grad buffer (a training loop that zeroes
    instead of freeing), it is accumulated into it directly, as Megatron's
    gradient_accumulation_fusion does into main_grad, so no [E, in, out] gradient temporary
    exists next to the activations (for E = 256 experts that would be gigabytes)."""

    @staticmethod
    def forward(ctx, tokens: Tensor, weight: Tensor, offsets: Tensor, grouped: bool) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(tokens, weight)
        ctx.offsets, ctx.grouped, ctx.weight = offsets, grouped, weight
        return _grouped_mm(tokens, weight, offsets, grouped)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        tokens, weight = ctx.saved_tensors
        grad_tokens = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_tokens = _grouped_mm(grad, weight.transpose(-2, -1), ctx.offsets, ctx.grouped)
        if ctx.needs_input_grad[1]:
            main_grad = None if torch.compiler.is_compiling() else ctx.weight.grad
            if main_grad is not None and ctx.weight.is_leaf:
                _accumulate_weight_grad(tokens, grad, ctx.offsets, ctx.grouped, main_grad)
            else:
                grad_weight = _grouped_weight_grad(tokens, grad, ctx.offsets, ctx.grouped)
        return grad_tokens, grad_weight, None, None


def grouped_matmul(tokens: Tensor, weight: Tensor, offsets: Tensor, grouped: bool = True) -> Tensor:
    """tokens sorted by expert [N, in] times each expert's [in, out] slice of the stacked
    weight [E, in, out]; `offsets` [E] ends each expert's rows. One torch._grouped_mm kernel
    when `grouped` (no host sync), else the per-expert loop (a host sync for the slices)."""
    # (Under torch.compile the probe is skipped: a graph only compiles with the kernel.)
    if (
        grouped
        and not torch.compiler.is_compiling()
        and not (
            grouped_mm_supported(tokens.device.type, tokens.dtype) and _rows_aligned(tokens, weight)
        )
    ):
        _say_loop_fallback(tokens.device.type, tokens.dtype)
        grouped = False
    return _GroupedMatmul.apply(tokens, weight, offsets, grouped)


class ExpertActivation(nn.Module):
    """The expert activation between fc1 and fc2, weighted by each pick's router probability
    (as Megatron's grouped MLP does, so the combine is a plain sum). The `moe_act` unit: its
    output is discarded once fc2 saved it and rebuilt when fc2's output gradient arrives."""

    def __init__(self, use_swiglu: bool, policy: RecomputePolicy):
        super().__init__()
        self.activation_fn = activation_fn(use_swiglu)
        self.policy = policy
        self._pending = None

    def forward(self, fc1_out: Tensor, probs: Tensor) -> Tensor:
        self._pending = self.policy.discarding("moe_act")
        with self.policy.offload("moe_act"):
            return self._pending.run(self.weighted_activation, fc1_out, probs)

    def weighted_activation(self, fc1_out: Tensor, probs: Tensor) -> Tensor:
        return self.activation_fn(fc1_out) * probs.unsqueeze(-1)

    def discard_output(self, hook_tensor: Tensor) -> None:
        if self._pending is not None:
            self._pending.discard_output_and_register_recompute(hook_tensor)
            self._pending = None


class GroupedExperts(nn.Module):
    """All routed experts: stacked fc1 [E, h, fc1_out] and fc2 [E, ffn, h] weights, each run
    as one grouped GEMM over the expert-sorted token copies (Megatron's GroupedMLP).
    `grouped = False` runs the per-expert loop instead (for comparison; it syncs)."""

    def __init__(self, config: ModelConfig, policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        self.grouped = True
        num_experts, hidden = config.num_moe_experts or 1, config.hidden_size
        ffn = config.moe_ffn_size
        fc1_out = 2 * ffn if config.swiglu else ffn
        self.weight1 = nn.Parameter(torch.randn(num_experts, hidden, fc1_out) / math.sqrt(hidden))
        self.weight2 = nn.Parameter(torch.randn(num_experts, ffn, hidden) / math.sqrt(ffn))
        self.activation = ExpertActivation(config.swiglu, policy)

    def forward(self, tokens: Tensor, probs: Tensor, offsets: Tensor) -> Tensor:
        with self.policy.offload("expert_fc1"):
            fc1_out = grouped_matmul(tokens, self.weight1, offsets, self.grouped)
        act_out = self.activation(fc1_out, probs)
        fc2_out = grouped_matmul(act_out, self.weight2, offsets, self.grouped)
        self.activation.discard_output(fc2_out)
        return fc2_out


class MoELayer(nn.Module):
    """Router -> dispatch (top-k copies sorted by expert) -> experts -> combine (+ shared).
    The `moe` unit: a normal checkpoint of all of it. Nothing in it waits for the host: no
    .item()/.tolist(), no boolean indexing, no data-dependent shapes (on the grouped path)."""

    def __init__(self, config: ModelConfig, policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        self.topk = config.moe_router_topk
        self.num_experts = config.num_moe_experts or 1
        self.router = Router(config)
        self.experts = GroupedExperts(config, policy)
        shared = config.moe_shared_expert_intermediate_size
        self.shared_experts = (
            MLP(config.hidden_size, shared, config.swiglu, policy, "shared_experts")
            if shared
            else None
        )

    def forward(self, hidden: Tensor) -> Tensor:
        return self.policy.checkpoint("moe", self.route_and_compute, hidden, training=self.training)

    def route_and_compute(self, hidden: Tensor) -> Tensor:
        shape = hidden.shape
        tokens = hidden.reshape(-1, shape[-1])
        probs, indices = self.router(tokens)

        # Dispatch: one copy of a token per pick, sorted by expert (stable: ties keep order).
        expert_of_pick = indices.flatten()
        order = torch.argsort(expert_of_pick, stable=True)
        token_of_slot = order // self.topk
        dispatched = tokens[token_of_slot]
        slot_probs = probs.flatten()[order]
        offsets = expert_offsets(expert_of_pick, self.num_experts)

        expert_out = self.experts(dispatched, slot_probs, offsets)

        # Combine: sum each token's picks back into its row.
        out = _SumIntoRows.apply(expert_out, token_of_slot, tokens.shape[0])
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.view(shape)
