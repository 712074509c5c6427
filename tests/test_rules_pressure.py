"""Genuine pressure against activation memory, read from the evidence that separates them: a
detection / segmentation workload (detectron2 / mmdetection / DETR keys and words) is too big
for its GPU and its lever is fewer or smaller images (RK630), while a paste that keeps
activation checkpointing off on a small GPU (RK631) or computes eager attention scores
(RK632) has activations as its lever; the default reading RK170 names the per-device batch
key when the paste sets none. Every text is a dev corpus case's paste, verbatim."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

from recompute_kit.doctor.evidence.signals import scan_signals


@covers("RK630")
def test_r6p_rk630_detectron2_batch_one_shrinks_the_images():
    # https://github.com/facebookresearch/detectron2/issues/433: "An image will consume much
    # more memory than others if it has a large number of instances." (IMS_PER_BATCH is 1)
    f = top(run(text("r6p-detectron2-433-instances")))
    assert f.rule == "RK630" and f.category == "genuine_pressure"
    assert f.config_patch == {"MIN_SIZE_TRAIN": 576}  # 800 -> about half the pixels
    assert "instances" in f.fix and "SOLVER.IMS_PER_BATCH = 1" in f.evidence


@covers("RK630")
def test_r6p_rk630_config_for_eight_gpus_halves_ims_per_batch():
    # https://github.com/chensnathan/YOLOF/issues/14: "The settings are designed for 8 GPUs,
    # you should adjust them when you use 2 GPUs" (the key wrapped as "IMS_ PER_ Batch: 32")
    f = top(run(text("r6p-yolof-14-ims-per-batch")))
    assert f.rule == "RK630" and f.category == "genuine_pressure"
    assert f.config_patch == {"IMS_PER_Batch": 16}
    assert "written for 8 GPUs" in f.fix


@covers("RK630")
def test_r6p_rk630_validation_metric_in_chunks_or_on_cpu():
    # https://github.com/roboflow/rf-detr/issues/1084: the mask IoU of validation allocates
    # [num_select x gt_masks x H x W] at once; workaround: fewer predictions, chunks
    d = run(text("r6p-rfdetr-1084-validation-mask-iou"))
    f = top(d)
    assert f.rule == "RK630" and f.category == "genuine_pressure"
    assert f.config_patch == {"batch_size": 1}
    assert "chunks" in f.fix and "CPU" in f.fix
    assert "RK087" not in ids(d)  # superseded: recompute is not the lever


def test_r6p_vision_signal_needs_a_vision_key_or_word():
    # an LLM launch line names no detection key or word: no vision reading
    assert "vision_lines" not in scan_signals(["--per_device_train_batch_size 4 --max_length 8192"])
    facts = scan_signals(["cfg.SOLVER.IMS_PER_BATCH = 1", "cfg.MIN_SIZE_TRAIN = (800,)"])
    assert facts["vision_keys"] == {"SOLVER.IMS_PER_BATCH": 1, "MIN_SIZE_TRAIN": 800}


def test_r6p_rk630_not_for_llm_knobs():
    # the same detectron2 paste with a sequence cap added is no longer a pure vision run
    d = run(text("r6p-detectron2-433-instances") + "\n--max_length 8192\n")
    assert "RK630" not in ids(d)


@covers("RK631")
def test_r6p_rk631_small_gpu_checkpointing_declined():
    # https://github.com/derrian-distro/LoRA_Easy_Training_Scripts/issues/178: "you must use
    # gradient checkpointing and gradient accumulation to stretch your vram"
    d = run(text("r6p-lora-easy-178-8gb-no-ckpt"))
    f = top(d)
    assert f.rule == "RK631" and f.category == "activation_memory"
    assert f.config_patch["gradient_checkpointing"] is True
    assert "RK102" not in ids(d)


@covers("RK632")
def test_r6p_rk632_eager_attention_scores_are_activations():
    # https://github.com/unslothai/unsloth/issues/3363: eager attention in evaluation
    # (torch.matmul(query, key_states.transpose(2, 3))) OOMs; flex attention is the fix
    f = top(run(text("r6p-unsloth-3363-eager-scores")))
    assert f.rule == "RK632" and f.category == "activation_memory"
    assert "flex_attention" in f.config_patch["code"]


def test_r6p_rk261_keeps_uncompiled_flex_attention():
    # https://github.com/pytorch/pytorch/issues/133206: flex_attention's own reference math
    # (working_precision) run uncompiled allocates the whole 48 GB score matrix at once
    f = top(run(text("r6p-pt-133206-flex-uncompiled")))
    assert f.rule == "RK261" and f.category == "allocation_exceeds_device"


@covers("RK170")
def test_r6p_rk170_names_the_batch_key_when_the_paste_sets_none():
    # https://github.com/unslothai/unsloth/issues/1418: "I think it's just due to excessive
    # batch size." (the paste sets no batch)
    f = top(run(text("r6p-unsloth-1418-batch")))
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert "batch_size" in f.fix and "not set in the paste" in f.fix
