"""Tests of the rules in recompute_kit/doctor/rules/measured.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from pathlib import Path

from rule_helpers import (
    cites,
    covers,
    get,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.rules import (
    EXPANDABLE,
)

# =============================================================================================
# Pasted measurements (rules/measured.py, evidence/measured.py): recompute on/off tables
# (RK230, RK231), logits-sized sizes (RK232), OOM inside Module.to (RK233), offload that does
# not take effect (RK234), reserved far above allocated (RK235), optimizer states loaded onto
# the GPU at resume (RK236). Sources: development corpus cases, quoted verbatim from their
# threads (each test names the URL).
# =============================================================================================

CASES_DIR = Path(__file__).parent / "corpus" / "cases"


def corpus_text(case_id: str) -> str:
    """The verbatim artefacts of a development corpus case (never a held-out one)."""
    import yaml
    from corpus_scoring import split_of

    case = yaml.safe_load((CASES_DIR / f"{case_id}.yaml").read_text(encoding="utf-8"))
    assert split_of(case["source"]) == "dev", case_id
    return case["artefacts"]


# =============================================================================================
# recompute_overhead
# =============================================================================================


@covers("RK230")
def test_fresh_overhead_table_with_and_without_recompute():
    # https://github.com/cybertronai/gradient-checkpointing/issues/55: iteration time 557 ms
    # without, 1457.91 / 704.9 ms with recomputation. Right before this round.
    f = top(run(text("fz-gradckpt-55-speed-mode")))
    assert f.rule == "RK230" and f.category == "recompute_overhead"
    assert "selective" in f.fix


# =============================================================================================
# RK231 / measured tables: the recompute switch's own state beside other on/off options
# =============================================================================================


@covers("RK231")
def test_fresh_rk231_recompute_state_beside_overlap_state():
    # https://github.com/NVIDIA/Megatron-LM/pull/6429: rows "overlap off, recompute on" and
    # "overlap on, recompute off": the recompute run is faster at lower memory.
    f = top(run(text("fg-recompute-on-off-table-mlm6429")))
    assert f.rule == "RK231" and f.category == "informational"
    assert "recompute on" in f.config_patch["recompute"]


@covers("RK230")
def test_rk230_table_with_and_without_recompute_measures_its_cost():
    # https://github.com/PaddlePaddle/PaddleFleetX/pull/135: "1 card 247.27 ins/s | 380" vs
    # "1 card+recompute 189.78 ins/s | 780": recompute doubles the batch, costs ~23%.
    f = top(run(corpus_text("e_paddlefleetx_135_resnet_recompute_speed_drop_batch_doubles")))
    assert f.rule == "RK230" and f.category == "recompute_overhead"
    cites(f, "1450.6", "1896.03", "-23.5%", "batch 370 vs 760")
    assert f.config_patch == {"recompute": False, "batch_size": 370}
    assert "without recompute" in f.fix and "selective" in f.fix
    # https://github.com/pytorch/torchtitan/pull/3429: columns `default` and `full`: TPS -11.2%
    f = top(run(corpus_text("e_torchtitan_3429_full_recompute_policy_tps_minus_10pct")))
    assert f.rule == "RK230" and f.config_patch == {"recompute_granularity": "selective"}
    cites(f, "'full'", "'default'", "-11.2%", "52.44 -> 32.07")
    # within 5% it is no cost worth a finding
    cheap = corpus_text("e_torchtitan_3429_full_recompute_policy_tps_minus_10pct")
    for slow, fast in (
        ("5,933", "6,500"),
        ("7,006", "7,800"),
        ("34.74%", "38.5%"),
        ("41.02%", "45.9%"),
    ):
        cheap = cheap.replace(slow, fast)
    assert "RK230" not in ids(run(cheap))


@covers("RK231")
def test_rk231_recompute_of_cheap_ops_costs_nothing_and_buys_batch():
    # https://github.com/microsoft/onnxruntime/pull/4402: Phase 1 max BS 64 -> 80 with GeLU +
    # attention-dropout recompute, throughput 186.792 -> 191.111 ex/sec.
    case = corpus_text("e_ort_4402_localized_recompute_gelu_dropout_batch_throughput")
    f = top(run(case))
    assert f.rule == "RK231" and f.category == "informational"
    cites(f, "191.111", "186.792", "batch 64 vs 80")
    assert f.config_patch == {
        "recompute": "gelu_checkpoint + attention_dropout_checkpoint",
        "batch_size": 80,
    }
    # one recompute run 6% slower makes it a cost (RK230), not a free lunch
    slow = case.replace("| 36.0144 |", "| 34.2 |")
    assert "RK231" not in ids(run(slow)) and top(run(slow)).rule == "RK230"


@covers("RK232")
def test_rk232_size_equals_tokens_times_vocabulary_fp32():
    # https://github.com/NVIDIA-NeMo/RL/pull/2883: pre-fix peak 16219 MiB at seq_len 32768 with
    # V_local=128256, B=1: 32768 x 128256 x 4 bytes, the fp32 logits held whole.
    case = corpus_text("e_nemorl_2883_distillation_topk_fp32_logits_grows_with_seqlen")
    f = top(run(case))
    assert f.rule == "RK232" and f.category == "logits_memory"
    cites(f, "32768", "128256", "4 bytes")
    assert f.config_patch == {"logprob_chunk_size": 1024, "defer_fp32_logits": True}
    # https://github.com/huggingface/trl/issues/3678: `2 × 256 × 151665` next to 310 MB
    f = top(run(corpus_text("b_trl_3678_grpo_qwen3_06b_oom_full_vocab_logits")))
    assert f.rule == "RK232" and "use_liger_kernel" in f.fix
    # sizes that are not tokens x vocabulary x 2 or 4 bytes are not logits
    assert "RK232" not in ids(run(case.replace("V_local=128256", "V_local=50000")))


@covers("RK233")
def test_rk233_oom_inside_module_to_is_the_model_moved_whole():
    # https://github.com/l294265421/alpaca-rlhf/issues/6: OOM in module.py `convert`
    # (t.to(device, ...)) with --actor_zero_stage 3 --critic_zero_stage 3 on 8x V100 32 GB.
    case = corpus_text("e_alpacarlhf_6_v100_step3_zero3_models_loaded_whole_per_gpu")
    f = top(run(case))
    assert f.rule == "RK233" and f.category == "model_state_memory"
    cites(f, "30.95 GiB of 31.75 GiB")
    assert f.config_patch["map_location"] == "cpu" and "zero.Init" in f.fix
    # the same OOM raised elsewhere (no convert frame) is not this rule's
    cut = "\n".join(
        line for line in case.splitlines() if "convert" not in line and "t.to(" not in line
    )
    assert "RK233" not in ids(run(cut))


@covers("RK234")
def test_rk234_offload_on_but_memory_allocated_stays():
    # https://github.com/verl-project/verl/issues/2822: param_offload=True and
    # optimizer_offload=True, yet "memory allocated (GB): 32.006..." before the rollout.
    case = corpus_text("e_verl_2822_fsdp2_param_optimizer_offload_no_effect")
    f = top(run(case))
    assert f.rule == "RK234" and f.category == "framework_bug"
    cites(f, "32.01 GB")
    assert f.config_patch == {"actor_rollout_ref.actor.fsdp_config.offload_policy": True}
    # https://github.com/modelscope/ms-swift/pull/7821: ZeRO-3, "after model offload, memory
    # allocated (GB): 52.63"
    f = top(run(corpus_text("e_swift_7821_zero3_optimizer_offload_param_groups_empty")))
    assert f.rule == "RK234" and "optimizer.state" in f.fix
    # a report that dropped to ~1 GB is an offload that worked
    assert "RK234" not in ids(run(case.replace("32.006070613861084", "1.2")))


@covers("RK235")
def test_rk235_reserved_far_above_allocated_after_a_load():
    # https://github.com/PrimeIntellect-ai/prime-rl/pull/2154: reserved after load 14,362 MB vs
    # allocated 2,884 MB before the fix.
    case = corpus_text("e_primerl_2154_resume_cpu_offload_optimizer_reserved_not_returned")
    f = top(run(case))
    assert f.rule == "RK235" and f.category == "fragmentation"
    cites(f, "13.38 GiB reserved", "2.69 GiB allocated")
    assert "empty_cache" in f.fix and f.config_patch["env"] == EXPANDABLE["env"]
    # reserved close to allocated is no held cache
    assert "RK235" not in ids(run(case.replace("| 14,362 MB |", "| 3,100 MB |")))


@covers("RK236")
def test_rk236_optimizer_states_loaded_onto_the_gpu_at_resume():
    # https://github.com/NVIDIA/Megatron-LM/issues/380: load_checkpoint ->
    # optimizer.load_state_dict -> deepcopy(state_dict), "would cause gpu oom sometimes".
    case = corpus_text("e_megatron_380_distopt_load_state_dict_deepcopy_oom")
    f = top(run(case))
    assert f.rule == "RK236" and f.category == "framework_bug"
    cites(f, "megatron", "deep-copies")
    assert f.config_patch == {"map_location": "cpu"} and "upgrade megatron" in f.fix
    # without the optimizer's load_state_dict frames it is not this rule's
    cut = "\n".join(line for line in case.splitlines() if "load_state_dict" not in line)
    assert "RK236" not in ids(run(cut))


# =============================================================================================
# RK237: repeats or per-iteration step times that do not decide (evidence/experiments.py
# aggregates them with recompute_kit/runstats.py; RK033 stays quiet within the noise)
# =============================================================================================


@covers("RK237")
def test_doctor_does_not_call_a_slow_node_a_regression(tmp_path):
    """Two of three 'full' repeats ran on a slow node: the old reader took each row alone and
    RK033 called -15% a regression (with a patch); now the repeats are one setting, the node is
    shown as a confounder and RK237 names the re-run instead."""
    from recompute_kit.doctor.evidence import collect

    table = tmp_path / "runs.md"
    table.write_text(
        "| recompute | run | host | TFLOP/s/GPU | vs golden |\n|---|---|---|---|---|\n"
        "| none | 1 | node-a | 400 | 0% |\n| none | 2 | node-a | 402 | +0.5% |\n"
        "| none | 3 | node-a | 399 | -0.3% |\n| full | 1 | node-a | 396 | -1% |\n"
        "| full | 2 | node-b | 340 | -15% |\n| full | 3 | node-b | 342 | -14.5% |\n"
    )
    found = diagnose(collect(experiments=str(table))).findings
    rules = [f.rule for f in found]
    assert "RK033" not in rules
    top = found[0]
    assert top.rule == "RK237" and top.config_patch in (None, {})
    assert "host differs" in top.evidence and "interleaved" in top.fix


@covers("RK237", "RK033")
def test_doctor_keeps_a_regression_that_clears_the_noise(tmp_path):
    from recompute_kit.doctor.evidence import collect

    rows = ["iteration,recompute,run,step_time_ms"]
    for setting, base in (("none", 1000.0), ("full:uniform:1", 1350.0)):
        for repeat in (1, 2, 3):
            rows += [
                f"{it},{setting},{repeat},{base + it * 7 % 11 + repeat}" for it in range(1, 21)
            ]
    table = tmp_path / "iters.csv"
    table.write_text("\n".join(rows) + "\n")
    ev = collect(experiments=str(table))
    full = next(r for r in ev.experiments if r["recompute"] == "full:uniform:1")
    assert full["within_noise"] is False and full["vs_golden"] < -0.2
    assert full["measured"]["runs"] == 3
    rules = [f.rule for f in diagnose(ev).findings]
    assert "RK033" in rules and "RK237" not in rules


@covers("RK237")
def test_doctor_reads_a_checkpointing_flag_and_names_a_noisy_repeat(tmp_path):
    """A user's own log (`run,gradient_checkpointing,step,time_ms`): the flag is the setting
    (on: full, off: none), `time_ms` the step time; a repeat with spikes is shown as a noisy
    run beside the within-noise verdict (the doctor read 4 unrelated rows before)."""
    from recompute_kit.doctor.evidence import collect

    rows = ["run,gradient_checkpointing,step,time_ms"]
    for label, flag, base in (
        ("on_a", "true", 1005),
        ("on_b", "true", 1008),
        ("off_a", "false", 1000),
    ):
        rows += [f"{label},{flag},{it},{base + it % 3}" for it in range(1, 25)]
    spikes = {5: 1900, 9: 1700, 13: 1950, 17: 1600, 21: 1800}
    rows += [f"off_b,false,{it},{spikes.get(it, 1020 + it % 5 * 9)}" for it in range(1, 25)]
    table = tmp_path / "steps.csv"
    table.write_text("\n".join(rows) + "\n")
    ev = collect(experiments=str(table))
    assert {r["recompute"] for r in ev.experiments} == {"full", "none"}
    top = get(diagnose(ev), "RK237")
    assert "noisy run" in top.evidence and "off_b" in top.evidence


# RK230: a time column moves the other way from throughput: 557 -> 1458 ms is not "time -61.8%".
@covers("RK230")
def test_rk230_time_column_reads_as_time_up():
    # https://github.com/cybertronai/gradient-checkpointing/issues/55: iteration time (ms)
    f = get(run(text("fz-gradckpt-55-speed-mode")), "RK230")
    assert "time -61.8%" not in f.evidence
    assert "time +161.7%" in f.evidence and "throughput -61.8%" in f.evidence


@covers("RK661")
def test_r8p_rk661_selective_recompute_exhausted_memory():
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5506: "A separate matched
    # selective-recompute run exhausted memory at iteration 7" -> full-layer uniform recompute
    f = top(run(text("r8p-mbridge5506-selective-oom")))
    assert f.rule == "RK661" and f.category == "activation_memory"
    assert f.config_patch == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    }
    assert "exhausted memory at iteration 7" in f.evidence


# RK238: the two real Megatron-LM runs of https://github.com/NVIDIA/Megatron-LM/issues/756
# (tests/data/measured/mlm756) as the trial tabulated them, with the dates their logs stamp: a
# 45% gap that lines up with a week between the runs is "confounded", never "within noise"
@covers("RK238")
def test_a_confounded_gap_is_called_confounded_not_within_noise(tmp_path):
    from recompute_kit.doctor.evidence import collect as collect_ev

    table = tmp_path / "dated.md"
    table.write_text(
        "| recompute | elapsed time per iteration (ms) | tflops | run | date |\n"
        "|---|---|---|---|---|\n| none | 5444.9 | 236.0 | control.log | 2024-04-06 |\n"
        "| full:uniform:1 | 10036.9 | 130.1 | full.log | 2024-03-30 |\n"
    )
    found = {f.rule: f for f in diagnose(collect_ev(experiments=str(table))).findings}
    assert "RK238" in found and "RK237" not in found and "RK033" not in found
    assert "within noise" not in found["RK238"].title and "confounded" in found["RK238"].title
