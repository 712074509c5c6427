"""Fresh real pastes (second round) for model states, genuine memory pressure and single
allocations larger than the device. Each test names its thread's URL and the remedy its
maintainers (or the thread) gave."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.signals import scan_signals


@covers("RK500")
def test_fresh_rk500_llama7b_full_without_peft_on_a100_80g():
    # https://github.com/meta-llama/llama-cookbook/issues/413: "finetune the llama-7b model
    # without any PEFT and Quantization" on one A100-SXM4-80GB -> CUDA OOM; 6.7B x 16 bytes of
    # mixed-precision Adam states exceed 80 GB (remedy: FSDP over several GPUs / PEFT).
    f = top(run(text("fq-cookbook413-llama7b-full-a100-80g")))
    assert f.rule == "RK500" and f.category == "model_state_memory"
    assert "offload_optimizer" in f.config_patch["zero_optimization"]
    assert "ZeRO-3 / FSDP" in f.fix and "LoRA" in f.fix


def test_fresh_negated_adapters_are_not_a_way_of_keeping_states():
    # "without any PEFT and Quantization" (llama-cookbook#413) says full fine-tuning
    said = scan_signals(["finetune the llama-7b model without any PEFT and Quantization on X"])
    assert "not_full_training" not in said
    # named without a negation it still is one, and a later clause still counts
    assert "not_full_training" in scan_signals(["finetune llama-7b with PEFT and Quantization"])
    assert "not_full_training" in scan_signals(["no OOM before, then I added LoRA adapters"])
    assert "not_full_training" in scan_signals(["without packing, we use QLoRA"])


def test_fresh_negated_adapters_mutation_guard():
    # Mutation guard: the same paste saying it uses PEFT is no model-states reading.
    pasted = text("fq-cookbook413-llama7b-full-a100-80g").replace("without any PEFT", "with PEFT")
    assert top(run(pasted)).rule != "RK500"


@covers("RK004")
def test_fresh_rk004_305gib_input_on_a_15gib_gpu():
    # https://github.com/kyegomez/LongNet/issues/19: torch.randn((batch_size, seq_len,
    # d_model)) asks for 305.18 GiB on a 14.75 GiB GPU: one tensor larger than the device; the
    # remedy is a smaller seq_len / batch_size.
    f = top(run(text("fq-longnet19-305gib-seq-len")))
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"
    assert "sequence length" in f.fix and "batch size" in f.fix


@covers("RK005")
def test_fresh_rk005_a40_protein_inference_genuine_pressure():
    # https://github.com/lujiarui/Str2Str/issues/4: 4.19 GiB asked with 4.20 GiB free on a
    # 44.40 GiB A40, 39.85 GiB allocated by PyTorch, 40.98 MiB cached: the job needs more than
    # the GPU has; the maintainer: lower precision (fp16) or a smaller batch size.
    f = top(run(text("fq-str2str4-a40-protein-525")))
    assert f.rule == "RK005" and f.category == "genuine_pressure"
    assert "batch size" in f.fix
