"""Memory facts said only in words, with no OOM message to read them from: an allocation
larger than any GPU (RK501)."""

from __future__ import annotations

import re

from ..types import Context, Match
from .allocator import shrink_patch
from .registry import fact, gib, rule

# More than any single GPU holds (the largest ship 288 GB): no batch size makes it fit
ANY_GPU_BYTES = 300 * 10**9
_ATTENTION_RE = re.compile(r"mask|attention|attn|score|softmax|sdpa", re.I)


@rule(
    "RK501",
    "An allocation larger than any GPU, stated in words",
    "allocation_exceeds_device",
    symptom="The paste says a step will try to allocate (or allocates) more than any single "
    "GPU has (over 300 GB: '... will try to allocate 720gb'), with no OOM message to read",
    cause="One tensor grows with a square or product of the input sizes (a materialised "
    "[batch, heads, seq, seq] attention mask or score matrix, full fp32 logits, an expanded "
    "broadcast) and outgrows every device; more GPUs of the same kind do not help",
    confirm="Compute the tensor's size from its shape at the sizes in use; it scales with the "
    "sequence length squared for masks and scores",
    fix="Never materialise the tensor: flash / memory-efficient attention with is_causal or "
    "a block mask instead of a dense 4-d mask, chunked or fused loss instead of full logits, "
    "or a smaller input (sequence length, batch, resolution); then context parallelism to "
    "split the sequence",
    supersedes=("RK170", "RK005"),
)
def _allocation_in_words(ctx: Context) -> Match | None:
    size = fact(ctx, "alloc_prose_bytes")
    if not isinstance(size, int) or size < ANY_GPU_BYTES:
        return None
    if any(o.requested_bytes and o.requested_bytes >= size for o in ctx.evidence.oom):
        return None  # the OOM message states it: RK004 reads the message
    line = str(fact(ctx, "alloc_prose_line") or "")
    if _ATTENTION_RE.search(line):
        patch = {"attn_implementation": "flash_attention_2"}
        what = (
            "the line names a mask / attention tensor: a dense [batch, heads, seq, seq] "
            "tensor; use flash attention with is_causal (no mask tensor) or a block mask"
        )
    else:
        patch, what = shrink_patch(ctx)
    return Match(
        0.75,
        f"The paste states an allocation of {gib(size)} ('{line[:160]}'): more than any "
        f"single GPU has, so no batch size or sharding of model states makes it fit; {what}.",
        config_patch=patch,
    )
