"""Recompute that costs more than it saves."""

from __future__ import annotations

import re

from ..types import Context, Match
from .measured import measured_cost
from .registry import (
    candidate_patch,
    fact,
    gib,
    is_megatron,
    patch_for,
    rule,
    zero_stage,
)

# --------------------------------------------------------------------------------------------
# Recompute that costs too much
# --------------------------------------------------------------------------------------------


def _regressions(ctx: Context, threshold: float = -0.10):
    return [
        r
        for r in ctx.evidence.experiments
        if r.get("vs_golden") is not None
        and r["vs_golden"] <= threshold
        and not r.get("oom")
        and not r.get("within_noise")  # repeats that do not decide it (RK237 says so)
    ]


def _bands_overlap(a: dict, b: dict) -> bool:
    """Two aggregated rows whose noise bands (evidence/experiments.py's `measured`) overlap."""
    ma, mb = a.get("measured") or {}, b.get("measured") or {}
    if ma.get("low") is None or mb.get("low") is None:
        return False
    return ma["low"] <= mb["high"] and mb["low"] <= ma["high"]


@rule(
    "RK030",
    "mlp recompute on a large FFN costs too much throughput",
    "recompute_overhead",
    symptom=">15% throughput (TFLOP/s/GPU) drop after adding mlp to recompute_modules",
    cause="The FFN is the largest GEMM block (ffn_hidden_size 28672 on Llama-3-70B): "
    "recomputing it re-runs a big share of the forward",
    confirm="Compare TFLOP/s/GPU with and without mlp (the experiments table); "
    "recompute-kit estimate reports recompute_flops_fraction",
    fix="Recompute a few layers fully instead (full:block:N with the smallest N that fits) "
    "or offload; keep mlp only if nothing else fits",
    refs=("NVIDIA skill perf-activation-recompute (Llama3-70B: mlp -16.4%)",),
)
def _mlp_overhead(ctx: Context) -> Match | None:
    for r in _regressions(ctx, -0.15):
        if "mlp" in (r.get("recompute_modules") or []):
            # With a model shape and a GPU size, the planner names the cheaper setting that
            # fits; without, the smallest full block is where to start measuring.
            spec = ctx.best.estimate.recompute if ctx.best is not None else "full:block:1"
            why = (
                f" The planner's cheapest fitting setting is '{spec}' "
                f"({ctx.best.estimate.recompute_flops_fraction:.1%} extra FLOPs)."
                if ctx.best is not None
                else ""
            )
            return Match(
                0.85,
                f"Experiment '{r.get('name')}' with {r.get('recompute_modules')} "
                f"runs {r['vs_golden']:+.1%} vs golden.{why}",
                config_patch=patch_for(spec),
            )
    if "mlp" in ctx.modules and not ctx.is_moe and ctx.config and ctx.estimate:
        frac = ctx.estimate.recompute_flops_fraction
        if frac > 0.12:
            return Match(0.5, f"mlp recompute adds {frac:.1%} to the step's FLOPs here.")
    return None


