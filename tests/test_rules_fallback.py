"""Tests of the rules in recompute_kit/doctor/rules/fallback.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import (
    cites,
    covers,
    get,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.evidence import (
    parse_config,
)

# =============================================================================================
# RK170-RK171: default readings when no specific rule fires. Texts are tests/data/rules/i17-*
# (and two i13 ones), verbatim from dev corpus cases (URLs in SOURCES); "[... cut by corpus ...]"
# marks where the case's author cut the thread's text.
# =============================================================================================


@covers("RK170")
def test_rk170_an_oom_in_words_beside_a_step_that_fits_stays_possible(tmp_path):
    # A real Megatron-LM launch script (GPT 345M, tests/sources/corpus/megatron_lm), an OOM said
    # in words, an 80 GB GPU: the step is estimated at about 5 GiB, so the knobs of the step are
    # not the likely cause; the reading says so and stays below 0.2 (a skill trial was led to
    # "recompute more" by a 42 GiB estimate on a 79 GiB GPU)
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    script = Path(__file__).parent / "sources/corpus/megatron_lm"
    script = script / "blind2_beinggod_pretrain_gpt_345m_N1C2.sh"
    log = tmp_path / "said.log"
    log.write_text("CUDA out of memory when I start training with this script.\n")
    on_h100 = diagnose(collect(logs=[str(log)], config=str(script)), 79.1)
    f = top(on_h100)
    assert f.rule == "RK170" and f.raw_confidence <= 0.2
    assert "do not explain an OOM by themselves" in f.evidence
    # on a GPU the estimate fills, the reading stands
    small = top(diagnose(collect(logs=[str(log)], config=str(script)), 6.0))
    assert small.rule == "RK170" and small.raw_confidence > 0.2
    assert "do not explain" not in small.evidence


@covers("RK170")
def test_rk170_llamafactory_command_halves_the_batch_and_keeps_the_global_one():
    # https://github.com/hiyouga/LlamaFactory/issues/922: only the launch command is pasted;
    # maintainer: one over-long sample blew up the GPU, reduce the batch size.
    d = run(text("i13-llamafactory-922"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory" and len(d.findings) == 1
    assert f.config_patch == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
    assert f.evidence.startswith("Default reading")
    cites(f, "per_device_train_batch_size = 4", "gradient_accumulation_steps = 4", "LoRA")
    cites(f, "LlamaFactory's default: on")  # checkpointing absent: on in LlamaFactory
    assert f.fix.startswith("Activation memory, cheapest change first: 1. ")
    assert "2. cap the tokens per sample (cutoff_len" in f.fix


@covers("RK170")
def test_rk170_checkpointing_switched_off_in_the_config_under_its_own_key():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2585: "CUDA OOM" in a results table, and a
    # config with distributed.activation_checkpointing false; the merged fix turns it on.
    d = run(text("i17-automodel-2585"), config=text("i17-automodel-2585-config"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert f.config_patch == {"distributed.activation_checkpointing": True}
    cites(f, "CUDA OOM", "(off)")
    # the table's header names the switch (comparing on with off): not a state of the run
    d = run(text("i17-automodel-2585"))
    assert top(d).config_patch == {"activation_checkpointing": True}
    assert "CUDA OOM" in top(d).evidence


@covers("RK170")
def test_rk170_plain_argparse_flags_batch_first_and_checkpointing_absent_is_off():
    # https://github.com/openai/improved-diffusion/issues/3: TRAIN_FLAGS="--lr 1e-4
    # --batch_size 4"; maintainer: try --microbatch or --use-checkpoint.
    d = run(text("i17-improved-diffusion-3"))
    f = top(d)
    assert f.rule == "RK170" and f.config_patch == {"batch_size": 2}
    cites(f, "batch_size = 4", "gradient checkpointing: not in the paste (off")
    assert "global batch halves unless the script accumulates" in f.fix
    assert "2. activation (gradient) checkpointing" in f.fix


@covers("RK170")
def test_rk170_names_the_sequence_caps_the_paste_sets():
    # https://github.com/THUDM/slime/issues/1450: the rollout length caps; the OOM came from a
    # sample longer than rollout_max_context_len that SFT rollout did not truncate.
    d = run(config=text("i17-slime-1450-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK170"
    cites(f, "rollout_max_context_len = 8192", "no OOM message pasted")
    assert "rollout_max_context_len 8192 -> 4096" in f.fix and f.config_patch


@covers("RK171")
def test_rk171_full_fine_tune_at_batch_1_with_zero3_offloads_the_optimizer():
    # https://github.com/hiyouga/LlamaFactory/issues/5977: full fine-tuning of Llama-3-8B with
    # ds_z3_config.json OOMs on 3090s, ds_z3_offload_config.json runs (maintainer: normal).
    d = run(text("i13-llamafactory-5977"))
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory" and len(d.findings) == 1
    assert f.config_patch == {"deepspeed": "examples/deepspeed/ds_z3_offload_config.json"}
    cites(f, "about 8B parameters", "per_device_train_batch_size = 1", "ZeRO stage 3")
    cites(f, "119.21 GiB", "does not count the GPUs")
    assert "finetuning_type: lora" in f.fix and "recompute cannot free" in f.fix


@covers("RK171")
def test_rk171_model_size_unnamed_but_batch_1_and_checkpointing_on():
    # https://github.com/Alpha-VLLM/LLaMA2-Accessory/issues/26: --batch_size 1 --checkpointing
    # --model_parallel_size 2 on 2 GPUs; maintainer: optimizer states of a full fine-tune need
    # more GPUs, or parameter-efficient tuning.
    d = run(text("i17-llama2-accessory-26"))
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory"
    assert f.config_patch == {"model_parallel_size": 4, "nproc_per_node": 4}
    cites(f, "batch_size = 1", "checkpointing = True (on)", "full training assumed")
    assert "LoRA" in f.fix


def test_default_readings_only_when_nothing_else_fires():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/1975: a real OOM message makes RK087 fire;
    # with LlamaFactory#922's command added the default readings stay silent.
    d = run(text("i12-automodel-1975") + "\n" + text("i13-llamafactory-922"))
    assert d.findings and not {"RK170", "RK171"} & set(ids(d))
    # https://github.com/pytorch/pytorch/issues/116928: a memory summary saying
    # "CUDA OOMs: 0" is no OOM, and it has no training knobs: no RK170/RK171; its peak is read
    # by the memory-figures default reading RK265 alone
    assert ids(run(text("i17-mistral-116928-summary"))) == ["RK265"]
    # real-formats.md oom-pt-16417-title: 9.28 GiB free yet OOM: no knob reading either; the
    # driver reading (RK421) alone
    assert ids(run(text("oom-pt-16417-title"))) == ["RK421"]


@covers("RK170", "RK171")
def test_batch_1_with_checkpointing_disabled_is_still_an_activation_reading():
    # https://github.com/hiyouga/LlamaFactory/issues/5977's YAML with LlamaFactory's switch
    # disable_gradient_checkpointing set: activations still have room, so RK170 (not RK171)
    # and the first step is the framework's own key.
    d = run(text("i13-llamafactory-5977"), config="disable_gradient_checkpointing: true\n")
    f = top(d)
    assert f.rule == "RK170" and "RK171" not in ids(d)
    assert f.config_patch == {"disable_gradient_checkpointing": False}
    cites(f, "disable_gradient_checkpointing = True (off)")


# Generic memory findings (RK087, RK005, RK004, RK102) in the paste's own knobs
# (rules/knob_advice.py); launch scripts whose flags sit in shell variables.
# =============================================================================================


def test_megatron_example_script_flags_in_quoted_shell_variables():
    # NVIDIA/Megatron-LM examples/pretrain_gpt_distributed.sh, verbatim (SOURCES): every flag
    # sits in a quoted, backslash-continued variable (GPT_ARGS="..."), expanded on the torchrun
    # line as $GPT_ARGS; GPUS_PER_NODE=8 is expanded inside DISTRIBUTED_ARGS.
    script = text("i22-mlm-pretrain-gpt-distributed")
    for flat in (parse_config(script, "pretrain_gpt_distributed.sh"), run(script).evidence.config):
        assert flat["micro_batch_size"] == 8 and flat["global_batch_size"] == 64
        assert flat["num_layers"] == 24 and flat["seq_length"] == 1024 and flat["fp16"] is True
        assert flat["nproc_per_node"] == 8 and flat["split"] == "949,50,1"
    # The default reading then names the script's own knob with its value.
    f = top(run(config=script, config_name="pretrain_gpt_distributed.sh"))
    assert f.rule == "RK170" and "micro_batch_size = 8" in f.evidence
    assert f.config_patch == {"micro_batch_size": 4}


# ---- RK170: the knobs of a pasted script's constants ----------------------------------------


@covers("RK170")
def test_fresh_rk170_micro_batch_size_in_pasted_constants():
    # https://github.com/Lightning-AI/lit-llama/issues/286: "still get OOM, on v100 32GB";
    # lantiga: batch_size does not change memory under gradient accumulation,
    # micro_batch_size does
    f = top(run(text("fd-litllama-286-micro-batch")))
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert f.config_patch == {"micro_batch_size": 1}
    assert "micro_batch_size = 2" in f.evidence
    # micro_batch_size alone does not make a script Megatron (no global_batch_size next to it)
    assert "Megatron" not in f.fix


@covers("RK170")
def test_rk170_sharded_states_small_on_the_stated_gpu_and_eager_attention():
    # https://github.com/OpenRLHF/OpenRLHF/issues/384: DPO of glm-4-9b with ZeRO-3,
    # micro_train_batch_size 1 and gradient checkpointing on "A100-80Gx8"; the fix was
    # --flash_attn. ZeRO-3 over 8 GPUs leaves ~17 GiB of states per 80 GiB GPU: activations.
    d = run(text("i26-openrlhf-384"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert d.evidence.facts["log"]["gpu_prose"]["count"] == 8
    cites(f, "about 9B parameters", "16.76 GiB per GPU")
    assert "flash_attn" in f.fix and "max_len 2048 -> 1024" in f.fix


@covers("RK171", "RK100")
def test_rk171_states_of_a_model_named_in_prose_not_a_separate_inference_engine():
    # https://github.com/OpenRLHF/OpenRLHF/issues/392: "16B模型", zero_stage 3 over
    # actor_num_gpus_per_node 4; maintainer: without Adam offload a large model OOMs. vLLM
    # runs on engines of its own (vllm_num_engines): no colocated-engine reading.
    d = run(text("i26-openrlhf-392"), config=text("i26-openrlhf-392-config"), config_name="run.sh")
    assert "RK100" not in ids(d)
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory"
    cites(f, "about 16B parameters", "59.60 GiB per GPU over 4 GPU(s)")
    assert "offload_optimizer" in f.fix
    # ref_reward_offload offloads the frozen models, not the actor's optimizer
    assert "offload on" not in f.evidence


@covers("RK170")
def test_r6p_rk170_names_the_batch_key_when_the_paste_sets_none():
    # https://github.com/unslothai/unsloth/issues/1418: "I think it's just due to excessive
    # batch size." (the paste sets no batch)
    f = top(run(text("r6p-unsloth-1418-batch")))
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert "batch_size" in f.fix and "not set in the paste" in f.fix


@covers("RK170")
def test_rk170_megatron_run_without_recompute_gets_a_step_the_estimator_shows_lowers_the_peak():
    # NeMo-RL's GRPO 8B Megatron config (tests/data/nemo_rl_launch/, NVIDIA-NeMo/RL 7ea279ab):
    # activation_checkpointing false, attention left to Megatron's auto (flash/fused) backend.
    # The default reading led with Megatron's bare `selective` (core_attn), which frees next to
    # nothing beside flash attention and raises the estimated peak: its patch was then dropped
    # and the words still led with it. The step shown is one the estimate says lowers the peak,
    # in NeMo-RL's keys (activation_checkpointing must be on for recompute_* to be read).
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    config = Path(__file__).parent / "data/nemo_rl_launch/examples/configs"
    config = config / "grpo_math_8B_megatron.yaml"
    d = diagnose(collect(config=str(config)), gpu_memory_gb=80)
    f = next(f for f in d.findings if f.rule == "RK170")
    check = f.patch_check
    assert f.config_patch.get("recompute_granularity") in ("selective", "full")
    assert f.config_patch != {"recompute_granularity": "selective"}
    assert check["peak_after_bytes"] < check["peak_before_bytes"]
    assert not [x for x in check["dropped"] if x["reason"].startswith("dropped")]
    step1 = f.fix.split("1. ", 1)[1].split(" 2. ")[0]
    assert step1.startswith("policy.megatron_cfg.activation_checkpointing: true")
    assert "recompute_granularity: selective" in step1 or "full" in step1


@covers("RK170")
def test_rk170_takes_the_plans_cheapest_fit_in_the_runs_override_syntax():
    # A skill trial: Megatron-Bridge's DeepSeek-V3 H100 recipe (tests/sources/corpus/bridge,
    # NVIDIA-NeMo/Megatron-Bridge 067f987) at DP 32 on 79.1 GiB GPUs, no recompute set. The
    # default reading led with mla_up_proj (+2.7% FLOPs) where `plan` fits with moe_act (no
    # matmul recomputed), wrote `model.recompute_granularity selective` (not an override) and
    # said the sequence length was not in the paste although the recipe's base sets 4096.
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    recipe = Path(__file__).parent / "sources/corpus/bridge/bridge_deepseek_v3_h100_recipes.py"
    evidence = collect(config=str(recipe), overrides={"data_parallel_size": 32})
    d = diagnose(evidence, gpu_memory_gb=72)  # (79.1: DeepSeekV3Bridge fusions fit as is)
    f = next(f for f in d.findings if f.rule == "RK170")
    assert f.config_patch["recompute_modules"] == ["moe_act"]
    step1 = f.fix.split("1. ", 1)[1].split(" 2. ")[0]
    assert step1.startswith(
        "model.recompute_granularity=selective model.recompute_modules=[moe_act]"
    )
    assert "dataset.seq_length 4096 -> 2048" in f.fix and "not set in the paste" not in f.fix


def test_rk170_takes_the_readers_values_over_every_file_s_raw_keys():
    """A skill trial (NeMo-RL's GRPO Qwen2.5-32B DTensor recipe given with its parent): the
    default reading listed the parent's 512-token length, LoRA from a disabled lora_cfg, and
    offered full recompute to a run that checkpoints every layer already, and shortening the
    Megatron inference engine's max_tokens. The shared reader's values are the run's."""
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    configs = Path(__file__).parent / "data/read/nemo_rl_dtensor/examples/configs"
    child = configs / "recipes/llm/grpo-qwen2.5-32b-32n8g-fsdp2tp8-actckpt-long.v3.yaml"
    d = diagnose(collect(config=[str(child), str(configs / "grpo_math_1B.yaml")]), 79.1)
    f = next(f for f in d.findings if f.rule == "RK170")
    assert "seq_length = 16384" in f.evidence  # (Megatron-Core's name for the run's length)
    assert "= 512" not in f.evidence and "LoRA" not in f.evidence
    assert "policy.max_total_sequence_length 16384 -> 8192" in f.fix  # in NeMo-RL's key
    assert "mcore_generation_config" not in f.fix
    assert "full:uniform:1" not in f.fix  # every layer is recomputed already


def test_rk170_does_not_take_lora_from_another_recipe_in_the_file():
    """A closing check on a file no test held (Bridge's qwen/h100/qwen3.py): the pretraining
    recipe's default reading said "LoRA (adapters on frozen weights)", from the words of the
    fine-tuning recipes beside it; the shared reader's reading of the recipe read decides."""
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    recipe = Path(__file__).parent / (
        "sources/corpus/bridge_checkout/src/megatron/bridge/recipes/qwen/h100/qwen3.py"
    )
    evidence = collect(config=[f"{recipe}::qwen3_8b_pretrain_4gpu_h100_bf16_config"])
    f = next(f for f in diagnose(evidence, 79.1).findings if f.rule == "RK170")
    assert "LoRA (adapters" not in f.evidence and "full training assumed" in f.evidence


def test_settings_in_the_reporters_words_are_read():
    # transformers#28022: "batch=1, seq_len=1024, using flash-attn", "I enable
    # gradient_checkpointing in the training_args". A skill trial: the knobs were "not in the
    # paste" and flash attention was advised to a run already on flash-attn 2.
    d = run(text("t11-transformers-28022"))
    # batch 1 with checkpointing on at 1024 tokens: the activations have no room left, so the
    # default reading is the model states' (RK171), which the thread's "checkpointing does not
    # save memory" agrees with
    f = next(f for f in d.findings if f.rule in ("RK170", "RK171"))
    assert f.rule == "RK171"
    assert "per-device batch 1 (the paste's words)" in f.evidence
    assert "sequence length 1024 (the paste's words)" in f.evidence
    assert "flash attention" not in f.fix and "--flash_attn" not in f.fix
    assert "halve the per-device batch" not in f.fix  # a batch of one
    assert "not in the paste (off unless set elsewhere)" not in f.evidence  # it is on


@covers("RK087")
def test_a_short_sequence_is_not_offered_as_a_lever():
    # Megatron-LM#606 (Llama-2-7B at --seq-length 64 on an A100 40G, from a skill trial) was
    # told "64 -> 32": at a few hundred tokens the sequence is not what fills the GPU
    said = (
        "torch.OutOfMemoryError: CUDA out of memory.\n"
        "python pretrain_gpt.py --seq-length {} --micro-batch-size 1 "
        "--recompute-granularity selective\n"
    )
    short = next(f for f in run(said.format(64)).findings if f.rule == "RK087")
    assert "64 -> 32" not in short.fix
    long = next(f for f in run(said.format(4096)).findings if f.rule == "RK087")
    assert "--seq-length 4096 -> 2048" in long.fix


@covers("RK170")
def test_a_whole_layer_framework_is_offered_whole_layers(tmp_path):
    # NeMo-RL DPO on its DTensor backend (https://github.com/NVIDIA-NeMo/RL/issues/362, from a
    # skill trial): it checkpoints whole layers (policy.dtensor_cfg.activation_checkpointing);
    # it was offered "recompute_modules (no nemo-rl key sets it): [mlp]"
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    log, cmd = tmp_path / "log.txt", tmp_path / "cmd.sh"
    log.write_text(text("nemorl-362-dtensor-dpo-oom"))
    cmd.write_text(text("nemorl-362-dtensor-dpo-cmd"))
    ev = collect(logs=[str(log)], config=[str(cmd)], model="meta-llama/Llama-3.1-8B")
    f = next(f for f in diagnose(ev, 95).findings if f.rule == "RK170")
    assert "policy.dtensor_cfg.activation_checkpointing: true (every layer, whole)" in f.fix
    assert "recompute_modules" not in f.fix and "Megatron runs" not in f.fix


@covers("RK171")
def test_full_fine_tuning_at_batch_one_and_short_samples_in_chinese_reads_as_model_states():
    # LlamaFactory#6752: "我有四张3090显卡...打算全参数微调，我使用了zero-2，序列长度是512，
    # batch_size为1，为啥显存还不够？" (maintainer: "用 zero3"). At one sample of 512 tokens a
    # layer keeps tens of MB, the states 16 bytes per parameter: not an activation problem.
    said = (
        "我有四张3090显卡，每张卡24G显存，打算全参数微调，我使用了zero-2，序列长度是512，"
        "batch_size为1，为啥显存还不够？按理论应该是够的啊\n"
    )
    f = run(said).findings[0]
    assert f.rule == "RK171" and f.category == "model_state_memory"
    assert "batch 1 at 512 tokens" in f.evidence and "full fine-tuning" in f.evidence
    # the same at 4096 tokens with checkpointing off: activations may still shrink
    longer = said.replace("序列长度是512", "序列长度是4096")
    assert run(longer).findings[0].rule == "RK170"


def test_a_data_sections_train_batch_size_is_the_global_batch_never_halved():
    # https://github.com/verl-project/verl/issues/456: verl's data.train_batch_size=1024 is the
    # prompts of a step over all 16 GPUs; a skill trial got "data.train_batch_size 1024 -> 512"
    # (each GPU's micro-batch unchanged), and the prose reader took it as a bare batch_size too.
    d = run(text("verl-456-grpo-global-batch"))
    assert "batch_size" not in d.evidence.config
    for f in d.findings:
        assert not any(k.endswith("batch_size") for k in f.config_patch), f.config_patch


def test_one_gpu_is_told_to_offload_the_states_not_to_shard_them():
    # https://github.com/facebookresearch/fairseq/issues/2926: CUDA_VISIBLE_DEVICES=2, one GPU.
    # ZeRO-3 or FSDP shards over ranks it does not have (a skill trial met the same advice for
    # TransformerEngine#712's "single h100 ... without FSDP").
    d = run(text("fairseq-2926-one-gpu-long-input"))
    f = get(d, "RK170")
    assert "one GPU has no ranks to shard them over" in f.fix
    assert "ZeRO-3 (zero_optimization.stage 3) or FSDP" not in f.fix
