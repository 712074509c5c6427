"""When nothing is wrong."""

from __future__ import annotations

from ..types import Context, Match
from .knobs import read_knobs
from .registry import fact, gib, patch_for, rule

# --------------------------------------------------------------------------------------------
# When nothing is wrong
# --------------------------------------------------------------------------------------------


@rule(
    "RK090",
    "Headroom: recompute could be reduced",
    "informational",
    symptom="No OOM; the estimate leaves a large part of the GPU unused while recompute is on",
    cause="The recompute setting is stricter than the memory needs",
    confirm="recompute-kit plan --gpu-memory-gb X shows a cheaper setting that fits",
    fix="Switch to the planner's choice for throughput",
)
def _headroom(ctx: Context) -> Match | None:
    if ctx.oom or ctx.says("out of memory") or ctx.best is None or ctx.estimate is None:
        return None
    if not ctx.granularity:
        return None
    best = ctx.best.estimate
    if ctx.estimate.recompute_flops_fraction - best.recompute_flops_fraction < 0.02:
        return None
    return Match(
        0.5,
        f"'{best.recompute}' also fits and adds {best.recompute_flops_fraction:.1%} "
        f"FLOPs instead of {ctx.estimate.recompute_flops_fraction:.1%}.",
        config_patch=patch_for(best.recompute),
    )


def _quiet(ctx: Context) -> bool:
    """No failure in the evidence: no OOM and no exception line."""
    return not ctx.oom and not any(e.kind == "exception" and e.type for e in ctx.evidence.errors)


@rule(
    "RK157",
    "A library's notice: it falls back to a slower or larger path",
    "informational",
    symptom="A line such as 'Unsloth: Vocab size of N exceeds the max CUDA blocksize ... will "
    "use Pytorch's CrossEntropyLoss, which will entail a 25% increase in memory usage and be "
    "slower', with no error",
    cause="The library's fast kernel does not cover this case; it says so and uses the "
    "generic implementation, which costs some memory and speed but works",
    confirm="Training runs; the notice repeats at start-up",
    fix="No fix needed; upgrade the library when a release covers the case (the notice names "
    "the component, e.g. CrossEntropyLoss), or leave headroom for the extra memory",
    patch={"command": "pip install -U <the library named in the notice>"},
)
def _fallback_notice(ctx: Context) -> Match | None:
    notices = fact(ctx, "notices", "log")
    if not notices or not _quiet(ctx):
        return None
    line = notices[0]
    lib = line.split(":", 1)[0].strip() if ":" in line[:40] else ""
    lib = lib if lib.replace("-", "").replace("_", "").isalnum() else ""
    return Match(
        0.6,
        f'The log says: "{line}": a fallback it announces, not an error.',
        config_patch={"command": f"pip install -U {lib.lower() or '<library>'}"},
        fix="No fix needed: the run works on the slower path"
        + (f"; upgrade {lib.lower()} when a release covers this case" if lib else ""),
    )


@rule(
    "RK159",
    "'Checkpointing has no effect' read from the wrong number",
    "informational",
    symptom="The same memory with and without gradient checkpointing by one measure (nvidia-smi, "
    "reserved memory), while the allocator's peaks (MaxMemAllocated, max_memory_allocated) "
    "differ",
    cause="nvidia-smi and reserved memory include the allocator's cache, which keeps the "
    "largest footprint ever reached; at a short sequence length activations are a small "
    "share of the total anyway",
    confirm="Compare torch.cuda.max_memory_allocated() (DeepSpeed's MaxMemAllocated) of the "
    "two runs",
    fix="No fix needed: checkpointing works; compare MaxMemAllocated / max_memory_allocated, "
    "and expect a large saving only at long sequences (max_seq_len) or large batches",
    patch={"code": "print(torch.cuda.max_memory_allocated()) with and without checkpointing"},
)
def _misread(ctx: Context) -> Match | None:
    if not _quiet(ctx):
        return None
    labelled = fact(ctx, "labelled_sizes") or []
    same = [s for _, s in labelled]
    equal = len(same) >= 2 and max(same) <= 1.05 * min(same)
    peaks = [m.max_allocated_bytes for m in ctx.evidence.memory if m.max_allocated_bytes]
    differ = len(peaks) >= 2 and max(peaks) >= 1.5 * min(peaks)
    if not (equal and differ):
        return None
    # the sequence cap under any framework's name (rules/knobs.py), not a fixed key list
    seq_knobs = read_knobs(ctx).seq
    key, seq = seq_knobs[0] if seq_knobs else (None, None)
    evidence = (
        f"{labelled[0][0]} and {labelled[1][0]} both read {gib(same[0])}, but the allocator's "
        f"peaks differ: {gib(min(peaks))} vs {gib(max(peaks))}."
    )
    if isinstance(seq, int) and seq <= 512:
        evidence += f" At {key} {seq} activations are a small share of the memory."
    return Match(0.75, evidence)


@rule(
    "RK671",
    "Tokenizer's 'Token indices sequence length is longer than ...' warning alone: harmless",
    "informational",
    symptom="'Token indices sequence length is longer than the specified maximum sequence "
    "length for this model (N > M). Running this sequence through the model will result in "
    "indexing errors', with no error after it",
    cause="transformers' tokenizer warns whenever a text is tokenized whole beyond its "
    "model_max_length; trainers (Unsloth, TRL SFTTrainer, LLaMA-Factory's cutoff_len) "
    "tokenize first and truncate or pack to max_seq_length afterwards, so no over-long "
    "sequence reaches the model",
    confirm="The batches' input_ids are no longer than max_seq_length (and training runs)",
    fix="No fix needed when the trainer truncates to max_seq_length; if you feed the ids to "
    "the model yourself, tokenize with truncation=True, max_length=<max_seq_length>",
    patch={"truncation": True},
    refs=("https://github.com/unslothai/unsloth/issues/382",),
)
def _token_overflow(ctx: Context) -> Match | None:
    over = fact(ctx, "token_overflow")
    if not isinstance(over, dict) or not _quiet(ctx) or fact(ctx, "oom_mentions"):
        return None  # with a failure in the paste the warning is a bystander
    return Match(
        0.55,
        f'The log says: "{over["line"]}": the tokenizer saw a {over["length"]}-token text '
        f"against its {over['max']}-token limit before any truncation; a warning, not an "
        "error.",
        config_patch={"max_seq_length": over["max"], "truncation": True},
        fix=f"No fix needed when the trainer truncates to max_seq_length (<= {over['max']}); "
        f"if you feed the ids to the model yourself, tokenize with truncation=True, "
        f"max_length={over['max']}",
    )
