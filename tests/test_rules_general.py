"""Tests of the rules in recompute_kit/doctor/rules/general.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

import pytest
from rule_helpers import (
    cites,
    covers,
    get,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.engine import build_context, diagnose
from recompute_kit.doctor.evidence import (
    Evidence,
    MemoryReport,
)
from recompute_kit.doctor.evidence.cjk import PREFIX, english_for, translate_cjk
from recompute_kit.doctor.evidence.signals import scan_signals
from recompute_kit.doctor.symptoms import stated


@covers("RK260")
def test_fx_deepspeed_configure_checkpointing_none_optimizer():
    # https://github.com/deepspeedai/DeepSpeed/issues/1499 (label bug): AttributeError in
    # deepspeed's _configure_checkpointing with partition_activations on
    f = top(run(text("fx-ds-1499-dp-process-group")))
    assert f.rule == "RK260" and f.category == "framework_bug" and "deepspeed" in f.fix


@covers("RK260")
def test_fx_neox_pipeline_engine_configure_checkpointing():
    # https://github.com/EleutherAI/gpt-neox/issues/474 (label bug): the same frame from eval
    f = top(run(text("fx-neox-474-dp-process-group-eval")))
    assert f.category == "framework_bug" and "deepspeed" in f.fix


@covers("RK260")
def test_fx_deepspeed_checkpoint_traceback_cut_short():
    # https://github.com/deepspeedai/DeepSpeed/issues/1057: deepspeed checkpointing fails on
    # python 3.8; the paste ends inside the model's forward (no exception line)
    f = top(run(text("fx-ds-1057-ckpt-py38")))
    assert f.category == "framework_bug"


@covers("RK266")
def test_fy_leak_with_a_library_version_names_the_upgrade():
    # https://github.com/pytorch/pytorch/issues/3824 (label bug): "Memory keeps growing at every
    # iteration" with double backward; fixed in PyTorch (PR #3970)
    f = top(run(text("fy-pt-3824-double-backward-memory-grows")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install -U torch" and "loss.item" not in f.fix


@covers("RK266")
def test_fy_leak_with_checkpointing_names_reference_cycle_not_loss_item():
    # https://github.com/QuantumLab-ZY/HamGNN/issues/105 (fixed): memory steadily increases
    # with use_gradient_checkpointing, a reference cycle through torch.utils.checkpoint
    f = top(run(text("fy-hamgnn-105-ckpt-cyclic-reference-leak")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "reference cycle" in f.fix and "Upgrade" in f.fix


@covers("RK262")
def test_fb_oom_computing_log_softmax_over_a_large_dictionary():
    # https://github.com/facebookresearch/fairseq/issues/50: "out of memory when computing the
    # log_softmax" with a 500k dictionary; maintainers: smaller vocabulary / adaptive softmax
    f = top(run(text("fb-fairseq-50-log-softmax-vocab")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "log_softmax" in f.evidence


@covers("RK262")
def test_fb_masked_cross_entropy_full_logits():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2336: OOM in F.cross_entropy; the fix
    # switches to FusedLinearCrossEntropy
    f = top(run(text("fb-automodel-pr2336-masked-ce")))
    assert f.category == "logits_memory" and "fused linear cross-entropy" in f.fix


# ---- the mapping ----------------------------------------------------------------------------


def test_english_text_comes_back_unchanged():
    log = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.14 GiB.\n"
        "training is 20% slower with recompute\n"
    )
    assert translate_cjk(log) is log
    assert translate_cjk("") == ""


def test_chinese_without_known_phrases_comes_back_unchanged():
    log = "请问这个是什么原因？谢谢！\n"
    assert translate_cjk(log) is log


def test_original_chinese_stays_and_the_english_follows_its_line():
    log = "为什么我在训练的时候显存会一直增加到爆了\nRuntimeError: boom\n"
    out = translate_cjk(log)
    lines = out.splitlines()
    assert lines[0] == "为什么我在训练的时候显存会一直增加到爆了"  # kept verbatim, first
    assert lines[1] == f"{PREFIX}memory keeps growing. out of memory."
    assert lines[2] == "RuntimeError: boom"
    assert out.endswith("\n")
    assert all(line in out.splitlines() for line in log.splitlines())


def test_no_trailing_newline_is_added():
    assert translate_cjk("训练变慢") == f"训练变慢\n{PREFIX}slower."


@pytest.mark.parametrize(
    ("chinese", "english"),
    [
        ("显存不足", "out of memory"),
        ("直接爆显存了", "out of memory"),
        ("显存溢出", "out of memory"),
        ("跑了两步就OOM了", "out of memory"),
        ("开启后训练变慢", "slower"),
        ("速度慢", "slower"),
        ("吞吐下降明显", "slower"),
        ("训练速度大约慢20%左右", "20% slower"),
        ("开启重计算", "activation recompute"),
        ("激活值重计算", "activation recompute"),
        ("梯度检查点", "gradient checkpointing"),
        ("显存泄漏", "memory leak"),
        ("疑似显存泄露", "memory leak"),
        ("显存一直增长", "memory keeps growing"),
        ("训练过程中显存占用持续上涨", "memory keeps growing"),
        ("加载模型时报错", "while loading the model"),
        ("升级到2.1后", "after upgrading to 2.1"),
        ("升级后", "after upgrading"),
        ("更新到0.3.0版本后", "after upgrading to 0.3.0"),
        ("之前版本正常", "it worked fine in the previous version"),
        ("我之前使用的是0.2.0版本", "it worked fine in 0.2.0"),
        ("扩充词表", "vocabulary"),
        ("8卡训练", "8 GPUs"),
        ("单卡训练", "1 GPU"),
        ("两张A100", "2 GPUs"),
        ("报错", "error"),
    ],
)
def test_phrase(chinese, english):
    assert english in english_for(chinese)


def test_a_hypothetical_is_not_evidence():
    # https://github.com/IEIT-Yuan/Yuan-2.0/issues/18: "如果显存不够" (if memory is short)
    assert "out of memory" not in english_for("如果显存不够，是不是可以使用selective的模式")
    assert "out of memory" in english_for("显存不够，训练直接退出")


def test_a_phrase_said_twice_is_given_once():
    assert english_for("显存不足，显存不足") == ["out of memory"]


def test_cjk_another_process_holding_the_gpu():
    # https://github.com/RangiLyu/nanodet/issues/147, the reporter's follow-up: "我运行nvidia-smi，
    # 发现有个VeCarRecoServer进程，把所有内存基本全吃了" (another user's daemon held the GPU)
    line = (
        "我运行nvidia-smi，发现有个VeCarRecoServer进程，把所有内存基本全吃了，"
        "杀掉再运行训练的命令"
    )
    assert "the GPU is used by another process" in english_for(line)
    f = top(run(line + "\n"))
    assert f.category == "other_processes"
    assert "the GPU is used by another process" not in english_for("训练进程很慢")


# ---- memory that keeps growing: a leak --------------------------------------------------------


@covers("RK266")
def test_fresh_cjk_memory_grows_until_it_bursts():
    # https://github.com/McGregorWwww/UDTransNet/issues/21: "显存会一直增加到爆了" (memory keeps
    # growing until it bursts); the fix given in the thread: loss_sum += loss.item(), not loss.
    # Before the normalisation: nothing fired.
    f = top(run(text("fh-udtransnet-21-grows-until-oom")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "loss.item()" in f.fix


def test_fresh_cjk_memory_keeps_growing_over_training():
    # https://github.com/laisimiao/Unet/issues/4: "显存持续增长" (memory keeps growing); the
    # maintainer: "看看是不是有什么tensor一直没有消掉" (some tensor is never released).
    # Before: nothing fired.
    f = top(run(text("fh-unet-4-keeps-growing")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "gc.collect()" in f.fix and "loss.item()" in f.fix


def test_fresh_cjk_memory_grows_with_loss_item_already_checked():
    # https://github.com/chenyuntc/simple-faster-rcnn-pytorch/issues/252: "out of memory
    # 训练的时候显存一直在增长" (memory keeps growing while training); the thread looks for what
    # keeps references (the tqdm wrapping order, the eval loop, pin_memory).
    # Before: RK170 (activation memory).
    f = top(run(text("fh-simple-faster-rcnn-252-grows-oom")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "gc.collect()" in f.fix


@pytest.mark.xfail(strict=True, reason="growth from longer samples reads as a leak")
def test_fresh_cjk_memory_grows_with_longer_samples_is_not_a_leak():
    # https://github.com/OpenSenseNova/piccolo-embedding/issues/10: memory grows over hours to
    # an OOM; the maintainer: not a leak, the later samples are longer (activation memory
    # grows with the input length). Before: RK170 (activation memory, right by chance);
    # after: RK266 (a leak): the paste gives no input lengths to tell the two apart.
    f = top(run(text("fh-piccolo-10-leak-until-oom")))
    assert f.category == "activation_memory"


@covers("RK807")
def test_fresh_cjk_oom_after_an_update_without_versions():
    # https://github.com/pkuliyi2015/multidiffusion-upscaler-for-automatic1111/issues/156:
    # "更新后，每次运行到98％-99％，稳定爆显存" (after the update it runs out of memory at 98-99%
    # every time); the author fixed it ("感谢作者修复"). Read: "after upgrading. out of memory.";
    # the regression rules need the two releases. Before: RK170; now the stated update is
    # read (RK807), as a possible cause.
    f = top(run(text("fh-multidiffusion-156-oom-after-update")))
    assert f.category == "framework_bug" and f.rule == "RK807"


@covers("RK808")
def test_fresh_cjk_full_finetune_does_not_fit_one_gpu():
    # https://github.com/modelscope/ms-swift/issues/2282: "sft_type为lora的时候是正常的，
    # 改成full后报 ... CUDA out of memory" on one 80 GiB A800; the maintainer:
    # "单卡80GB 跑不起来的 要2卡" (one 80 GB GPU cannot run it, it needs 2 GPUs): model
    # states. Before: RK005; now the stated contrast is read (RK808).
    f = top(run(text("fh-swift-2282-full-oom")))
    assert f.category == "model_state_memory" and f.rule == "RK808"


# =============================================================================================
# logits_memory
# =============================================================================================


def test_a_vocabulary_option_in_a_launch_script_names_no_logits():
    # alibaba/Pai-Megatron-Patch examples/deepseek_v2/run_mcore_deepseek.sh passes
    # `--extra-vocab-size ${EXTRA_VOCAB_SIZE} \`: an option's name, not logits said to be
    # vocabulary-sized (a skill trial got RK262 "the paste names the logits" from it)
    from recompute_kit.doctor.evidence.signals import scan_signals

    assert "logits_lines" not in scan_signals(["        --extra-vocab-size ${EXTRA_VOCAB_SIZE} \\"])
    assert "logits_lines" not in scan_signals(["--padded-vocab-size 128256 \\"])
    # prose that says it still counts (https://github.com/NVIDIA-NeMo/Automodel/pull/2336's
    # words: "the native FP32 vocabulary-sized buffer")
    assert scan_signals(["the native FP32 vocabulary-sized buffer"])["logits_lines"]


@covers("RK262")
def test_fresh_logits_float_upcast_32k_tokens():
    # https://github.com/modelscope/ms-swift/issues/6966: logits.float() asks for 49G,
    # 32k * 151936 * 4 bytes. Right before this round.
    f = top(run(text("fz-msswift-6966-logits-float-49g")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "fused linear cross-entropy" in f.fix


@covers("RK262")
def test_fresh_logits_size_of_a_128k_vocabulary():
    # https://github.com/pytorch/pytorch/issues/124480: 128256 x 81920 x 2 bytes = 19.57GiB of
    # logits; the remedy is a fused linear cross-entropy. Right before this round.
    f = top(run(text("fz-pytorch-124480-linear-ce")))
    assert f.category == "logits_memory" and "fused linear cross-entropy" in f.fix


# =============================================================================================
# logits_memory
# =============================================================================================


@covers("RK262")
def test_fresh_logits_float_upcast_in_masked_ce():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2609: `logits.float()` of [tokens, vocab]
    # needs 48 GiB; the fix is FusedLinearCrossEntropy (full logits never materialised).
    f = top(run(text("fl-automodel-2609-logits-float-48gib")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "FusedLinearCrossEntropy" in f.fix


@covers("RK262")
def test_fresh_logits_masked_ce_vlm_spike():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2603: MaskedCrossEntropy fp32-upcasts the
    # full [num_tokens, vocab] logits and OOMs in the loss.
    f = top(run(text("fl-automodel-2603-masked-ce-vlm")))
    assert f.category == "logits_memory" and "fused linear cross-entropy" in f.fix


@covers("RK262")
def test_fresh_logits_large_vocab_per_sequence():
    # https://github.com/unslothai/unsloth/pull/4330: 8192 x 248320 x 4 bytes = 7.68 GB of fp32
    # logits; the fix computes the fused CE loss from hidden states.
    f = top(run(text("fl-unsloth-4330-qwen35-vocab")))
    assert f.category == "logits_memory" and "fused" in f.fix.lower()


# ---- RK266: memory that grows step after step -----------------------------------------------


@covers("RK266")
def test_fresh_rk266_prose_memory_grows_until_oom():
    # https://github.com/pytorch/pytorch/issues/1840: "the memory grows unlimitly until OOM";
    # soumith: `sum_log_likelihood += neg_log_likelihood` keeps the graph of every step - add
    # the value (.data / .item()), not the tensor.
    f = top(run(text("fm-pt-1840-loss-accumulated")))
    assert f.rule == "RK266"
    assert "loss.item()" in f.fix and "total_loss += loss" in f.evidence


def test_knobs_read_framework_names_not_lookalikes():
    # Key names as the frameworks document them (verl's ppo_trainer.yaml `trainer:` section,
    # Lightning's Trainer arguments, an LSTM's input_size): a `trainer.*` key alone is not
    # Lightning, and a feature size is not a sequence cap.
    from recompute_kit.doctor.rules.knobs import read_knobs

    def knobs(config: dict):
        return read_knobs(build_context(Evidence(config=config)))

    verl = knobs({"trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "max_prompt_length": 512})
    assert verl.framework == "script" and verl.seq == [("max_prompt_length", 512)]
    assert knobs({"trainer.accumulate_grad_batches": 4}).framework == "lightning"
    assert knobs({"trainer.devices": 2, "batch_size": 8}).framework == "lightning"
    assert knobs({"input_size": 128, "hidden_size": 256, "batch_size": 4}).seq == []


def test_knobs_offload_switched_off_is_no_offload():
    # NeMo-RL's grpo_math_1B.yaml sets policy.megatron_cfg.optimizer_offload: false (and
    # Megatron's optimizer_offload_fraction 0.0 is none): keys named offload, set off, are no
    # offload; set on, or naming a device, they are.
    from recompute_kit.doctor.rules.knobs import read_knobs

    def offload(config: dict) -> bool:
        return read_knobs(build_context(Evidence(config=config))).offload

    assert not offload({"policy.megatron_cfg.optimizer_offload": False, "global_batch_size": 8})
    assert not offload({"optimizer_offload_fraction": 0.0})
    assert offload({"policy.megatron_cfg.optimizer_offload": True})
    assert offload({"zero_optimization.offload_optimizer.device": "cpu"})
    assert not offload({"zero_optimization.offload_optimizer.device": "none"})


def test_megatron_states_step_is_not_a_deepspeed_key():
    # A Megatron run (zero_stage 0 is its "no ZeRO") with the distributed optimizer on: the
    # next model-states step is more tensor parallelism, never zero_optimization.stage 3.
    from recompute_kit.doctor.rules.fallback import _states_step
    from recompute_kit.doctor.rules.knobs import read_knobs

    ctx = build_context(
        Evidence(
            config={
                "global_batch_size": 512,
                "zero_stage": 0,
                "use_distributed_optimizer": True,
                "tensor_model_parallel_size": 4,
            }
        )
    )
    patch, words = _states_step(ctx, read_knobs(ctx))
    assert "zero_optimization" not in patch and "ZeRO" not in words


def test_pasted_document_with_glued_lines_does_not_crash():
    # The NVIDIA perf-activation-recompute skill (seed-001) pasted as a log: its scraped lines
    # run `--recompute_modules core_attn layernorm \` on into glued prose and a table header.
    # Only module names are read (no crash in RK143's patch, no "Megatron would reject" from
    # garbage), and the table's findings lead as they do when it is given as experiments.
    d = run(text("seed-001-perf-activation-recompute"))
    assert d.evidence.config["recompute_modules"] == ["core_attn", "layernorm"]
    assert top(d).category == "recompute_overhead" and "RK054" not in ids(d)


# RK260-RK265: general readings of a phenomenon (rules/general.py, facts from
# evidence/signals.py), and default readings from sizes stated in prose. Texts are
# tests/data/rules/i26-*, verbatim from dev corpus cases (URLs in SOURCES).
# =============================================================================================


@covers("RK260")
def test_rk260_traceback_cut_inside_a_library_on_a_sharding_path():
    # https://github.com/huggingface/transformers/issues/46822: from_pretrained's frames end in
    # transformers' _initialize_missing_keys under deepspeed.zero.GatheredParameters; the
    # exception line is cut. Root cause: transformers gathers every missing key at once.
    d = run(text("i26-hf-46822"))
    f = top(d)
    assert f.rule == "RK260" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install -U transformers"
    assert f.config_patch["zero_optimization"] == {"stage": 2}
    cites(f, "transformers's own code", "_initialize_missing_keys", "GatheredParameters")
    assert "upgrade transformers" in f.fix and "paste it to confirm" in f.evidence
    # the same frames in the user's own script: not a library's bug
    mine = text("i26-hf-46822").replace(".../transformers/modeling_utils.py", "/home/me/train.py")
    assert "RK260" not in ids(run(mine))


@covers("RK260")
def test_rk260_needs_a_recompute_offload_or_sharding_path():
    # https://github.com/huggingface/transformers/issues/28499: Trainer -> accelerate ->
    # torch.autograd backward frames, cut before the exception: no feature in the frames, so
    # no framework-bug reading (the paste does not say which feature failed).
    assert "RK260" not in ids(run(text("i26-hf-28499")))


@covers("RK260", "RK103")
def test_rk260_ranks_below_the_specific_recompute_type_error():
    # https://github.com/NVIDIA/Megatron-LM/pull/2754: TypeError from Megatron's own
    # tensor_parallel.checkpoint; the specific RK103 leads, the general RK260 follows.
    d = run(text("i12-megatron-2754"))
    assert ids(d)[0] == "RK103"
    f = get(d, "RK260")
    assert f.confidence < top(d).confidence and f.config_patch["command"].endswith("megatron")


@covers("RK261")
def test_rk261_square_mask_of_a_long_sequence():
    # https://github.com/meta-pytorch/attention-gym/issues/32: q/k/v [2, 12, 93600, 128] and
    # "materialize [93600, 93600] mask causes OOM"; maintainer: pass _compile to
    # create_block_mask.
    d = run(text("i26-attngym-32"))
    f = top(d)
    assert f.rule == "RK261" and f.category == "allocation_exceeds_device"
    cites(f, "[93600, 93600]", "8.16 GiB", "[2, 12, 93600, 93600]", "783.29 GiB")
    assert "_compile=True" in f.config_patch["code"] and "create_block_mask" in f.fix


@covers("RK261")
def test_rk261_the_failing_line_computes_the_full_scores():
    # https://github.com/pytorch/pytorch/issues/133206: the OOM line of flex_attention run
    # uncompiled; the reporter: "the problem was I had to compile the function".
    f = top(run(text("i26-pt-133206")))
    assert f.rule == "RK261" and "torch.compile(flex_attention)" in f.config_patch["code"]
    assert f.confidence < 0.85  # no size in the paste: less sure than with [N, N]


@covers("RK262")
def test_rk262_logits_with_a_vocabulary_sized_dimension():
    # https://github.com/huggingface/trl/issues/3678: the full logits [B, logits_to_keep,
    # vocab] (2 x 256 x 151665) dominate the logprob forward; the answer: use_liger_kernel.
    # Here the pasted size is 2 x 256 x 151665 x 4 bytes: RK232 says so and RK262, the same
    # logits only named, steps aside; with a size that is not the product, RK262 reads them.
    assert top(run(text("i26-trl-3678"))).rule == "RK232"
    assert "RK262" not in ids(run(text("i26-trl-3678")))
    d = run(text("i26-trl-3678").replace("**310 MB**", "**500 MB**"))
    f = top(d)
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert f.config_patch == {"use_liger_kernel": True}
    cites(f, "151665")
    assert "logits_to_keep" in f.fix and "chunked" in f.fix
    # the logits named with no size and no OOM next to them: no reading
    assert "RK262" not in ids(run("full logits tensor `[B, logits_to_keep, vocab]`\n"))


@covers("RK263", "RK001")
def test_rk263_side_stream_communication_outranks_fragmentation():
    # https://github.com/pytorch/pytorch/issues/71616: the OOM (36.19 GiB reserved, 22.96 GiB
    # allocated) in a job that overlaps NCCL communication on separate streams; the fix was
    # per-stream event queues (PR #71745) and fewer queued comms in flight.
    d = run(text("i26-pt-71616-report"))
    f = top(d)
    assert f.rule == "RK263" and f.category == "framework_bug"
    cites(f, "36.19 GiB", "22.96 GiB", "13.23 GiB", "NCCL")
    assert f.config_patch["env"] == {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
    assert "record_stream" in f.fix and "in flight" in f.fix
    assert ids(d)[1] == "RK001"  # the reserved-but-unallocated reading stays, second
    # the OOM line alone (no side streams in the paste): fragmentation leads, as before
    assert top(run(text("pt-71616"))).rule == "RK001"


@covers("RK264")
def test_rk264_memory_allocated_nonzero_after_freeing_is_cublas_workspace():
    # https://github.com/pytorch/pytorch/pull/85447: after deleting the model and garbage
    # collection memory_allocated() stays non-zero; the PR moved cuBLAS workspaces into the
    # caching allocator ("This is expected").
    f = top(run(text("i26-pt-85447")))
    assert f.rule == "RK264" and f.category == "informational"
    assert f.config_patch["code"] == "torch._C._cuda_clearCublasWorkspaces()"
    assert "CUBLAS_WORKSPACE_CONFIG" in f.config_patch["env"]
    # gigabytes left over are references the program holds, not a workspace
    big = text("i26-pt-85447").replace("returns non-zero", "returns non-zero (12 GB)")
    assert "RK264" not in ids(run(big))


@covers("RK265")
def test_rk265_memory_summary_peak_without_an_oom():
    # https://github.com/pytorch/pytorch/issues/116928: torch.cuda.memory_summary() with a
    # 23806 MiB peak and no OOM; ptrblck: the script needs ~24GB, so an 8GB cap OOMs.
    f = top(run(text("i17-mistral-116928-summary")))
    assert f.rule == "RK265" and f.category == "genuine_pressure"
    cites(f, "23.25 GiB", "14.02 GiB", "set_per_process_memory_fraction")
    # "half of the current one" is no value: with no batch in the paste, said in words
    assert f.config_patch == {}
    assert "Patch left out: batch_size (halve it" in f.fix


@covers("RK266")
def test_rk266_allocated_memory_rising_every_step_is_a_leak():
    # https://github.com/pytorch/pytorch/issues/115255 (labels: module: checkpoint, module:
    # memory usage): a saved-tensor-hook loop prints "memory (MB) | allocated: ..." once per
    # step, 20.4, 20.5, 20.5, 20.6, ... 21.0 MB, never settling. No public paste of this
    # shape is in the corpus, so the reports are built from the thread's numbers.
    mb = [20.4, 20.5, 20.5, 20.6, 20.6, 20.6, 20.7, 20.7, 20.8, 20.8, 20.9, 20.9, 21.0, 21.0, 21.1]
    reports = [MemoryReport(allocated_bytes=int(v * 2**20)) for v in mb]
    d = diagnose(Evidence(memory=reports))
    f = top(d)
    assert f.rule == "RK266" and f.category == "framework_bug"
    cites(f, "20.40 MiB -> 21.10 MiB", "14 steps")
    assert "gc.collect()" in f.config_patch["code"] and "upgrade" in f.fix
    # the same figures settling after warm-up: a peak, not a leak
    settled = [MemoryReport(allocated_bytes=int(v * 2**20)) for v in mb[:5] + [20.6] * 6]
    assert "RK266" not in ids(diagnose(Evidence(memory=settled)))


@covers("RK266")
def test_rk266_reads_step_numbered_lines_and_yields_to_specific_growth_rules():
    # pytorch#123548 (dev corpus text): reserved grows per cycle under max_split_size_mb with
    # expandable_segments; the specific RK154 leads, whatever else reads the growth.
    assert top(run(text("i13-pt-123548"))).rule == "RK154"

    # a Megatron report line without a step on it counts in print order
    facts = scan_signals(["[Rank 0] memory (MB) | allocated: 20.4 | max allocated: 21.8"])
    assert facts["memory_series"][0][:3] == (0, 20_400_000, "allocated")


# RK260: resume_from_checkpoint=checkpoint (a saved model) is not activation checkpointing.
@covers("RK260")
def test_rk260_model_checkpoint_words_are_not_activation_checkpointing():
    # https://github.com/huggingface/transformers/issues/26377: the innermost frames are the
    # Trainer's train(); the only "checkpoint" in them is resume_from_checkpoint=checkpoint
    log = text("fn-noreqgrad-hf26377")
    assert "trainer.train(resume_from_checkpoint=checkpoint)" in log
    d = run(log)
    assert "RK260" not in ids(d) and top(d).rule == "RK071"
    # a frame of DeepSpeed's activation checkpointing still counts
    # https://github.com/deepspeedai/DeepSpeed/issues/1057
    f = get(run(text("fx-ds-1057-ckpt-py38")), "RK260")
    assert "activation checkpointing / recompute path" in f.evidence


# RK266: growth tied to a library release names the checkpoint as the holder only where the
# paste has checkpointing in it.
@covers("RK266")
def test_rk266_names_the_checkpoint_only_where_it_is_in_play():
    # https://github.com/pytorch/pytorch/issues/3824: double backward (create_graph=True), no
    # checkpointing anywhere in the paste
    log = text("fy-pt-3824-double-backward-memory-grows")
    assert "checkpoint" not in log.lower()
    f = get(run(log), "RK266")
    assert "checkpoint" not in f.evidence.lower() and "checkpoint" not in f.fix.lower()
    assert "0.4.0a0+4d405a4" in f.evidence
    # https://github.com/QuantumLab-ZY/HamGNN/issues/105: use_gradient_checkpointing = True
    g = get(run(text("fy-hamgnn-105-ckpt-cyclic-reference-leak")), "RK266")
    assert "checkpoint" in g.evidence


@covers("RK632")
def test_r6p_rk632_eager_attention_scores_are_activations():
    # https://github.com/unslothai/unsloth/issues/3363: eager attention in evaluation
    # (torch.matmul(query, key_states.transpose(2, 3))) OOMs; flex attention is the fix
    f = top(run(text("r6p-unsloth-3363-eager-scores")))
    assert f.rule == "RK632" and f.category == "activation_memory"
    assert "flex_attention" in f.config_patch["code"]


@covers("RK632")
def test_rk632_reads_the_softmax_over_eager_scores():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/758: a rich traceback whose
    # failing line is `attention_probs = attention_scores.softmax(dim=-1)` (eager attention)
    f = top(run(text("bnb-758-attention-softmax-oom")))
    assert f.rule == "RK632" and f.category == "activation_memory"


def test_rk632_patches_in_the_framework_the_frames_name():
    # Hugging Face's eager attention line (transformers' modeling_llama.py, verbatim) failing
    # in a Trainer run: the fix is the model's attn_implementation, not flex_attention code
    log = (
        '  File "/usr/local/lib/python3.10/site-packages/transformers/models/llama/'
        'modeling_llama.py", line 350, in forward\n'
        "    attn_weights = nn.functional.softmax(attn_weights, dim=-1, "
        "dtype=torch.float32).to(query_states.dtype)\n" + text("bnb-758-attention-softmax-oom")
    )
    f = top(run(log))
    assert f.rule == "RK632" and f.config_patch == {"attn_implementation": "sdpa"}


def test_r6p_rk261_keeps_uncompiled_flex_attention():
    # https://github.com/pytorch/pytorch/issues/133206: flex_attention's own reference math
    # (working_precision) run uncompiled allocates the whole 48 GB score matrix at once
    f = top(run(text("r6p-pt-133206-flex-uncompiled")))
    assert f.rule == "RK261" and f.category == "allocation_exceeds_device"


@covers("RK262")
def test_r8p_rk262_fp32_vocabulary_sized_loss_buffer():
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5508: "The native loss path creates
    # an approximately 3.79 GiB FP32 buffer for a `[4096, 1, 248320]` tensor"
    f = top(run(text("r8p-mbridge5508-fp32-ce-buffer")))
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert "vocabulary-sized buffer" in f.evidence and "fused cross entropy" in f.fix


@covers("RK260")
def test_r8p_rk260_traceback_cut_before_an_oom_said_in_words_is_no_library_bug():
    # https://github.com/huggingface/trl/issues/3436: the traceback is cut before its
    # exception line inside FSDP's unshard, and the user says "...load the model and OOM";
    # maintainer: "this is a genuine CUDA OOM ... not a TRL bug"
    d = run(text("r8p-trl3436-unshard-oom-cut"))
    assert "RK260" not in ids(d)
    assert top(d).category != "framework_bug"


@covers("RK266")
def test_a_leak_said_with_its_holder_named_reads_the_holder():
    # https://github.com/verl-project/verl/issues/6698 (the reporter's words, verbatim): a
    # leak "per training micro-batch" of outputs kept with grad_fn, checkpointing on. It was
    # the default activation reading, with "gradient checkpointing: not in the paste" and a
    # gradient_checkpointing patch.
    said = (
        "The unified engine's actor update leaks GPU memory **per training micro-batch**: "
        "tensors returned in `forward_step`'s `model_output` (and loss tensors stored in the "
        "metrics dict) still carry `grad_fn`, and `forward_backward_batch` holds them in "
        "`output_lst` until the *entire* batch finishes. The retained autograd graphs pin large "
        "activations for every micro-batch that runs a backward pass. With LoRA + long packed "
        "sequences this reliably OOMs the very first `update_actor` on an 80GB GPU.\n"
        "- multi-turn tool-agent rollouts, `use_dynamic_bsz` packed micro-batches up to 16k "
        "tokens, `use_remove_padding`, NO_PADDING, fsdp2 (`fsdp_size=1`), gradient "
        "checkpointing on\n"
    )
    d = run(said)
    f = top(d)
    assert f.rule == "RK266" and "autograd graphs" in f.evidence and "detach" in f.fix
    assert all("gradient_checkpointing" not in str(g.config_patch) for g in d.findings)


def test_settings_said_as_bs_and_checkpointing_on_are_read():
    # transformers#8403 ("I get OOM even with bs=1 on a 8GB card") and verl#6698 ("gradient
    # checkpointing on"): the reporters' words
    said = _said_settings("I get OOM even with bs=1 on a 8GB card\n")
    assert said.get("micro_batch") == 1
    assert _said_settings("fsdp2, gradient checkpointing on\n").get("gradient_checkpointing")
    assert "batch_no_help" in stated("I get OOM even with bs=1 on a 8GB card")


def _said_settings(text: str) -> dict:
    from recompute_kit.doctor.evidence.settings_prose import scan_settings

    return scan_settings(text.splitlines()).get("settings_prose", {})


def test_the_sequence_length_and_batch_said_in_a_sentence_are_read():
    # https://github.com/NVIDIA/TransformerEngine/issues/712: "a transformer with 4096 sequence
    # length, 32 heads, 32 layers, 128 head size, and batch size of 1"; a skill trial got
    # "sequence length: not in the paste".
    d = run(text("stated-te-712-fp8-peak-not-lower"))
    said = d.evidence.facts["log"]["settings_prose"]
    assert (said["seq_len"], said["micro_batch"]) == (4096, 1)
    assert all("sequence length: not in the paste" not in f.evidence for f in d.findings)
