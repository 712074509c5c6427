"""Tests of the rules in recompute_kit/doctor/rules/no_effect.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from pathlib import Path

from rule_helpers import (
    DEEPSEEK_V2_LITE_MLP,
    GIB,
    LLAMA3_8B_SELECTIVE,
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

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import (
    Evidence,
)


@covers("RK651")
def test_r6a_rk651_reentrant_checkpoint_inputs_without_requires_grad():
    # https://github.com/pytorch/pytorch/issues/7617: "if the all the inputs have requires_grad
    # to be False, the output will also checkpoint(...) will also have requires_grad to be
    # False" (ruotianluo; the checkpoint author states the same limit in #6884)
    f = top(run(text("r6a-pt7617-ckpt-inputs-no-grad")))
    assert f.rule == "RK651" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"use_reentrant": False}
    assert "x = torch.randn(10,4)" in f.evidence and "requires_grad_()" in f.fix


def test_r6a_rk651_mutations():
    base = text("r6a-pt7617-ckpt-inputs-no-grad")
    # the input requires grad, the call is non-reentrant, or nothing looks at the gradient
    assert "RK651" not in ids(
        run(base.replace("torch.randn(10,4)", "torch.randn(10,4, requires_grad=True)"))
    )
    assert "RK651" not in ids(run(base.replace("m(_), x)", "m(_), x, use_reentrant=False)")))
    assert "RK651" not in ids(run(base.replace(".requires_grad)", ".shape)")))
    # a traceback in the paste: the failure is what to read, not this
    failing = (
        base
        + "\nTraceback (most recent call last):\nRuntimeError: CUDA error: device-side assert\n"
    )
    assert "RK651" not in ids(run(failing))


@covers("RK652")
def test_r6a_rk652_trainer_resets_model_gc_kwargs():
    # https://github.com/huggingface/transformers/issues/26221: pacman100: "You were correctly
    # setting model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=...) but the
    # Trainer was resetting it because of trainingArgument gradient_checkpointing". The paste
    # is the reporter's diff: its old version ("-" and unmarked lines) is what failed.
    d = run(text("r6a-hf26221-trainer-resets-gc-kwargs"))
    f = top(d)
    assert f.rule == "RK652" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    assert "gradient_checkpointing=cp_enabled" in f.evidence


def test_r6a_rk652_mutations():
    base = text("r6a-hf26221-trainer-resets-gc-kwargs")
    # the trainer gets the kwargs too (the diff applied: "+" lines kept), or checkpointing is
    # off in the trainer's arguments: nothing is overridden
    applied = base.replace("\n+", "\n ").replace("\n-", "\n#")
    assert "RK652" not in ids(run(applied))
    off = base.replace("gradient_checkpointing=cp_enabled,", "gradient_checkpointing=False,")
    assert "RK652" not in ids(run(off))
    no_kwargs = base.replace("gradient_checkpointing_enable(gradient_checkpointing_kwargs=", "x(")
    assert "RK652" not in ids(run(no_kwargs))


@covers("RK681")
def test_r8a_rk681_compiled_backward_trace():
    # https://github.com/Lightning-AI/lightning-thunder/issues/1379: "When recomputation is
    # enabled, the earlier part of the backward trace is just recomputing and then post that we
    # use the gradient from loss function (so it gets used later and deleted later" (kshitij12345)
    f = top(run(text("r8a-thunder1379-backward-trace")))
    assert f.rule == "RK681" and f.category == "recompute_no_effect"
    assert f.config_patch == {"enable_saved_for_backward_recomputation": True}
    assert "backward_fn(saved_for_backward, cotangents)" in f.evidence


def test_r8a_rk681_mutations():
    base = text("r8a-thunder1379-backward-trace")
    # a forward function's signature is no compiled backward
    fwd = base.replace("def backward_fn(saved_for_backward, cotangents):", "def forward_fn(a):")
    assert "RK681" not in ids(run(fwd))
    # a traceback pasted with it: the error is what to read
    err = base + "RuntimeError: expected scalar type Float but found Half\n"
    assert "RK681" not in ids(run(err))


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


@covers("RK092")
def test_rk092_deepspeed_activation_checkpointing_section_alone():
    d = run("", config=text("i12-ds-5704"), config_name="ds_config.json")
    f = top(d)
    assert f.rule == "RK092" and f.category == "recompute_no_effect"
    assert f.config_patch == {"gradient_checkpointing": True}


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


def test_rk157_prose_about_memory_is_not_a_library_notice():
    # pytorch#28113 (a non_pytorch_memory dev case): the reporter's own sentence says memory
    # usage and "using"; only a library's voice (a logger prefix, "falling back to") is a notice.
    from recompute_kit.doctor.evidence.code import scan_snippets

    line = (
        "The nvidia-smi will show an increase in memory usage, while the torch.cuda says it's "
        "using 0 memory."
    )
    assert "notices" not in scan_snippets(line)


@covers("RK160")
def test_rk160_flag_given_but_printed_false():
    # DeepSpeedExamples#332's command (--gradient_checkpointing) with the script's own printed
    # arguments saying the opposite (as transformers prints TrainingArguments).
    log = "TrainingArguments(\n_n_gpu=1,\ngradient_checkpointing=False,\nlearning_rate=9.65e-06,\n"
    d = run(log, config=text("i13-dsexamples-332-config"), config_name="x.sh")
    f = top(d)
    assert f.rule == "RK160" and f.category == "recompute_no_effect"
    cites(f, "gradient_checkpointing=False")


def test_rk053_invalid_activation_recompute_method_sets_a_method():
    # Megatron-Core's layer loop: ValueError("Invalid activation recompute method.")
    f = top(run("ValueError: Invalid activation recompute method."))
    assert f.rule == "RK053" and f.config_patch["recompute_method"] == "uniform"


def test_pasted_command_line_joins_the_config():
    # https://github.com/hiyouga/LlamaFactory/issues/922: the launch command is all the paste.
    d = run(text("i13-llamafactory-922"))
    cfg = d.evidence.config
    assert cfg["per_device_train_batch_size"] == 4 and cfg["finetuning_type"] == "lora"
    assert cfg["visible_devices"] == 1  # CUDA_VISIBLE_DEVICES=0
    # an explicit config wins over what the log pastes
    d = run(text("i13-llamafactory-922"), config="per_device_train_batch_size: 1\n")
    assert d.evidence.config["per_device_train_batch_size"] == 1


# =============================================================================================
# RK020-RK023: settings that do not do what they seem to
# =============================================================================================


@covers("RK020")
def test_rk020_core_attn_with_fused_attention():
    # --recompute-activations (selective core_attn) with TransformerEngine attention and a real
    # OOM: the setting Megatron-LM#1225/#464 report as buying almost nothing.
    d = run(text("oom-msswift-9191"), config=LLAMA3_8B_SELECTIVE, config_name="l8b.sh")
    f = get(d, "RK020")
    assert f.category == "recompute_no_effect"
    assert f.confidence == 0.7
    assert f.config_patch["recompute_modules"] == ["mlp"]
    cites(f, "'selective:mlp'")


def _gpt3_with_recompute_activations() -> str:
    """Megatron-LM's examples/gpt3 175B script (tests/sources/corpus) with the flag a skill
    trial's user added: --recompute-activations (selective, core_attn)."""
    script = (
        Path(__file__).parent / "sources/corpus/megatron_lm/blind_gpt3_175b_distributed.sh"
    ).read_text()
    return script.replace("--seq-length 2048 ", "--seq-length 2048 --recompute-activations ")


