"""Readings of phenomena rather than of one tool's message: an exception raised inside a
framework's own frames on a recompute / offload / sharding path, a square [seq, seq] attention
tensor, logits with a vocabulary-sized dimension, allocator blocks held by communication on
side streams, memory a library keeps after everything was freed, and a memory summary's peak.

Each reads what the paste shows (frames and their source lines, shapes, sizes, the words a
tool prints) through the facts of evidence/signals.py; none matches a case's own strings.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

from ..types import Context, Match
from .registry import GIB, HALF, all_frames, fact, gib, is_megatron, oom_errors, patch_for, rule

# --------------------------------------------------------------------------------------------
# RK260: an exception inside a framework's frames on a recompute / offload / sharding path
# --------------------------------------------------------------------------------------------

# Exceptions that say "the code is wrong", not "the input is wrong" (ValueError and
# RuntimeError are how frameworks reject configs and shapes: left to the specific rules).
BUG_EXCEPTIONS = (
    "IndexError",
    "AttributeError",
    "KeyError",
    "UnboundLocalError",
    "TypeError",
    "NameError",
    "AssertionError",
    "ZeroDivisionError",
    "NotImplementedError",
)
ORPHAN = "(traceback without exception line)"
# Package folders of the frameworks in these tracebacks (site-packages or a source checkout).
LIBRARIES = (
    "megatron",
    "nemo_rl",
    "nemo",
    "transformer_engine",
    "deepspeed",
    "peft",
    "accelerate",
    "transformers",
    "trl",
    "apex",
    "verl",
    "lightning",
    "pytorch_lightning",
    "colossalai",
    "fairscale",
    "diffusers",
    "openrlhf",
    "llamafactory",
    "unsloth",
    "torchtitan",
    "torch",
)
_LIB_RE = re.compile(
    r"(?:site-packages/|dist-packages/|^|/|\.\.\./)(" + "|".join(LIBRARIES) + r")/", re.I
)
# (words in the failing frames / their source lines, the feature's name)
FEATURES = (
    (("checkpoint", "recompute", "save_for_backward"), "checkpointing"),
    (("offload",), "offloading"),
    (
        ("/zero/", "zero3", "stage3", "stage_1_and_2", "gatheredparameters", "partition_param"),
        "zero",
    ),
    (("fsdp", "fully_shard", "sharded_grad", "flat_param"), "fsdp"),
    (("distrib_optimizer", "distributed_optimizer"), "distributed_optimizer"),
)
FEATURE_WORDS = {
    "checkpointing": "activation checkpointing / recompute",
    "offloading": "CPU offloading",
    "zero": "DeepSpeed ZeRO-3 parameter partitioning",
    "fsdp": "FSDP sharding",
    "distributed_optimizer": "the distributed optimizer",
}


def library_of(frame: str) -> str | None:
    path = frame.replace("\\", "/")
    # An installed package is the directory right after site-packages / dist-packages; a
    # directory named like a library before it (a conda env called "trl") is not the library.
    installed = re.split(r"(?:site|dist)-packages/", path)
    if len(installed) > 1:
        m = re.match(r"(" + "|".join(LIBRARIES) + r")/", installed[-1], re.I)
        return m.group(1).lower() if m else None
    m = _LIB_RE.search(path)
    return m.group(1).lower() if m else None


def _frames_with_code(ctx: Context, frames: list[str]) -> list[tuple[str, str]]:
    """(frame, its source line) for the given frames, the source line from the paste."""
    code = {f: c for f, c in fact(ctx, "frame_code", "log") or []}
    return [(f, code.get(f, "")) for f in frames]


_MODEL_CHECKPOINT_RE = re.compile(
    r"\w*(?:resume_from|save|load|from)_checkpoint\w*(?:\s*=\s*[\w.]+)?"
    r"|checkpoint_(?:dir|path|file|name)\w*"
    # loading a model with device_map's disk offload (from_pretrained's offload_folder,
    # offload_index, offload_state_dict) is not the training run's CPU offloading
    r"|offload_(?:index|folder|state_dict|buffers)\w*|disk_offload\w*"
)


def _feature(pieces: list[str]) -> tuple[str, str] | None:
    """(feature, the piece that names it) from frames, source lines and the message."""
    for piece in pieces:
        # Saving / loading a model checkpoint (resume_from_checkpoint, load_checkpoint) is not
        # activation checkpointing: drop those words before looking for the feature.
        low = _MODEL_CHECKPOINT_RE.sub(" ", piece.lower())
        for words, name in FEATURES:
            if any(w in low for w in words):
                return name, piece
    return None


def _turn_off(ctx: Context, feature: str) -> tuple[dict[str, Any], str]:
    """The setting that takes the failing feature out of the run, in the framework's keys."""
    megatron = is_megatron(ctx)
    if feature == "checkpointing":
        if megatron:
            mods = ctx.modules
            return patch_for("selective:core_attn"), (
                "recompute only core_attn (recompute_granularity selective), or turn the "
                "recompute module in the frames off" + (f" (now {', '.join(mods)})" if mods else "")
            )
        return {"gradient_checkpointing": False}, (
            "turn gradient checkpointing off for one run (or switch its implementation: "
            "gradient_checkpointing_kwargs use_reentrant True <-> False)"
        )
    if feature == "offloading":
        if megatron:
            return {"cpu_offloading": False}, "cpu_offloading false"
        return (
            {"zero_optimization": {"offload_optimizer": {"device": "none"}}},
            "offload off (offload_optimizer / offload_param device none)",
        )
    if feature == "zero":
        return {"zero_optimization": {"stage": 2}}, (
            "ZeRO-2 instead of ZeRO-3 for one run (or load the model before deepspeed.initialize)"
        )
    if feature == "fsdp":
        return {"fsdp": False}, "plain DDP (or ZeRO-2) instead of FSDP for one run"
    return {"use_distributed_optimizer": False}, "use_distributed_optimizer false"


