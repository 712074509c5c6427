"""What pasted measurements say (facts from evidence/measured.py): a table setting runs with
and without recompute side by side (RK230 its cost, RK231 when it pays for itself), sizes that
equal a logits tensor (RK232), an OOM raised while a model is moved whole onto the GPU
(RK233), offload switched on while the memory report still shows the states on the GPU
(RK234); repeats and per-iteration runs that do not decide (RK237 within noise, RK238
confounded), with the measured slowdown set against the recompute FLOPs where a config gives
the model shape."""

from __future__ import annotations

from ..types import Context, Match
from .registry import all_frames, fact, gib, is_megatron, rule, zero_stage

_SLOWER = -0.05  # a recompute run 5% slower than its baseline is a cost worth naming
_SAME = -0.02  # within 2% (or faster) it costs nothing measurable


def _comparisons(ctx: Context) -> list[dict]:
    return list(fact(ctx, "recompute_comparisons") or [])


def _describe(c: dict) -> str:
    # `change` is the throughput's change; for a time column it is base / arm - 1, so the time
    # itself moved the other way (557 -> 1458 ms is time +161.7%, throughput -61.8%)
    if c["kind"] == "time" and c.get("base_value"):
        change = f"time {c['arm_value'] / c['base_value'] - 1:+.1%}, throughput {c['change']:+.1%}"
    else:
        change = f"throughput {c['change']:+.1%}"
    batch = ""
    if c.get("base_batch") and c.get("arm_batch"):
        batch = f" at batch {c['base_batch']:g} vs {c['arm_batch']:g}"
    return f"'{c['arm']}' {c['arm_value']:g} vs '{c['base']}' {c['base_value']:g} ({change}{batch})"


def _off_patch(c: dict) -> dict:
    """Recompute off at the batch the run without it already fits (when the table says it)."""
    patch: dict = {"recompute": False}
    if c.get("base_batch"):
        patch["batch_size"] = int(c["base_batch"])
    return patch


@rule(
    "RK230",
    "Measured: the run with recompute is slower than the one without",
    "recompute_overhead",
    symptom="A pasted table sets a run with recompute / activation checkpointing beside one "
    "without, and the recompute run's throughput is 5% or more lower (or its step time higher)",
    cause="Recompute re-runs the forward of every checkpointed block in the backward: full "
    "recompute adds about a third of the step's FLOPs, layer-wise checkpointing a large share; "
    "a larger batch in the freed memory rarely wins that back",
    confirm="Compare the two rows at the same batch size; the memory column shows what the "
    "recompute buys",
    fix="Recompute less: selective recompute of the cheap, memory-heavy ops instead of whole "
    "layers, or checkpoint only as many layers as the memory needs; where the run without "
    "recompute fits (the table's baseline), train without recompute",
    patch={"recompute_granularity": "selective"},
)
def _measured_overhead(ctx: Context) -> Match | None:
    slower = [c for c in _comparisons(ctx) if c["change"] <= _SLOWER]
    if not slower:
        return None
    worst = min(slower, key=lambda c: c["change"])
    full = "full" in worst["arm"].lower()
    if full or not worst.get("base_batch"):
        patch = (
            {"recompute_granularity": "selective"}
            if is_megatron(ctx) or full
            else {"activation_checkpointing": "selective"}
        )
        how = "selective recompute instead of full layers"
    else:
        patch = _off_patch(worst)
        how = f"without recompute at batch {int(worst['base_batch'])}, where the baseline fits"
    saved = ""
    if worst.get("base_memory") and worst.get("arm_memory"):
        saved = f" It buys memory {worst['base_memory']:g} -> {worst['arm_memory']:g}."
    return Match(
        0.8,
        f"The pasted table measures the cost: {_describe(worst)}.{saved}",
        config_patch=patch,
        fix=f"The recompute run is {-worst['change']:.0%} slower: train {how}, or recompute "
        "less (selective recompute of cheap ops, fewer checkpointed layers); keep recompute only "
        "where the run without it does not fit (disable recompute otherwise)",
    )