@covers("RK020")
def test_rk020_next_step_is_the_cheaper_of_the_ffn_and_a_few_whole_layers():
    # A skill trial: Megatron-LM's examples/gpt3 175B script (tests/sources/corpus, TP8 PP16)
    # with --recompute-activations, "memory did not go down": RK020's next step was
    # 'selective:mlp' "(costly: ~16% on 70B)", a figure of another model; by this config's
    # estimate mlp saves 8.9 GiB for 21.9% extra FLOPs, full:block:3 as much for 16.6%.
    flagged = _gpt3_with_recompute_activations()
    d = run(
        config=flagged,
        config_name="run.sh",
        gpu_memory_gb=79.1,
        overrides={"data_parallel_size": 16},
    )
    f = get(d, "RK020")
    assert "'full:block:" in f.evidence and "against its" in f.evidence
    assert f.config_patch["recompute_granularity"] == "full"
    assert "70B" not in f.evidence


@covers("RK020")
def test_rk020_measured_no_change_decides_it():
    # The same trial's user had measured it: with and without --recompute-activations the
    # peaks agreed to 0.1% (their Megatron memory report lines, as a table). The doctor asked
    # for exactly that measurement (needs_evidence, 45%); measured, the finding is decided.
    flagged = _gpt3_with_recompute_activations()
    table = (
        "| recompute | max allocated (MB) | max reserved (MB) |\n|---|---|---|\n"
        "| none | 61877.2 | 64820.0 |\n| selective | 61850.1 | 64818.0 |\n"
    )
    dp16 = {"data_parallel_size": 16}
    d = run(config=flagged, config_name="run.sh", experiments=table, overrides=dp16)
    f = top(d)
    assert f.rule == "RK020" and "measured: 'selective' peaks at" in f.evidence
    assert d.verdict.verdict == "diagnosed"
    apart = table.replace("61850.1 | 64818.0", "52850.1 | 55818.0")
    g = get(run(config=flagged, config_name="run.sh", experiments=apart, overrides=dp16), "RK020")
    assert "measured" not in g.evidence and g.confidence < 0.85


