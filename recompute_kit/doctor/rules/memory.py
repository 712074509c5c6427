"""With a model shape or a traceback: which memory dominates (activations or model states; the
logits are rules/logits.py), and the next recompute step.
"""

from __future__ import annotations

import re

from ...config import ConfigError, format_spec, parse_spec
from ...memory.estimate import estimate
from ...plan import same_setting
from ...plan.levers import CLEARLY_FASTER
from ..types import Context, Match
from .general import ORPHAN
from .knob_advice import knob_advice
from .lever_patch import first_fitting_lever, lever_patch, lever_rows
from .model_states import (
    COMMON_GPU_BYTES,
    model_state_count,
    optimizer_shard_step,
    stated_gpu_bytes,
)
from .registry import (
    all_frames,
    before_first_step,
    candidate_patch,
    candidate_spec,
    fact,
    from_the_launcher,
    gib,
    is_megatron,
    moments_before_first_step,
    more_recompute_patch,
    next_step,
    oom_errors,
    oom_where,
    parse_spec_safe,
    patch_for,
    rule,
    tensor_parallel_patch,
    whole_layers_only,
    zero_stage,
)


@rule(
    "RK010",
    "Activations dominate: more recompute (or a smaller micro-batch) makes the rank fit",
    "activation_memory",
    symptom="OOM in training; the estimate puts activations above weights + gradients + "
    "optimizer states on the failing rank, or the current setting does not fit the GPU and a "
    "recompute setting does",
    cause="The current recompute setting keeps too many activations for this sequence "
    "length, micro-batch and parallel layout",
    confirm="recompute-kit estimate --config CONFIG --recompute CURRENT NEXT shows the peak "
    "per setting; recompute-kit plan --gpu-memory-gb X ranks what fits",
    fix="Apply the cheapest step that fits (config_patch): the next recompute setting, or a "
    "smaller micro-batch where that costs less (plan --levers prices both); the planner's "
    "choice when the GPU size is known",
    refs=("arXiv:2205.05198",),
    supersedes=("RK005",),
)
def _activations(ctx: Context) -> Match | None:
    e = ctx.estimate
    if e is None:
        return None
    seen = bool(ctx.oom or ctx.says("out of memory"))
    # No OOM pasted: the estimate above the GPU's memory is the OOM it predicts (a config
    # that fits is a plan, not a diagnosis).
    predicted = not seen and bool(ctx.gpu_bytes) and e.total_bytes > ctx.gpu_bytes
    if not (seen or predicted):
        return None
    if ctx.plan_error:
        return None  # even full recompute does not fit: rules/nothing_fits.py and RK012 say why
    state = e.model_state_bytes
    layers, edges = activation_split(e)
    dominate = e.peak_activation_bytes >= state
    # Activations need not dominate for recompute to be the fix: the planner says a
    # recompute setting fits where the current one does not.
    rescued = (
        ctx.best_keeping is not None
        and ctx.gpu_bytes is not None
        and e.total_bytes > ctx.gpu_bytes
        and ctx.best_keeping.estimate.recompute != e.recompute
    )
    if not (dominate or rescued):
        return None
    current = format_spec(parse_spec_safe(ctx))
    keeping = ctx.best_keeping
    run = parse_spec_safe(ctx)
    if keeping is not None and not keeping.offload and same_setting(keeping.recompute, run):
        return None  # the run's own setting fits by the estimate: more recompute is no answer
    spec, why = next_step(ctx)
    patch = patch_for(spec)
    if ctx.best_keeping is not None:
        spec, why = (
            candidate_spec(ctx.best_keeping),
            (
                "the planner's cheapest setting that fits"
                + (
                    " and keeps what the run recomputes"
                    if parse_spec_safe(ctx).recompute_granularity is not None
                    else ""
                )
                + f" ({ctx.best_keeping.estimate.recompute_flops_fraction:.1%} extra FLOPs)"
            ),
        )
        patch = candidate_patch(ctx.best_keeping)
        if ctx.best_keeping.offload:
            why += f", with activation offloading ({ctx.best_keeping.offload}): it fits only so"
    if whole_layers_only(ctx) and not spec.startswith("full"):
        # the Trainer (and NeMo-RL's DTensor path) checkpoint whole layers: no module choice
        spec, why = "full:uniform:1", "activation checkpointing of every layer (whole layers)"
        patch = patch_for(spec)
    if spec == current:
        return None  # already the most recompute there is: no step left (RK013 when nothing fits)
    if dominate:
        said = (
            f"Estimated per rank: activations peak at {gib(e.peak_activation_bytes)} vs "
            f"{gib(state)} of weights, gradients and optimizer states under '{current}'"
            f" ({gib(layers)} in the transformer layers, which recompute acts on; "
            f"{gib(edges)} in the embedding, logits, loss and backward's working memory, which "
            "it does not touch)."
        )
    else:
        said = (
            f"Estimated per rank under '{current}': {gib(e.total_bytes)} ({gib(state)} of "
            f"weights, gradients and optimizer states, activations peaking at "
            f"{gib(e.peak_activation_bytes)}) against the {gib(ctx.gpu_bytes)} GPU; "
            f"recompute closes the gap."
        )
    moments = moments_before_first_step(ctx)
    if moments:
        said += (
            f" The log shows no finished iteration: if the OOM came before the first optimizer "
            f"step, Adam's moments ({gib(moments)}) did not exist yet, and the states held "
            f"{gib(state - moments)} at the failure."
        )
    if predicted:
        said += (
            f" No OOM was pasted: the estimate's {gib(e.total_bytes)} exceeds the "
            f"{gib(ctx.gpu_bytes)} GPU, so the run would run out of memory."
        )
    # the logits (recompute does not touch them) outweigh the layers: RK012's lever leads
    conf = 0.85 if dominate else 0.75
    if edges > layers:
        conf -= 0.35
    elif predicted:
        conf -= 0.15  # a prediction by the estimate, not an OOM seen
    m = ctx.config.model
    if (
        m.loss_implementation == "torchtitan"
        and m.num_moe_experts
        and ctx.config.recompute.recompute_granularity == "selective"
    ):
        # torchtitan's per-op policy on MoE blocks is counted as Megatron's whole-MoE-layer
        # recompute (sources/torchtitan_defaults.op_sac_modules): approximate there
        conf -= 0.15
        said += (
            " (torchtitan's per-op selective AC on MoE blocks is counted approximately: "
            "measure the peak before relying on the margin.)"
        )
    step = f"'{spec}' - {why}"
    cheaper = _cheaper_micro_batch(ctx)
    if cheaper is not None:
        # the micro-batch alone fits at a lower step time than the recompute pick (a one-key
        # change that keeps the run's recompute and global batch): it leads, recompute after
        patch, words = lever_patch(ctx, cheaper)
        step = f"{words}; else {step}"
    return Match(conf, f"{said} Next: {step}.", config_patch=patch)


