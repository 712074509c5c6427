"""More fresh public pastes for logits memory and recompute overhead (freshlo2): each text is
another thread than the rules' own sources and tests, copied verbatim into
tests/data/rules/fz-*.txt (its URL in `SOURCES` and in the test's comment; where the search
gave only an excerpt, the excerpt is the paste). Each test asserts the top finding's rule /
category and that the fix names the remedy the thread gave."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.measured import recompute_cost_prose, vocab_memory_prose

# =============================================================================================
# logits_memory
# =============================================================================================


@covers("RK262")
def test_fresh_logits_float_upcast_32k_tokens():
    # https://github.com/modelscope/ms-swift/issues/6966: logits.float() asks for 49G,
    # 32k * 151936 * 4 bytes. Right before this round.
    f = top(run(text("fz-msswift-6966-logits-float-49g")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "fused linear cross-entropy" in f.fix


@covers("RK262")
def test_fresh_logits_size_of_a_128k_vocabulary():
    # https://github.com/pytorch/pytorch/issues/124480: 128256 x 81920 x 2 bytes = 19.57GiB of
    # logits; the remedy is a fused linear cross-entropy. Right before this round.
    f = top(run(text("fz-pytorch-124480-linear-ce")))
    assert f.category == "logits_memory" and "fused linear cross-entropy" in f.fix


@covers("RK016")
def test_fresh_logits_oom_in_cross_entropy_loss_frame():
    # https://github.com/linkedin/Liger-Kernel/pull/47: a pytest OOM raised in
    # torch._C._nn.cross_entropy_loss. Right before this round.
    f = top(run(text("fz-liger-47-ce-oom-test")))
    assert f.rule == "RK016" and f.category == "logits_memory"
    assert "cross-entropy" in f.fix


@covers("RK620")
def test_fresh_logits_memory_blamed_on_128k_vocab_in_words():
    # https://github.com/facebookresearch/advprompter/issues/1: "insufficient memory since
    # Llama3 has much larger vocab_size (128K)"; the maintainer's fix processes the batch in
    # chunks (num_chunks=2). Before: no finding.
    f = top(run(text("fz-advprompter-1-llama3-vocab-chunks")))
    assert f.rule == "RK620" and f.category == "logits_memory"
    assert "chunks" in f.fix and "128K" in f.evidence


@covers("RK620")
def test_fresh_logits_chunked_ce_for_250k_vocab():
    # https://github.com/EvolvingLMMs-Lab/LongVA/pull/19: chunk-by-chunk cross entropy for a
    # 250K vocabulary, peak memory 43G -> 8G. Before: no finding.
    f = top(run(text("fz-longva-19-chunked-ce")))
    assert f.category == "logits_memory" and "chunks" in f.fix


@covers("RK620")
def test_fresh_logits_128k_vocab_1gib_per_sequence():
    # https://github.com/allenai/open-instruct/pull/777: "for a 128k vocab size and 4k seqlen,
    # bfloat16 logits cost 1 GiB * batch_size". Before: no finding.
    f = top(run(text("fz-openinstruct-777-logits-refs")))
    assert f.category == "logits_memory" and "use_liger_kernel" in f.fix


def test_vocab_memory_prose_needs_a_large_vocab_and_memory():
    assert vocab_memory_prose(["a 128k vocab size costs memory"])[0]["vocab"] == 128_000
    assert vocab_memory_prose(["vocab_size=151936, peak 40 GiB"])[0]["vocab"] == 151_936
    assert not vocab_memory_prose(["a 128k vocab size trains fast"])  # no memory named
    assert not vocab_memory_prose(["an 8k vocab, out of memory"])  # not a large vocabulary


# =============================================================================================
# recompute_overhead
# =============================================================================================


@covers("RK230")
def test_fresh_overhead_table_with_and_without_recompute():
    # https://github.com/cybertronai/gradient-checkpointing/issues/55: iteration time 557 ms
    # without, 1457.91 / 704.9 ms with recomputation. Right before this round.
    f = top(run(text("fz-gradckpt-55-speed-mode")))
    assert f.rule == "RK230" and f.category == "recompute_overhead"
    assert "selective" in f.fix


@covers("RK560")
def test_fresh_overhead_only_says_slower():
    # https://github.com/chuanyangjin/fast-DiT/issues/11: "with gradient checkpointing ... it
    # is super slow" (no number). Before: no finding.
    f = top(run(text("fz-fastdit-11-ckpt-slow")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "turn checkpointing off" in f.fix and "no number" in f.evidence


@covers("RK560")
def test_fresh_overhead_throughput_drop_by_a_factor():
    # https://github.com/Modalities/modalities/issues/13: "activation checkpointing leads to
    # tremendous throughput drops (factor >100)". Before: no finding.
    f = top(run(text("fz-modalities-13-throughput-drop")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "100x" in f.evidence and "more than one extra forward" in f.evidence


@covers("RK560")
def test_fresh_overhead_faster_without_checkpointing():
    # https://github.com/ReaLLMASIC/ReaLLM-Forge/pull/594: "iteration speed is still 10% or so
    # faster without gradient checkpointing" when the VRAM allows. Before: no finding.
    f = top(run(text("fz-reallm-594-ckpt-10pct")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "1.1x" in f.evidence and "no recompute where the run fits" in f.fix


def test_recompute_cost_prose_reads_slow_words_factors_and_faster_without():
    lines = [
        "gradient checkpointing is very slow on 8 GPUs",
        "",
        "activation checkpointing: throughput drops by a factor of 3",
        "",
        "20% faster without activation checkpointing",
        "",
        "gradient checkpointing showed no noticeable slowdown",
        "",
        "training is very slow",  # no checkpointing named
    ]
    got = [c["ratio"] for c in recompute_cost_prose(lines)]
    assert got == [3.0, 1.2, None]