@rule(
    "RK231",
    "Measured: recompute costs nothing here and buys batch or memory",
    "informational",
    symptom="A pasted table shows the recompute run as fast as (or faster than) the one "
    "without, at a larger batch or lower memory",
    cause="Recomputing cheap element-wise ops (GeLU, dropout, norms) re-runs little compute; "
    "the memory it frees funds a larger batch that keeps the GPU busier",
    confirm="Same or higher throughput in the recompute column, larger max batch or lower "
    "peak memory",
    fix="Nothing to fix: keep this recompute setting and use its memory (larger batch or sequence)",
    patch={"recompute_granularity": "selective"},
)
def _measured_free(ctx: Context) -> Match | None:
    comparisons = _comparisons(ctx)
    if not comparisons or any(c["change"] <= _SLOWER for c in comparisons):
        return None
    gains = [
        c
        for c in comparisons
        if c["change"] >= _SAME
        and (
            (c.get("arm_batch") or 0) > (c.get("base_batch") or 0)
            or (c.get("arm_memory") or 0) < (c.get("base_memory") or 0)
        )
    ]
    if not gains:
        return None
    best = max(gains, key=lambda c: (c.get("arm_batch") or 0, c["change"]))
    patch = {"recompute": best["arm"]}
    if best.get("arm_batch"):
        patch["batch_size"] = int(best["arm_batch"])
    return Match(
        0.7,
        f"The pasted table: {_describe(best)}; no recompute run is 5% slower than its baseline.",
        config_patch=patch,
        fix=f"Keep '{best['arm']}' (selective recompute of cheap ops pays for itself) and "
        "spend the memory it frees on batch or sequence length",
    )


