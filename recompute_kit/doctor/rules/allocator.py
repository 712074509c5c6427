"""What the OOM message alone says: fragmentation, other processes, memory outside PyTorch, requests
larger than the device, genuine pressure, allocator limits.
"""

from __future__ import annotations

from ..types import Context, Match
from .knob_advice import knob_advice, shrink_step
from .registry import (
    EXPANDABLE,
    GIB,
    HALF,
    all_frames,
    expandable_on,
    fact,
    gib,
    is_megatron,
    more_recompute_patch,
    oom_where,
    rule,
)

# --------------------------------------------------------------------------------------------
# Reading the OOM message
# --------------------------------------------------------------------------------------------

# The least memory a CUDA context takes outside PyTorch (lazy loading, CUDA >= 11.7).
CONTEXT_FLOOR = 256 * 2**20
PT_MEMORY = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"


def reserved_unallocated(oom) -> int | None:
    """Reserved-but-unallocated bytes; PyTorch <= 2.0 printed other fields: '(... C cached)'
    is that amount itself (the parser stores it as such), '(... A already allocated; ... R
    reserved in total by PyTorch)' gives it as R - A."""
    if oom.reserved_unallocated_bytes is not None:
        return oom.reserved_unallocated_bytes
    if oom.reserved_bytes is None:
        return None
    if oom.allocated_bytes is not None and oom.reserved_bytes >= oom.allocated_bytes:
        return oom.reserved_bytes - oom.allocated_bytes
    return None


def fragmentation_worth_the_name(slack: int, requested: int, total: int) -> bool:
    """Reserved-but-unallocated memory that explains an OOM by itself: more than the failed
    request and a real share of the GPU - twice the request and 10% of the GPU, or a fifth of
    the GPU. (Below 10% of a full GPU the engine's reconciliation already rules fragmentation
    out next to a memory finding; 5% let 618 MiB in split blocks of a 7.79 GiB GPU outrank
    its 6.27 GiB allocated.)"""
    if slack < requested:
        return False
    return (slack >= 2 * requested and slack >= 0.1 * total) or slack >= 0.2 * total


@rule(
    "RK001",
    "Fragmentation: memory is reserved but unallocated",
    "fragmentation",
    symptom="CUDA OOM where 'reserved by PyTorch but unallocated' is comparable to or larger "
    "than the failed allocation",
    cause="The caching allocator's segments are split into blocks too small for the request; "
    "the memory is free inside PyTorch but not in one piece",
    confirm="In the OOM message compare 'reserved but unallocated' (before PyTorch 2.1: "
    "'reserved in total' minus 'already allocated', or 'cached') with 'Tried to allocate'; "
    "torch.cuda.memory_stats()['inactive_split_bytes.all.current'] is large",
    fix="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of "
    "splitting); recompute settings are not the problem",
    patch=EXPANDABLE,
    refs=(PT_MEMORY, "NVIDIA-NeMo/Megatron-Bridge PR #3880"),
)
def _fragmentation(ctx: Context) -> Match | None:
    oom = ctx.oom
    slack = reserved_unallocated(oom) if oom else None
    if not oom or not slack or not oom.requested_bytes:
        return None
    req = oom.requested_bytes
    total = oom.total_bytes or 0
    if slack < req and slack < 0.05 * total:
        return None
    if expandable_on(ctx):
        return None
    # The allocator's hint is printed on every OOM; it matters when the slack is several times
    # the request and a real share of the GPU, not 50 MiB against a 20 MiB request on a full
    # GPU (expandable segments would only move that OOM to the next allocation).
    if slack < req:
        # Less than the request: even in one piece the cached memory would not have served
        # it. Only with the device's free memory next to it could expandable segments help.
        free = oom.free_bytes
        if free is None:
            together = (
                "fragmentation matters here only if that and the device's free memory "
                "together cover the request (the message does not say what is free)."
            )
        elif slack + free >= req:
            together = (
                f"with the {gib(free)} free on the device it covers the request "
                f"({gib(slack + free)}): expandable segments can join them, so fragmentation "
                "is possible here."
            )
        else:
            return None  # even with the free memory it does not cover the request
        return Match(
            0.25,
            f"{gib(slack)} is reserved by PyTorch but unallocated, less than the failed "
            f"request of {gib(req)}: not enough on its own even in one piece; {together}",
        )
    confidence = 0.9 if fragmentation_worth_the_name(slack, req, total) else 0.45
    return Match(
        confidence,
        f"{gib(slack)} is reserved by PyTorch but unallocated, against a "
        f"failed request of {gib(req)}: enough free memory exists, but in "
        "pieces.",
    )


