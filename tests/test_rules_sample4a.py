"""RK691 (ZeRO-3 / offload named, the whole model moved onto the GPU first), RK690 (a
checkpoint call passing a forward argument in another parameter's slot) and RK600 read from an
"upgrading X from A to B" sentence, on verbatim real pastes (sources in rule_helpers.SOURCES)."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top


@covers("RK691")
def test_r10a_zero3_module_moved_whole_before_partitioning():
    # https://github.com/deepspeedai/DeepSpeed/issues/2497: ZeRO-3 + offload OOMs at
    # `self.module.to(self.device)`; the maintainer points to deepspeed.zero.Init
    d = run(text("r10a-deepspeed2497-module-to-device"))
    f = top(d)
    assert f.rule == "RK691" and f.category == "model_state_memory"
    assert "self.module.to(self.device)" in f.evidence
    assert "deepspeed.zero.Init" in f.fix
    assert f.config_patch["zero_init"] is True


def test_r10a_whole_move_without_sharding_or_oom_is_silent():
    paste = text("r10a-deepspeed2497-module-to-device")
    no_shard = paste.replace("Zero (Stage-3 + offload)", "plain DDP").replace(
        "as deepspeed requires", "as it requires"
    )
    assert "RK691" not in ids(run(no_shard))
    calm = (
        paste.replace("I got OOM error", "I got an error")
        .replace(" whose parameter size is larger than GPU memory capacity", "")
        .replace("that's where the OOM occurs", "that's where it fails")
    )
    assert "RK691" not in ids(run(calm))


@covers("RK690")
def test_r10a_ckpt_call_passes_rotary_where_inference_params_go():
    # https://github.com/NVIDIA/Megatron-LM/pull/355: "The variable `rotary_pos_emb` is passed
    # as `inference_params` by mistake" (full recompute path)
    d = run(text("r10a-megatron355-ckpt-arg-slot"))
    f = top(d)
    assert f.rule == "RK690" and f.category == "framework_bug"
    assert "rotary_pos_emb" in f.fix and "inference_params" in f.evidence
    assert "upgrade" in f.fix
    assert f.config_patch["code"].startswith("checkpoint(")


def test_r10a_ckpt_call_in_forward_order_is_silent():
    paste = text("r10a-megatron355-ckpt-arg-slot")
    fixed = paste.replace(
        "enc_dec_attn_mask, rotary_pos_emb)", "enc_dec_attn_mask, None, rotary_pos_emb)"
    )
    assert "RK690" not in ids(run(fixed))


def test_r10a_upgrade_from_to_reads_as_regression():
    # https://github.com/deepspeedai/DeepSpeed/issues/7116: "after upgrading deepspeed from
    # 0.15.0 to 0.16.0, my ppo demo encounters OOM" (a commit in between, bisected)
    d = run(text("r10a-deepspeed7116-upgrade-from-to"))
    f = top(d)
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "pip install deepspeed==0.15.0" in f.fix
    assert f.config_patch["command"] == "pip install deepspeed==0.15.0"
    # no failure said: no regression
    calm = text("r10a-deepspeed7116-upgrade-from-to").replace("encounters OOM", "runs")
    assert "RK600" not in ids(run(calm))
