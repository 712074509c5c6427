"""The registry: categories, the `rule` decorator that adds a check to `RULES`, and helpers every
category module uses (sizes as PyTorch prints them, message matching, recompute patches).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ...config import CONFIG_KEYS, ConfigError, format_spec, parse_spec
from ...memory.estimate import estimate
from ..types import Context, Match, Rule

GIB = 2**30
CATEGORIES = (
    "fragmentation",
    "other_processes",
    "non_pytorch_memory",
    "allocation_exceeds_device",
    "genuine_pressure",
    "activation_memory",
    "model_state_memory",
    "logits_memory",
    "recompute_no_effect",
    "recompute_overhead",
    "invalid_config",
    "checkpoint_api_misuse",
    "nondeterministic_recompute",
    "framework_bug",
    "informational",
)
EXPANDABLE = {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}

RULES: list[Rule] = []


def rule(
    id: str,
    title: str,
    category: str,
    *,
    symptom: str,
    cause: str,
    confirm: str,
    fix: str,
    patch: dict | None = None,
    refs: tuple[str, ...] = (),
    supersedes: tuple[str, ...] = (),
    fallback: bool = False,
    reads_stated: str | None = None,
):
    """Register a check function as a rule. A `fallback` rule is a default reading: the engine
    asks it only when no other rule fired. A `reads_stated` rule reads a symptom the user
    states (doctor/symptoms.py): the engine asks it only when no finding explains that one."""
    assert category in CATEGORIES, category

    def register(check: Callable[[Context], Match | None]):
        RULES.append(
            Rule(
                id,
                title,
                category,
                symptom,
                cause,
                confirm,
                fix,
                check,
                patch or {},
                refs,
                supersedes,
                fallback,
                reads_stated,
            )
        )
        return check

    return register


def gib(n: float | None) -> str:
    """A size as PyTorch's OOM message prints it: GiB from 1 GiB up, MiB below (so that a
    138.00 MiB request reads as in the message, not as 0.13 GiB)."""
    if n is None:
        return "?"
    if abs(n) < GIB:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / GIB:.2f} GiB"


def on_message(*fragments: str, confidence: float = 0.95):
    """A check that fires when any error or warning contains one of the fragments."""

    def check(ctx: Context) -> Match | None:
        for e in ctx.evidence.errors:
            text = " ".join(f"{e.type}: {e.message}".split())  # hard wraps are spaces
            if any(f in text for f in fragments):
                quoted = text if len(text) < 220 else text[:217] + "..."
                return Match(confidence, f'The log says: "{quoted}"')
        return None

    return check


def next_step(ctx: Context) -> tuple[str, str]:
    """The next recompute setting by architecture: (spec, why); where the run's config is
    known, the first one Megatron-Core's validation accepts for it (fp8 delayed scaling
    refuses layernorm and moe_act recompute)."""
    candidates = _next_steps(ctx)
    first = next(candidates)
    if ctx.config is None or not _accepted(ctx, None):
        return first
    for spec, why in (first, *candidates):
        if _accepted(ctx, spec):
            return spec, why
    return first


def _accepted(ctx: Context, spec: str | None) -> bool:
    config = ctx.config if spec is None else ctx.config.with_recompute(parse_spec(spec))
    try:
        config.validate()
    except ConfigError:
        return False
    return True


def _next_steps(ctx: Context):
    """The candidate next settings, the most fitting first."""
    # With flash/fused attention core_attn holds nothing worth recomputing: drop it.
    mods = set(ctx.modules) - ({"core_attn"} if ctx.flash else set())
    gran = ctx.granularity
    if gran == "full":
        n = ctx.cfg.get("recompute_num_layers") or 1
        if ctx.cfg.get("recompute_method") == "block":
            yield f"full:block:{n + 1}", "full recompute with one more block layer per stage"
        yield "full:uniform:1", "full recompute of every layer on its own (the most saving)"
        return
    if not ctx.flash and "core_attn" not in mods:
        yield _spec(mods | {"core_attn"}), (
            "the unfused attention keeps [b, a, s, s] scores; core_attn removes them cheaply"
        )
    if ctx.is_mla and "mla_up_proj" not in mods:
        yield _spec(mods | {"mla_up_proj"}), "MLA's expanded Q/K/V are its largest tensors"
    if ctx.is_moe and ctx.cfg.get("moe_grouped_gemm") and "moe_act" not in mods:
        yield _spec(mods | {"moe_act", "layernorm"}), (
            "the expert activations (top-k copies of every token) are cheap to recompute"
        )
    if ctx.is_moe and "moe" not in mods:
        yield _spec(mods | {"moe"}), "recomputing the whole MoE layer frees dispatch and experts"
    if not ctx.is_moe and "mlp" not in mods:
        yield _mlp_or_block(ctx, _spec(mods | {"mlp"}))
    yield "full:uniform:1", "selective recompute is exhausted; recompute whole layers"


def _mlp_or_block(ctx: Context, mlp: str) -> tuple[str, str]:
    """The dense FFN's recompute, or, where the config is known, the smallest full:block:N that
    saves at least as much for fewer extra FLOPs (a whole layer's recompute costs its forward,
    the FFN's is most of it: a few whole layers often beat every layer's FFN)."""
    why = "the dense FFN is the largest block left"
    if ctx.config is None:
        return mlp, why + " (costly: its forward again, most of a layer's)"
    try:
        base = estimate(ctx.config).total_bytes
        with_mlp = estimate(ctx.config.with_recompute(mlp))
        layers = max(len(with_mlp.layers), 1)
        for n in range(1, layers + 1):
            block = estimate(ctx.config.with_recompute(f"full:block:{n}"))
            if block.total_bytes <= with_mlp.total_bytes:  # saves at least as much
                break
        else:
            block = None
    except ConfigError:
        return mlp, why
    cost = with_mlp.recompute_flops_fraction
    saved = (base - with_mlp.total_bytes) / 2**30
    if block is not None and block.recompute_flops_fraction < cost - 0.01:  # clearly cheaper
        return f"full:block:{n}", (
            f"saves at least as much as '{mlp}' ({saved:.1f} GiB) for "
            f"{block.recompute_flops_fraction:.1%} extra FLOPs against its {cost:.1%}"
        )
    return mlp, f"{why} ({saved:.1f} GiB for {cost:.1%} extra FLOPs)"


def _spec(mods: set[str]) -> str:
    from ...config import RECOMPUTE_MODULES

    return format_spec(
        parse_spec("selective:" + ",".join(m for m in RECOMPUTE_MODULES if m in mods))
    )


def patch_for(spec: str) -> dict[str, Any]:
    rc = parse_spec(spec)
    return {
        "recompute_granularity": rc.recompute_granularity,
        "recompute_method": rc.recompute_method,
        "recompute_num_layers": rc.recompute_num_layers,
        "recompute_modules": rc.recompute_modules
        if rc.recompute_granularity == "selective"
        else None,
    }


def estimate_with(ctx: Context, changes: dict[str, Any]) -> tuple[int | None, str | None]:
    """The estimated peak (weights, gradients, optimizer, activations) with the patch applied,
    or the validation error the patched config raises; (None, None) where a value is no
    setting the estimator can take ("<2x the current>")."""
    settable = {k: v for k, v in changes.items() if k in CONFIG_KEYS}
    if not settable or any(isinstance(v, str) and v.startswith("<") for v in settable.values()):
        return None, None
    try:
        cfg = ctx.config.replace(**settable)
    except (ConfigError, TypeError, ValueError):
        return None, None
    try:
        cfg.validate()
        # the same stage as the estimate before: the OOM's, else each side's highest
        return estimate(cfg, stage=ctx.oom_stage).total_bytes, None
    except ConfigError as exc:
        return None, str(exc).splitlines()[0][:200]
    except (ValueError, ZeroDivisionError, TypeError, AttributeError):
        return None, None


def candidate_spec(c) -> str:
    return c.estimate.recompute


def candidate_patch(c) -> dict[str, Any]:
    """A plan candidate as a patch: its recompute keys and the offloading keys it brings (a
    pick that fits only with offloading, handed over without them, does not fit)."""
    from ...export import offload_settings

    offload = offload_settings(c.recompute)
    offload.pop("distribute_saved_activations", None)  # the run's own, not the candidate's
    return {**patch_for(c.estimate.recompute), **offload}


def parse_spec_safe(ctx: Context):
    from ...config import RecomputeConfig

    return ctx.config.recompute if ctx.config else RecomputeConfig()


def fact(ctx: Context, key: str, source: str | None = None) -> Any:
    """A fact from pasted code / prose / tables (evidence/code.py): from one source ("log",
    "config") or, without one, the log's and the config's together (lists joined)."""
    sources = (source,) if source else ("log", "config")
    found: Any = None
    for s in sources:
        value = ctx.evidence.facts.get(s, {}).get(key)
        if value is None:
            continue
        if isinstance(value, list) and isinstance(found, list):
            found = found + value
        elif found is None:
            found = value
    return found


def assume(ctx: Context, words: str) -> None:
    """An assumption a finding rests on (a value no input gives, with the key that sets it),
    listed once in the diagnosis's assumptions however many findings rest on it."""
    if words not in ctx.assumptions:
        ctx.assumptions.append(words)


