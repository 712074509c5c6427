"""Fresh real pastes by memory category (model states, fragmentation, logits, one allocation
larger than the GPU, other processes, memory outside PyTorch): threads other than the rules'
own sources and the corpus. Each test names its thread's URL and the remedy given there."""

from __future__ import annotations

from rule_helpers import covers, run, text, top


@covers("RK017", "RK110")
def test_fb_zero2_oom_initialising_adam_states():
    # https://github.com/deepspeedai/DeepSpeed/issues/237: ZeRO-2 OOM in
    # initialize_optimizer_states (exp_avg zeros_like): the optimizer states do not fit
    f = top(run(text("fb-ds-237-zero2-init-optimizer-states")))
    assert f.category == "model_state_memory"


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


@covers("RK004")
def test_fb_grid_sampler_asks_for_more_than_the_gpu():
    # https://github.com/wxian3/NeuroLens/issues/2: 55.57 GiB requested on a 12 GiB GPU
    f = top(run(text("fb-neurolens-2-grid-sampler-55gib")))
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"


@covers("RK089")
def test_fb_little_allocated_no_free_other_users():
    # https://github.com/horovod/horovod/issues/2719: 2.68 GiB allocated, 53.75 MiB free of
    # 15.78 GiB; "some other users are sharing the same GPU"
    f = top(run(text("fb-horovod-2719-other-users")))
    assert f.category == "other_processes"


@covers("RK481")
def test_fb_cuda_overhead_beyond_the_allocator_cache():
    # https://github.com/pytorch/pytorch/issues/28394: 2 MB cached but ~1 GB used on the GPU:
    # the CUDA context (maintainers: lazy loading in later CUDA)
    f = top(run(text("fb-pt-28394-cuda-overhead")))
    assert f.rule == "RK481" and f.category == "non_pytorch_memory"
    assert f.config_patch == {"env": {"CUDA_MODULE_LOADING": "LAZY"}}


@covers("RK481")
def test_fb_driver_memory_not_counted_by_max_memory_allocated():
    # https://github.com/facebookresearch/maskrcnn-benchmark/issues/182 (fmassa): memory of
    # the CUDA driver is not counted in torch.cuda.max_memory_allocated()
    f = top(run(text("fb-maskrcnn-182-driver-memory")))
    assert f.rule == "RK481" and f.category == "non_pytorch_memory"


@covers("RK480")
def test_fb_fragmentation_reserved_growing_over_time():
    # https://github.com/meta-pytorch/torchtune/issues/2830 (maintainer): fragmentation,
    # reserved memory growing over time; try expandable_segments:True
    f = top(run(text("fb-torchtune-2830-reserved-growing")))
    assert f.rule == "RK480" and f.category == "fragmentation"
    assert "expandable_segments" in f.fix


@covers("RK480")
def test_fb_fragmentation_split_remainder_pinned():
    # https://github.com/vllm-project/vllm/pull/41268: a split block's free remainder pinned by
    # the live tensor; fixed with max_split_size_mb (expandable_segments in #41158)
    f = top(run(text("fb-vllm-pr41268-split-remainder")))
    assert f.rule == "RK480" and f.category == "fragmentation"
    assert "max_split_size_mb" in f.fix


def test_fb_pytorch_tip_alone_is_not_fragmentation_in_words():
    # the OOM message's own "to avoid fragmentation" tip is not the thread naming it
    d = run(text("fb-neurolens-2-grid-sampler-55gib"))
    assert "RK480" not in [f.rule for f in d.findings]


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


@covers("RK501")
def test_fb_allocation_larger_than_any_gpu_stated_in_words():
    # https://github.com/hpcaitech/Open-Sora/issues/70: expand_mask_4d "will try to allocate
    # 720gb" at ~200k sequence length: a dense 4-d mask no GPU holds
    f = top(run(text("fb-opensora-70-mask-720gb")))
    assert f.rule == "RK501" and f.category == "allocation_exceeds_device"
    assert f.config_patch == {"attn_implementation": "flash_attention_2"}


def test_fb_allocation_in_words_that_fits_a_gpu_is_not_rk501():
    d = run("When the sequence length ~ 8k this will try to allocate 40gb.")
    assert "RK501" not in [f.rule for f in d.findings]


@covers("RK360")
def test_fb_gpu_consumed_by_another_process_without_an_oom():
    # https://github.com/sgl-project/sglang/issues/465: a misspelled CUDA_VISIBLE_DEVICES left
    # the server on "a GPU that was consumed already"
    f = top(run(text("fb-sglang-465-gpu-consumed")))
    assert f.rule == "RK360" and f.category == "other_processes"
    assert "CUDA_VISIBLE_DEVICES" in f.config_patch["env"]


def test_fb_gpu_memory_used_up_is_not_another_process():
    # memory used up by this job's own tensors is not the GPU taken by someone else
    d = run("The GPU memory is already used up by the model after two steps.")
    assert "RK360" not in [f.rule for f in d.findings]