@rule(
    "RK260",
    "An exception inside a framework's own frames on a recompute / offload / sharding path",
    "framework_bug",
    symptom="IndexError, AttributeError, KeyError, UnboundLocalError, TypeError or a bare "
    "AssertionError (or a traceback cut before its exception line) whose innermost frames are "
    "a framework's (site-packages, megatron/, nemo/, transformer_engine/, deepspeed/, "
    "torch/utils/checkpoint, peft/, accelerate/, transformers/) on a checkpointing, "
    "offloading or sharding code path",
    cause="The framework's own code fails on a combination of features it does not handle: "
    "a bug (or a version mismatch between two libraries), not the user's configuration",
    confirm="The innermost frames are the library's, not the training script's; turning the "
    "feature in those frames off makes the error go",
    fix="Upgrade the library in the innermost frames; meanwhile turn the feature in the "
    "failing frames off (or switch its implementation) and report the traceback upstream",
    patch={"command": "pip install -U <the library in the innermost frames>"},
)
def _library_exception(ctx: Context) -> Match | None:
    events = [e for e in ctx.evidence.errors if e.kind == "exception"]
    typed = [
        e
        for e in events
        if e.type.rsplit(".", 1)[-1] in BUG_EXCEPTIONS
        and not (e.type.endswith("AssertionError") and e.message.strip())
    ]
    orphans = [e for e in events if e.message == ORPHAN]
    candidates: list[tuple[Any, list[str], float]] = []
    for e in typed:
        frames = e.frames or [f for o in orphans for f in o.frames]
        candidates.append((e, frames, 0.6))
    said_oom = ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions")  # "...and OOM" in words
    if orphans and not typed and not said_oom:
        candidates.append((orphans[-1], [f for o in orphans for f in o.frames], 0.45))
    for e, frames, confidence in candidates:
        if not frames:
            continue
        inner = frames[-4:]
        lib = library_of(frames[-1])
        if lib is None:
            continue  # raised in the user's own code
        pairs = _frames_with_code(ctx, inner)
        pieces = [p for f, c in reversed(pairs) for p in (f, c) if p]
        if e.message != ORPHAN:
            pieces.append(e.message)
        found = _feature(pieces)
        if found is None:
            continue
        feature, where = found
        func = frames[-1].rsplit(" in ", 1)[-1] if " in " in frames[-1] else frames[-1]
        code = pairs[-1][1]
        patch, off = _turn_off(ctx, feature)
        package = "torch" if lib == "torch" else lib.replace("_", "-")
        patch = {**patch, "command": f"pip install -U {package}"}
        said = f"{e.type}: {e.message[:140]}" if e.message != ORPHAN else "A traceback"
        evidence = (
            f"{said} is raised in {lib}'s own code ({frames[-1].rsplit('/', 1)[-1]}"
            + (f": `{code[:120]}`" if code else "")
            + f"), on the {FEATURE_WORDS[feature]} path ('{where.strip()[:100]}')."
        )
        if e.message == ORPHAN:
            evidence += " The exception line is not in the paste: paste it to confirm."
        return Match(
            confidence,
            evidence,
            config_patch=patch,
            fix=f"A bug in {lib} ({func}), not in the configuration: upgrade {package} "
            f"(pip install -U {package}); meanwhile {off}, and report the traceback upstream",
        )
    return None