@rule(
    "RK232",
    "A measured size equals a logits tensor (tokens x vocabulary)",
    "logits_memory",
    symptom="A pasted size (a peak, an allocation) equals batch x sequence x vocabulary x 2 or "
    "4 bytes: the logits, or their fp32 copy, held whole",
    cause="The LM head's output is [tokens, vocab]: with a 128K-152K vocabulary it outgrows "
    "every activation of a layer, and an fp32 upcast for the softmax / log-probs doubles it",
    confirm="The size grows linearly with the sequence length and does not shrink with more "
    "recompute",
    fix="Compute the loss / log-probs in chunks of the sequence (a logprob or loss chunk size) "
    "with the fp32 cast inside the chunk, or a fused linear-cross-entropy kernel that never "
    "materialises the logits (Liger, cut-cross-entropy); keep only the logits needed",
    patch={"logprob_chunk_size": 1024},
    supersedes=("RK262",),  # the same logits, named (RK262) and here also sized
)
def _logits_size(ctx: Context) -> Match | None:
    sizes = list(fact(ctx, "logits_sizes") or [])
    if not sizes:
        return None
    top = max(sizes, key=lambda s: s["size"])
    width = "fp32" if top["bytes_per"] == 4 else "bf16/fp16"
    # a chunk that keeps the fp32 working set near 512 MiB
    chunk = max(256, min(4096, int(2**29 / (top["vocab"] * 4)) // 256 * 256 or 256))
    seq = f" at sequence {top['seq']}" if top.get("seq") else ""
    return Match(
        0.8,
        f"{gib(int(top['size']))}{seq} is {top['elements']:.3g} logits elements x "
        f"{top['bytes_per']:g} bytes ({width}, vocabulary {top['vocab']}): '{top['line']}'.",
        config_patch={"logprob_chunk_size": chunk, "defer_fp32_logits": True},
        fix=f"The logits ({width}) are held whole: chunk the log-prob / loss computation over "
        f"the sequence ({chunk} tokens bounds the fp32 working set to about "
        f"{gib(chunk * top['vocab'] * 4)}) with the fp32 cast inside each chunk, or use a fused "
        "linear-cross-entropy (use_liger_kernel; LLaMA-Factory enable_liger_kernel) / keep "
        "only the logits needed (logits_to_keep)",
    )


_MOVE_FRAMES = ("in convert", "t.to(device", "in _apply", ".cuda(", "module.to(", "model.to(")


@rule(
    "RK233",
    "OOM while the model is moved onto the GPU: the weights do not fit whole",
    "model_state_memory",
    symptom="The OOM is raised inside Module.to() / .cuda() (torch's `convert` / `_apply`), "
    "before any forward",
    cause="The whole model is materialised on each GPU before anything shards it: under "
    "ZeRO-3 a model built outside deepspeed.zero.Init (or loaded to the GPU and then "
    "partitioned) needs its full size on every rank first",
    confirm="The traceback ends in module.py convert/_apply; memory is full before training starts",
    fix="Build or load the model sharded: deepspeed.zero.Init() (HF: from_pretrained under a "
    "ZeRO-3 DeepSpeed config), load checkpoints with map_location='cpu', or a lower "
    "precision; each model of an RLHF setup needs this",
    patch={"zero_optimization": {"stage": 3}, "zero_init": True},
)
def _oom_moving_model(ctx: Context) -> Match | None:
    if ctx.oom is None and not fact(ctx, "oom_mentions"):
        return None
    frames = all_frames(ctx)
    if not any(f in frames for f in _MOVE_FRAMES):
        return None
    o = ctx.oom
    held = ""
    if o is not None and o.total_bytes and (o.allocated_bytes or o.reserved_bytes):
        held = (
            f" {gib(o.allocated_bytes or o.reserved_bytes)} of {gib(o.total_bytes)} is "
            "already taken while weights are still being moved."
        )
    stage = zero_stage(ctx)
    z3 = (
        stage == 3
        or "zero_stage 3" in " ".join(fact(ctx, "oom_mentions") or [])
        or any(
            "zero_stage 3" in line or "zero3" in line.lower()
            for line in (fact(ctx, "mentions") or [])
        )
    )
    words = "ZeRO-3 " if z3 else ""
    return Match(
        0.75,
        f"The OOM is raised inside Module.to() (the `convert` frame): the model itself is being "
        f"moved onto the GPU whole.{held}",
        config_patch={"zero_optimization": {"stage": 3}, "zero_init": True, "map_location": "cpu"},
        fix=f"Load the model {words}sharded instead of whole on each GPU: construct it under "
        "deepspeed.zero.Init() (HF from_pretrained with the ZeRO-3 config set), load state "
        "dicts with map_location='cpu', and load the frozen reference / reward models the same "
        "way",
    )


@rule(
    "RK234",
    "Offload is on, but the memory report still shows the states on the GPU",
    "framework_bug",
    symptom="Parameter / optimizer offload is switched on (or a log line says it ran), yet "
    "'memory allocated (GB)' stays at tens of GB at that point",
    cause="The offload did not move the tensors: FSDP2 parameters are DTensors whose "
    "`param.data.to('cpu')` is a no-op (offload needs FSDP2's CPUOffloadPolicy); under "
    "DeepSpeed ZeRO-3 the optimizer's param_groups can be empty, so offload code that walks "
    "them leaves Adam's exp_avg / exp_avg_sq on the GPU",
    confirm="Print torch.cuda.memory_allocated() right before and after the offload call: "
    "it does not drop",
    fix="Use the framework's own offload path (FSDP2: offload_policy / CPUOffloadPolicy; "
    "DeepSpeed: engine.offload_states(), or walk optimizer.state rather than param_groups) or "
    "upgrade the framework to a release that fixes it",
    patch={"offload_policy": True},
)
def _offload_not_effective(ctx: Context) -> Match | None:
    requested = list(fact(ctx, "offload_requested") or [])
    reports = [r for r in fact(ctx, "allocated_reports") or [] if r["gb"] >= 4]
    if not requested or not reports:
        return None
    r = max(reports, key=lambda r: r["gb"])
    keys = " ".join(requested)
    if "fsdp_config" in keys or "fsdp" in keys.lower():
        prefix = keys.split("fsdp_config")[0].split()[-1] if "fsdp_config" in keys else ""
        key = f"{prefix}fsdp_config.offload_policy" if prefix else "fsdp_config.offload_policy"
        patch = {key: True}
        how = (
            f"set {key}=True (FSDP2's CPUOffloadPolicy: FSDP2 drops the FSDP1 _offload_params "
            "path, and param.data.to('cpu') on its DTensors moves nothing), or upgrade verl"
        )
    else:
        patch = {"offload_states": "engine.offload_states()", "iterate": "optimizer.state"}
        how = (
            "walk optimizer.state (param_groups can be empty under ZeRO-3, so Adam's exp_avg / "
            "exp_avg_sq stay referenced on the GPU) or call DeepSpeed's "
            "engine.offload_states(); upgrade the framework (ms-swift, OpenRLHF) to a release "
            "that does this"
        )
    return Match(
        0.75,
        f"Offload is requested ('{requested[0]}') yet '{r['label']}' reports "
        f"{r['gb']:.2f} GB still allocated on the GPU.",
        config_patch=patch,
        fix=f"The offload is not taking effect: {how}; confirm with "
        "torch.cuda.memory_allocated() before/after the offload call",
    )


@rule(
    "RK235",
    "Measured: the allocator keeps far more reserved than allocated",
    "fragmentation",
    symptom="A pasted table reports reserved memory several GB above allocated memory (after a "
    "checkpoint load, an offload or a phase change)",
    cause="Freed blocks stay in PyTorch's caching allocator (and stale references keep some "
    "alive until the garbage collector runs): the next phase cannot use them for its own "
    "sizes and OOMs although the tensors it needs would fit",
    confirm="torch.cuda.memory_reserved() - memory_allocated() right after the load / offload; "
    "it falls after gc.collect(); torch.cuda.empty_cache()",
    fix="Drop the stale references, then gc.collect() and torch.cuda.empty_cache() after the "
    "load / offload; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    patch={"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
)
def _reserved_far_above_allocated(ctx: Context) -> Match | None:
    pairs = [
        p
        for p in fact(ctx, "reserved_vs_allocated") or []
        if p["reserved"] - p["allocated"] >= 2 * 2**30 and p["reserved"] >= 2 * p["allocated"]
    ]
    if not pairs:
        return None
    p = max(pairs, key=lambda p: p["reserved"] - p["allocated"])
    idle = int(p["reserved"] - p["allocated"])
    return Match(
        0.75,
        f"'{p['label']}' ({p['column']}): {gib(int(p['reserved']))} reserved vs "
        f"{gib(int(p['allocated']))} allocated: {gib(idle)} held by the caching allocator.",
        config_patch={
            "after_load": "gc.collect(); torch.cuda.empty_cache()",
            "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        },
        fix=f"Release the {gib(idle)} the allocator holds: drop stale references, then "
        "gc.collect() and torch.cuda.empty_cache() right after the load / offload; keep "
        "expandable_segments:True",
    )


_LOAD_FRAMES = ("load_checkpoint", "load_state_dict", "resume")
_FRAMEWORK_FILES = ("megatron/", "deepspeed/", "transformers/", "accelerate/", "lightning/")


@rule(
    "RK236",
    "OOM while a checkpoint's optimizer states are loaded onto the GPU",
    "framework_bug",
    symptom="The OOM (or a deepcopy) is raised inside optimizer.load_state_dict during the "
    "framework's checkpoint load, before the first step",
    cause="The framework loads the saved optimizer states (Adam's two fp32 moments) to the GPU "
    "and torch's Optimizer.load_state_dict deep-copies the state dict: for a moment the states "
    "exist twice on the GPU, on top of the model, although fresh training allocates them only "
    "at the first step",
    confirm="The traceback runs load_checkpoint -> optimizer.load_state_dict -> deepcopy; the "
    "same run without --load (or with fewer data-parallel ranks per shard) fits",
    fix="Load the checkpoint to CPU (torch.load(..., map_location='cpu')) and let "
    "load_state_dict move each state, or upgrade the framework (Megatron's distributed "
    "checkpointing loads optimizer shards in place)",
    patch={"map_location": "cpu"},
)
def _optimizer_load_oom(ctx: Context) -> Match | None:
    if ctx.oom is None and not fact(ctx, "oom_mentions"):
        return None
    frames = all_frames(ctx)
    if "load_state_dict" not in frames or not any(f in frames for f in _LOAD_FRAMES[:1]):
        return None
    if "optim" not in frames:
        return None
    where = next((f.rstrip("/") for f in _FRAMEWORK_FILES if f in frames), "the framework")
    copy = " and deep-copies the state dict" if "deepcopy" in frames else ""
    return Match(
        0.75,
        f"The traceback runs through {where}'s load_checkpoint into the optimizer's "
        f"load_state_dict{copy}: the saved optimizer states are materialised on the GPU at "
        "resume.",
        config_patch={"map_location": "cpu"},
        fix=f"Load the checkpoint's optimizer states to CPU (map_location='cpu') before "
        f"optimizer.load_state_dict, or upgrade {where} (upgrade megatron: distributed "
        "checkpointing loads optimizer shards in place)",
    )


# --------------------------------------------------------------------------------------------
# RK661: selective recompute said to run out of memory: full, uniform recompute is the step
# --------------------------------------------------------------------------------------------


@rule(
    "RK661",
    "Selective recompute still runs out of memory: recompute whole layers",
    "activation_memory",
    symptom="The paste says a run with selective recompute (attention / MoE / core-attention "
    "modules only) ran out of memory (OOM, 'exhausted memory', does not fit)",
    cause="Selective recompute drops only the cheap-to-recompute parts (attention scores, "
    "activation functions, MoE dispatch); each layer still keeps its inputs to the linear "
    "layers, so with long sequences, large micro-batches, vision tokens or a large "
    "cross-entropy workspace the live activations still exceed the GPU",
    confirm="Run the same step with recompute_granularity: full, recompute_method: uniform, "
    "recompute_num_layers: 1 and compare the peak (torch.cuda.max_memory_allocated); full "
    "recompute typically costs about a third more forward compute",
    fix="Full-layer uniform recompute, one decoder layer per recompute unit "
    "(recompute_granularity: full, recompute_method: uniform, recompute_num_layers: 1); "
    "raise recompute_num_layers (or use block) to buy back speed once it fits",
    patch={
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    },
    refs=("arXiv:2205.05198",),
    supersedes=("RK005", "RK087", "RK102", "RK010"),
)
def _selective_ooms(ctx: Context) -> Match | None:
    lines = fact(ctx, "selective_oom_prose") or []
    if not lines:
        return None
    if str(ctx.cfg.get("recompute_granularity", "selective")).lower() == "full":
        return None  # already full: the advice would repeat what is set
    said = next(
        (p for p in lines[0].split(". ") if "selective" in p.lower()), lines[0]
    )  # the sentence that says it, not the whole line
    return Match(
        0.7,
        f"The paste says selective recompute ran out of memory ('{said[:160]}'): the layers' "
        "inputs to the linear layers are still kept; recomputing whole layers frees them.",
    )


# --------------------------------------------------------------------------------------------
# RK237: repeated / per-iteration measurements that do not decide (evidence/experiments.py's
# aggregation, recompute_kit/runstats.py's statistics)
# --------------------------------------------------------------------------------------------


def measured_cost(ctx: Context, row: dict) -> str:
    """Whether the measured slowdown of an experiment row is what its recompute setting
    should cost (plan/measured_cost.py), where the evidence gives a model shape; "" else."""
    if ctx.config is None or not row.get("recompute"):
        return ""
    from ...plan.measured_cost import explain_slowdown, measured_time_change

    rows = [r for r in ctx.evidence.experiments if r.get("recompute")]
    summary = next((r["measured_summary"] for r in rows if r.get("measured_summary")), None)
    golden = summary["golden"] if summary else "none"
    base = next((r for r in rows if r["recompute"] == golden), None)
    if base is None or base is row:
        return ""
    change, read_from = measured_time_change(
        base.get("step_time_ms"),
        row.get("step_time_ms"),
        base.get("tflops_per_gpu"),
        row.get("tflops_per_gpu"),
    )
    said = explain_slowdown(ctx.config, str(row["recompute"]), str(golden), change, read_from)
    return f" Cost: {said['text']}." if said else ""


def _undecided(ctx: Context, confounded: bool) -> Match | None:
    """RK237 (within noise) and RK238 (confounded): the rows the one speed judgement
    (runstats.speed_verdict) leaves undecided, with what was shown and the re-run."""
    rows = [r for r in ctx.evidence.experiments if isinstance(r.get("measured"), dict)]
    summary = next((r["measured_summary"] for r in rows if r.get("measured_summary")), None)
    if not rows or summary is None:
        return None
    undecided = [
        r
        for r in rows
        if r.get("within_noise")
        and (r["measured"].get("comparison") or {}).get("change") is not None
        and bool((r["measured"].get("comparison") or {}).get("confounded")) == confounded
    ]
    if not undecided:
        return None
    shown = [c["note"] for c in summary.get("confounders") or []]
    outliers = [
        f"run {o['run']} of '{o['setting']}': {o['why']}"
        if o.get("why")
        else f"run {o['run']} of '{o['setting']}' is {o['off_by']:+.0%} from its other repeats"
        for o in summary.get("outliers") or []
    ]
    dropped = [
        f"run {d['run']} of '{d['setting']}': {d['why']}" for d in summary.get("dropped_runs") or []
    ]
    said = "; ".join(
        f"'{r.get('recompute') or r.get('name')}' vs '{summary['golden']}': "
        f"{r['measured']['comparison']['why']}"
        for r in undecided[:3]
    )
    extra = "".join(
        f" {label}: {'; '.join(items)}."
        for label, items in (("Confounders", shown), ("Outliers", outliers), ("Left out", dropped))
        if items
    )
    worst = min(undecided, key=lambda r: r["measured"]["comparison"]["change"])
    return Match(
        0.6 if confounded or len(undecided) == len(rows) - 1 else 0.5,
        f"The measurements do not decide: {said}.{extra}{measured_cost(ctx, worst)}",
        fix=f"No recompute change on this evidence: {summary['rerun']}",
    )


@rule(
    "RK237",
    "Measured: the difference is within noise; a re-run decides",
    "recompute_overhead",
    symptom="Repeated runs or per-iteration step times of two recompute settings differ by less "
    "than their spread, or by a single run's value that is within the contract's threshold",
    cause="Run-to-run and node-to-node variation (a slow node, a thermally throttled GPU, a "
    "profiler window, warm-up) can be as large as what recompute costs: a median of per-run "
    "medians taken over such runs decides nothing",
    confirm="Compare each setting's per-run medians and IQRs (warm-up and profiled iterations "
    "dropped): the bands overlap",
    fix="Re-run the settings interleaved (A B A B ..., at least 3 repeats each) on the same "
    "nodes, with the profiler off and the same global batch and sequence length, and compare "
    "per-iteration step times after warm-up",
)
def _measured_within_noise(ctx: Context) -> Match | None:
    return _undecided(ctx, confounded=False)


@rule(
    "RK238",
    "Measured: the runs differ in more than the recompute setting (confounded); a re-run decides",
    "recompute_overhead",
    symptom="The settings compared ran on different nodes / dates, under the profiler, at "
    "another batch, sequence or planned length, or with other printed arguments, one value "
    "per setting",
    cause="When everything that differs lines up with the recompute setting, the measured "
    "difference cannot be told apart from the node, the date or the other arguments, however "
    "large it is",
    confirm="The confounders shown: each setting saw one value of the field, and the values differ",
    fix="Re-run the settings interleaved (A B A B ..., at least 3 repeats each) on the same "
    "nodes, with the profiler off and the same global batch and sequence length, and compare "
    "per-iteration step times after warm-up",
)
def _measured_confounded(ctx: Context) -> Match | None:
    return _undecided(ctx, confounded=True)