@rule(
    "RK031",
    "mlp + core_attn is slower than mlp alone",
    "recompute_overhead",
    symptom="Adding core_attn to mlp recompute lowers throughput further for no memory gain",
    cause="Double recompute overhead: with flash attention core_attn saves almost nothing "
    "but still re-runs attention",
    confirm="Compare the [mlp] and [mlp, core_attn] rows: same peak memory, lower TFLOP/s",
    fix="Use mlp alone",
    patch=patch_for("selective:mlp"),
    refs=("NVIDIA skill perf-activation-recompute (Exp 1 vs Exp 2)",),
)
def _double(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    alone = [r for r in rows if (r.get("recompute_modules") or []) == ["mlp"]]
    both = [r for r in rows if set(r.get("recompute_modules") or []) == {"mlp", "core_attn"}]
    for a in alone:
        for b in both:
            if _bands_overlap(a, b):
                continue  # within the noise of their repeats
            if (
                a.get("tflops_per_gpu")
                and b.get("tflops_per_gpu")
                and b["tflops_per_gpu"] < a["tflops_per_gpu"]
                and (b.get("peak_memory_bytes") or 0) >= (a.get("peak_memory_bytes") or 0)
            ):
                return Match(
                    0.85,
                    f"[mlp, core_attn] runs {b['tflops_per_gpu']} TFLOP/s/GPU vs "
                    f"{a['tflops_per_gpu']} for [mlp] at no lower peak memory.",
                )
    return None


@rule(
    "RK032",
    "Full recompute where a cheaper setting fits",
    "recompute_overhead",
    symptom="Step time ~30-40% above a no-recompute run; full recompute configured",
    cause="Full recompute re-runs every layer's forward; selective recompute of the right "
    "modules, or none, often fits for a few percent",
    confirm="recompute-kit plan --gpu-memory-gb X ranks the settings that fit by added FLOPs",
    fix="Switch to the planner's choice",
    refs=("arXiv:2205.05198 Table 4",),
    supersedes=("RK090",),  # the same advice, said more specifically
)
def _full_overkill(ctx: Context) -> Match | None:
    if ctx.granularity != "full" or ctx.best is None:
        return None
    if ctx.oom or ctx.says("out of memory"):
        return None  # the run does not fit even with full recompute: never advise less
    best = ctx.best.estimate
    if best.recompute.startswith("full") or ctx.estimate is None:
        return None
    if ctx.estimate.recompute_flops_fraction - best.recompute_flops_fraction < 0.05:
        return None
    return Match(
        0.75,
        f"'{ctx.best.name}' fits ({gib(best.total_bytes)} per rank) for "
        f"{best.recompute_flops_fraction:.1%} extra FLOPs instead of "
        f"{ctx.estimate.recompute_flops_fraction:.1%}.",
        config_patch=candidate_patch(ctx.best),
    )


@rule(
    "RK033",
    "A recompute setting regresses throughput",
    "recompute_overhead",
    symptom="An experiment runs more than 10% below the golden (no-recompute or baseline) "
    "throughput",
    cause="The recomputed modules re-run a large share of the forward pass",
    confirm="recompute-kit ablate (or the experiments table): TFLOP/s/GPU vs golden",
    fix="Pick the fitting setting with the smallest overhead (recompute-kit plan)",
)
def _regression(ctx: Context) -> Match | None:
    rows = _regressions(ctx)
    if not rows:
        return None
    worst = min(rows, key=lambda r: r["vs_golden"])
    fitting = [
        r
        for r in ctx.evidence.experiments
        if not r.get("oom") and r.get("recompute") and r.get("vs_golden") is not None
    ]
    best = max(fitting, key=lambda r: r["vs_golden"], default=None)
    evidence = (
        f"Experiment '{worst.get('name')}' ({worst.get('recompute')}) runs "
        f"{worst['vs_golden']:+.1%} vs golden."
    )
    if (worst.get("speed_verdict") or {}).get("text"):
        evidence += f" {worst['speed_verdict']['text']}."
    evidence += measured_cost(ctx, worst)
    if best is not None and best is not worst:
        evidence += f" '{best.get('name')}' ({best['recompute']}) fits at {best['vs_golden']:+.1%}."
        return Match(0.6, evidence, config_patch=patch_for(best["recompute"]))
    return Match(0.6, evidence, config_patch={"command": "recompute-kit plan --config CONFIG"})


@rule(
    "RK034",
    "Uniform recompute with large groups: the backward peak",
    "activation_memory",
    symptom="Full uniform recompute with recompute_num_layers > 1 still OOMs, in backward",
    cause="Each group of N layers is recomputed at once in backward: its activations come "
    "back together (the recompute buffer)",
    confirm="recompute-kit estimate --recompute full:uniform:N full:uniform:1: compare "
    "peak_activation_bytes",
    fix="Use recompute_num_layers 1 with uniform",
    patch=patch_for("full:uniform:1"),
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/1226",),
)
def _uniform_groups(ctx: Context) -> Match | None:
    if ctx.granularity != "full" or ctx.cfg.get("recompute_method") != "uniform":
        return None
    n = ctx.cfg.get("recompute_num_layers") or 1
    if n <= 1 or not (ctx.oom or ctx.says("out of memory")):
        return None
    return Match(0.7, f"Groups of {n} layers are rematerialised together in backward.")


@rule(
    "RK035",
    "The OOM moved to another rank after enabling recompute",
    "activation_memory",
    symptom="After a recompute change the OOM appears on a different (pipeline) rank",
    cause="Pipeline stages hold different activation loads (the first stage keeps p "
    "micro-batches in flight); recompute per stage shifted the binding stage",
    confirm="Compare the ranks in the OOM messages before/after; recompute-kit estimate "
    "reports the first stage",
    fix="Use block recompute with more layers on the early stages, or rebalance layers "
    "(num_layers_in_first_pipeline_stage)",
    refs=("Megatron-Bridge perf-activation-recompute triage",),
)
def _moved_rank(ctx: Context) -> Match | None:
    pp = ctx.cfg.get("pipeline_model_parallel_size")
    if not isinstance(pp, int) or pp < 2:
        # no pipeline stages, or none the input says: ranks of one job (data-parallel
        # replicas, FSDP shards) simply all OOM at once; several ranks are no moved stage
        return None
    ranks = [o.rank for o in ctx.evidence.oom if o.rank is not None]
    if len(set(ranks)) < 2:
        return None
    world = ctx.cfg.get("world_size")
    if isinstance(world, int) and world >= pp and world % pp == 0:
        per_stage = world // pp  # Megatron's default order puts PP outermost (tp-cp-ep-dp-pp)
        if len({r // per_stage for r in ranks}) < 2:
            return None  # the ranks are of one pipeline stage
    n = ctx.cfg.get("recompute_num_layers") or 1
    return Match(
        0.55,
        f"OOMs were reported on ranks {sorted(set(ranks))}.",
        config_patch={
            "recompute_granularity": "full",
            "recompute_method": "block",
            "recompute_num_layers": n + 1,
        },
    )


_OPT_FRAME_RE = re.compile(
    r"optimizer|step\(|\bin step\b|reduce_scatter|finish_grad_sync|start_grad_sync"
    r"|allreduce_params|allreduce_gradients|exp_avg",
    re.I,
)
# In a pasted source line only code counts: a call or a state name, not the word in prose
_OPT_CODE_RE = re.compile(
    r"optimi[sz]er\.step\(|\.step\(\)|exp_avg|reduce_scatter|finish_grad_sync|start_grad_sync"
    r"|allreduce_params|allreduce_gradients"
)


@rule(
    "RK036",
    "The run gets farther but still OOMs: the peak moved past backward",
    "model_state_memory",
    symptom="A candidate survives more iterations/phases but still OOMs, in the optimizer "
    "step or gradient reduction",
    cause="Recompute lowered the activation peak; now gradient buffers and optimizer states bind",
    confirm="The traceback ends in optimizer.step / the distributed optimizer / grad sync",
    fix="Distributed optimizer, gradient buffer bucketing, or more data/pipeline parallelism",
    patch={"use_distributed_optimizer": True},
    refs=("Megatron-Bridge perf-activation-recompute triage",),
    supersedes=("RK005", "RK010", "RK087"),
)
def _optimizer_peak(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        if "out of memory" not in e.message.lower():
            continue
        # A frame (or a pasted source line) of the optimizer step / gradient sync; prose around
        # the OOM ("an identical train step") names no frame.
        where = next((f for f in reversed(e.frames) if _OPT_FRAME_RE.search(f)), None)
        if where is None:
            where = next((c for c in e.context if _OPT_CODE_RE.search(c)), None)
        if where is None:
            continue
        fix = None
        if is_megatron(ctx):
            patch: dict = {"use_distributed_optimizer": True}
        else:  # DeepSpeed / Hugging Face vocabulary: the next ZeRO stage shards more
            stage = zero_stage(ctx)
            nxt = min(3, (stage or 1) + 1)
            patch = {"zero_optimization": {"stage": nxt}}
            fix = (
                f"Shard more: ZeRO-{nxt} (zero_optimization.stage {nxt}) splits the optimizer "
                "states"
                + (" and weights" if nxt == 3 else " and gradients")
                + " over the GPUs; or offload the optimizer to CPU (offload_optimizer)"
            )
        return Match(
            0.75,
            f"The OOM happened in the optimizer step / gradient sync ('{where.strip()[:160]}'"
            + (f", innermost frame {e.frames[-1]}" if e.frames and e.frames[-1] != where else "")
            + ").",
            config_patch=patch,
            fix=fix,
        )
    return None


# --------------------------------------------------------------------------------------------
# RK560: recompute's cost, stated in words
# --------------------------------------------------------------------------------------------

# One extra forward in a backward that costs about two forwards: ~1.33x the step at most
_ONE_EXTRA_FORWARD = 1.4
_FEWER_LAYERS_RE = re.compile(r"interval|every\s+\d|num_layers|fewer layers|\blayers?\b", re.I)
_ATTENTION_RE = re.compile(r"attention|attn", re.I)


@rule(
    "RK560",
    "Recompute's cost, stated in words",
    "recompute_overhead",
    symptom="The paste says what recompute / activation checkpointing costs in time: 'a 3.75x "
    "slowdown', '~12% of GPU compute burned every step', 'from 4.25 to 3.00 second per "
    "step' when fewer layers are checkpointed",
    cause="Recompute re-runs the forward of every checkpointed block in the backward: full "
    "recompute of every layer adds about one forward pass (~1.3x the step); recomputing the "
    "attention, the most expensive op, costs the most for the least memory",
    confirm="Time a few steps with checkpointing on every layer, on every other layer and off "
    "(same batch); the step time falls with the number of recomputed layers",
    fix="Recompute less: selective recompute (save the attention output and the large "
    "matmuls, recompute the cheap element-wise ops), checkpoint fewer layers (a "
    "checkpointing interval / recompute_num_layers, only as many as the memory needs), or "
    "no recompute where the run fits without it",
    patch={"recompute_granularity": "selective"},
    supersedes=("RK170", "RK090"),
)
def _cost_in_words(ctx: Context) -> Match | None:
    costs = list(fact(ctx, "recompute_cost_prose") or [])
    if not costs or fact(ctx, "recompute_comparisons"):
        return None  # a table measures it: RK230 reads the table
    measured = [c for c in costs if c["ratio"]]
    worst = max(measured, key=lambda c: c["ratio"]) if measured else costs[0]
    lines = " ".join(c["line"] for c in costs)
    fewer = bool(_FEWER_LAYERS_RE.search(lines))  # every layer against fewer, not on vs off
    if fewer and not _ATTENTION_RE.search(lines):
        how = "checkpoint fewer layers (every other layer: a checkpointing interval of 2)"
        patch: dict = (
            {"recompute_granularity": "full", "recompute_method": "block"}
            if is_megatron(ctx)
            else {"gradient_checkpointing_interval": 2}
        )
    else:
        how = (
            "selective recompute that saves the attention output (recompute only the cheap "
            "ops, never the attention forward)"
        )
        patch = (
            {"recompute_granularity": "selective"}
            if is_megatron(ctx)
            else {"activation_checkpointing": "selective"}
        )
    beyond = ""
    if not worst["ratio"]:
        # slower, said without a number: time it before choosing how much to recompute
        return Match(
            0.55,
            f"The paste says checkpointing slows the run: '{worst['line'][:160]}' (no number). "
            "Full recompute costs about one extra forward (~1.3x the step); time a few steps "
            "with and without it.",
            config_patch=patch,
            fix=f"Recompute less: {how}; or turn checkpointing off where the run fits without "
            "it (a larger batch it frees can also pay the cost back)",
        )
    # A ratio of more checkpointed layers against fewer says nothing about blocks recomputed
    # twice; only an on / off ratio above one extra forward hints at it, and the paste does
    # not show the cause: say what to look for, not what happened
    if worst["ratio"] > _ONE_EXTRA_FORWARD and not fewer:
        beyond = (
            f" {worst['ratio']:g}x is more than one extra forward pass (~1.3x) costs: if it "
            "compares checkpointing on against off, look for blocks recomputed more than once "
            "(nested checkpoints, checkpointing with offload) or a small, memory-bound model "
            "— profile the backward."
        )
    against = " of checkpointing fewer layers" if fewer else ""
    return Match(
        0.75,
        f"The paste states recompute's cost: '{worst['line'][:160]}' "
        f"(about {worst['ratio']:g}x the step{against}).{beyond}",
        config_patch=patch,
        fix=f"Recompute less: {how}; or no recompute where the run fits without it",
    )


@rule(
    "RK700",
    "torch.compile's activation memory budget below 1: the partitioner recomputes for memory, "
    "and the run is slower",
    "recompute_overhead",
    symptom="torch._functorch.config.activation_memory_budget (or a framework's memory_budget "
    "for compile-based auto selective checkpointing) set below 1.0, and the paste says the run "
    "is slower or 'not optimal for speed'",
    cause="Below 1.0 the min-cut partitioner chooses what to save by a knapsack over memory: "
    "to meet the budget it recomputes ops in the backward it would otherwise save, matmuls "
    "included, and it prefers saving what the forward materialises anyway; the choice is "
    "by design memory-first, so a budget the run does not need costs speed",
    confirm="Time a few steps with the budget at 1.0 and at the value set (same batch); "
    "TORCH_COMPILE_DEBUG=1 / tlparse shows which ops the backward graph recomputes",
    fix="Raise activation_memory_budget toward 1.0 (the default: only cheap, fusible ops are "
    "recomputed) until the memory fits; for exact control use a selective checkpointing "
    "policy (create_selective_checkpoint_contexts with the matmuls MUST_SAVE) instead of the "
    "budget",
    patch={"activation_memory_budget": 1.0},
    refs=("https://pytorch.org/blog/activation-checkpointing-techniques/",),
    supersedes=("RK560",),
)
def _memory_budget_speed(ctx: Context) -> Match | None:
    budgets = fact(ctx, "memory_budget") or []
    speed = fact(ctx, "speed_prose") or []
    if not budgets or not speed or ctx.oom or fact(ctx, "grad_mismatch"):
        return None
    if any(e.kind == "exception" and e.type for e in ctx.evidence.errors):
        return None  # an error is the problem, not the speed
    line, budget = budgets[0]
    # a budget near 1 saves little memory for its recompute: back to 1.0; a low one, halfway
    target = 1.0 if budget >= 0.9 else round((budget + 1.0) / 2, 2)
    return Match(
        0.75,
        f"The code sets the partitioner's memory budget below 1 ('{line[:120]}') and the "
        f"paste says the run is slow ('{speed[0][:120]}'): under a budget of {budget:g} the "
        "partitioner recomputes ops in the backward to save memory, by design at the cost of "
        "speed.",
        config_patch={"activation_memory_budget": target},
        fix=f"Raise activation_memory_budget from {budget:g} to {target:g}"
        + (" (no budget: only cheap ops are recomputed)" if target == 1.0 else "")
        + " and time the steps; lower it only as far as the memory needs, or save the "
        "matmuls explicitly with a selective checkpointing policy",
    )