def _cheaper_micro_batch(ctx: Context):
    """The largest micro-batch `plan --levers` prices that fits, clears the band and keeps the
    run's own recompute, where its step is shorter than the recompute pick's (None otherwise)."""
    rows = lever_rows(ctx)
    pick = next((r for r in rows if r.lever == "recompute"), None)
    own = ctx.config.recompute.spec
    batches = [
        r
        for r in rows
        if r.lever == "micro-batch"
        and r.fits
        and r.clears_band
        and r.estimate.recompute == own
        and (pick is None or not pick.fits or r.step.seconds < CLEARLY_FASTER * pick.step.seconds)
    ]
    return max(batches, key=lambda r: r.config.model.micro_batch_size, default=None)


def activation_split(e) -> tuple[float, float]:
    """(the transformer layers' activations, the rest of the activation peak: embedding,
    output layer, logits and loss, backward's transients) per rank, by the estimate's split:
    recompute frees only the first."""
    layers = e.per_layer_activation_bytes * len(e.layers) * e.micro_batches_in_flight
    layers = min(layers, e.peak_activation_bytes)
    return layers, e.peak_activation_bytes - layers


TERMS = {
    "states": "weights, gradients and optimizer states",
    "layers": "the layers' saved inputs",
    "edges": "the embedding, logits, loss and backward's working memory",
}


def full_recompute_terms(ctx: Context) -> dict[str, float] | None:
    """The smallest candidate's terms on the OOM's stage (full recompute of every layer, or the
    planner's smallest where Megatron refuses full recompute for this run), when the planner
    found nothing that fits; None otherwise."""
    if not ctx.plan_error or ctx.config is None:
        return None
    cfg = ctx.config
    full = cfg.__class__(cfg.model, cfg.parallel, parse_spec("full:uniform:1"), cfg.assumptions)
    if ctx.full_refused and ctx.plan_smallest is not None:
        full = ctx.plan_smallest.config(cfg)
    try:
        e = estimate(full, stage=ctx.oom_stage)
    except (ConfigError, ValueError, ZeroDivisionError):
        return None
    layers, edges = activation_split(e)
    return {
        "states": e.model_state_bytes,
        "layers": layers,
        "edges": edges,
    }


