"""Rules RK140-RK160: checkpointing that does not act, recompute that differs, configs."""

from __future__ import annotations

import pytest
from rule_helpers import (
    GIB,
    LLAMA3_70B_32K,
    LLAMA3_70B_MLM_1031,
    MIXTRAL_8X7B_MLP,
    cites,
    covers,
    get,
    ids,
    intended_patch,
    run,
    spec_patch,
    text,
    top,
)

# =============================================================================================
# RK140-RK160 (issue 13): checkpointing that does not act, recompute that differs, configs
# =============================================================================================


@covers("RK140")
def test_rk140_gradient_checkpointing_then_eval():
    # diffusers#9850: `block.gradient_checkpointing = True` then `block.eval()`.
    f = top(run(text("i13-diffusers-9850")))
    assert f.rule == "RK140" and f.category == "recompute_no_effect"
    cites(f, "block.gradient_checkpointing = True", "block.eval()")
    assert "block.train()" in f.config_patch["code"]


def test_rk140_not_for_inference_under_no_grad():
    # trl PR #4636's snippet: train(), gradient_checkpointing_enable(), then no_grad inference.
    snippet = (
        "model.train()\nmodel.gradient_checkpointing_enable()\n"
        "with torch.no_grad():\n    output = model(input_ids=input_ids)\nmodel.eval()\n"
    )
    assert "RK140" not in ids(run(snippet))


@covers("RK141")
def test_rk141_flags_given_but_the_argument_dump_says_none():
    # Megatron-LM's printed arguments of a run without recompute (large-scale-lm-tutorials)
    # next to the flags of Megatron-LM#1031 (full, uniform, 5).
    d = run(text("mlm-args-dump-recompute-none"), config=LLAMA3_70B_MLM_1031, config_name="run.sh")
    f = top(d)
    assert f.rule == "RK141" and f.category == "recompute_no_effect"
    assert intended_patch(f) == spec_patch("full", "uniform", 5)
    cites(f, "recompute_granularity full", "recompute_num_layers 5")


def test_rk141_not_when_the_dump_agrees():
    # real-formats.md ex-args-local-v014-full: the dump itself says full.
    assert "RK141" not in ids(run(text("ex-args-local-v014-full")))


@covers("RK142")
def test_rk142_nemo_null_granularity_overrides_recompute_granularity():
    # NeMo's megatron_gpt_config.yaml block, with the Megatron-Core keys a user adds under it.
    yaml_text = (
        "model:\n"
        + text("nemo-megatron-gpt-config-ac")
        + "  recompute_granularity: full\n  recompute_method: uniform\n  recompute_num_layers: 1\n"
    )
    d = run(config=yaml_text)
    assert d.evidence.config["recompute_granularity"] is None
    f = get(d, "RK142")
    assert f.category == "recompute_no_effect"
    assert f.config_patch["activations_checkpoint_granularity"] == "full"
    assert f.config_patch["activations_checkpoint_method"] == "uniform"
    # pasted into a log instead of given as the config: the same
    assert "RK142" in ids(run(yaml_text))


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


@covers("RK143")
def test_rk143_layernorm_recompute_on_a_dense_te_model():
    # The skill's Llama3-70B Exp 3 (seed 001): [core_attn, layernorm] is as large as the
    # baseline; dense Llama with Transformer Engine fuses both norms.
    config = LLAMA3_70B_32K + "    --recompute-granularity selective \\\n"
    config += "    --recompute-modules core_attn layernorm\n"
    d = run(config=config, config_name="run.sh")
    f = get(d, "RK143")
    assert f.category == "recompute_no_effect"
    assert f.config_patch["recompute_modules"] == ["core_attn", "mlp"]
    assert "RK143" not in ids(run(config=MIXTRAL_8X7B_MLP.replace(" mlp ", " layernorm ")))


