"""FLOP counts of the reference layers, and the extra FLOPs that recomputation costs.

Conventions:

* one multiply-add is 2 FLOPs, so a [m, k] x [k, n] matmul costs 2·m·k·n;
* only matmuls are counted. Elementwise work (norms, softmax, dropout, activations, RoPE, bias
  adds, residual adds, the causal mask, the router's top-k) and the MoE dispatch/combine
  gathers and scatters are ignored, as in the paper's Appendix A and in
  `torch.utils.flop_counter.FlopCounterMode`;
* causal masking is not exploited: QK^T and attention-over-V cost the full s x s, as Megatron
  and the paper count them (and as the unfused backend really computes them);
* embedding lookups are free; the output layer (logits) costs 2·b·s·h·v;
* a backward pass costs twice its forward (gradients of the inputs and of the weights), so a
  training step is 3 x forward, plus whatever recomputation re-runs in backward.

Numbers are for one micro-batch (b = micro_batch_size, s = seq_length) on the whole model, on
one device: tensor/pipeline/expert parallelism split the same work across ranks. Every count
here equals what `FlopCounterMode` counts when the reference layers run (see tests/test_flops.py).

Symbols: T = b·s tokens, h hidden, a heads, g KV groups, d head dim, f ffn hidden, v vocab,
L layers, E experts, k router top-k.
"""

from __future__ import annotations

from ..config import Config, ModelConfig, RecomputeConfig


def _matmul(tokens: int, d_in: int, d_out: int) -> float:
    """FLOPs of a linear layer [tokens, d_in] -> [tokens, d_out] (bias add not counted)."""
    return 2.0 * tokens * d_in * d_out


def _mlp_flops(tokens: int, hidden: int, ffn: int, swiglu: bool) -> float:
    """fc1 (2·ffn wide with SwiGLU: gate and up halves) plus fc2."""
    fc1_out = 2 * ffn if swiglu else ffn
    return _matmul(tokens, hidden, fc1_out) + _matmul(tokens, ffn, hidden)


def _attention_flops(m: ModelConfig) -> dict[str, float]:
    """MHA/GQA attention, or multi-latent attention (MLA)."""
    b, s, h, a = m.micro_batch_size, m.seq_length, m.hidden_size, m.num_attention_heads
    tokens = b * s
    flops: dict[str, float] = {}
    if m.multi_latent_attention:
        q_dim = m.qk_head_dim + m.qk_pos_emb_head_dim  # per-head q/k width: nope + rope
        v_dim = m.v_head_dim
        # Down projections: the q latent (if any) and the kv latent plus the shared RoPE key.
        q_down = _matmul(tokens, h, m.q_lora_rank) if m.q_lora_rank else 0.0
        kv_down = _matmul(tokens, h, m.kv_lora_rank + m.qk_pos_emb_head_dim)
        flops["qkv"] = q_down + kv_down
        # Up projections: q from its latent (or straight from the hidden state, linear_q_proj),
        # k_nope and v from the kv latent.
        q_in = m.q_lora_rank or h
        q_up = _matmul(tokens, q_in, a * q_dim)
        kv_up = _matmul(tokens, m.kv_lora_rank, a * (m.qk_head_dim + v_dim))
        flops["mla_up_proj"] = q_up + kv_up
        # q k^T over q_dim, probs v over v_dim, all a heads, the full s x s.
        flops["core_attn"] = 2.0 * b * a * s * s * q_dim + 2.0 * b * a * s * s * v_dim
        flops["proj"] = _matmul(tokens, a * v_dim, h)
    else:
        g, d = m.kv_groups, m.head_dim
        flops["qkv"] = _matmul(tokens, h, (a + 2 * g) * d)
        # GQA K/V are expanded to all a heads before the two batched matmuls.
        flops["core_attn"] = 2 * (2.0 * b * a * s * s * d)
        flops["proj"] = _matmul(tokens, a * d, h)
    return flops


def layer_forward_flops(model: ModelConfig, moe_layer: bool) -> dict[str, float]:
    """Forward FLOPs of one transformer layer for one micro-batch, per module.

    Keys: `qkv` (QKV projection; MLA: the down projections), `mla_up_proj` (MLA only),
    `core_attn`, `proj`, then `mlp` on a dense layer, or `router`, `experts`, `moe_act` (0:
    elementwise) and `shared_experts` (when the model has them) on an MoE layer. Norms are
    elementwise and not listed.
    """
    m = model
    tokens = m.micro_batch_size * m.seq_length
    h = m.hidden_size
    flops = _attention_flops(m)
    if not moe_layer:
        flops["mlp"] = _mlp_flops(tokens, h, m.ffn_size, m.swiglu)
        return flops
    num_experts = m.num_moe_experts or 1
    flops["router"] = _matmul(tokens, h, num_experts)
    # Dropless routing: every token is copied once per pick, whatever the expert loads are.
    flops["experts"] = _mlp_flops(tokens * m.moe_router_topk, h, m.moe_ffn_size, m.swiglu)
    flops["moe_act"] = 0.0  # activation x router probability: elementwise
    if m.moe_shared_expert_intermediate_size:
        shared = m.moe_shared_expert_intermediate_size
        flops["shared_experts"] = _mlp_flops(tokens, h, shared, m.swiglu)
    return flops


