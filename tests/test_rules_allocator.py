"""Tests of the rules in recompute_kit/doctor/rules/allocator.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from rule_helpers import (
    GIB,
    LLAMA3_70B_32K,
    cites,
    covers,
    get,
    ids,
    llava_inputs,
    run,
    text,
    top,
)

from recompute_kit.doctor.engine import Diagnosis, diagnose
from recompute_kit.doctor.evidence import (
    ErrorEvent,
    Evidence,
    OOMEvent,
    collect,
)
from recompute_kit.doctor.evidence.pasted import parse_pasted_settings
from recompute_kit.doctor.rules import (
    EXPANDABLE,
)

# =============================================================================================
# Rules added for the scenario corpus: their inputs are the corpus's real cases
# (tests/scenarios/*.yaml, each with its source URL in the file)
# =============================================================================================

SCENARIOS = Path(__file__).parent / "scenarios"


def scenario(name: str) -> Diagnosis:
    import yaml

    case = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    return run(
        case.get("log") or "",
        config=case.get("config"),
        config_name=case.get("config_name") or "config.yaml",
        experiments=case.get("experiments"),
        gpu_memory_gb=case.get("gpu_memory_gb"),
    )


def _write(body: str):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "train.log"
    path.write_text(body, encoding="utf-8")
    return path


# ---- ranking (issue 12 item 3): constructed events, not real text ---------------------------


def _oom_in_loss(reserved_unallocated: int, requested: int) -> Evidence:
    oom = OOMEvent(
        requested_bytes=requested,
        total_bytes=80 * GIB,
        free_bytes=GIB // 4,
        allocated_bytes=60 * GIB,
        reserved_unallocated_bytes=reserved_unallocated,
        process_bytes=60 * GIB + reserved_unallocated,
        generation="gen5_expandable",
    )
    error = ErrorEvent(
        type="torch.OutOfMemoryError",
        message="CUDA out of memory.",
        frames=["train.py:10 in step", "loss.py:5 in cross_entropy"],
    )
    return Evidence(oom=[oom], errors=[error])


# verbatim from https://github.com/NVIDIA/nccl/issues/1284 (the title, quoted there)
NCCL_1284 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory"
)


@covers("RK102")
def test_rk102_halves_the_pasted_batch_and_says_what_it_frees():
    # https://github.com/BaberMuyu/2020CCF-NER/issues/6 (dev corpus case): a 294 MiB request
    # with 61.62 MiB free on a 7.79 GiB GPU, batch_size 16; the author: lower batch_size.
    d = run(text("i22-ccf-ner-6"), config=text("i22-ccf-ner-6-config"))
    f = get(d, "RK102")
    # 617.88 MiB "cached" (split blocks) is twice the request but under 10% of the GPU: not
    # fragmentation worth the name, so the small-GPU reading leads and RK001 follows
    assert top(d).rule == "RK102" and ids(d).index("RK001") > 0
    assert f.config_patch == {"batch_size": 8}  # a plain script: no checkpoint key to set
    cites(f, "batch_size = 16", "232.38 MiB", "147.00 MiB", "6.27 GiB")
    assert "batch_size 16 -> 8" in f.fix and "larger GPU" in f.fix


# =============================================================================================
# Ranking: a specific finding outranks the generic ones on the same input
# =============================================================================================


def test_summary_names_the_top_finding():
    d = run(text("pt-71616"))
    assert d.summary.startswith("RK001 ")
    assert "13.23 GiB" in d.summary


@covers("RK008")
def test_rk008_oom_far_below_capacity_from_the_experiments():
    # NVIDIA skill perf-activation-recompute (Llama3-70B): OOM at a 58.8 GB peak on 80 GB.
    d = scenario("frag_llama3_70b_vpp_vs_expandable")
    assert top(d).category == "fragmentation"  # RK105 (the expandable row passes) leads
    f = get(d, "RK008")
    assert f.config_patch == {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    assert "RK011" not in ids(d)


@covers("RK009")
def test_rk009_nccl_could_not_allocate():
    # cosmos-rl PR #731: "NCCL WARN Cuda failure 2 'out of memory'" with no torch OOM.
    f = top(scenario("frag_cosmos_rl_nccl_calloc"))
    assert f.rule == "RK009" and f.category == "fragmentation"


@covers("RK009")
def test_rk009_nccl_calloc_failure_alone():
    # https://github.com/microsoft/NPKit/issues/37: NCCL's own warning, no torch OOM around it
    f = top(run(text("npkit-37-nccl-calloc")))
    assert f.rule == "RK009" and "nccl" in f.evidence.lower()


def test_an_xpu_oom_is_pytorchs_allocator_not_a_library():
    # Intel GPUs: PyTorch's XPU caching allocator words its OOM as CUDA's does
    # (https://github.com/pytorch/pytorch/blob/main/c10/xpu/XPUCachingAllocator.cpp, the
    # TORCH_CHECK_WITH(OutOfMemoryError, ...) message, rendered with a real run's figures)
    d = run(
        "torch.OutOfMemoryError: XPU out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        "total capacity of 11.93 GiB of which 5.62 MiB is free. Of the allocated memory 10.43 "
        "GiB is allocated by PyTorch, and 94.57 MiB is reserved by PyTorch but unallocated."
    )
    assert "RK009" not in ids(d) and top(d).category in ("genuine_pressure", "activation_memory")


@covers("RK009")
def test_rk009_blas_handle_allocation_on_cuda_and_rocm():
    # PyTorch's message when cuBLAS cannot allocate its handle's workspace
    # (https://github.com/QwenLM/Qwen3/issues/873: "解决了，用单卡去跑，显存充足就可以" - fixed
    # with a GPU that had enough free memory), and the same call hipified on ROCm
    # (https://github.com/ROCm/TheRock/issues/1708): one rule for both spellings.
    cuda = (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    )
    rocm = (
        "RuntimeError: CUDA error: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`"
    )
    for line in (cuda, rocm):
        f = top(run(line + "\n"))
        assert f.rule == "RK009" and f.config_patch == EXPANDABLE


@covers("RK004")
def test_fb_grid_sampler_asks_for_more_than_the_gpu():
    # https://github.com/wxian3/NeuroLens/issues/2: 55.57 GiB requested on a 12 GiB GPU
    f = top(run(text("fb-neurolens-2-grid-sampler-55gib")))
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"


# ---- small GPUs, one OOM line: the batch ---------------------------------------------------


@covers("RK102")
def test_fresh_rk102_four_gib_gpu_reduce_batch_or_image_size():
    # https://github.com/microsoft/computervision-recipes/issues/561: "Try reducing the batch
    # size or the image size or both" (a 4 GiB GPU, the old message wording)
    f = top(run(text("fd-cvrecipes-561-4gb")))
    assert f.rule == "RK102" and f.category == "genuine_pressure"
    assert "Patch left out: batch_size (halve it" in f.fix  # (no batch in the paste)


@covers("RK102")
def test_fresh_rk102_twelve_gib_gpu_lower_batch_size():
    # https://github.com/RistoranteRist/FastFlow/issues/4: "Lower your batch size"; the
    # 430 MiB reserved-but-unallocated is no fragmentation to lead with
    d = run(text("fd-fastflow-4-12gb"))
    assert top(d).rule == "RK102" and top(d).category == "genuine_pressure"
    assert [f.rule for f in d.findings].index("RK001") > 0


@covers("RK102")
def test_fresh_rk102_two_gib_gpu_after_reducing_the_batch():
    # https://github.com/herbert-chen/tianchi_lvcai/issues/9: a 2 GiB GPU; "after I reduce the
    # batch size" is not a batch size the paste sets
    f = top(run(text("fd-tianchi-9-2gb")))
    assert f.rule == "RK102" and f.category == "genuine_pressure"
    assert "batch_size" not in parse_pasted_settings(text("fd-tianchi-9-2gb"))


# ---- RK005: allocated near the GPU, the batch stated in a sentence --------------------------


@covers("RK005")
def test_fresh_rk005_batch_size_stated_in_prose_is_halved():
    # https://github.com/152334H/DL-Art-School/issues/56: 20.44 of 23.99 GiB allocated;
    # "Training batch size is 188" (the fix in the thread: anything under 100 works). The
    # validation batch size in the next line is not the training one.
    f = top(run(text("fd-dlas-56-batch188")))
    assert f.rule == "RK005" and f.category == "genuine_pressure"
    assert f.config_patch == {"batch_size": 94}
    assert "188 -> 94" in f.evidence


def test_fresh_prose_batch_size_reading_mutations():
    # the sentence is what sets it: without it no batch is read; an evaluation batch alone is
    # not the training batch
    pasted = text("fd-dlas-56-batch188").replace("Training batch size is 188\n", "")
    assert "batch_size" not in parse_pasted_settings(pasted)
    assert top(run(pasted)).config_patch != {"batch_size": 94}
    assert "batch_size" not in parse_pasted_settings("validation batch size is 48\n")
    assert parse_pasted_settings("with a batch size of 4 it OOMs\n") == {"batch_size": 4}


def test_fresh_knob_assignments_need_a_number_and_a_knob_name():
    # mutation guards: an expression is not read, nor a name that is no memory knob
    got = parse_pasted_settings(text("fd-litllama-286-micro-batch"))
    assert got["micro_batch_size"] == 2 and got["batch_size"] == 6
    assert "gradient_accumulation_steps" not in got  # batch_size // micro_batch_size
    assert "max_iters" not in got
    assert parse_pasted_settings("learning_rate = 3\nmicro_batch_size = mbs\n") == {}


# ---- RK001: a sliver of slack next to a small request ---------------------------------------


@covers("RK001")
def test_fresh_rk001_reporter_needs_expandable_segments():
    # https://github.com/jhc13/taggui/issues/188: "if I don't set it
    # [PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True] I get OOM"
    f = top(run(text("fd-taggui-188-expandable")))
    assert f.rule == "RK001" and f.category == "fragmentation"
    assert f.config_patch["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


# ---- RK071: the Variable-era wording --------------------------------------------------------


@covers("RK071")
def test_fresh_rk071_element_0_of_variables_with_gradient_checkpointing():
    # https://github.com/kohya-ss/sd-scripts/issues/697: "element 0 of variables does not
    # require grad" with gradient checkpointing and a frozen part (--network_train_unet_only)
    d = run(text("fd-kohya-697-element0"))
    assert top(d).rule == "RK071" and top(d).category == "checkpoint_api_misuse"
    assert top(d).config_patch == {"use_reentrant": False}
    # mutation: another first word is not the message
    other = text("fd-kohya-697-element0").replace("of variables", "of outputs")
    assert "RK071" not in ids(run(other))


# ---- RK002 / RK360: other processes on the GPU ----------------------------------------------


@covers("RK002")
def test_fresh_rk002_hard_wrapped_message_with_three_other_processes():
    # https://github.com/qibin0506/llm_trainer/issues/2 ("HOW to set CUDA_VISIBLE_DEVICE"): three
    # other processes hold 68.71 GiB of the 79.32 GiB GPU; the paste is cut mid-word
    # ("Includ" / "ing non-PyTorch ...", "expandable_segments:T" / "rue"). The wrapped lines
    # carry the fields, so this process's own 10.58 GiB is read, not taken for another's.
    d = run(text("fm-llmtrainer-2-other-processes"))
    f = top(d)
    assert f.rule == "RK002" and f.category == "other_processes"
    assert "CUDA_VISIBLE_DEVICES" in f.config_patch["env"]
    assert f.evidence.startswith("Other processes hold 68.71 GiB")
    oom = collect(logs=[str(_write(text("fm-llmtrainer-2-other-processes")))]).oom[0]
    assert oom.process_bytes and oom.allocated_bytes and not oom.truncated


# ---- RK004: one request larger than the GPU ---------------------------------------------------


@covers("RK004")
def test_fresh_rk004_request_above_the_gpu_with_other_processes_listed():
    # https://github.com/QwenLM/Qwen2.5-Omni/issues/240: a 124.68 GiB request on a 95.22 GiB GPU
    # while two other processes hold 44 GiB; the maintainers asked "Are you using
    # flash-attention?" (an eager attention score matrix). The request alone exceeds the GPU:
    # RK004 leads, not the other processes.
    d = run(text("fm-qwenomni-240-request-over-gpu"))
    f = top(d)
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"
    assert "flash" in f.fix
    assert "124.68 GiB" in f.evidence and "95.22 GiB" in f.evidence


@covers("RK003")
def test_fresh_rk003_context_sized_share_of_a_small_gpu():
    # https://github.com/Synthintel0/MyGirlGPT/issues/11: 4 GiB GPU, "this process has 3.44
    # GiB" against 2.58 GiB allocated by PyTorch, "no other running process". No maintainer
    # reply; the numbers place 0.86 GiB outside the allocator (the CUDA context), and before
    # this change no rule fired at all.
    f = top(run(text("fo-mygirlgpt-11-non-pytorch-4gb")))
    assert f.rule == "RK003" and f.category == "non_pytorch_memory"
    assert f.config_patch == {"env": {"CUDA_MODULE_LOADING": "LAZY"}}
    assert "878.74 MiB" in f.evidence and "context" in f.fix


def test_fresh_context_gap_on_a_6gib_gpu_reads_as_a_small_gpu():
    # https://github.com/pytorch/pytorch/issues/67971: 6 GiB total, 0 free, 4.96 GiB reserved;
    # the maintainer: the missing ~1 GiB is the CUDA context. The numbers are those of any
    # full small GPU (the diagnosis rests on the question asked), so the doctor keeps its
    # small-GPU reading; documented miss.
    f = top(run(text("fo-pt-67971-last-gb-context")))
    assert f.rule == "RK102" and f.category == "genuine_pressure"


@covers("RK004")
def test_fresh_rk004_305gib_input_on_a_15gib_gpu():
    # https://github.com/kyegomez/LongNet/issues/19: torch.randn((batch_size, seq_len,
    # d_model)) asks for 305.18 GiB on a 14.75 GiB GPU: one tensor larger than the device; the
    # remedy is a smaller seq_len / batch_size.
    f = top(run(text("fq-longnet19-305gib-seq-len")))
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"
    assert "sequence length" in f.fix and "batch size" in f.fix


@covers("RK005")
def test_fresh_rk005_a40_protein_inference_genuine_pressure():
    # https://github.com/lujiarui/Str2Str/issues/4: 4.19 GiB asked with 4.20 GiB free on a
    # 44.40 GiB A40, 39.85 GiB allocated by PyTorch, 40.98 MiB cached: the job needs more than
    # the GPU has; the maintainer: lower precision (fp16) or a smaller batch size.
    f = top(run(text("fq-str2str4-a40-protein-525")))
    assert f.rule == "RK005" and f.category == "genuine_pressure"
    assert "batch size" in f.fix


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
    # Fifteen of one size are the ranks themselves: RK645 (every rank on this GPU) reads them
    # and supersedes RK002's sum; without the list's sizes RK002 says the sum.
    f = top(run(text("returnn-1469")))
    assert f.rule == "RK645" and f.category == "other_processes"
    cites(f, "lists 15 processes on this GPU holding about 1.19 GiB each")
    one = text("returnn-1469").split(" Process 101563")[0] + ". Including non-PyTorch memory"
    g = top(run(one + text("returnn-1469").split("Including non-PyTorch memory", 1)[1]))
    assert g.rule == "RK002" and g.category == "other_processes"
    cites(g, "2.38 GiB", "31.74 GiB")  # the two left of the 31.74 GiB GPU


@pytest.mark.parametrize(
    "name, held",
    [
        # https://github.com/Alibaba-NLP/ZeroSearch/issues/11: a simulation server (30.51 GiB)
        # shares the GPU; no "this process" line, so our own process is listed too.
        ("zerosearch-11", "30.92 GiB"),
        # https://github.com/huggingface/trl/issues/4237: sibling xdist workers in CI. The
        # four entries add up to the 13.09 GiB in use; one alone (6.79 GiB) holds PyTorch's
        # reserve (4.50 + 2.14 GiB): this process; the others hold 6.30 GiB.
        ("trl-4237", "6.30 GiB"),
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
    # The same OOM (a 139.8 GiB GPU) with a Llama-3-70B config whose estimate exceeds it
    # (64k: 202.7 GiB per rank without recompute): the activation finding replaces RK005.
    # At 32k the estimate (110.9 GiB) fits that GPU, and RK010 rightly says nothing.
    config = LLAMA3_70B_32K.replace("32768", "65536")
    d = run(text("oom-msswift-9191"), config=config, config_name="pretrain.sh")
    assert "RK010" in ids(d) and "RK005" not in ids(d)
    d32 = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    assert "RK010" not in ids(d32)


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


@covers("RK102")
def test_rk102_partial_old_message_on_a_small_gpu():
    # The paste starts at "Tried to allocate": no "RuntimeError: CUDA out of memory." head.
    d = run(text("i12-shannon-6"))
    (oom,) = d.evidence.oom
    assert oom.requested_bytes == 20 * 2**20 and oom.reserved_bytes == round(1.25 * GIB)
    assert oom.held_elsewhere_bytes == round(1.96 * GIB) - round(2.88 * 2**20) - round(1.25 * GIB)
    f = top(d)
    assert f.rule == "RK102" and f.category == "genuine_pressure"
    cites(f, "1.96 GiB", "20.00 MiB", "2.88 MiB")
    assert "RK089" not in ids(d)  # 724 MiB outside PyTorch on a desktop GPU: display/context


@covers("RK098")
def test_rk098_reserved_far_above_allocated_lines():
    f = top(run(text("i12-cosmosrl-388")))
    assert f.rule == "RK098" and f.category == "fragmentation"
    cites(f, "118.25 GiB", "56.75 GiB")
    assert f.config_patch == EXPANDABLE


def test_rk098_memory_summary_table():
    d = run(text("i12-pt-35901"))
    summary = [m for m in d.evidence.memory if m.source == "memory_summary"]
    assert summary and summary[0].max_allocated_bytes == 4877 * 10**6
    assert summary[0].reserved_bytes == 12420 * 10**6
    assert top(d).rule == "RK098"


def test_ranking_large_slack_keeps_fragmentation_first_over_logits():
    d = diagnose(_oom_in_loss(reserved_unallocated=8 * GIB, requested=2 * GIB))
    assert ids(d)[:2] == ["RK001", "RK016"]


def test_ranking_small_slack_drops_fragmentation_with_a_reason():
    d = diagnose(_oom_in_loss(reserved_unallocated=3 * GIB, requested=2 * GIB))
    assert "RK001" not in ids(d) and top(d).rule == "RK016"
    assert any(x["rule"] == "RK001" for x in d.dropped)


def test_rk004_more_than_1eb_is_a_corrupted_size():
    d = run(NCCL_1284)
    assert d.evidence.oom[0].requested_bytes == 10**18
    f = top(d)
    assert f.rule == "RK004" and "NCCL" in f.evidence
    assert f.config_patch["env"]["NCCL_DEBUG"] == "INFO"


@covers("RK105")
def test_rk105_table_pasted_in_the_log_shows_expandable_segments_fix_it():
    # The table is pasted into the log (not given with --experiments): collect reads it.
    d = run(text("i12-mbridge-skill-expandable"))
    assert d.evidence.experiments[0]["name"] == "Baseline"
    f = top(d)
    assert f.rule == "RK105" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    cites(f, "'Baseline' runs out of memory", "Baseline + expandable_segments", "704")


# RK001: "enough free memory exists, but in pieces" is false when the reserved-but-unallocated
# memory is smaller than the request.
@covers("RK001")
def test_rk001_no_enough_memory_claim_when_slack_is_below_the_request():
    # https://github.com/OPIXray-author/OPIXray/issues/5: 264 MiB requested, 1.02 GiB reserved
    # - 788.51 MiB allocated = 255.97 MiB cached, less than the request
    d = run(text("fa-prec-opixray-5-slack-below-request"))
    f = get(d, "RK001")
    assert "enough free memory exists" not in f.evidence
    assert "255.97 MiB" in f.evidence and "less than the failed request of 264.00 MiB" in f.evidence
    assert f.confidence <= 0.25 and top(d).rule != "RK001"
    # slack above the request still reads as fragmentation
    # https://github.com/NVIDIA/Megatron-LM/issues/60: 9.10 GiB cached against 2.29 GiB
    g = get(run(text("mlm-60")), "RK001")
    assert "enough free memory exists" in g.evidence and g.raw_confidence == 0.9


# RK003: "this process has 17179869184.00 GiB memory in use" (2**64 bytes) on an 8 GiB GPU is a
# counter the driver could not read, not 17 billion GiB outside PyTorch's allocator.
@covers("RK003")
def test_rk003_ignores_a_process_total_above_the_gpu():
    # https://github.com/linkedin/Liger-Kernel/pull/47
    log = text("fz-liger-47-ce-oom-test")
    assert "this process has 17179869184.00 GiB memory in use" in log
    d = run(log)
    assert "RK003" not in ids(d)
    assert not any("17179869" in f.evidence for f in d.findings)
    # a credible process total still reads as memory outside the allocator
    # https://github.com/Synthintel0/MyGirlGPT/issues/11 (a 4 GiB GPU)
    assert "RK003" in ids(run(text("fo-mygirlgpt-11-non-pytorch-4gb")))


@covers("RK631")
def test_r6p_rk631_small_gpu_checkpointing_declined():
    # https://github.com/derrian-distro/LoRA_Easy_Training_Scripts/issues/178: "you must use
    # gradient checkpointing and gradient accumulation to stretch your vram"
    d = run(text("r6p-lora-easy-178-8gb-no-ckpt"))
    f = top(d)
    assert f.rule == "RK631" and f.category == "activation_memory"
    assert f.config_patch["gradient_checkpointing"] is True
    assert "RK102" not in ids(d)


@covers("RK001", "RK005")
def test_fragmentation_follows_when_the_slack_is_a_sliver_of_a_full_gpu():
    # https://github.com/NVIDIA-NeMo/Automodel/issues/3907: 2.00 GiB reserved-unallocated
    # against a 720 MiB request, but 171.63 GiB of 184.31 GiB allocated: the slack is 1% of
    # the GPU. RK001 stays listed, after the memory finding.
    d = run(text("i13-automodel-3907"))
    assert ids(d)[0] == "RK005" and "RK001" in ids(d)
    # (calibrated, both may round down to the same value; the rules' own order is kept)
    assert get(d, "RK001").raw_confidence < top(d).raw_confidence
    assert get(d, "RK001").confidence <= top(d).confidence


@covers("RK102")
def test_rk102_leads_on_a_2gb_gpu_with_51mib_slack():
    # https://github.com/pkhungurn/talking-head-anime-demo/issues/36: 2.00 GiB GPU, 20 MiB
    # request, 51.20 MiB reserved-unallocated; the maintainer: batch is already 1, the GPU is
    # too small.
    d = run(text("i13-talking-head-36"))
    f = top(d)
    assert f.rule == "RK102" and "larger GPU" in f.fix
    assert ids(d).index("RK001") > 0


@covers("RK004")
def test_rk004_ipex_per_allocation_limit():
    # https://github.com/intel/intel-extension-for-pytorch/issues/629: a 6.85 GiB tensor on a
    # 15.56 GiB Intel GPU fails because one block may not exceed 4 GB.
    d = run(text("ipex-629"))
    oom = d.evidence.oom[0]
    assert oom.backend == "xpu" and oom.allocation_limit_bytes == 4 * GIB
    f = top(d)
    assert f.rule == "RK004"
    cites(f, "6.85 GiB", "4.00 GiB")


@covers("RK001")
def test_rk001_small_slack_finishes_the_check_with_the_free_memory():
    # a skill trial (THUDM/slime#1951's numbers): 20.79 GiB reserved-but-unallocated is less
    # than the 29.39 GiB request, but with the 19.41 GiB free it covers it: say so, do not
    # leave "only if" to the reader; with too little free, fragmentation is not a reading
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 29.39 GiB. GPU 0 has a "
        "total capacity of 139.81 GiB of which {free} GiB is free. Including non-PyTorch "
        "memory, this process has 120.38 GiB memory in use. Of the allocated memory 98.83 GiB "
        "is allocated by PyTorch, and 20.79 GiB is reserved by PyTorch but unallocated.\n"
    )
    f = get(run(oom.format(free="19.41")), "RK001")
    cites(f, "covers the request", "fragmentation is possible here")
    assert "RK001" not in ids(run(oom.format(free="1.41")))


@covers("RK816")
def test_rk816_deepspeed_allocator_cache_flushes_are_memory_pressure():
    # https://github.com/deepspeedai/DeepSpeedExamples/issues/186 ("OOM despite ZeRO stage
    # 3"): ZeRO-3's flush warnings every step before the OOM. A skill trial (LLaVA on 40GB
    # A100s) found the doctor silent on them.
    d = run(text("ds-examples-186-allocator-flushes"))
    f = top(d)
    assert f.rule == "RK816" and f.category == "genuine_pressure"
    assert "up to 2 flushes a step" in f.evidence
    assert f.config_patch == {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    assert d.verdict.verdict == "needs_evidence"  # which term fills the GPU is not said
    # the warning quoted in a code comment is no warning the run gave
    comment = "        # in case of warning: pytorch allocator cache flushes since last step. \\"
    assert "RK816" not in ids(run(comment))


def test_a_run_that_steps_is_asked_for_its_peak_not_an_oom_message():
    # a skill trial: flush warnings with training going on were answered with "collect the
    # full OOM message ... memory_summary at the failure"; the run never failed
    d = run(text("ds-examples-186-allocator-flushes"))
    ids_ = [c["id"] for c in d.verdict.collect]
    assert "peak_memory" in ids_ and "oom_message" not in ids_ and "memory_summary" not in ids_


def test_an_estimate_that_says_no_fit_yields_to_a_run_that_steps(tmp_path):
    # LLaVA-1.5 13B (tests/data/launch/llava, verbatim) on 40 GB A100s with the flush warnings
    # of DeepSpeedExamples#186: the estimate at the longest sample (2048 tokens) says nothing
    # fits, the log shows the run stepping. RK013 led with "even full recompute does not fit".
    config = llava_inputs()
    log = tmp_path / "train.log"
    log.write_text(text("ds-examples-186-allocator-flushes"))
    evidence = collect(logs=[str(log)], config=config, overrides={"data_parallel_size": 8})
    d = diagnose(evidence, 39.4)
    assert d.findings[0].rule == "RK816"
    no_fit = [f for f in d.findings if f.rule in ("RK011", "RK013")]
    assert no_fit and all(f.confidence <= 0.4 and "upper bound" in f.evidence for f in no_fit)


# https://github.com/aqlaboratory/openfold/issues/67 : 4.41 GiB cached (14% of the GPU) just
# under the 4.50 GiB request, with 1.81 GiB free beside it; the maintainer reads fragmentation
OPENFOLD_67 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 4.50 GiB (GPU 0; 31.75 GiB total "
    "capacity; 23.94 GiB already allocated; 1.81 GiB free; 28.35 GiB reserved in total by "
    "PyTorch)\n  File \"train.py\", line 10, in <module>\n    loss.backward()\n"
)


@covers("RK001")
def test_rk001_leads_where_the_cache_and_the_free_memory_together_hold_the_request():
    f = top(run(OPENFOLD_67))
    assert f.rule == "RK001" and f.category == "fragmentation"
    cites(f, "with the 1.81 GiB free on the device it covers the request")
    # the same cache as a sliver of the GPU (under 10%) follows the memory reading
    sliver = OPENFOLD_67.replace("31.75 GiB total", "80.00 GiB total")
    assert top(run(sliver)).rule != "RK001"


# https://github.com/modelscope/ms-swift/issues/1613 : 861.82 MiB held by another process (4%)
# on a 22 GB GPU this process's PyTorch fills (19.94 GiB allocated): a full SFT too big for it
SWIFT_1613 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 130.00 MiB. GPU 0 has a "
    "total capacty of 22.09 GiB of which 9.44 MiB is free. Process 3667 has 861.82 MiB memory in "
    "use. Including non-PyTorch memory, this process has 20.70 GiB memory in use. Of the "
    "allocated memory 19.94 GiB is allocated by PyTorch, and 446.71 MiB is reserved by PyTorch "
    "but unallocated.\n"
)


@covers("RK002")
def test_rk002_a_small_other_process_beside_a_full_pytorch_does_not_lead():
    d = run(SWIFT_1613)
    assert top(d).rule == "RK005" and top(d).category == "genuine_pressure"
    f = get(d, "RK002")
    # ranked below it (calibrated, it is capped at the confidence of the finding above it)
    assert d.findings.index(f) > 0 and f.confidence <= top(d).confidence
    assert f.raw_confidence < top(d).raw_confidence
    cites(f, "861.82 MiB (4%)", "this process's PyTorch holds")


# torchtitan PR 660 (rule_sources.py): NCCL's barrier cannot calloc its 8 MiB; the failure is in
# the lines under the exception line
TORCHTITAN_660 = text("torchtitan-660-nccl-barrier-calloc")


@covers("RK026")
def test_rk026_a_library_oom_with_expandable_segments_already_on():
    f = top(run(TORCHTITAN_660))
    assert f.rule == "RK026" and f.category == "non_pytorch_memory"
    assert "Failed to CUDA calloc" in f.evidence and "expandable_segments" not in str(
        f.config_patch
    )
    # without the expandable line it is RK009's reading (the error's detail lines read too)
    cut = TORCHTITAN_660.split("My run already")[0]
    f = top(run(cut))
    assert f.rule == "RK009" and "Failed to CUDA calloc" in f.evidence
