"""Diagnoses users state in prose next to an OOM (a PR's measurements, an issue's summary):
an OOM they place at the (first) optimizer step (RK190), and reserved-but-unallocated memory
they quantify in their own words rather than in PyTorch's OOM message (RK191)."""

from __future__ import annotations

import re

from ..evidence.text import parse_size
from ..types import Context, Match
from .model_states import OPTIMIZER_OFFLOAD, optimizer_shard_step
from .registry import EXPANDABLE, fact, rule

# "OOM at the first optimizer step", "OOMs in optimizer.step()", "OOM ... allocate optimizer
# state", "OOM ... Adam lazy state init": the optimizer named on the line that says OOM.
_OPT_STEP_RE = re.compile(
    r"optimizer[ ._]?step|optimizer[ _-]?states?\b|adam(?:w)?(?:'s)?\s+(?:lazy\s+)?"
    r"(?:state|moments?)|exp_avg",
    re.I,
)
# "~20 GiB reserved-but-unallocated", "3.5 GB of reserved but unallocated memory"; PyTorch's
# own message ("X GiB is reserved by PyTorch but unallocated") is RK001's.
_RBU_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*(GiB|GB|G|MiB|MB)\s+(?:of\s+)?reserved[- ]but[- ]unallocated", re.I
)


def _oom_lines(ctx: Context) -> list[str]:
    return list(fact(ctx, "oom_mentions") or [])


@rule(
    "RK190",
    "The report places the OOM at the optimizer step: optimizer states",
    "model_state_memory",
    symptom="A summary or PR text says the run OOMs at the (first) optimizer step, or while "
    "Adam's states are allocated, without a traceback to show it",
    cause="Adam allocates its two fp32 moments (and fp32 master weights under mixed precision) "
    "lazily, at the first optimizer.step(): 8-12 bytes per trainable parameter arrive after "
    "the first backward, when activations are already freed",
    confirm="The OOM comes right after the first backward (step 1), or when resuming from a "
    "checkpoint that loads the optimizer states to the GPU",
    fix="Shard the optimizer states (ZeRO-1/2/3, Megatron's distributed optimizer, FSDP), "
    "offload them to CPU (or stream them per layer), an 8-bit / paged AdamW, or LoRA",
    patch={"zero_optimization": {"stage": 3}},
)
def _reported_optimizer_step_oom(ctx: Context) -> Match | None:
    hit = next((line for line in _oom_lines(ctx) if _OPT_STEP_RE.search(line)), None)
    if hit is None:
        return None
    patch, words = optimizer_shard_step(ctx)
    return Match(
        0.7,
        f"The paste puts the OOM at the optimizer step ('{hit}'): Adam's states, allocated at "
        f"the first step, not activations. Next: {words}.",
        config_patch=patch,
        fix=f"Optimizer states, not activations: {words}; else {OPTIMIZER_OFFLOAD}, an 8-bit "
        "/ paged AdamW or LoRA. Recompute cannot free them",
    )


@rule(
    "RK191",
    "The report quantifies reserved-but-unallocated memory at the OOM: fragmentation",
    "fragmentation",
    symptom="Next to the OOM the text says how much memory was reserved but unallocated "
    '("~20 GiB reserved-but-unallocated"), in the reporter\'s words',
    cause="The caching allocator holds free blocks that no request fits: changing tensor sizes "
    "(variable sequence lengths, offload / reload, sleep / wake cycles) fragment its segments",
    confirm="torch.cuda.memory_reserved() - memory_allocated() is large at the failure; the run "
    "passes with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    fix="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (where the process uses no "
    "custom memory pool that forbids it); else max_split_size_mb",
    patch=EXPANDABLE,
)
def _reported_reserved_unallocated(ctx: Context) -> Match | None:
    for line in _oom_lines(ctx):
        m = _RBU_RE.search(line)
        if m is None:
            continue
        unit = "GiB" if m.group(2).upper() == "G" else m.group(2)  # a bare "G" is GiB
        amount = parse_size(m.group(1), unit) or 0
        if amount < 2**30:
            continue
        return Match(
            0.75,
            f"The paste reports {m.group(1)} {m.group(2)} reserved but unallocated at the OOM "
            f"('{line}'): free cached memory no request could use - fragmentation, not "
            "capacity.",
            config_patch=EXPANDABLE,
            fix="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the allocator grow "
            "segments in place instead of stranding free blocks; if a custom memory pool "
            "forbids it (vLLM's CuMemAllocator in colocated RL), enable it only in the "
            "trainer process, or call torch.cuda.empty_cache() between phases",
        )
    return None
