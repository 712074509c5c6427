"""Mixture-of-experts layer: router, dropless dispatch, grouped experts, shared experts, combine.

Per token the router picks `topk` experts; the token is copied once per pick (the top-k
expansion), the copies are sorted by expert, each expert runs one matmul over its contiguous
slice (a loop over experts, never over tokens), and the results are summed back per token.

Recompute units, as in Megatron-Core:
* `moe`            - normal checkpoint of the whole layer (router, dispatch, experts, combine);
* `shared_experts` - normal checkpoint of the shared-expert MLP;
* `moe_act`        - output-discarding checkpoint of the expert activation (between fc1 and
                     fc2), whose output is refilled when fc2's output gradient arrives.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
        if indices.is_meta:  # shape-only runs: balanced routing
            picks = scores.new_full((self.num_experts,), indices.numel() / self.num_experts)
        else:
            picks = torch.bincount(indices.flatten(), minlength=self.num_experts).float()
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


def grouped_matmul(
    tokens: Tensor, weight: nn.ParameterList, tokens_per_expert: list[int]
) -> Tensor:
    """tokens sorted by expert [N, in] times each expert's [in, out] weight, expert by expert.
    (One parameter per expert: slicing a stacked [E, in, out] weight would make every expert's
    weight gradient a full [E, in, out] temporary.)"""
    outputs = [
        chunk @ weight[e]
        for e, chunk in enumerate(tokens.split(tokens_per_expert))
        if chunk.numel()
    ]
    if not outputs:
        return tokens.new_zeros(0, weight[0].shape[-1])
    return torch.cat(outputs)


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
    """All routed experts: fc1 and fc2 weights per expert, run over each expert's slice of the
    sorted token copies (what Megatron's grouped GEMM does in one kernel)."""

    def __init__(self, config: ModelConfig, policy: RecomputePolicy):
        super().__init__()
        self.policy = policy
        num_experts, hidden = config.num_moe_experts or 1, config.hidden_size
        ffn = config.moe_ffn_size
        fc1_out = 2 * ffn if config.swiglu else ffn
        self.weight1 = nn.ParameterList(
            torch.randn(hidden, fc1_out) / math.sqrt(hidden) for _ in range(num_experts)
        )
        self.weight2 = nn.ParameterList(
            torch.randn(ffn, hidden) / math.sqrt(ffn) for _ in range(num_experts)
        )
        self.activation = ExpertActivation(config.swiglu, policy)

    def forward(self, tokens: Tensor, probs: Tensor, tokens_per_expert: list[int]) -> Tensor:
        with self.policy.offload("expert_fc1"):
            fc1_out = grouped_matmul(tokens, self.weight1, tokens_per_expert)
        act_out = self.activation(fc1_out, probs)
        fc2_out = grouped_matmul(act_out, self.weight2, tokens_per_expert)
        self.activation.discard_output(fc2_out)
        return fc2_out


class MoELayer(nn.Module):
    """Router -> dispatch (top-k copies sorted by expert) -> experts -> combine (+ shared).
    The `moe` unit: a normal checkpoint of all of it."""

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
        tokens_per_expert = self._tokens_per_expert(expert_of_pick)

        expert_out = self.experts(dispatched, slot_probs, tokens_per_expert)

        # Combine: sum each token's picks back into its row.
        out = _SumIntoRows.apply(expert_out, token_of_slot, tokens.shape[0])
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.view(shape)

    def _tokens_per_expert(self, expert_of_pick: Tensor) -> list[int]:
        if expert_of_pick.is_meta:
            # Shape-only runs have no routing decisions: assume perfectly balanced experts.
            picks, experts = expert_of_pick.numel(), self.num_experts
            return [picks // experts + (e < picks % experts) for e in range(experts)]
        return torch.bincount(expert_of_pick, minlength=self.num_experts).tolist()
