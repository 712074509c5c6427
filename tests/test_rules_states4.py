"""RK670 (ColossalAI Gemini placement 'auto' / 'cuda' with an OOM) and RK671 (the tokenizer's
'Token indices sequence length is longer than ...' warning alone), on verbatim real pastes
(sources in rule_helpers.SOURCES)."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top


@covers("RK670")
def test_r8s_gemini_auto_placement_oom():
    # https://github.com/hpcaitech/ColossalAI/issues/2246: OPT-30B with GeminiDDP,
    # PLACEMENT_POLICY = 'auto' OOMs; the maintainer: "I suggest you use CPU for large model"
    d = run(text("r8s-colossalai2246-gemini-auto"))
    f = top(d)
    assert f.rule == "RK670" and f.category == "model_state_memory"
    assert "'auto'" in f.evidence and "PLACEMENT_POLICY = 'auto'" in f.evidence
    assert f.config_patch == {"placement_policy": "cpu"}
    assert "placement_policy='cpu'" in f.fix


def test_r8s_gemini_cpu_placement_or_no_oom_is_silent():
    paste = text("r8s-colossalai2246-gemini-auto")
    # already on 'cpu': nothing to move off the GPU
    assert "RK670" not in ids(
        run(paste.replace("PLACEMENT_POLICY = 'auto'", "PLACEMENT_POLICY = 'cpu'"))
    )
    # no OOM said
    calm = paste.replace("I got OOM when BS is lager than 8 in using GeminiDDP.", "").replace(
        " and get OOM errors", ""
    )
    assert "RK670" not in ids(run(calm))
    # a placement policy of something that is not Gemini
    assert "RK670" not in ids(run(paste.replace("GeminiDDP", "our trainer")))


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
