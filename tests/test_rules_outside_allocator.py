"""Tests of the rules in recompute_kit/doctor/rules/outside_allocator.py, one or more per rule, on
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


@covers("RK481")
def test_fb_cuda_overhead_beyond_the_allocator_cache():
    # https://github.com/pytorch/pytorch/issues/28394: 2 MB cached but ~1 GB used on the GPU:
    # the CUDA context (maintainers: lazy loading in later CUDA)
    f = top(run(text("fb-pt-28394-cuda-overhead")))
    assert f.rule == "RK481" and f.category == "non_pytorch_memory"
    assert f.config_patch == {"env": {"CUDA_MODULE_LOADING": "LAZY"}}


@covers("RK481")
def test_fb_driver_memory_not_counted_by_max_memory_allocated():
    # https://github.com/facebookresearch/maskrcnn-benchmark/issues/182 (fmassa): memory of
    # the CUDA driver is not counted in torch.cuda.max_memory_allocated()
    f = top(run(text("fb-maskrcnn-182-driver-memory")))
    assert f.rule == "RK481" and f.category == "non_pytorch_memory"


@covers("RK480")
def test_fb_fragmentation_reserved_growing_over_time():
    # https://github.com/meta-pytorch/torchtune/issues/2830 (maintainer): fragmentation,
    # reserved memory growing over time; try expandable_segments:True
    f = top(run(text("fb-torchtune-2830-reserved-growing")))
    assert f.rule == "RK480" and f.category == "fragmentation"
    assert "expandable_segments" in f.fix


@covers("RK480")
def test_fb_fragmentation_split_remainder_pinned():
    # https://github.com/vllm-project/vllm/pull/41268: a split block's free remainder pinned by
    # the live tensor; fixed with max_split_size_mb (expandable_segments in #41158)
    f = top(run(text("fb-vllm-pr41268-split-remainder")))
    assert f.rule == "RK480" and f.category == "fragmentation"
    assert "max_split_size_mb" in f.fix


def test_fb_pytorch_tip_alone_is_not_fragmentation_in_words():
    # the OOM message's own "to avoid fragmentation" tip is not the thread naming it
    d = run(text("fb-neurolens-2-grid-sampler-55gib"))
    assert "RK480" not in [f.rule for f in d.findings]


@covers("RK360")
def test_fb_gpu_consumed_by_another_process_without_an_oom():
    # https://github.com/sgl-project/sglang/issues/465: a misspelled CUDA_VISIBLE_DEVICES left
    # the server on "a GPU that was consumed already"
    f = top(run(text("fb-sglang-465-gpu-consumed")))
    assert f.rule == "RK360" and f.category == "other_processes"
    assert "CUDA_VISIBLE_DEVICES" in f.config_patch["env"]


def test_fb_gpu_memory_used_up_is_not_another_process():
    # memory used up by this job's own tensors is not the GPU taken by someone else
    d = run("The GPU memory is already used up by the model after two steps.")
    assert "RK360" not in [f.rule for f in d.findings]


@covers("RK360")
def test_fresh_rk360_gpus_full_with_no_process_listed():
    # https://github.com/phil-bergmann/tracking_wo_bnw/issues/57: "CUDA error: out of memory";
    # the maintainer asked whether something else runs on the GPU; gpustat shows GPUs 0, 1, 4,
    # 5 full and 2, 3, 6, 7 empty while nvidia-smi lists no process. Run on an idle GPU.
    f = top(run(text("fm-tracking-57-gpus-held")))
    assert f.rule == "RK360" and f.category == "other_processes"
    assert f.config_patch == {"env": {"CUDA_VISIBLE_DEVICES": "2"}}
    assert "GPU 0, 1, 4, 5" in f.evidence


@covers("RK360")
def test_fresh_rk360_another_code_on_gpu0_in_words():
    # https://github.com/yinboc/DGP/issues/16: "I run another code on GPU0"; the script's own
    # --gpu resets CUDA_VISIBLE_DEVICES (the maintainer: choose the GPU with --gpu).
    f = top(run(text("fm-dgp-16-another-code")))
    assert f.rule == "RK360" and f.category == "other_processes"
    assert "CUDA_VISIBLE_DEVICES" in f.config_patch["env"]
    assert "--gpu" in f.fix


@covers("RK360")
def test_fresh_rk360_already_a_training_in_gpu0():
    # https://github.com/open-mmlab/mmdetection/issues/3020: GPU 0 is out of memory "because
    # there is already a training in GPU 0"
    f = top(run(text("fm-mmdet-3020-gpu0-busy")))
    assert f.rule == "RK360" and f.category == "other_processes"


def test_fresh_rk360_needs_an_oom_and_a_full_gpu():
    # the same gpustat rows without an OOM, or with no GPU over 90%, are no finding
    rows = text("fm-tracking-57-gpus-held").split("\n", 1)[1]
    assert "RK360" not in [f.rule for f in run(rows).findings]
    light = text("fm-tracking-57-gpus-held").replace("15836 / 16130", "1836 / 16130")
    light = light.replace("15825 / 16130", "1825 / 16130").replace("15718", "1718")
    light = light.replace("15682", "1682")
    assert "RK360" not in [f.rule for f in run(light).findings]
    # full GPUs next to an OOM, with processes listed (or nothing said): this job's own usage
    listed = text("fm-tracking-57-gpus-held").replace(
        "and nvidia-smi shows that no processes on GPU were launched\n", ""
    )
    assert "RK360" not in [f.rule for f in run(listed).findings]


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


@covers("RK100")
def test_rk100_vllm_cumem_oom():
    d = run(text("i12-nemorl-3280"))
    assert d.evidence.oom and d.evidence.oom[0].generation == "cuda_error"
    f = top(d)
    assert f.rule == "RK100" and "gpu_memory_utilization" in f.config_patch


@covers("RK100")
def test_rk100_nemo_rl_config_colocates_vllm_and_the_oom_is_at_setup():
    # https://github.com/NVIDIA-NeMo/RL/issues/2702 (the reporter's log, cut where the thread
    # is) with the config it names, examples/configs/grpo_math_1B_megatron.yaml and its
    # defaults: parent grpo_math_1B.yaml (colocated vLLM, gpu_memory_utilization 0.6): the
    # engine shares the GPU; the OOM is in setup, where checkpointing saves nothing
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    data = Path(__file__).parent / "data" / "rules" / "nemo-rl-2702-colocated-oom-at-setup.txt"
    corpus = Path(__file__).parent / "sources" / "corpus" / "nemo_rl"
    evidence = collect(logs=[str(data)], config=str(corpus / "grpo_math_1B_megatron.yaml"))
    d = diagnose(evidence, None)
    assert "RK100" in ids(d)
    f = get(d, "RK100")
    assert "policy.generation.colocated.enabled" in f.evidence
    assert set(f.patch_keys or f.config_patch) == {
        "policy.generation.vllm_cfg.gpu_memory_utilization"
    }
    assert "RK014" not in ids(d)  # activation checkpointing cannot help before a step


LAUNCH = Path(__file__).parent / "data" / "nemo_rl_launch" / "examples" / "configs"
# A skill trial's user, in words, beside NeMo-RL's real examples/configs/grpo_math_8B_megatron.yaml
# (Llama-3.1-8B, TP1 PP2 on 8 GPUs, colocated vLLM at gpu_memory_utilization 0.6)
SAID = "This NeMo-RL job OOMs on 8x H100 80GB during the policy training step.\n"
# The same run's OOM as PyTorch >= 2.1 words it (c10/cuda/CUDACachingAllocator.cpp), with no
# "Process <pid> has ..." line: NVML listed no other process (another container's engine), the
# sizes the skill trial used: 79.10 GiB, 301 MiB free, this process 30.87 GiB.
UNLISTED_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 0 has a "
    "total capacity of 79.10 GiB of which 301.00 MiB is free. Including non-PyTorch memory, "
    "this process has 30.87 GiB memory in use. Of the allocated memory 27.50 GiB is allocated "
    "by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.\n"
)


def _nemo_rl_8b(tmp_path, said, gpu):
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    log = tmp_path / "said.log"
    log.write_text(said, encoding="utf-8")
    config = LAUNCH / "grpo_math_8B_megatron.yaml"
    return diagnose(collect(logs=[str(log)], config=str(config)), gpu)


@covers("RK100")
def test_rk100_an_oom_in_words_beside_a_step_that_fits_puts_the_engine_first(tmp_path):
    # The trial: the estimate (about 43 GiB of 79.1) fits, yet the doctor led with "recompute
    # more". Said in words, the OOM reads the colocated engine's share beside the step.
    d = _nemo_rl_8b(tmp_path, SAID, 79.1)
    engine = get(d, "RK100")
    assert "0.6 x 79.10 GiB = 47.46 GiB" in engine.evidence
    assert "only where sleep mode frees the engine's memory" in engine.evidence
    assert top(d).rule == "RK100"
    # the default reading that blames the step's own knobs says the estimate fits, and follows
    default = next((f for f in d.findings if f.rule in ("RK170", "RK171")), None)
    if default is not None:
        assert default.raw_confidence <= 0.2 and "do not explain an OOM" in default.evidence


@covers("RK100", "RK089")
def test_rk100_memory_held_outside_the_process_is_the_engine_s_share(tmp_path):
    d = _nemo_rl_8b(tmp_path, UNLISTED_OOM, None)
    engine = get(d, "RK100")
    assert engine.raw_confidence >= 0.85
    assert "47.94 GiB held outside this process" in engine.evidence
    # RK089 reads the memory no "Process" line names (without the config, it alone)
    elsewhere = get(run(UNLISTED_OOM), "RK089")
    assert "does not list" in elsewhere.evidence and "47.94 GiB" in elsewhere.evidence


def test_nemo_rl_environment_patches_go_to_the_policys_env_vars():
    # NeMo-RL's workers take env vars from policy.megatron_cfg.env_vars (its
    # docs/design-docs/env-vars.md); a bare environment variable would reach the colocated
    # vLLM workers too, whose memory pool refuses expandable_segments (NVIDIA-NeMo/RL#2319)
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    data = Path(__file__).parent / "data" / "rules" / "nemo-rl-2702-colocated-oom-at-setup.txt"
    corpus = Path(__file__).parent / "sources" / "corpus" / "nemo_rl"
    d = diagnose(collect(logs=[str(data)], config=str(corpus / "grpo_math_1B_megatron.yaml")), None)
    env = [f.patch_keys for f in d.findings if f.patch_keys and "env" in str(f.patch_keys)]
    assert env and all(
        set(p) == {"policy.megatron_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF"} for p in env
    )


def test_nemo_rl_patches_in_its_own_log_prob_keys_and_no_device_pinning(tmp_path):
    # A skill trial on grpo_math_8B_megatron.yaml (sequence packing on, which GRPO refuses with
    # use_fused_linear_logprobs): the loss finding's patch left NeMo-RL's own lever out; its
    # chunked log-probs (policy.logprob_chunk_size, which nemo_rl/models/megatron/setup.py
    # accepts only with megatron_cfg.defer_fp32_logits) are the patch. And a
    # CUDA_VISIBLE_DEVICES for a Ray worker's env_vars would fight Ray's placement: left out.
    d = _nemo_rl_8b(tmp_path, UNLISTED_OOM, None)
    assert not get(d, "RK089").patch_keys  # its CUDA_VISIBLE_DEVICES: left out
    from recompute_kit.doctor.engine import build_context
    from recompute_kit.doctor.evidence import collect
    from recompute_kit.doctor.patches import _translate

    log = tmp_path / "said.log"
    log.write_text(SAID, encoding="utf-8")
    ctx = build_context(collect(logs=[str(log)], config=str(LAUNCH / "grpo_math_8B_megatron.yaml")))
    dropped = []
    out = _translate(
        "nemo-rl",
        {"cross_entropy_loss_fusion": True, "env": {"CUDA_VISIBLE_DEVICES": "0"}},
        ctx,
        lambda key, value, why: dropped.append(why),
    )
    assert out == {
        "policy.logprob_chunk_size": 1024,
        "policy.megatron_cfg.defer_fp32_logits": True,
    }
    assert dropped == ["NeMo-RL's Ray placement sets each worker's GPUs"]


@covers("RK360")
def test_processes_of_earlier_runs_said_alive_read_as_other_processes():
    # https://github.com/deepspeedai/DeepSpeed/issues/1016 (the reporter's words, verbatim):
    # the earlier attempts' processes held the GPU until killed
    said = (
        "I've been debugging my code to run with deepspeed, and I started noticing cuda out of "
        "memory errors. I check `nvidia-smi` and see that most of my GPU memory is still being "
        "used. I check my python processes and see a bunch of instances of my deepspeed "
        "scripts, I think for each attempt at running my script.\n\n"
        "I had to stop each one directly using `kill -9`. After that, I saw that the GPUs "
        "memory was released.\n"
    )
    f = top(run(said))
    assert f.rule == "RK360" and f.category == "other_processes"
    # a question about killing is no statement that processes linger
    asked = "Training OOMs with batch 8. Should I kill the other processes on the node?\n"
    assert all(g.rule != "RK360" for g in run(asked).findings)
    # no OOM named: the same words alone, at lower confidence
    alone = top(run(said.replace("cuda out of memory errors", "slow steps")))
    assert alone.rule == "RK360" and alone.confidence <= 0.5 and "kill PID" in alone.fix


def test_the_evidence_proposes_in_the_run_s_keys_too(tmp_path):
    # The trial: RK170's evidence proposed "--recompute-granularity selective
    # --recompute-modules mlp" (Megatron-LM's flags) while its patch was NeMo-RL's keys. Here the
    # engine is said not to share the GPUs, so the default reading is what answers.
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    log = tmp_path / "said.log"
    log.write_text(SAID, encoding="utf-8")
    config = str(LAUNCH / "grpo_math_8B_megatron.yaml")
    evidence = collect(logs=[str(log)], config=config, overrides={"inference_colocated": False})
    f = get(diagnose(evidence, 50), "RK170")
    assert "--recompute-" not in f.evidence
    assert "policy.megatron_cfg.recompute_modules: [mlp]" in f.evidence


def test_an_rl_run_s_sequence_cap_is_said_to_shorten_its_rollouts(tmp_path):
    # The trial: "policy.max_total_sequence_length 4096 -> 2048 ... truncate or drop the longest
    # samples", for a GRPO run where that key is also vLLM's max_model_len and max_new_tokens
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    log = tmp_path / "said.log"
    log.write_text(SAID, encoding="utf-8")
    config = str(LAUNCH / "grpo_math_8B_megatron.yaml")
    evidence = collect(logs=[str(log)], config=config, overrides={"inference_colocated": False})
    fix = get(diagnose(evidence, 50), "RK170").fix
    assert "policy.max_total_sequence_length 4096 -> 2048" in fix
    assert "shortens the rollouts" in fix and "truncate or drop" not in fix