def largest_at_full_recompute(ctx: Context) -> tuple[str, str] | None:
    """(the largest term's key, a sentence naming the terms) when nothing fits."""
    terms = full_recompute_terms(ctx)
    if terms is None:
        return None
    key = max(terms, key=terms.get)
    if ctx.full_refused and ctx.plan_smallest is not None:  # (the plan's error says why)
        names = {**TERMS, "layers": "the layers' activations"}
        parts = ", ".join(f"{names[k]} {gib(v)}" for k, v in terms.items())
        return key, f"With the smallest candidate the largest term is {names[key]} ({parts})."
    parts = ", ".join(f"{TERMS[k]} {gib(v)}" for k, v in terms.items())
    return key, f"With full recompute of every layer its largest term is {TERMS[key]} ({parts})."


_MODEL_STATES_FIX = (
    "Shard the model states further (Megatron's distributed optimizer, DeepSpeed ZeRO-3, "
    "FSDP), offload the optimizer states to the CPU, or add model parallelism; recompute only "
    "reduces activations"
)


@rule(
    "RK011",
    "Model states dominate: recompute cannot fix this",
    "model_state_memory",
    symptom="OOM; weights + gradients + optimizer states alone take most of the GPU",
    cause="Too few ranks share the parameters and optimizer states",
    confirm="recompute-kit estimate --config CONFIG shows weights_bytes, grads_bytes and "
    "optimizer_bytes per rank",
    fix=_MODEL_STATES_FIX,
    patch={"use_distributed_optimizer": True},
    supersedes=("RK005",),
)
def _model_states(ctx: Context) -> Match | None:
    e = ctx.estimate
    if e is None:
        return None
    state = e.model_state_bytes
    gpu = ctx.gpu_bytes
    if not gpu and state >= COMMON_GPU_BYTES:  # no GPU size given: above any common GPU
        gpu = COMMON_GPU_BYTES
    if not gpu:
        return None
    share = state / gpu
    if share < 0.6:
        return None
    # When the whole estimate fits, model states explain the memory but not the OOM; when
    # nothing fits, they lead only if they are the largest term left at full recompute.
    explains_oom = e.total_bytes > 0.95 * gpu
    largest = largest_at_full_recompute(ctx)
    if largest is not None and largest[0] != "states":
        explains_oom = False
    row = first_fitting_lever(ctx) if explains_oom else None
    if row is not None and row.lever == "recompute":
        return None  # recompute makes the rank fit: this reading's premise does not hold
    said = (
        f"Weights {gib(e.weights_bytes)}, gradients {gib(e.grads_bytes)} and optimizer "
        f"states {gib(e.optimizer_bytes)} already take {share:.0%} of the "
        f"{gib(gpu)} GPU."
        if ctx.gpu_bytes
        else f"Weights {gib(e.weights_bytes)}, gradients {gib(e.grads_bytes)} and optimizer "
        f"states {gib(e.optimizer_bytes)} per rank ({gib(state)}) are more than the "
        f"{gib(gpu)} of an A100/H100 (no input gives the GPU's size)."
    )
    conf = (0.85 if explains_oom else 0.5) if ctx.oom else 0.45
    moments = moments_before_first_step(ctx) if not ctx.oom else 0
    if moments:  # (with an OOM's figures, the check below says it from them)
        said += (
            f" The paste places the OOM at the first step: Adam's moments ({gib(moments)}) "
            f"are made at the first optimizer step, so {gib(state - moments)} of states were "
            f"there ({(state - moments) / gpu:.0%} of the GPU)."
        )
    oom = ctx.oom
    if oom and oom.allocated_bytes and state > oom.allocated_bytes + (oom.requested_bytes or 0):
        # the OOM's own figure is below the states: they were not all there yet (Adam's are
        # made at the first optimizer step) or the estimate assumes more than the run holds
        conf = min(conf, 0.6)
        said += (
            f" The OOM's own figures ({gib(oom.allocated_bytes)} allocated) are below them: "
            "they were not all on the GPU when it failed (Adam's moments are made at the "
            "first optimizer step; the weights, gradients and any fp32 master copy exist from "
            "setup), so the run fails there if not before."
        )
    patch, words = lever_patch(ctx) if explains_oom else ({}, "")
    sharded = sharded_already(ctx)
    base = sharded or _MODEL_STATES_FIX
    fix = base if not words else f"{base}; {words}"
    if sharded and not words:  # no patch: what the rule's default sets is on already
        return Match(conf, said, config_patch={}, fix=fix)
    if not words and not is_megatron(ctx):
        # the rule's default (Megatron's distributed optimizer) is no key of this run: its
        # own next sharding step (ZeRO's next stage) instead
        patch, words = optimizer_shard_step(ctx)
        return Match(conf, said, config_patch=patch, fix=f"{fix}; {words}")
    return Match(conf, said, config_patch=patch if words else None, fix=fix)


