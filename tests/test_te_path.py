"""The Transformer Engine path per layer against what TE's modules save, from TE's source.

TE does not run on a CPU, so the reference here is a bottom-up count written from the source
of TransformerEngine v2.11 (commit c188b533cc3721ca9c6bbfd26148f5cf60108c25; megatron-core
0.16.1 pins transformer-engine>=2.9,<2.12) and megatron-core 0.16.1's TE spec, module by
module, independent of memory/estimate.py:

* LayerNormLinear (linear_qkv, dense linear_fc1): `inputmat` (the norm's input), `ln_out`
  (the local, sequence-sharded one with SP: the gathered copy is freed and gathered again in
  backward), mu and rsigma in fp32 (RMSNorm: rsigma only) -- layernorm_linear.py:381-383,
  466-476, 669-696.
* Linear (linear_proj, linear_fc2): its input, not gathered (row-parallel) -- linear.py:404, 439.
* FusedAttention: q, k, v (contiguous copies when Megatron's split is no layout cuDNN takes),
  out, softmax stats fp32 [b, heads, s, 1] and the rng state (2 x int64) --
  backends.py:1301-1332, utils.py:2018-2021, fused_attn_f16_arbitrary_seqlen.cu:1118-1131. The
  `out` it saves is the storage linear_proj saves (backends.py:1955).
* GroupedLinear (TEGroupedMLP's fc1 and fc2): `torch.split` views of its input --
  grouped_linear.py:152, 250-256.
"""

import pytest

from recompute_kit.memory.estimate import estimate, layer_activation_bytes
from recompute_kit.presets import get_preset

B = 2  # bf16


def _dims(cfg):
    m, p = cfg.model, cfg.parallel
    t = p.tensor_model_parallel_size
    sp = t if p.sequence_parallel else 1
    T = m.seq_length // p.context_parallel_size * m.micro_batch_size
    return m, t, sp, T


