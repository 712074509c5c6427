"""Fresh real pastes of model states with the settings said in prose and on command lines
(ZeRO stage, CPU offload, adapters, GPU count and size) rather than in a config file; the
reader is evidence/settings_prose.py and RK101 takes one step up the ladder from what the
paste already uses (ZeRO-2 -> ZeRO-3 -> optimizer offload -> parameter offload -> LoRA).
Each test names its thread's URL and the remedy given there."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.settings_prose import scan_settings

GIB = 2**30


def _said(line: str) -> dict:
    found = scan_settings([line]).get("settings_prose", {})
    return {k: v for k, v in found.items() if k != "lines"}


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
    assert _said("我是用了8张T4 bs=1") == {"gpu_count": 8, "gpu_bytes": 16 * GIB}
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


@covers("RK017")
def test_fresh_settings_mellama9_oom_while_loading():
    # https://github.com/BIDS-Xu-Lab/Me-LLaMA/issues/9: "It trows `out of memory error` while
    # loading the model" after from_pretrained(...).to(device) of a 13B on 24 GB: the weights.
    f = top(run(text("fq-mellama9-13b-load-24gb")))
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert f.config_patch.get("load_in_4bit") is True
    assert "half precision" in f.fix


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
