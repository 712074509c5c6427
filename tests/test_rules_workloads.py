"""Tests of the rules in recompute_kit/doctor/rules/workloads.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top

from recompute_kit.doctor.evidence.signals import scan_signals


# RK660: 内存 is said loosely of a GPU's memory too. On a line that names the GPU ("3*V100
# （16G）") with no host word or host size beside it, it is not the host's RAM.
@covers("RK660")
def test_rk660_not_for_neimem_on_a_line_that_names_the_gpu():
    # https://github.com/baichuan-inc/Baichuan2/issues/162:
    # "使用lora微调baichuan2-7b-base，3*V100（16G），还是OOM？到底需要多少内存"
    log = text("fk-baichuan2-162-lora-3xv100-16g")
    assert "3*V100（16G）" in log and "内存" in log
    assert "RK660" not in ids(run(log))
    # a host size beside the GPU still reads as host RAM:
    # https://github.com/verl-project/verl/issues/224 ("8*A800 80g and 96g memory and got OOM")
    assert top(run(text("r8p-verl224-rollout-host-ram"))).rule == "RK660"


# RK660: 内存 of each card ("每张卡") is the GPUs' memory. A skill trial read it as host RAM
# and answered out_of_scope, with a dataloader-workers patch, for a ZeRO-3 OOM.
@covers("RK660")
def test_rk660_not_for_neimem_said_per_card():
    # https://github.com/hiyouga/LlamaFactory/issues/5977 (the reporter's line, verbatim)
    line = (
        "使用ds_z3_config.json会OOM，但是使用ds_z3_offload_config.json就可以跑起来，"
        "而且每张卡只占用了13G内存。这正常吗？\n"
    )
    d = run(line)
    assert "RK660" not in ids(d) and d.verdict.verdict != "out_of_scope"
    assert top(run("训练时内存不足，进程被Killed\n")).rule == "RK660"  # the host's, said so


# RK660: a host memory reading ("CPU RSS: 592.20 MB, VMS: 5.79 GB") is not a shortage.
@covers("RK660")
def test_rk660_not_for_a_host_memory_reading():
    # https://github.com/pytorch/pytorch/issues/166790: a Conv3d OOM on a 24 GiB GPU after an
    # upgrade; the script logs its CPU RSS, which never runs out
    log = text("fy-pt-166790-conv3d-cudnn-workspace-after-upgrade")
    assert "CPU RSS: 592.20 MB, VMS: 5.79 GB" in log
    d = run(log)
    assert "RK660" not in ids(d)
    assert top(d).rule == "RK600"


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


@covers("RK660")
def test_r8p_rk660_rollout_workers_exhaust_host_ram():
    # https://github.com/verl-project/verl/issues/224: "realize that 96GB momery is too small.
    # I add it to 1TB and everything is OK" (8 Ray rollout workers x 11 GB of host memory)
    f = top(run(text("r8p-verl224-rollout-host-ram")))
    assert f.rule == "RK660" and f.category == "genuine_pressure"
    assert "8 processes" in f.evidence and "89 GB together" in f.evidence
    assert "host RAM" in f.fix and "112 GB" in f.fix  # 89 GB x 1.25
    assert "RK170" not in ids(run(text("r8p-verl224-rollout-host-ram")))


@covers("RK660")
def test_r8p_rk660_not_for_a_cuda_oom_that_mentions_cpu_memory():
    # the same paste with a CUDA OOM line: the GPU ran out, host words do not decide it
    log = text("r8p-verl224-rollout-host-ram") + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 720.00 MiB.\n"
    )
    assert "RK660" not in ids(run(log))


def test_r8p_host_signals_read_kills_and_words_not_gpu_sizes():
    facts = scan_signals(
        [
            "DataLoader worker (pid 4242) is killed by signal: Killed.",
            "Killed",
            "a single A100 with 80GB memory",
            "系统内存不足",
        ]
    )
    assert len(facts["host_kill_lines"]) == 2
    assert facts["host_memory_lines"] == ["系统内存不足"]