def outside_this_process(oom) -> int | None:
    """What an OOM message shows held on the GPU outside this process: the other processes it
    lists, or (PyTorch >= 2.1, which counts this process whole, none listed) what is neither
    free nor this process's, or (<= 2.0) all but PyTorch's reserved memory."""
    if oom is None or not oom.total_bytes:
        return None
    if oom.other_processes_bytes:
        return oom.other_processes_bytes
    if oom.free_bytes is None:
        return None
    if oom.process_bytes is not None:
        return oom.total_bytes - oom.free_bytes - oom.process_bytes
    return oom.held_elsewhere_bytes


# A patch value that is a change, not a value: doctor/patches.py writes the value where the
# inputs give the current one, and says it in words where they do not
HALF = "half of the current one"


# Exceptions a launcher raises because a rank failed: they say that one failed, not why
LAUNCHER_EXCEPTIONS = ("ChildFailedError", "CalledProcessError", "SystemExit")


def from_the_launcher(error: Any) -> bool:
    return str(error.type).rsplit(".", 1)[-1] in LAUNCHER_EXCEPTIONS


def oom_errors(ctx: Context):
    return [
        e
        for e in ctx.evidence.errors
        if "out of memory" in e.message.lower() or "OutOfMemory" in e.type
    ]


def steps_without_oom(ctx: Context) -> bool:
    """The log shows the run stepping (iteration lines, DeepSpeed's allocator-flush warnings)
    and no OOM: what it holds is measured by its peak, not by an OOM it never printed."""
    if ctx.oom is not None or oom_errors(ctx) or ctx.says("out of memory"):
        return False
    return bool(ctx.evidence.iterations or fact(ctx, "allocator_flushes", "log"))


