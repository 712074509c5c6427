"""Rules RK220 and later: memory outside the allocator, pasted measurements (rules/measured.py),
general readings (rules/general.py)."""

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

from recompute_kit.doctor.engine import build_context, diagnose
from recompute_kit.doctor.evidence import (
    Evidence,
    MemoryReport,
)
from recompute_kit.doctor.rules import (
    EXPANDABLE,
)

# =============================================================================================
# RK220: nvidia-smi shows more than PyTorch holds (rules/outside_allocator.py)
# =============================================================================================


@covers("RK220")
def test_rk220_smi_above_torch_counters_is_the_cuda_context():
    # https://github.com/pytorch/pytorch/issues/28113 (dev corpus case): torch says 0, nvidia-smi
    # 200+ to 700+ MB; maintainer: "That is the size of the CUDA context."
    d = run(text("i22-pt-28113"))
    f = top(d)
    assert f.rule == "RK220" and f.category == "non_pytorch_memory"
    cites(f, "667.57 MiB", "0.00 MiB", "700+mb")
    assert "CUDA context" in f.fix and "mem_get_info" in f.confirm
    assert f.config_patch == {"env": {"CUDA_MODULE_LOADING": "LAZY"}}


@covers("RK220")
def test_rk220_memory_fraction_does_not_cap_the_context():
    # https://github.com/pytorch/pytorch/issues/107667 (dev corpus case): a 100MB cap with
    # set_per_process_memory_fraction, 430MB in nvidia-smi; ptrblck: the CUDA context.
    d = run(text("i22-pt-107667"))
    f = top(d)
    assert f.rule == "RK220"
    cites(f, "410.08 MiB", "95.37 MiB", "314.71 MiB", "set_per_process_memory_fraction")
    assert "never the context" in f.fix


def test_rk220_not_for_gigabytes_over_memory_allocated_alone():
    # https://github.com/pytorch/pytorch/issues/37250: memory_allocated() 0 after `del model`,
    # nvidia-smi 12433MiB; the answer there is the allocator's cache (max_memory_reserved is
    # close to nvidia-smi), not memory outside it.
    d = run(text("i22-pt-37250"))
    facts = d.evidence.facts["log"]
    assert facts["smi_bytes"] == 12433 * 2**20  # the device row, not the 81920MiB total
    assert "torch_bytes" not in facts  # "it shows `0`" names no PyTorch counter on its line
    assert "RK220" not in ids(d)
    # Said on one line, the gap is still gigabytes over memory_allocated alone: not RK220.
    d = run(text("i22-pt-37250").replace("it shows `0`.", "torch.cuda.memory_allocated() shows 0."))
    assert d.evidence.facts["log"]["torch_bytes"] == 0 and "RK220" not in ids(d)


