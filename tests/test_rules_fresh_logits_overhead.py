"""Fresh public pastes for logits memory (an OOM in the loss / lm_head / fp32 logits of a large
vocabulary) and recompute overhead (what checkpointing costs in step time): each text is another
thread than the rules' own sources and tests, copied verbatim into tests/data/rules/fl-*.txt (its
URL in `SOURCES` and in the test's comment). Each test asserts the top finding's rule / category
and that the fix names the remedy the thread's maintainers gave."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.measured import recompute_cost_prose

# =============================================================================================
# logits_memory
# =============================================================================================


@covers("RK262")
def test_fresh_logits_float_upcast_in_masked_ce():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2609: `logits.float()` of [tokens, vocab]
    # needs 48 GiB; the fix is FusedLinearCrossEntropy (full logits never materialised).
    f = top(run(text("fl-automodel-2609-logits-float-48gib")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "FusedLinearCrossEntropy" in f.fix


@covers("RK262")
def test_fresh_logits_masked_ce_vlm_spike():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2603: MaskedCrossEntropy fp32-upcasts the
    # full [num_tokens, vocab] logits and OOMs in the loss.
    f = top(run(text("fl-automodel-2603-masked-ce-vlm")))
    assert f.category == "logits_memory" and "fused linear cross-entropy" in f.fix


@covers("RK262")
def test_fresh_logits_large_vocab_per_sequence():
    # https://github.com/unslothai/unsloth/pull/4330: 8192 x 248320 x 4 bytes = 7.68 GB of fp32
    # logits; the fix computes the fused CE loss from hidden states.
    f = top(run(text("fl-unsloth-4330-qwen35-vocab")))
    assert f.category == "logits_memory" and "fused" in f.fix.lower()


@covers("RK016")
def test_fresh_logits_oom_said_in_a_title_above_loss_frames():
    # https://github.com/hiyouga/LlamaFactory/issues/10367: the title says "报错oom", the
    # frames end in loss_function -> cross_entropy; no exception line. Before: RK420 (a torch
    # bug, default reading). The OOM word after CJK text now counts as an OOM mention.
    f = top(run(text("fl-llamafactory-10367-ce-frames")))
    assert f.rule == "RK016" and f.category == "logits_memory"
    assert "cross-entropy" in f.fix


def test_fresh_oom_word_not_inside_english_words():
    # mutation guard for the OOM-word change: "zoom" / "bloom" / "room" are no OOM mention
    d = run("zoom in on the bloom filter, there is room for a larger batch")
    assert not any(f.category == "logits_memory" for f in d.findings)


# =============================================================================================
# recompute_overhead: RK560, the cost said in words
# =============================================================================================


@covers("RK560")
def test_fresh_overhead_checkpointing_interval_speeds_up():
    # https://github.com/bghira/SimpleTuner/pull/1184: checkpointing every other block
    # (--gradient_checkpointing_interval=2) takes a step from 4.25 s to 3.00 s (1.42x).
    f = top(run(text("fl-simpletuner-1184-interval")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "fewer layers" in f.fix and f.config_patch == {"gradient_checkpointing_interval": 2}
    assert "1.42x" in f.evidence


@covers("RK560")
def test_fresh_overhead_full_recompute_reruns_attention():
    # https://github.com/hao-ai-lab/FastVideo/pull/1410: full recompute re-runs the attention
    # forward, ~12% of GPU compute; the PR's remedy is an attn_only selective policy that saves
    # the attention output. Before: RK170 (activation memory, from the word 'OOMs').
    f = top(run(text("fl-fastvideo-1410-attn-recompute")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "saves the attention output" in f.fix
    assert f.config_patch == {"activation_checkpointing": "selective"}


@covers("RK560")
def test_fresh_overhead_slowdown_beyond_one_forward():
    # https://github.com/QwenLM/Qwen-Image/issues/69: "a 3.75x slowdown ... theoretical
    # overhead from recomputation is only around 1.3x" (no maintainer answer yet). Before: no
    # finding. The evidence says 3.75x is more than one extra forward costs.
    f = top(run(text("fl-qwenimage-69-slowdown")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "3.75x" in f.evidence and "more than one extra forward" in f.evidence


def test_recompute_cost_prose_reads_ratios_times_and_shares():
    lines = [
        "with gradient checkpointing the step goes from 2.0 s to 2.6 s",
        "activation checkpointing: 25% slower",
        "recompute gave a 1.3x slowdown",
        "gradient checkpointing showed no noticeable slowdown, 1.3x less memory",
        "",
        "training went from 2.0 s to 2.6 s",  # no checkpointing named: not this fact
    ]
    got = [c["ratio"] for c in recompute_cost_prose(lines)]
    assert got == [1.3, 1.25, 1.3]


def test_rk560_not_without_a_cost():
    # checkpointing named with no time cost is no overhead finding
    d = run("I enabled gradient checkpointing and the memory dropped from 70 GB to 40 GB")
    assert "RK560" not in [f.rule for f in d.findings]
