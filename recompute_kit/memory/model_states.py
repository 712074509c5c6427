"""Weights, gradients and optimizer states per rank: parameter counts by kind, their split over
TP/PP/EP/ETP and the data-parallel sharding of gradients and Adam states (Megatron's layout,
checked against Megatron-Core's own modules in tests/test_megatron_parity.py)."""

from __future__ import annotations

from ..config import Config, ModelConfig
from .layout import pipeline_layout


def parameter_counts(m: ModelConfig) -> dict[str, int]:
    """Parameters of the reference model by part (whole model, no parallelism)."""
    h, a = m.hidden_size, m.num_attention_heads
    norm = 2 * h if m.normalization == "LayerNorm" else h
    width = 2 if m.swiglu else 1
    bias = 1 if m.add_bias_linear else 0

    def mlp(ffn: int) -> int:
        return h * ffn * width + bias * ffn * width + ffn * h + bias * h

    if m.multi_latent_attention:
        dq, dv = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        attention = (m.kv_lora_rank + m.qk_pos_emb_head_dim) * h  # kv down
        attention += m.kv_lora_rank * a * (m.qk_head_dim + dv) + m.kv_lora_rank  # kv up + norm
        if m.q_lora_rank:
            attention += h * m.q_lora_rank + m.q_lora_rank * a * dq + m.q_lora_rank
        else:
            attention += h * a * dq
        attention += a * dv * h  # output projection
    else:
        d, g = m.head_dim, m.kv_groups
        attention = h * (a + 2 * g) * d + bias * (a + 2 * g) * d + a * d * h + bias * h
    dense_layer = 2 * norm + attention + mlp(m.ffn_size)
    experts = 0
    moe_layer = 2 * norm + attention
    if m.num_moe_experts:
        e, f = m.num_moe_experts, m.moe_ffn_size
        experts = e * (h * f * width + f * h)
        moe_layer += e * h  # router
        if m.moe_shared_expert_intermediate_size:
            moe_layer += mlp(m.moe_shared_expert_intermediate_size)
    n_moe = m.num_moe_layers
    return {
        "embedding": m.vocab_size * h + m.seq_length * h,
        "layers": dense_layer * (m.num_layers - n_moe) + moe_layer * n_moe,
        "experts": experts * n_moe,
        "head": norm + h * m.vocab_size,
    }


