"""Rules RK020-RK036: settings that do not do what they seem to; recompute that costs too
much, and where the peak went."""

from __future__ import annotations

import re

from rule_helpers import (
    DEEPSEEK_V2_LITE_MLP,
    GIB,
    LLAMA3_8B_SELECTIVE,
    LLAMA3_70B_MLM_1031,
    LLAMA3_70B_TP8_NO_DISTOPT,
    LLAMA31_8B_MLP,
    MIXTRAL_8X7B_MLP,
    cites,
    covers,
    get,
    ids,
    intended_patch,
    run,
    spec_patch,
    text,
    top,
)

from recompute_kit.doctor.engine import build_context, diagnose
from recompute_kit.doctor.evidence import (
    Evidence,
    OOMEvent,
    parse_config,
    parse_log,
)
from recompute_kit.doctor.rules import (
    patch_for,
)

# =============================================================================================
# RK020-RK023: settings that do not do what they seem to
# =============================================================================================


@covers("RK020")
def test_rk020_core_attn_with_fused_attention():
    # --recompute-activations (selective core_attn) with TransformerEngine attention and a real
    # OOM: the setting Megatron-LM#1225/#464 report as buying almost nothing.
    d = run(text("oom-msswift-9191"), config=LLAMA3_8B_SELECTIVE, config_name="l8b.sh")
    f = get(d, "RK020")
    assert f.category == "recompute_no_effect"
    assert f.confidence == 0.7
    assert f.config_patch["recompute_modules"] == ["mlp"]
    cites(f, "'selective:mlp'")


@covers("RK020")
def test_rk020_not_with_unfused_attention():
    # With --attention-backend unfused the [b, a, s, s] scores exist and core_attn removes them.
    unfused = LLAMA3_8B_SELECTIVE.replace(
        "--transformer-impl transformer_engine", "--attention-backend unfused"
    )
    d = run(text("oom-msswift-9191"), config=unfused, config_name="l8b.sh")
    assert "RK020" not in ids(d)


@covers("RK021")
def test_rk021_mlp_recompute_on_an_all_moe_model():
    # Mixtral-8x7B recomputing 'mlp' (skipped by Megatron on MoE layers), real H200 OOM.
    d = run(text("oom-msswift-9191"), config=MIXTRAL_8X7B_MLP, config_name="mixtral.sh")
    f = get(d, "RK021")
    assert f.confidence == 0.75
    assert f.config_patch["recompute_modules"] == ["layernorm", "moe_act"]
    assert "every layer is MoE" in f.evidence


@covers("RK021")
def test_rk021_mlp_recompute_acts_only_on_the_dense_layers():
    # DeepSeek-V2-Lite: the first layer is dense, the 26 others MoE.
    d = run(text("oom-msswift-9191"), config=DEEPSEEK_V2_LITE_MLP, config_name="dsv2l.yaml")
    f = get(d, "RK021")
    assert f.confidence == 0.5 and "dense layers" in f.evidence


@covers("RK021")
def test_rk021_not_on_a_dense_model():
    cfg = LLAMA3_8B_SELECTIVE.replace(
        "--recompute-activations", "--recompute-granularity selective --recompute-modules mlp"
    )
    assert "RK021" not in ids(run(text("oom-msswift-9191"), config=cfg, config_name="x.sh"))


@covers("RK022")
def test_rk022_layernorm_recompute_still_ooms():
    # seed 001, the skill's Llama3-70B table: "Exp 3 | [core_attn, layernorm] | ... | OOM".
    d = run(experiments=text("seed-001-perf-activation-recompute"))
    f = get(d, "RK022")
    assert f.category == "recompute_no_effect"
    cites(f, "Exp 3", "layernorm")
    assert f.config_patch["recompute_granularity"] == "selective"
    assert "mlp" in f.config_patch["recompute_modules"]


@covers("RK022")
def test_rk022_not_when_no_layernorm_row_ooms():
    # The same table without the Exp 3 row (only verbatim lines removed).
    table = "\n".join(
        line
        for line in text("seed-001-perf-activation-recompute").splitlines()
        if not line.startswith("| Exp 3 |")
    )
    assert "RK022" not in ids(run(experiments=table))