@covers("RK144")
def test_rk144_oom_with_checkpointing_under_a_compiler():
    # lightning-thunder#2116: OOM with --checkpoint_activations=True and --compile dynamo_thunder.
    d = run(text("i13-thunder-2116"), config=text("i13-thunder-2116-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK144" and f.category == "recompute_no_effect"
    assert f.config_patch == {"compile": False, "checkpoint_activations": True}


@covers("RK145")
def test_rk145_debug_mode_names_the_first_different_op():
    # torch.utils.checkpoint(debug=True) output, reproduced on CPU: topk only in the recompute.
    d = run(text("ckpt-local-debug-topk"))
    f = top(d)
    assert f.rule == "RK145" and f.category == "nondeterministic_recompute"
    cites(f, "aten.cos in the forward, aten.topk in the recompute", "A routing / token-count op")
    assert "router" in f.fix and "RK075" not in ids(d)
    assert "aten.topk" in f.config_patch["code"]


@covers("RK146")
def test_rk146_checkpoint_under_bf16_autocast():
    # pytorch#71124: checkpoint(b, x) inside torch.cuda.amp.autocast(dtype=torch.bfloat16).
    f = top(run(text("i13-pt-71124")))
    assert f.rule == "RK146" and f.category == "nondeterministic_recompute"
    assert "upgrade torch" in f.fix.lower() and f.config_patch["use_reentrant"] is False
    cites(f, "x = checkpoint(b, x)", "autocast(dtype=torch.bfloat16)")


def test_rk146_not_on_code_alone():
    # pytorch#71124's script without its printed output: checkpoint + bf16 autocast is how many
    # training scripts read; without dtypes printed the paste is not about the recompute's dtype.
    code = text("i13-pt-71124").split("Output dtype: torch.bfloat16")[0]
    assert "autocast(dtype=torch.bfloat16)" in code and "checkpoint(b, x)" in code
    assert "RK146" not in ids(run(code))


@covers("RK147")
def test_rk147_dropout_without_rng_state_shifts_the_loss():
    # OLMo-core PR #828: CE 2.49 with AC on vs 2.19 off, residual dropout 0.1.
    d = run(text("i13-olmocore-828"), config=text("i13-olmocore-828-config"))
    f = top(d)
    assert f.rule == "RK147" and f.category == "nondeterministic_recompute"
    assert f.config_patch == {"preserve_rng_state": True}
    cites(f, "response_residual_dropout = 0.1", "2.491", "2.194")


@covers("RK148")
def test_rk148_traceback_cut_in_the_reentrant_backward_under_deepspeed():
    # DeepSpeed#988: the loss scaler's backward into torch/utils/checkpoint.py backward.
    f = top(run(text("i13-ds-988")))
    assert f.rule == "RK148" and f.category == "checkpoint_api_misuse"
    assert f.config_patch["zero_optimization"] == {"stage": 1}
    assert f.config_patch["gradient_checkpointing_kwargs"] == {"use_reentrant": False}


def test_rk148_not_without_a_hook_reducing_wrapper():
    # The tail of DeepSpeed#988's traceback, from torch/_tensor.py on (a paste that starts
    # below the DeepSpeed frames): the same cut backward through the reentrant checkpoint, but
    # nothing that reduces gradients from hooks; any error (an OOM in the recompute, a shape
    # error) could end it, so RK148 stays silent.
    tail = "\n".join(text("i13-ds-988").splitlines()[3:])
    assert "deepspeed" not in tail and "utils/checkpoint.py" in tail
    assert "RK148" not in ids(run(tail))


@covers("RK149")
def test_rk149_requires_grad_warning_in_full_training():
    # open_clip#573: the warning with a plain training command (--grad-checkpointing).
    d = run(text("i13-openclip-573"), config=text("i13-openclip-573-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"use_reentrant": False} and "RK099" not in ids(d)
    # the same warning alone (InternLM-XComposer#326) stays informational
    assert top(run(text("i12-internlm-326"))).rule == "RK099"


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


@covers("RK154")
def test_rk154_max_split_with_expandable_segments():
    # pytorch#123548: PYTORCH_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True.
    f = top(run(text("i13-pt-123548")))
    assert f.rule == "RK154" and f.category == "framework_bug"
    assert f.config_patch == {"env": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}}


@covers("RK155")
def test_rk155_checkpoint_on_xpu_hits_the_cuda_path():
    # pytorch#128478: test_gradient_checkpointing - RuntimeError: PyTorch was compiled without
    # CUDA support.
    f = top(run(text("i13-pt-128478")))
    assert f.rule == "RK155" and f.category == "framework_bug"
    assert "DefaultDeviceType" in f.fix and "upgrade torch" in f.fix.lower()


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


def test_rk157_prose_about_memory_is_not_a_library_notice():
    # pytorch#28113 (a non_pytorch_memory dev case): the reporter's own sentence says memory
    # usage and "using"; only a library's voice (a logger prefix, "falling back to") is a notice.
    from recompute_kit.doctor.evidence.code import scan_snippets

    line = (
        "The nvidia-smi will show an increase in memory usage, while the torch.cuda says it's "
        "using 0 memory."
    )
    assert "notices" not in scan_snippets(line)


@covers("RK158")
def test_rk158_nccl_cumem_warning_from_vllm():
    # open-instruct PR #838: vLLM's "WARNING 07-29 15:39:27 [env_override.py:17] ..." line.
    d = run(text("i13-open-instruct-838"))
    assert d.evidence.errors[0].frames == ["env_override.py:17"]
    f = top(d)
    assert f.rule == "RK158" and f.category == "informational"


@covers("RK159")
def test_rk159_checkpointing_works_the_reading_was_wrong():
    # DeepSpeedExamples#332: 6.4G both ways by one measure, MaxMemAllocated 11.76 vs 44.23 GB.
    config = text("i13-dsexamples-332-config")
    d = run(text("i13-dsexamples-332"), config=config, config_name="x.sh")
    f = top(d)
    assert f.rule == "RK159" and f.category == "informational"
    cites(f, "max_seq_len 64")
    assert "MaxMemAllocated" in f.fix


@covers("RK160")
def test_rk160_flag_given_but_printed_false():
    # DeepSpeedExamples#332's command (--gradient_checkpointing) with the script's own printed
    # arguments saying the opposite (as transformers prints TrainingArguments).
    log = "TrainingArguments(\n_n_gpu=1,\ngradient_checkpointing=False,\nlearning_rate=9.65e-06,\n"
    d = run(log, config=text("i13-dsexamples-332-config"), config_name="x.sh")
    f = top(d)
    assert f.rule == "RK160" and f.category == "recompute_no_effect"
    cites(f, "gradient_checkpointing=False")


# ---- widened existing rules (issue 13) ------------------------------------------------------


def test_rk083_zero3_shape_zero_in_a_shortened_paste():
    # transformers#47254: "saved {'shape': [1024]} vs recomputed {'shape': [0]}".
    d = run(text("i13-hf-47254"))
    f = top(d)
    assert f.rule == "RK083" and f.category == "framework_bug" and "RK075" not in ids(d)
    cites(f, "[1024]")


def test_rk075_tensor_count_mismatch_names_the_gate():
    # pytorch#171355: 2634 tensors saved in the forward, 884 in the recompute.
    f = top(run(text("i13-pt-171355")))
    assert f.rule == "RK075" and "gate" in f.fix and "target_modules" in f.fix
    cites(f, "2634", "884")


def test_rk077_old_transformers_is_a_config_matter():
    # transformers#15959: "DebertaV2Model does not support gradient checkpointing!"
    f = top(run(text("i13-hf-15959")))
    assert f.rule == "RK077" and f.category == "invalid_config"
    assert "upgrade transformers" in f.fix.lower()


def test_rk033_table_arms_named_by_their_recompute():
    # Megatron-LM PR #6311: "no overlap, no recompute" 225.1 vs full recompute 184.2 TFLOP/s.
    d = run(text("i13-megatron-pr6311"))
    rows = d.evidence.experiments
    assert rows[0]["recompute"] == "none" and rows[1]["recompute"] == "full:uniform:1"
    assert rows[1]["vs_golden"] == pytest.approx(184.2 / 225.1 - 1, abs=1e-3)
    f = top(d)
    assert f.rule == "RK033" and f.category == "recompute_overhead"
    cites(f, "-18.2%")


def test_rk053_invalid_activation_recompute_method_sets_a_method():
    # Megatron-Core's layer loop: ValueError("Invalid activation recompute method.")
    f = top(run("ValueError: Invalid activation recompute method."))
    assert f.rule == "RK053" and f.config_patch["recompute_method"] == "uniform"


@covers("RK110")
def test_rk110_source_line_of_adam_pasted_before_the_oom():
    # https://github.com/hiyouga/LlamaFactory/issues/1221: only Adam's source line ("denom =
    # (exp_avg_sq.sqrt() ...") precedes the OOM (kept as its context). The maintainer: ZeRO-2
    # needs 80G; the reporter ran with ZeRO-3.
    d = run(text("i12-llamafactory-1221"))
    f = top(d)
    assert f.rule == "RK110" and f.category == "model_state_memory"
    assert "exp_avg_sq" in f.evidence
    cites(f, "3.14 GiB", "28.28 GiB", "31.75 GiB")
    assert "ZeRO-3" in f.fix and f.config_patch == {"zero_optimization": {"stage": 3}}
    assert {"rule": "RK036", "reason": "superseded by RK110"} in d.dropped


@covers("RK110")
def test_rk110_not_for_an_oom_outside_the_optimizer():
    # pytorch#35901's OOM (no optimizer frame) and a real traceback through the loss
    # (Megatron-LM#92): not the optimizer step.
    assert "RK110" not in ids(run(text("i12-pt-35901")))
    assert "RK110" not in ids(run(text("mlm-92")))


@covers("RK101")
def test_rk101_lora_under_ddp_replicates_weights_above_any_80gb_gpu():
    # https://github.com/hiyouga/LlamaFactory/issues/2379: Mixtral-8x7B LoRA on 8 GPUs with
    # accelerate's MULTI_GPU (DDP, no ZeRO); no OOM message and no GPU size pasted. The
    # maintainer: launch with DeepSpeed ZeRO-3.
    d = run(text("i13-llamafactory-2379"), config=text("i13-llamafactory-2379-config"))
    assert d.evidence.config["finetuning_type"] == "lora"  # read from the pasted command
    f = top(d)
    assert f.rule == "RK101" and f.category == "model_state_memory"
    cites(f, "56.0B", "8 GPU(s)", "104.31 GiB", "80.00 GiB")
    assert f.config_patch == {"zero_optimization": {"stage": 3}} and "ZeRO-3" in f.fix


@covers("RK101")
def test_rk101_not_when_zero3_and_the_gpu_count_are_unknown():
    # https://github.com/hiyouga/LlamaFactory/issues/5977: full fine-tuning of Llama-3-8B with
    # ds_z3_config.json, pasted YAML only: ZeRO-3 shards over GPUs the paste does not count, so
    # no per-GPU figure can be claimed.
    d = run(text("i13-llamafactory-5977"))
    assert d.evidence.config["deepspeed"].endswith("ds_z3_config.json")
    assert "RK101" not in ids(d)


def test_pasted_command_line_joins_the_config():
    # https://github.com/hiyouga/LlamaFactory/issues/922: the launch command is all the paste.
    d = run(text("i13-llamafactory-922"))
    cfg = d.evidence.config
    assert cfg["per_device_train_batch_size"] == 4 and cfg["finetuning_type"] == "lora"
    assert cfg["visible_devices"] == 1  # CUDA_VISIBLE_DEVICES=0
    # an explicit config wins over what the log pastes
    d = run(text("i13-llamafactory-922"), config="per_device_train_batch_size: 1\n")
    assert d.evidence.config["per_device_train_batch_size"] == 1


@covers("RK001", "RK005")
def test_fragmentation_follows_when_the_slack_is_a_sliver_of_a_full_gpu():
    # https://github.com/NVIDIA-NeMo/Automodel/issues/3907: 2.00 GiB reserved-unallocated
    # against a 720 MiB request, but 171.63 GiB of 184.31 GiB allocated: the slack is 1% of
    # the GPU. RK001 stays listed, after the memory finding.
    d = run(text("i13-automodel-3907"))
    assert ids(d)[0] == "RK005" and "RK001" in ids(d)
    assert get(d, "RK001").confidence < top(d).confidence


@covers("RK102")
def test_rk102_leads_on_a_2gb_gpu_with_51mib_slack():
    # https://github.com/pkhungurn/talking-head-anime-demo/issues/36: 2.00 GiB GPU, 20 MiB
    # request, 51.20 MiB reserved-unallocated; the maintainer: batch is already 1, the GPU is
    # too small.
    d = run(text("i13-talking-head-36"))
    f = top(d)
    assert f.rule == "RK102" and "larger GPU" in f.fix
    assert ids(d).index("RK001") > 0


@covers("RK089", "RK102")
def test_rk089_not_for_a_1x_message_whose_cached_memory_is_pytorchs():
    # https://github.com/IDKiro/CBDNet-pytorch/issues/7 (PyTorch <= 1.4 "cached" format):
    # 10.85 GiB allocated + 128.66 MiB cached + 56.62 MiB free of 11.92 GiB leaves 0.89 GiB
    # outside PyTorch (the CUDA context and display), not 11.74 GiB. Maintainer: the input
    # image is too big for an 11 GiB GPU.
    d = run(text("i13-cbdnet-7"))
    oom = d.evidence.oom[0]
    assert oom.reserved_unallocated_bytes == round(128.66 * 2**20)
    assert 0.85 * GIB < oom.held_elsewhere_bytes < 0.95 * GIB
    assert "RK089" not in ids(d)
    f = top(d)
    assert f.rule == "RK102" and "smaller inputs" in f.fix


@covers("RK004")
def test_rk004_ipex_per_allocation_limit():
    # https://github.com/intel/intel-extension-for-pytorch/issues/629: a 6.85 GiB tensor on a
    # 15.56 GiB Intel GPU fails because one block may not exceed 4 GB.
    d = run(text("ipex-629"))
    oom = d.evidence.oom[0]
    assert oom.backend == "xpu" and oom.allocation_limit_bytes == 4 * GIB
    f = top(d)
    assert f.rule == "RK004"
    cites(f, "6.85 GiB", "4.00 GiB")