def where_raised(e) -> str:
    return " ".join([*e.frames, e.details or "", *e.context]).lower()


def oom_where(ctx: Context) -> str:
    """The frames of the OOM's traceback (lower-case); with a cut or reordered paste, every
    frame in the evidence."""
    frames = " ".join(where_raised(e) for e in oom_errors(ctx))
    if ctx.oom is not None and ctx.oom.context:
        frames += " " + " ".join(ctx.oom.context).lower()
    return frames if frames.strip() else all_frames(ctx)


def all_frames(ctx: Context) -> str:
    """Every traceback frame and detail line in the evidence, lower-case: a paste may put the
    frames before the OOM line, after it, or cut the exception line off."""
    return " ".join(where_raised(e) for e in ctx.evidence.errors)


# Frames of a run that has not reached its first step (model construction, loading,
# conversion, a framework's setup) and frames of the step itself.
_SETUP_FRAME = re.compile(
    r" in (?:setup\w*|__init__|build_\w*|get_model|from_pretrained|load_\w*|convert\w*|"
    r"import_\w*|initiali[sz]e\w*|init_\w*|model_provider|provide)\b"
)
_STEP_FRAME = re.compile(
    r" in (?:forward\w*|backward|_?train\w*|step|_inner_training_loop|run_backward|"
    r"\w*loss\w*|checkpoint\w*)\b"
)