def _layer_totals(model: ModelConfig) -> list[float]:
    """Forward FLOPs of each layer, in order (dense and MoE layers differ)."""
    dense = sum(layer_forward_flops(model, moe_layer=False).values())
    moe = sum(layer_forward_flops(model, moe_layer=True).values()) if model.num_moe_experts else 0
    return [moe if model.is_moe_layer(i) else dense for i in range(model.num_layers)]


def output_layer_flops(model: ModelConfig) -> float:
    """The logits: [b·s, h] x [h, v]."""
    return _matmul(model.micro_batch_size * model.seq_length, model.hidden_size, model.vocab_size)


def model_forward_flops(config: Config) -> float:
    """Forward FLOPs of the whole model for one micro-batch: all layers plus the logits."""
    return sum(_layer_totals(config.model)) + output_layer_flops(config.model)


def step_flops(config: Config) -> float:
    """Model FLOPs of one training step for one micro-batch: forward + backward (2 x forward)."""
    return 3.0 * model_forward_flops(config)


def _selective_recompute_flops(model: ModelConfig, rc: RecomputeConfig) -> float:
    """Forward FLOPs re-run in backward by the selected modules, summed over the layers."""
    dense = layer_forward_flops(model, moe_layer=False)
    moe = layer_forward_flops(model, moe_layer=True) if model.num_moe_experts else {}
    num_moe = model.num_moe_layers
    num_dense = model.num_layers - num_moe
    total = 0.0
    for module in ("core_attn", "mla_up_proj"):  # present on every layer (or on none)
        if rc.selects(module):
            total += dense.get(module, 0.0) * model.num_layers
    if rc.selects("mlp"):  # dense layers only: 'mlp' is a no-op on MoE layers
        total += dense["mlp"] * num_dense
    if rc.selects("moe"):  # the whole MoE layer: router, experts and shared experts
        moe_layer = ("router", "experts", "moe_act", "shared_experts")
        total += sum(moe.get(key, 0.0) for key in moe_layer) * num_moe
    if rc.selects("shared_experts"):
        # The shared-expert checkpoint sits inside the 'moe' checkpoint. When both are on, the
        # 'moe' recompute runs the shared experts with grad enabled, so their own checkpoint
        # applies again and re-runs them once more in its backward (Megatron nests the same
        # way): they are re-run twice, and counted twice.
        total += moe.get("shared_experts", 0.0) * num_moe
    # 'moe_act' and 'layernorm' re-run elementwise ops only: 0 FLOPs.
    return total


def recompute_flops(config: Config) -> float:
    """Extra forward FLOPs that recomputation re-runs during backward, for one micro-batch.

    selective: the recomputed modules' forward on every layer they apply to; full uniform (any
    N): every layer once; full block N: the first min(N, L/p) layers of every pipeline stage,
    as Megatron applies it (with p = 1, the first N layers of the model). Offloading costs no
    FLOPs.
    """
    model, rc = config.model, config.recompute
    if rc.recompute_granularity is None:
        return 0.0
    if rc.recompute_granularity == "selective":
        return _selective_recompute_flops(model, rc)
    if rc.recompute_granularity != "full":
        raise ValueError(f"unknown recompute_granularity {rc.recompute_granularity!r}")
    layers = _layer_totals(model)
    if rc.recompute_method == "uniform":
        return sum(layers)  # every chunk of N layers is re-run once
    if rc.recompute_method == "block":
        stages = config.parallel.pipeline_model_parallel_size
        per_stage = len(layers) // stages
        n = min(rc.recompute_num_layers or 1, per_stage)
        return sum(sum(layers[k * per_stage : k * per_stage + n]) for k in range(stages))
    raise ValueError(
        f"full recompute needs recompute_method uniform or block, got {rc.recompute_method!r}"
    )


def recompute_flops_fraction(config: Config) -> float:
    """Recompute FLOPs as a fraction of the model FLOPs of a step (the CLI's
    `recompute_flops_fraction`)."""
    return recompute_flops(config) / step_flops(config)


def hardware_flops_per_step(config: Config) -> float:
    """FLOPs the hardware executes in one training step for one micro-batch: model FLOPs plus
    recomputation."""
    return step_flops(config) + recompute_flops(config)


# --------------------------------------------------------------------------------------------
# The paper's closed forms (Korthikanti et al. 2022, Appendix A), for a GPT layer: MHA, GeLU,
# ffn = 4h. B is the micro-batch size here (one micro-batch, one iteration).
# --------------------------------------------------------------------------------------------


def _paper_terms(config: Config) -> tuple[float, float, float, float, float]:
    m = config.model
    return (
        float(m.micro_batch_size),
        float(m.num_layers),
        float(m.seq_length),
        float(m.hidden_size),
        float(m.vocab_size),
    )


def paper_model_flops(config: Config) -> float:
    """Eq. 7: model FLOPs = 72·B·L·s·h²·(1 + s/(6h) + v/(12hL))."""
    b, layers, s, h, v = _paper_terms(config)
    return 72 * b * layers * s * h**2 * (1 + s / (6 * h) + v / (12 * h * layers))


def paper_hardware_flops_selective(config: Config) -> float:
    """Eq. 8: hardware FLOPs with selective recompute = 72·B·L·s·h²·(1 + s/(3h) + v/(12hL)).

    Note: Eq. 8 adds 12·B·s²·h per layer over Eq. 7, three times the 4·B·s²·h that re-running
    QK^T and attention-over-V costs; `hardware_flops_per_step` counts the re-run once.
    """
    b, layers, s, h, v = _paper_terms(config)
    return 72 * b * layers * s * h**2 * (1 + s / (3 * h) + v / (12 * h * layers))