def sharded_already(ctx: Context) -> str:
    """The fix in words where the run shards its model states over data parallelism already
    (ZeRO-3 / FSDP, or ZeRO-1/2 or Megatron's distributed optimizer for the optimizer): what is
    left; empty where it does not."""
    from ...memory.model_states import sharding_mode

    p = ctx.config.parallel
    mode = sharding_mode(ctx.config)
    # dense states shard over data x context parallelism (Megatron's distributed optimizer and
    # FSDP); DeepSpeed has no context parallelism
    dp = p.data_parallel_size * (1 if mode == "zero" else p.context_parallel_size)
    ranks = "data-parallel" if dp == p.data_parallel_size else "data x context-parallel"
    sharding = (mode == "zero" and p.zero_stage >= 1) or (
        mode == "megatron" and p.use_distributed_optimizer
    )
    if sharding and dp == 1:
        what = f"ZeRO stage {p.zero_stage}" if mode == "zero" else "the distributed optimizer"
        sources = (ctx.evidence.read or {}).get("sources") or {}
        assumed = (sources.get("data_parallel_size") or {}).get("from") == "assumed"
        one = "if there is one, as assumed" if assumed else "there is one"
        return (
            f"The run shards its model states with {what}, which splits them over the "
            f"{ranks} ranks: {one}, so nothing is sharded. More data-parallel ranks "
            "(more GPUs at this model parallelism), or fewer GPUs spent on model parallelism, "
            "or offload the optimizer states to the CPU; recompute only reduces activations"
        )
    if mode in ("zero", "megatron_fsdp", "fsdp2") and p.zero_stage == 3:
        # (mode "zero" is also torch FSDP1's: an Accelerate fsdp_config or the Trainer's fsdp)
        stage = ((ctx.evidence.read or {}).get("sources") or {}).get("zero_stage") or {}
        fsdp1 = str(stage.get("note", "")).startswith("FSDP")
        name = {
            "zero": "FSDP FULL_SHARD" if fsdp1 else "DeepSpeed ZeRO-3",
            "megatron_fsdp": "Megatron-FSDP",
            "fsdp2": "FSDP",
        }
        return (
            f"The model states are sharded already ({name[mode]} over {dp} {ranks} "
            "ranks): more GPUs share them, or offload the optimizer states (and parameters) "
            "to the CPU; recompute only reduces activations"
        )
    if mode == "megatron" and p.use_distributed_optimizer:
        return (
            f"The optimizer states are sharded already (the distributed optimizer over {dp} "
            f"{ranks} ranks): add model parallelism (tensor, pipeline, expert) or more "
            "data-parallel ranks, or offload the optimizer states; recompute only reduces "
            "activations"
        )
    return ""


_BACKWARD_FRAME = re.compile(r"\bin (?:backward|_engine_run_backward|run_backward)\b|\.backward\(")
BUILD_WORDS = (
    "build_module",
    "__init__",
    "build_model",
    "get_model",
    "from_pretrained",
    "load_state_dict",
    "model_provider",
    "provide(",
)


# Calls that load or place a model's weights, as a traceback's source line or a quoted line
LOAD_CALLS = ("from_pretrained(", "load_state_dict(", "torch.load(", "load_checkpoint(")
# from_pretrained(..., device_map="auto").cuda(): the dispatched layers all moved to one GPU
_DISPATCH_THEN_MOVE_RE = re.compile(
    r"device_map\s*=\s*['\"]auto['\"][^\n]*\)\s*\.\s*(?:cuda\(|to\(\s*['\"]?cuda)"
)


