"""What Megatron-Core's Transformer Engine spec keeps for backward where it differs from the
local spec: which norms are fused into the next linear, and whether the attention kernel's
saved output is the tensor linear_proj saves.

TransformerEngine does not run on a CPU, so these rules come from its source, not from a
measurement: TransformerEngine v2.11 (commit c188b533cc3721ca9c6bbfd26148f5cf60108c25, the
release line megatron-core 0.16.1 pins: transformer-engine>=2.9,<2.12) and megatron-core
0.16.1's TE spec (models/gpt/gpt_layer_specs.py, transformer/transformer_layer.py).
"""

from __future__ import annotations

from ..config import ModelConfig


def te_spec(m: ModelConfig) -> bool:
    return m.transformer_impl == "transformer_engine"


def attention_norm_fused(m: ModelConfig) -> bool:
    """The input norm lives inside linear_qkv (TELayerNormColumnParallelLinear) and the layer's
    input_layernorm is an IdentityOp (gpt_layer_specs.py, the non-MLA branch of
    get_gpt_layer_with_transformer_engine_spec). MLA builds a separate TENorm there (its down
    projections are plain TELinear), so its input norm is a norm of its own."""
    return te_spec(m) and not m.multi_latent_attention


def mlp_norm_fused(m: ModelConfig, moe_layer: bool) -> bool:
    """A dense layer's pre-MLP norm lives inside linear_fc1 (pre_mlp_layernorm is IdentityOp
    unless the layer has experts; get_mlp_module_spec_for_backend builds
    column_parallel_layer_norm_linear for fc1); an MoE layer has a TENorm."""
    return te_spec(m) and not moe_layer


def norm_recomputed(fused: bool, layernorm_selected: bool) -> bool:
    """Megatron recomputes a norm only where it is a module of its own: transformer_layer.py
    sets recompute_input_layernorm / recompute_pre_mlp_layernorm only when the norm is not an
    IdentityOp (megatron-core 0.16.1, transformer_layer.py:384 and :432). A norm fused into
    LayerNormLinear keeps its input, its output and its statistics whatever `layernorm` says
    (TE layernorm_linear.py:466-476 saves inputmat, ln_out, mu, rsigma)."""
    return layernorm_selected and not fused


def attention_output_shared(m: ModelConfig, micro_batch: int) -> bool:
    """Whether the output TE's attention saves for its backward is the very storage linear_proj
    saves as its input (so the layer holds it once, not twice).

    * FusedAttention (cuDNN): FusedAttnFunc saves `out` (backends.py:1299-1332) and
      FusedAttention returns `output.view(..., -1)` (backends.py:1955), which TE's Linear saves
      as its input without a copy in 16-bit (linear.py:240, 404, 439). Shared.
    * FlashAttention (flash-attn through TE): sbhd inputs are transposed to bshd with
      `.contiguous()` and the output transposed back and made `.contiguous()`
      (backends.py:722-725, 1075-1083): a copy when the micro-batch is above 1, so flash-attn's
      saved bshd output and linear_proj's sbhd input are two tensors; with a micro-batch of 1
      both transposes are already contiguous and nothing is copied. The context-parallel path
      goes through the same transposes.
    * "auto" is taken as FusedAttention: TE prefers it over flash-attn on Hopper and newer
      (utils.py:1134-1139, get_attention_backend); on Ampere with flash-attn installed TE would
      pick flash-attn, which this assumes away.
    """
    if not te_spec(m) or m.attention_backend == "unfused":
        return False
    return m.attention_backend in ("fused", "auto") or micro_batch == 1
