"""Tests of the rules in recompute_kit/doctor/rules/reported.py, one or more per rule, on
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

from recompute_kit.doctor.rules import (
    EXPANDABLE,
)

# =============================================================================================
# RK190-RK191: what a report states in prose next to an OOM. Texts are tests/data/rules/i19-*,
# verbatim from dev corpus cases (URLs in SOURCES).
# =============================================================================================


@covers("RK190")
def test_rk190_pr_places_the_oom_at_the_first_optimizer_step():
    # https://github.com/verl-project/verl/pull/5364: "Baseline can OOM at the first optimizer
    # step due to Adam lazy state init"; the PR streams optimizer states per layer.
    d = run(text("i19-verl-5364"))
    f = top(d)
    assert f.rule == "RK190" and f.category == "model_state_memory"
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    cites(f, "first optimizer step")
    assert "optimizer_offload" in f.fix and "Recompute cannot free them" in f.fix
    # a Megatron command names its own key
    d = run(text("i19-verl-5364"), config="tensor_model_parallel_size: 2\n")
    assert top(d).config_patch == {"use_distributed_optimizer": True}
    # an OOM line that names no optimizer is not this rule's
    assert "RK190" not in ids(run("Baseline can OOM at step 2 of the rollout\n"))


@covers("RK191")
def test_rk191_pr_quantifies_reserved_but_unallocated_memory():
    # https://github.com/NovaSky-AI/SkyRL/pull/1768: "the baseline OOMs at step 2 (~20 GiB
    # reserved-but-unallocated); the trainer flag makes all 5 steps pass" (expandable_segments).
    d = run(text("i19-skyrl-1768"))
    f = top(d)
    assert f.rule == "RK191" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    cites(f, "20 GiB reserved but unallocated")
    # under a GiB stranded is no diagnosis; PyTorch's own wording is RK001's, not this rule's
    assert "RK191" not in ids(run("the run OOMs (~300 MiB reserved-but-unallocated)\n"))
