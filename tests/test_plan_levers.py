"""`plan --levers` (issue #20, deliver 5): the step-time model's pieces, each pinned by numbers
derived by hand here, and the lever table end to end on a real config from the corpus."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from recompute_kit.cli import main
from recompute_kit.config import Config, ConfigError, ModelConfig, ParallelConfig
from recompute_kit.plan.levers import levers
from recompute_kit.plan.step_log import iteration_seconds, measured_step_seconds
from recompute_kit.plan.step_time import (
    Hardware,
    bubble_fraction,
    calibrate_tflops,
    cp_exchange_bytes,
    host_link_gbps,
    micro_batches_per_step,
    offload_exposed_seconds,
    step_time,
)
from recompute_kit.presets import get_preset

CORPUS = Path(__file__).parent / "sources" / "corpus" / "megatron_lm"
MFLOPS = 1e-6  # TFLOP/s: 1e6 FLOP/s, so seconds read as MFLOPs

# The tiny model below, by hand (unfused attention: executed = model FLOPs; tokens T = b*s = 64):
#   qkv   2*T*h*3h          = 2*64*64*192         = 1,572,864
#   attn  2*(2*b*a*s*s*d)   = 2*(2*2*4*32*32*16)  =   524,288
#   proj  2*T*h*h           = 2*64*64*64          =   524,288
#   mlp   2*T*h*f + 2*T*f*h = 2 * 2*64*64*256     = 4,194,304
#   one layer                                     = 6,815,744
#   logits 2*T*h*v          = 2*64*64*128         = 1,048,576
LAYER = 6_815_744
LOGITS = 1_048_576
ATTN = 524_288


def tiny(**parallel) -> Config:
    model = ModelConfig(
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=256,
        seq_length=32,
        micro_batch_size=2,
        vocab_size=128,
        attention_backend="unfused",
    )
    return Config(model, ParallelConfig(**parallel))


def test_bubble_is_pp_minus_one_over_vpp_times_m():
    # Narayanan et al. 2021, Sec. 2.2: (p - 1) / m, and / v interleaved
    assert bubble_fraction(4, 1, 16) == 3 / 16
    assert bubble_fraction(4, 2, 16) == 3 / 32
    assert bubble_fraction(1, 1, 16) == 0


def test_step_is_m_plus_bubble_slots_times_the_slowest_stage():
    cfg = tiny(pipeline_model_parallel_size=2, data_parallel_size=2)
    hw = Hardware(tflops_per_gpu=MFLOPS)
    # stage 1 holds layers 2-3 and the logits: 3 x (2 x LAYER + LOGITS) FLOPs per micro-batch
    slow = 3 * (2 * LAYER + LOGITS) / 1e6
    m = micro_batches_per_step(cfg, 32)  # 32 / (2 x 2)
    assert m == 8
    t = step_time(cfg, m, hw)
    assert t.slowest_stage == 1
    assert t.seconds == pytest.approx((8 + 1) * slow, rel=1e-12)
    assert t.bubble_s == pytest.approx(slow, rel=1e-12)
    vpp = step_time(cfg.replace(virtual_pipeline_model_parallel_size=2), m, hw)
    assert vpp.seconds == pytest.approx((8 + 0.5) * slow, rel=1e-12)


def test_offload_time_is_bytes_over_the_link_less_the_overlapped_pass():
    assert host_link_gbps("pcie5") == 64.0
    assert host_link_gbps("pcie4") == 32.0
    assert host_link_gbps("nvlink-c2c") == 450.0
    assert host_link_gbps("100") == 100.0
    with pytest.raises(ConfigError):
        host_link_gbps("usb")
    # 64 GB each way over PCIe 5: 1 s; forward 0.5 s hides half of it, backward 2 s all of it
    one_way, exposed = offload_exposed_seconds(64e9, 64.0, 0.5, 2.0)
    assert one_way == pytest.approx(1.0)
    assert exposed == pytest.approx(0.5)
    # the same bytes over NVLink-C2C: 64/450 s, hidden
    one_way, exposed = offload_exposed_seconds(64e9, 450.0, 0.5, 2.0)
    assert one_way == pytest.approx(64 / 450)
    assert exposed == 0.0


def test_cp_ring_volume():
    # Llama-3-8B shape at 128k, CP4 x TP2, bf16: (cp-1) x b x s/cp x (K+V: 2 x 8/2 groups x 128)
    m = ModelConfig(
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        seq_length=131072,
        micro_batch_size=1,
        bf16=True,
    )
    p = ParallelConfig(context_parallel_size=4, tensor_model_parallel_size=2)
    assert cp_exchange_bytes(Config(m, p)) == 3 * 32768 * 1024 * 2
    assert cp_exchange_bytes(Config(m, ParallelConfig())) == 0
    # MLA: all heads' K (128 + 64) and V (128), over TP 8
    mla = ModelConfig(
        num_layers=4,
        hidden_size=7168,
        num_attention_heads=128,
        multi_latent_attention=True,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        seq_length=4096,
        micro_batch_size=1,
        bf16=True,
    )
    p = ParallelConfig(context_parallel_size=2, tensor_model_parallel_size=8)
    assert cp_exchange_bytes(Config(mla, p)) == 1 * 2048 * (128 * 320 // 8) * 2


def test_cp_ring_exposes_what_attention_does_not_hide():
    cfg = tiny(context_parallel_size=2)
    # per layer forward: 1 x b x s/2 x (2 x 4 heads x 16) x 4 B = 16,384 B; at 1e-6 GB/s
    # (1000 B/s): 16.384 s forward, 32.768 s backward; attention on one of 2 ranks:
    # 524,288 / 2 FLOPs = 0.262144 s forward, 2 x that backward (unfused)
    assert cp_exchange_bytes(cfg) == 16_384
    hw = Hardware(tflops_per_gpu=MFLOPS, cp_link_gbps=1e-6)
    fwd, bwd = 16.384 - ATTN / 2 / 1e6, 32.768 - 2 * ATTN / 2 / 1e6
    t = step_time(cfg, 1, hw)
    assert t.cp_exposed_s == pytest.approx(4 * (fwd + bwd), rel=1e-12)
    # recomputing attention runs the forward ring again on every layer
    again = step_time(cfg.with_recompute("selective:core_attn"), 1, hw)
    assert again.cp_exposed_s == pytest.approx(4 * (2 * fwd + bwd), rel=1e-12)
    # a fast link hides it all
    assert step_time(cfg, 1, Hardware(tflops_per_gpu=MFLOPS)).cp_exposed_s == 0


def test_calibration_recovers_the_rate_from_a_measured_step():
    cfg = tiny(data_parallel_size=2)
    flops = 3 * (4 * LAYER + LOGITS)  # one micro-batch, no pipeline, no transfers
    m = micro_batches_per_step(cfg, 16)  # 16 / (2 x 2)
    assert m == 4
    tflops = calibrate_tflops(cfg, m, Hardware(), 2.0)
    assert tflops == pytest.approx(4 * flops / 2.0 / 1e12, rel=1e-9)
    piped = tiny(pipeline_model_parallel_size=2)
    slow = 3 * (2 * LAYER + LOGITS)
    tflops = calibrate_tflops(piped, 8, Hardware(), 3.0)
    assert tflops == pytest.approx((8 + 1) * slow / 3.0 / 1e12, rel=1e-9)


def test_iteration_lines_give_the_measured_step():
    log = "\n".join(
        f" [2025-01-01] iteration {i:>8}/    1000 | consumed samples: {i * 8} | elapsed time "
        f"per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): 400.1 |"
        for i, ms in ((1, 9000.0), (2, 2100.0), (3, 2000.0), (4, 2050.0), (5, 1990.0))
    )
    assert iteration_seconds(log)[0] == (1, 9.0)
    # the first two are warm-up; median of 2.0, 2.05, 1.99
    assert measured_step_seconds(log) == (2.0, 3)
    with pytest.raises(ConfigError):
        measured_step_seconds("no iterations here")


def test_uneven_vpp_and_distributed_optimizer_rows():
    cfg = tiny(pipeline_model_parallel_size=2, data_parallel_size=2)
    table = levers(cfg, 1.0, global_batch_size=32)
    kinds = {r.lever for r in table.rows}
    assert {"current", "cp x pp", "vpp", "uneven stages", "micro-batch"} <= kinds
    assert "distributed optimizer" in kinds
    dist = next(r for r in table.rows if r.lever == "distributed optimizer")
    assert dist.step.seconds == table.current.step.seconds  # same bytes: no time
    assert dist.estimate.optimizer_bytes < table.current.estimate.optimizer_bytes
    uneven = [r for r in table.rows if r.lever == "uneven stages"]
    assert all(
        r.config.parallel.num_layers_in_first_pipeline_stage
        + r.config.parallel.num_layers_in_last_pipeline_stage
        == 4
        for r in uneven
    )


def test_a_global_batch_the_layout_cannot_split_says_why():
    # NeMo Launcher's mixtral_8x22b.yaml ships global_batch_size: 1 for 48 nodes
    cfg = tiny(pipeline_model_parallel_size=2, data_parallel_size=2)
    with pytest.raises(ConfigError, match="global batch 3 is not divisible by micro batch"):
        levers(cfg, 1.0, global_batch_size=3)


def test_cli_levers_on_llama3_8b_at_128k(capsys):
    script = CORPUS / "blind_llama3_8b_h100_fp8.sh"
    args = ["plan", "--config", str(script), "--seq-length", "131072", "--gpu-memory-gb", "139"]
    assert main([*args, "--levers", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    table = doc["levers"]
    assert table["global_batch_size"] == 128  # read from the script
    rows = table["rows"]
    kinds = {r["lever"] for r in rows}
    assert {"current", "recompute", "cp x pp", "offload"} <= kinds
    # the run as given does not fit: a larger micro-batch cannot help, and is said left out
    assert "micro-batch" not in kinds
    assert any(n.startswith("left out: micro_batch_size 2/4/8") for n in table["notes"])
    current = table["current"]
    assert current["step_vs_current"] == 1.0 and not current["fits"]
    # 8 GPUs at 128k: only context parallelism fits the 8B (the script's --grad-reduce-in-bf16,
    # line 96, keeps 2 B gradients). Each CP row takes the recompute that clears its error band
    # (a row that fits only within it is re-planned): CP8 with full:block:3 ranks first, ahead
    # of CP4 x DP2 with selective mlp (64 micro-batches per DP rank)
    best = rows[0]
    assert best["fits"] and best["clears_error_band"] and best["lever"] == "cp x pp"
    assert best["context_parallel_size"] == 8 and best["data_parallel_size"] == 1
    cp4 = next(r for r in rows if r["setting"].startswith("cp=4 pp=1 dp=2"))
    assert cp4["fits"] and cp4["step_time"]["micro_batches"] == 64
    ranked = [r["step_seconds"] for r in rows if r["fits"] and r["clears_error_band"]]
    assert ranked == sorted(ranked)
    # the table in text, with the calibration from a measured step on the config as given
    assert main([*args, "--levers", "--measured-step-seconds", "900"]) == 0
    out = capsys.readouterr().out
    assert "cp=8 pp=1 dp=1" in out and "calibrated: 900 s measured" in out


def test_price_recompute_times_a_chosen_setting_as_the_current_row(capsys):
    # a skill trial could time only the plan's pick: --price-recompute puts the setting the
    # user asks about in the `current` row, priced by the same step-time model
    script = CORPUS / "blind_llama3_8b_h100_fp8.sh"
    args = ["plan", "--config", str(script), "--gpu-memory-gb", "139", "--levers", "--json"]
    got, said = {}, {}
    for spec in (None, "full:uniform:1"):
        assert main([*args, *(["--price-recompute", spec] if spec else [])]) in (0, 1)
        doc = json.loads(capsys.readouterr().out)
        got[spec], said[spec] = doc["levers"]["current"], doc["current_is"]
    # (a later trial read current_fits as the run's own: the document says which it is)
    assert said[None] == "the run as given" and "--price-recompute" in said["full:uniform:1"]
    assert got[None]["recompute"] == "none"  # the script recomputes nothing
    assert got["full:uniform:1"]["recompute"] == "full:uniform:1"
    # full recompute runs every layer's forward again: the step is longer, the memory lower
    assert got["full:uniform:1"]["step_seconds"] > got[None]["step_seconds"]
    assert got["full:uniform:1"]["peak_bytes"] < got[None]["peak_bytes"]
    # the run's own setting priced again is the run as given, said so (a skill trial read
    # "not its own setting" for a NeMo-RL run whose setting it was)
    assert main([*args, "--price-recompute", "none"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["current_is"] == "the run as given (recompute none, its own setting)"
    assert "not its own setting" in said["full:uniform:1"]


def test_layout_hint_says_what_nemo_rl_needs_for_context_parallelism(capsys):
    # NeMo-RL's Megatron policy asserts sequence packing with CP (nemo_rl/models/megatron/
    # setup.py: "Sequence Packing must be enabled to use Context Parallelism with MCore."):
    # plain `plan` offering a CP layout for a run that does not pack says it needs packing
    recipe = CORPUS.parent / "nemo_rl" / "grpo_math_qwen30ba3b_megatron.yaml"
    args = ["plan", "--config", str(recipe), "policy.max_total_sequence_length=32768"]
    assert main([*args, "--gpu", "h100-80gb", "--json"]) in (0, 1)
    hint = json.loads(capsys.readouterr().out).get("better_layout") or {}
    assert "cp=" in hint.get("setting", ""), hint
    assert hint["needs"].startswith("policy.sequence_packing.enabled: true")
    assert main(
        [*args, "policy.sequence_packing.enabled=true", "--gpu", "h100-80gb", "--json"]
    ) in (0, 1)
    hint = json.loads(capsys.readouterr().out).get("better_layout") or {}
    assert "cp=" in hint.get("setting", "") and hint["needs"] == ""


def test_a_cp_ring_across_nodes_runs_at_the_networks_speed():
    # a skill trial: CP16 at TP1 (two nodes of 8 GPUs) was costed at NVLink's 450 GB/s; a ring
    # that spans nodes passes its slowest hops over the network (50 GB/s per GPU assumed)
    from recompute_kit.plan.step_time import Hardware, stage_time

    cfg = (
        get_preset("llama3-8b")
        .config()
        .replace(seq_length=131072, context_parallel_size=16, data_parallel_size=1)
    )
    inside = stage_time(cfg, 0, Hardware(internode_gbps=450.0))
    across = stage_time(cfg, 0, Hardware())
    assert across.cp_transfer_s == pytest.approx(inside.cp_transfer_s * 9)  # 450 / 50
    eight = cfg.replace(context_parallel_size=8)  # one node: NVLink either way
    assert (
        stage_time(eight, 0, Hardware()).cp_transfer_s
        == stage_time(eight, 0, Hardware(internode_gbps=450.0)).cp_transfer_s
    )


def test_lever_rows_carry_their_hand_over_in_the_frameworks_keys(capsys):
    # a skill trial (torchtitan llama3_70b.toml at 32k on 64 GPUs): every row had to be re-run
    # through plan --format torchtitan to get its TOML; the global batch was assumed 512 where
    # torchtitan's -1 means local_batch_size x DP = 64; a PP row kept the local batch as its
    # micro-batch (torchtitan splits it into pipeline_parallel_microbatch_size, default 1)
    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "llama3_70b.toml"
    argv = ["plan", "--config", str(toml), "--dp", "8", "--gpu", "h100-80gb"]
    assert main([*argv, "--seq-length", "32768", "--levers", "--json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    table = doc["levers"]
    assert table["global_batch_size"] == 64 and doc["current_fits"] is False
    cp = next(r for r in table["rows"] if r["setting"].startswith("cp=2 pp=1"))
    assert "context_parallel_degree = 2" in cp["rendered"] and "seq_len = 32768" in cp["rendered"]
    piped = next(r for r in table["rows"] if " pp=2 " in f" {r['setting']} ")
    assert piped["micro_batch_size"] == 1
    assert "pipeline_parallel_microbatch_size = 1" in piped["rendered"]
    # a smaller local batch keeps the step's global batch (torchtitan's -1 would shrink it)
    smaller = next(r for r in table["rows"] if r["lever"] == "micro-batch")
    assert "global_batch_size = 64" in smaller["rendered"]


def test_a_nemo_rl_dtensor_run_is_planned_in_its_own_keys(capsys):
    # a skill trial (NeMo-RL grpo_math_8B.yaml, DTensor policy): the plan picked selective:mlp
    # and wrote it in policy.megatron_cfg keys, which a DTensor run ignores; its levers offered
    # pipeline splits and activation offloading it does not have
    corpus = Path(__file__).parent / "sources" / "corpus" / "nemo_rl"
    cfg = str(corpus / "sft.yaml")  # NeMo-RL's examples/configs/sft.yaml: DTensor, Llama 3.2 1B
    argv = ["plan", "--config", cfg, "--seq-length", "16384", "--gpu-memory-gb", "40"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"]["recompute"] in ("none", "full:uniform:1")
    assert "policy.dtensor_cfg.activation_checkpointing" in doc["rendered"]
    assert "megatron_cfg" not in doc["rendered"]
    assert main([*argv, "--levers", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    assert all(r["pipeline_model_parallel_size"] == 1 for r in rows)
    assert not any(r["lever"] == "offload" for r in rows)
    assert all("megatron_cfg" not in (r["rendered"] or "") for r in rows)


def test_tensor_parallel_collectives_and_the_tp_lever():
    # TP's collectives: per layer 2 for attention and 2 for a dense MLP in forward, as many in
    # backward, again for a fully recomputed layer; (t-1)/t x b x s/cp x h bytes each over
    # NVLink (450 GB/s) inside a node; none with tp_comm_overlap
    from recompute_kit.plan.step_time import Hardware, tp_transfer_seconds

    cfg = (
        get_preset("llama3-8b")
        .config()
        .replace(tensor_model_parallel_size=4, sequence_parallel=True, data_parallel_size=2)
    )
    m = cfg.model
    per = 3 / 4 * m.micro_batch_size * m.seq_length * m.hidden_size * 2 / 450e9
    assert tp_transfer_seconds(cfg, 0, Hardware()) == pytest.approx(m.num_layers * 8 * per)
    full = cfg.with_recompute("full:uniform:1")
    assert tp_transfer_seconds(full, 0, Hardware()) == pytest.approx(m.num_layers * 12 * per)
    from recompute_kit.plan.step_time import stage_time

    assert stage_time(cfg, 0, Hardware(tp_comm_overlap=True)).tp_exposed_s == 0
    assert stage_time(cfg, 0, Hardware()).tp_exposed_s > 0
    # the lever: every other TP size the world holds, sequence parallelism with it
    table = levers(cfg, 79.1, global_batch_size=64)
    tps = {r.setting.split(",")[0] for r in table.rows if r.lever == "tp"}
    assert tps == {"tp=1 dp=8", "tp=2 dp=4 sp", "tp=8 dp=1 sp"}


def test_torchtitan_with_flex_attention_gets_no_context_parallel_lever(capsys):
    # a skill trial: torchtitan's deepseek_v3_16b.toml (attn_type flex) got `cp=2` as its best
    # lever; torchtitan refuses context parallelism with FlexAttention ("Context Parallel only
    # supports SDPA attention"), so the run would fail at start-up
    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "deepseek_v3_16b.toml"
    argv = ["plan", "--config", str(toml), "--dp", "32", "--gpu", "h100-80gb", "--levers"]
    assert main([*argv, "--json"]) in (0, 1)
    table = json.loads(capsys.readouterr().out)["levers"]
    assert all(r["context_parallel_size"] == 1 for r in table["rows"])
    assert any("FlexAttention" in n for n in table["notes"])


def test_a_layout_that_frees_memory_takes_the_cheaper_recompute_it_allows():
    # A skill trial: torchtitan's llama3_405b.toml (v0.1.0, full AC, TP8 FSDP16 on 128 H100s).
    # Every CP row kept full AC at "x1.000"; only a run started from cheaper AC found that CP 8
    # fits it. Where the run's recompute costs, a layout row takes the plan's pick for itself.
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources/corpus/torchtitan/llama3_405b_v0.1.0.toml"
    cfg = resolve([str(toml)], overrides={"data_parallel_size": 16}).config
    table = levers(cfg, 79.1)
    cp8 = next(r for r in table.rows if r.setting.startswith("cp=8 pp=1 dp=2"))
    assert cp8.fits and cp8.estimate.recompute != "full:uniform:1"
    assert cp8.step.compute_s < table.current.step.compute_s  # the cheaper recompute's
    # (its step is not shorter: at the same micro-batch, DP 2 runs 8x the micro-batches and
    # FSDP gathers 405B/8 parameters in each, over the network)
    assert cp8.step.fsdp_exposed_s > 0 == table.current.step.fsdp_exposed_s


def test_torchtitan_fsdp2_cpu_offload_is_a_lever_and_the_doctors_patch():
    # A skill trial on https://github.com/pytorch/torchtitan/issues/620 (Llama3-8B, FSDP2 over 2
    # GPUs, OOM at the first optimizer step; the fix: FSDP2 CPU offload, PR #624's
    # --training.enable_cpu_offload). `plan --levers` priced only layout and recompute ("no
    # lever fits") and the doctor's patch was TP 2 on the same 2 GPUs, which shards nothing more.
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources/corpus/torchtitan/llama3_8b_2024-10.toml"
    cfg = resolve([str(toml)], overrides={"data_parallel_size": 2}).config
    table = levers(cfg, 47.5)
    offload = next(r for r in table.rows if r.lever == "CPU offload")
    assert offload.fits and not table.current.fits
    assert offload.setting == "[training] enable_cpu_offload = true"
    d = diagnose(collect(config=str(toml), overrides={"data_parallel_size": 2}), gpu_memory_gb=47.5)
    f = next(f for f in d.findings if f.rule in ("RK011", "RK013"))
    assert f.patch_keys == {"training.enable_cpu_offload": True}


def test_a_named_gpu_sets_the_step_time_models_rate(capsys):
    # A skill trial: `plan --levers --gpu a100-80gb` priced the step at 400 TFLOP/s per GPU
    # (the H100 assumption, above an A100's 312 dense BF16 peak). The named GPU scales the
    # rate by its datasheet peak (and its NVLink speed for the CP ring).
    argv = ["plan", "--model", "llama3-8b", "--dp", "8", "--levers", "--json"]
    assert main([*argv, "--gpu", "a100-80gb"]) == 0
    hw = json.loads(capsys.readouterr().out)["levers"]["hardware"]
    assert round(hw["tflops_per_gpu"], 1) == round(400 * 312 / 989, 1)
    assert hw["cp_link_gbps"] == 300.0 and hw["host_link_gbps"] == 32.0  # PCIe 4 x16
    assert main([*argv, "--gpu", "a100-80gb", "--tflops-per-gpu", "150"]) == 0
    assert json.loads(capsys.readouterr().out)["levers"]["hardware"]["tflops_per_gpu"] == 150


def test_equal_step_micro_batches_rank_the_largest_first_and_zero3_says_its_gathers(capsys):
    # LLaVA-1.5 13B (tests/data/launch/llava, verbatim) with ZeRO-3 on 8 A100 40GB: batches 1,
    # 2 and 4 fit at the same modelled step; batch 1 came first, while ZeRO-3 gathers the
    # parameters and reduce-scatters the gradients in every micro-batch (16 of them at 1).
    from rule_helpers import llava_inputs

    files = llava_inputs()
    argv = ["plan", "--config", *files, "--dp", "8", "--gpu", "a100-40gb", "--levers", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    batches = [r for r in rows if r["lever"] == "micro-batch" and r["fits"]]
    sizes = [r["setting"] for r in batches]
    assert sizes[0].startswith("per_device_train_batch_size=4"), sizes
    assert "ZeRO-3 gathers and reduce-scatters" in batches[-1]["adds"]  # (DeepSpeed)
    assert "in each of 16 micro-batches" in batches[-1]["adds"]
    # the fused-loss row says which transformers has the key (LLaVA pins 4.37, which has not)
    fused = next(r for r in rows if r["lever"] == "fused loss")
    assert "use_liger_kernel needs transformers >= 4.45" in fused["adds"]


def test_fsdp_rows_time_their_gathers_in_every_micro_batch(capsys):
    # torchtitan's Llama 3.1 70B TOML (tests/data/launch/titan70) on 64 GPUs: a skill trial saw
    # micro-batch 1 priced at the same step as 8 with nothing said of FSDP's per-micro-batch
    # collectives; another (Llama 4 on 32 GPUs) saw 16 micro-batches of FSDP over the network
    # ranked first at "0.74x" where each micro-batch waits on ~1.6 s of gathers
    from pathlib import Path

    from recompute_kit.plan.step_time import Hardware, fsdp_transfer_seconds
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "data" / "launch" / "titan70" / "llama3_70b.toml"
    argv = ["plan", "--config", str(toml), "--dp", "8", "--gpu", "h100-80gb", "--levers", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    one = next(r for r in rows if r["setting"].startswith("micro_batch_size=1"))
    assert "FSDP gathers and reduce-scatters" in one["adds"]
    assert "in each of 8 micro-batches" in one["adds"]
    # the bytes: the rank's parameters gathered in bf16 twice and reduced in fp32, 7/8 of them
    # over the network (TP 8 x FSDP 8 spans nodes)
    cfg = resolve([str(toml)], overrides={"data_parallel_size": 8}).config
    hw = Hardware()
    params = 70.55e9 / 8  # Llama 3.1 70B over TP 8 (the embedding and head split too)
    expected = (2 * 2 + 4) * params * 7 / 8 / (hw.internode_gbps * 1e9)
    assert abs(fsdp_transfer_seconds(cfg, 0, hw) / expected - 1) < 0.01
    # many micro-batches of little compute each leave the gathers exposed
    many = next(r for r in rows if "micro_batch_size=1" in r["setting"] and "cp=8" in r["setting"])
    exposed = re.search(r"micro-batches, exposed ([0-9.]+) s", many["adds"])
    assert exposed and float(exposed.group(1)) > 10  # 64 x (1.23 s - its compute)
    pp2 = cfg.replace(pipeline_model_parallel_size=2, data_parallel_size=4)
    assert fsdp_transfer_seconds(pp2, 0, hw) == 0  # once a step under torch's pipelining


def test_a_nemo_rl_megatron_run_levers_doctor_and_plan_pick_what_nemo_rl_can_set(capsys, tmp_path):
    # a skill trial: NeMo-RL's grpo_math_8B_megatron.yaml (+ its defaults: parents) with
    # policy.max_total_sequence_length=8192 policy.train_micro_batch_size=2 on A100 80GB. NeMo-RL
    # sets full recompute as uniform, 1 layer (nemo_rl/models/megatron/setup.py
    # _apply_performance_config) and has no VPP key, yet `plan --levers` and the doctor priced
    # 'full:block:7' and vpp rows while `plan` picked selective:mlp, and better_layout was
    # measured against the block pick
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    corpus = Path(__file__).parent / "sources" / "corpus" / "nemo_rl"
    files = [
        str(corpus / "grpo_math_8B_megatron.yaml"),
        "policy.max_total_sequence_length=8192",
        "policy.train_micro_batch_size=2",
    ]
    argv = ["plan", "--config", *files, "--gpu", "a100-80gb"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    pick = doc["best"]["recompute"]
    assert not pick.startswith("full:block")
    assert main([*argv, "--levers", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["levers"]
    rows = table["rows"]
    assert not any(r["lever"] == "vpp" for r in rows)
    assert any("vpp (nemo-rl has no key for it)" in n for n in table["notes"])
    assert all("full:block" not in r["setting"] for r in rows)
    (recompute_row,) = [r for r in rows if r["lever"] == "recompute"]
    assert pick in recompute_row["setting"]
    log = tmp_path / "train.log"  # all the user pasted
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    evidence = collect(logs=[str(log)], config=files)
    d = diagnose(evidence, 79.1)
    f = next(f for f in d.findings if f.rule == "RK010")
    assert "full:block" not in f.evidence and pick in f.evidence
    # the colocated vLLM: only the config says it is there, and NeMo-RL puts it to sleep while
    # the policy trains: below the activation finding, with the trade of a smaller share said
    engine = next(f for f in d.findings if f.rule == "RK100")
    assert engine.raw_confidence < f.raw_confidence
    assert "sleep" in engine.evidence and "slower rollouts" in engine.evidence


def test_a_script_that_overlaps_its_tp_communication_is_priced_so(capsys, tmp_path):
    # A skill trial (NeMo 2.0's 405B recipe turns tp_comm_overlap on): the levers priced TP
    # collectives as exposed whatever the run said. Megatron-LM's --tp-comm-overlap is read and
    # used where the command line does not say --tp-comm-overlap itself.
    script = Path(__file__).parent / "sources/corpus/megatron_lm/blind_gpt3_175b_distributed.sh"
    overlapped = tmp_path / "train.sh"
    overlapped.write_text(
        script.read_text().replace(
            "--tensor-model-parallel-size 8 ", "--tensor-model-parallel-size 8 --tp-comm-overlap "
        )
    )
    argv = ["plan", "--dp", "16", "--gpu", "h100-80gb", "--levers", "--json", "--config"]
    assert main([*argv, str(script)]) == 0
    exposed = json.loads(capsys.readouterr().out)["levers"]["current"]
    assert "TP collectives exposed" in exposed["adds"]
    assert main([*argv, str(overlapped)]) == 0
    hidden = json.loads(capsys.readouterr().out)["levers"]["current"]
    assert "TP collectives" not in hidden["adds"]
    assert hidden["step_seconds"] < exposed["step_seconds"]


def test_megatron_runs_get_a_fused_loss_lever_and_offload_rows_say_their_host_memory(capsys):
    # A skill trial (this script at 32k on 80 GB): the loss (23.5 GiB of fp32 and bf16 logits)
    # set the pick, and no lever offered Transformer Engine's fused loss, which the kit's own
    # estimate shows dropping the fp32 softmax; the offload rows said nothing of the host
    # memory they take (31 layers: over 100 GiB per GPU). Megatron-LM's arguments.py refuses
    # the TE fusion from core_v0.19 (a second trial): left out there unless the version is
    # older; Megatron-Core itself (Bridge) accepts it, and the rendered config carries the key.
    script = CORPUS / "blind_llama3_8b_h100_fp8.sh"
    args = ["plan", "--config", str(script), "--seq-length", "32768", "--gpu-memory-gb", "80"]
    assert main([*args, "--levers", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["levers"]
    assert not [r for r in doc["rows"] if r["lever"] == "fused loss"]
    assert any("Megatron-LM refuses --cross-entropy-fusion-impl te" in n for n in doc["notes"])
    offload = [r for r in doc["rows"] if r["lever"] == "offload"]
    assert offload and all("host memory" in r["adds"] for r in offload)
    assert main([*args, "--levers", "--json", "--megatron-core-version", "0.18"]) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    fused = next(r for r in rows if r["lever"] == "fused loss")
    assert fused["setting"].startswith("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te")
    assert "--cross-entropy-fusion-impl te" in fused["rendered"]
    assert "its speed is not timed" in fused["adds"] and fused["fits"]
    # the run has it off (a recipe may on purpose); 0.18 accepts te, so no refusal is said
    assert "check why" in fused["adds"] and "core_v0.19" not in fused["adds"]
    # the same run in Megatron-Bridge's keys
    assert main([*args, "--levers", "--json", "--format", "megatron-bridge"]) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    bridge = next(r for r in rows if r["lever"] == "fused loss")
    assert bridge["setting"].startswith("model.cross_entropy_loss_fusion=true")
    assert 'cfg.model.cross_entropy_fusion_impl = "te"' in bridge["rendered"]
    # the version unknown (the strictest): Megatron-LM's refusal from core_v0.19 is said
    assert "core_v0.19" in bridge["adds"]


def test_torchtitan_levers_combine_a_layout_with_the_micro_batch_and_say_fp32(capsys):
    # A skill trial on torchtitan's qwen3_32b.toml at 16k (local batch 2, 8 H100): "no lever
    # fits ... add GPUs" while CP 8 with local batch 1 (the step's 16 sequences kept) fits;
    # TP 8 without FSDP was priced in bf16 though torchtitan turns mixed precision off there
    # (maybe_enable_amp); the CPU-offload row's TOML did not turn offload on.
    toml = Path(__file__).parent / "sources/corpus/torchtitan/qwen3_32b.toml"
    args = ["plan", "--config", str(toml), "--seq-length", "16384", "--dp", "8"]
    assert main([*args, "--gpu", "h100-80gb", "--levers", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    combo = next(r for r in rows if r["setting"].startswith("cp=8 pp=1 dp=1, micro_batch_size=1"))
    assert combo["fits"] and combo["lever"] == "cp x pp + micro-batch"
    assert (
        "local_batch_size = 1" in combo["rendered"]
        and "global_batch_size = 16" in combo["rendered"]
    )
    tp8 = next(r for r in rows if r["setting"].startswith("tp=8 dp=1"))
    assert "fp32: torchtitan turns mixed precision off" in tp8["adds"]
    offload = next(r for r in rows if r["lever"] == "CPU offload")
    assert "enable_cpu_offload = true" in offload["rendered"]
    # plan (not --levers) with the layout given keeps the step's batch in the TOML too
    layout = ["--cp", "8", "--dp", "1", "--micro-batch-size", "1", "--gpu", "h100-80gb"]
    assert main([*args, *layout, "--global-batch-size", "16"]) == 0
    assert "global_batch_size = 16" in capsys.readouterr().out
    assert main([*args, *layout]) == 0  # not known: said, not made up
    out = capsys.readouterr()
    assert "global_batch_size" not in out.out and "give --global-batch-size" in out.err


def test_a_cp_comm_type_the_step_model_does_not_time_is_said(capsys):
    # A skill trial (Bridge's GLM-5 recipe, cp_comm_type allgather): the CP rows were timed as
    # the p2p ring without a word. Bridge's resolved gpt-oss config sets cp_comm_type a2a.
    config = (
        Path(__file__).parent
        / "sources/corpus/bridge/blind_gpt_oss_120b_pretrain_h100_fp8_mx_v1.yaml"
    )
    assert (
        main(["plan", "--config", str(config), "--dp", "8", "--gpu", "h100-80gb", "--levers"]) == 0
    )
    assert "model.cp_comm_type 'a2a': CP's communication is timed as the p2p ring" in (
        capsys.readouterr().out
    )


def test_fsdp2_cpu_offload_host_memory_counts_every_expert_shard():
    # A skill trial on torchtitan's deepseek_v3_671b.toml at EP 32 on 256 GPUs: the offload row
    # said 2.5 GiB of host memory per GPU. FSDP2's CPUOffloadPolicy moves the fp32 parameters,
    # gradients and Adam states (16 B a parameter) of the rank's shard, experts sharded over the
    # 8 expert-data-parallel ranks, not over all 256: 671B / 256 x 16 B = 39 GiB.
    from recompute_kit.plan.trainer_levers import host_bytes
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources/corpus/torchtitan/blind_deepseek_v3_671b.toml"
    over = {"data_parallel_size": 256, "expert_model_parallel_size": 32}
    cfg = resolve([str(toml)], overrides=over).config
    offloaded = cfg.replace(optimizer_offload=True, param_offload=True)
    assert abs(host_bytes(offloaded) / (671.03e9 / 256 * 16) - 1) < 0.01


def test_expert_parallel_rows_price_their_all_to_alls():
    # A skill trial on torchtitan's deepseek_v3_671b.toml on 256 GPUs (EP 1: every rank gathers
    # each MoE block's 256 experts): no lever offered expert parallelism, and EP sizes were
    # priced alike, their all-to-alls untimed. EP rows are levers now, with a smaller
    # micro-batch where EP alone falls short, and each MoE layer's dispatch and combine count.
    from recompute_kit.plan.step_time import Hardware, ep_transfer_seconds
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources/corpus/torchtitan/blind_deepseek_v3_671b.toml"
    cfg = resolve([str(toml)], overrides={"data_parallel_size": 256}).config.with_recompute(
        "full:uniform:1"
    )
    table = levers(cfg, 79.1, global_batch_size=1024)
    ep32 = next(r for r in table.rows if r.setting.startswith("ep=32, micro_batch_size=2"))
    assert ep32.fits and not table.current.fits
    hw = Hardware()
    m = cfg.model
    ep = cfg.replace(expert_model_parallel_size=32, micro_batch_size=2)
    moe_layers = m.num_layers - 3  # DeepSeek-V3's first 3 layers are dense
    per = 2 * m.seq_length * m.moe_router_topk * m.hidden_size * 2 * 31 / 32  # bf16 copies
    # 2 forward + 2 backward + 2 recomputed all-to-alls a layer, over the network (EP 32)
    expected = moe_layers * 6 * per / (hw.internode_gbps * 1e9)
    assert abs(ep_transfer_seconds(ep, 0, hw) / expected - 1) < 1e-9
    assert ep_transfer_seconds(cfg, 0, hw) == 0  # no EP, no all-to-all
    # and `plan`'s "nothing fits" names it first
    from recompute_kit.config import ConfigError
    from recompute_kit.plan import plan

    with pytest.raises(ConfigError, match=r"too much; expert parallelism"):
        plan(cfg, 79.1)


def test_the_doctor_prices_levers_on_the_gpu_named_as_plan_does():
    """A re-trial (Qwen2.5-72B under Accelerate FSDP on 16 A100s): diagnose --gpu a100-80gb
    priced the offload lever at 3.68x (the default H100-class rates), plan --levers --gpu at
    1.16x. Both now take the named GPU's rates (plan/step_time.hardware_for)."""
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect
    from recompute_kit.gpus import GPUS
    from recompute_kit.plan.step_time import DEFAULT_TFLOPS, hardware_for

    a100 = hardware_for("a100-80gb")
    assert a100.tflops_per_gpu < DEFAULT_TFLOPS == hardware_for(None).tflops_per_gpu
    corpus = Path(__file__).parent / "sources" / "corpus" / "hf_trainer"
    files = [
        str(corpus / "accelerate_fsdp.yaml"),
        str(corpus / "zephyr-7b-beta_sft_config_full.yaml"),
    ]
    evidence = collect(config=files, overrides={"data_parallel_size": 16}, model="Qwen/Qwen2.5-72B")
    gib = GPUS["a100-80gb"].usable_gib
    link = {}
    for gpu in ("a100-80gb", None):
        words = " ".join(f.fix for f in diagnose(evidence, gib, gpu=gpu).findings)
        found = re.search(r"host link (\d+\.\d+) s/step", words)  # (the offload lever's)
        assert found, words[:500]
        link[gpu] = float(found.group(1))
    assert link["a100-80gb"] > link[None]  # the A100's PCIe 4 host link, not the default 5


