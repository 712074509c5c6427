"""Tests of the rules in recompute_kit/doctor/rules/defaults.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import (
    covers,
    get,
    ids,
    run,
    text,
    top,
)


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


def test_nothing_known_asks_for_more_evidence():
    # a paste with no failure in it has no finding, and the doctor says what to collect next
    d = run("nothing failed here\n")
    assert d.findings == []
    assert d.summary.startswith("No known pattern.")
    # oom-pt-16417-title (9.28 GiB free yet OOM, a driver issue) gets a low-confidence default
    # reading instead of nothing
    low = run(text("oom-pt-16417-title"))
    assert low.summary.startswith("RK421 ") and low.findings[0].confidence <= 0.25


@covers("RK420")
def test_fx_zero3_gradient_checkpointing_attribute_error_names_deepspeed():
    # https://github.com/deepspeedai/DeepSpeed/issues/7830 (label bug): ZeRO-3 +
    # gradient_checkpointing, no frames pasted: the fix names DeepSpeed, not transformers
    f = top(run(text("fx-ds-7830-z3-gc-next-functions")))
    assert f.category == "framework_bug" and "deepspeed" in f.fix
    assert f.config_patch == {"command": "pip install -U deepspeed"}


@covers("RK420")
def test_fx_regression_names_the_library_not_the_env_and_the_working_release():
    # https://github.com/deepspeedai/DeepSpeed/issues/1903 (label bug): ZeRO-3 fails on
    # deepspeed 0.6.1, "it works on deepspeed==0.5.10"; the conda env is named "trl"
    f = top(run(text("fx-ds-1903-z3-fetch-regression")))
    assert f.category == "framework_bug" and "trl" not in f.fix
    assert "deepspeed==0.5.10" in f.fix


# =============================================================================================
# framework_bug
# =============================================================================================


@covers("RK420")
def test_fresh_cat_library_lacks_gradient_checkpointing_enable():
    # https://github.com/huggingface/sentence-transformers/issues/3330: the maintainer calls it
    # an oversight, fixed in the next release (install from git meanwhile).
    f = top(run(text("fa-fb-crossencoder-gc-st3330")))
    assert f.category == "framework_bug" and "upgrade" in f.fix.lower()


@covers("RK420")
def test_fresh_cat_pop_from_empty_list_in_the_recompute():
    # https://github.com/PriorLabs/TabPFN/pull/1138: the library's own change (a mutable list
    # consumed by pop(0)) breaks its checkpointed recompute; fixed in the library.
    f = top(run(text("fa-fb-tabpfn-pop-empty-1138")))
    assert f.category == "framework_bug" and "upgrade" in f.fix.lower()


# ---- RK420: an exception that nothing specific explains -------------------------------------


@covers("RK420")
def test_fresh_rk420_traceback_cut_short_with_checkpointing_named():
    # https://github.com/bghira/SimpleTuner/issues/543 (labels upstream-bug): "Tensor, not
    # tuple" when USE_GRADIENT_CHECKPOINTING=true; the traceback stops in torch's DDP forward.
    # The maintainer: gradient checkpointing is broken in the current diffusers releases.
    # Before: RK170 read it as activation memory (gradient_checkpointing on).
    d = run(text("fd-simpletuner-543-tensor-not-tuple"))
    f = top(d)
    assert f.rule == "RK420" and f.category == "framework_bug"
    assert f.config_patch == {"gradient_checkpointing": False}
    assert "paste the whole traceback" in f.evidence
    assert "RK170" not in ids(d)


def test_fresh_rk420_needs_an_exception_without_an_oom():
    # mutations: the prose without the traceback is the knobs' reading again; an OOM line in
    # the paste leaves the exception to the memory rules
    body = text("fd-simpletuner-543-tensor-not-tuple")
    prose = body.split("```Error")[0]
    assert "RK420" not in ids(run(prose))
    with_oom = body + "torch.cuda.OutOfMemoryError: CUDA out of memory.\n"
    assert "RK420" not in ids(run(with_oom))


# ---- RK421: an OOM with room on the device and little held by PyTorch -----------------------


@covers("RK421")
def test_rk421_free_above_the_request_with_nothing_held():
    # https://github.com/pytorch/pytorch/issues/16417 (title): 12.50 MiB requested with 9.28 GiB
    # free, 8.57 MiB allocated and 4.68 MiB cached (a driver issue): no other rule reads it;
    # the default reading says so at low confidence instead of nothing
    d = run(text("oom-pt-16417-title"))
    assert ids(d) == ["RK421"] and top(d).category == "framework_bug"
    assert top(d).confidence <= 0.25 and "nvidia-smi" in top(d).config_patch["command"]
    # mutations: no room on the device, or PyTorch holding a real share, is not this reading
    tight = text("oom-pt-16417-title").replace("9.28 GiB free", "9.28 MiB free")
    assert "RK421" not in ids(run(tight))
    held = text("oom-pt-16417-title").replace("4.68 MiB cached", "4.68 GiB cached")
    assert "RK421" not in ids(run(held))


# RK650: the allowed values a message lists are values, not the caller's arguments.
@covers("RK650")
def test_rk650_names_only_the_argument_not_the_allowed_values():
    # Megatron-Core's recompute_modules validation: https://github.com/NVIDIA/Megatron-LM/blob/
    # d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py
    f = get(run(text("tc-measured-selective-bad-module")), "RK650")
    said = f.evidence.split(" is raised about ", 1)[1]
    assert said.startswith("recompute_modules:")
    assert "mla_up_proj" not in said and "shared_experts" not in said