@rule(
    "RK002",
    "Other processes hold GPU memory",
    "other_processes",
    symptom="CUDA OOM listing 'Process <pid> has X memory in use' for other processes",
    cause="Another process (a second job, a stale worker, a notebook kernel) shares the GPU",
    confirm="nvidia-smi --query-compute-apps=pid,used_memory --format=csv on the node (in a "
    "container the message lists this process itself as 'Process <pid>' too, without an "
    "'Including non-PyTorch memory, this process has' line)",
    fix="Stop the other process or give this job its own GPU (CUDA_VISIBLE_DEVICES)",
    refs=("https://github.com/pytorch/pytorch/pull/99699",),
    patch={"env": {"CUDA_VISIBLE_DEVICES": "<a GPU no other process uses>"}},
)
def _other_processes(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.other_processes_bytes or not oom.total_bytes:
        return None
    others, total = oom.other_processes_bytes, oom.total_bytes
    pytorch = (oom.allocated_bytes or 0) + (oom.reserved_unallocated_bytes or 0)
    if oom.process_bytes is None:
        # NVML listed the GPU's processes but none as "this process": our own PID did not
        # match (a container's PID namespace), so this process is one of the "Process <pid>"
        # entries. Only what exceeds PyTorch's own memory can belong to other processes (an
        # upper bound: it still includes this process's CUDA context and workspaces).
        others = others - pytorch
        share = others / total
        if others < max(2 * GIB, 0.1 * total):
            return None
        return Match(
            min(0.95, 0.5 + share),
            f"Processes other than this one hold up to {gib(others)} ({share:.0%}) of the "
            f"{gib(total)} GPU: {gib(oom.other_processes_bytes)} listed, of which this "
            f"process's own PyTorch memory ({gib(pytorch)}) is a part.",
        )
    share = others / total
    # A few hundred MiB listed for "Process <pid>" is usually a CUDA context (often this
    # job's own, seen from a container): below the request and 10% of the GPU it explains
    # nothing.
    if share < 0.02 or (others < (oom.requested_bytes or 0) and share < 0.1):
        return None
    if share < 0.1 and pytorch >= 0.8 * total:
        # a small share beside a GPU this process's PyTorch fills: freeing it moves the OOM a
        # step later, the memory this process holds is the reading (RK005 and others)
        return Match(
            0.35,
            f"Other processes hold {gib(others)} ({share:.0%}) of the {gib(total)} GPU, while "
            f"this process's PyTorch holds {gib(pytorch)} ({pytorch / total:.0%}).",
        )
    return Match(
        min(0.95, 0.5 + share),
        f"Other processes hold {gib(others)} ({share:.0%}) of the {gib(total)} GPU.",
    )


@rule(
    "RK003",
    "Memory used outside PyTorch's allocator",
    "non_pytorch_memory",
    symptom="The process uses much more than PyTorch reserved ('Including non-PyTorch "
    "memory, this process has X' well above allocated + reserved-unallocated)",
    cause="CUDA context, NCCL buffers, cuBLAS/cuDNN workspaces or another allocator "
    "(TransformerEngine userbuffers, a second framework) live outside PyTorch's pool",
    confirm="Compare the process total with torch.cuda.memory_reserved(); check "
    "NCCL_BUFFSIZE, TP communication overlap buffers and CUDA graphs",
    fix="Shrink communication buffers (NCCL_BUFFSIZE, tp_comm_overlap), or budget a few GiB "
    "per GPU for them; recompute cannot free this memory",
    refs=("https://github.com/pytorch/pytorch/issues/16417",),
    patch={"tp_comm_overlap": False, "env": {"NCCL_BUFFSIZE": "2097152"}},
)
def _non_pytorch(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or oom.process_bytes is None or oom.allocated_bytes is None:
        return None
    if oom.total_bytes and oom.process_bytes > 1.05 * oom.total_bytes:
        # "this process has 17179869184.00 GiB" (2**64 bytes) on an 8 GiB GPU: a counter the
        # driver could not read (unified memory, WSL), not memory outside the allocator.
        return None
    pytorch = oom.allocated_bytes + (oom.reserved_unallocated_bytes or 0)
    outside = oom.process_bytes - pytorch
    total = oom.total_bytes or oom.process_bytes
    if outside < max(2 * GIB, 0.1 * total):
        if CONTEXT_FLOOR <= outside <= 2 * GIB and outside >= 0.1 * total:
            # A context-sized share of a small GPU: below every other reading (pressure,
            # a small GPU), a fallback where nothing else explains the OOM.
            return Match(
                0.35,
                f"This process uses {gib(oom.process_bytes)} but PyTorch accounts for "
                f"{gib(pytorch)}: {gib(outside)} ({outside / total:.0%} of the "
                f"{gib(total)} GPU) sits outside its allocator, the size of a CUDA context "
                "with its cuDNN / cuBLAS handles.",
                config_patch={"env": {"CUDA_MODULE_LOADING": "LAZY"}},
                fix="Budget the CUDA context (0.5-1 GiB per process and device) on a small "
                "GPU: load kernels lazily (CUDA_MODULE_LOADING=LAZY, CUDA >= 11.7), keep one "
                "process per GPU, and leave that much free below the batch's peak",
            )
        return None
    return Match(
        0.7,
        f"This process uses {gib(oom.process_bytes)} but PyTorch accounts for "
        f"{gib(pytorch)}: {gib(outside)} is outside its allocator.",
    )


@rule(
    "RK004",
    "A single allocation of half the GPU or more",
    "allocation_exceeds_device",
    symptom="'Tried to allocate' is half the GPU's total or more (or more than any GPU has, "
    "where the message gives no total)",
    cause="One tensor is too big - typically logits [seq x batch x vocab] in fp32, an "
    "unfused attention score matrix [b, a, s, s], or a mistaken shape",
    confirm="Compute the tensor's size from the shapes; recompute-kit estimate --json shows "
    "the logits and core attention terms",
    fix="Shrink the tensor that asks for it: a smaller batch size or input (sequence length "
    "/ max_length, image size or resolution, video frames); flash / memory-efficient attention "
    "(a compiled flex_attention) instead of a materialised [batch, heads, seq, seq] score "
    "matrix; a chunked or fused cross-entropy instead of full fp32 logits; more tensor/context "
    "parallelism. A size no shape explains is a bug (an overflowed or wrong shape)",
    refs=("https://github.com/pytorch/pytorch/issues/16417",),
    supersedes=("RK005",),
)
def _too_big(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.requested_bytes:
        return None
    req = oom.requested_bytes
    if req >= 2**50:  # a PiB or "more than 1EB": no tensor is that large, the size is garbage
        return Match(
            0.85,
            f"The request is {gib(req)}: a corrupted size (typically after an NCCL timeout "
            "or error on another rank, or an overflowed shape), not a tensor to shrink.",
            config_patch={"env": {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}},
            fix="Read the first error before the OOM (an NCCL timeout, a rank that died); "
            "rerun with NCCL_DEBUG=INFO to find it",
        )
    limit = oom.allocation_limit_bytes
    if limit and req > limit:  # IPEX: one block may not exceed the platform's limit
        return Match(
            0.85,
            f"One allocation of {gib(req)} was requested; this platform allocates at most "
            f"{gib(limit)} in one block, whatever the device's {gib(oom.total_bytes)}.",
            config_patch={"batch_size": HALF},
            fix=f"Keep every tensor under {gib(limit)}: a smaller batch size or input, or "
            "process the tensor in chunks",
        )
    if not oom.total_bytes:  # no capacity in the message: only an absurd request is clear
        if req < 256 * GIB:
            return None
    elif req < 0.5 * oom.total_bytes:
        return None
    patch, what = shrink_patch(ctx)
    on = f" on a {gib(oom.total_bytes)} GPU" if oom.total_bytes else "; no GPU has that much"
    return Match(
        0.9 if oom.total_bytes else 0.8,
        f"One allocation of {gib(req)} was requested{on}; {what}.",
        config_patch=patch,
    )


ATTENTION_WORDS = ("flex_attention", "attention", "sdpa", "softmax", "scores", "query @ key", "bmm")


def shrink_patch(ctx: Context) -> tuple[dict, str]:
    """Which tensor is too big, from the frames around the OOM, and the setting that shrinks it."""
    where = oom_where(ctx) + " " + all_frames(ctx)
    if "flex_attention" in where:
        return {"code": "flex_attention = torch.compile(flex_attention)"}, (
            "flex_attention runs uncompiled, which materialises the full score matrix: "
            "compile it (torch.compile)"
        )
    if any(w in where for w in ATTENTION_WORDS):
        if is_megatron(ctx):
            return {"attention_backend": "flash"}, "the frames are attention's: use flash attention"
        return {"attn_implementation": "flash_attention_2"}, (
            "the frames are attention's (an unfused [batch, heads, seq, seq] score matrix): use "
            "flash / SDPA attention or a shorter sequence"
        )
    if any(w in where for w in ("cross_entropy", "logits", "log_softmax", "lm_head")):
        return {"cross_entropy_loss_fusion": True}, "the frames are the loss's: fuse or chunk it"
    if (step := shrink_step(ctx)) is not None:  # the paste's own batch / sequence knob
        return step
    mbs = ctx.cfg.get("micro_batch_size")
    half = max(1, mbs // 2) if isinstance(mbs, int) else HALF
    return {"micro_batch_size": half}, (
        "shrink the tensor: a smaller micro-batch or sequence (its size scales with both)"
    )


@rule(
    "RK005",
    "PyTorch-allocated memory fills the GPU",
    "genuine_pressure",
    symptom="CUDA OOM with 'allocated by PyTorch' close to the total capacity",
    cause="Tensors in use fill the GPU: activations, weights, gradients or optimizer states. "
    "Which of them needs the model shape and parallel config",
    confirm="Pass the config to recompute-kit doctor --config, or run recompute-kit estimate "
    "to split the peak into activations and model states",
    fix="Reduce the dominant term: more recompute if activations dominate, distributed "
    "optimizer / more parallelism if model states do",
    supersedes=("RK087",),
)
def _pressure(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.allocated_bytes or not oom.total_bytes:
        return None
    if ctx.plan_error:  # the estimate splits it and nothing fits: rules/nothing_fits.py, RK012
        return None
    share = oom.allocated_bytes / oom.total_bytes
    if share < 0.8:
        return None
    patch, words = more_recompute_patch(ctx)
    mbs = ctx.cfg.get("micro_batch_size")
    if isinstance(mbs, int) and mbs > 1:
        patch = {**patch, "micro_batch_size": mbs // 2}
    said = (
        f"PyTorch had {gib(oom.allocated_bytes)} allocated of {gib(oom.total_bytes)} "
        f"({share:.0%}) when the OOM hit."
    )
    e = ctx.estimate
    split = (
        "Without a model shape the split is unknown; activations are the usual term"
        if e is None
        else f"By the estimate of the config given, activations peak at "
        f"{gib(e.peak_activation_bytes)} and weights, gradients and optimizer states take "
        f"{gib(e.model_state_bytes)}"
    )
    fix = (
        f"{split}: "
        f"{words}, or halve the batch size (micro_batch_size) / sequence length or input size "
        "(activations scale linearly with them) and keep the effective batch with gradient "
        "accumulation. If the OOM is in the first optimizer step, shard the optimizer states "
        "instead (use_distributed_optimizer / ZeRO); if the weights alone nearly fill the GPU, "
        "a smaller model, half precision or quantization"
    )
    if (advice := knob_advice(ctx)) is not None:  # the paste's own knobs, patched
        patch, said, fix = advice.patch, said + advice.says(), advice.fix(fix)
    return Match(0.5, said, config_patch=patch, fix=fix)


@rule(
    "RK006",
    "A per-process memory cap is set",
    "informational",
    symptom="The OOM message includes 'X allowed;'",
    cause="torch.cuda.set_per_process_memory_fraction limits this process below the GPU size",
    confirm="Search the code/launcher for set_per_process_memory_fraction",
    fix="Raise or remove the fraction if the cap is not intended",
    patch={"code": "torch.cuda.set_per_process_memory_fraction(1.0)"},
)
def _allowed(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.allowed_bytes:
        return None
    return Match(
        0.6, f"The process may use only {gib(oom.allowed_bytes)} of {gib(oom.total_bytes)}."
    )


@rule(
    "RK007",
    "CUDA graphs' private pools hold memory",
    "genuine_pressure",
    symptom="The OOM message reports memory 'allocated in private pools (e.g., CUDA Graphs)'",
    cause="Captured CUDA graphs keep their own memory pools alive between steps",
    confirm="Compare the private-pool size with the failed request; disable graphs to test",
    fix="Narrow cuda_graph_scope, or turn CUDA graphs off while searching for a recompute setting",
    patch={"cuda_graph_impl": "none"},
)
def _private_pools(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.private_pool_bytes or oom.private_pool_bytes < GIB:
        return None
    return Match(0.6, f"{gib(oom.private_pool_bytes)} sit in private pools (CUDA graphs).")


@rule(
    "RK008",
    "OOM far below the GPU's size: the allocator, not the model",
    "fragmentation",
    symptom="A run OOMs although its measured peak is well below the GPU's capacity",
    cause="The caching allocator could not find a large enough free block (fragmentation), "
    "or memory outside PyTorch grew",
    confirm="Compare max_memory_reserved with max_memory_allocated; rerun with "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    fix="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before changing recompute",
    patch=EXPANDABLE,
    supersedes=("RK011", "RK005"),
)
def _oom_below_capacity(ctx: Context) -> Match | None:
    if not ctx.gpu_bytes:
        return None
    rows = [r for r in ctx.evidence.experiments if r.get("oom") and r.get("peak_memory_bytes")]
    for r in rows:
        share = r["peak_memory_bytes"] / ctx.gpu_bytes
        if share < 0.8:
            return Match(
                0.75,
                f"'{r.get('name')}' ran out of memory at a measured peak of "
                f"{gib(r['peak_memory_bytes'])}, {share:.0%} of the "
                f"{gib(ctx.gpu_bytes)} GPU.",
            )
    return None


LIBRARY_OOM = (
    "NCCL WARN Cuda failure 2 'out of memory'",
    "Cuda failure 'out of memory'",  # NCCL before 2.12 printed no error number
    "Triton Error [CUDA]: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
    "CUDA_ERROR_OUT_OF_MEMORY",  # the driver API's name (Triton, CuPy, JAX)
    "Failed to CUDA calloc",  # NCCL's own buffers ("NCCL WARN Failed to CUDA calloc async")
    # ROCm: the same libraries hipified
    "HIPBLAS_STATUS_ALLOC_FAILED",
    "hipErrorOutOfMemory",
    "Triton Error [HIP]: out of memory",
)


@rule(
    "RK009",
    "A library outside PyTorch could not allocate",
    "fragmentation",
    symptom="NCCL, Triton, cuBLAS or cuDNN reports 'out of memory' (not PyTorch's allocator)",
    cause="PyTorch's caching allocator holds the free memory in its cache, so the library's "
    "own cudaMalloc fails",
    confirm="torch.cuda.memory_reserved() is close to the GPU size while allocated is lower",
    fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, torch.cuda.empty_cache() before "
    "the library call, or cap PyTorch (set_per_process_memory_fraction)",
    patch=EXPANDABLE,
)
def _library_oom(ctx: Context) -> Match | None:
    hit = library_oom_hit(ctx)
    if hit is None or expandable_on(ctx):
        return None  # with expandable segments on, nothing is held in split segments: RK026
    return Match(0.75, f"'{hit}': a library's own allocation failed, not PyTorch's.")


def library_oom_hit(ctx: Context) -> str | None:
    """The words of a library's own failed allocation (NCCL, Triton, cuBLAS, cuDNN), in an
    error's message or the lines under it (NCCL's 'Last error: Failed to CUDA calloc ...')."""
    text = "\n".join([ctx.text, *(e.details for e in ctx.evidence.errors if e.details)])
    hit = next((w for w in LIBRARY_OOM if w.lower() in text.lower()), None)
    if hit is None:
        for o in ctx.evidence.oom:
            library = next(
                (
                    n
                    for n in ("nccl", "triton", "cublas", "cudnn")
                    if n in (o.generation or "").lower()
                ),
                None,
            )
            if library:  # (HIP, XPU and NPU messages are PyTorch's own allocators, like CUDA's)
                hit = f"{library} out of memory"
                break
    return hit


@rule(
    "RK026",
    "A library outside PyTorch could not allocate, with expandable segments already on",
    "non_pytorch_memory",
    symptom="NCCL, Triton, cuBLAS or cuDNN reports 'out of memory' (NCCL's 'Failed to CUDA "
    "calloc'), and the run already sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    cause="The library allocates outside PyTorch's allocator (NCCL's buffers, a workspace): "
    "PyTorch's allocations and its cache leave it no free memory, and with expandable segments "
    "on there are no split segments left to release",
    confirm="torch.cuda.mem_get_info() just before the failing call shows less free memory than "
    "the library asks for; the failure goes with torch.cuda.empty_cache() before the call",
    fix="Leave the library headroom: torch.cuda.empty_cache() before the collective or kernel "
    "that fails, a cap on PyTorch (torch.cuda.set_per_process_memory_fraction), smaller NCCL "
    "buffers (NCCL_BUFFSIZE); or lower the peak PyTorch holds there",
)
def _library_oom_expandable_on(ctx: Context) -> Match | None:
    hit = library_oom_hit(ctx)
    if hit is None or not expandable_on(ctx):
        return None
    return Match(
        0.7,
        f"'{hit}': a library's own allocation failed, not PyTorch's, while the run already "
        "sets expandable_segments:True: the memory PyTorch holds leaves it none.",
    )


@rule(
    "RK098",
    "Reserved memory far above allocated: fragmentation",
    "fragmentation",
    symptom="Memory reports (torch.cuda.memory_summary(), 'Allocated ... Reserved ...' lines) "
    "where PyTorch's reserved memory is well above even the peak allocated",
    cause="The caching allocator keeps split segments it cannot reuse for new sizes; "
    "reserved grows while allocated does not",
    confirm="torch.cuda.memory_stats()['inactive_split_bytes.all.current'] (Non-releasable "
    "memory in memory_summary) is large; expandable segments bring reserved down",
    fix="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place "
    "instead of splitting)",
    patch=EXPANDABLE,
    refs=(PT_MEMORY,),
    supersedes=("RK087", "RK005"),
)
def _reserved_over_allocated(ctx: Context) -> Match | None:
    if expandable_on(ctx):
        return None
    for m in ctx.evidence.memory:
        if m.source not in ("memory_summary", "allocated-reserved"):
            continue
        reserved = m.max_reserved_bytes or m.reserved_bytes
        used = max(m.max_allocated_bytes or 0, m.allocated_bytes or 0)
        if not reserved or not used:
            continue
        slack = reserved - used
        if reserved >= 1.5 * used and slack >= 2 * GIB:
            return Match(
                0.8,
                f"PyTorch reserved {gib(reserved)} while at most {gib(used)} was allocated: "
                f"{gib(slack)} ({slack / reserved:.0%} of the reserve) sits in segments it "
                "cannot reuse.",
            )
    return None


@rule(
    "RK102",
    "A small GPU: the workload does not fit",
    "genuine_pressure",
    symptom="OOM on a GPU of 12 GiB or less with no sign of another cause (no other "
    "process, no fragmentation worth the name, no single oversized tensor)",
    cause="The batch (or image / sequence size) needs more memory than a desktop-class GPU "
    "has; nothing is misconfigured",
    confirm="Halve the batch size: if the OOM goes, the GPU was simply too small for it",
    fix="Halve the batch size and keep the effective batch with gradient accumulation; "
    "smaller inputs (crop/resize images, shorter sequences), mixed precision, or a larger GPU",
    patch={"batch_size": HALF, "gradient_accumulation_steps": 2},
    supersedes=("RK087", "RK005"),  # same category; the advice fits desktop-class workloads
)
def _small_gpu(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.total_bytes or oom.total_bytes > 12 * GIB:
        return None
    if oom.free_bytes is not None and oom.requested_bytes and oom.free_bytes >= oom.requested_bytes:
        return None
    said = (
        f"The GPU has {gib(oom.total_bytes)} and the failed request was "
        f"{gib(oom.requested_bytes)} with {gib(oom.free_bytes)} free: the workload is larger "
        "than this GPU at this batch size."
    )
    if (advice := knob_advice(ctx)) is not None:  # the paste's own batch / sequence knobs
        return Match(0.4, said + advice.says(), advice.patch, advice.fix("RK102"))
    return Match(0.4, said)


@rule(
    "RK631",
    "A small GPU with activation checkpointing off: checkpointing is the lever left",
    "activation_memory",
    symptom="OOM on a GPU of 12 GiB or less where the paste says activation (gradient) "
    "checkpointing is off, disabled or not wanted",
    cause="Without checkpointing every layer's activations stay until the backward: on a "
    "desktop-class GPU they are the term that still has room, whatever the allocator settings",
    confirm="Turn checkpointing on for one run: the peak falls by a third or more",
    fix="Turn on gradient checkpointing and keep the effective batch with gradient "
    "accumulation (batch 1 x N accumulation steps); allocator settings "
    "(expandable_segments) do not make the activations smaller",
    patch={"gradient_checkpointing": True, "gradient_accumulation_steps": 2},
    supersedes=("RK102", "RK087", "RK005", "RK001"),
)
def _small_gpu_no_ckpt(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not oom or not oom.total_bytes or oom.total_bytes > 12 * GIB:
        return None
    if oom.free_bytes is not None and oom.requested_bytes and oom.free_bytes >= oom.requested_bytes:
        return None
    said = fact(ctx, "ckpt_off_prose") or []
    if not said:
        return None
    return Match(
        0.45,
        f"The GPU has {gib(oom.total_bytes)} and the paste keeps activation checkpointing off "
        f"('{said[0][:120]}'): every layer's activations stay until the backward, the term "
        "that still has room on this GPU.",
    )


@rule(
    "RK105",
    "Experiments: the OOM goes with expandable segments alone",
    "fragmentation",
    symptom="In the experiments, a configuration OOMs and the same one with "
    "expandable_segments (PYTORCH_CUDA_ALLOC_CONF) passes",
    cause="The OOM was fragmentation, not capacity: the same tensors fit once segments can "
    "grow in place",
    confirm="The two rows differ only in the allocator setting",
    fix="Keep PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and drop the parallelism or "
    "recompute changes made to fix the OOM (they cost throughput for nothing)",
    patch=EXPANDABLE,
    supersedes=("RK033", "RK030", "RK087", "RK005"),
)
def _expandable_fixes_it(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    fixed = [
        r
        for r in rows
        if not r.get("oom") and "expandable" in f"{r.get('name')} {r.get('result')}".lower()
    ]
    failed = [r for r in rows if r.get("oom")]
    if not (fixed and failed):
        return None
    return Match(
        0.9,
        f"'{failed[0].get('name')}' runs out of memory; '{fixed[0].get('name')}' passes"
        + (
            f" at {fixed[0]['tflops_per_gpu']:g} TFLOP/s/GPU"
            if fixed[0].get("tflops_per_gpu")
            else ""
        )
        + ".",
    )


# --------------------------------------------------------------------------------------------
# RK816: the allocator flushed its cache to satisfy a request (DeepSpeed's warning)
# --------------------------------------------------------------------------------------------


@rule(
    "RK816",
    "The allocator flushes its cache to find memory: the run is at its limit",
    "genuine_pressure",
    symptom="DeepSpeed's warning 'N pytorch allocator cache flushes since last step. this "
    "happens when there is high memory pressure ...' (ZeRO-3), every step or often; the "
    "steps are slow, and an OOM may follow some steps later",
    cause="A cudaMalloc failed with the GPU full, so PyTorch's caching allocator freed its "
    "cached blocks and retried (memory_stats' num_alloc_retries grows): the step needs about "
    "all the GPU has, and the blocks it frees are too split up to reuse; each flush "
    "synchronizes the GPU, and ranks that flush at different times wait for each other",
    confirm="torch.cuda.memory_stats()['num_alloc_retries'] rising step by step, "
    "max_memory_reserved() at the GPU's total capacity",
    fix="Lower the peak (a smaller micro-batch with more gradient accumulation, activation "
    "checkpointing, a shorter sequence, offloading), or set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (fewer split blocks); DeepSpeed's own "
    "workaround: get_accelerator().empty_cache() at the same point of every rank's step",
    patch=EXPANDABLE,
    refs=(
        "https://github.com/deepspeedai/DeepSpeedExamples/issues/186",
        "https://github.com/deepspeedai/DeepSpeedExamples/issues/172",
    ),
)
def _allocator_flushes(ctx: Context) -> Match | None:
    flushes = fact(ctx, "allocator_flushes", "log") or []
    if not flushes:
        return None
    counts = [n for n, _ in flushes if n is not None]
    said = f"{len(flushes)} warning(s)"
    said += f", up to {max(counts)} flushes a step" if counts else ""
    return Match(
        0.5,
        f"DeepSpeed reports allocator cache flushes ({said}: '{flushes[0][1][:160]}'): the "
        "caching allocator ran out, freed its cache and retried; the run sits at the GPU's "
        "limit, and which term fills it the estimate or the memory summary says.",
        config_patch=dict(EXPANDABLE),
    )