def test_knobs_read_framework_names_not_lookalikes():
    # Key names as the frameworks document them (verl's ppo_trainer.yaml `trainer:` section,
    # Lightning's Trainer arguments, an LSTM's input_size): a `trainer.*` key alone is not
    # Lightning, and a feature size is not a sequence cap.
    from recompute_kit.doctor.rules.knobs import read_knobs

    def knobs(config: dict):
        return read_knobs(build_context(Evidence(config=config)))

    verl = knobs({"trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "max_prompt_length": 512})
    assert verl.framework == "script" and verl.seq == [("max_prompt_length", 512)]
    assert knobs({"trainer.accumulate_grad_batches": 4}).framework == "lightning"
    assert knobs({"trainer.devices": 2, "batch_size": 8}).framework == "lightning"
    assert knobs({"input_size": 128, "hidden_size": 256, "batch_size": 4}).seq == []


def test_pasted_document_with_glued_lines_does_not_crash():
    # The NVIDIA perf-activation-recompute skill (seed-001) pasted as a log: its scraped lines
    # run `--recompute_modules core_attn layernorm \` on into glued prose and a table header.
    # Only module names are read (no crash in RK143's patch, no "Megatron would reject" from
    # garbage), and the table's findings lead as they do when it is given as experiments.
    d = run(text("seed-001-perf-activation-recompute"))
    assert d.evidence.config["recompute_modules"] == ["core_attn", "layernorm"]
    assert top(d).category == "recompute_overhead" and "RK054" not in ids(d)


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


# RK260-RK265: general readings of a phenomenon (rules/general.py, facts from
# evidence/signals.py), and default readings from sizes stated in prose. Texts are
# tests/data/rules/i26-*, verbatim from dev corpus cases (URLs in SOURCES).
# =============================================================================================


@covers("RK260")
def test_rk260_traceback_cut_inside_a_library_on_a_sharding_path():
    # https://github.com/huggingface/transformers/issues/46822: from_pretrained's frames end in
    # transformers' _initialize_missing_keys under deepspeed.zero.GatheredParameters; the
    # exception line is cut. Root cause: transformers gathers every missing key at once.
    d = run(text("i26-hf-46822"))
    f = top(d)
    assert f.rule == "RK260" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install -U transformers"
    assert f.config_patch["zero_optimization"] == {"stage": 2}
    cites(f, "transformers's own code", "_initialize_missing_keys", "GatheredParameters")
    assert "upgrade transformers" in f.fix and "paste it to confirm" in f.evidence
    # the same frames in the user's own script: not a library's bug
    mine = text("i26-hf-46822").replace(".../transformers/modeling_utils.py", "/home/me/train.py")
    assert "RK260" not in ids(run(mine))


@covers("RK260")
def test_rk260_needs_a_recompute_offload_or_sharding_path():
    # https://github.com/huggingface/transformers/issues/28499: Trainer -> accelerate ->
    # torch.autograd backward frames, cut before the exception: no feature in the frames, so
    # no framework-bug reading (the paste does not say which feature failed).
    assert "RK260" not in ids(run(text("i26-hf-28499")))


@covers("RK260", "RK103")
def test_rk260_ranks_below_the_specific_recompute_type_error():
    # https://github.com/NVIDIA/Megatron-LM/pull/2754: TypeError from Megatron's own
    # tensor_parallel.checkpoint; the specific RK103 leads, the general RK260 follows.
    d = run(text("i12-megatron-2754"))
    assert ids(d)[0] == "RK103"
    f = get(d, "RK260")
    assert f.confidence < top(d).confidence and f.config_patch["command"].endswith("megatron")


@covers("RK261")
def test_rk261_square_mask_of_a_long_sequence():
    # https://github.com/meta-pytorch/attention-gym/issues/32: q/k/v [2, 12, 93600, 128] and
    # "materialize [93600, 93600] mask causes OOM"; maintainer: pass _compile to
    # create_block_mask.
    d = run(text("i26-attngym-32"))
    f = top(d)
    assert f.rule == "RK261" and f.category == "allocation_exceeds_device"
    cites(f, "[93600, 93600]", "8.16 GiB", "[2, 12, 93600, 93600]", "783.29 GiB")
    assert "_compile=True" in f.config_patch["code"] and "create_block_mask" in f.fix


@covers("RK261")
def test_rk261_the_failing_line_computes_the_full_scores():
    # https://github.com/pytorch/pytorch/issues/133206: the OOM line of flex_attention run
    # uncompiled; the reporter: "the problem was I had to compile the function".
    f = top(run(text("i26-pt-133206")))
    assert f.rule == "RK261" and "torch.compile(flex_attention)" in f.config_patch["code"]
    assert f.confidence < 0.85  # no size in the paste: less sure than with [N, N]


@covers("RK262")
def test_rk262_logits_with_a_vocabulary_sized_dimension():
    # https://github.com/huggingface/trl/issues/3678: the full logits [B, logits_to_keep,
    # vocab] (2 x 256 x 151665) dominate the logprob forward; the answer: use_liger_kernel.
    # Here the pasted size is 2 x 256 x 151665 x 4 bytes: RK232 says so and RK262, the same
    # logits only named, steps aside; with a size that is not the product, RK262 reads them.
    assert top(run(text("i26-trl-3678"))).rule == "RK232"
    assert "RK262" not in ids(run(text("i26-trl-3678")))
    d = run(text("i26-trl-3678").replace("**310 MB**", "**500 MB**"))
    f = top(d)
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert f.config_patch == {"use_liger_kernel": True}
    cites(f, "151665")
    assert "logits_to_keep" in f.fix and "chunked" in f.fix
    # the logits named with no size and no OOM next to them: no reading
    assert "RK262" not in ids(run("full logits tensor `[B, logits_to_keep, vocab]`\n"))


@covers("RK263", "RK001")
def test_rk263_side_stream_communication_outranks_fragmentation():
    # https://github.com/pytorch/pytorch/issues/71616: the OOM (36.19 GiB reserved, 22.96 GiB
    # allocated) in a job that overlaps NCCL communication on separate streams; the fix was
    # per-stream event queues (PR #71745) and fewer queued comms in flight.
    d = run(text("i26-pt-71616-report"))
    f = top(d)
    assert f.rule == "RK263" and f.category == "framework_bug"
    cites(f, "36.19 GiB", "22.96 GiB", "13.23 GiB", "NCCL")
    assert f.config_patch["env"] == {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
    assert "record_stream" in f.fix and "in flight" in f.fix
    assert ids(d)[1] == "RK001"  # the reserved-but-unallocated reading stays, second
    # the OOM line alone (no side streams in the paste): fragmentation leads, as before
    assert top(run(text("pt-71616"))).rule == "RK001"


@covers("RK264")
def test_rk264_memory_allocated_nonzero_after_freeing_is_cublas_workspace():
    # https://github.com/pytorch/pytorch/pull/85447: after deleting the model and garbage
    # collection memory_allocated() stays non-zero; the PR moved cuBLAS workspaces into the
    # caching allocator ("This is expected").
    f = top(run(text("i26-pt-85447")))
    assert f.rule == "RK264" and f.category == "informational"
    assert f.config_patch["code"] == "torch._C._cuda_clearCublasWorkspaces()"
    assert "CUBLAS_WORKSPACE_CONFIG" in f.config_patch["env"]
    # gigabytes left over are references the program holds, not a workspace
    big = text("i26-pt-85447").replace("returns non-zero", "returns non-zero (12 GB)")
    assert "RK264" not in ids(run(big))


@covers("RK265")
def test_rk265_memory_summary_peak_without_an_oom():
    # https://github.com/pytorch/pytorch/issues/116928: torch.cuda.memory_summary() with a
    # 23806 MiB peak and no OOM; ptrblck: the script needs ~24GB, so an 8GB cap OOMs.
    f = top(run(text("i17-mistral-116928-summary")))
    assert f.rule == "RK265" and f.category == "genuine_pressure"
    cites(f, "23.25 GiB", "14.02 GiB", "set_per_process_memory_fraction")
    assert f.config_patch == {"batch_size": "half of the current one"}


@covers("RK170")
def test_rk170_sharded_states_small_on_the_stated_gpu_and_eager_attention():
    # https://github.com/OpenRLHF/OpenRLHF/issues/384: DPO of glm-4-9b with ZeRO-3,
    # micro_train_batch_size 1 and gradient checkpointing on "A100-80Gx8"; the fix was
    # --flash_attn. ZeRO-3 over 8 GPUs leaves ~17 GiB of states per 80 GiB GPU: activations.
    d = run(text("i26-openrlhf-384"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert d.evidence.facts["log"]["gpu_prose"]["count"] == 8
    cites(f, "~9.0B parameters", "16.76 GiB per GPU")
    assert "flash_attn" in f.fix and "max_len 2048 -> 1024" in f.fix


@covers("RK171", "RK100")
def test_rk171_states_of_a_model_named_in_prose_not_a_separate_inference_engine():
    # https://github.com/OpenRLHF/OpenRLHF/issues/392: "16B模型", zero_stage 3 over
    # actor_num_gpus_per_node 4; maintainer: without Adam offload a large model OOMs. vLLM
    # runs on engines of its own (vllm_num_engines): no colocated-engine reading.
    d = run(text("i26-openrlhf-392"), config=text("i26-openrlhf-392-config"), config_name="run.sh")
    assert "RK100" not in ids(d)
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory"
    cites(f, "~16.0B parameters", "59.60 GiB per GPU over 4 GPU(s)")
    assert "offload_optimizer" in f.fix
    # ref_reward_offload offloads the frozen models, not the actor's optimizer
    assert "offload on" not in f.evidence


@covers("RK266")
def test_rk266_allocated_memory_rising_every_step_is_a_leak():
    # https://github.com/pytorch/pytorch/issues/115255 (labels: module: checkpoint, module:
    # memory usage): a saved-tensor-hook loop prints "memory (MB) | allocated: ..." once per
    # step, 20.4, 20.5, 20.5, 20.6, ... 21.0 MB, never settling. No public paste of this
    # shape is in the corpus, so the reports are built from the thread's numbers.
    mb = [20.4, 20.5, 20.5, 20.6, 20.6, 20.6, 20.7, 20.7, 20.8, 20.8, 20.9, 20.9, 21.0, 21.0, 21.1]
    reports = [MemoryReport(allocated_bytes=int(v * 2**20)) for v in mb]
    d = diagnose(Evidence(memory=reports))
    f = top(d)
    assert f.rule == "RK266" and f.category == "framework_bug"
    cites(f, "20.40 MiB -> 21.10 MiB", "14 steps")
    assert "gc.collect()" in f.config_patch["code"] and "upgrade" in f.fix
    # the same figures settling after warm-up: a peak, not a leak
    settled = [MemoryReport(allocated_bytes=int(v * 2**20)) for v in mb[:5] + [20.6] * 6]
    assert "RK266" not in ids(diagnose(Evidence(memory=settled)))


@covers("RK266")
def test_rk266_reads_step_numbered_lines_and_yields_to_specific_growth_rules():
    # pytorch#123548 (dev corpus text): reserved grows per cycle under max_split_size_mb with
    # expandable_segments; the specific RK154 leads, whatever else reads the growth.
    assert top(run(text("i13-pt-123548"))).rule == "RK154"
    from recompute_kit.doctor.evidence.signals import scan_signals

    # a Megatron report line without a step on it counts in print order
    facts = scan_signals(["[Rank 0] memory (MB) | allocated: 20.4 | max allocated: 21.8"])
    assert facts["memory_series"][0][:3] == (0, 20_400_000, "allocated")


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
