"""A fourth unbiased sample's dev misses, read as phenomena: torch.compile's memory budget set
below 1 with the run said to be slow (RK700), a CheckpointError whose tensors changed as only
another kernel backend changes them (RK701), a reentrant checkpoint's output stored where its
run function reaches it (RK702). Every text is a dev corpus case's paste, verbatim."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text

from recompute_kit.doctor.evidence.code import scan_snippets
from recompute_kit.doctor.evidence.measured import speed_prose


@covers("RK700")
def test_r10b_rk700_memory_budget_below_one_and_slow():
    # https://github.com/pytorch/pytorch/issues/149258: activation_memory_budget = 0.99 and
    # "selective activation checkpointing is not optimal for speed"; the maintainer: the
    # partitioner's choice under a budget < 1 is by design
    d = run(text("r10b-pt149258-memory-budget-speed"))
    f = d.findings[0]
    assert f.rule == "RK700" and f.category == "recompute_overhead"
    assert "0.99" in f.evidence and "not optimal for speed" in f.evidence
    assert f.config_patch == {"activation_memory_budget": 1.0}
    assert "activation_memory_budget from 0.99 to 1" in f.fix


@covers("RK700")
def test_r10b_rk700_needs_the_speed_complaint_and_a_low_budget_goes_halfway():
    code = text("r10b-pt149258-memory-budget-speed")
    no_speed = code.replace("is not optimal for speed", "uses the budget")
    assert "RK700" not in ids(run(no_speed))
    low = code.replace("activation_memory_budget = 0.99", "activation_memory_budget = 0.5")
    f = next(x for x in run(low).findings if x.rule == "RK700")
    assert f.config_patch == {"activation_memory_budget": 0.75}


def test_r10b_speed_prose_skips_code():
    lines = ["x = slow_down(y)", "def slower(x):", "Training is 2x slower with the budget."]
    assert speed_prose(lines) == ["Training is 2x slower with the budget."]


@covers("RK701")
def test_r10b_rk701_cudnn_attention_recomputed_with_another_backend():
    # https://github.com/NVIDIA-NeMo/RL/pull/1676: [16, 4, 448, 1] saved vs [16, 4, 448]
    # recomputed, int64 scalars vs uint64; "the CUDNN_ATTENTION sdpa implementation was being
    # selected and activation_checkpointing was enabled"
    d = run(text("r10b-nemorl1676-cudnn-attention-metadata"))
    f = d.findings[0]
    assert f.rule == "RK701" and f.category == "nondeterministic_recompute"
    assert "[16, 4, 448, 1] saved, [16, 4, 448] recomputed" in f.evidence
    assert "int64 saved, uint64 recomputed" in f.evidence
    assert "CUDNN_ATTENTION" in f.fix and "activation_checkpointing" in f.fix
    assert "RK075" not in ids(d)  # superseded: autocast does not change integer dtypes


@covers("RK701")
def test_r10b_rk701_not_for_float_dtypes_or_leading_dimension():
    # the same error with a float dtype change (autocast) and a token-count change (routing)
    log = (
        text("r10b-nemorl1676-cudnn-attention-metadata")
        .replace("torch.Size([16, 4, 448, 1])", "torch.Size([17, 4, 448])")
        .replace("torch.int64", "torch.bfloat16")
        .replace("torch.uint64", "torch.float32")
    )
    assert "RK701" not in ids(run(log))


@covers("RK702")
def test_r10b_rk702_reentrant_output_stored_in_captured_dict():
    # https://github.com/pytorch/pytorch/issues/84413: run_function captures `data`, and
    # data['x'] = checkpoint's output; "with gc.collect is ok ... only a cyclic reference"
    d = run(text("r10b-pt84413-reentrant-output-cycle"))
    f = d.findings[0]
    assert f.rule == "RK702" and f.category == "checkpoint_api_misuse"
    assert "'data'" in f.evidence and "data['x'] = x" in f.evidence
    assert f.config_patch == {"use_reentrant": False}
    assert "use_reentrant=False" in f.fix and "gc.collect()" in f.fix


@covers("RK702")
def test_r10b_rk702_bound_method_and_non_reentrant():
    code = "\n".join(
        [
            "class Block(nn.Module):",
            "    def forward(self, x):",
            "        y = checkpoint(self.inner, x, use_reentrant=True)",
            "        self.last = y",
            "        return y",
        ]
    )
    assert scan_snippets(code)["ckpt_output_cycle"][2] == "self"
    assert "ckpt_output_cycle" not in scan_snippets(code.replace("=True", "=False"))
    # the output not stored where the function reaches it: no cycle
    src = text("r10b-pt84413-reentrant-output-cycle")
    assert "RK702" not in ids(run(src.replace("data # let", "pass # let")))


@covers("RK702")
def test_r10b_rk702_reads_a_paste_with_its_indentation_lost():
    # the same paste with whitespace collapsed (tests/test_doctor_robustness.py's h_collapsed):
    # the closure's body runs to its return
    flat = "\n".join(
        " ".join(line.split()) for line in text("r10b-pt84413-reentrant-output-cycle").splitlines()
    )
    assert scan_snippets(flat)["ckpt_output_cycle"][2] == "data"
