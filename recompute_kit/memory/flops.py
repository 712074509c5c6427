"""FLOP counts of the reference layers, and the extra FLOPs that recomputation costs.

Conventions:

* one multiply-add is 2 FLOPs, so a [m, k] x [k, n] matmul costs 2·m·k·n;
* only matmuls are counted. Elementwise work (norms, softmax, dropout, activations, RoPE, bias
  adds, residual adds, the causal mask, the router's top-k) and the MoE dispatch/combine
  gathers and scatters are ignored, as in the paper's Appendix A and in
  `torch.utils.flop_counter.FlopCounterMode`;
* embedding lookups are free; the output layer (logits) costs 2·b·s·h·v;
* a backward pass costs twice its forward (gradients of the inputs and of the weights), so a
  training step is 3 x forward, plus whatever recomputation re-runs in backward; with adapters
  on a frozen base (LoRA) the weights' backward is the input gradient alone (2 x forward, core
  attention aside).

Two counts, named by the `executed` flag of every function:

* model FLOPs (`executed=False`, the default of the counting functions): causal attention costs
  the full s x s (QK^T and attention-over-V over every query/key pair), as Korthikanti et al.
  (2022, Appendix A) count it and as Megatron-LM's `num_floating_point_operations` did up to
  core_r0.11.0. It is what the `unfused` backend really computes (a full `baddbmm`, then the
  mask). Megatron-LM core_r0.12.0 and later halve the causal attention term in that function
  ("causal mask (only half of the mask is non-zero)", megatron/training/training.py): its
  logged TFLOP/s then counts attention like the executed count below;
* executed FLOPs (`executed=True`): what the kernels do. The flash / fused (cuDNN) / auto
  backends skip the key blocks above the diagonal, so the two s x s matmuls cost half
  (FlashAttention's `flops(..., causal)` in benchmarks/benchmark_flash_attention.py divides by
  2), and their backward recomputes QK^T inside the kernel: 2.5 x its forward, not 2 x (the
  same function's `mode="bwd"`). `unfused` executes the model count.

Step-time predictions ("+x% step time", the planner's ranking, the CLI's
`recompute_flops_fraction`) use executed FLOPs; `model_recompute_flops_fraction` keeps the
model convention.

Numbers are for one micro-batch (b = micro_batch_size, s = seq_length) of the whole model, or
of one pipeline stage (`stage=`: the layers of its virtual chunks, plus the logits on the last
stage), on one device: tensor/context/expert parallelism split the same work across the ranks
of a stage, so fractions are per rank. Every model count equals what `FlopCounterMode` counts
when the reference layers run (see tests/test_flops.py).

Symbols: T = b·s tokens, h hidden, a heads, g KV groups, d head dim, f ffn hidden, v vocab,
L layers, E experts, k router top-k.
"""

from __future__ import annotations

from ..config import Config, ModelConfig, RecomputeConfig, full_recompute_chunks
from .layout import pipeline_layout

# Attention backends whose causal kernels skip the masked half (Megatron's `attention_backend`
# values; `auto` picks TE's flash or fused kernel on a GPU).
CAUSAL_SKIPPING_BACKENDS = ("flash", "fused", "auto")
FLASH_BACKWARD_FACTOR = 2.5  # flash/fused attention backward / forward (QK^T recomputed)


def skips_masked_half(model: ModelConfig) -> bool:
    """Whether the attention kernel skips the masked half of causal attention."""
    return model.attention_backend in CAUSAL_SKIPPING_BACKENDS


def _matmul(tokens: int, d_in: int, d_out: int) -> float:
    """FLOPs of a linear layer [tokens, d_in] -> [tokens, d_out] (bias add not counted)."""
    return 2.0 * tokens * d_in * d_out


def _mlp_flops(tokens: int, hidden: int, ffn: int, swiglu: bool) -> float:
    """fc1 (2·ffn wide with SwiGLU: gate and up halves) plus fc2."""
    fc1_out = 2 * ffn if swiglu else ffn
    return _matmul(tokens, hidden, fc1_out) + _matmul(tokens, ffn, hidden)


def _attention_flops(m: ModelConfig, executed: bool) -> dict[str, float]:
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
    if executed and skips_masked_half(m):
        flops["core_attn"] /= 2  # only the key blocks on and below the diagonal
    return flops


