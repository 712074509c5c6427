"""Fresh real pastes of framework bugs on recompute / offload / sharding paths: threads other
than the rules' own sources and the corpus. Each test names its thread's URL and the remedy."""

from __future__ import annotations

from rule_helpers import covers, run, text, top


@covers("RK260")
def test_fx_deepspeed_configure_checkpointing_none_optimizer():
    # https://github.com/deepspeedai/DeepSpeed/issues/1499 (label bug): AttributeError in
    # deepspeed's _configure_checkpointing with partition_activations on
    f = top(run(text("fx-ds-1499-dp-process-group")))
    assert f.rule == "RK260" and f.category == "framework_bug" and "deepspeed" in f.fix


@covers("RK260")
def test_fx_neox_pipeline_engine_configure_checkpointing():
    # https://github.com/EleutherAI/gpt-neox/issues/474 (label bug): the same frame from eval
    f = top(run(text("fx-neox-474-dp-process-group-eval")))
    assert f.category == "framework_bug" and "deepspeed" in f.fix


@covers("RK420")
def test_fx_zero3_gradient_checkpointing_attribute_error_names_deepspeed():
    # https://github.com/deepspeedai/DeepSpeed/issues/7830 (label bug): ZeRO-3 +
    # gradient_checkpointing, no frames pasted: the fix names DeepSpeed, not transformers
    f = top(run(text("fx-ds-7830-z3-gc-next-functions")))
    assert f.category == "framework_bug" and "deepspeed" in f.fix
    assert f.config_patch == {"command": "pip install -U deepspeed"}


@covers("RK260")
def test_fx_deepspeed_checkpoint_traceback_cut_short():
    # https://github.com/deepspeedai/DeepSpeed/issues/1057: deepspeed checkpointing fails on
    # python 3.8; the paste ends inside the model's forward (no exception line)
    f = top(run(text("fx-ds-1057-ckpt-py38")))
    assert f.category == "framework_bug"


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


@covers("RK420")
def test_fx_regression_names_the_library_not_the_env_and_the_working_release():
    # https://github.com/deepspeedai/DeepSpeed/issues/1903 (label bug): ZeRO-3 fails on
    # deepspeed 0.6.1, "it works on deepspeed==0.5.10"; the conda env is named "trl"
    f = top(run(text("fx-ds-1903-z3-fetch-regression")))
    assert f.category == "framework_bug" and "trl" not in f.fix
    assert "deepspeed==0.5.10" in f.fix