def before_first_step(ctx: Context) -> bool:
    """The failure comes before training's first step: no iteration line, and the frames
    are a framework's setup (model construction, loading, conversion), none of a step's
    forward or backward. Activations do not exist yet."""
    if ctx.evidence.iterations:
        return False
    frames = all_frames(ctx)
    return bool(_SETUP_FRAME.search(frames)) and not _STEP_FRAME.search(frames)


def moments_before_first_step(ctx: Context) -> int:
    """Adam's two moments (memory/model_states.py `adam_moment_share`: two thirds of the
    optimizer's 12 bytes per parameter with an fp32 master copy, all of it without) where an
    OOM came with no finished iteration in the log (or the paste says it came at the first
    step): torch's Adam makes them at the first optimizer step, so an OOM before it held that
    much less than the estimate counts; 0 otherwise."""
    from ...memory.model_states import adam_moment_share

    e = ctx.estimate
    if ctx.evidence.iterations or e is None or not e.optimizer_bytes:
        return 0
    if ctx.oom is None and not fact(ctx, "first_step_prose", "log"):
        return 0  # (no OOM message: only where the paste places the OOM at the first step)
    return int(e.optimizer_bytes * adam_moment_share(ctx.config)) if ctx.config else 0


MEGATRON_RUNS = ("megatron-core", "megatron-lm", "megatron-bridge", "nemo2", "nemo1")


def is_megatron(ctx: Context) -> bool:
    """Megatron-LM / NeMo / Megatron-Bridge: the framework the shared reader names for the
    config files, else from the config's keys or the frames. (The reader writes every config
    in Megatron-Core's field names, so its keys say nothing of the framework.)"""
    read = ctx.evidence.read or {}
    if read.get("framework") in MEGATRON_RUNS:
        return True
    if read.get("framework") in ("hf-trainer", "torchtitan"):
        return False
    keys = ("recompute_", "tensor_model_parallel", "pipeline_model_parallel", "num_moe_experts")
    if any(k.startswith(keys) for k in ctx.cfg):
        return True
    frames = all_frames(ctx)
    return "megatron" in frames or "/nemo/" in frames or bool(fact(ctx, "megatron_paths"))


def more_recompute_patch(ctx: Context) -> tuple[dict[str, Any], str]:
    """The next activation-memory step in the user's framework's own keys: (patch, words)."""
    if is_megatron(ctx):
        spec, why = next_step(ctx)
        return patch_for(spec), f"recompute {spec} ({why})"
    return (
        {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}},
        "activation (gradient) checkpointing: gradient_checkpointing=True, use_reentrant=False",
    )


