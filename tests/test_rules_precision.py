"""Precision guards: a finding claims only what the paste shows (the framework, the setting,
the numbers, the frame). Each test feeds a real paste from tests/data/rules (sources in
`SOURCES`) and pins what the finding must not assert, next to a paste where it may. Each was
checked against the rule as it was before the audit (the mutation: the old code), and fails
there.
"""

from __future__ import annotations

from rule_helpers import covers, get, ids, run, text, top


# RK083: an empty recomputed tensor is what a ZeRO-3 shard looks like, but the paste must say
# the run shards parameters before the finding says so.
@covers("RK083")
def test_rk083_names_zero3_only_when_the_paste_does():
    # https://github.com/huggingface/transformers/issues/47254: the CheckpointError alone,
    # "saved {'shape': [1024]} vs recomputed {'shape': [0]}", nothing names DeepSpeed / ZeRO
    f = get(run(text("i13-hf-47254")), "RK083")
    assert f.category == "framework_bug" and "[1024]" in f.evidence
    assert "if the run shards parameters" in f.evidence and f.confidence < 0.9
    assert "does not name the framework" in f.evidence
    assert "ZeRO-3" not in f.title.split("(")[0]  # the title hedges: "(ZeRO-3)" as the example
    # with DeepSpeed ZeRO's frames in the paste it names them, at full confidence
    g = get(run(text("fr-zero3-metadata-minicpmv")), "RK083")
    assert g.raw_confidence == 0.9 and "'deepspeed'" in g.evidence
    # with zero_stage 3 in the pasted launch command
    h = get(run(text("fr-zero3-metadata-openrlhf")), "RK083")
    assert h.raw_confidence == 0.9 and "ZeRO stage 3" in h.evidence


# RK001: "enough free memory exists, but in pieces" is false when the reserved-but-unallocated
# memory is smaller than the request.
@covers("RK001")
def test_rk001_no_enough_memory_claim_when_slack_is_below_the_request():
    # https://github.com/OPIXray-author/OPIXray/issues/5: 264 MiB requested, 1.02 GiB reserved
    # - 788.51 MiB allocated = 255.97 MiB cached, less than the request
    d = run(text("fa-prec-opixray-5-slack-below-request"))
    f = get(d, "RK001")
    assert "enough free memory exists" not in f.evidence
    assert "255.97 MiB" in f.evidence and "less than the failed request of 264.00 MiB" in f.evidence
    assert f.confidence <= 0.25 and top(d).rule != "RK001"
    # slack above the request still reads as fragmentation
    # https://github.com/NVIDIA/Megatron-LM/issues/60: 9.10 GiB cached against 2.29 GiB
    g = get(run(text("mlm-60")), "RK001")
    assert "enough free memory exists" in g.evidence and g.raw_confidence == 0.9


# RK003: "this process has 17179869184.00 GiB memory in use" (2**64 bytes) on an 8 GiB GPU is a
# counter the driver could not read, not 17 billion GiB outside PyTorch's allocator.
@covers("RK003")
def test_rk003_ignores_a_process_total_above_the_gpu():
    # https://github.com/linkedin/Liger-Kernel/pull/47
    log = text("fz-liger-47-ce-oom-test")
    assert "this process has 17179869184.00 GiB memory in use" in log
    d = run(log)
    assert "RK003" not in ids(d)
    assert not any("17179869" in f.evidence for f in d.findings)
    # a credible process total still reads as memory outside the allocator
    # https://github.com/Synthintel0/MyGirlGPT/issues/11 (a 4 GiB GPU)
    assert "RK003" in ids(run(text("fo-mygirlgpt-11-non-pytorch-4gb")))


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


# RK260: resume_from_checkpoint=checkpoint (a saved model) is not activation checkpointing.
@covers("RK260")
def test_rk260_model_checkpoint_words_are_not_activation_checkpointing():
    # https://github.com/huggingface/transformers/issues/26377: the innermost frames are the
    # Trainer's train(); the only "checkpoint" in them is resume_from_checkpoint=checkpoint
    log = text("fn-noreqgrad-hf26377")
    assert "trainer.train(resume_from_checkpoint=checkpoint)" in log
    d = run(log)
    assert "RK260" not in ids(d) and top(d).rule == "RK071"
    # a frame of DeepSpeed's activation checkpointing still counts
    # https://github.com/deepspeedai/DeepSpeed/issues/1057
    f = get(run(text("fx-ds-1057-ckpt-py38")), "RK260")
    assert "activation checkpointing / recompute path" in f.evidence


# RK266: growth tied to a library release names the checkpoint as the holder only where the
# paste has checkpointing in it.
@covers("RK266")
def test_rk266_names_the_checkpoint_only_where_it_is_in_play():
    # https://github.com/pytorch/pytorch/issues/3824: double backward (create_graph=True), no
    # checkpointing anywhere in the paste
    log = text("fy-pt-3824-double-backward-memory-grows")
    assert "checkpoint" not in log.lower()
    f = get(run(log), "RK266")
    assert "checkpoint" not in f.evidence.lower() and "checkpoint" not in f.fix.lower()
    assert "0.4.0a0+4d405a4" in f.evidence
    # https://github.com/QuantumLab-ZY/HamGNN/issues/105: use_gradient_checkpointing = True
    g = get(run(text("fy-hamgnn-105-ckpt-cyclic-reference-leak")), "RK266")
    assert "checkpoint" in g.evidence


# RK230: a time column moves the other way from throughput: 557 -> 1458 ms is not "time -61.8%".
@covers("RK230")
def test_rk230_time_column_reads_as_time_up():
    # https://github.com/cybertronai/gradient-checkpointing/issues/55: iteration time (ms)
    f = get(run(text("fz-gradckpt-55-speed-mode")), "RK230")
    assert "time -61.8%" not in f.evidence
    assert "time +161.7%" in f.evidence and "throughput -61.8%" in f.evidence


# RK089: fires from 25% of the GPU held elsewhere; its title must not say "most".
@covers("RK089")
def test_rk089_title_matches_its_threshold():
    # https://github.com/xinge008/Cylinder3D/issues/109: 4.12 GiB (28%) of 14.76 GiB
    f = get(run(text("fd-cylinder3d-109-backward")), "RK089")
    assert "(28%)" in f.evidence
    assert not f.title.lower().startswith("most")