# --------------------------------------------------------------------------------------------
# RK261: a square [seq, seq] attention mask or score matrix
# --------------------------------------------------------------------------------------------

_QKV_SHAPE_RE = re.compile(r"\[(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\]")

FLEX_FIX = (
    "flex_attention = torch.compile(flex_attention); "
    "block_mask = create_block_mask(mask_mod, B, H, S, S, _compile=True)"
)


@rule(
    "RK261",
    "A [seq x seq] attention mask or score matrix is materialised",
    "allocation_exceeds_device",
    symptom="An OOM (or a question about one) naming a square [N, N] mask / score / "
    "attention tensor for a long sequence, or the failing line computes q @ k^T in full",
    cause="Eager attention (and flex_attention or create_block_mask run uncompiled) builds "
    "the whole [batch, heads, seq, seq] score matrix or [seq, seq] mask: it grows with the "
    "square of the sequence and for long sequences exceeds any GPU",
    confirm="batch x heads x seq^2 x 4 bytes (fp32 scores) or seq^2 bytes (a bool mask) "
    "against the GPU",
    fix="Never materialise it: compile flex_attention (torch.compile) and build the mask "
    "with create_block_mask(..., _compile=True) (a block-sparse BlockMask), or use a fused "
    "kernel (flash / SDPA memory-efficient with is_causal) instead of an explicit mask",
    patch={"code": FLEX_FIX},
    supersedes=("RK004", "RK005", "RK087"),
)
def _square_attention(ctx: Context) -> Match | None:
    dims = fact(ctx, "square_dims") or []
    matmul = fact(ctx, "score_matmul") or []
    if not dims and not matmul:
        return None
    if dims:
        n, line = max(dims, key=lambda d: d[0])
        mask_bytes = n * n
        heads = ""
        for m in _QKV_SHAPE_RE.finditer(" ".join(fact(ctx, "oom_mentions") or []) + _shapes(ctx)):
            b, h, s = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if s == n:
                heads = (
                    f"; the fp32 scores of [{b}, {h}, {n}, {n}] would be {gib(4 * b * h * n * n)}"
                )
                break
        return Match(
            0.85,
            f"The paste names a square [{n}, {n}] tensor ('{line[:140]}'): {gib(mask_bytes)} "
            f"as a bool mask, {gib(4 * mask_bytes)} per head in fp32{heads}. It grows with "
            "the square of the sequence.",
        )
    if _uncompiled_flex(ctx, matmul):
        return Match(
            0.6,
            f"The failing line is flex_attention's reference math ('{matmul[0][:140]}'): run "
            "uncompiled, it builds the whole [batch, heads, seq, seq] score matrix in one "
            "allocation, the square of the sequence.",
        )
    return None  # q @ k^T in model code with no size: eager attention's activations (RK632)


def _uncompiled_flex(ctx: Context, matmul: list[str]) -> bool:
    """The q @ k^T line is flex_attention's eager fallback (torch's math_attention casts the
    scores to its `working_precision`), or the frames run through flex_attention."""
    return any("working_precision" in m for m in matmul) or "flex_attention" in all_frames(ctx)


