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

from ..types import Context, Match
from .lever_patch import lever_patch
from .memory import largest_at_full_recompute, sharded_already
from .registry import rule


def _match(ctx: Context, mine: str, conf: float) -> Match | None:
    """The reading of rule `mine` when its term is the largest, with the planner's lever."""
    found = largest_at_full_recompute(ctx)
    if found is None:
        return None
    key, terms = found
    if key != mine:  # the largest term's own rule reads it (RK012 for the logits)
        return None
    patch, words = lever_patch(ctx)
    said = ctx.plan_error[0].upper() + ctx.plan_error[1:] + ". " + terms
    if not (ctx.oom or ctx.says("out of memory")):  # the estimate's prediction, not an OOM seen
        conf -= 0.15
        said += " No OOM was pasted: this is the estimate's prediction for the GPU given."
    # (an empty patch stays empty: the rule's default would be Megatron's distributed optimizer)
    fix = (mine == "states" and sharded_already(ctx)) or _FIX[mine]
    if mine == "layers" and ctx.full_refused:
        fix = (
            "Full recompute, which keeps one input per layer, is refused for this run: lift "
            f"what refuses it ({ctx.full_refused}), split the sequence (context "
            "parallelism) or shorten it"
        )
    return Match(conf, said, config_patch=patch, fix=f"{fix}; {words}")


_FIX = {
    "states": "Shard the model states (distributed optimizer / FSDP) or add model parallelism",
    "layers": "Split the sequence (context parallelism) or shorten it: full recompute already "
    "keeps only one input per layer",
}


@rule(
    "RK013",
    "Nothing fits, full recompute included: model states are the largest term",
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
    "Nothing fits, full recompute included: the layers' activations are the largest term",
    "activation_memory",
    symptom="OOM persists with full recompute (uniform, 1 layer), or where the run refuses "
    "full recompute (CUDA graphs, EP overlap) with the least-memory setting left, and the "
    "layers' activations are that candidate's largest term (a long sequence)",
    cause="Full recompute keeps each layer's input, [sequence x batch x hidden] per layer; at "
    "long sequences these alone exceed the GPU",
    confirm="recompute-kit estimate --recompute SPEC (full:uniform:1, or the smallest "
    "candidate plan names where full is refused) shows the layers' activations above the "
    "model states and the logits",
    fix=_FIX["layers"],
    supersedes=("RK010", "RK005"),
)
def _nothing_fits_layers(ctx: Context) -> Match | None:
    return _match(ctx, "layers", 0.8)
