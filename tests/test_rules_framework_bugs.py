"""Tests of the rules in recompute_kit/doctor/rules/framework_bugs.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from rule_helpers import (
    GIB,
    cites,
    covers,
    get,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.engine import Diagnosis, diagnose
from recompute_kit.doctor.evidence import (
    Evidence,
    MemoryReport,
    parse_config,
)
from recompute_kit.doctor.evidence.versions import scan_versions

# =============================================================================================
# RK080-RK090: framework bugs, and headroom
# =============================================================================================

# Megatron-LM#3221's MOE_ARGS (verbatim flags, EP resolved to 8) on a small GPT with full
# recompute, as in the issue.
MOE_FULL_RECOMPUTE = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 16 \\
    --hidden-size 2048 \\
    --num-attention-heads 16 \\
    --seq-length 4096 \\
    --micro-batch-size 1 \\
    --expert-model-parallel-size 8 \\
    --num-experts 4 \\
    --moe-token-dispatcher-type alltoall \\
    --moe-router-topk 2 \\
    --moe-aux-loss-coeff 0.02 \\
    --recompute-granularity full \\
    --recompute-method uniform \\
    --recompute-num-layers 1 \\
    --bf16
"""


# =============================================================================================
# Rules added for the scenario corpus: their inputs are the corpus's real cases
# (tests/scenarios/*.yaml, each with its source URL in the file)
# =============================================================================================

SCENARIOS = Path(__file__).parent / "scenarios"


def scenario(name: str) -> Diagnosis:
    import yaml

    case = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    return run(
        case.get("log") or "",
        config=case.get("config"),
        config_name=case.get("config_name") or "config.yaml",
        experiments=case.get("experiments"),
        gpu_memory_gb=case.get("gpu_memory_gb"),
    )


@covers("RK680")
def test_r8a_rk680_compiler_saved_tensors_reported_with_trace():
    # https://github.com/Lightning-AI/lightning-thunder/issues/1368: "Using
    # `thunder.jit(f, nv_enable_linear=True, nv_enable_matmul=True)` makes the problem go away
    # because it simplifies the task for rematerialization" (IvanYashchuk)
    f = top(run(text("r8a-thunder1368-saved-tensors")))
    assert f.rule == "RK680" and f.category == "framework_bug"
    assert f.config_patch == {"nv_enable_linear": True, "nv_enable_matmul": True}
    assert "saved_tensors)=5" in f.evidence and "rematerialization" in f.fix


def test_r8a_rk680_mutations():
    base = text("r8a-thunder1368-saved-tensors")
    # the saved-tensor report without a compiler's trace: nothing says a compiler chose it
    no_trace = "\n".join(base.splitlines()[:3])
    assert "RK680" not in ids(run(no_trace))
    # the trace without a report of what is saved
    no_report = base.replace("len(jout.grad_fn.saved_tensors)=5", "").replace(
        "Saved tensors size Thunder: 580.00 MiB", ""
    )
    assert "RK680" not in ids(run(no_report))