@rule(
    "RK632",
    "Eager attention computes the full [seq x seq] score matrix: attention activations",
    "activation_memory",
    symptom="An OOM (or a question about one) whose pasted code or failing line computes "
    "q @ k^T in full (eager attention), with no size that exceeds the GPU by itself",
    cause="Eager attention keeps [batch, heads, seq, seq] scores (and their softmax) per layer "
    "for the backward: activations that grow with the square of the sequence, which fused "
    "kernels never store",
    confirm="Switch the attention to flash / SDPA / compiled flex_attention for one run: the "
    "peak falls with the sequence length squared",
    fix="Use a fused attention instead of eager: attn_implementation flash_attention_2 / sdpa, "
    "or compile flex_attention (torch.compile) with create_block_mask(..., _compile=True); "
    "else a shorter sequence or micro-batch",
    patch={"code": FLEX_FIX},
    supersedes=("RK004", "RK005", "RK087", "RK102"),
)
def _eager_scores(ctx: Context) -> Match | None:
    matmul = fact(ctx, "score_matmul") or []
    if not matmul or fact(ctx, "square_dims") or _uncompiled_flex(ctx, matmul):
        return None
    patch = None  # flex_attention's fix (the rule's patch) unless the frames name a framework
    if is_megatron(ctx):
        patch = {"attention_backend": "flash"}
    elif "transformers/" in all_frames(ctx) or "modeling_" in all_frames(ctx):
        patch = {"attn_implementation": "sdpa"}
    return Match(
        0.6,
        f"The failing line computes the full score matrix ('{matmul[0][:140]}'): eager "
        "attention keeps [batch, heads, seq, seq] scores per layer, the square of the sequence.",
        config_patch=patch,
    )


def _shapes(ctx: Context) -> str:
    """4-d shapes printed in the paste (q, k, v: torch.Size([b, h, s, d])), as one string."""
    return " " + " ".join(fact(ctx, "shape_lines") or [])


# --------------------------------------------------------------------------------------------
# RK262: logits with a vocabulary-sized dimension
# --------------------------------------------------------------------------------------------


@rule(
    "RK262",
    "Logits with a vocabulary-sized dimension dominate the memory",
    "logits_memory",
    symptom="The paste names the logits with a vocabulary-sized dimension ([batch, tokens, "
    "vocab], vocab 30k-300k) next to memory figures or an OOM",
    cause="Logits (and their fp32 copy, log-probabilities and gradient) are batch x tokens x "
    "vocab: with a 150k vocabulary they outgrow the model's own activations, whatever the "
    "model size; recompute of transformer layers does not touch them",
    confirm="batch x tokens x vocab x 4 bytes against the peak; a fused linear cross-entropy "
    "makes the peak drop by about that much",
    fix="Never materialise the full logits: a fused cross entropy or fused linear cross-entropy "
    "(Liger's FusedLinearCrossEntropy: use_liger_kernel, LLaMA-Factory enable_liger_kernel; "
    "Megatron cross_entropy_loss_fusion "
    "with cross_entropy_fusion_impl: te), chunked log-prob / loss "
    "computation, logits_to_keep (only the completion tokens), or a smaller micro-batch",
    patch={"use_liger_kernel": True},
    supersedes=("RK005", "RK087", "RK004"),
)
def _vocab_logits(ctx: Context) -> Match | None:
    lines = fact(ctx, "logits_lines") or []
    if not lines:
        return None
    sizes = re.compile(r"\d(?:\.\d+)?\s*[KMGT]i?B\b|\d\s*[KMGT]\b", re.I)
    failing = ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions") or ctx.evidence.memory
    failing = failing or fact(ctx, "exhausted_prose")
    if not failing and not any(sizes.search(line) for line in lines):
        return None  # logits named, but no memory figure or OOM next to them
    if is_megatron(ctx):
        patch: dict[str, Any] = {"cross_entropy_loss_fusion": True}
    else:
        patch = {"use_liger_kernel": True}
    return Match(
        0.75,
        f"The paste names the logits with a vocabulary-sized dimension ('{lines[0][:160]}'): "
        "they scale with batch x tokens x vocab, not with the model.",
        config_patch=patch,
    )


