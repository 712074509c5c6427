"""When even full recompute of every layer does not fit: what the smallest candidate is made of,
and the planner's cheapest lever that fits (RK013 model states, RK024 the layers' saved inputs;
the logits' reading is RK012, rules/logits.py, which asks `largest_at_full_recompute` too).

The planner raises "nothing fits" with the smallest candidate's total; which term of that
candidate is the largest decides what to change: model states call for sharding or more model
parallelism, the layers' saved inputs (full recompute keeps one per layer) for context
parallelism or a shorter sequence, the logits for a fused loss. The patch is the first row of
`plan --levers` that fits (plan/levers.py): one ranking for the planner and the doctor.
"""

from __future__ import annotations

from typing import Any

from ...config import ConfigError
from ..types import GIB, Context, Match
from .memory import largest_at_full_recompute
from .registry import gib, patch_for, rule, tensor_parallel_patch


def lever_patch(ctx: Context) -> tuple[dict[str, Any], str]:
    """The first row of `plan --levers` that fits, as a patch and words; else the next tensor
    parallel size (which may need more GPUs), as before."""
    row = _first_fitting_lever(ctx)
    if row is None:
        return tensor_parallel_patch(ctx)
    cfg, new = ctx.config, row.config
    patch: dict[str, Any] = {}
    for key in (
        "tensor_model_parallel_size",
        "context_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "use_distributed_optimizer",
    ):  # (data parallelism follows from the world size in every framework: no key to set)
        if getattr(new.parallel, key) != getattr(cfg.parallel, key):
            patch[key] = getattr(new.parallel, key)
    if new.model.micro_batch_size != cfg.model.micro_batch_size:
        patch["micro_batch_size"] = new.model.micro_batch_size
    spec = row.estimate.recompute
    if spec != cfg.recompute.spec:
        patch.update({k: v for k, v in patch_for(spec).items() if v is not None})
    words = (
        f"the cheapest change that fits by `plan --levers` on the run's GPUs: {row.setting}"
        + (f" with '{spec}'" if spec != cfg.recompute.spec else "")
        + f" ({gib(row.estimate.total_bytes)} per rank, step {row.relative:.2f}x the current)"
    )
    return patch, words


def _first_fitting_lever(ctx: Context):
    from ...plan.levers import levers

    if ctx.config is None or not ctx.gpu_bytes:
        return None
    if "first_fitting_lever" not in ctx.memo:  # three rules ask; the table is made once
        try:
            rows = levers(ctx.config, ctx.gpu_bytes / GIB).rows
        except (ConfigError, ValueError, ZeroDivisionError):
            rows = []
        ctx.memo["first_fitting_lever"] = next(
            (r for r in rows if r.fits and r.lever != "current"), None
        )
    return ctx.memo["first_fitting_lever"]


def _match(ctx: Context, mine: str, conf: float) -> Match | None:
    """The reading of rule `mine` when its term is the largest, with the planner's lever."""
    found = largest_at_full_recompute(ctx)
    if found is None or not (ctx.oom or ctx.says("out of memory")):
        return None
    key, terms = found
    if key != mine:  # the largest term's own rule reads it (RK012 for the logits)
        return None
    patch, words = lever_patch(ctx)
    said = ctx.plan_error[0].upper() + ctx.plan_error[1:] + ". " + terms
    return Match(conf, said, config_patch=patch or None, fix=f"{_FIX[mine]}; {words}")


_FIX = {
    "states": "Shard the model states (distributed optimizer / FSDP) or add model parallelism",
    "layers": "Split the sequence (context parallelism) or shorten it: full recompute already "
    "keeps only one input per layer",
}


@rule(
    "RK013",
    "Even full recompute does not fit: model states are the largest term",
    "model_state_memory",
    symptom="OOM persists with full recompute (uniform, 1 layer), and weights, gradients and "
    "optimizer states are the smallest candidate's largest term",
    cause="Too few ranks share the parameters and optimizer states for this GPU",
    confirm="recompute-kit plan --gpu-memory-gb X exits 1 and says by how much the smallest "
    "candidate misses; recompute-kit estimate --recompute full:uniform:1 shows its terms",
    fix=_FIX["states"],
    supersedes=("RK010", "RK005"),
    patch={"use_distributed_optimizer": True},
)
def _nothing_fits_states(ctx: Context) -> Match | None:
    return _match(ctx, "states", 0.8)


@rule(
    "RK024",
    "Even full recompute does not fit: the layers' saved inputs are the largest term",
    "activation_memory",
    symptom="OOM persists with full recompute (uniform, 1 layer), and the one input each "
    "layer keeps is the smallest candidate's largest term (a long sequence)",
    cause="Full recompute keeps each layer's input, [sequence x batch x hidden] per layer; at "
    "long sequences these alone exceed the GPU",
    confirm="recompute-kit estimate --recompute full:uniform:1 shows the layers' activations "
    "above the model states and the logits",
    fix=_FIX["layers"],
    supersedes=("RK010", "RK005"),
)
def _nothing_fits_layers(ctx: Context) -> Match | None:
    return _match(ctx, "layers", 0.8)