def padded_vocab_size(m: ModelConfig, t: int) -> int:
    """Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP."""
    multiple = m.make_vocab_size_divisible_by * t
    return -(-m.vocab_size // multiple) * multiple


def rank_parameters(config: Config, stage: int = 0) -> dict[str, float]:
    """Parameters one rank of `stage` holds in Megatron-Core: `dense` (sharded over TP, some
    replicated) and `expert` (sharded over EP and expert-TP).

    TP shards the column-parallel layers (QKV, fc1) with their biases and the row-parallel ones
    (proj, fc2) without theirs; norms, row-parallel biases, the learned position embedding and
    the router are replicated on every TP rank. The vocabulary is padded (padded_vocab_size)."""
    m, p = config.model, config.parallel
    t, ep, etp = p.tensor_model_parallel_size, p.expert_model_parallel_size, p.etp
    h, a = m.hidden_size, m.num_attention_heads
    norm = 2 * h if m.normalization == "LayerNorm" else h
    width = 2 if m.swiglu else 1
    bias = 1 if m.add_bias_linear else 0

    def mlp(ffn: int, shards: int) -> float:  # column fc1 (+ bias), row fc2; fc2's bias whole
        return (h * ffn * width + bias * ffn * width + ffn * h) / shards + bias * h

    if m.multi_latent_attention:
        # TE's spec replicates the down projections (TELinear, "duplicated") and fuses the
        # latent norms (qk_layernorm) into the up projections; the local spec shards the down
        # projections like any column-parallel linear and builds the norms on their own.
        down = t if m.transformer_impl == "local" else 1
        latent_norm = (2 if m.normalization == "LayerNorm" else 1) if m.qk_layernorm else 0
        dq, dv = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        attention = (m.kv_lora_rank + m.qk_pos_emb_head_dim) * h / down
        attention += latent_norm * m.kv_lora_rank
        attention += m.kv_lora_rank * a * (m.qk_head_dim + dv) / t  # kv up (column)
        if m.q_lora_rank:
            attention += h * m.q_lora_rank / down + latent_norm * m.q_lora_rank
            attention += m.q_lora_rank * a * dq / t
        else:
            attention += h * a * dq / t
        attention += a * dv * h / t + bias * h
    else:
        d, g = m.head_dim, m.kv_groups
        qkv = (a + 2 * g) * d
        attention = (h * qkv + bias * qkv + a * d * h) / t + bias * h
        if m.qk_layernorm:
            attention += 2 * d * (2 if m.normalization == "LayerNorm" else 1)
    layers = [n for chunk in pipeline_layout(m, p)[stage] for n in chunk]
    dense = expert = 0.0
    for n in layers:
        dense += 2 * norm + attention
        if not m.is_moe_layer(n):
            dense += mlp(m.ffn_size, t)
            continue
        dense += m.num_moe_experts * h  # the router, replicated
        if m.moe_shared_expert_intermediate_size:
            dense += mlp(m.moe_shared_expert_intermediate_size, t)
        f = m.moe_ffn_size
        per_expert = (h * f * width + bias * f * width + f * h) / etp + bias * h
        expert += per_expert * m.num_moe_experts / ep
    vocab = padded_vocab_size(m, t)
    if stage == 0:
        dense += vocab * h / t
        if m.position_embedding_type == "learned_absolute":
            dense += m.seq_length * h  # replicated on every TP rank
    if stage == len(pipeline_layout(m, p)) - 1:
        dense += norm
        if not (m.share_embeddings_and_output_weights and stage == 0):
            dense += vocab * h / t
    return {"dense": dense, "expert": expert}


def model_state_bytes(
    config: Config, stage: int = 0, engine: str = "megatron"
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes on one rank of `stage`.

    Mixed precision as in Megatron: 16-bit weights, fp32 main gradients, Adam with an fp32
    master copy and two moments (12 B/param). In fp32: 4 B weights, 4 B gradients, 8 B moments.
    The distributed optimizer shards the optimizer states of dense parameters over the
    data-parallel ranks (context-parallel ones included: DP x CP) and those of expert
    parameters over the expert-data-parallel ranks (TP x CP x DP / (ETP x EP)).
    `engine="reference"` counts the kit's own layers: every parameter divided by TP, no vocab
    padding (their parameter count is checked against the layers)."""
    m, p = config.model, config.parallel
    if engine == "reference":
        counts = parameter_counts(m)
        t, pp, ep = (
            p.tensor_model_parallel_size,
            p.pipeline_model_parallel_size,
            p.expert_model_parallel_size,
        )
        dense = counts["layers"] / (t * pp) + counts["embedding"] / t
        dense += counts["head"] / t if pp == 1 else 0.0
        params = {"dense": dense, "expert": counts["experts"] / (ep * pp)}
    else:
        params = rank_parameters(config, stage)
    half = m.bf16 or m.fp16
    weight_b, grad_b, optim_b = (2, 4, 12) if half else (4, 4, 8)
    on_rank = params["dense"] + params["expert"]
    if p.use_distributed_optimizer:
        dp_cp = p.data_parallel_size * p.context_parallel_size
        edp = max(p.tensor_model_parallel_size * dp_cp // (p.etp * p.expert_model_parallel_size), 1)
        optimizer = optim_b * (params["dense"] / dp_cp + params["expert"] / edp)
    else:
        optimizer = optim_b * on_rank
    return round(on_rank * weight_b), round(on_rank * grad_b), round(optimizer)
