"""Precision guards, second audit: the rules added or changed in the same day each claim only
what the paste shows. Every input is a real paste from tests/data/rules (sources in
`SOURCES`); each test was run against the rule as it was before the audit (the mutation: the
old code) and fails there.
"""

from __future__ import annotations

from rule_helpers import covers, get, ids, run, text, top


# RK660: 内存 is said loosely of a GPU's memory too. On a line that names the GPU ("3*V100
# （16G）") with no host word or host size beside it, it is not the host's RAM.
@covers("RK660")
def test_rk660_not_for_neimem_on_a_line_that_names_the_gpu():
    # https://github.com/baichuan-inc/Baichuan2/issues/162:
    # "使用lora微调baichuan2-7b-base，3*V100（16G），还是OOM？到底需要多少内存"
    log = text("fk-baichuan2-162-lora-3xv100-16g")
    assert "3*V100（16G）" in log and "内存" in log
    assert "RK660" not in ids(run(log))
    # a host size beside the GPU still reads as host RAM:
    # https://github.com/verl-project/verl/issues/224 ("8*A800 80g and 96g memory and got OOM")
    assert top(run(text("r8p-verl224-rollout-host-ram"))).rule == "RK660"


# RK660: a host memory reading ("CPU RSS: 592.20 MB, VMS: 5.79 GB") is not a shortage.
@covers("RK660")
def test_rk660_not_for_a_host_memory_reading():
    # https://github.com/pytorch/pytorch/issues/166790: a Conv3d OOM on a 24 GiB GPU after an
    # upgrade; the script logs its CPU RSS, which never runs out
    log = text("fy-pt-166790-conv3d-cudnn-workspace-after-upgrade")
    assert "CPU RSS: 592.20 MB, VMS: 5.79 GB" in log
    d = run(log)
    assert "RK660" not in ids(d)
    assert top(d).rule == "RK600"


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


# RK101: a launch command with no GPU, no GPU count and no OOM: no "over 1 GPU(s)" plan (a
# count the paste does not give) and no full confidence.
@covers("RK101")
def test_rk101_no_gpu_count_invented():
    # https://github.com/hiyouga/LlamaFactory/issues/2379: the command alone (Mixtral 8x7B LoRA)
    f = get(run(text("i13-llamafactory-2379")), "RK101")
    assert "1 GPU(s)" not in f.evidence and "GPU count not in the paste" in f.evidence
    assert f.confidence <= 0.6 and "if the run uses one" in f.evidence
    # the same model with the count given keeps its numbers
    # https://github.com/OpenRLHF/OpenRLHF/issues/698 ("deepspeed --num_gpus 1", an 80 GB A100)
    g = get(run(text("fd-openrlhf-698-adam-offload")), "RK101")
    assert "on 1 GPU(s)" in g.evidence and g.raw_confidence == 0.9


# RK650: the allowed values a message lists are values, not the caller's arguments.
@covers("RK650")
def test_rk650_names_only_the_argument_not_the_allowed_values():
    # Megatron-Core's recompute_modules validation: https://github.com/NVIDIA/Megatron-LM/blob/
    # d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py
    f = get(run(text("tc-measured-selective-bad-module")), "RK650")
    said = f.evidence.split(" is raised about ", 1)[1]
    assert said.startswith("recompute_modules:")
    assert "mla_up_proj" not in said and "shared_experts" not in said