@covers("RK020")
def test_rk020_not_with_unfused_attention():
    # With --attention-backend unfused the [b, a, s, s] scores exist and core_attn removes them.
    unfused = LLAMA3_8B_SELECTIVE.replace(
        "--transformer-impl transformer_engine", "--attention-backend unfused"
    )
    d = run(text("oom-msswift-9191"), config=unfused, config_name="l8b.sh")
    assert "RK020" not in ids(d)


@covers("RK021")
def test_rk021_mlp_recompute_on_an_all_moe_model():
    # Mixtral-8x7B recomputing 'mlp' (skipped by Megatron on MoE layers), real H200 OOM.
    d = run(text("oom-msswift-9191"), config=MIXTRAL_8X7B_MLP, config_name="mixtral.sh")
    f = get(d, "RK021")
    assert f.confidence == 0.75
    assert f.config_patch["recompute_modules"] == ["layernorm", "moe_act"]
    assert "every layer is MoE" in f.evidence


@covers("RK021")
def test_rk021_not_where_mlp_recomputes_the_dense_layers():
    # DeepSeek-V2-Lite: the first layer is dense, the 26 others MoE: mlp recomputes the dense
    # layer's MLP, so "does nothing" is false (a skill trial on Bridge's DeepSeek-V3 recipe,
    # dense layers 0-2, got it beside a top finding that kept mlp)
    d = run(text("oom-msswift-9191"), config=DEEPSEEK_V2_LITE_MLP, config_name="dsv2l.yaml")
    assert "RK021" not in ids(d)


@covers("RK021")
def test_rk021_not_on_a_dense_model():
    cfg = LLAMA3_8B_SELECTIVE.replace(
        "--recompute-activations", "--recompute-granularity selective --recompute-modules mlp"
    )
    assert "RK021" not in ids(run(text("oom-msswift-9191"), config=cfg, config_name="x.sh"))


@covers("RK022")
def test_rk022_layernorm_recompute_still_ooms():
    # seed 001, the skill's Llama3-70B table: "Exp 3 | [core_attn, layernorm] | ... | OOM".
    d = run(experiments=text("seed-001-perf-activation-recompute"))
    f = get(d, "RK022")
    assert f.category == "recompute_no_effect"
    cites(f, "Exp 3", "layernorm")
    assert f.config_patch["recompute_granularity"] == "selective"
    assert "mlp" in f.config_patch["recompute_modules"]


