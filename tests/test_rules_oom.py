"""Rules RK001-RK013: reading the OOM message; which memory dominates, with a model shape."""

from __future__ import annotations

import pytest
from rule_helpers import (
    GIB,
    LLAMA3_70B_32K,
    LLAMA3_70B_TP8_NO_DISTOPT,
    LLAMA31_8B_128K,
    QWEN25_7B_32K,
    cites,
    covers,
    get,
    ids,
    run,
    spec_patch,
    text,
    top,
)

from recompute_kit.doctor.engine import build_context, diagnose
from recompute_kit.doctor.evidence import (
    Evidence,
    OOMEvent,
)
from recompute_kit.doctor.rules import (
    EXPANDABLE,
    gib,
)

# =============================================================================================
# RK001-RK007: reading the OOM message
# =============================================================================================


@covers("RK001")
def test_rk001_fragmentation_in_a_pre_2_1_message():
    # https://github.com/pytorch/pytorch/issues/71616: 36.19 GiB reserved, 22.96 GiB allocated
    # at a 648 MiB request (PyTorch <= 2.0 prints no "reserved but unallocated": it is R - A).
    d = run(text("pt-71616"))
    f = top(d)
    assert f.rule == "RK001" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    assert f.config_patch["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    cites(f, "13.23 GiB", "648.00 MiB")  # 36.19 - 22.96, and the request as printed


@covers("RK001")
def test_rk001_fragmentation_in_a_current_message():
    # https://github.com/pytorch/pytorch/issues/175431 (ROCm): 14.93 GiB reserved but
    # unallocated, a 2.00 MiB request fails.
    f = top(run(text("pt-175431")))
    assert f.rule == "RK001"
    cites(f, "14.93 GiB", "2.00 MiB")
    assert f.config_patch == EXPANDABLE


@covers("RK001")
def test_rk001_hard_wrapped_message_from_the_pytorch_pr():
    # real-formats.md oom-pt-pr99699 (https://github.com/pytorch/pytorch/pull/99699), pasted
    # hard-wrapped: 410.41 MiB reserved-unallocated against 138.00 MiB.
    f = get(run(text("oom-pt-pr99699")), "RK001")
    cites(f, "410.41 MiB", "138.00 MiB")


@pytest.mark.parametrize(
    "name",
    [
        # real-formats.md oom-msswift-9191: 40.42 MiB slack, 48.00 MiB request, 139.81 GiB GPU
        "oom-msswift-9191",
        # real-formats.md oom-unilm-137 (2.0 format): 10.86 - 10.85 GiB reserved-allocated
        "oom-unilm-137",
        # real-formats.md oom-pt-16417-title (<=1.4 "cached" format): 4.68 MiB cached
        "oom-pt-16417-title",
    ],
)
@covers("RK001")
def test_rk001_not_when_reserved_unallocated_is_tiny(name):
    assert "RK001" not in ids(run(text(name)))


@covers("RK001")
def test_rk001_not_when_expandable_segments_is_already_set():
    # The same real OOM (pytorch#175431) from a job whose launcher already exports the
    # setting: the advice would be circular.
    d = run(
        text("pt-175431"),
        config="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "torchrun --nproc_per_node 8 train.py --bf16\n",
        config_name="launch.sh",
    )
    assert d.evidence.env.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    assert "RK001" not in ids(d)


@covers("RK002")
def test_rk002_other_processes_hold_the_gpu():
    # https://github.com/rwth-i6/returnn/issues/1469: 15 other workers hold 1.19 GiB each
    # ("every worker reserves memory on every GPU").
    f = top(run(text("returnn-1469")))
    assert f.rule == "RK002" and f.category == "other_processes"
    cites(f, "17.85 GiB", "31.74 GiB")  # 15 x 1.19 GiB of the 31.74 GiB GPU
    assert f.confidence >= 0.9


@pytest.mark.parametrize(
    "name, held",
    [
        # https://github.com/Alibaba-NLP/ZeroSearch/issues/11: a simulation server (30.51 GiB)
        # shares the GPU; no "this process" line, so our own process is listed too.
        ("zerosearch-11", "30.92 GiB"),
        # https://github.com/huggingface/trl/issues/4237: sibling xdist workers in CI.
        ("trl-4237", "6.46 GiB"),
    ],
)
@covers("RK002")
def test_rk002_other_processes_in_a_container(name, held):
    d = run(text(name))
    f = top(d)
    assert f.rule == "RK002"
    cites(f, held)  # listed processes minus this process's own PyTorch memory


@pytest.mark.parametrize(
    "name",
    [
        # https://github.com/vllm-project/vllm/issues/10637: "Process 6513 has 15.63 GiB" is
        # the failing vLLM process itself (13.81 GiB allocated by PyTorch): PID namespace.
        "vllm-10637",
        # https://github.com/studio-dots-ai/dots.ocr/issues/196: "Process 2684311 has 14.51
        # GiB" is the process itself (13.44 GiB + 738.96 MiB PyTorch).
        "dots-ocr-196",
        # real-formats.md oom-pt-16417-comment: no other process at all.
        "oom-pt-16417-comment",
    ],
)
@covers("RK002")
def test_rk002_not_when_the_listed_process_is_this_one(name):
    assert "RK002" not in ids(run(text(name)))


@covers("RK003")
def test_rk003_memory_outside_pytorch():
    # WEAK: no public OOM message shows a large non-PyTorch share. The numbers are those
    # measured in https://github.com/NVIDIA/TransformerEngine/issues/2111 (device memory used
    # 31.6 GB while torch.cuda.memory_allocated stays 20.42 GB), placed in an OOMEvent.
    oom = OOMEvent(process_bytes=int(31.6e9), allocated_bytes=20423514624)
    d = diagnose(Evidence(oom=[oom]))
    f = top(d)
    assert f.rule == "RK003" and f.category == "non_pytorch_memory"
    cites(f, "29.43 GiB", "19.02 GiB")  # 31.6 GB and 20.42 GB in GiB


@pytest.mark.parametrize(
    "name",
    [
        # https://github.com/pytorch/pytorch/issues/111363: 41.06 GiB in use, 39.10 GiB
        # allocated + 427.46 MiB reserved: 1.5 GiB outside PyTorch is the CUDA context.
        "pt-111363",
        # real-formats.md oom-pt-pr99699: 15.32 GiB vs 14.12 GiB + 410.41 MiB.
        "oom-pt-pr99699",
    ],
)
@covers("RK003")
def test_rk003_not_for_an_ordinary_cuda_context(name):
    assert "RK003" not in ids(run(text(name)))


@pytest.mark.parametrize(
    "name, size, total",
    [
        # https://github.com/studio-dots-ai/dots.ocr/issues/196: eager attention matrix
        ("dots-ocr-196", "74.16 GiB", "44.40 GiB"),
        # https://github.com/pytorch/pytorch/pull/13751: the PR's own example (<=1.4 format)
        ("pt-pr13751", "16.00 GiB", "11.93 GiB"),
        # https://github.com/ROCm/TheRock/issues/1054: HIP, 16 GiB on a 15.24 GiB device
        ("therock-1054", "16.00 GiB", "15.24 GiB"),
    ],
)
@covers("RK004")
def test_rk004_one_allocation_larger_than_the_gpu(name, size, total):
    f = top(run(text(name)))
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"
    cites(f, size, total)


@covers("RK004")
def test_rk004_not_for_a_request_below_half_the_gpu():
    # https://github.com/pytorch/pytorch/issues/35901: 10.84 GiB of 23.65 GiB (46%); the
    # thread's cause was a split segment (fragmentation), which RK001 reports.
    d = run(text("pt-35901"))
    assert "RK004" not in ids(d)
    assert top(d).rule == "RK001"


@covers("RK005")
def test_rk005_pytorch_allocations_fill_the_gpu():
    # real-formats.md oom-msswift-9191 (https://github.com/modelscope/ms-swift/issues/9191):
    # 138.20 GiB of 139.81 GiB allocated by PyTorch, nothing else to blame.
    d = run(text("oom-msswift-9191"))
    f = top(d)
    assert f.rule == "RK005" and f.category == "genuine_pressure"
    cites(f, "138.20 GiB", "139.81 GiB")
    assert ids(d) == ["RK005"]


@covers("RK005")
def test_rk005_superseded_when_the_model_shape_explains_it():
    # The same OOM with a Llama-3-70B 32k config: the activation finding replaces RK005.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    assert "RK010" in ids(d) and "RK005" not in ids(d)


@covers("RK006")
def test_rk006_per_process_cap():
    # WEAK: no complete public OOM message with "allowed;" was found. Numbers from
    # https://github.com/pytorch/pytorch/issues/111729 ("4.77 GiB allowed; 4.74 GiB reserved
    # in total by PyTorch" on GPUs with 12.2 GiB each).
    oom = OOMEvent(
        allowed_bytes=round(4.77 * GIB),
        reserved_bytes=round(4.74 * GIB),
        total_bytes=round(12.2 * GIB),
    )
    f = get(diagnose(Evidence(oom=[oom])), "RK006")
    assert f.category == "informational"
    cites(f, "4.77 GiB", "12.20 GiB")


@covers("RK006")
def test_rk006_not_without_a_cap():
    # Real messages without "allowed;" (pytorch#111363 used the fraction API, but its message
    # did not print the cap - the bug the issue reports).
    for name in ("pt-111363", "oom-msswift-9191", "returnn-1469"):
        assert "RK006" not in ids(run(text(name))), name


@covers("RK007")
def test_rk007_cuda_graph_private_pools():
    # WEAK: the public messages with "allocated in private pools" that carry a URL hold less
    # than 1 GiB there. Numbers from a public notebook's OOM (47.00 GiB allocated, 46.22 GiB
    # of it in private pools, 47.53 GiB GPU), found through the code index without a URL.
    oom = OOMEvent(
        requested_bytes=2 * 2**20,
        total_bytes=round(47.53 * GIB),
        allocated_bytes=round(47.00 * GIB),
        private_pool_bytes=round(46.22 * GIB),
        reserved_unallocated_bytes=round(149.10 * 2**20),
    )
    f = get(diagnose(Evidence(oom=[oom])), "RK007")
    assert f.config_patch == {"cuda_graph_impl": "none"}
    cites(f, "46.22 GiB")


@covers("RK007")
def test_rk007_not_for_small_private_pools():
    # https://github.com/vllm-project/vllm/issues/10637: 106.00 MiB in private pools.
    d = run(text("vllm-10637"))
    assert d.evidence.oom[0].private_pool_bytes == 106 * 2**20
    assert "RK007" not in ids(d)


# =============================================================================================
# RK010-RK013: which memory dominates, with a model shape
# =============================================================================================


@covers("RK010")
def test_rk010_activations_dominate_llama3_70b_at_64k():
    # Llama-3-70B, TP8 PP4 DP4 (torchrun 8 x 16) at 64k context without recompute, and the
    # H200 OOM of real-formats.md oom-msswift-9191 (139.81 GiB device). (At 32k the script fits
    # that GPU once read as Megatron-LM runs it: bias-SwiGLU fused, DP 4 for the optimizer.)
    config = LLAMA3_70B_32K.replace("32768", "65536")
    d = run(text("oom-msswift-9191"), config=config, config_name="pretrain.sh")
    f = top(d)
    assert f.rule == "RK010" and f.category == "activation_memory"
    ctx = build_context(d.evidence)
    e = ctx.estimate
    cites(f, gib(e.peak_activation_bytes), "'none'")
    cites(f, gib(e.weights_bytes + e.grads_bytes + e.optimizer_bytes))
    # the patch is the planner's choice for this GPU, and the evidence names it
    best = ctx.best.estimate.recompute
    cites(f, f"'{best}'")
    assert f.config_patch["recompute_granularity"] in ("selective", "full")
    assert f.config_patch != spec_patch(None)
    assert e.peak_activation_bytes > e.weights_bytes + e.grads_bytes + e.optimizer_bytes


LLAMA3_8B_TP4_8K = """\
num_layers: 32
hidden_size: 4096
num_attention_heads: 32
num_query_groups: 8
ffn_hidden_size: 14336
gated_linear_unit: true
normalization: RMSNorm
seq_length: 8192
micro_batch_size: 1
padded_vocab_size: 128256
share_embeddings_and_output_weights: false
position_embedding_type: rope
add_bias_linear: false
bias_activation_fusion: true
apply_rope_fusion: true
hidden_dropout: 0.0
attention_dropout: 0.0
tensor_model_parallel_size: 4
sequence_parallel: true
data_parallel_size: 8
use_distributed_optimizer: true
bf16: true
"""


@covers("RK010")
def test_rk010_recompute_makes_it_fit_though_states_are_larger():
    # The real 23.65 GiB OOM of pytorch/pytorch#16417 with Llama-3-8B on TP4 at 8k: model
    # states outweigh activations, yet the rank does not fit without recompute and does with
    # it. The shape was given: the finding must not fall back to RK005's "without a model
    # shape" advice.
    d = run(text("oom-pt-16417-comment"), config=LLAMA3_8B_TP4_8K, config_name="l8b.yaml")
    f = top(d)
    assert f.rule == "RK010" and f.category == "activation_memory"
    ctx = build_context(d.evidence)
    e = ctx.estimate
    assert e.peak_activation_bytes < e.weights_bytes + e.grads_bytes + e.optimizer_bytes
    assert e.total_bytes > ctx.gpu_bytes
    cites(f, gib(e.total_bytes), "23.65 GiB", f"'{ctx.best.estimate.recompute}'")
    assert f.config_patch["recompute_granularity"] in ("selective", "full")
    assert "RK005" not in ids(d)


@covers("RK010")
def test_rk010_needs_an_oom():
    # The same config without an OOM is a plan, not a diagnosis.
    d = run(config=LLAMA3_70B_32K, config_name="pretrain.sh", gpu_memory_gb=141)
    assert "RK010" not in ids(d)


@covers("RK011")
def test_rk011_model_states_dominate_without_the_distributed_optimizer():
    # Llama-3-70B on TP8 alone, Adam states unsharded, and the real H200 OOM
    # (oom-msswift-9191): recompute cannot help.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_TP8_NO_DISTOPT, config_name="x.sh")
    f = top(d)
    assert f.rule == "RK011" and f.category == "model_state_memory"
    assert f.config_patch == {"use_distributed_optimizer": True}
    e = build_context(d.evidence).estimate
    cites(f, gib(e.weights_bytes), gib(e.grads_bytes), gib(e.optimizer_bytes), "139.81 GiB")


@covers("RK011")
def test_rk011_not_when_states_are_small():
    # Llama-3-70B TP8 PP4 with the distributed optimizer: states are a minority of the GPU.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    assert "RK011" not in ids(d)


@covers("RK012")
def test_rk012_logits_of_a_large_vocabulary_at_32k():
    # Qwen2.5-7B (152064 vocabulary) at 32k tokens on TP2, 80 GiB GPUs.
    d = run(config=QWEN25_7B_32K, config_name="qwen25_7b.yaml", gpu_memory_gb=80)
    f = get(d, "RK012")
    assert f.category == "logits_memory"
    cites(f, "32768 tokens x 152064", "9.28 GiB")  # 4 B x 32768 x 152064 / TP2
    assert f.config_patch == {"cross_entropy_loss_fusion": True}


@covers("RK012")
def test_rk012_not_for_a_short_sequence():
    # The same model at 4k: 1.16 GiB of fp32 logits per rank is no concern on 80 GiB.
    short = QWEN25_7B_32K.replace("seq_length: 32768", "seq_length: 4096")
    assert "RK012" not in ids(run(config=short, config_name="q.yaml", gpu_memory_gb=80))


@covers("RK013")
def test_rk013_even_full_recompute_does_not_fit():
    # Llama-3.1-8B at 128k context without context parallelism, full recompute on, and the
    # real H200 OOM (oom-msswift-9191).
    d = run(text("oom-msswift-9191"), config=LLAMA31_8B_128K, config_name="l8b.yaml")
    f = get(d, "RK013")
    assert f.category == "model_state_memory"
    assert top(d).category == "model_state_memory"
    cites(f, "Nothing fits in 139.81 GiB")
    assert "RK010" not in ids(d)  # superseded


@covers("RK013")
def test_rk013_needs_an_oom():
    d = run(config=LLAMA31_8B_128K, config_name="l8b.yaml", gpu_memory_gb=141)
    assert "RK013" not in ids(d)