def layer_forward_flops(
    model: ModelConfig, moe_layer: bool, executed: bool = False
) -> dict[str, float]:
    """Forward FLOPs of one transformer layer for one micro-batch, per module.

    Keys: `qkv` (QKV projection; MLA: the down projections), `mla_up_proj` (MLA only),
    `core_attn`, `proj`, then `mlp` on a dense layer, or `router`, `experts`, `moe_act` (0:
    elementwise) and `shared_experts` (when the model has them) on an MoE layer. Norms are
    elementwise and not listed. `executed`: causal attention as the backend runs it.
    """
    m = model
    tokens = m.micro_batch_size * m.seq_length
    h = m.hidden_size
    flops = _attention_flops(m, executed)
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


def _layer_kinds(model: ModelConfig, executed: bool) -> tuple[dict, dict]:
    """Per-module forward FLOPs of a dense and of an MoE layer ({} without experts)."""
    dense = layer_forward_flops(model, moe_layer=False, executed=executed)
    moe = {}
    if model.num_moe_experts:
        moe = layer_forward_flops(model, moe_layer=True, executed=executed)
    return dense, moe


def _layer_totals(model: ModelConfig, executed: bool = False) -> list[float]:
    """Forward FLOPs of each layer, in order (dense and MoE layers differ)."""
    dense, moe = (sum(kind.values()) for kind in _layer_kinds(model, executed))
    return [moe if model.is_moe_layer(i) else dense for i in range(model.num_layers)]


def _chunks(config: Config, stage: int | None) -> list[list[int]]:
    """The layer numbers of each virtual-pipeline chunk of `stage` (None: of every stage), as
    the memory model lays them out (`layout.pipeline_layout`)."""
    layout = pipeline_layout(config.model, config.parallel)
    stages = range(len(layout)) if stage is None else [stage]
    return [chunk for k in stages for chunk in layout[k]]


def _has_logits(config: Config, stage: int | None) -> bool:
    return stage is None or stage == config.parallel.pipeline_model_parallel_size - 1


def output_layer_flops(model: ModelConfig) -> float:
    """The logits: [b·s, h] x [h, v]."""
    return _matmul(model.micro_batch_size * model.seq_length, model.hidden_size, model.vocab_size)


def model_forward_flops(config: Config, stage: int | None = None, executed: bool = False) -> float:
    """Forward FLOPs for one micro-batch: all layers (of `stage`) plus the logits (on the last
    stage)."""
    totals = _layer_totals(config.model, executed)
    if stage is None:
        layers = sum(totals)
    else:
        layers = sum(totals[n] for chunk in _chunks(config, stage) for n in chunk)
    return layers + (output_layer_flops(config.model) if _has_logits(config, stage) else 0.0)


def step_flops(config: Config, stage: int | None = None, executed: bool = False) -> float:
    """FLOPs of one training step for one micro-batch (of the whole model, or of `stage`),
    without recomputation: forward + backward (2 x forward). Executed on a flash/fused
    backend, attention's backward is 2.5 x its forward instead."""
    forward = model_forward_flops(config, stage, executed)
    m = config.model
    layers = m.num_layers if stage is None else sum(map(len, _chunks(config, stage)))
    attn = _attention_flops(m, executed)["core_attn"] * layers
    # adapters on a frozen base: no weight gradients (Transformer Engine's linears skip the
    # wgrad GEMM of a weight that does not require grad), so a weight's backward is its input
    # gradient alone, 1 x forward; core attention has no weights and keeps 2 x
    total = 2.0 * forward + attn if config.parallel.frozen_base else 3.0 * forward
    if executed and skips_masked_half(m):
        total += (FLASH_BACKWARD_FACTOR - 2.0) * attn
    return total


