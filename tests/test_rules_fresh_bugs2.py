"""Fresh real pastes of framework bugs, second round: memory that grows step after step (a leak
fixed upstream), a release that worked and the next that fails or takes more memory, features
that fail only together. Each test names its thread's URL and the remedy."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.versions import scan_versions


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


@covers("RK266")
def test_fy_leak_with_a_library_version_names_the_upgrade():
    # https://github.com/pytorch/pytorch/issues/3824 (label bug): "Memory keeps growing at every
    # iteration" with double backward; fixed in PyTorch (PR #3970)
    f = top(run(text("fy-pt-3824-double-backward-memory-grows")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install -U torch" and "loss.item" not in f.fix


@covers("RK266")
def test_fy_leak_with_checkpointing_names_reference_cycle_not_loss_item():
    # https://github.com/QuantumLab-ZY/HamGNN/issues/105 (fixed): memory steadily increases
    # with use_gradient_checkpointing, a reference cycle through torch.utils.checkpoint
    f = top(run(text("fy-hamgnn-105-ckpt-cyclic-reference-leak")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "reference cycle" in f.fix and "Upgrade" in f.fix


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
