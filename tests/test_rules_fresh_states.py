"""Fresh real pastes for model states and genuine memory pressure: weights, gradients and
optimizer states that do not fit the GPU, or a job that needs more memory than the GPU has.
Each test names its thread's URL and the remedy its maintainers gave."""

from __future__ import annotations

from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.signals import scan_signals


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


@covers("RK017")
def test_fresh_rk017_not_enough_to_load_the_model():
    # https://github.com/shikiw/OPERA/issues/36: "CUDA error: out of memory" on an A6000 with
    # 48 GB, "Is 48 GB not enough to load the model?"; the maintainer: load_in_8bit /
    # load_in_4bit at model initialization.
    f = top(run(text("fs-opera36-llava-a6000-48gb")))
    assert f.rule == "RK017" and f.category == "model_state_memory"
    assert f.config_patch.get("load_in_8bit") is True
    assert "load_in_8bit" in f.fix


def test_fresh_rk017_load_fit_prose_needs_the_words():
    # Mutation guard: without the sentence about loading, the OPERA paste is no load reading.
    pasted = text("fs-opera36-llava-a6000-48gb").replace(
        "Is 48 GB not enough to load the model?", "Any idea?"
    )
    assert top(run(pasted)).rule != "RK017"
    assert "load_fit_prose" in scan_signals(["The model does not fit on my GPU"])
    assert "load_fit_prose" not in scan_signals(["the model loads fine"])


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
