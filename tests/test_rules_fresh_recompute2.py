"""Fresh public pastes for the recompute rule families, second round (checkpoint API misuse,
recompute that differs): each text is another thread than the rule's own sources and tests,
copied verbatim into tests/data/rules/fn-*.txt (its URL in `SOURCES` and in the test's
comment). Each test asserts the top finding's rule / category and that the fix names the
remedy the thread's maintainers (or the error message itself) gave."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

# =============================================================================================
# RK074: DDP marks a parameter ready twice under the reentrant checkpoint
# =============================================================================================


@covers("RK074")
def test_fresh2_rk074_ready_twice_with_hf_gradient_checkpointing_enable():
    # https://github.com/huggingface/peft/issues/313 (accelerate launch, the message quoted as
    # a blockquote, cut mid-sentence; the fix the thread settled on: non-reentrant checkpoint)
    f = top(run(text("fn-ddp-ready-twice-peft313")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"
    assert "use_reentrant=False" in f.fix and f.config_patch == {"use_reentrant": False}


@covers("RK074")
def test_fresh2_rk074_ready_twice_rank_prefixed_only_the_message():
    # https://github.com/modelscope/ms-swift/issues/3171 (GRPO under DDP; maintainer: pass
    # --gradient_checkpointing_kwargs '{"use_reentrant": false}' or use DeepSpeed)
    f = top(run(text("fn-ddp-ready-twice-swift3171")))
    assert f.rule == "RK074" and "use_reentrant=False" in f.fix


@covers("RK074")
def test_fresh2_rk074_ready_twice_through_a_custom_checkpoint_backward():
    # https://github.com/OEvortex/unsloth/issues/6 (unsloth_zoo's own checkpoint function in
    # the frames, the message cut off at the end)
    f = top(run(text("fn-ddp-ready-twice-unsloth-fork6")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"


# =============================================================================================
# RK071: outputs without grad_fn from a reentrant checkpoint whose inputs need no gradient
# =============================================================================================


@covers("RK071")
def test_fresh2_rk071_element0_with_the_warning_and_use_cache():
    # https://github.com/huggingface/transformers/issues/26377: the issue title carries the
    # error line (first line of the file), the body the 'None of the inputs have
    # requires_grad=True' warnings and use_cache notices; the remedy in the HF threads is
    # model.enable_input_require_grads() or use_reentrant=False
    f = top(run(text("fn-noreqgrad-hf26377")))
    assert f.rule == "RK071" and f.category == "checkpoint_api_misuse"
    assert "enable_input_require_grads" in f.fix and "use_reentrant=False" in f.fix


@covers("RK071")
def test_fresh2_rk071_element_index_other_than_zero():
    # https://github.com/liucongg/ChatGLM-Finetuning/issues/101 (title: "element 0 or 1 of
    # tensors does not require grad", with DeepSpeed's activation_checkpoint_interval=1)
    f = top(run(text("fn-noreqgrad-chatglm-pipe101")))
    assert f.rule == "RK071" and f.category == "checkpoint_api_misuse"


@covers("RK071")
def test_fresh2_rk071_any_element_index_mutation_guard():
    # the error names whichever output came out without grad_fn: element 1, 2, ...
    log = "RuntimeError: element 1 of tensors does not require grad and does not have a grad_fn"
    assert top(run(log)).rule == "RK071"
    # and not from unrelated text that only shares words
    assert "RK071" not in ids(run("RuntimeError: element of the batch does not require padding"))


# =============================================================================================
# RK075: recomputed tensors differ from the forward's
# =============================================================================================


@covers("RK075")
def test_fresh2_rk075_metadata_differs_in_dtype_and_shape():
    # https://github.com/Sompote/SAM3_LoRA/issues/10 (PyTorch 2.4-era frames, dtypes and shapes
    # shifted position by position; open issue: the fix the error itself points to is
    # checkpoint debug mode to find the op that differs)
    f = top(run(text("fn-ckpt-metadata-sam3lora")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "set_checkpoint_debug_enabled" in f.fix
