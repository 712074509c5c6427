"""Tests of the rules in recompute_kit/doctor/rules/nondeterminism.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import (
    cites,
    covers,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.evidence.code import scan_snippets
from recompute_kit.doctor.evidence.measured import speed_prose


@covers("RK653")
def test_r6a_rk653_compiled_gradients_differ_with_rng():
    # https://github.com/intel/torch-xpu-ops/issues/4691 (upstream pytorch#190758):
    # "Memory-budget partitioner recomputes RNG ops with fresh randomness in backward,
    # silently corrupting gradients"
    f = top(run(text("r6a-xpuops4691-compiled-grad-rng")))
    assert f.rule == "RK653" and f.category == "nondeterministic_recompute"
    assert f.config_patch["activation_memory_budget"] == 1.0
    assert "grad match: False" in f.evidence


def test_r6a_rk653_mutations():
    base = text("r6a-xpuops4691-compiled-grad-rng")
    # no random op named, nothing recomputed or compiled, or the gradients match: not this
    assert "RK653" not in ids(run(base.replace("RNG mask mismatch", "tolerance")))
    assert "RK653" not in ids(run(base.replace("compiled", "second")))
    assert "RK653" not in ids(
        run(
            base.replace("match: False", "match: True")
            .replace("differs from", "vs")
            .replace("mask mismatch", "mask")
        )
    )


@covers("RK147")
def test_fresh_cat_dropout_without_rng_restore_in_prose():
    # https://github.com/openai/guided-diffusion/issues/167: a custom checkpoint helper that
    # re-runs the forward "without restoring the RNG state"; dropout then diverges the loss.
    f = top(run(text("fa-nd-dropout-rng-guideddiff167")))
    assert f.rule == "RK147" and f.category == "nondeterministic_recompute"
    assert "preserve_rng_state=True" in f.fix and f.config_patch == {"preserve_rng_state": True}


def test_fresh_cat_rng_prose_without_dropout_is_not_rk147():
    report = "The helper re-runs the forward without restoring the RNG state."
    assert "RK147" not in ids(run(report))


@covers("RK147")
def test_fresh_rk147_preserve_rng_state_false_with_dropout():
    # https://github.com/ankanbhunia/PIDM/pull/66 (preserve_rng_state=False with dropout on:
    # a failed 300-epoch training); the PR's fix keeps the RNG state.
    f = top(run(text("fr-rng-dropout-pidm")))
    assert f.rule == "RK147" and f.category == "nondeterministic_recompute"
    assert f.config_patch == {"preserve_rng_state": True}


@covers("RK145")
def test_rk145_debug_mode_names_the_first_different_op():
    # torch.utils.checkpoint(debug=True) output, reproduced on CPU: topk only in the recompute.
    d = run(text("ckpt-local-debug-topk"))
    f = top(d)
    assert f.rule == "RK145" and f.category == "nondeterministic_recompute"
    cites(f, "aten.cos in the forward, aten.topk in the recompute", "A routing / token-count op")
    assert "router" in f.fix and "RK075" not in ids(d)
    assert "aten.topk" in f.config_patch["code"]


@covers("RK146")
def test_rk146_checkpoint_under_bf16_autocast():
    # pytorch#71124: checkpoint(b, x) inside torch.cuda.amp.autocast(dtype=torch.bfloat16).
    f = top(run(text("i13-pt-71124")))
    assert f.rule == "RK146" and f.category == "nondeterministic_recompute"
    assert "upgrade torch" in f.fix.lower() and f.config_patch["use_reentrant"] is False
    cites(f, "x = checkpoint(b, x)", "autocast(dtype=torch.bfloat16)")


def test_rk146_not_on_code_alone():
    # pytorch#71124's script without its printed output: checkpoint + bf16 autocast is how many
    # training scripts read; without dtypes printed the paste is not about the recompute's dtype.
    code = text("i13-pt-71124").split("Output dtype: torch.bfloat16")[0]
    assert "autocast(dtype=torch.bfloat16)" in code and "checkpoint(b, x)" in code
    assert "RK146" not in ids(run(code))


@covers("RK147")
def test_rk147_dropout_without_rng_state_shifts_the_loss():
    # OLMo-core PR #828: CE 2.49 with AC on vs 2.19 off, residual dropout 0.1.
    d = run(text("i13-olmocore-828"), config=text("i13-olmocore-828-config"))
    f = top(d)
    assert f.rule == "RK147" and f.category == "nondeterministic_recompute"
    assert f.config_patch == {"preserve_rng_state": True}
    cites(f, "response_residual_dropout = 0.1", "2.491", "2.194")


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


@covers("RK147")
def test_preserve_rng_state_false_without_anything_random_is_no_rng_finding():
    # https://github.com/pytorch/pytorch/issues/133550 (verbatim): a meta-device Linear under
    # checkpoint(..., preserve_rng_state=False) fails in _get_device_module; nothing random is
    # recomputed, so no RNG reading (it read "Dropout is recomputed without the RNG state")
    said = (
        "with torch.device('meta'):\n"
        "    m = torch.nn.Linear(20, 30)\n"
        "    x = torch.randn(1, 20)\n\n"
        "out = checkpoint(m, x, use_reentrant=False, preserve_rng_state=False)\n"
        "```\nleads to \n```torch/utils/checkpoint.py\", line 92, in _get_device_module\n"
        "    device_module = getattr(torch, device)\n"
        "                    ^^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "lib/python3.11/site-packages/torch/__init__.py", line 2428, in __getattr__\n'
        "    raise AttributeError(f\"module '{__name__}' has no attribute '{name}'\")\n"
        "AttributeError: module 'torch' has no attribute 'meta'\n"
    )
    assert "RK147" not in ids(run(said))
    assert "RK147" in ids(run(said.replace("nn.Linear(20, 30)", "nn.Dropout(0.1)")))