def test_a_lever_that_needs_a_smaller_micro_batch_takes_the_largest_that_fits(capsys):
    """A re-trial (Qwen2.5-72B, the handbook's FSDP config and recipe, 16 A100s): FSDP offload
    fits at per_device_train_batch_size 8 (53 GiB), but the table paired it only with 1
    (16 micro-batches, more FSDP gathers: slower)."""
    corpus = Path(__file__).parent / "sources" / "corpus" / "hf_trainer"
    argv = [
        "plan",
        "--config",
        str(corpus / "accelerate_fsdp.yaml"),
        str(corpus / "zephyr-7b-beta_sft_config_full.yaml"),
        "--model",
        "Qwen/Qwen2.5-72B",
        "--dp",
        "16",
        "--gpu",
        "a100-80gb",
        "--levers",
        "--json",
    ]
    main(argv)
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    offload = [r for r in rows if "fsdp_offload_params true" in r["setting"] and r["fits"]]
    assert offload and offload[0]["micro_batch_size"] == 8
    assert offload[0]["setting"].startswith("per_device_train_batch_size=8 ")


def test_ep_overlap_hides_the_all_to_alls_behind_compute():
    # overlap_moe_expert_parallel_comm (read from Megatron-Bridge's comm_overlap section): the
    # all-to-alls overlap another micro-batch's compute, exposed = max(0, transfer - compute);
    # a skill trial saw 124 s of a 231 s step priced as exposed on a recipe that overlaps them
    from recompute_kit.plan.step_time import Hardware, ep_transfer_seconds, stage_time

    cfg = Config(
        ModelConfig(
            num_layers=4,
            hidden_size=2048,
            num_attention_heads=16,
            seq_length=16384,
            num_moe_experts=64,
            moe_router_topk=8,
            moe_ffn_hidden_size=768,
            bf16=True,
            moe_token_dispatcher_type="alltoall",
            vocab_size=32000,
        ),
        ParallelConfig(expert_model_parallel_size=16, data_parallel_size=16),
    )
    hw = Hardware()
    plain = stage_time(cfg, 0, hw)
    assert plain.ep_exposed_s == ep_transfer_seconds(cfg, 0, hw) > 0
    overlapped = cfg.replace(overlap_moe_expert_parallel_comm=True)
    hidden = stage_time(overlapped, 0, hw)
    assert hidden.ep_exposed_s == max(0.0, plain.ep_exposed_s - hidden.compute_s)
    assert hidden.ep_exposed_s < plain.ep_exposed_s


