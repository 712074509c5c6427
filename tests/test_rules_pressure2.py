"""Host (CPU) RAM against GPU memory, and activation / logits memory said in words: the OS or
the user names the machine's memory (RK660: GPU advice would not help), a selective-recompute
run is said to exhaust memory (RK661: recompute whole layers), a loss buffer of vocabulary
size is materialised (RK262). Every text is a dev corpus case's paste, verbatim."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

from recompute_kit.doctor.evidence.signals import scan_signals


@covers("RK660")
def test_r8p_rk660_rollout_workers_exhaust_host_ram():
    # https://github.com/verl-project/verl/issues/224: "realize that 96GB momery is too small.
    # I add it to 1TB and everything is OK" (8 Ray rollout workers x 11 GB of host memory)
    f = top(run(text("r8p-verl224-rollout-host-ram")))
    assert f.rule == "RK660" and f.category == "genuine_pressure"
    assert "8 processes" in f.evidence and "89 GB together" in f.evidence
    assert "host RAM" in f.fix and "112 GB" in f.fix  # 89 GB x 1.25
    assert "RK170" not in ids(run(text("r8p-verl224-rollout-host-ram")))


@covers("RK660")
def test_r8p_rk660_not_for_a_cuda_oom_that_mentions_cpu_memory():
    # the same paste with a CUDA OOM line: the GPU ran out, host words do not decide it
    log = text("r8p-verl224-rollout-host-ram") + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 720.00 MiB.\n"
    )
    assert "RK660" not in ids(run(log))


def test_r8p_host_signals_read_kills_and_words_not_gpu_sizes():
    facts = scan_signals(
        [
            "DataLoader worker (pid 4242) is killed by signal: Killed.",
            "Killed",
            "a single A100 with 80GB memory",
            "系统内存不足",
        ]
    )
    assert len(facts["host_kill_lines"]) == 2
    assert facts["host_memory_lines"] == ["系统内存不足"]


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


@covers("RK262")
def test_r8p_rk262_fp32_vocabulary_sized_loss_buffer():
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5508: "The native loss path creates
    # an approximately 3.79 GiB FP32 buffer for a `[4096, 1, 248320]` tensor"
    f = top(run(text("r8p-mbridge5508-fp32-ce-buffer")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "vocabulary-sized buffer" in f.evidence and "fused cross entropy" in f.fix


@covers("RK260")
def test_r8p_rk260_traceback_cut_before_an_oom_said_in_words_is_no_library_bug():
    # https://github.com/huggingface/trl/issues/3436: the traceback is cut before its
    # exception line inside FSDP's unshard, and the user says "...load the model and OOM";
    # maintainer: "this is a genuine CUDA OOM ... not a TRL bug"
    d = run(text("r8p-trl3436-unshard-oom-cut"))
    assert "RK260" not in ids(d)
    assert top(d).category != "framework_bug"