@rule(
    "RK017",
    "The OOM happens while building or loading the model",
    "model_state_memory",
    symptom="CUDA OOM raised from module constructors (build_module, __init__, "
    "from_pretrained, load_state_dict) before training starts, or a paste that says the OOM "
    "comes when the model is loaded (a traceback cut before its exception line inside the "
    "load: possible only, at low confidence)",
    cause="The weights alone do not fit the GPU(s) at this parallel layout and precision; "
    "activations and recompute are not involved yet",
    confirm="The traceback's frames (or the failing source line) are model construction or "
    "loading; no iteration line was printed",
    fix="More tensor/pipeline/expert parallelism, FSDP, or a smaller model per GPU; for a "
    "loaded checkpoint, half precision or quantized weights (8-bit / 4-bit) and "
    "device_map='auto' across GPUs",
    supersedes=("RK005", "RK001", "RK010", "RK102"),
    patch={"use_distributed_optimizer": True},
)
def _oom_at_build(ctx: Context) -> Match | None:
    if ctx.evidence.iterations:
        return None
    for e in oom_errors(ctx):
        # the functions and source lines, not the files' paths (torch/autograd/__init__.py
        # holds backward); a backward in the frames is a step, not construction
        tail = re.sub(r'file "[^"]*"', "", " ".join(e.frames[-6:]).lower())
        if _BACKWARD_FRAME.search(tail):
            continue
        if any(w in tail for w in BUILD_WORDS):
            tp, words = tensor_parallel_patch(ctx)
            return Match(
                0.85,
                f"The OOM is raised while constructing the model "
                f"('{e.frames[-1] if e.frames else ''}').",
                config_patch={**tp, "use_distributed_optimizer": True},
                fix="More tensor/pipeline/expert parallelism, FSDP, or a smaller model per GPU; "
                f"{words}",
            )
    if not (ctx.oom or oom_errors(ctx)):
        return _cut_while_loading(ctx)
    frames = fact(ctx, "frame_code") or []
    line = frames[-1][1] if frames else ""
    said = ""
    if not any(call in line for call in LOAD_CALLS):  # the failing source line is no load
        prose = fact(ctx, "load_prose") or []
        loads = fact(ctx, "load_lines") or []
        models = [q for q in loads if not re.search(r"tokeni[sz]er|processor", q, re.I)]
        line = next((q for q in loads if _DISPATCH_THEN_MOVE_RE.search(q)), "")
        line = line or next(iter(models), "")
        fit = fact(ctx, "load_fit_prose") or []
        if fit and not line and not fact(ctx, "training_prose"):
            # no load call pasted, but the prose asks whether the GPU can hold the model's
            # weights at load: the weights, not activations
            return Match(
                0.7,
                f"The paste says the OOM comes loading the model ('{fit[0][:120]}'): the "
                "weights do not fit this GPU at this precision.",
                config_patch={"load_in_8bit": True, "device_map": "auto"},
                fix="Load fewer bytes per GPU: quantized weights (load_in_8bit / load_in_4bit), "
                "half precision if it loads in fp32, device_map='auto' over several GPUs, "
                "or a smaller model",
            )
        if not (prose and line):
            return None
        said = f"The paste says the OOM comes at the load ('{prose[0].strip()[:120]}'). "
    line = " ".join(line.strip().strip("`").split())
    if _DISPATCH_THEN_MOVE_RE.search(line):
        return Match(
            0.85,
            f"{said}`{line[:160]}`: .cuda() / .to('cuda') after device_map='auto' moves every "
            "layer the map spread over the GPUs back onto one GPU.",
            config_patch={"code": "from_pretrained(..., device_map='auto')  # no .cuda() after"},
            fix="Drop the .cuda() / .to('cuda') after from_pretrained(device_map='auto'): the map "
            "already placed the layers; if one GPU must hold it, load in half precision or "
            "quantized (load_in_8bit / 4-bit)",
        )
    return Match(
        0.8,
        f"{said}The OOM is raised while the weights are loaded (`{line[:160]}`): the model "
        "does not fit this GPU at this precision.",
        config_patch={"torch_dtype": "bfloat16", "load_in_4bit": True, "device_map": "auto"},
        fix="Load fewer bytes per GPU: half precision if it loads in fp32, quantized weights "
        "(load_in_8bit / load_in_4bit, a published Int4 / GPTQ checkpoint), device_map='auto' "
        "over several GPUs, or a smaller model",
    )


_LOAD_FRAME_RE = re.compile(
    r"\bin (?:from_pretrained|_load_pretrained_model|load_state_dict|load_model)\b"
)


def _cut_while_loading(ctx: Context) -> Match | None:
    """A traceback cut before its exception line (only the launcher's "a rank failed" after
    it) whose innermost frames load the model: it does not say the failure is an OOM, so the
    load's memory is one possible reading, at low confidence, until the exception line says."""
    events = [e for e in ctx.evidence.errors if e.kind == "exception"]
    cut = [e for e in events if e.message == ORPHAN]
    said = [e for e in events if e.message != ORPHAN]
    if not cut or not all(from_the_launcher(e) for e in said):
        return None
    for e in cut:
        tail = " ".join(e.frames[-4:])
        if e.frames and _LOAD_FRAME_RE.search(tail) and not _BACKWARD_FRAME.search(tail):
            where = e.frames[-1].rsplit("/", 1)[-1]
            return Match(
                0.35,
                f"A traceback is cut before its exception line inside the model's load "
                f"({where}), before any step: if that exception is the OOM, the weights do not "
                "fit this GPU at this layout and precision. Paste the exception line to decide.",
                config_patch=None,
                fix="Paste the exception line; if it is the OOM: load fewer bytes per GPU "
                "(half precision, quantized weights, a sharded load: ZeRO-3 / FSDP / "
                "device_map over several GPUs) or a larger GPU",
            )
    return None


OFF_KEYS = (
    "gradient_checkpointing",
    "activation_checkpointing",
    "use_gradient_checkpointing",
    "enable_gradient_checkpointing",
    "recompute",
)


