"""Fresh public pastes for the recompute rule families (checkpoint API misuse, recompute that
differs, recompute that does not act, Megatron validation, framework bugs, overhead): each text
is another thread than the rule's own sources and tests, copied verbatim into
tests/data/rules/fr-*.txt (its URL in `SOURCES` and in the test's comment). Each test asserts
the top finding's rule / category and that the fix names the remedy the thread's maintainers
(or the error message itself) gave."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

# =============================================================================================
# RK074: DDP marks a parameter ready twice under the reentrant checkpoint
# =============================================================================================


@covers("RK074")
def test_fresh_rk074_ddp_ready_twice_with_parameter_name():
    # https://github.com/microsoft/FocalNet/issues/4 (torch 1.10 wording, names the parameter)
    f = top(run(text("fr-ddp-ready-twice-focalnet")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"
    assert "_set_static_graph" in f.fix and f.config_patch == {"use_reentrant": False}


@covers("RK074")
def test_fresh_rk074_ddp_ready_twice_older_wording():
    # https://github.com/allenai/longformer/issues/63 (older wording: "DDP does not support
    # such use cases yet. 3) Incorrect unused parameter detection ...")
    f = top(run(text("fr-ddp-ready-twice-longformer")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"


@covers("RK074")
def test_fresh_rk074_ddp_ready_twice_after_reentrant_frames():
    # https://github.com/bytedance/ibot/issues/30 (frames of checkpoint.py's backward first)
    f = top(run(text("fr-ddp-ready-twice-ibot")))
    assert f.rule == "RK074" and "use_reentrant=False" in f.fix


# =============================================================================================
# RK099 / RK149: 'None of the inputs have requires_grad=True' harmless vs gradients lost
# =============================================================================================


@covers("RK099")
def test_fresh_rk099_warning_at_inference_is_harmless():
    # https://github.com/petko-nikolov/pysemseg/issues/5 (inference under no_grad and eval)
    f = top(run(text("fr-noreqgrad-pysemseg")))
    assert f.rule == "RK099" and f.category == "informational"


@covers("RK099")
def test_fresh_rk099_warning_with_a_frozen_tower():
    # https://github.com/2U1/Qwen-VL-Series-Finetune/issues/56 (frozen vision tower)
    f = top(run(text("fr-noreqgrad-qwenvl")))
    assert f.rule == "RK099" and "RK149" not in ids(run(text("fr-noreqgrad-qwenvl")))


@covers("RK149")
def test_fresh_rk149_warning_and_parameters_not_optimized():
    # https://github.com/Lyken17/pytorch-memonger/issues/4: the warning, and the reporter sees
    # that layer1's parameters "can't be optimized" (inputs without requires_grad).
    f = top(run(text("fr-noreqgrad-memonger")))
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert "use_reentrant=False" in f.fix and "enable_input_require_grads" in f.fix
    assert "can't be optimized" in f.evidence


@covers("RK149")
def test_fresh_rk149_lora_gradients_none_with_checkpointing():
    # https://github.com/microsoft/LoRA/issues/120: no warning pasted, only the report that
    # with gradient checkpointing the LoRA gradients are 'None' and lora_A/B never update.
    f = top(run(text("fr-lora-grads-none-mslora")))
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert "enable_input_require_grads" in f.fix and f.config_patch == {"use_reentrant": False}


def test_fresh_rk149_not_without_checkpointing_named():
    # A report of None gradients that names no checkpointing is not this rule's.
    report = "all gradients will be 'None', so lora_A and B will not be updated"
    assert "RK149" not in ids(run(report))


# =============================================================================================
# RK083 / RK075: recomputed tensors differ from the forward's
# =============================================================================================


@covers("RK083")
def test_fresh_rk083_zero3_lora_dpo_command_and_empty_shapes():
    # https://github.com/OpenRLHF/OpenRLHF/issues/569: --zero_stage 3 --lora_rank 32
    # --gradient_checkpointing; recomputed metadata torch.Size([0]) (ZeRO-3 released params).
    f = top(run(text("fr-zero3-metadata-openrlhf")))
    assert f.rule == "RK083" and f.category == "framework_bug"
    assert "use_reentrant=True" in f.fix or "deepspeed.checkpointing" in f.fix


@covers("RK083")
def test_fresh_rk083_zero3_linear_frames():
    # https://github.com/OpenBMB/MiniCPM-V/issues/651: deepspeed/runtime/zero/linear.py frames,
    # torch.Size([0]) recomputed.
    f = top(run(text("fr-zero3-metadata-minicpmv")))
    assert f.rule == "RK083" and f.category == "framework_bug"


@covers("RK075")
def test_fresh_rk075_shifted_shapes_are_not_moe_routing():
    # https://github.com/mihirp1998/VADER/issues/9 (LoRA video diffusion, no MoE): the paste puts
    # two pairs before the exception line and one after; the shapes at the same positions have
    # other ranks (another op sequence), so one pair whose leading dimension moved (4 -> 128)
    # is not token routing.
    f = top(run(text("fr-metadata-vader")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "router" not in str(f.config_patch)
    assert "set_checkpoint_debug_enabled" in f.fix


@covers("RK075")
def test_fresh_rk075_sequence_dimension_halved():
    # https://github.com/huggingface/trl/issues/4314 (LoRA + FSDP2 context parallel)
    f = top(run(text("fr-metadata-cp-trl")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"


# =============================================================================================
# RK093: backward through the graph twice; RK073: keyword arguments; RK156: old notice
# =============================================================================================


@covers("RK093")
def test_fresh_rk093_retain_graph_through_reentrant_checkpoint():
    # https://github.com/zhanghang1989/PyTorch-Encoding/issues/76 (PyTorch 0.4, the message cut
    # at "freed"; the frames run through checkpoint.py's backward)
    f = top(run(text("fr-backward-twice-encoding")))
    assert f.rule == "RK093" and f.category == "checkpoint_api_misuse"
    assert "use_reentrant=False" in f.fix


@covers("RK093")
def test_fresh_rk093_reported_in_prose_with_checkpointing_yaml_key():
    # https://github.com/MooreThreads/Moore-AnimateAnyone/issues/126 (prose: with
    # "gradient_checkpointing: True" the error appears once a second UNet trains too)
    f = top(run(text("fr-backward-twice-animateanyone")))
    assert f.rule == "RK093" and f.category == "checkpoint_api_misuse"


@covers("RK073")
def test_fresh_rk073_use_reentrant_rejected_by_an_old_pytorch():
    # https://github.com/MCG-NJU/MeMOTR/issues/15: the error quoted as inline code
    # (`ValueError: Unexpected keyword arguments: use_reentrant`) after
    # `checkpoint(self.backbone, frame, use_reentrant=False)`: the installed checkpoint has no
    # use_reentrant parameter (PyTorch < 1.11), so the remedy is not use_reentrant=False.
    f = top(run(text("fr-kwargs-use-reentrant-memotr")))
    assert f.rule == "RK073" and f.category == "checkpoint_api_misuse"
    assert "Upgrade PyTorch" in f.fix and "1.11" in f.config_patch["command"]


def test_fresh_rk073_other_keywords_keep_the_non_reentrant_remedy():
    # the same ValueError naming the function's own keyword (attention_mask): use_reentrant=False
    f = top(run("ValueError: Unexpected keyword arguments: attention_mask"))
    assert f.rule == "RK073" and f.config_patch == {"use_reentrant": False}


@covers("RK156")
def test_fresh_rk156_old_use_reentrant_notice_alone():
    # https://github.com/bmaltais/kohya_ss/issues/2481 (PyTorch 2.1-2.3 wording, no failure)
    f = top(run(text("fr-use-reentrant-old-kohya")))
    assert f.rule == "RK156" and f.category == "informational"
    assert "use_reentrant" in str(f.config_patch)


def test_fresh_inline_code_line_is_read_without_its_backticks():
    # the parser change behind the MeMOTR#15 test: a whole line quoted as inline code
    from recompute_kit.doctor.evidence.text import clean_line

    assert clean_line("`ValueError: Unexpected keyword arguments: use_reentrant`") == (
        "ValueError: Unexpected keyword arguments: use_reentrant"
    )
    assert clean_line("```") == "```"
    assert clean_line("`a` and `b`") == "`a` and `b`"


# =============================================================================================
# RK094: ZeRO-2 reduces a shared weight's gradient twice under the reentrant checkpoint
# =============================================================================================


@covers("RK094")
def test_fresh_rk094_one_layer_reused_six_times_under_zero2():
    # https://github.com/deepspeedai/DeepSpeed/issues/2103 (one layer's weights reused by six
    # checkpointed layers; "AssertionError: The parameter 97 has already been reduced")
    f = top(run(text("fr-reduced-twice-weight-sharing-ds")))
    assert f.rule == "RK094" and f.category == "checkpoint_api_misuse"
    assert "share the weight" in f.fix
    assert f.config_patch["zero_optimization"] == {"stage": 1}


# =============================================================================================
# RK140: checkpointing gated on self.training; RK147: dropout without the RNG state
# =============================================================================================


@covers("RK140")
def test_fresh_rk140_trainer_puts_the_model_in_eval_mode_in_prose():
    # https://github.com/huggingface/trl/issues/1066: PPOTrainer sets evaluation mode before the
    # forward whose gradients it collects; "the gradient checkpointing function is not being
    # invoked because LlamaModel confirms whether it is in training mode". No code snippet.
    f = top(run(text("fr-eval-mode-ppo-trl")))
    assert f.rule == "RK140" and f.category == "recompute_no_effect"
    assert "train()" in f.fix and "model.train()" in f.config_patch["code"]


def test_fresh_rk140_not_without_the_mode_named():
    # checkpointing reported inactive, nothing about eval / training mode: not RK140
    report = "The gradient checkpointing is not being applied to the vision tower."
    assert "RK140" not in ids(run(report))


@covers("RK147")
def test_fresh_rk147_preserve_rng_state_false_with_dropout():
    # https://github.com/ankanbhunia/PIDM/pull/66 (preserve_rng_state=False with dropout on:
    # a failed 300-epoch training); the PR's fix keeps the RNG state.
    f = top(run(text("fr-rng-dropout-pidm")))
    assert f.rule == "RK147" and f.category == "nondeterministic_recompute"
    assert f.config_patch == {"preserve_rng_state": True}
