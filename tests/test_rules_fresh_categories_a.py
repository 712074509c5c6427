"""Fresh public pastes by category (nondeterministic_recompute, framework_bug,
recompute_overhead, recompute_no_effect): each text is from a thread that is neither a corpus
case nor another test's source, copied verbatim into tests/data/rules/fa-*.txt (its URL in
`SOURCES` and in the test's comment). Each test asserts the top finding's rule / category and
that the fix names the remedy the thread's maintainers gave."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

# =============================================================================================
# nondeterministic_recompute
# =============================================================================================


@covers("RK075")
def test_fresh_cat_recompute_doubles_the_sequence_length_kv_cache():
    # https://github.com/pytorch/pytorch/issues/155171: saved [1, 12, 171, 128], recomputed
    # [1, 12, 342, 128] (the paste is cut inside the dtype); the maintainer: the forward updates
    # global state (past_key_value.update), so the recompute runs differently.
    f = top(run(text("fa-nd-kvcache-qwen2-pt155171")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "use_cache=False" in f.fix and f.config_patch == {"use_cache": False}
    assert "171" in f.evidence and "342" in f.evidence


def test_fresh_cat_halved_length_is_not_a_kv_cache():
    # Mutation of the paste above: a recompute with half the length (context parallel
    # sharding, not a cache) must not read as a KV cache.
    halved = text("fa-nd-kvcache-qwen2-pt155171").replace("342", "85")
    f = top(run(halved))
    assert f.rule == "RK075" and "use_cache" not in str(f.config_patch)


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


@covers("RK075")
def test_fresh_cat_fsdp2_recompute_in_float32():
    # https://github.com/pytorch/pytorch/issues/159359 (fixed by pytorch#182580: FSDP2 casts
    # the forward inputs in the recompute): saved bfloat16, recomputed float32 under FSDPv2.
    f = top(run(text("fa-nd-fsdp2-dtype-pt159359")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "Upgrade torch" in f.fix and "fully_shard" in f.fix
    assert "torch>=2.13" in f.config_patch["command"]


def test_fresh_cat_dtype_mismatch_without_fsdp2_is_autocast():
    plain = text("fa-nd-fsdp2-dtype-pt159359").replace("FSDPv2", "DDP")
    f = top(run(plain))
    assert f.rule == "RK075" and f.config_patch == {"use_reentrant": False}


# =============================================================================================
# framework_bug
# =============================================================================================


@covers("RK420")
def test_fresh_cat_library_lacks_gradient_checkpointing_enable():
    # https://github.com/huggingface/sentence-transformers/issues/3330: the maintainer calls it
    # an oversight, fixed in the next release (install from git meanwhile).
    f = top(run(text("fa-fb-crossencoder-gc-st3330")))
    assert f.category == "framework_bug" and "upgrade" in f.fix.lower()


@covers("RK460")
def test_fresh_cat_backward_twice_in_a_compiled_backward():
    # https://github.com/unslothai/unsloth/issues/3543 (labelled "fixed - pending
    # confirmation"; the maintainers' remedy in the same bug, unsloth#3592: upgrade unsloth and
    # unsloth_zoo). The error is raised in _aot_autograd's backward, no user checkpoint call.
    f = top(run(text("fa-fb-unsloth-backward-twice-3543")))
    assert f.rule == "RK460" and f.category == "framework_bug"
    assert "unsloth" in f.fix and "RK093" not in ids(run(text("fa-fb-unsloth-backward-twice-3543")))


def test_fresh_cat_backward_twice_with_a_checkpoint_frame_stays_rk093():
    # The same error with the user's checkpointed blocks in the traceback is RK093's.
    log = (
        'File "train.py", line 5, in forward\n    x = checkpoint(self.block, x)\n'
        'File "/x/torch/utils/checkpoint.py", line 1, in backward\n'
        "RuntimeError: Trying to backward through the graph a second time (or directly access "
        "saved tensors after they have already been freed)."
    )
    assert top(run(log)).rule == "RK093"


@covers("RK420")
def test_fresh_cat_pop_from_empty_list_in_the_recompute():
    # https://github.com/PriorLabs/TabPFN/pull/1138: the library's own change (a mutable list
    # consumed by pop(0)) breaks its checkpointed recompute; fixed in the library.
    f = top(run(text("fa-fb-tabpfn-pop-empty-1138")))
    assert f.category == "framework_bug" and "upgrade" in f.fix.lower()


# =============================================================================================
# recompute_no_effect
# =============================================================================================


@covers("RK023")
def test_fresh_cat_checkpointing_flag_leaves_memory_the_same():
    # https://github.com/verl-project/verl/issues/26: with the critic's
    # enable_gradient_checkpointing on, the max reserved / allocated "remain the same as when
    # it is turned off"; the maintainers: the flag was not applied (fixed in verl PR #27).
    f = top(run(text("fa-ne-critic-gc-verl26")))
    assert f.rule == "RK023" and f.category == "recompute_no_effect"
    assert "gradient_checkpointing_enable" in f.fix and "upgrade" in f.fix


def test_fresh_cat_memory_dropped_with_checkpointing_is_not_rk023():
    report = "With gradient checkpointing on, the peak memory went from 40 GB to 12 GB."
    assert "RK023" not in ids(run(report))