# --------------------------------------------------------------------------------------------
# RK263: allocator blocks held by communication on side streams
# --------------------------------------------------------------------------------------------


@rule(
    "RK263",
    "Reserved far above allocated while communication runs on side streams",
    "framework_bug",
    symptom="An OOM whose reserved memory is far above the allocated memory in a job that "
    "overlaps NCCL communication with compute on separate streams (or calls record_stream); "
    "the same step fits most of the time",
    cause="A block freed while another stream still uses it goes back to the pool only when "
    "that stream's event completes; with many collectives in flight (the CPU far ahead of "
    "the GPU) the caching allocator holds gigabytes of such blocks (PyTorch kept one event "
    "queue for all streams until pytorch#71745: one slow stream blocked every other's frees)",
    confirm="torch.cuda.memory_stats(): active_bytes well above allocated_bytes at the OOM; "
    "the gap shrinks when fewer collectives are queued",
    fix="Bound the collectives in flight (a fixed number of queued NCCL ops; FSDP "
    "limit_all_gathers=True), set TORCH_NCCL_AVOID_RECORD_STREAMS=1 (no record_stream on "
    "collective tensors), and upgrade PyTorch (per-stream event queues)",
    patch={"env": {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}, "limit_all_gathers": True},
    refs=("https://github.com/pytorch/pytorch/pull/71745",),
    supersedes=("RK001", "RK005", "RK087"),
)
def _side_streams(ctx: Context) -> Match | None:
    lines = fact(ctx, "side_stream_lines") or []
    oom = ctx.oom
    if not lines or oom is None or not oom.total_bytes:
        return None
    reserved = oom.reserved_bytes
    if reserved is None and oom.reserved_unallocated_bytes is not None and oom.allocated_bytes:
        reserved = oom.allocated_bytes + oom.reserved_unallocated_bytes
    if not reserved or not oom.allocated_bytes:
        return None
    gap = reserved - oom.allocated_bytes
    if gap < max(2 * GIB, 0.15 * oom.total_bytes):
        return None
    return Match(
        0.92,
        f"PyTorch reserved {gib(reserved)} but only {gib(oom.allocated_bytes)} is allocated "
        f"({gib(gap)} held), and the job overlaps communication on side streams "
        f"('{lines[0][:140]}'): blocks wait for those streams' events before reuse.",
    )


# --------------------------------------------------------------------------------------------
# RK264: memory a library keeps after everything was freed (cuBLAS workspaces)
# --------------------------------------------------------------------------------------------


@rule(
    "RK264",
    "memory_allocated() stays above zero after everything is freed: cuBLAS workspaces",
    "informational",
    symptom="torch.cuda.memory_allocated() (or reserved) is non-zero after the model is "
    "deleted and garbage-collected; a few MiB per stream / handle that never go",
    cause="cuBLAS keeps one workspace per handle and stream, allocated through PyTorch's "
    "caching allocator since PyTorch 1.13 / 2.0 (for CUDA-graph safety): it is counted as "
    "allocated and lives until the process exits. Not a leak",
    confirm="torch._C._cuda_clearCublasWorkspaces() brings memory_allocated() back to zero; "
    "the residue is a multiple of the workspace size (CUBLAS_WORKSPACE_CONFIG)",
    fix="Nothing to fix; to measure from zero call torch._C._cuda_clearCublasWorkspaces() "
    "before reading the counter, or shrink the workspace with CUBLAS_WORKSPACE_CONFIG=:4096:8",
    patch={
        "code": "torch._C._cuda_clearCublasWorkspaces()",
        "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
    },
    refs=("https://github.com/pytorch/pytorch/pull/85447",),
)
def _cublas_workspace(ctx: Context) -> Match | None:
    lines = (fact(ctx, "residual_lines") or []) + (fact(ctx, "cublas_workspace_lines") or [])
    if not lines or ctx.oom or oom_errors(ctx):
        return None
    if (fact(ctx, "residual_bytes") or 0) > 512 * 2**20:
        return None  # gigabytes left over are references the program still holds, not cuBLAS
    return Match(
        0.6,
        f"The paste says a memory counter stays non-zero after freeing ('{lines[0][:160]}'): "
        "the cuBLAS workspaces PyTorch allocates per handle and stream stay until exit.",
    )


