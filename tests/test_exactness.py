"""Recompute must not change the math: loss and every gradient bitwise equal to no recompute,
in fp32 on CPU with dropout on, for every valid dense spec."""

import pytest
import torch

from recompute_kit.checkpoint import OutputDiscardingCheckpoint, RecomputePolicy, checkpoint
from recompute_kit.config import parse_spec
from recompute_kit.presets import get_preset
from recompute_kit.verify import all_specs, verify

TINY = get_preset("tiny-gpt").config()


def test_all_specs_cover_modules_alone_and_combined_and_every_n():
    specs = all_specs(TINY)
    assert {
        "none",
        "selective:",
        "selective:core_attn",
        "selective:mlp",
        "selective:layernorm",
        "selective:core_attn,mlp,layernorm",
    } <= {s if s != "selective" else "selective:core_attn" for s in specs} | {"selective:core_attn"}
    n = TINY.model.num_layers
    assert [s for s in specs if s.startswith("full:uniform")] == [
        f"full:uniform:{i}" for i in range(1, n + 1)
    ]
    assert [s for s in specs if s.startswith("full:block")] == [
        f"full:block:{i}" for i in range(1, n + 1)
    ]


def assert_all_exact(results):
    assert results
    for r in results:
        assert r.loss_match, r.recompute
        assert r.grads_match, r.recompute
        assert r.max_grad_abs_diff == 0.0


def test_every_dense_spec_is_bitwise_exact_with_dropout():
    assert TINY.model.hidden_dropout > 0 and TINY.model.attention_dropout > 0
    results = verify(TINY, all_specs(TINY), device="cpu", dtype="fp32", seed=7)
    assert_all_exact(results)
    # and recompute really happened: every spec but the controls saves less than none
    for r in results:
        if r.recompute in ("none", "selective:"):
            assert r.saved_activation_bytes == r.baseline_saved_activation_bytes
        else:
            assert r.saved_activation_bytes < r.baseline_saved_activation_bytes, r.recompute


def test_sdpa_swiglu_rmsnorm_mha_variant_is_exact():
    cfg = TINY.replace(
        attention_backend="flash",
        swiglu=True,
        normalization="RMSNorm",
        num_query_groups=None,
        num_layers=3,
    )
    assert_all_exact(verify(cfg, all_specs(cfg), seed=3))


def test_sdpa_gqa_is_exact():
    cfg = TINY.replace(attention_backend="flash", num_layers=2)
    assert_all_exact(verify(cfg, ["selective:core_attn,mlp,layernorm", "full:uniform:1"], seed=5))


def test_bf16_cpu_is_exact():
    cfg = TINY.replace(num_layers=2)
    assert_all_exact(
        verify(
            cfg,
            ["selective:core_attn,mlp,layernorm", "full:uniform:2", "full:block:1"],
            dtype="bf16",
            seed=11,
        )
    )


def test_dropout_really_varies_between_seeds():
    # guards against a test that passes because dropout is silently off
    a = verify(TINY, ["none"], seed=1)[0].baseline_loss
    b = verify(TINY, ["none"], seed=2)[0].baseline_loss
    assert a != b


# ---- the mechanisms on their own -------------------------------------------------------------


def _dropout_fn(x):
    return torch.nn.functional.dropout(x * 2, 0.5, training=True).sin()


def test_checkpoint_replays_rng_and_leaves_global_rng_alone():
    x = torch.randn(64, requires_grad=True)
    torch.manual_seed(0)
    _dropout_fn(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    torch.manual_seed(0)
    y = checkpoint(_dropout_fn, x)
    after_forward = torch.get_rng_state()
    y.sum().backward()
    assert torch.equal(x.grad, expected)
    assert torch.equal(torch.get_rng_state(), after_forward)  # recompute ran in a fork


def test_checkpoint_refuses_autograd_grad_with_megatron_message():
    x = torch.randn(8, requires_grad=True)
    y = checkpoint(torch.sin, x)
    with pytest.raises(
        RuntimeError,
        match=r"Checkpointing is not compatible with \.grad\(\), "
        r"please use \.backward\(\) if possible",
    ):
        torch.autograd.grad(y.sum(), x)


def test_output_discarding_frees_the_output_and_restores_it():
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    norm = torch.nn.LayerNorm(8)
    ref_out = (norm(x) @ w).relu().sum()
    ref_out.backward()
    expected = (x.grad.clone(), w.grad.clone(), norm.weight.grad.clone())
    for t in (x, w, norm.weight, norm.bias):
        t.grad = None

    ckpt = OutputDiscardingCheckpoint()
    y = ckpt.run(norm, x)
    z = y @ w  # matmul saves y
    ckpt.discard_output_and_register_recompute(z)
    assert y.untyped_storage().nbytes() == 0
    z.relu().sum().backward()
    assert torch.equal(x.grad, expected[0])
    assert torch.equal(w.grad, expected[1])
    assert torch.equal(norm.weight.grad, expected[2])


def test_policy_chunks_follow_megatron():
    def chunks(spec, n=4, training=True):
        return RecomputePolicy(parse_spec(spec)).full_recompute_chunks(n, training)

    assert chunks("full:uniform:1") == [(0, 1, True), (1, 2, True), (2, 3, True), (3, 4, True)]
    assert chunks("full:uniform:3") == [(0, 3, True), (3, 4, True)]  # last chunk clamped
    assert chunks("full:uniform:9") == [(0, 4, True)]
    assert chunks("full:block:2") == [(0, 1, True), (1, 2, True), (2, 4, False)]
    assert chunks("full:block:4") == [(i, i + 1, True) for i in range(4)]
    assert chunks("full:uniform:1", training=False) == [(0, 4, False)]  # training only
    assert chunks("selective") == [(0, 4, False)]


def test_eval_mode_never_checkpoints():
    policy = RecomputePolicy(parse_spec("selective:core_attn,mlp"))
    calls = []
    out = policy.checkpoint(
        "core_attn", lambda t: calls.append(t) or t, torch.ones(1), training=False
    )
    assert calls and out.grad_fn is None


def test_rmsnorm_gradients_match_autograd():
    from recompute_kit.layers.norm import RMSNorm

    norm = RMSNorm(16).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))
    expected = torch.nn.functional.rms_norm(x, (16,), norm.weight, norm.eps)
    assert torch.allclose(norm(x), expected)
