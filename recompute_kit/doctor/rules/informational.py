"""When nothing is wrong."""

from __future__ import annotations

from ..types import Context, Match
from .registry import on_message, patch_for, rule

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


@rule(
    "RK104",
    "Old gradient-checkpointing format of a remote-code model (Hugging Face)",
    "informational",
    symptom="'You are using an old version of the checkpointing format that is deprecated (We "
    "will also silently ignore `gradient_checkpointing_kwargs` ...)'",
    cause="The model's own modeling file (trust_remote_code) still defines "
    "_set_gradient_checkpointing(module, value); transformers falls back to it, so "
    "checkpointing works but gradient_checkpointing_kwargs (use_reentrant) are ignored",
    confirm="The model is loaded with trust_remote_code and its modeling file defines "
    "_set_gradient_checkpointing",
    fix="No fix needed for memory: checkpointing is on. To pass use_reentrant, update the "
    "modeling file to the new format (its _set_gradient_checkpointing takes "
    "enable/gradient_checkpointing_func)",
    patch={
        "code": "no change needed; optional: update _set_gradient_checkpointing in the "
        "model's modeling file"
    },
    refs=("https://github.com/hiyouga/LlamaFactory/issues/1916",),
)
def _old_checkpointing_format(ctx: Context) -> Match | None:
    found = on_message("old version of the checkpointing format", confidence=0.7)(ctx)
    if found is None or ctx.oom or any(e.kind == "exception" for e in ctx.evidence.errors):
        return None
    return found