@rule(
    "RK014",
    "OOM with activation checkpointing switched off",
    "activation_memory",
    symptom="CUDA OOM in training while the config turns gradient/activation checkpointing "
    "off (gradient_checkpointing: false, activation_checkpointing: false)",
    cause="Every layer keeps all its activations; they grow with sequence length x batch",
    confirm="Turn checkpointing on for one run (or halve the sequence) and compare the peak",
    fix="Enable activation checkpointing (Hugging Face: gradient_checkpointing=True with "
    "use_reentrant=False; Megatron: recompute_granularity selective, then full)",
    patch={"gradient_checkpointing": True},
    supersedes=("RK005",),
)
def _checkpointing_off(ctx: Context) -> Match | None:
    if not (ctx.oom or oom_errors(ctx)) or before_first_step(ctx):
        return None  # (at setup there are no activations for checkpointing to save)
    for key, value in ctx.cfg.items():
        name = key.rsplit(".", 1)[-1]
        # a switch that turns it off by its own name (LLaMA-Factory's
        # disable_gradient_checkpointing: true) says the same as gradient_checkpointing: false
        inverted = name.removeprefix("disable_").removeprefix("no_")
        off = value is False or (value is True and inverted != name)
        if off and any(inverted == k or inverted.startswith(k) for k in OFF_KEYS):
            said = "false" if value is False else "true"
            return Match(0.75, f"The config sets {key} = {said} and training ran out of memory.")
    return None


