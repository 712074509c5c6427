"""MoE and MLA layers: every recompute module exact, routing reproduced, and saved-byte deltas
that match formulas written from the shapes (top-k token expansion included)."""

import pytest
import torch

from recompute_kit.config import all_specs, applicable_modules, parse_spec
from recompute_kit.layers import GPTModel
from recompute_kit.layers.moe import Router
from recompute_kit.memory.measure import make_batch, training_step
from recompute_kit.presets import get_preset
from recompute_kit.verify import verify

MOE = get_preset("tiny-moe").config()
MLA = get_preset("tiny-mla").config()


@pytest.mark.parametrize("cfg", [MOE, MLA], ids=["tiny-moe", "tiny-mla"])
def test_every_spec_is_bitwise_exact_with_dropout(cfg):
    assert cfg.model.hidden_dropout > 0 and cfg.model.attention_dropout > 0
    specs = all_specs(cfg)
    results = verify(cfg, specs, seed=21)
    assert len(results) == len(specs)
    for r in results:
        assert r.loss_match and r.grads_match and r.max_grad_abs_diff == 0.0, r.recompute


def test_applicable_modules():
    assert applicable_modules(MOE) == [
        "core_attn",
        "mlp",
        "layernorm",
        "moe",
        "moe_act",
        "shared_experts",
    ]
    assert applicable_modules(MLA)[-1] == "mla_up_proj"
    assert "mla_up_proj" in " ".join(all_specs(MLA))


def test_mlp_on_moe_layers_is_a_noop_and_verify_says_so():
    only_moe = MOE.replace(moe_layer_freq=1)  # every layer MoE
    [r] = verify(only_moe, ["selective:mlp"])
    assert r.saved_activation_bytes == r.baseline_saved_activation_bytes
    assert any("'mlp' is a no-op on the 4 MoE layers" in note for note in r.notes)


def test_bf16_moe_is_exact():
    results = verify(
        MOE,
        ["selective:moe", "selective:moe_act,layernorm", "full:uniform:1"],
        dtype="bf16",
        seed=4,
    )
    for r in results:
        assert r.loss_match and r.grads_match, r.recompute


# ---- routing: recompute must take the same decisions ----------------------------------------


def _routing_log(model):
    log = []
    for module in model.modules():
        if isinstance(module, Router):
            module.register_forward_hook(lambda _m, _i, out: log.append(out[1].clone()))
    return log


@pytest.mark.parametrize("tie", [False, True], ids=["random", "all-tied"])
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_recompute_reproduces_routing_including_ties(tie, score):
    cfg = MOE.replace(moe_layer_freq=1, moe_router_score_function=score)
    torch.manual_seed(0)
    model = GPTModel(cfg.with_recompute("none"))
    if tie:  # every logit equal: top-k must break ties the same way both times
        for module in model.modules():
            if isinstance(module, Router):
                module.weight.data.zero_()
    tokens, labels = make_batch(cfg, torch.device("cpu"), 0)
    log = _routing_log(model)
    training_step(model, tokens, labels, 1)
    reference = list(log)
    log.clear()

    model.set_recompute(parse_spec("selective:moe"))
    training_step(model, tokens, labels, 1)
    n = cfg.model.num_layers
    assert len(log) == 2 * n  # forward once per layer, then once more per layer in backward
    forward, recompute = log[:n], log[n:][::-1]  # backward visits layers last to first
    for ref, fwd, rec in zip(reference, forward, recompute, strict=True):
        assert torch.equal(ref, fwd) and torch.equal(fwd, rec)
    if tie:
        assert (reference[0] == reference[0][0]).all()  # really tied: every token same experts


# ---- saved-byte deltas per module -------------------------------------------------------------


def per_layer(cfg, spec):
    torch.manual_seed(0)
    model = GPTModel(cfg.with_recompute(parse_spec(spec)))
    tokens, labels = make_batch(cfg, torch.device("cpu"), 0)
    return training_step(model, tokens, labels, 1).saved.per_layer()


def deltas(cfg, spec):
    return [a - b for a, b in zip(per_layer(cfg, "none"), per_layer(cfg, spec), strict=True)]


B, INDEX = 4, 8  # fp32 activations, int64 indices
m = MOE.model
T, k, h, E = m.micro_batch_size * m.seq_length, m.moe_router_topk, m.hidden_size, m.num_moe_experts
f_e, f_s = m.moe_ffn_size, m.moe_shared_expert_intermediate_size
dense_layers = [not m.is_moe_layer(i) for i in range(m.num_layers)]


def moe_or_zero(value):
    return [0 if dense else value for dense in dense_layers]


def test_moe_act_frees_the_expert_activation():
    # SwiGLU activation x probs: silu(gate), silu(gate)*up and the activation output (fc2's input)
    # are gone; fc1's output and the probabilities stay (the checkpoint's inputs).
    assert deltas(MOE, "selective:moe_act") == moe_or_zero(3 * T * k * f_e * B)


def test_shared_experts_frees_the_shared_mlp_internals():
    # fc1 output (gate|up), silu(gate), and fc2's input; the MLP input stays.
    assert deltas(MOE, "selective:shared_experts") == moe_or_zero(T * (2 * f_s + 2 * f_s) * B)


def test_moe_frees_everything_but_the_layer_input():
    router = T * k * INDEX + T * k * B + T * E * 4 + E * 4  # top-k ids, probs, fp32 aux scores
    dispatch = 2 * T * k * INDEX  # slot -> token and pick order (both int64)
    experts = (
        T * k * h  # dispatched token copies: the top-k expansion
        + T * k * 2 * f_e  # fc1 output (gate|up)
        + 3 * T * k * f_e  # silu(gate), silu(gate)*up, activation output
        + T * k
    ) * B  # per-pick probabilities
    shared = T * (2 * f_s + 2 * f_s) * B
    assert deltas(MOE, "selective:moe") == moe_or_zero(router + dispatch + experts + shared)


def test_mla_up_proj_frees_the_expanded_qkv():
    c = MLA.model
    b, s, a = c.micro_batch_size, c.seq_length, c.num_attention_heads
    q_or_k = b * a * s * (c.qk_head_dim + c.qk_pos_emb_head_dim) * B
    v = b * a * s * c.v_head_dim * B
    # the norms of the latents live inside the up-projection unit (as in TE's fused
    # norm+linear): their outputs and fp32 rstd go too; the latents themselves stay
    norms = b * s * (c.q_lora_rank + c.kv_lora_rank) * B + 2 * b * s * 4
    assert deltas(MLA, "selective:mla_up_proj") == [2 * q_or_k + v + norms] * c.num_layers


def test_top_k_expansion_scales_the_moe_act_saving():
    for topk in (1, 2, 3):
        cfg = MOE.replace(moe_router_topk=topk)
        assert deltas(cfg, "selective:moe_act") == moe_or_zero(3 * T * topk * f_e * B)


# ---- exactness at the scaled sizes where a difference was once reported -----------------------


def test_scaled_mla_is_bitwise_exact():
    # Issue 13 saw `selective` off by 9.3e-10 at these sizes (not reproduced on the pinned CPU
    # build: see benchmarks/RESULTS.md); the tiny presets would hide a size-dependent kernel path.
    cfg = MLA.replace(hidden_size=256, num_moe_experts=8, q_lora_rank=128, kv_lora_rank=96)
    specs = ["selective", "selective:mla_up_proj", "selective:moe", "selective:moe_act"]
    for r in verify(cfg, [*specs, "full:uniform:1"], seed=21):
        assert r.loss_match and r.grads_match and r.max_grad_abs_diff == 0.0, r.recompute