@covers("RK600")
def test_r8a_rk600_fsdp_checkpoint_wrapper_regression_names_manual_wrapping():
    # https://github.com/Lightning-AI/pytorch-lightning/issues/16435: "Manually configuring the
    # model sharding solves the issue" (w2ex)
    f = top(run(text("r8a-lightning16435-fsdp-wrapper")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "configure_sharded_model" in f.fix and "checkpoint_wrapper" in f.fix
    # without FSDP named, the regression's fix says nothing about wrapping
    no_fsdp = text("r8a-lightning16435-fsdp-wrapper").replace("fsdp", "ddp").replace("FSDP", "DDP")
    g = top(run(no_fsdp))
    assert g.rule == "RK600" and "configure_sharded_model" not in g.fix


@covers("RK600")
def test_r8a_rk600_release_comparison_table():
    # https://github.com/karpathy/autoresearch/pull/588: "The real bug is in PyTorch 2.9.1 ...
    # Verified fixed in PyTorch 2.11.0." (srosro): a table of releases, one OOMs, one fits
    f = top(run(text("r8a-autoresearch588-release-table")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install torch==2.11.0"
    assert "upgrade" in f.fix and "2.9.1" in f.fix
    # both rows fit: no release is the bad one, and RK600 stays out
    both_fit = text("r8a-autoresearch588-release-table").replace(
        "OOM at batch=64", "Fits at batch=64"
    )
    assert "RK600" not in ids(run(both_fit))


@covers("RK080")
def test_rk080_moe_full_recompute_memory_grows():
    # WEAK: Megatron-LM#3221 shows the growth as a memory-snapshot screenshot; no text log of
    # growing "max allocated" was found. The two reports restate its 6.6 GiB snapshot rising
    # by the freed-late activations (illustrative numbers, marked as such).
    cfg = parse_config(MOE_FULL_RECOMPUTE, "train.sh")
    reports = [
        MemoryReport(iteration=1, max_allocated_bytes=round(6.6 * GIB)),
        MemoryReport(iteration=2, max_allocated_bytes=round(7.5 * GIB)),
    ]
    f = get(diagnose(Evidence(config=cfg, memory=reports)), "RK080")
    assert f.category == "framework_bug"
    cites(f, "6.60 GiB", "7.50 GiB")
    assert f.config_patch["recompute_modules"] == ["layernorm", "moe_act"]


@covers("RK080")
def test_rk080_not_when_peak_memory_is_flat():
    # NeMo progress lines of https://github.com/NVIDIA-NeMo/Speech/issues/14850: the
    # max_memory_allocated stays 53930270720 over iterations 8-11.
    d = run(text("ex-nemo-14850"), config=MOE_FULL_RECOMPUTE, config_name="train.sh")
    assert {m.max_allocated_bytes for m in d.evidence.memory} == {53930270720}
    assert "RK080" not in ids(d)


@covers("RK083")
def test_rk083_zero3_released_parameters():
    # DeepSpeed ZeRO-3: recomputed metadata torch.Size([0]).
    d = scenario("fb_deepspeed_zero3_frozen_recompute")
    assert top(d).rule == "RK083" and "RK075" not in ids(d)


@covers("RK084")
def test_rk084_pp_offload_error_with_no_offloaded_layer():
    # Megatron-Bridge: the PP + CPU offloading ValueError with activation_offload_layers: 0.
    d = scenario("fb_mbridge_offload_zero_layers_pp")
    assert top(d).rule == "RK084" and "RK059" not in ids(d)


@covers("RK520")
def test_fx_features_work_alone_fail_together():
    # https://github.com/EleutherAI/gpt-neox/issues/62 (label bug): pipeline + checkpointing
    # + ZeRO-2 fail together, "KeyError: 0 from somewhere deep in DeepSpeed"
    f = top(run(text("fx-neox-62-pp-ckpt-zero2-keyerror")))
    assert f.rule == "RK520" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install -U deepspeed"


def test_fx_combined_prose_needs_checkpointing_and_another_feature():
    # mutation guard: one feature alone said to work is not a combination
    log = "Pipeline parallelism works individually. KeyError: 0\n"
    assert all(f.rule != "RK520" for f in run(log).findings)


@covers("RK600")
def test_fy_conv3d_oom_after_torch_upgrade_names_cudnn_and_the_working_release():
    # https://github.com/pytorch/pytorch/issues/166790 (module: regression): runs on torch
    # 2.5.1, OOMs on 2.9 in a Conv3d (a cuDNN algorithm with a ~27 GiB workspace); the
    # excerpt the search returned is the paste
    f = top(run(text("fy-pt-166790-conv3d-cudnn-workspace-after-upgrade")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install torch==2.5.1"
    assert "cudnn.benchmark" in f.fix and "2.9" in f.fix


@covers("RK600")
def test_fy_fsdp_checkpointing_worked_until_a_release():
    # https://github.com/Lightning-AI/pytorch-lightning/issues/16435 (label bug): FSDP +
    # activation checkpointing "worked fine up until 1.7.7. It stopped working from 1.8.0"
    f = top(run(text("fy-pl-16435-fsdp-ckpt-worked-until-177")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert f.config_patch["command"].endswith("==1.7.7") and "cudnn" not in f.fix


@covers("RK600")
def test_fy_memory_on_master_against_a_release():
    # https://github.com/pytorch/pytorch/issues/3610 (label bug, fixed): >11G on master, 3.5G
    # on 0.3 / 0.2, "the memory usage increases as I run more iteration"
    f = top(run(text("fy-pt-3610-master-memory-grows-per-iteration")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "==0.3" in f.config_patch["command"]


@covers("RK600")
def test_fy_host_memory_eaten_after_upgrade_env_cudnn_is_not_a_convolution():
    # https://github.com/pytorch/pytorch/issues/15774: works under 0.4.1, eats 200+G gradually
    # under 1.0.0; the environment block lists libcudnn, which names no cuDNN algorithm
    f = top(run(text("fy-pt-15774-host-memory-grows-after-upgrade")))
    assert f.rule == "RK600" and f.config_patch["command"] == "pip install torch==0.4.1"
    assert "code" not in f.config_patch


@covers("RK520")
def test_fy_fsdp_and_checkpoint_activations_together():
    # https://github.com/facebookresearch/fairseq/issues/3353 (label bug): the error comes only
    # "using --checkpoint-activations together with FSDP"; without it the error is gone
    f = top(run(text("fy-fairseq-3353-fsdp-checkpoint-activations")))
    assert f.rule == "RK520" and f.category == "framework_bug"
    assert f.config_patch["gradient_checkpointing"] is False


def test_fy_one_release_named_is_not_a_regression():
    # mutation guards: a single release, or the same release on both sides, is no regression
    assert "release_regression" not in scan_versions("It works fine on torch 2.1.\n")
    said = "It works fine on torch 2.1 but OOMs on torch 2.1 with batch 64.\n"
    assert "release_regression" not in scan_versions(said)
    assert "together_prose" not in scan_versions("FSDP works. Checkpointing works.\n")


@covers("RK460")
def test_fresh_cat_backward_twice_in_a_compiled_backward():
    # https://github.com/unslothai/unsloth/issues/3543 (labelled "fixed - pending
    # confirmation"; the maintainers' remedy in the same bug, unsloth#3592: upgrade unsloth and
    # unsloth_zoo). The error is raised in _aot_autograd's backward, no user checkpoint call.
    f = top(run(text("fa-fb-unsloth-backward-twice-3543")))
    assert f.rule == "RK460" and f.category == "framework_bug"
    assert "unsloth" in f.fix and "RK093" not in ids(run(text("fa-fb-unsloth-backward-twice-3543")))


# ---- a release that worked and the next that fails --------------------------------------------


@covers("RK600")
def test_fresh_cjk_oom_after_updating_to_the_next_release():
    # https://github.com/open-mmlab/mmocr/issues/541: "我之前使用的是0.2.0版本 ... 昨天更新到0.3.0
    # 版本后 ... 在测试时报错 : RuntimeError: CUDA out of memory" (0.2.0 worked; after updating
    # to 0.3.0 the test OOMs, the code unchanged). Before: RK102 (genuine pressure).
    f = top(run(text("fh-mmocr-541-oom-after-update")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "0.2.0" in f.fix and "0.3.0" in f.evidence
    assert f.config_patch == {"command": "pip install <the library>==0.2.0"}


# =============================================================================================
# RK083 / RK075: recomputed tensors differ from the forward's
# =============================================================================================


@covers("RK083")
def test_fresh_rk083_zero3_lora_dpo_command_and_empty_shapes():
    # https://github.com/OpenRLHF/OpenRLHF/issues/569: --zero_stage 3 --lora_rank 32
    # --gradient_checkpointing; recomputed metadata torch.Size([0]) (ZeRO-3 released params).
    f = top(run(text("fr-zero3-metadata-openrlhf")))
    assert f.rule == "RK083" and f.category == "framework_bug"
    assert "use_reentrant=True" in f.fix or "deepspeed.checkpointing" in f.fix


@covers("RK083")
def test_fresh_rk083_zero3_linear_frames():
    # https://github.com/OpenBMB/MiniCPM-V/issues/651: deepspeed/runtime/zero/linear.py frames,
    # torch.Size([0]) recomputed.
    f = top(run(text("fr-zero3-metadata-minicpmv")))
    assert f.rule == "RK083" and f.category == "framework_bug"


@covers("RK103")
def test_rk103_type_error_in_megatrons_mlp_recompute():
    f = top(run(text("i12-megatron-2754")))
    assert f.rule == "RK103" and f.category == "framework_bug"
    assert "padding_mask" in f.evidence and "Upgrade" in f.fix
    assert f.config_patch["recompute_modules"] == ["core_attn"]


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


# ---- widened existing rules (issue 13) ------------------------------------------------------


def test_rk083_zero3_shape_zero_in_a_shortened_paste():
    # transformers#47254: "saved {'shape': [1024]} vs recomputed {'shape': [0]}".
    d = run(text("i13-hf-47254"))
    f = top(d)
    assert f.rule == "RK083" and f.category == "framework_bug" and "RK075" not in ids(d)
    cites(f, "[1024]")


@covers("RK690")
def test_r10a_ckpt_call_passes_rotary_where_inference_params_go():
    # https://github.com/NVIDIA/Megatron-LM/pull/355: "The variable `rotary_pos_emb` is passed
    # as `inference_params` by mistake" (full recompute path)
    d = run(text("r10a-megatron355-ckpt-arg-slot"))
    f = top(d)
    assert f.rule == "RK690" and f.category == "framework_bug"
    assert "rotary_pos_emb" in f.fix and "inference_params" in f.evidence
    assert "upgrade" in f.fix
    assert f.config_patch["code"].startswith("checkpoint(")


def test_r10a_ckpt_call_in_forward_order_is_silent():
    paste = text("r10a-megatron355-ckpt-arg-slot")
    fixed = paste.replace(
        "enc_dec_attn_mask, rotary_pos_emb)", "enc_dec_attn_mask, None, rotary_pos_emb)"
    )
    assert "RK690" not in ids(run(fixed))


def test_r10a_upgrade_from_to_reads_as_regression():
    # https://github.com/deepspeedai/DeepSpeed/issues/7116: "after upgrading deepspeed from
    # 0.15.0 to 0.16.0, my ppo demo encounters OOM" (a commit in between, bisected)
    d = run(text("r10a-deepspeed7116-upgrade-from-to"))
    f = top(d)
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "pip install deepspeed==0.15.0" in f.fix
    assert f.config_patch["command"] == "pip install deepspeed==0.15.0"
    # no failure said: no regression
    calm = text("r10a-deepspeed7116-upgrade-from-to").replace("encounters OOM", "runs")
    assert "RK600" not in ids(run(calm))


def test_a_release_on_a_warnings_timeline_is_not_the_installed_one():
    # PyTorch's own warning (reproduced with torch 2.13, tests/data/rules/
    # ckpt-local-use-reentrant-missing.txt) names "PyTorch 2.9" as the release that will raise:
    # not the user's version, which would make a known problem's fixed_in decide wrongly
    warning = text("ckpt-local-use-reentrant-missing")
    assert "versions_said" not in scan_versions(warning)
    assert scan_versions(warning + "\nI am on torch 2.3.1\n")["versions_said"] == {"torch": "2.3.1"}


@covers("RK083")
def test_rk083_reads_the_metadata_lines_of_a_paste_cut_after_the_error_line():
    # https://github.com/deepspeedai/DeepSpeed/pull/8148 (ZeRO-3 with activation checkpointing
    # and frozen parameters): the paste starts at the per-tensor metadata lines, the
    # CheckpointError line cut off; the empty recomputed shapes still name the mechanism
    d = run(text("ds-8148-zero3-empty-recompute-header-cut"))
    f = top(d)
    assert f.rule == "RK083" and f.category == "framework_bug"
    cites(f, "shape [0] where the forward saved [128]")


@pytest.mark.parametrize(
    "said, good, bad",
    [
        # https://github.com/huggingface/transformers/issues/29484 (the reporter's words)
        (
            "I noticed that using transformers version 4.38.2 results in an error: "
            "torch.cuda.OutOfMemoryError: CUDA out of memory. However, simply downgrading "
            "transformers to version 4.37.2 resolves this issue.",
            "4.37.2",
            "4.38.2",
        ),
        ("OOM after upgrading to torch 2.5. Rolling back to torch 2.4.1 fixed it.", "2.4.1", "2.5"),
    ],
)
def test_going_back_to_a_release_that_works_is_a_regression(said, good, bad):
    _, got_good, got_bad, _ = scan_versions(said)["release_regression"]
    assert (got_good, got_bad) == (good, bad)
    # a downgrade that does not help names no release that works
    assert "release_regression" not in scan_versions(
        "downgrading transformers to 4.37.2 did not change anything; it still runs out of memory"
    )