@covers("RK023")
def test_rk023_recompute_num_layers_without_a_granularity():
    # A launcher that sets the method and layer count but no --recompute-granularity (Megatron
    # then recomputes nothing), with the real H200 OOM (oom-msswift-9191).
    cfg = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 \\
    --hidden-size 4096 \\
    --num-attention-heads 32 \\
    --seq-length 8192 \\
    --micro-batch-size 1 \\
    --tensor-model-parallel-size 2 \\
    --use-distributed-optimizer \\
    --recompute-method uniform \\
    --recompute-num-layers 1 \\
    --bf16
"""
    f = get(run(text("oom-msswift-9191"), config=cfg, config_name="train.sh"), "RK023")
    assert f.category == "recompute_no_effect"
    assert "recompute_granularity is empty" in f.evidence


@covers("RK023")
def test_rk023_full_recompute_with_the_same_peak_as_none():
    # WEAK: no public ablation table shows identical peaks. radixark/miles PR #1482 describes
    # the case ("--recompute-granularity full never engages"; ~136 GiB/GPU either way); the
    # rows below restate it.
    rows = [
        {"name": "baseline", "recompute": "none", "peak_memory_bytes": 136 * GIB},
        {"name": "full", "recompute": "full:uniform:1", "peak_memory_bytes": 136 * GIB},
    ]
    f = get(diagnose(Evidence(experiments=rows)), "RK023")
    cites(f, "'full'", "136.00 GiB", "'baseline'")


@covers("RK023")
def test_rk023_not_when_granularity_is_set():
    # The real Megatron argument dump (full, uniform, 2) and the Megatron-LM#525 OOM.
    d = run(text("ex-args-local-v014-full") + text("oom-mlm-525"))
    assert d.evidence.config["recompute_granularity"] == "full"
    assert "RK023" not in ids(d)


# =============================================================================================
# RK030-RK036: recompute that costs too much, and where the peak went
# =============================================================================================


@covers("RK030", "RK031", "RK033")
def test_rk030_rk031_rk033_the_skills_llama3_70b_table():
    # seed 001: Exp 1 [mlp] -16.4%, Exp 2 [mlp, core_attn] -17.3% at the same 55.6 GB peak.
    d = run(experiments=text("seed-001-perf-activation-recompute"))
    f30 = top(d)
    assert f30.rule == "RK030" and f30.category == "recompute_overhead"
    cites(f30, "Exp 1", "-16.4%")
    assert intended_patch(f30) == spec_patch("full", "block", 1)
    f31 = get(d, "RK031")
    cites(f31, "586.8", "593.6")
    assert f31.config_patch == spec_patch("selective", modules=["mlp"])
    f33 = get(d, "RK033")
    cites(f33, "Exp 2", "-17.3%")


@covers("RK030")
def test_rk030_from_the_flop_model_without_experiments():
    # Llama-3.1-8B recomputing mlp, no table: the FLOP model prices it (> 12%).
    d = run(config=LLAMA31_8B_MLP, config_name="l8b.yaml", gpu_memory_gb=80)
    f = get(d, "RK030")
    assert re.search(r"adds \d+\.\d% to the step's FLOPs", f.evidence)
    assert f.confidence == 0.5


@covers("RK031", "RK033")
def test_rk031_rk033_not_without_the_regressing_rows():
    # The seed table without Exp 1 and Exp 2 (verbatim lines removed): only -0.8% and -1.1%.
    table = "\n".join(
        line
        for line in text("seed-001-perf-activation-recompute").splitlines()
        if not line.startswith(("| Exp 1 |", "| Exp 2 |"))
    )
    d = run(experiments=table)
    assert not {"RK030", "RK031", "RK033"} & set(ids(d))


@covers("RK032")
def test_rk032_full_recompute_where_selective_fits():
    # The flags of Megatron-LM#1031 on 80 GiB H100s: full/uniform/5 re-runs every layer.
    d = run(config=LLAMA3_70B_MLM_1031, config_name="pretrain_llama70b.sh", gpu_memory_gb=80)
    f = top(d)
    assert f.rule == "RK032" and f.category == "recompute_overhead"
    assert "RK090" not in ids(d)  # the same advice, superseded
    best = build_context(d.evidence, 80).best.estimate
    cites(f, f"'{best.recompute}'", f"{best.recompute_flops_fraction:.1%}")
    assert intended_patch(f) == patch_for(best.recompute)
    assert (
        best.recompute_flops_fraction
        < build_context(d.evidence, 80).estimate.recompute_flops_fraction
    )


@covers("RK032")
def test_rk032_never_advises_less_recompute_after_an_oom():
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_MLM_1031, config_name="x.sh")
    assert "RK032" not in ids(d)


@covers("RK034")
def test_rk034_uniform_groups_of_two_layers():
    # The real Megatron argument dump (real-formats.md ex-args-local-v014-full: full, uniform,
    # recompute_num_layers 2) followed by the Megatron-LM#525 OOM.
    d = run(text("ex-args-local-v014-full") + text("oom-mlm-525"))
    f = get(d, "RK034")
    assert f.category == "activation_memory"
    cites(f, "Groups of 2 layers")
    assert f.config_patch == {"recompute_num_layers": 1}  # full, uniform: already set
    assert intended_patch(f) == spec_patch("full", "uniform", 1)


@covers("RK034")
def test_rk034_not_for_one_layer_per_group():
    one = LLAMA3_70B_MLM_1031.replace("--recompute-num-layers 5", "--recompute-num-layers 1")
    d = run(text("oom-mlm-525"), config=one, config_name="x.sh")
    assert "RK034" not in ids(d)


@covers("RK035")
def test_rk035_oom_on_different_ranks():
    # WEAK: no public log with OOMs of one job on several pipeline ranks was found; the two
    # events carry the fields of real-formats.md oom-msswift-9191 on ranks 0 and 97.
    base = parse_log(text("oom-msswift-9191")).oom[0]
    other = OOMEvent(**{**base.__dict__, "rank": 0})
    f = get(diagnose(Evidence(oom=[other, base])), "RK035")
    cites(f, "[0, 97]")


@covers("RK035")
def test_rk035_not_without_pipeline_stages():
    # Data-parallel replicas all OOM together; with PP = 1 there is no stage to move to.
    base = parse_log(text("oom-msswift-9191")).oom[0]
    other = OOMEvent(**{**base.__dict__, "rank": 0})
    cfg = parse_config(LLAMA3_70B_TP8_NO_DISTOPT, "x.sh")
    assert cfg["pipeline_model_parallel_size"] == 1
    assert "RK035" not in ids(diagnose(Evidence(oom=[other, base], config=cfg)))


@covers("RK035")
def test_rk035_not_for_a_single_rank():
    # oom-msswift-9191 is printed by rank 97 only; the seed table's OOMs are both on rank 0.
    d = run(text("oom-msswift-9191"), experiments=text("seed-001-perf-activation-recompute"))
    assert d.evidence.oom[0].rank == 97
    assert "RK035" not in ids(d)


@covers("RK036", "RK110")
def test_rk036_oom_in_the_optimizer_step():
    # https://github.com/huggingface/trl/pull/2776: the OOM is raised in AdamW's step. RK110
    # (optimizer states, issue 13) reads the same frames and supersedes RK036.
    d = run(text("trl-pr2776"))
    f = top(d)
    assert f.rule == "RK110" and f.category == "model_state_memory"
    cites(f, "adamw.py:606 in _multi_tensor_adamw")
    # TRL (Hugging Face / DeepSpeed, no Megatron keys, no stage): ZeRO-3, not Megatron's key
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    assert {"rule": "RK036", "reason": "superseded by RK110"} in d.dropped


@covers("RK036")
def test_rk036_oom_in_megatron_gradient_all_reduce():
    # https://github.com/NVIDIA/Megatron-LM/issues/60: allreduce_params in backward_step.
    f = get(run(text("mlm-60")), "RK036")
    assert "_flatten_dense_tensors" in f.evidence


@covers("RK036")
def test_rk036_not_for_an_oom_in_the_forward():
    # https://github.com/NVIDIA/Megatron-LM/issues/92: the OOM is in the loss, in forward.
    d = run(text("mlm-92"))
    assert "RK036" not in ids(d)
    # one 9.33 GiB tensor on a 10.76 GiB GPU, raised under post_language_model_processing: the
    # logits rule (RK016) names the cause and supersedes the generic RK004
    assert top(d).rule == "RK016" and "RK004" not in ids(d)
