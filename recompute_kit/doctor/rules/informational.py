"""When nothing is wrong."""

from __future__ import annotations

from ..types import Context, Match
from .registry import patch_for, rule

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
