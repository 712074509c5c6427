"""Recompute settings the framework accepts and then does not act on (RK025)."""

from __future__ import annotations

from ..types import Context, Match
from .registry import fact, patch_for, rule


@rule(
    "RK025",
    "recompute_modules are ignored: recompute_granularity is not selective",
    "recompute_no_effect",
    symptom="The inputs set recompute_modules while recompute_granularity is unset (None) or "
    "full; memory is the same as without them",
    cause="Megatron-Core reads recompute_modules only when recompute_granularity is "
    "'selective': unset, it recomputes nothing; 'full', it recomputes whole layers (and a "
    "recipe's own recompute_granularity / recompute_num_layers stay as they were)",
    confirm="The arguments / config the framework prints at start-up: recompute_granularity "
    "there; `recompute-kit validate` warns about it",
    fix="Set recompute_granularity to selective beside recompute_modules (and recompute_method "
    "/ recompute_num_layers to null, which selective refuses)",
    supersedes=("RK023",),
)
def _modules_ignored(ctx: Context) -> Match | None:
    modules = ctx.cfg.get("recompute_modules")
    granularity = ctx.cfg.get("recompute_granularity")
    if not modules or granularity == "selective":
        return None
    if "recompute_granularity" not in ctx.cfg and not (ctx.evidence.read or {}).get("config"):
        return None  # no reading of the whole config: granularity unknown, not unset
    spec = "selective:" + ",".join(modules if isinstance(modules, list) else [str(modules)])
    said = "unset" if granularity is None else f"'{granularity}'"
    stated = " The report says they change nothing." if fact(ctx, "symptom_lines") else ""
    return Match(
        0.85,
        f"recompute_modules {modules} are set while recompute_granularity is {said}: "
        f"Megatron-Core reads them only under 'selective', so they do nothing.{stated}",
        config_patch=patch_for(spec),
    )