def tensor_parallel_patch(ctx: Context, gpus: int | None = None) -> tuple[dict[str, Any], str]:
    """The next tensor-parallel size as a patch and words: one Megatron accepts for the model,
    within the run's GPUs and one node (plan/tensor_parallel.py), or no patch and why not."""
    from ...plan.tensor_parallel import next_tensor_parallel

    def number(key: str) -> int | None:
        value = ctx.cfg.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    sources = (ctx.evidence.read or {}).get("sources") or {}
    assumed = (sources.get("data_parallel_size") or {}).get("from") == "assumed"
    current = start = number("tensor_model_parallel_size") or 1
    config, first = ctx.config, ""
    if config is not None and not assumed and gpus is None:  # (the run's GPUs, kept)
        p = config.parallel
        gpus = start * p.pipeline_model_parallel_size * p.context_parallel_size
        gpus *= p.data_parallel_size
    while True:  # the next size up, then the next, until one fits by the estimate
        step = next_tensor_parallel(
            config,
            current=current,
            heads=number("num_attention_heads"),
            query_groups=number("num_query_groups"),
            gpus=gpus,
            world_known=not assumed,  # an assumed DP says nothing of the run's GPUs
            more_gpus=True,  # the step that fits may need GPUs the run does not have: said so
        )
        # said as Megatron-LM's flag: the fix's words are then written in the framework's
        # own key (doctor/fix_words.py), as the patch is
        words = step.words.replace("tensor_model_parallel_size", "--tensor-model-parallel-size")
        words = words.replace(f"{current} -> ", f"{start} -> ", 1)  # from the run's own size
        if step.value is None or step.value <= current:
            return {}, first + words if first else words
        priced = _estimated_at(ctx, step.value)
        if "still above" not in priced:
            return {"tensor_model_parallel_size": step.value}, first + words + priced
        # a size its own estimate shows too big is no patch: the next one is tried
        first = first or f"{words}{priced}; "
        current = step.value
        config = config.replace(tensor_model_parallel_size=current)


def _estimated_at(ctx: Context, tp: int) -> str:
    """What the estimator says of the run at tensor-parallel size `tp` (the rest as it is):
    a proposed layout is checked before it is shown, never offered unpriced."""
    from ...plan.margins import SAFETY_MARGIN, planned_bytes

    if ctx.config is None:  # no shape read: nothing to price
        return ""
    try:
        held = planned_bytes(estimate(ctx.config.replace(tensor_model_parallel_size=tp)))
    except ConfigError:
        return ""
    usable = int(ctx.gpu_bytes * (1 - SAFETY_MARGIN)) if ctx.gpu_bytes else None
    verdict = "" if usable is None else (
        f", {'within' if held <= usable else 'still above'} the {gib(usable)} usable"
    )
    return f"; estimated there: {gib(held)} held per rank at the current recompute{verdict}"


def zero_stage(ctx: Context) -> int | None:
    """The DeepSpeed ZeRO stage in use, from the config or its file name (ds_z3_config.json)."""
    stage = ctx.cfg.get("zero_optimization.stage", ctx.cfg.get("zero_stage"))
    if isinstance(stage, int):
        return stage
    path = str(ctx.cfg.get("deepspeed", "")).lower()
    m = re.search(r"(?:z|zero|stage)_?([0-3])", path)
    if m:
        return int(m.group(1))
    said = fact(ctx, "settings_prose")  # "ZeRO stage: 2", "zero2" in prose (settings_prose.py)
    return said.get("zero_stage") if isinstance(said, dict) else None


def whole_layers_only(ctx: Context) -> bool:
    """The run's framework checkpoints whole layers only (the Hugging Face Trainer, NeMo-RL on
    its DTensor backend): no selective recompute by module."""
    read = ctx.evidence.read or {}
    framework = read.get("framework")
    dtensor = bool((read.get("config") or {}).get("use_torch_fsdp2"))
    return framework == "hf-trainer" or (framework == "nemo-rl" and dtensor)


def expandable_on(ctx: Context) -> bool:
    """The environment the inputs show sets expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF,
    its newer name PYTORCH_ALLOC_CONF (2.9+), or ROCm's)."""
    return any(
        key.endswith("ALLOC_CONF") and "expandable_segments:True" in value.replace(" ", "")
        for key, value in ctx.evidence.env.items()
    )