def te_dense_layer_bytes(cfg, recompute: str = "none", flash_copy: bool = False) -> float:
    """A dense TE layer's saved bytes, module by module, from TE's source (bf16, no dropout,
    fused RoPE, fused bias-SwiGLU or bias-GeLU)."""
    m, t, sp, T = _dims(cfg)
    h, a, g, d = m.hidden_size, m.num_attention_heads, m.kv_groups, m.head_dim
    stats = (4 if m.normalization == "RMSNorm" else 8) * T / sp
    layer_norm_linear = B * T * h / sp + B * T * h / sp + stats  # inputmat, ln_out, mu/rsigma
    q, kv = B * T * a * d / t, B * T * g * d / t
    out = B * T * a * d / t
    aux = 4 * m.micro_batch_size * (a / t) * (m.seq_length // 1) + 16
    proj = out  # Linear's input: the attention's output
    masks = 2 * T * h / sp if m.hidden_dropout > 0 else 0.0
    if recompute == "core_attn":
        # Megatron's checkpoint keeps its inputs: rotated q and k (new tensors) and v, a view
        # that keeps the whole fused QKV output alive
        attention = (q + 2 * kv) + q + kv
    else:
        attention = q + 2 * kv + aux + (out if flash_copy else 0.0)
    f = m.ffn_size / t
    act = (3 if m.swiglu else 2) * B * T * f  # SwiGLU: fc1 out (2f) + fc2 input (f)
    ffn = layer_norm_linear + act
    if recompute == "mlp":
        ffn = B * T * h / sp  # the checkpoint's input: the residual stream
    return layer_norm_linear + attention + proj + masks + ffn


LLAMA8 = get_preset("llama3-8b").config().replace(pipeline_model_parallel_size=1)
LLAMA70 = get_preset("llama3-70b").config().replace(pipeline_model_parallel_size=1)
CASES = {
    "llama3-8b TP1 fused mb2": LLAMA8.replace(attention_backend="fused", micro_batch_size=2),
    "llama3-8b TP1 auto mb2": LLAMA8.replace(attention_backend="auto", micro_batch_size=2),
    "llama3-8b TP1 flash mb1": LLAMA8,
    "llama3-70b TP8+SP flash mb1": LLAMA70,
    "llama3-70b TP8+SP fused mb2": LLAMA70.replace(attention_backend="fused", micro_batch_size=2),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("recompute", ["none", "core_attn", "mlp", "layernorm"])
def test_dense_te_layer_equals_te_source_count(name, recompute):
    # Old code: the attention output was counted by core attention and by linear_proj (+1 out
    # per layer: 64 MiB on Llama-3-8B at 8k), `mlp` recompute kept the fused pre-MLP norm's
    # input, statistics and output outside the checkpoint (+64 MiB).
    cfg = CASES[name]
    spec = "none" if recompute == "none" else f"selective:{recompute}"
    expected = te_dense_layer_bytes(cfg, "none" if recompute == "layernorm" else recompute)
    assert estimate(cfg.with_recompute(spec)).per_layer_activation_bytes == pytest.approx(
        expected, rel=1e-12
    )


def test_flash_attention_keeps_its_own_output_above_micro_batch_one():
    # TE's FlashAttention transposes sbhd -> bshd and back with .contiguous()
    # (backends.py:722-725, 1075-1083): a copy when b > 1, a no-op when b = 1.
    cfg = LLAMA8.replace(micro_batch_size=2)
    est = estimate(cfg).per_layer_activation_bytes
    assert est == pytest.approx(te_dense_layer_bytes(cfg, flash_copy=True), rel=1e-12)
    fused = estimate(cfg.replace(attention_backend="fused")).per_layer_activation_bytes
    m, t, _sp, T = _dims(cfg)
    assert est - fused == B * T * m.num_attention_heads * m.head_dim / t


def test_te_path_is_megatron_lm_theoretical_formula():
    # Megatron-LM megatron/training/theoretical_memory_usage.py (compute_activation_memory,
    # commit d98e8a64): s*b*h*(18 + 4*ffn/h)/t per layer with TP + SP, Korthikanti et al.'s
    # Table 2 with selective recompute. On the TE path with fused attention and NO recompute
    # the same bytes are kept (q, k, v and one output instead of q, k, v and the projection's
    # input), plus what the formula leaves out: the norms' fp32 statistics and cuDNN's softmax
    # statistics and rng state. Old code: +2*s*b*h/t (the output twice).
    base = get_preset("gpt3-175b").config().replace(pipeline_model_parallel_size=1)
    for ffn_over_h in (3, 4, 8):
        for t in (1, 8):
            cfg = base.replace(
                transformer_impl="transformer_engine",
                attention_backend="fused",
                ffn_hidden_size=ffn_over_h * base.model.hidden_size,
                tensor_model_parallel_size=t,
                sequence_parallel=t > 1,
            )
            m = cfg.model
            s, b, h, a = m.seq_length, m.micro_batch_size, m.hidden_size, m.num_attention_heads
            formula = s * b * h * (18 + 4 * ffn_over_h) / t
            norm_stats = 2 * 8 * s * b / t  # two LayerNorms, fp32 mean + rstd per token
            softmax_stats = 4 * b * (a / t) * s + 16
            for spec, extra in (("none", softmax_stats), ("selective:core_attn", 0.0)):
                got = estimate(cfg.with_recompute(spec)).per_layer_activation_bytes
                assert got == pytest.approx(formula + norm_stats + extra, rel=1e-12), (t, spec)


MIXTRAL = (
    get_preset("mixtral-8x7b")
    .config()
    .replace(pipeline_model_parallel_size=1, expert_model_parallel_size=8)
)


@pytest.mark.parametrize("tp_sp", [(1, False), (2, True)])
def test_moe_layer_layernorm_recompute_spares_the_fused_input_norm(tp_sp):
    # An MoE layer under the TE spec: the input norm is still inside linear_qkv
    # (LayerNormLinear, input_layernorm IdentityOp), only pre_mlp_layernorm is a TENorm that
    # `layernorm` recomputes (transformer_layer.py:384, :432). Old code: both norms' outputs
    # and statistics were dropped (qkv role 0).
    t, sp_on = tp_sp
    cfg = MIXTRAL.replace(tensor_model_parallel_size=t, sequence_parallel=sp_on)
    m, t, sp, T = _dims(cfg)
    roles = layer_activation_bytes(
        m, cfg.with_recompute("selective:layernorm").recompute, cfg.parallel, B, True
    )
    h = m.hidden_size
    assert roles["qkv"] == B * T * h / sp  # LayerNormLinear's ln_out
    # the fused norm's input and rsigma; the TENorm's input (its checkpoint's), no statistics
    assert roles["layernorm"] == (B * T * h / sp + 4 * T / sp) + B * T * h / sp
    plain = layer_activation_bytes(m, cfg.recompute, cfg.parallel, B, True)
    # what `layernorm` saves on an MoE layer: the TENorm's output and its rsigma
    saved = sum(plain.values()) - sum(roles.values())
    assert saved == B * T * h / sp + 4 * T / sp


def test_moe_grouped_gemm_experts_equal_grouped_linear_saves():
    # TEGroupedMLP (moe_grouped_gemm, TE spec): GroupedLinear fc1 keeps split views of the
    # permuted tokens (grouped_linear.py:152, 250-256), the fused weighted SwiGLU keeps fc1's
    # output and the permuted probabilities (experts.py weighted_bias_swiglu_impl), GroupedLinear
    # fc2 keeps its input. With `moe_act` the activation's output is recomputed for fc2.
    cfg = MIXTRAL
    m, _t, sp, T = _dims(cfg)
    picks = T / sp * m.moe_router_topk  # balanced: every rank's share of token copies
    f = m.moe_ffn_size
    for spec, fc2_input in (("none", B * picks * f), ("selective:moe_act", 0.0)):
        roles = layer_activation_bytes(m, cfg.with_recompute(spec).recompute, cfg.parallel, B, True)
        assert roles["experts"] == B * picks * m.hidden_size + B * picks
        assert roles["moe_act"] == 2 * B * picks * f + fc2_input


def test_mla_input_norm_is_a_module_under_te():
    # MLA's TE spec builds input_layernorm=TENorm (its down projections are plain TELinear), so
    # `layernorm` recomputes it even on a dense layer; the dense layer's pre-MLP norm stays
    # fused into linear_fc1. Old code: no norm recomputed on any dense TE layer.
    cfg = get_preset("deepseek-v3").config()
    m = cfg.model
    _, _t, sp, T = _dims(cfg)
    dense = not m.is_moe_layer(0)
    assert dense
    rc = cfg.with_recompute("selective:layernorm").recompute
    roles = layer_activation_bytes(m, rc, cfg.parallel, B, False)
    plain = layer_activation_bytes(m, cfg.recompute, cfg.parallel, B, False)
    h = m.hidden_size
    assert plain["qkv"] == B * T * h / sp and roles["qkv"] == 0.0
    assert plain["layernorm"] - roles["layernorm"] == 4 * T / sp  # the TENorm's rsigma


def test_reference_layers_keep_sdpa_output_and_its_copy():
    # The TE rules apply to engine="megatron" with transformer_impl="transformer_engine" only:
    # the kit's reference layers run torch's SDPA, whose [b, a, s, d] output is saved by the
    # kernel and transposed into a new tensor for the projection (two storages).
    cfg = LLAMA8
    m, _t, _sp, T = _dims(cfg)
    a, g, d = m.num_attention_heads, m.kv_groups, m.head_dim
    ref = estimate(cfg, engine="reference").modules
    lse = 4 * m.micro_batch_size * a * m.seq_length
    assert ref["core_attn"] == B * T * d * (a + 2 * g) + B * T * a * d + lse
    local = estimate(cfg.replace(transformer_impl="local")).modules
    assert local["core_attn"] == ref["core_attn"]  # no TE: nothing shared