@covers("RK022")
def test_rk022_not_when_no_layernorm_row_ooms():
    # The same table without the Exp 3 row (only verbatim lines removed).
    table = "\n".join(
        line
        for line in text("seed-001-perf-activation-recompute").splitlines()
        if not line.startswith("| Exp 3 |")
    )
    assert "RK022" not in ids(run(experiments=table))


@covers("RK023")
def test_rk023_recompute_num_layers_without_a_granularity():
    # A launcher that sets the method and layer count but no --recompute-granularity (Megatron
    # then recomputes nothing), with the real H200 OOM (oom-msswift-9191).
    cfg = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 \\
    --hidden-size 4096 \\
    --num-attention-heads 32 \\
    --seq-length 8192 \\
    --micro-batch-size 1 \\
    --tensor-model-parallel-size 2 \\
    --use-distributed-optimizer \\
    --recompute-method uniform \\
    --recompute-num-layers 1 \\
    --bf16
"""
    f = get(run(text("oom-msswift-9191"), config=cfg, config_name="train.sh"), "RK023")
    assert f.category == "recompute_no_effect"
    assert "recompute_granularity is empty" in f.evidence


@covers("RK023")
def test_rk023_full_recompute_with_the_same_peak_as_none():
    # WEAK: no public ablation table shows identical peaks. radixark/miles PR #1482 describes
    # the case ("--recompute-granularity full never engages"; ~136 GiB/GPU either way); the
    # rows below restate it.
    rows = [
        {"name": "baseline", "recompute": "none", "peak_memory_bytes": 136 * GIB},
        {"name": "full", "recompute": "full:uniform:1", "peak_memory_bytes": 136 * GIB},
    ]
    f = get(diagnose(Evidence(experiments=rows)), "RK023")
    cites(f, "'full'", "136.00 GiB", "'baseline'")


@covers("RK023")
def test_rk023_not_when_granularity_is_set():
    # The real Megatron argument dump (full, uniform, 2) and the Megatron-LM#525 OOM.
    d = run(text("ex-args-local-v014-full") + text("oom-mlm-525"))
    assert d.evidence.config["recompute_granularity"] == "full"
    assert "RK023" not in ids(d)


# https://github.com/NVIDIA/Megatron-LM/issues/1886 : the report's opening sentence, verbatim;
# the flags it added to Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh are quoted by
# the maintainer there: `--recompute-granularity selective --recompute-modules core_attn`
ISSUE_1886 = (
    "When enabling activation checkpointing (recomputation) for the core_attn module in "
    "Megatron-LM, the overall GPU memory consumption does not decrease as expected.\n"
)
LLAMA3_FP8 = Path(__file__).parent / "sources/corpus/megatron_lm/blind_llama3_8b_h100_fp8.sh"


@covers("RK020")
def test_rk020_reads_core_attn_from_the_report_and_the_added_flags_from_their_own_file(tmp_path):
    """A skill trial: the flags in a file of their own were refused ("not a training config"),
    and with the script alone the doctor led with the generic stated reading (RK800), although
    the report names core_attn and the script runs fused attention."""
    from recompute_kit.doctor.evidence import collect

    log = tmp_path / "report.md"
    log.write_text(ISSUE_1886)
    flags = tmp_path / "added_flags.txt"
    flags.write_text("--recompute-granularity selective --recompute-modules core_attn\n")
    for config in ([str(LLAMA3_FP8)], [str(LLAMA3_FP8), str(flags)]):
        d = diagnose(collect(logs=[str(log)], config=config), 79.1)
        assert d.findings[0].rule == "RK020", config
    read = collect(config=[str(LLAMA3_FP8), str(flags)]).read
    assert read["config"]["recompute_modules"] == ["core_attn"]
    # the patch in Megatron-LM's flags: no flag set to null that the script never passes
    keys = d.findings[0].patch_keys
    assert keys["--recompute-modules"] == "mlp" and None not in keys.values()
