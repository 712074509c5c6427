"""A library rejecting the caller's input (RK650) told from a library bug (RK420's default
reading): a ValueError / AssertionError raised right at the call, with a message about a limit
the argument breaks. Verbatim real pastes (the dev corpus cases' artefacts), URLs quoted."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top


@covers("RK650")
def test_r6a_rk650_checkpoint_sequential_segments_over_functions():
    # https://github.com/pytorch/pytorch/issues/152752: "When incorrectly specifying segments
    # to be greater than number of functions, the error message is not clear"
    f = top(run(text("r6a-pt152752-ckpt-seq-segments")))
    assert f.rule == "RK650" and f.category == "invalid_config"
    assert f.config_patch == {"segments": "len(functions)"}
    assert "checkpoint_sequential" in f.evidence


@covers("RK650")
def test_r6a_rk650_sample_over_max_tokens_limit():
    # https://github.com/facebookresearch/fairseq/issues/1191: "it means that sentence is too
    # long ... cut the sentence, increase max tokens, or skip it" (huihuifan); the paste's
    # "otherwise it gives CUDA oom error" is no OOM to read
    f = top(run(text("r6a-fairseq1191-max-tokens")))
    assert f.rule == "RK650" and f.category == "invalid_config"
    assert "--max-tokens" in f.config_patch["command"] and "max_tokens" in f.config_patch
    assert "skip" in f.fix


def test_r6a_rk650_mutations():
    # a library's own broken invariant, raised deep inside it, or in the script's own frames is
    # no rejected input: RK650 stays out and RK420's default reading (a bug) answers
    base = text("r6a-pt152752-ckpt-seq-segments")
    internal = base.replace("must not be zero", "INTERNAL ASSERT FAILED at checkpoint.cpp")
    assert "RK650" not in ids(run(internal))
    deep = base.replace(
        "\nValueError:",
        '\n  File "/x/site-packages/torch/utils/_helpers.py", line 9, in split\n'
        "    raise ValueError\nValueError:",
    )
    assert "RK650" not in ids(run(deep)) and top(run(deep)).rule == "RK420"
    own = base.replace("site-packages/torch/utils/checkpoint.py", "myproj/ckpt_utils.py")
    assert "RK650" not in ids(run(own))
    worded = text("r6a-fairseq1191-max-tokens").replace("exceeds max_tokens limit", "is broken")
    assert "RK650" not in ids(run(worded))
    keyed = text("r6a-fairseq1191-max-tokens").replace("AssertionError", "KeyError")
    assert "RK650" not in ids(run(keyed))


@covers("RK651")
def test_r6a_rk651_reentrant_checkpoint_inputs_without_requires_grad():
    # https://github.com/pytorch/pytorch/issues/7617: "if the all the inputs have requires_grad
    # to be False, the output will also checkpoint(...) will also have requires_grad to be
    # False" (ruotianluo; the checkpoint author states the same limit in #6884)
    f = top(run(text("r6a-pt7617-ckpt-inputs-no-grad")))
    assert f.rule == "RK651" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"use_reentrant": False}
    assert "x = torch.randn(10,4)" in f.evidence and "requires_grad_()" in f.fix


def test_r6a_rk651_mutations():
    base = text("r6a-pt7617-ckpt-inputs-no-grad")
    # the input requires grad, the call is non-reentrant, or nothing looks at the gradient
    assert "RK651" not in ids(
        run(base.replace("torch.randn(10,4)", "torch.randn(10,4, requires_grad=True)"))
    )
    assert "RK651" not in ids(run(base.replace("m(_), x)", "m(_), x, use_reentrant=False)")))
    assert "RK651" not in ids(run(base.replace(".requires_grad)", ".shape)")))
    # a traceback in the paste: the failure is what to read, not this
    failing = (
        base
        + "\nTraceback (most recent call last):\nRuntimeError: CUDA error: device-side assert\n"
    )
    assert "RK651" not in ids(run(failing))


@covers("RK652")
def test_r6a_rk652_trainer_resets_model_gc_kwargs():
    # https://github.com/huggingface/transformers/issues/26221: pacman100: "You were correctly
    # setting model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=...) but the
    # Trainer was resetting it because of trainingArgument gradient_checkpointing". The paste
    # is the reporter's diff: its old version ("-" and unmarked lines) is what failed.
    d = run(text("r6a-hf26221-trainer-resets-gc-kwargs"))
    f = top(d)
    assert f.rule == "RK652" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    assert "gradient_checkpointing=cp_enabled" in f.evidence


def test_r6a_rk652_mutations():
    base = text("r6a-hf26221-trainer-resets-gc-kwargs")
    # the trainer gets the kwargs too (the diff applied: "+" lines kept), or checkpointing is
    # off in the trainer's arguments: nothing is overridden
    applied = base.replace("\n+", "\n ").replace("\n-", "\n#")
    assert "RK652" not in ids(run(applied))
    off = base.replace("gradient_checkpointing=cp_enabled,", "gradient_checkpointing=False,")
    assert "RK652" not in ids(run(off))
    no_kwargs = base.replace("gradient_checkpointing_enable(gradient_checkpointing_kwargs=", "x(")
    assert "RK652" not in ids(run(no_kwargs))


def test_r6a_rk650_rejections_pasted_without_their_exception_head():
    # the same pastes with "ValueError: " / "AssertionError: " cut: the call's frames, or the
    # assert line followed by the message it prints, still say the input was rejected
    seq = text("r6a-pt152752-ckpt-seq-segments").replace("ValueError: ", "")
    assert top(run(seq)).rule == "RK650"
    fairseq = text("r6a-fairseq1191-max-tokens").replace("AssertionError: ", "")
    f = top(run(fairseq))
    assert f.rule == "RK650" and f.category == "invalid_config"
    # an assert whose message is not the line after it is no failure
    other = fairseq.replace("sentence at index 25683144 exceeds", "a line of prose about")
    assert "RK650" not in ids(run(other))


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