@rule(
    "RK015",
    "Experiments: selective recompute OOMs, full recompute fits",
    "activation_memory",
    symptom="In the experiments, the selective settings run out of memory and a full "
    "recompute setting does not",
    cause="Activations dominate; the selective modules tried do not cover the binding tensors",
    confirm="The experiments table: OOM rows are selective, passing rows full",
    fix="Keep full recompute with the fewest layers that fit (full:block:N, rising N), or the "
    "selective module that holds the memory (mlp / moe / mla_up_proj)",
    supersedes=("RK011",),
)
def _selective_oom_full_ok(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    bad = [
        r for r in rows if r.get("oom") and str(r.get("recompute") or "").startswith("selective")
    ]
    good = [
        r for r in rows if not r.get("oom") and str(r.get("recompute") or "").startswith("full")
    ]
    if not (bad and good):
        return None
    return Match(
        0.85,
        f"'{bad[0].get('name')}' ({bad[0]['recompute']}) runs out of memory; "
        f"'{good[0].get('name')}' ({good[0]['recompute']}) fits.",
        config_patch=patch_for(good[0]["recompute"]),
    )


EVAL_WORDS = (
    " in validate",
    " in evaluate",
    " in evaluation_loop",
    " in prediction_step",
    " in eval",
    " in generate",
    " in predict",
)


# Evaluation loops a trainer runs itself, under no_grad (Lightning here; the Hugging Face
# Trainer's, which gathers every batch's logits, is RK621's: rules/logits.py)
_MANAGED_EVAL_FRAMES = ("lightning/pytorch/loops", "pytorch_lightning/")
HF_EVAL_FRAMES = ("transformers/trainer.py",)
# a managed-loop line (evidence/code.py) that is the Hugging Face Trainer's or LLaMA-Factory's
HF_EVAL_LINE = re.compile(r"transformers/trainer\.py|llama-?factory", re.I)


@rule(
    "RK086",
    "The OOM happens in evaluation without torch.no_grad",
    "activation_memory",
    symptom="The OOM traceback runs through a validate / evaluate / generate function and no "
    "backward; or the paste says the memory jumps or the OOM comes in validation / evaluation "
    "and shows no torch.no_grad",
    cause="Without torch.no_grad() (or inference_mode) the forward keeps every activation for "
    "a backward that never comes; outputs kept across batches pin their graphs too",
    confirm="Wrap the loop in torch.no_grad(); the memory reports during evaluation fall",
    fix="Run evaluation under torch.no_grad() / torch.inference_mode() and keep only detached "
    "outputs (Hugging Face Trainer: eval_accumulation_steps, prediction_loss_only)",
    patch={"code": "with torch.no_grad():  # around the evaluation loop"},
    supersedes=("RK005", "RK087", "RK266"),
)
def _oom_in_eval(ctx: Context) -> Match | None:
    mentions = fact(ctx, "oom_mentions")
    if not (ctx.oom or oom_errors(ctx) or mentions):
        return None
    where = " " + oom_where(ctx)
    if not oom_errors(ctx):  # frames cut off the exception line: the paste's frames
        where += " " + all_frames(ctx)
    hit = next((w for w in EVAL_WORDS if w in where), None)
    if hit is not None and "backward" not in where:
        frames = all_frames(ctx)
        if any(t in frames for t in HF_EVAL_FRAMES):
            return None  # the Trainer's own loop: RK621
        if any(t in frames for t in _MANAGED_EVAL_FRAMES):
            # the Trainer's / Lightning's own loop, already under no_grad: what it gathers
            # across batches fills the GPU (the Trainer keeps every batch's predictions there
            # until eval_accumulation_steps moves them)
            return Match(
                0.6,
                f"The OOM is raised under '{hit.strip()}' in the trainer's own evaluation loop, "
                "which runs under no_grad: what it keeps across batches (every batch's "
                "predictions / logits, gathered on the GPU) is what fills it.",
                fix="Lightning: return only detached scalars from validation_step (not the "
                "outputs); a smaller validation batch",
                config_patch={},
            )
        return Match(
            0.8,
            f"The OOM is raised under '{hit.strip()}' with no backward in the traceback: the "
            "evaluation forward keeps its autograd graph.",
        )
    # Prose: the memory jumps / the OOM comes in validation, and no no_grad is shown.
    prose = fact(ctx, "eval_memory_prose")
    if not prose or fact(ctx, "no_grad_code") or "backward" in where:
        return None
    managed = fact(ctx, "managed_eval_loop")
    if managed and any(HF_EVAL_LINE.search(line) for line in managed):
        return None  # the Trainer's own loop: RK621
    if managed:
        # Lightning / the Trainer run evaluation under no_grad themselves: not showing it
        # says nothing; what grows there is what the loop keeps across batches
        return Match(
            0.35,
            f"The paste places the memory problem in evaluation ('{prose[0]}'), in a loop the "
            f"trainer runs itself under no_grad ('{managed[0]}'): what the evaluation keeps "
            "across batches (predictions, logits, generated sequences) is the likelier cause.",
            fix="Keep less per evaluation batch: Hugging Face Trainer eval_accumulation_steps "
            "or prediction_loss_only, shorter generation (max new tokens, beams), a smaller "
            "evaluation batch; Lightning: return only detached scalars from validation_step",
            config_patch={},  # no_grad is already there: wrapping the loop again does nothing
        )
    return Match(
        0.65,
        f"The paste places the memory problem in evaluation ('{prose[0]}') and shows no "
        "torch.no_grad(): the evaluation forward keeps its autograd graph.",
    )


@rule(
    "RK087",
    "Training OOM without a model shape: activations are the first lever",
    "activation_memory",
    symptom="An out-of-memory error in training, with no config, memory breakdown or "
    "traceback that points elsewhere",
    cause="In LLM training the activations (growing with micro-batch x sequence length) are "
    "the term that recompute, batch and sequence control; weights and optimizer states "
    "are fixed by the model and the sharding",
    confirm="Halve micro_batch_size or seq_length for one run: if the peak falls by about a "
    "third or more, activations dominate",
    fix="Turn on (more) activation recompute; if it is on, halve micro_batch_size (or "
    "seq_length / max_length, packing size) and keep the global batch with gradient "
    "accumulation",
    patch={"gradient_checkpointing": True},
)
def _training_oom(ctx: Context) -> Match | None:
    oom = ctx.oom
    if not (oom or oom_errors(ctx)):
        return None
    if ctx.estimate is not None:
        return None  # a model shape was given: the estimate's rules say which memory dominates
    if oom and oom.free_bytes and oom.requested_bytes and oom.free_bytes >= oom.requested_bytes:
        return None  # the device had room for the request: not a matter of what training keeps
    count = model_state_count(ctx)
    if count is not None and not count.lora:
        gpu = stated_gpu_bytes(ctx) or COMMON_GPU_BYTES
        if count.per_gpu >= 0.5 * gpu:
            return None  # a full fine-tune whose counted states take half the GPU: RK101/RK171
    patch, words = more_recompute_patch(ctx)
    mbs = ctx.cfg.get("micro_batch_size")
    if isinstance(mbs, int) and mbs > 1:
        patch = {**patch, "micro_batch_size": mbs // 2}
    advice = knob_advice(ctx)
    numbers = ""
    if oom and oom.requested_bytes:
        numbers = f"The failed request is {gib(oom.requested_bytes)}"
        if oom.total_bytes and oom.free_bytes is not None:
            numbers += f" with {gib(oom.free_bytes)} free of {gib(oom.total_bytes)}"
        numbers += ". "
    where = oom_where(ctx)
    if "checkpoint" in where and "backward" in where:
        numbers += "It is raised in the backward's recompute of a checkpointed unit. "
    elif "backward" in where:
        numbers += "It is raised in the backward pass. "
    if advice is not None:  # the paste sets memory knobs: name them, patch them
        return Match(
            0.3,
            f"{numbers}Next step: {advice.steps[0]}.{advice.says()}",
            config_patch=advice.patch,
            fix=advice.fix("RK087"),
        )
    return Match(
        0.3,
        f"{numbers}Next step: {words}; or halve micro_batch_size / seq_length (activations "
        "scale linearly with both).",
        config_patch=patch,
    )


@rule(
    "RK088",
    "Per-step peaks far above the memory at rest: activations",
    "activation_memory",
    symptom="Per-step memory lines (alloc=... peak=..., MaxMemAllocated) show peaks several "
    "times the memory held between steps, near the GPU's size",
    cause="What is allocated between steps is weights, gradients and optimizer states; the "
    "rest of each step's peak is activations kept for the backward",
    confirm="peak - alloc is the activation term; it scales with micro-batch x sequence",
    fix="Turn on activation checkpointing (or more recompute); it keeps about one input per "
    "layer instead of every intermediate",
    patch={"gradient_checkpointing": True},
    supersedes=("RK087", "RK005"),
)
def _step_peaks(ctx: Context) -> Match | None:
    rows = [
        m
        for m in ctx.evidence.memory
        if m.source == "step-peak" and m.allocated_bytes and m.max_allocated_bytes
    ]
    if not rows:
        return None
    top = max(rows, key=lambda m: m.max_allocated_bytes)
    rest, peak = top.allocated_bytes, top.max_allocated_bytes
    if peak < 3 * rest:
        return None
    patch, words = more_recompute_patch(ctx)
    # the config's own switch, under its own (dotted) name: NeMo-RL's
    # policy.dtensor_cfg.activation_checkpointing is no bare activation_checkpointing
    # (of the section the run enables, where the config has one per backend)
    owns = [k for k in ctx.cfg if k.endswith("activation_checkpointing")]
    enabled = [k for k in owns if ctx.cfg.get(k.rsplit(".", 1)[0] + ".enabled") is True]
    own = (enabled or owns or [None])[0]
    if own is not None:
        patch = {own: True}
    return Match(
        0.8,
        f"Steps peak at {gib(peak)} while {gib(rest)} is held between steps: about "
        f"{gib(peak - rest)} per step is activations. Next step: {words}.",
        config_patch=patch,
    )


@rule(
    "RK691",
    "ZeRO-3 / FSDP / offload on, but the whole model is put on the GPU before it is sharded",
    "model_state_memory",
    symptom="An OOM with ZeRO-3, FSDP or offload named, and the paste shows (or says) the whole "
    "model moved onto the device first: `self.module.to(self.device)`, `model.cuda()`, "
    "'requires the entire model on the GPU'",
    cause="Sharding and offload act on a model that is already whole on every GPU: a model "
    "built outside deepspeed.zero.Init (or FSDP's meta-device init) is materialised in full "
    "on each rank before it is partitioned, so a model larger than one GPU never gets there",
    confirm="torch.cuda.memory_allocated() right after building the model: the full weight "
    "size on each rank",
    fix="Build the model partitioned: construct it under deepspeed.zero.Init(config_dict_or_"
    "path=ds_config) (HF from_pretrained with the ZeRO-3 config set); FSDP: init on the meta "
    "device / cpu and shard before moving",
    patch={"zero_optimization": {"stage": 3}, "zero_init": True},
    supersedes=("RK170", "RK005", "RK102"),
)
def _whole_model_before_sharding(ctx: Context) -> Match | None:
    moved = fact(ctx, "whole_move_lines")
    if not moved or (ctx.oom is None and not fact(ctx, "oom_mentions")):
        return None
    sharded = fact(ctx, "sharding_prose")
    if not sharded and zero_stage(ctx) != 3 and not ctx.cfg.get("fsdp"):
        return None
    fsdp = any(re.search(r"fsdp|fully_shard", x, re.I) for x in sharded or [])
    how = (
        "create the model on the meta device (or cpu) and call fully_shard / FSDP before "
        "moving it (FSDP's param_init_fn / to_empty); never model.cuda() first"
        if fsdp
        else "construct it under `with deepspeed.zero.Init(config_dict_or_path=ds_config): "
        "model = MyModel()` (HF: from_pretrained after the ZeRO-3 DeepSpeed config is set), "
        "so each rank only ever holds its partition and offload can move it to cpu"
    )
    return Match(
        0.6,
        f"Sharding is named ('{(sharded or ['ZeRO-3'])[0][:100]}') but the whole model is put "
        f"on the device first ('{moved[-1][:100]}'): the OOM happens before any partitioning.",
        config_patch={"zero_optimization": {"stage": 3}, "zero_init": True, "map_location": "cpu"},
        fix=f"Build the model partitioned instead of whole on each GPU: {how}",
    )