# --------------------------------------------------------------------------------------------
# RK265: a memory summary's peak, no OOM and nothing else
# --------------------------------------------------------------------------------------------


@rule(
    "RK265",
    "Default reading of memory figures: the peak is what the run needs",
    "genuine_pressure",
    symptom="A memory summary or memory report (peak allocated) and no OOM message, no "
    "specific pattern",
    cause="The peak allocated memory is what this workload needs at this batch and input "
    "size; a smaller GPU, another process or a per-process cap "
    "(set_per_process_memory_fraction) below it OOMs",
    confirm="Compare the peak with the GPU's (or the cap's) size; halve the batch and see the "
    "peak fall",
    fix="Give the run at least its peak (a larger GPU, no lower set_per_process_memory_"
    "fraction cap), or lower the peak: halve the batch size, shorter inputs, half precision, "
    "a smaller model",
    patch={"batch_size": HALF},
    fallback=True,
)
def _summary_peak(ctx: Context) -> Match | None:
    if ctx.oom or oom_errors(ctx):
        return None
    peaks = [m for m in ctx.evidence.memory if m.max_allocated_bytes]
    if not peaks:
        return None
    peak = max(peaks, key=lambda m: m.max_allocated_bytes)
    current = f", {gib(peak.allocated_bytes)} now" if peak.allocated_bytes else ""
    gpu = ctx.gpu_bytes or (fact(ctx, "gpu_prose") or {}).get("bytes")
    against = f" against a {gib(gpu)} GPU" if gpu else ""
    return Match(
        0.3,
        f"The memory report ({peak.label or peak.source}) peaks at "
        f"{gib(peak.max_allocated_bytes)} allocated{current}{against}: a GPU or a "
        "set_per_process_memory_fraction cap below that peak OOMs at this batch size.",
        config_patch={"batch_size": HALF},
    )


# --------------------------------------------------------------------------------------------
# RK266: memory that grows step after step at a fixed shape (a leak), not a peak too high
# --------------------------------------------------------------------------------------------


def _growing(points: list[tuple[int, int]]) -> tuple[int, int, int] | None:
    """(first, last, steps) when a per-step series keeps growing: in step order, never
    falling and still rising at the end. Three or four points must grow by 10% and 256 MiB;
    five or more (a steady loop prints the same figure every step) by any amount at three
    steps or more, the last one among the final three."""
    if len(points) < 3:
        return None
    points = sorted(points)
    values = [v for _, v in points]
    if any(b < a for a, b in pairwise(values)):
        return None
    rises = sum(b > a for a, b in pairwise(values))
    if len(values) >= 5:
        if rises < 3 or values[-1] <= values[-3]:
            return None  # a plateau at the end: warm-up, not a leak
    elif not (values[-1] > values[-2] > values[-3]) or (
        values[-1] < 1.1 * values[0] or values[-1] - values[0] < 256 * 2**20
    ):
        return None
    return values[0], values[-1], points[-1][0] - points[0][0]


