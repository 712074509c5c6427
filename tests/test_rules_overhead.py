"""Tests of the rules in recompute_kit/doctor/rules/overhead.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

import re

import pytest
from rule_helpers import (
    LLAMA3_70B_MLM_1031,
    LLAMA3_70B_TP8_NO_DISTOPT,
    LLAMA31_8B_MLP,
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
from recompute_kit.doctor.evidence.measured import (
    recompute_cost_prose,
)
from recompute_kit.doctor.rules import (
    patch_for,
)

# ---- recompute's cost, said in Chinese ------------------------------------------------------


@covers("RK560")
def test_fresh_cjk_recompute_about_twenty_percent_slower():
    # https://github.com/bojone/bert4keras/issues/368: "采用recompute_grad 训练速度大约慢20%左右"
    # (about 20% slower with recompute_grad). Before: nothing fired.
    f = top(run(text("fh-bert4keras-368-recompute-slower")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "20" in f.evidence
    assert "selective" in f.fix or "fewer layers" in f.fix


def test_fresh_cjk_recompute_trades_time_for_memory():
    # https://github.com/IEIT-Yuan/Yuan-2.0/issues/18: "激活值重计算 ... 增加了额外的计算量，相当于
    # 用时间换空间" (recompute adds compute: time for memory); the maintainers: no recompute
    # where memory suffices, otherwise choose its granularity (full vs selective) by memory.
    # Before: nothing fired.
    f = top(run(text("fh-yuan2-18-recompute-cost")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "Recompute less" in f.fix and "selective" in f.fix


@covers("RK560")
def test_fresh_overhead_only_says_slower():
    # https://github.com/chuanyangjin/fast-DiT/issues/11: "with gradient checkpointing ... it
    # is super slow" (no number). Before: no finding.
    f = top(run(text("fz-fastdit-11-ckpt-slow")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "turn checkpointing off" in f.fix and "no number" in f.evidence


@covers("RK560")
def test_fresh_overhead_throughput_drop_by_a_factor():
    # https://github.com/Modalities/modalities/issues/13: "activation checkpointing leads to
    # tremendous throughput drops (factor >100)". Before: no finding.
    f = top(run(text("fz-modalities-13-throughput-drop")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "100x" in f.evidence and "more than one extra forward" in f.evidence


@covers("RK560")
def test_fresh_overhead_faster_without_checkpointing():
    # https://github.com/ReaLLMASIC/ReaLLM-Forge/pull/594: "iteration speed is still 10% or so
    # faster without gradient checkpointing" when the VRAM allows. Before: no finding.
    f = top(run(text("fz-reallm-594-ckpt-10pct")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "1.1x" in f.evidence and "no recompute where the run fits" in f.fix


def test_fresh_oom_word_not_inside_english_words():
    # mutation guard for the OOM-word change: "zoom" / "bloom" / "room" are no OOM mention
    d = run("zoom in on the bloom filter, there is room for a larger batch")
    assert not any(f.category == "logits_memory" for f in d.findings)


# =============================================================================================
# recompute_overhead: RK560, the cost said in words
# =============================================================================================


@covers("RK560")
def test_fresh_overhead_checkpointing_interval_speeds_up():
    # https://github.com/bghira/SimpleTuner/pull/1184: checkpointing every other block
    # (--gradient_checkpointing_interval=2) takes a step from 4.25 s to 3.00 s (1.42x).
    f = top(run(text("fl-simpletuner-1184-interval")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "fewer layers" in f.fix and f.config_patch == {"gradient_checkpointing_interval": 2}
    assert "1.42x" in f.evidence


@covers("RK560")
def test_fresh_overhead_full_recompute_reruns_attention():
    # https://github.com/hao-ai-lab/FastVideo/pull/1410: full recompute re-runs the attention
    # forward, ~12% of GPU compute; the PR's remedy is an attn_only selective policy that saves
    # the attention output. Before: RK170 (activation memory, from the word 'OOMs').
    f = top(run(text("fl-fastvideo-1410-attn-recompute")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "saves the attention output" in f.fix
    assert f.config_patch == {"activation_checkpointing": "selective"}


@covers("RK560")
def test_fresh_overhead_slowdown_beyond_one_forward():
    # https://github.com/QwenLM/Qwen-Image/issues/69: "a 3.75x slowdown ... theoretical
    # overhead from recomputation is only around 1.3x" (no maintainer answer yet). Before: no
    # finding. The evidence says 3.75x is more than one extra forward costs.
    f = top(run(text("fl-qwenimage-69-slowdown")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "3.75x" in f.evidence and "more than one extra forward" in f.evidence


def test_recompute_cost_prose_reads_ratios_times_and_shares():
    lines = [
        "with gradient checkpointing the step goes from 2.0 s to 2.6 s",
        "activation checkpointing: 25% slower",
        "recompute gave a 1.3x slowdown",
        "gradient checkpointing showed no noticeable slowdown, 1.3x less memory",
        "",
        "training went from 2.0 s to 2.6 s",  # no checkpointing named: not this fact
    ]
    got = [c["ratio"] for c in recompute_cost_prose(lines)]
    assert got == [1.3, 1.25, 1.3]


def test_rk560_not_without_a_cost():
    # checkpointing named with no time cost is no overhead finding
    d = run("I enabled gradient checkpointing and the memory dropped from 70 GB to 40 GB")
    assert "RK560" not in [f.rule for f in d.findings]


# RK036: the optimizer / gradient-sync reading needs a frame or a code line; "an identical
# train step" in the prose (where "train step" contains "in step") is neither.
@covers("RK036")
def test_rk036_reads_frames_not_prose():
    # https://github.com/pytorch/pytorch/issues/71616: an OOM with no traceback frames
    log = text("i26-pt-71616-report")
    assert "identical train step" in log
    d = run(log)
    assert "RK036" not in ids(d)
    assert not any("optimizer step / gradient sync ()" in f.evidence for f in d.findings)
    # https://github.com/NVIDIA/Megatron-LM/issues/60: the allreduce_params frame is quoted
    f = get(run(text("mlm-60")), "RK036")
    assert "distributed.py:53 in allreduce_params" in f.evidence


# RK560: "4.25 -> 3.00 s per step with gradient_checkpointing_interval=2" compares every layer
# with every other layer, not checkpointing on with off: 1.42x says nothing about blocks
# recomputed twice.
@covers("RK560")
def test_rk560_interval_ratio_claims_no_double_recompute():
    # https://github.com/bghira/SimpleTuner/pull/1184
    f = get(run(text("fl-simpletuner-1184-interval")), "RK560")
    assert "1.42x the step of checkpointing fewer layers" in f.evidence
    assert "recomputed more than once" not in f.evidence
    # an on / off slowdown above one extra forward: what to look for, said with an "if"
    # https://github.com/QwenLM/Qwen-Image/issues/69 ("a 3.75x slowdown")
    g = get(run(text("fl-qwenimage-69-slowdown")), "RK560")
    assert "if it compares checkpointing on against off, look for" in g.evidence
    assert "the checkpointed blocks are recomputed more than once" not in g.evidence


def test_rk033_table_arms_named_by_their_recompute():
    # Megatron-LM PR #6311: "no overlap, no recompute" 225.1 vs full recompute 184.2 TFLOP/s.
    d = run(text("i13-megatron-pr6311"))
    rows = d.evidence.experiments
    assert rows[0]["recompute"] == "none" and rows[1]["recompute"] == "full:uniform:1"
    assert rows[1]["vs_golden"] == pytest.approx(184.2 / 225.1 - 1, abs=1e-3)
    f = top(d)
    assert f.rule == "RK033" and f.category == "recompute_overhead"
    cites(f, "-18.2%")


@covers("RK700")
def test_r10b_rk700_memory_budget_below_one_and_slow():
    # https://github.com/pytorch/pytorch/issues/149258: activation_memory_budget = 0.99 and
    # "selective activation checkpointing is not optimal for speed"; the maintainer: the
    # partitioner's choice under a budget < 1 is by design
    d = run(text("r10b-pt149258-memory-budget-speed"))
    f = d.findings[0]
    assert f.rule == "RK700" and f.category == "recompute_overhead"
    assert "0.99" in f.evidence and "not optimal for speed" in f.evidence
    assert f.config_patch == {"activation_memory_budget": 1.0}
    assert "activation_memory_budget from 0.99 to 1" in f.fix


@covers("RK700")
def test_r10b_rk700_needs_the_speed_complaint_and_a_low_budget_goes_halfway():
    code = text("r10b-pt149258-memory-budget-speed")
    no_speed = code.replace("is not optimal for speed", "uses the budget")
    assert "RK700" not in ids(run(no_speed))
    low = code.replace("activation_memory_budget = 0.99", "activation_memory_budget = 0.5")
    f = next(x for x in run(low).findings if x.rule == "RK700")
    assert f.config_patch == {"activation_memory_budget": 0.75}


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
    pp4 = {"pipeline_model_parallel_size": 4, "world_size": 128}
    f = get(diagnose(Evidence(oom=[other, base], config=pp4)), "RK035")
    cites(f, "[0, 97]")  # stages 0 and 3 of 4 (32 ranks each)


@covers("RK035")
def test_rk035_not_for_ranks_of_one_job_without_stages_said():
    # A skill trial: https://github.com/meta-pytorch/torchtune/issues/2071, ranks 3 and 5 of an
    # FSDP job OOM with the same numbers in one run; nothing says there are pipeline stages.
    base = parse_log(text("oom-msswift-9191")).oom[0]
    other = OOMEvent(**{**base.__dict__, "rank": 0})
    assert "RK035" not in ids(diagnose(Evidence(oom=[other, base])))
    # ... and two ranks of one stage (ranks 0 and 97 of a 256-GPU PP2 job: both stage 0)
    same = {"pipeline_model_parallel_size": 2, "world_size": 256}
    assert "RK035" not in ids(diagnose(Evidence(oom=[other, base], config=same)))


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
