"""Tests of the rules in recompute_kit/doctor/rules/model_states.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

import json
from pathlib import Path

from rule_helpers import (
    GIB,
    cites,
    covers,
    get,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.evidence.settings_prose import scan_settings
from recompute_kit.doctor.evidence.signals import scan_signals


def _said(line: str) -> dict:
    found = scan_settings([line]).get("settings_prose", {})
    return {k: v for k, v in found.items() if k != "lines"}


@covers("RK500")
def test_fb_named_size_with_adam_fills_the_gpu_by_default():
    # https://github.com/deepspeedai/DeepSpeed/issues/3208: "the little 1.3b" OOMs on a
    # 14.56 GiB GPU; the maintainer: weights + grads + Adam states need ~18 GB (offload / ZeRO)
    f = top(run(text("fb-ds-3208-1p3b-adam-14gb")))
    assert f.rule == "RK500" and f.category == "model_state_memory"
    assert "assuming full training" in f.evidence and "offload" in f.fix
    assert f.config_patch["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


def test_fb_named_size_default_reading_stays_silent_when_states_are_small_or_not_adam():
    # the same OOM message with a model whose 16 bytes/param are a small share of the GPU, or
    # with LoRA / inference named: no default model-state reading
    oom = text("fb-ds-3208-1p3b-adam-14gb").splitlines()[1]
    for prose in (
        "so the little 0.3b need how much memory ?",
        "so the little 1.3b with LoRA need how much memory ?",
        "so inference with the little 1.3b need how much memory ?",
    ):
        d = run(oom + "\n" + prose)
        assert "RK500" not in [f.rule for f in d.findings], prose


# ---- RK101: a full fine-tune whose states exceed the GPU ------------------------------------


@covers("RK101")
def test_fresh_rk101_llama3_8b_zero2_one_gpu_adam_offload():
    # https://github.com/OpenRLHF/OpenRLHF/issues/698: batch 1, max_len 128, checkpointing on,
    # ZeRO-2 on one A100 80GB, OOM in the optimizer step; hijkzzz: "use --adam_offload"
    f = top(run(text("fd-openrlhf-698-adam-offload")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


# ---- RK110: the OOM in the optimizer step -------------------------------------------------


@covers("RK110")
def test_fresh_rk110_hybrid_adam_state_allocation():
    # https://github.com/hpcaitech/ColossalAI/issues/3509: the OOM is raised where HybridAdam
    # creates state['exp_avg'] (torch.zeros_like) inside optimizer.step of a ZeRO optimizer.
    f = top(run(text("fm-colossalai-3509-optimizer-step")))
    assert f.rule == "RK110" and f.category == "model_state_memory"
    assert "optimizer step" in f.evidence
    assert "ZeRO" in f.fix or "offload" in f.fix


# ---- the reader ------------------------------------------------------------------------------


def test_settings_zero_stage_spellings():
    for line, stage in (
        ("ZeRO stage: 2 (with CPU offload)", 2),
        ("I use deepspeed Zero-2 following instructions", 2),
        ("Also tried deep speed stage 3.", 3),
        ("change --deepspeed parameter to configs/ds_config_zero2.json", 2),
        ("--deepspeed examples/deepspeed/ds_z3_config.json", 3),
        ("torchrun train.py --zero_stage 3", 3),
        ("zero3 + qlora + 4bit", 3),
    ):
        assert _said(line).get("zero_stage") == stage, line


def test_settings_asked_or_negated_are_not_in_use():
    # a question or a proposal names a setting not in use
    assert "zero_stage" not in _said("Would you recommend switching to ZeRO-3 for 2x A100?")
    assert "zero_stage" not in _said("should I use zero3 instead?")
    assert "adapters" not in _said("full fine-tuning without LoRA on 8 GPUs")
    assert _said("使用lora微调baichuan2-7b-base").get("adapters") is True  # CJK next to it


def test_settings_offload_adapters_flags_and_gpus():
    said = _said(
        "deepspeed --num_gpus 8 train.py --use_lora --lora_r 8 --per_device_train_batch_size 4 "
        "--max_seq_length 2048 --gradient_checkpointing False --adam_offload"
    )
    assert said["adapters"] is True and said["micro_batch"] == 4 and said["seq_len"] == 2048
    assert said["gradient_checkpointing"] is False and said["offload_optimizer"] is True
    assert _said("offload_optimizer=True, offload_parameters=False")["offload_param"] is False
    assert _said("QLoRA with load_in_4bit")["quant_bits"] == 4
    assert _said("GPUs: 2× NVIDIA A100 (40GB each)") == {"gpu_count": 2, "gpu_bytes": 40 * GIB}
    assert _said("2 16G A4000") == {"gpu_count": 2, "gpu_bytes": 16 * GIB}
    assert _said("我是用了8张T4 bs=1") == {"gpu_count": 8, "gpu_bytes": 16 * GIB, "micro_batch": 1}
    assert _said("8 x 3090")["gpu_count"] == 8
    # an OOM message's sizes are not the GPU's
    assert "gpu_bytes" not in _said("Tried to allocate 20 GiB (GPU 0; 79 GiB total capacity")


# ---- the previous round's pastes, now read as model states -----------------------------------


@covers("RK101")
def test_fresh_settings_dllm9_zero2_offload_8b_on_2x_a100_40g():
    # https://github.com/ZHZisZZ/dllm/issues/9: LLaDA-8B, "ZeRO stage: 2 (with CPU offload)",
    # 2x A100 40GB, OOM asking 14.9 GiB "during ZeRO optimizer state initialization" (= 8B x
    # 4 bytes / 2 GPUs, an fp32 partition); the reporter asks about ZeRO-3: one step up.
    f = top(run(text("fq-dllm9-8b-zero2-2xa100-40g")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch["zero_optimization"]["stage"] == 3
    assert f.config_patch["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert "ZeRO stage 2 and the optimizer offloaded" in f.evidence
    assert "shard of the model states" in f.evidence and "2 GPU(s)" in f.evidence


@covers("RK101")
def test_fresh_settings_litllama397_deepspeed_optimizer_offload():
    # https://github.com/Lightning-AI/lit-llama/issues/397: full fine-tuning of llama-7b with
    # DeepSpeedStrategy(offload_optimizer=True) on 4 A100 40g; the 6.28 GiB request is 6.7B x
    # 4 bytes / 4 GPUs: model states (ZeRO-3 / parameter offload next), not activations.
    f = top(run(text("fq-litllama397-7b-deepspeed-offload")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch["zero_optimization"]["stage"] == 3
    assert "ZeRO-3" in f.fix and "offload_param" in f.fix


@covers("RK101")
def test_fresh_settings_lmflow213_lora_zero2_on_2x16g():
    # https://github.com/OptimalScale/LMFlow/issues/213: --use_lora and --deepspeed
    # configs/ds_config_zero2.json, llama 7B on 2 16G A4000: 13 GiB of frozen weights on each.
    f = top(run(text("fq-lmflow213-llama7b-2x16g")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    assert "LoRA" in f.evidence and "6.52 GiB" in f.evidence  # 7B x 2 bytes / 2 GPUs


# ---- fresh pastes ----------------------------------------------------------------------------


@covers("RK101")
def test_fresh_settings_fastchat1193_zero3_7b_on_4x_v100_32g():
    # https://github.com/lm-sys/FastChat/issues/1193: VICUNA-7b on 4*v100(32G), OOM with
    # micro-batch 1, "Also tried deep speed stage 3": ZeRO-3 keeps 26 GiB of states per GPU;
    # the step up is optimizer offload (the thread: a DeepSpeed offload config works).
    f = top(run(text("fk-fastchat1193-vicuna7b-4xv100-zero3")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch == {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    }
    assert "ZeRO stage 3" in f.evidence and "32.00 GiB GPU" in f.evidence


@covers("RK101")
def test_fresh_settings_llamafactory260_zero2_7b_on_8x_v100_32g():
    # https://github.com/hiyouga/LlamaFactory/issues/260: full fine-tuning of BaiChuan-7B on
    # 8 V100 32G with "deepspeed Zero-2" still OOMs; the maintainer: 7B full tuning needs about
    # 240 GB (ZeRO-2 on 3 x 80 GB): on 32 GB cards ZeRO-3 is the next step.
    f = top(run(text("fk-llamafactory260-baichuan7b-8xv100-zero2")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    assert "ZeRO stage 2 on 8 GPU(s)" in f.evidence and "ZeRO-3 over 8 GPU(s)" in f.evidence


@covers("RK101")
def test_fresh_settings_baichuan2_162_lora_on_3x_v100_16g():
    # https://github.com/baichuan-inc/Baichuan2/issues/162: "使用lora微调baichuan2-7b-base，
    # 3*V100（16G），还是OOM": 13 GiB of frozen fp16 weights on each 16G card; the thread's
    # remedy is QLoRA (4-bit frozen weights).
    f = top(run(text("fk-baichuan2-162-lora-3xv100-16g")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert "LoRA without ZeRO-3" in f.evidence and "3 GPU(s)" in f.evidence
    assert "QLoRA" in f.fix and "ZeRO-3" in f.fix


@covers("RK101")
def test_fresh_settings_llamafactory3880_qlora_70b_zero3_on_8_t4():
    # https://github.com/hiyouga/LlamaFactory/issues/3880: "zero3 + qlora + 4bit" for llama3
    # 70b on 8张T4 still OOMs: ZeRO-3 leaves 4-bit weights whole (35 GB per 16 GB card); the
    # maintainer points to the FSDP + QLoRA example.
    f = top(run(text("fk-llamafactory3880-qlora-70b-8xt4-zero3")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch["fsdp"] == "full_shard auto_wrap"
    assert "FSDP + QLoRA" in f.fix and "16.00 GiB GPU" in f.evidence


# ---- mutation guards -------------------------------------------------------------------------


def test_fresh_settings_mutation_stage_said_as_a_question_only():
    # the dllm paste without its stated stage and offload: the question about ZeRO-3 alone is
    # no stage in use, so the per-rank count is not ZeRO-2-with-offload's
    pasted = text("fq-dllm9-8b-zero2-2xa100-40g")
    pasted = pasted.replace("ZeRO stage: 2 (with CPU offload)", "Precision check done")
    pasted = pasted.replace("ZeRO-2 with CPU offload (still OOM)", "(still OOM)")
    f = top(run(pasted))
    assert not (f.rule == "RK101" and "ZeRO stage 2" in f.evidence)


def test_fresh_settings_mutation_lora_negated():
    # "without lora" on the Baichuan2 paste: no adapters, so no LoRA reading
    pasted = text("fk-baichuan2-162-lora-3xv100-16g").replace("使用lora微调", "without lora, 微调")
    f = top(run(pasted))
    assert "LoRA without ZeRO-3" not in f.evidence


def test_fresh_settings_mutation_full_precision_qlora_is_sharded():
    # the same 70B paste without 4-bit: ZeRO-3 shards bf16 frozen weights (70B x 2 / 8 GPUs
    # = 16.3 GiB, still above a T4) and the step is not FSDP + QLoRA
    pasted = text("fk-llamafactory3880-qlora-70b-8xt4-zero3")
    pasted = pasted.replace("qlora", "lora").replace("4bit", "bf16")
    f = top(run(pasted))
    assert f.config_patch.get("fsdp") is None


@covers("RK500")
def test_fresh_rk500_gptj6b_fp16_on_a100_40gb():
    # https://github.com/huggingface/transformers/issues/13329: run_clm.py on GPT-J-6B with
    # --fp16 on "single GPU A100 (40Gb)" -> OOM; 6B x 16 bytes of mixed-precision Adam states
    # do not fit 40 GB (the thread's remedy: DeepSpeed ZeRO with CPU offload / more memory).
    f = top(run(text("fs-hf13329-gptj6b-a100-40g")))
    assert f.rule == "RK500" and f.category == "model_state_memory"
    assert "40.00 GiB GPU" in f.evidence  # "A100 (40Gb)" read as the GPU's size
    assert f.config_patch["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}


def test_fresh_gpu_prose_lowercase_gb_and_with():
    # "A100 (40Gb)" (transformers#13329) and "A6000 with 48 GB memory" (OPERA#36)
    assert scan_signals(["single GPU A100 (40Gb)"])["gpu_prose"]["bytes"] == 40 * 2**30
    assert scan_signals(["a A6000 with 48 GB memory"])["gpu_prose"]["bytes"] == 48 * 2**30
    assert "gpu_prose" not in scan_signals(["an A100 with 2 GPUs"])


@covers("RK500")
def test_fresh_rk500_gptj6b_no_gpu_named():
    # https://github.com/mallorbc/Finetune_LLMs/issues/23: "finetune GPT-j-6b", an OOM of
    # 394 MiB, batch size 1 tried; the answer: the GPU is not large enough. 6B x 16 bytes
    # exceeds even an 80 GB GPU, so no GPU size is needed to say model states.
    f = top(run(text("fs-finetunellms23-gptj6b")))
    assert f.rule == "RK500" and f.category == "model_state_memory"
    assert "no GPU named" in f.evidence
    assert f.config_patch


def test_fresh_rk500_no_gpu_needs_training_words():
    # Mutation guard: the same paste without the training words is not a model-states reading
    # (inference of a 6B model fits an 80 GB GPU).
    pasted = text("fs-finetunellms23-gptj6b").replace("finetune", "run")
    pasted = pasted.replace("gradient_accumulation_steps=4", "")
    assert top(run(pasted)).rule != "RK500"


@covers("RK500")
def test_fresh_rk500_baichuan7b_full_on_one_a100_80g():
    # https://github.com/hiyouga/LlamaFactory/issues/94: full fine-tuning baichuan-7b on one
    # A100 80G OOMs (with deepspeed too); the maintainer: 3 x 80G with DeepSpeed ZeRO-2.
    f = top(run(text("fs-lf94-baichuan7b-a100-80g")))
    assert f.rule == "RK500" and f.category == "model_state_memory"
    assert "ZeRO" in f.fix


@covers("RK101")
def test_fresh_rk101_baichuan13b_full_ddp_8_gpus():
    # https://github.com/hiyouga/LlamaFactory/issues/713: full fine-tuning Baichuan-13B on 8
    # A800 with accelerate MULTI_GPU (no DeepSpeed) OOMs at batch size 1; the answer: DeepSpeed
    # ZeRO stage-3 (with CPU offload if needed).
    f = top(run(text("fs-lf713-baichuan13b-full-ddp")))
    assert f.rule == "RK101" and f.category == "model_state_memory"
    assert f.config_patch == {"zero_optimization": {"stage": 3}}


def test_fresh_gptj_without_size_is_pressure_not_states():
    # https://github.com/EricFillion/happy-transformer/issues/287: "fine tuning GPTJ" on an
    # A100 (39.59 GiB, 36.94 allocated); the maintainer: DeepSpeed ZeRO-2 on several GPUs. The
    # paste names no model size, so the doctor cannot count the states: a known miss (it reads
    # genuine pressure, the neighbouring category).
    f = top(run(text("fs-happytr287-gptj-a100")))
    assert f.category == "genuine_pressure"


def test_fresh_baichuan13b_8_gpus_reduce_batch():
    # https://github.com/hiyouga/LlamaFactory/issues/811: full fine-tuning baichuan-13b-chat on
    # 8 x A800 80G OOMs; the maintainer: reduce the batch size. The doctor's fix names it.
    f = top(run(text("fs-lf811-baichuan13b-8xa800")))
    assert "micro_batch_size" in f.fix or "batch" in f.evidence


@covers("RK500")
def test_fresh_rk500_llama7b_full_without_peft_on_a100_80g():
    # https://github.com/meta-llama/llama-cookbook/issues/413: "finetune the llama-7b model
    # without any PEFT and Quantization" on one A100-SXM4-80GB -> CUDA OOM; 6.7B x 16 bytes of
    # mixed-precision Adam states exceed 80 GB (remedy: FSDP over several GPUs / PEFT).
    f = top(run(text("fq-cookbook413-llama7b-full-a100-80g")))
    assert f.rule == "RK500" and f.category == "model_state_memory"
    assert "offload_optimizer" in f.config_patch["zero_optimization"]
    assert "ZeRO-3 / FSDP" in f.fix and "LoRA" in f.fix


def test_fresh_negated_adapters_are_not_a_way_of_keeping_states():
    # "without any PEFT and Quantization" (llama-cookbook#413) says full fine-tuning
    said = scan_signals(["finetune the llama-7b model without any PEFT and Quantization on X"])
    assert "not_full_training" not in said
    # named without a negation it still is one, and a later clause still counts
    assert "not_full_training" in scan_signals(["finetune llama-7b with PEFT and Quantization"])
    assert "not_full_training" in scan_signals(["no OOM before, then I added LoRA adapters"])
    assert "not_full_training" in scan_signals(["without packing, we use QLoRA"])


def test_fresh_negated_adapters_mutation_guard():
    # Mutation guard: the same paste saying it uses PEFT is no model-states reading.
    pasted = text("fq-cookbook413-llama7b-full-a100-80g").replace("without any PEFT", "with PEFT")
    assert top(run(pasted)).rule != "RK500"


@covers("RK101")
def test_rk101_13b_full_fine_tuning_with_zero2_on_4_gpus():
    d = run(
        text("i12-llamafactory-1158"),
        config=text("i12-llamafactory-1158-config"),
        config_name="train.sh",
    )
    f = top(d)
    assert f.rule == "RK101" and f.category == "model_state_memory"
    # The launch command is read by the shared reader (sources/hf_launch.py): 4 GPUs from
    # --include localhost:4,5,6,7, and the unseen ds_config.json's stage assumed at DeepSpeed's
    # default, 0; the rule takes that one assumption: 13e9 x 16 B = 193.72 GiB per GPU on a
    # 79.35 GiB GPU; ZeRO-3 over 4: 48.43
    cites(f, "without ZeRO (DDP replicates everything) on 4 GPU(s)", "193.72 GiB", "79.35 GiB")
    cites(f, "48.43 GiB")
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    # The count is the name's "13B" (Baichuan2-13B has ~13.9B): said as the name's, and the
    # 12.94 GiB request is near 13e9 x 4 B / 4 = 12.11 GiB, not equal to it.
    cites(f, "about 13B parameters by its name", "12.94 GiB against 13B (by its name)")
    cites(f, "= 12.11 GiB")
    assert "12.94 GiB = " not in f.evidence and "13.0B" not in f.evidence
    # --deepspeed ds_config.json was never shown: the stage is an assumption, said once with
    # the key that sets it, and no second finding says "no ZeRO stage named" against it
    stated = [a for a in d.assumptions if "ZeRO stage 0 assumed" in a]
    assert d.evidence.read["config"]["zero_stage"] == 0  # the reader's, the same one
    assert len(stated) == 1 and "zero_optimization.stage" in stated[0]
    assert "ds_config.json" in stated[0]
    assert "RK500" not in ids(d)
    assert not any("no ZeRO stage" in g.evidence for g in d.findings)


# RK101: a launch command with no GPU, no GPU count and no OOM: no "over 1 GPU(s)" plan (a
# count the paste does not give) and no full confidence.
@covers("RK101")
def test_rk101_no_gpu_count_invented():
    # https://github.com/hiyouga/LlamaFactory/issues/2379: the command alone (Mixtral 8x7B LoRA)
    f = get(run(text("i13-llamafactory-2379")), "RK101")
    assert "1 GPU(s)" not in f.evidence and "GPU count not in the paste" in f.evidence
    assert f.confidence <= 0.6 and "if the run uses one" in f.evidence
    # the same model with the count given keeps its numbers
    # https://github.com/OpenRLHF/OpenRLHF/issues/698 ("deepspeed --num_gpus 1", an 80 GB A100)
    g = get(run(text("fd-openrlhf-698-adam-offload")), "RK101")
    assert "on 1 GPU(s)" in g.evidence and g.raw_confidence == 0.9


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
    cites(f, "56B parameters by its name", "8 GPU(s)", "104.31 GiB", "80.00 GiB")
    assert f.config_patch == {"zero_optimization": {"stage": 3}} and "ZeRO-3" in f.fix


@covers("RK101")
def test_rk101_not_when_zero3_and_the_gpu_count_are_unknown():
    # https://github.com/hiyouga/LlamaFactory/issues/5977: full fine-tuning of Llama-3-8B with
    # ds_z3_config.json, pasted YAML only: ZeRO-3 shards over GPUs the paste does not count, so
    # no per-GPU figure can be claimed.
    d = run(text("i13-llamafactory-5977"))
    assert d.evidence.config["deepspeed"].endswith("ds_z3_config.json")
    assert "RK101" not in ids(d)


@covers("RK670")
def test_r8s_gemini_auto_placement_oom():
    # https://github.com/hpcaitech/ColossalAI/issues/2246: OPT-30B with GeminiDDP,
    # PLACEMENT_POLICY = 'auto' OOMs; the maintainer: "I suggest you use CPU for large model"
    d = run(text("r8s-colossalai2246-gemini-auto"))
    f = top(d)
    assert f.rule == "RK670" and f.category == "model_state_memory"
    assert "'auto'" in f.evidence and "PLACEMENT_POLICY = 'auto'" in f.evidence
    assert f.config_patch == {"placement_policy": "cpu"}
    assert "placement_policy='cpu'" in f.fix


def test_r8s_gemini_cpu_placement_or_no_oom_is_silent():
    paste = text("r8s-colossalai2246-gemini-auto")
    # already on 'cpu': nothing to move off the GPU
    assert "RK670" not in ids(
        run(paste.replace("PLACEMENT_POLICY = 'auto'", "PLACEMENT_POLICY = 'cpu'"))
    )
    # no OOM said
    calm = paste.replace("I got OOM when BS is lager than 8 in using GeminiDDP.", "").replace(
        " and get OOM errors", ""
    )
    assert "RK670" not in ids(run(calm))
    # a placement policy of something that is not Gemini
    assert "RK670" not in ids(run(paste.replace("GeminiDDP", "our trainer")))


def test_adapters_named_by_a_scripts_own_flags():
    # https://github.com/deepspeedai/DeepSpeedExamples/issues/386 (the opening post): DeepSpeed-
    # Chat's lora_dim / only_optimize_lora name a LoRA run; "explorative" is no adapter
    said = _said("when using lora_dim=128 and gradient_checkpointing, training step1 runs well")
    assert said.get("adapters") is True
    assert _said("When I drop gradient_checkpointing to use only_optimize_lora, I got oom.").get(
        "adapters"
    )
    assert not _said("an explorative run with exploration_rate 0.1 ran out of memory").get(
        "adapters"
    )


@covers("RK011", "RK013")
def test_model_states_sharded_already_are_not_told_to_shard(tmp_path):
    # A skill trial (TRL SFT, Qwen2.5-7B, DeepSpeed ZeRO-3 on 4 A100 40GB): RK011 told the run
    # to shard its model states with "DeepSpeed ZeRO-3" and patched use_distributed_optimizer,
    # which the patch check then dropped; the fix says what is left where they are sharded.
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    trl = Path(__file__).parent / "data" / "launch" / "trl"
    config = [
        str(trl / "launch.sh"),
        str(trl / "examples" / "accelerate_configs" / "deepspeed_zero3.yaml"),
    ]
    d = diagnose(
        collect(logs=[str(trl / "oom.log")], config=config, overrides={"data_parallel_size": 4}),
        39.38,
    )
    for rule in ("RK011", "RK013"):
        f = next(f for f in d.findings if f.rule == rule)
        assert f.fix.startswith("The model states are sharded already (DeepSpeed ZeRO-3 over 4")
        assert "use_distributed_optimizer" not in str(f.config_patch)


@covers("RK011", "RK013")
def test_a_tensor_parallel_fix_is_priced_and_the_sharding_counts_context_parallelism(tmp_path):
    # A skill trial (Megatron-Bridge Llama-3-8B at 16k, TP1 CP2 on 2 H100s, the distributed
    # optimizer): the fix said "over 1 ranks" where the optimizer shards over DP x CP = 2, and
    # proposed TP 2 on 4 GPUs without saying whether that fits. The OOM message's figures are
    # https://github.com/NVIDIA/TensorRT-LLM/issues/10580's, raised as PyTorch raises it.
    from test_doctor_verdict import TRTLLM_OOM

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    log = tmp_path / "oom.log"
    message = TRTLLM_OOM.split(" - ", 1)[1]
    engine_error = "tensorrt_llm.executor.utils.RequestError"
    log.write_text(message.replace(engine_error, "torch.OutOfMemoryError"))
    layout = {
        "tensor_model_parallel_size": 1,
        "context_parallel_size": 2,
        "data_parallel_size": 1,
        "seq_length": 16384,
        "use_distributed_optimizer": True,
    }
    d = diagnose(collect(logs=[str(log)], model="llama3-8b", overrides=layout), 79.11)
    f = next(f for f in d.findings if f.rule == "RK011")
    assert "the distributed optimizer over 2 data x context-parallel ranks" in f.fix
    # TP 2 is priced and still too big (said, no patch); TP 4 is the first size that fits
    assert f.config_patch == {"tensor_model_parallel_size": 4}
    assert "held per rank at the current recompute, still above" in f.fix
    assert f.fix.endswith("within the 71.20 GiB usable")


@covers("RK011")
def test_fsdp_full_shard_is_named_as_fsdp_not_deepspeed():
    """A re-trial (Qwen2.5-72B, the handbook's Accelerate FSDP config on 16 A100s): RK011 said
    "sharded already (DeepSpeed ZeRO-3 over 16 ...)" for an FSDP FULL_SHARD run; and Qwen2's
    config.json writes a sliding_window beside use_sliding_window false (no local layers), which
    was said as local attention counted as global."""
    from pathlib import Path

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    corpus = Path(__file__).parent / "sources" / "corpus" / "hf_trainer"
    files = [
        str(corpus / "accelerate_fsdp.yaml"),
        str(corpus / "zephyr-7b-beta_sft_config_full.yaml"),
    ]
    evidence = collect(config=files, overrides={"data_parallel_size": 16}, model="Qwen/Qwen2.5-72B")
    d = diagnose(evidence, 79.1)
    f = next(f for f in d.findings if f.rule == "RK011")
    assert f.fix.startswith("The model states are sharded already (FSDP FULL_SHARD over 16")
    assert not [w for w in evidence.read["warnings"] if "sliding_window=" in w]


@covers("RK500")
def test_rk500_takes_no_80_gb_for_a_named_gpu_it_cannot_size():
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/4587 (the reporter's words): a
    # Qwen3-30B-A3B recipe OOMs on 8x B300; 30B x 16 bytes against "an A100/H100's 80 GB" was
    # the reading of a GPU the paste never had
    said = (
        "I am running the official Megatron-Bridge performance recipe for Qwen3-30B-A3B on a "
        "single node with 8x NVIDIA B300 GPUs. The fp8_mx pretraining run fails with CUDA OOM.\n"
    )
    assert "RK500" not in ids(run(said))
    assert "RK500" in ids(run(said.replace("NVIDIA B300", "NVIDIA")))  # no GPU named: 80 GB


# https://github.com/huggingface/peft/issues/1149 (the reporter's paste)
KBIT_UPCAST = """\
I'm trying to finetune an LLM in 16 bit. It should fit in GPU memory, but it runs out of \
memory. The issue seems to be with peft:

> Traceback (most recent call last):
>   File "/train.py", line 85, in <module>
>     model = prepare_model_for_kbit_training( model )
>   File "/usr/local/lib/python3.9/site-packages/peft/utils/other.py", line 98, in \
prepare_model_for_kbit_training
>     param.data = param.data.to(torch.float32)
"""


@covers("RK826")
def test_rk826_prepare_model_for_kbit_training_upcasts_the_weights():
    f = top(run(KBIT_UPCAST))
    assert f.rule == "RK826" and f.category == "model_state_memory"
    assert "enable_input_require_grads" in f.fix
    # the same frames without any OOM said are not this finding
    assert "RK826" not in ids(run(KBIT_UPCAST.replace("it runs out of memory", "it is slow")))


@covers("RK110")
def test_an_oom_in_adams_update_arithmetic_is_its_temporary_in_the_runs_own_keys(tmp_path):
    # A skill trial: LLaMA-Factory's full SFT YAML run by `llamafactory-cli train` on ZeRO-2,
    # with the OOM of https://github.com/hiyouga/LlamaFactory/issues/1221 (its two lines as
    # pasted there). The doctor said "Adam's states are being allocated ... one more state
    # tensor" for the `denom = ...` line (a temporary of the update: torch/optim/adam.py), its
    # offload list read "Megatron: deepspeed zero_optimization.offload_optimizer.device", RK011
    # tried Megatron's use_distributed_optimizer, and the launch command was an input problem.
    from pathlib import Path

    corpus = Path(__file__).parent / "sources" / "corpus" / "hf_trainer"
    sft = (corpus / "qwen3_full_sft.yaml").read_text(encoding="utf-8")
    (tmp_path / "sft.yaml").write_text(
        sft.replace("examples/deepspeed/ds_z3_config.json", "ds_z2_config.json"), "utf-8"
    )
    (tmp_path / "ds_z2_config.json").write_text(
        (corpus / "blind_ds_z2_config.json").read_text(encoding="utf-8"), "utf-8"
    )
    launch = tmp_path / "train.sh"
    launch.write_text(f"FORCE_TORCHRUN=1 llamafactory-cli train {tmp_path / 'sft.yaml'}\n")
    log = (
        "denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.14 GiB (GPU 5; "
        "31.75 GiB total capacity; 28.28 GiB already allocated; 1.95 GiB free; 28.28 GiB "
        "reserved in total by PyTorch) If reserved memory is >> allocated memory try setting "
        "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
        "and PYTORCH_CUDA_ALLOC_CONF\n"
    )
    d = run(log, inputs=[str(launch)], overrides={"data_parallel_size": 8})
    f = get(d, "RK110")
    assert "a temporary of one moment's size" in f.evidence
    assert "one more state tensor" not in f.evidence and "adamw_torch_fused" in f.fix
    assert "Megatron: --optimizer-cpu-offload" in f.fix  # labelled Megatron's: as written
    # ZeRO-3 in LLaMA-Factory's own keys: its ds_z3_config.json beside the ds_z2 the run names
    assert f.patch_keys == {"deepspeed": str(tmp_path / "ds_z3_config.json")}
    assert not any("no configuration keys found" in n for n in d.evidence.notes)
    states = [g for g in d.findings if g.rule == "RK011"]
    assert all("use_distributed_optimizer" not in json.dumps(g.config_patch) for g in states)
    # a line that creates the states is still read as the states
    init = "state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)"
    d = run(log.replace(log.splitlines()[0], init))
    assert "one more state tensor" in get(d, "RK110").evidence


@covers("RK500")
def test_a_named_size_split_over_pipeline_ranks_is_no_whole_model_count():
    # https://github.com/NVIDIA/Megatron-LM/issues/1746 (verbatim lines): "20B PP4", "each rank
    # will hold 5B"; it read 20B x 16 bytes on one 80 GB GPU and patched DeepSpeed keys. The
    # resume OOM is what the report states (RK806), and the paths are Megatron's.
    said = (
        "when loading big enough model(20B PP4) from dcp format will cause OOM error\n"
        "Megatron-LM/megatron/core/transformer/mlp.py:344 alloc 12344.00M\n"
        "Megatron-LM/megatron/core/optimizer/distrib_optimizer.py:773 alloc19128.37MB\n"
        "I see @mikolajblaz have fix here,but it doesn't work,`mlp.py` will use lots of memory "
        "but no oom, until oom on optimizer states resume\n"
        "using GPT model,using PP4 DP2 EP1 TP1 training a 20B model, each rank will hold 5B "
        "model Parameters,save to DCP format and resume this format\n"
    )
    d = run(said)
    assert "RK500" not in ids(d)
    assert top(d).rule == "RK806" and top(d).category == "model_state_memory"
    assert all("zero_optimization" not in json.dumps(f.config_patch) for f in d.findings)


NEMO_RL_SFT70B_4GPU = (
    Path(__file__).parent
    / "data/read/nemo_rl_sft70b/examples/configs/recipes/llm"
    / "sft-llama3.1-70b-8n4g-tp2pp2-long-megatron.yaml"
)


@covers("RK011")
def test_rk011_at_the_first_step_counts_no_adam_moments_and_patches_nemo_rl_whole():
    # a skill trial (round ac): NeMo-RL's 70B SFT recipe on 8 nodes x 4 H100 80GB, "it OOMs at
    # the first training step on some ranks" (the trial's words). The finding said the optimizer
    # states "already take 109%" as if Adam's moments existed before the first step, and its
    # CP patch left out the sequence packing and padding NeMo-RL asserts for CP
    d = run(
        "It OOMs at the first training step on some ranks.",
        inputs=[str(NEMO_RL_SFT70B_4GPU)],
        gpu_memory_gb=79.1,
    )
    f = get(d, "RK011")
    assert "first step" in f.evidence and "Adam's moments" in f.evidence
    keys = f.patch_keys or {}
    if keys.get("policy.megatron_cfg.context_parallel_size", 1) > 1:
        assert keys["policy.sequence_packing.enabled"] is True
        assert keys["policy.make_sequence_length_divisible_by"] % 8 == 0
    assert any(k.startswith("policy.megatron_cfg.") for k in keys)
