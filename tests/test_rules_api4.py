"""What a compiler saves for backward (RK680), a compiled backward keeping its inputs alive
through the recomputation (RK681), and the FSDP + checkpoint-wrapper workaround in a release
regression (RK600). Verbatim real pastes (the dev corpus cases' artefacts), URLs quoted."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top


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


@covers("RK681")
def test_r8a_rk681_compiled_backward_trace():
    # https://github.com/Lightning-AI/lightning-thunder/issues/1379: "When recomputation is
    # enabled, the earlier part of the backward trace is just recomputing and then post that we
    # use the gradient from loss function (so it gets used later and deleted later" (kshitij12345)
    f = top(run(text("r8a-thunder1379-backward-trace")))
    assert f.rule == "RK681" and f.category == "recompute_no_effect"
    assert f.config_patch == {"enable_saved_for_backward_recomputation": True}
    assert "backward_fn(saved_for_backward, cotangents)" in f.evidence


def test_r8a_rk681_mutations():
    base = text("r8a-thunder1379-backward-trace")
    # a forward function's signature is no compiled backward
    fwd = base.replace("def backward_fn(saved_for_backward, cotangents):", "def forward_fn(a):")
    assert "RK681" not in ids(run(fwd))
    # a traceback pasted with it: the error is what to read
    err = base + "RuntimeError: expected scalar type Float but found Half\n"
    assert "RK681" not in ids(run(err))


@covers("RK600")
def test_r8a_rk600_fsdp_checkpoint_wrapper_regression_names_manual_wrapping():
    # https://github.com/Lightning-AI/pytorch-lightning/issues/16435: "Manually configuring the
    # model sharding solves the issue" (w2ex)
    f = top(run(text("r8a-lightning16435-fsdp-wrapper")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "configure_sharded_model" in f.fix and "checkpoint_wrapper" in f.fix
    # without FSDP named, the regression's fix says nothing about wrapping
    no_fsdp = text("r8a-lightning16435-fsdp-wrapper").replace("fsdp", "ddp").replace(
        "FSDP", "DDP"
    )
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