def test_an_expert_group_spans_its_own_ranks_not_the_attention_layers_tp_x_cp():
    # a skill trial (Bridge's Qwen3-30B-A3B on one node of 8, EP 8): the CP 2 rows showed
    # "EP all-to-all exposed 28.9 s" against 3.2 s: the EP group was taken to span TP x CP x EP
    # = 16 ranks (two nodes). Megatron-Core builds expert groups on their own grid
    # (expert_decoder_rank_generator: expert TP x EP, cp = 1): 8 ranks, one node.
    from recompute_kit.plan.step_time import Hardware, ep_transfer_seconds

    moe = get_preset("mixtral-8x7b").config()
    cfg = moe.replace(
        expert_model_parallel_size=8,
        tensor_model_parallel_size=1,
        context_parallel_size=2,
        data_parallel_size=4,
        moe_token_dispatcher_type="alltoall",
    )
    nvlink = Hardware(internode_gbps=450.0)
    assert ep_transfer_seconds(cfg, 0, Hardware()) == ep_transfer_seconds(cfg, 0, nvlink)
    wide = cfg.replace(expert_model_parallel_size=16, data_parallel_size=8)  # two nodes
    assert ep_transfer_seconds(wide, 0, Hardware()) > ep_transfer_seconds(wide, 0, nvlink)


