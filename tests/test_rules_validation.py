"""Tests of the rules in recompute_kit/doctor/rules/validation.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import (
    cites,
    covers,
    get,
    ids,
    intended_patch,
    run,
    text,
    top,
)

from recompute_kit.doctor.evidence.measured import _recompute_side

# =============================================================================================
# RK097: Megatron's argument checks, with or without their frames, in every version's wording
# =============================================================================================


@covers("RK097")
def test_fresh_rk097_title_and_cut_validate_args_frame():
    # https://github.com/modelscope/ms-swift/issues/5737: the message only in the issue title
    # (older wording "pipeline-model-parallel size"), the traceback cut after validate_args.
    f = top(run(text("fg-pp-divisible-swift5737")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    assert "num_layers_in_first_pipeline_stage" in f.config_patch


@covers("RK097")
def test_rk097_a_check_quoted_from_the_source_is_a_possibility_not_a_diagnosis():
    # https://github.com/NVIDIA/Megatron-LM/issues/381: the user quotes validate_args's
    # assertion (condition and message over two lines) and asks how to split the layers
    # unevenly: nothing was raised in a log, so it is possible, at 0.5.
    f = top(run(text("megatronlm-381-quoted-pp-divisible-check")))
    assert f.rule == "RK097" and f.confidence == 0.5
    assert "quotes a check" in f.evidence and "num_layers_in_first_pipeline_stage" in f.config_patch


@covers("RK097")
def test_fresh_rk097_model_construction_check():
    # https://github.com/NVIDIA-BioNeMo/bionemo-recipes/issues/784: the check raised from
    # get_num_layers_to_build (transformer_block.py), underscores in the setting's name.
    f = top(run(text("fg-pp-divisible-bionemo784")))
    assert f.rule == "RK097" and "pipeline_model_parallel_size" in f.evidence
    assert "num_layers_in_last_pipeline_stage" in f.config_patch


@covers("RK097")
def test_fresh_rk097_new_wording_states_values():
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5884: newer wording with the values
    # ("num_layers=60 should be divisible by config.pipeline_model_parallel_size=8"), no config:
    # the uneven split is computed from the message's numbers (the PR set first/last stages).
    f = top(run(text("fg-pp-divisible-mbridge5884")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    first = f.config_patch["num_layers_in_first_pipeline_stage"]
    last = f.config_patch["num_layers_in_last_pipeline_stage"]
    assert first + last + 6 * (60 // 8) == 60


@covers("RK097")
def test_fresh_rk097_sequence_parallel_message_without_frames():
    # https://github.com/NVIDIA/NeMo-Framework-Launcher/pull/309: the ValueError quoted in a
    # PR ("When using expert parallelism and tensor parallelism, sequence parallelism must be
    # used"); the PR's fix enables sequence parallelism.
    f = top(run(text("fg-ep-tp-sp-launcher309")))
    assert f.rule == "RK097" and f.config_patch == {"sequence_parallel": True}


def test_rk097_not_on_a_requirement_about_no_parallel_setting():
    # A requirement that names no parallel setting is not Megatron's argument check.
    f = run("AssertionError: batch must be a dict of tensors")
    assert "RK097" not in [x.rule for x in f.findings]


# =============================================================================================
# RK064: the uniform recompute loop runs past the last layer, reported in words
# =============================================================================================


@covers("RK064")
def test_fresh_rk064_reported_in_words():
    # https://github.com/NVIDIA/Megatron-LM/issues/1807: "List out of range" when
    # num_layers_per_pipeline_rank % recompute_num_layers != 0, no traceback; fixed upstream by
    # clamping the chunk (Megatron-Core >= 0.17).
    f = top(run(text("fg-uniform-remainder-mlm1807")))
    assert f.rule == "RK064" and f.category == "framework_bug"
    assert "megatron-core" in f.config_patch["command"]


def test_rk064_not_on_an_out_of_range_without_the_remainder():
    report = "IndexError: list index out of range\nin the data loader, recompute_num_layers = 2"
    assert "RK064" not in [x.rule for x in run(report).findings]


def test_recompute_side_reads_the_recompute_switch():
    assert _recompute_side("C. non-overlap baseline — overlap off, recompute on") is True
    assert _recompute_side("A. overlap on, recompute off (context)") is False
    assert _recompute_side("no recompute") is False
    assert _recompute_side("1 card+recompute") is True


@covers("RK097")
def test_rk097_megatron_validate_args_moe_tp_needs_sp():
    d = run(
        text("i12-rocm-megatron-85"),
        config=text("i12-rocm-megatron-85-config"),
        config_name="launch.sh",
    )
    assert d.evidence.config["tensor_model_parallel_size"] == 2
    f = top(d)
    assert f.rule == "RK097" and f.category == "invalid_config"
    assert f.config_patch == {"sequence_parallel": True}
    assert "sequence_parallel" in f.evidence


def test_validate_args_frame_cut_from_its_file_line_is_evidence():
    # slime's paste starts mid-frame ('Megatron-LM/megatron/training/arguments.py", line 561').
    f = top(run(text("i12-slime-1486")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    assert "num_layers_in_first_pipeline_stage" in f.config_patch


@covers("RK150")
def test_rk150_nemo_null_method_with_full_granularity():
    yaml_text = (
        "model:\n"
        + text("nemo-megatron-gpt-config-ac").replace(
            "activations_checkpoint_granularity: null", "activations_checkpoint_granularity: full"
        )
        + "  recompute_method: block\n  recompute_num_layers: 4\n"
    )
    f = top(run(config=yaml_text))
    assert f.rule == "RK150" and f.category == "invalid_config"
    assert f.config_patch == {
        "activations_checkpoint_method": "block",
        "activations_checkpoint_num_layers": 4,
    }


@covers("RK151")
def test_rk151_script_assert_forbids_fsdp_with_checkpointing():
    # DMD2#52: `assert not (train_args.fsdp and train_args.gradient_checkpointing), ...`
    f = top(run(text("i13-dmd2-52")))
    assert f.rule == "RK151" and f.category == "invalid_config"
    assert f.config_patch == {"fsdp": False}


def test_rk151_not_on_pytorchs_internal_checkpoint_assert():
    # unsloth-zoo PR #1001 (https://github.com/unslothai/unsloth-zoo/pull/1001), a dev case of
    # nondeterministic_recompute: "AssertionError: Something went unexpectedly wrong in
    # activation checkpoint." is torch.utils.checkpoint's own assert, not a script forbidding
    # two options together.
    d = run(text("i12-unslothzoo-1001"))
    assert "RK151" not in ids(d)


@covers("RK152")
def test_rk152_traceback_cut_in_the_uniform_chunk_loop():
    # NeMo Speech PR #12517: Hyena's _checkpointed_forward -> te_checkpoint, cut.
    f = top(run(text("i13-nemo-speech-12517")))
    assert f.rule == "RK152" and f.category == "invalid_config"
    assert f.config_patch == {"recompute_method": "uniform", "recompute_num_layers": 1}


def test_rk152_cut_traceback_needs_the_chunk_loop():
    # The same NeMo traceback cut one line earlier, before the loop's source line
    # (`custom(layer_idx, layer_idx + self.config.recompute_num_layers)`): a traceback cut in
    # _checkpointed_forward alone (an OOM or a shape error in the recompute could end it) does
    # not name chunks of recompute_num_layers.
    head = "\n".join(text("i13-nemo-speech-12517").splitlines()[:4])
    assert "_checkpointed_forward" in head and "recompute_num_layers" not in head
    assert "RK152" not in ids(run(head))


def test_rk152_config_with_a_non_dividing_recompute_num_layers():
    # Megatron-LM#2294's config: 24 layers, uniform 7 -> 6 is the largest divisor below 7.
    # Its IndexError in Megatron's own loop stays RK064's (fixed upstream) first.
    d = run(text("mlm-2294-error"), config=text("mlm-2294-config"))
    f = get(d, "RK152")
    # uniform is already set: the patch changes only the layer count
    assert f.config_patch == {"recompute_num_layers": 6}
    assert intended_patch(f) == {"recompute_method": "uniform", "recompute_num_layers": 6}
    assert "not a multiple of recompute_num_layers 7" in f.evidence
    assert top(d).rule == "RK064"


@covers("RK153")
def test_rk153_deepspeed_contiguous_checkpointing_index_error():
    # pytorch-lightning#20329: IndexError in partition_activations (the line cut at "IndexErro").
    f = top(run(text("i13-lightning-20329")))
    assert f.rule == "RK153" and f.category == "invalid_config"
    assert "number_checkpoints" in f.config_patch["activation_checkpointing"]


@covers("RK064")
def test_rk064_index_error_inside_megatron_recompute():
    # https://github.com/modelscope/ms-swift/issues/6149: IndexError from _get_layer under
    # tensor_parallel.checkpoint (Megatron core_v0.13.1).
    f = top(run(text("msswift-6149")))
    assert f.rule == "RK064" and f.category == "framework_bug"
    cites(f, "index 36 is out of range")


@covers("RK064")
def test_rk064_names_the_non_divisible_layer_count():
    # https://github.com/NVIDIA/Megatron-LM/issues/2294: the error and the config.
    d = run(text("mlm-2294-error"), config=text("mlm-2294-config"), config_name="repro.py")
    f = top(d)
    assert f.rule == "RK064"
    cites(f, "index 24 is out of range", "24 layers", "recompute_num_layers 7")


@covers("RK064")
def test_rk064_not_for_an_index_error_in_a_data_loader():
    # https://github.com/Atcold/pytorch-PPUU/issues/21: "list index out of range" in
    # dataloader.py - nothing to do with recompute.
    d = run(text("ppuu-21"))
    assert d.evidence.errors and d.evidence.errors[0].type == "IndexError"
    assert "RK064" not in ids(d)


# =============================================================================================
# RK065: the script's argument parser refused its command line (Megatron-LM's retired flags)
# =============================================================================================


@covers("RK065")
def test_rk065_unrecognized_retired_recompute_flag_names_its_new_name():
    # https://github.com/NVIDIA/Megatron-LM/issues/394: the README still used the 2021 flag
    f = top(run(text("megatron-394-unrecognized-activations-checkpoint-method")))
    assert f.rule == "RK065" and f.category == "invalid_config"
    assert "--activations-checkpoint-method by --recompute-method" in f.fix
    assert f.confidence >= 0.85  # argparse's error decides it


@covers("RK065")
def test_rk065_megatrons_exit_on_checkpoint_activations():
    # megatron/training/arguments.py (Megatron-LM d98e8a64), verbatim: its exit for the flag
    log = (
        "--checkpoint-activations is no longer valid, use --recompute-activations, or, for "
        "more control, --recompute-granularity and --recompute-method.\n"
    )
    f = top(run(log))
    assert f.rule == "RK065" and "--recompute-activations" in f.fix


@covers("RK065")
def test_rk065_any_refused_flag_is_invalid_config_without_a_rename():
    f = top(run("train.py: error: unrecognized arguments: --moe-expert-capcity-factor 1.0\n"))
    assert f.rule == "RK065" and f.fix is not None and "Replace each refused flag" in f.fix


@covers("RK065")
def test_rk065_a_launch_script_with_retired_flags_and_no_log():
    script = (
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 \\\n"
        "  --num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 --bf16 \\\n"
        "  --checkpoint-activations --distribute-checkpointed-activations\n"
    )
    f = get(run(config=script, config_name="train.sh"), "RK065")
    assert "--distribute-checkpointed-activations by --distribute-saved-activations" in f.fix


@covers("RK097")
def test_megatron_lms_assert_and_the_kits_layout_check_give_the_uneven_stages():
    # Megatron-LM's arguments.py assert (tests/rule_sources.py) and, before any run, the kit's
    # own check of the files' layout: Megatron-LM's gpt-oss example sets 12 layers over
    # PP = WORLD_SIZE = 8 (a skill trial); the patch gives the first and last stages theirs.
    f = top(run(text("mlm-arguments-layers-over-pp")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    script = (
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 12 --hidden-size 2880 "
        "--num-attention-heads 64 --pipeline-model-parallel-size 8"
    )
    f = top(run(config=script, config_name="train.sh"))
    assert f.rule == "RK097" and "is not divisible by pipeline parallel size 8" in f.evidence
    first = f.config_patch["num_layers_in_first_pipeline_stage"]
    last = f.config_patch["num_layers_in_last_pipeline_stage"]
    assert first + last + 6 * 1 == 12  # the six middle stages take 12 // 8 = 1 each
    # a pasted recompute setting with no layer count is no layout (Megatron's default 2 layers
    # over PP 4 is not the run's): Megatron-Bridge's recompute skill's Llama3 70B table
    paste = "recompute_granularity=selective, recompute_modules=[mlp] (Exp 1); TP=4, PP=4"
    assert "RK097" not in ids(run(config=paste, config_name="config.txt"))


def test_a_flag_quoted_in_prose_is_no_refused_config():
    # https://github.com/epfLLM/Megatron-LLM/pull/86: `--recompute_granularity full` quoted in
    # a sentence, and the run's forward failing: the paste does not show the whole command,
    # so the recompute_method it leaves out is not read as missing (no RK050)
    d = run(text("megatronllm-86-full-recompute-position-ids"))
    assert "RK050" not in ids(d)
    assert any("recompute_method" in a and "not read" in a for a in d.assumptions)


def test_a_whole_config_pasted_without_a_method_is_refused():
    shape = "num_layers: 4\nhidden_size: 256\nnum_attention_heads: 4\nseq_length: 128\n"
    d = run(shape + "recompute_granularity: full\n")
    assert "RK050" in ids(d)