def _selective_recompute_flops(
    model: ModelConfig, rc: RecomputeConfig, layers: list[int], executed: bool
) -> float:
    """Forward FLOPs re-run in backward by the selected modules, summed over `layers`."""
    dense, moe = _layer_kinds(model, executed)
    num_moe = sum(1 for n in layers if model.is_moe_layer(n))
    num_dense = len(layers) - num_moe
    total = 0.0
    if model.loss_implementation == "torchtitan" and not model.multi_latent_attention:
        # torchtitan's per-op policy (memory/torchtitan.py) recomputes every second matmul of
        # a dense block's forward: wk, wo and w3 (wq, wv, w1 and w2 are cached)
        tokens = model.micro_batch_size * model.seq_length
        h, d = model.hidden_size, model.head_dim
        per_layer = (
            _matmul(tokens, h, model.kv_groups * d)
            + _matmul(tokens, model.num_attention_heads * d, h)
            + _matmul(tokens, h, model.ffn_size)
        )
        total += per_layer * num_dense
        num_dense = 0  # attention outputs are cached
        # MoE layers: the same policy re-runs about every second matmul of the block (an
        # APPROXIMATION: half the attention projections' and experts' forward FLOPs)
        matmuls = ("qkv", "mla_up_proj", "proj", "router", "experts", "shared_experts")
        total += 0.5 * sum(moe.get(key, 0.0) for key in matmuls) * num_moe
        num_moe = 0
    elif model.loss_implementation == "torchtitan":
        # MLA (DeepSeek-V3 in torchtitan): about every second matmul of every block, as above
        matmuls = ("qkv", "mla_up_proj", "proj", "mlp", "router", "experts", "shared_experts")
        total += 0.5 * sum(dense.get(key, 0.0) for key in matmuls) * num_dense
        total += 0.5 * sum(moe.get(key, 0.0) for key in matmuls) * num_moe
        num_dense = num_moe = 0
    else:
        for module in ("core_attn", "mla_up_proj"):  # on every layer (or on none)
            if rc.selects(module):
                total += dense.get(module, 0.0) * len(layers)
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


def recompute_flops(config: Config, stage: int | None = None, executed: bool = False) -> float:
    """Extra forward FLOPs that recomputation re-runs during backward, for one micro-batch, on
    the whole model or on pipeline stage `stage`.

    selective: the recomputed modules' forward on every layer they apply to. full: Megatron
    applies `recompute_method`/`recompute_num_layers` per TransformerBlock, i.e. per virtual
    pipeline chunk (`TransformerBlock._checkpointed_forward` loops over
    `num_layers_per_pipeline_rank = len(self.layers)`, the chunk's layers: megatron-core 0.16.1
    megatron/core/transformer/transformer_block.py L326, L532-L560): block N re-runs the first
    min(N, chunk) layers of EVERY chunk, uniform re-runs every layer once whatever N (the last
    group of a chunk is clamped). The chunks are the memory model's
    (`config.full_recompute_chunks` over `layout.pipeline_layout`). Offloading costs no FLOPs.
    """
    model, rc = config.model, config.recompute
    if rc.recompute_granularity is None:
        return 0.0
    if rc.recompute_granularity == "selective":
        if stage is None:
            layers = list(range(model.num_layers))
        else:
            layers = [n for chunk in _chunks(config, stage) for n in chunk]
        return _selective_recompute_flops(model, rc, layers, executed)
    if rc.recompute_granularity != "full":
        raise ValueError(f"unknown recompute_granularity {rc.recompute_granularity!r}")
    if rc.recompute_method not in ("uniform", "block"):
        raise ValueError(
            f"full recompute needs recompute_method uniform or block, got {rc.recompute_method!r}"
        )
    totals = _layer_totals(model, executed)
    total = 0.0
    for chunk in _chunks(config, stage):
        for start, end, checkpointed in full_recompute_chunks(rc, len(chunk)):
            if checkpointed:
                total += sum(totals[n] for n in chunk[start:end])
    return total


def recompute_flops_fraction(config: Config, stage: int | None = None) -> float:
    """Executed recompute FLOPs over the executed FLOPs of a step without recompute, for the
    whole model or one pipeline stage: the predicted step-time increase (the CLI's
    `recompute_flops_fraction`)."""
    return recompute_flops(config, stage, executed=True) / step_flops(config, stage, executed=True)


def model_recompute_flops_fraction(config: Config, stage: int | None = None) -> float:
    """The same fraction in the model-FLOPs convention (full s x s attention; the CLI's
    `model_recompute_flops_fraction`)."""
    return recompute_flops(config, stage) / step_flops(config, stage)


def hardware_flops_per_step(config: Config, executed: bool = False) -> float:
    """FLOPs of one training step for one micro-batch with recomputation: model FLOPs plus
    recomputation (`executed`: as the kernels run them)."""
    return step_flops(config, executed=executed) + recompute_flops(config, executed=executed)


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
