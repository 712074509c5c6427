"""Tests of the rules in recompute_kit/doctor/rules/informational.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import (
    LLAMA31_8B_MLP,
    cites,
    covers,
    get,
    ids,
    intended_patch,
    run,
    text,
    top,
)

from recompute_kit.doctor.engine import build_context
from recompute_kit.doctor.rules import (
    patch_for,
)


@covers("RK090")
def test_rk090_headroom_while_recomputing():
    # Llama-3.1-8B with mlp recompute on 80 GiB, and a real Megatron iteration/memory line
    # (real-formats.md ex-mlm-pr5662): the run fits, and no recompute would fit too.
    d = run(text("ex-mlm-pr5662"), config=LLAMA31_8B_MLP, config_name="l8b.yaml", gpu_memory_gb=80)
    f = get(d, "RK090")
    assert f.category == "informational"
    best = build_context(d.evidence, 80).best.estimate
    cites(f, f"'{best.recompute}'", "0.0%")
    assert intended_patch(f) == patch_for(best.recompute)


@covers("RK090")
def test_rk090_not_after_an_oom():
    d = run(
        text("oom-msswift-9191"), config=LLAMA31_8B_MLP, config_name="l8b.yaml", gpu_memory_gb=80
    )
    assert "RK090" not in ids(d)


@covers("RK156")
def test_fresh_rk156_old_use_reentrant_notice_alone():
    # https://github.com/bmaltais/kohya_ss/issues/2481 (PyTorch 2.1-2.3 wording, no failure)
    f = top(run(text("fr-use-reentrant-old-kohya")))
    assert f.rule == "RK156" and f.category == "informational"
    assert "use_reentrant" in str(f.config_patch)


@covers("RK156")
def test_rk156_old_use_reentrant_notice_alone():
    # ChatGLM / LLaVA-Llama-3#4's first warning alone (the older wording).
    line = text("i13-llavallama3-4").splitlines()[0]
    f = top(run(line))
    assert f.rule == "RK156" and f.category == "informational"
    # the newer wording (PyTorch >= 2.4: "will raise an exception") alone: RK672's notice
    assert top(run(text("ckpt-local-use-reentrant-missing"))).rule == "RK672"
    # both warnings of LLaVA-Llama-3#4 together: informational, not misuse
    assert top(run(text("i13-llavallama3-4"))).category == "informational"


@covers("RK157")
def test_rk157_library_fallback_notice():
    # unsloth#91: "Unsloth: Vocab size of 102400 exceeds the max CUDA blocksize of 65536 ..."
    f = top(run(text("i13-unsloth-91")))
    assert f.rule == "RK157" and f.category == "informational"
    assert f.config_patch == {"command": "pip install -U unsloth"}
    assert "no fix needed" in f.fix.lower()


@covers("RK159")
def test_rk159_checkpointing_works_the_reading_was_wrong():
    # DeepSpeedExamples#332: 6.4G both ways by one measure, MaxMemAllocated 11.76 vs 44.23 GB.
    config = text("i13-dsexamples-332-config")
    d = run(text("i13-dsexamples-332"), config=config, config_name="x.sh")
    f = top(d)
    assert f.rule == "RK159" and f.category == "informational"
    cites(f, "max_seq_len 64")
    assert "MaxMemAllocated" in f.fix


@covers("RK671")
def test_r8s_token_indices_warning_alone_is_informational():
    # https://github.com/unslothai/unsloth/issues/382: the maintainer: "the max seq length
    # issue is fine - we auto truncate it in Unsloth"
    d = run(text("r8s-unsloth382-token-overflow"))
    f = top(d)
    assert f.rule == "RK671" and f.category == "informational"
    assert "12065" in f.evidence and "12000" in f.evidence
    assert f.config_patch == {"max_seq_length": 12000, "truncation": True}
    assert "max_seq_length" in f.fix and "max_length=12000" in f.fix


def test_r8s_token_indices_warning_beside_an_oom_is_a_bystander():
    # https://github.com/QwenLM/Qwen2.5-Omni/issues/257: the same warning, then an OOM
    d = run(text("r8s-qwen25omni257-token-overflow-oom"))
    assert "RK671" not in ids(d)
    assert top(d).category == "allocation_exceeds_device"


@covers("RK672")
def test_r8s_new_use_reentrant_warning_alone_is_informational():
    # the PyTorch >= 2.4 wording, reproduced locally (tests/rule_sources.py LOCAL); the
    # announced exception never came (https://github.com/pytorch/pytorch/pull/193720: "the
    # exception was never introduced")
    d = run(text("ckpt-local-use-reentrant-missing"))
    f = top(d)
    assert f.rule == "RK672" and f.category == "informational"
    assert "RK072" not in ids(d)
    assert f.config_patch == {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    assert "No fix needed" in f.fix and "use_reentrant=False" in f.fix


def test_r8s_new_use_reentrant_warning_beside_an_oom_is_not_the_answer():
    d = run(text("ckpt-local-use-reentrant-missing") + "\n" + text("oom-pt-16417-comment"))
    assert "RK672" not in ids(d)
    assert top(d).category != "informational"


def test_r8s_token_indices_warning_hard_wrapped():
    # the unsloth#382 line wrapped in the middle, as pastes into narrow boxes come
    paste = text("r8s-unsloth382-token-overflow").replace(
        "maximum sequence length", "maximum\nsequence length", 1
    )
    f = top(run(paste))
    assert f.rule == "RK671" and "12065" in f.evidence