@rule(
    "RK266",
    "Memory grows step after step at a fixed shape: something keeps references (a leak)",
    "framework_bug",
    symptom="Allocated memory (or max allocated) printed per step / iteration / epoch rises "
    "at every step instead of settling after the first ones, until an OOM hours in; or the "
    "paste says in words that the memory keeps growing",
    cause="Something keeps tensors of each step alive: a reference cycle (a checkpoint or "
    "compile wrapper, hooks), a framework path that holds autograd references until a later "
    "step (MoE full recompute, selective checkpointing contexts), adapters or caches loaded "
    "and never released, or the loop keeping losses / outputs with their graphs",
    confirm="Call gc.collect() after each step: memory flat means a reference cycle; diff two "
    "torch.cuda.memory._snapshot()s a few steps apart to see which allocations survive",
    fix="Find the holder rather than lowering the peak: gc.collect() per step as a stopgap, "
    "turn the recompute / offload feature in use off for one run to bisect, upgrade the "
    "framework (such leaks are fixed upstream), keep loss.item() not the tensor",
    patch={"code": "gc.collect()  # after each optimizer step, to test for a reference cycle"},
    supersedes=("RK005", "RK087"),
)
def _leak(ctx: Context) -> Match | None:
    series: dict[str, list[tuple[int, int]]] = {}
    lines: dict[str, str] = {}
    for step, value, kind, line in fact(ctx, "memory_series") or []:
        series.setdefault(kind, []).append((step, value))
        lines.setdefault(kind, line)
    reports = ctx.evidence.memory  # in the order printed: by iteration where it is given
    for label, attr in (("max allocated", "max_allocated_bytes"), ("allocated", "allocated_bytes")):
        points = [
            (r.iteration if r.iteration is not None else i, getattr(r, attr))
            for i, r in enumerate(reports)
            if getattr(r, attr)
        ]
        if len(points) >= 3 and (label == "allocated" or "allocated" not in series):
            series[label] = points
    for kind in ("allocated", "max allocated"):
        grown = _growing(series.get(kind, []))
        if grown is None:
            continue
        first, last, steps = grown
        where = f" ('{lines[kind][:120]}')" if kind in lines else ""
        return Match(
            0.55,
            f"{kind.capitalize()} memory rises at every step: {gib(first)} -> {gib(last)} "
            f"over {steps} steps{where}. A peak too high is flat from step to step; this grows.",
        )
    # Prose without figures: "the memory grows until OOM", "continuous rising of gpu memory"
    prose = fact(ctx, "memory_growth_prose")
    kept = fact(ctx, "graph_kept_prose")  # the holder said: outputs kept with their graphs
    if prose and not kept and (fact(ctx, "mentions") or fact(ctx, "version_said")):
        # the growth tied to checkpointing or to a library release: a leak in the library
        # (a reference cycle through the checkpoint's saved context, hooks, caches)
        lib, version = fact(ctx, "version_said") or ("", "")
        where = f" ({lib} {version})" if lib else ""
        # Name the checkpoint as the holder only where the paste puts checkpointing in play
        ckpt = bool(fact(ctx, "mentions"))
        holder = "the checkpoint's saved context or hooks" if ckpt else "hooks, caches or graphs"
        return Match(
            0.5,
            f"The paste says the memory grows step after step ('{prose[0]}') with "
            + (f"a library release named{where}" if lib else "checkpointing in play")
            + f": a leak in the library's path (a reference cycle through {holder}) is the "
            "usual holder.",
            fix="Upgrade the library (such leaks - reference cycles through "
            + ("checkpoint contexts, " if ckpt else "")
            + "hooks or caches - are fixed upstream)"
            + (f": pip install -U {lib}" if lib else "")
            + "; gc.collect() after each step to confirm a reference cycle (memory flat), and "
            "diff two torch.cuda.memory._snapshot()s to find the holder"
            + ("; meanwhile turn gradient checkpointing off for one run to bisect" if ckpt else ""),
            config_patch={
                "command": f"pip install -U {lib or '<the library>'}",
                "code": "gc.collect()  # after each optimizer step, to test for a reference cycle",
            },
        )
    if prose:
        return Match(
            0.45,
            f"The paste says the memory grows step after step ('{prose[0]}'): something keeps "
            "each step's tensors - "
            + (
                f"as it says, outputs or losses kept with their autograd graphs ('{kept[0]}')."
                if kept
                else "most often a loss or output accumulated as a tensor (total_loss += loss) "
                "with its graph."
            ),
            fix="Accumulate loss.item() (or loss.detach()), not the loss tensor, and keep no "
            "outputs with their graphs across steps; then gc.collect() per step to test for a "
            "reference cycle, and diff two torch.cuda.memory._snapshot()s to find the holder",
        )
    return None