NEMO_RL_SFT70B_4GPU = (
    Path(__file__).parent
    / "data/read/nemo_rl_sft70b/examples/configs/recipes/llm"
    / "sft-llama3.1-70b-8n4g-tp2pp2-long-megatron.yaml"
)


def test_a_node_of_four_gpus_bounds_tp_and_prices_what_spans_it(capsys):
    # a skill trial (round ac) on NeMo-RL's 70B SFT recipe for 8 nodes x 4 GPUs
    # (cluster.gpus_per_node: 4): the step-time model took nodes of 8 GPUs, so a CP4 ring at
    # TP2 (8 GPUs: two nodes) cost nothing and TP 8 (across nodes) was offered; TP4 with PP4,
    # which fits without recompute, was never tried
    from recompute_kit.plan.step_time import Hardware, stage_time
    from recompute_kit.sources.resolve import resolve

    cfg = resolve([str(NEMO_RL_SFT70B_4GPU)]).config
    assert cfg.parallel.gpus_per_node == 4
    cp4 = cfg.replace(context_parallel_size=4, pipeline_model_parallel_size=4, data_parallel_size=1)
    on_dgx = cp4.replace(gpus_per_node=8)
    assert stage_time(cp4, 0, Hardware()).cp_transfer_s == pytest.approx(
        stage_time(on_dgx, 0, Hardware()).cp_transfer_s * 9  # 450 GB/s / 50 GB/s
    )
    args = ["plan", "--config", str(NEMO_RL_SFT70B_4GPU), "--gpu", "h100-80gb", "--levers"]
    assert main([*args, "--json"]) in (0, 1)
    rows = json.loads(capsys.readouterr().out)["levers"]["rows"]
    assert not [r for r in rows if r["tensor_model_parallel_size"] > 4]
    both = [r for r in rows if r["lever"] == "tp x pp" and r["fits"]]
    assert any(r["recompute"] == "none" for r in both)
    # its hand-over sets the padding NeMo-RL needs for TP4 with SP (the recipe pins it to 2)
    tp4pp4 = next(r for r in both if r["setting"].startswith("tp=4 pp=4"))
    assert "policy.make_sequence_length_divisible_by: 4" in tp4pp4["rendered"]
    cp_row = next(r for r in rows if r["context_parallel_size"] == 4)
    assert "policy.sequence_packing.enabled: true" in cp_row["rendered"]
    assert "policy.make_sequence_length_divisible_by: 8" in cp_row["rendered"]  # 2 CP x TP2 off SP


def test_levers_say_what_the_current_row_is_with_overrides(capsys):
    args = ["plan", "--config", str(NEMO_RL_SFT70B_4GPU), "--gpu", "h100-80gb", "--levers"]
    assert main([*args, "--tp", "4", "--sp", "--pp", "4", "--json"]) in (0, 1)
    said = json.loads(capsys.readouterr().out)["current_is"]
    assert said == "the run as given, with --tp 4 --pp 4 --sp"
