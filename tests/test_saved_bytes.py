"""Saved-activation bytes move as Korthikanti et al. (2022) say, per layer, on the unfused backend.

Every expectation is a formula written from the shapes (s, b, h, a, g, f and element sizes),
never a number copied from a run. B = bytes per activation element, M = bytes per dropout-mask
element (the layers keep bool masks on every device, as CUDA's fused dropout does: 1 byte, the
paper's assumption). Norm statistics are fp32 on every device, as in GPU kernels.
"""

import math

import pytest
import torch

from recompute_kit.config import parse_spec
from recompute_kit.layers import GPTModel
from recompute_kit.presets import get_preset
from recompute_kit.verify import make_batch, training_step

TINY = get_preset("tiny-gpt").config()
m = TINY.model
s, b, h, a, g, f, L = (
    m.seq_length,
    m.micro_batch_size,
    m.hidden_size,
    m.num_attention_heads,
    m.kv_groups,
    m.ffn_size,
    m.num_layers,
)
sbh, sbf, as2b = s * b * h, s * b * f, a * s * s * b


def ln_stats(B):
    return 2 * 4 * b * s  # fp32 mean and rstd per token


def layer_bytes_no_recompute(B, M):
    LN_STATS = ln_stats(B)
    layernorms = 2 * (B * sbh + LN_STATS)  # the two norm inputs (+ stats)
    attention = (
        B * sbh  # QKV input
        + 3 * B * sbh  # q and the GQA-expanded k and v
        + (2 * B + M) * as2b  # softmax output, dropout mask, dropped probabilities
        + B * sbh  # output-projection input
        + M * sbh
    )  # hidden dropout mask
    mlp = B * sbh + 2 * B * sbf + M * sbh  # fc1 input, GeLU input, fc2 input, dropout mask
    return layernorms + attention + mlp


def core_attn_saving(B, M):
    stored_qkv = B * sbh * (1 + 2 * g / a)  # the checkpoint keeps un-expanded q, k, v
    return 3 * B * sbh + (2 * B + M) * as2b - int(stored_qkv)


def measure(spec, dtype):
    torch.manual_seed(0)
    model = GPTModel(TINY.with_recompute(parse_spec(spec))).to(dtype)
    tokens, labels = make_batch(TINY, torch.device("cpu"), 0)
    saved = training_step(model, tokens, labels, 1).saved
    per_layer = saved.per_layer()
    decoder_level = saved.by_prefix("decoder") - sum(per_layer)  # full-recompute layer inputs
    return per_layer, decoder_level


DTYPES = [(torch.float32, 4), (torch.bfloat16, 2)]


@pytest.mark.parametrize("dtype,B", DTYPES)
def test_no_recompute_matches_the_paper_accounting(dtype, B):
    per_layer, decoder_level = measure("none", dtype)
    assert per_layer == [layer_bytes_no_recompute(B, M=1)] * L
    assert decoder_level == 0


def test_paper_constant_34_plus_5as_over_h_with_one_byte_masks():
    # With 16-bit activations and 1-byte masks our accounting is the paper's sbh(34 + 5as/h)
    # plus the LayerNorm statistics the paper ignores.
    assert f == 4 * h
    expected = sbh * (34 + 5 * a * s / h)
    mha = layer_bytes_no_recompute(B=2, M=1) - 2 * ln_stats(2)
    assert mha == expected


@pytest.mark.parametrize("dtype,B", DTYPES)
def test_core_attn_removes_the_attention_core(dtype, B):
    base, _ = measure("none", dtype)
    sel, _ = measure("selective:core_attn", dtype)
    assert [x - y for x, y in zip(base, sel, strict=True)] == [core_attn_saving(B, M=1)] * L


@pytest.mark.parametrize("dtype,B", DTYPES)
def test_layernorm_removes_both_norm_outputs(dtype, B):
    base, _ = measure("none", dtype)
    sel, _ = measure("selective:layernorm", dtype)
    assert [x - y for x, y in zip(base, sel, strict=True)] == [2 * (B * sbh + ln_stats(B))] * L


@pytest.mark.parametrize("dtype,B", DTYPES)
def test_mlp_removes_the_mlp_internals(dtype, B):
    base, _ = measure("none", dtype)
    sel, _ = measure("selective:mlp", dtype)
    assert [x - y for x, y in zip(base, sel, strict=True)] == [2 * B * sbf] * L


def test_modules_combine_additively():
    B = 4
    base, _ = measure("none", torch.float32)
    sel, _ = measure("selective:core_attn,mlp,layernorm", torch.float32)
    saving = core_attn_saving(B, 1) + 2 * (B * sbh + ln_stats(B)) + 2 * B * sbf
    assert [x - y for x, y in zip(base, sel, strict=True)] == [saving] * L


@pytest.mark.parametrize("n", range(1, L + 1))
def test_full_uniform_keeps_only_chunk_inputs(n):
    per_layer, decoder_level = measure(f"full:uniform:{n}", torch.float32)
    assert per_layer == [0] * L
    assert decoder_level == math.ceil(L / n) * 4 * sbh


@pytest.mark.parametrize("n", range(1, L + 1))
def test_full_block_checkpoints_the_first_n_layers(n):
    per_layer, decoder_level = measure(f"full:block:{n}", torch.float32)
    assert per_layer == [0] * n + [layer_bytes_no_recompute(4, 1)] * (L - n)
    assert decoder_level == n * 4 * sbh
