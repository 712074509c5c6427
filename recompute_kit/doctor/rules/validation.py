"""Megatron's validation messages (one rule per family, messages verbatim in the tests)."""

from __future__ import annotations

import re

from ...sources.bridge import UNDECIDED
from ...sources.megatron_lm import RENAMED_FLAGS
from ..types import Context, Match
from .registry import fact, on_message, patch_for, rule

# --------------------------------------------------------------------------------------------
# Megatron's validation messages (one rule per family, messages verbatim in the tests)
# --------------------------------------------------------------------------------------------

MEGATRON_CONFIG = "megatron/core/transformer/transformer_config.py"


def _validation(*fragments: str):
    """Fires on Megatron's message in a log, or when the kit's own validation of the given
    config raises it."""
    logged = on_message(*fragments, confidence=0.95)

    def check(ctx: Context) -> Match | None:
        found = logged(ctx)
        if found:
            return found
        if ctx.config_error and any(f in ctx.config_error for f in fragments):
            said = f'Megatron would reject this config: "{ctx.config_error}"'
            branched = _from_undecided_branches(ctx)
            if branched:  # the config read may not be the run's
                return Match(
                    0.5,
                    f"{said}, as read: it takes values set inside `if` branches the files do "
                    f"not decide ({', '.join(branched[:4])}), which the run may not set.",
                )
            ran = _ran_past_validation(ctx)
            if ran:  # Megatron validates before the first step: the run's config passed
                return Match(0.5, f"{said}, as read; but {ran}, so the run's own config passed.")
            return Match(0.9, said)
        return None

    return check


def _ran_past_validation(ctx: Context) -> str | None:
    """What in the log shows the run got past Megatron's validation (which runs before the
    model is built): training iterations, or a failure inside a forward or backward."""
    ev = ctx.evidence
    if ev.iterations:
        return f"the log shows {len(ev.iterations)} training iteration(s)"
    for e in ev.errors:
        if any(re.search(r" in (?:\w*_)?(?:forward|backward)\w*$", f) for f in e.frames):
            return "the log's traceback fails inside the model's forward or backward"
    return None


def _from_undecided_branches(ctx: Context) -> list[str]:
    """The keys the reader took from an `if` branch it read as taken (an assumption)."""
    sources = (ctx.evidence.read or {}).get("sources") or {}
    return sorted(
        key
        for key, src in sources.items()
        if isinstance(src, dict) and UNDECIDED in str(src.get("note", ""))
    )


VALIDATION_RULES = [
    (
        "RK050",
        "Full recompute needs a method",
        ('recompute_method must be "block" or "uniform"',),
        "recompute_granularity=full without recompute_method",
        "Full recompute must say how layers are grouped",
        "Set recompute_method to uniform (every layer, most saving) or block (first N)",
        patch_for("full:uniform:1"),
    ),
    (
        "RK051",
        "Full recompute needs recompute_num_layers",
        ("recompute_num_layers must be between",),
        "recompute_granularity=full without recompute_num_layers",
        "Megatron only checks that the value is set; out-of-range values act like the layer count",
        "Set recompute_num_layers (1 with uniform for the most saving)",
        patch_for("full:uniform:1"),
    ),
    (
        "RK052",
        "Selective recompute takes no recompute_num_layers",
        ("recompute_num_layers must be None",),
        "recompute_granularity=selective with recompute_num_layers set",
        "Selective recompute always applies to every layer",
        "Remove recompute_num_layers (and recompute_method)",
        {"recompute_num_layers": None, "recompute_method": None},
    ),
    (
        "RK053",
        "Unknown granularity or method",
        (
            'must be "full"or "selective"',
            'must be "block" or "uniform".',
            "Invalid activation recompute method",
        ),
        "A typo in recompute_granularity or recompute_method",
        "Only selective/full and uniform/block exist (Megatron's message spells 'granuarlity')",
        "Fix the value",
        {"recompute_granularity": "selective", "recompute_method": None},
    ),
    (
        "RK054",
        "Unknown recompute module",
        ("Invalid choices for recompute_modules",),
        "recompute_modules lists a name Megatron does not know",
        "Allowed: core_attn, mlp, layernorm, moe, moe_act, shared_experts, mla_up_proj (+ newer "
        "model-specific ones)",
        "Fix the module name",
        {"recompute_modules": ["core_attn"]},
    ),
    (
        "RK055",
        "moe_act recompute needs grouped GEMM",
        ("moe_act in recompute_modules is only supported with moe_grouped_gemm",),
        "moe_act in recompute_modules without moe_grouped_gemm",
        "Only TEGroupedMLP implements the output-discarding activation checkpoint",
        "Enable moe_grouped_gemm, or recompute 'moe' instead",
        {"moe_grouped_gemm": True},
    ),
    (
        "RK056",
        "mla_up_proj needs multi-latent attention",
        ("mla_up_proj in recompute_modules is only supported with",),
        "mla_up_proj in recompute_modules on a non-MLA model",
        "The module exists only in MLA attention",
        "Remove mla_up_proj",
        {"recompute_modules": ["core_attn"]},
    ),
    (
        "RK057",
        "shared_experts recompute conflicts with overlap",
        ("shared_experts recompute cannot work with --moe-shared-expert-overlap",),
        "shared_experts recompute together with moe_shared_expert_overlap",
        "Overlapped shared experts run on another stream outside the checkpoint",
        "Drop the overlap or the shared_experts recompute",
        {"moe_shared_expert_overlap": False},
    ),
    (
        "RK058",
        "fp8 delayed scaling cannot recompute moe_act/layernorm",
        (
            "Delayed scaling does not support moe_act and layernorm recompute",
            "moe_act and layernorm recompute for fp8 needs",
        ),
        "fp8 with the delayed recipe (or an old TransformerEngine) and moe_act/layernorm recompute",
        "Output-discarding recompute must re-quantize identically; delayed scaling cannot",
        "Use fp8_recipe tensorwise/blockwise/mxfp8 (TE >= 2.6), or drop moe_act/layernorm",
        {"fp8_recipe": "tensorwise"},
    ),
    (
        "RK059",
        "CPU offloading conflicts",
        (
            "CPU offloading does not work when activation recomputation is enabled",
            "Currently there is no support for Pipeline parallelism with CPU offloading",
            "CPU offloading can be done only for layers less than",
        ),
        "cpu_offloading together with recompute, with PP > 1, or for too many layers",
        "Layer offloading replaces recompute; it needs PP = 1 and fewer layers than the model",
        "Choose one: recompute, or cpu_offloading with PP = 1 and cpu_offloading_num_layers < L",
        {"cpu_offloading": False},
    ),
    (
        "RK060",
        "distribute_saved_activations conflicts",
        (
            "must be false when sequence parallel is enabled",
            "can distribute recomputed activations only across tensor model parallel groups",
            "distributed recompute activations is only application to full recompute",
        ),
        "distribute_saved_activations with sequence parallelism, TP = 1 or selective recompute",
        "It shards full recompute's stored layer inputs over TP; SP already shards them",
        "Turn distribute_saved_activations off (SP already does its job)",
        {"distribute_saved_activations": False},
    ),
    (
        "RK061",
        "Fine-grained offloading conflicts",
        (
            "fine_grained_activation_offloading cannot be enabled with cpu_offloading",
            "attn_proj cannot be set to offload_modules alone without core_attn",
            "while recomputing the entire MoE layer",
            "Invalid choices for offload_modules",
        ),
        "offload_modules combined with cpu_offloading, attn_proj without core_attn, or offloading "
        "inside a recomputed 'moe'",
        "Megatron's offload manager cannot own tensors a checkpoint or another offloader owns",
        "Follow the message: pick one mechanism per tensor",
        {},
    ),
    (
        "RK062",
        "CUDA graphs and recompute",
        (
            "CUDA graphs not supported with activation recomputation",
            "full recompute is only supported with full iteration CUDA graph",
            "not supported with graphed",
            "not supported with moe_router CUDA graph",
        ),
        "CUDA graphs enabled together with (full) recompute",
        "A recompute region cannot straddle a graph; graphed recompute cannot replay RNG",
        "Full recompute: cuda_graph_impl='full_iteration' or no graphs; selective: keep graphed "
        "scopes outside the recomputed modules and dropout off there",
        {"cuda_graph_impl": "none"},
    ),
    (
        "RK063",
        "Deprecated --moe-layer-recompute",
        ("--moe-layer-recompute is deprecated", "Do not set --moe-layer-recompute"),
        "--moe-layer-recompute set (with full granularity it is an error)",
        "The flag became selective recompute of 'moe' (its message says 'moe_layer', the real "
        "module is 'moe')",
        "Use recompute_granularity=selective, recompute_modules=[moe]",
        patch_for("selective:moe"),
    ),
]


def _invalid_method(check):
    """RK053: Megatron's runtime "Invalid activation recompute method." comes with full
    recompute and no method: the patch sets one."""

    def checked(ctx: Context) -> Match | None:
        found = check(ctx)
        if found is not None and "Invalid activation recompute method" in found.evidence:
            n = ctx.cfg.get("recompute_num_layers")
            return Match(
                found.confidence,
                found.evidence,
                config_patch={
                    "recompute_granularity": "full",
                    "recompute_method": "uniform",
                    "recompute_num_layers": n if isinstance(n, int) and n > 0 else 1,
                },
                fix="Set recompute_method to uniform or block (full recompute reached the "
                "layer loop without one; in NeMo 1.x YAML set activations_checkpoint_method)",
            )
        return found

    return checked


for _id, _title, _frags, _symptom, _cause, _fix, _patch in VALIDATION_RULES:
    _check = _validation(*_frags)
    if _id == "RK053":
        _check = _invalid_method(_check)
    rule(
        _id,
        _title,
        "invalid_config",
        symptom=_symptom + f" ('{_frags[0]}')",
        cause=_cause,
        confirm="recompute-kit validate CONFIG prints Megatron's message for the config",
        fix=_fix,
        patch=_patch,
        refs=(MEGATRON_CONFIG,),
    )(_check)


@rule(
    "RK064",
    "Uniform recompute crashes when the layer count is not a multiple",
    "framework_bug",
    symptom="IndexError (e.g. 'index 24 is out of range') with full/uniform recompute",
    cause="Megatron before core_v0.17 did not clamp the last chunk when num_layers per stage "
    "is not divisible by recompute_num_layers",
    confirm="num_layers per pipeline stage % recompute_num_layers != 0",
    fix="Upgrade Megatron-Core (>= 0.17, PR #3562) or use a divisor of the layer count",
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/2294",),
    patch={"command": "pip install -U megatron-core  # >= 0.17"},
)
def _uniform_index(ctx: Context) -> Match | None:
    # Only an IndexError raised with full recompute configured or from inside the recompute
    # loop (checkpoint / transformer_block frames): "list index out of range" in a data
    # loader says nothing about recompute.
    for e in ctx.evidence.errors:
        if e.type.rsplit(".", 1)[-1] != "IndexError":
            continue
        frames = " ".join(e.frames)
        in_recompute = any(
            k in frames for k in ("checkpoint", "transformer_block.py", "_get_layer")
        )
        if ctx.granularity != "full" and not in_recompute:
            continue
        text = f"IndexError: {e.message}"
        layers, pp = ctx.cfg.get("num_layers"), ctx.cfg.get("pipeline_model_parallel_size") or 1
        n = ctx.cfg.get("recompute_num_layers")
        per_stage = layers // pp if isinstance(layers, int) and isinstance(pp, int) else None
        uniform = ctx.cfg.get("recompute_method") == "uniform" and isinstance(n, int) and n > 0
        if uniform and per_stage and per_stage % n:
            return Match(
                0.85,
                f'The log says "{text}"; {per_stage} layers per pipeline stage are not a '
                f"multiple of recompute_num_layers {n}, so the last uniform chunk runs past "
                "the last layer.",
            )
        where = (
            "full recompute is configured"
            if ctx.granularity == "full"
            else "the traceback passes through the recompute loop"
        )
        return Match(0.75, f'The log says "{text}" and {where}.')
    # In words (an issue that reports the bug rather than pastes it): an out-of-range error
    # together with the layer count per stage not being a multiple of recompute_num_layers.
    out = next(iter(fact(ctx, "out_of_range_lines") or []), None)
    lines = [*(fact(ctx, "out_of_range_lines") or []), *(fact(ctx, "num_layers_lines") or [])]
    remainder = next((m for line in lines if (m := _REMAINDER_RE.search(line))), None)
    if out and remainder:
        return Match(
            0.7,
            f'The paste reports "{out[:120]}" when "{remainder.group(0)}": the uniform '
            "recompute loop's last chunk runs past the last layer.",
        )
    return None


# the layer count per stage not a multiple of recompute_num_layers, as code or words
_REMAINDER_RE = re.compile(
    r"%\s*(?:self\.)?(?:config\.)?recompute_num_layers\s*(?:!=\s*0)?"
    r"|recompute_num_layers\s+(?:is\s+)?(?:not\s+(?:a\s+)?(?:divisor|factor|multiple)"
    r"|(?:a\s+)?non[- ]?(?:factor|divisor))"
    r"|(?:undividable|indivisible|not divisible)[^.\n]{0,30}recompute_num_layers",
    re.I,
)


# Words of Megatron's argument checks -> the setting they are about.
ARGUMENT_WORDS = (
    ("sequence parallel", "sequence_parallel"),
    ("pipeline-model-parallel", "pipeline_model_parallel_size"),
    ("pipeline model parallel", "pipeline_model_parallel_size"),
    ("virtual pipeline", "virtual_pipeline_model_parallel_size"),
    ("tensor-model-parallel", "tensor_model_parallel_size"),
    ("tensor model parallel", "tensor_model_parallel_size"),
    ("tensor parallel", "tensor_model_parallel_size"),
    ("context parallel", "context_parallel_size"),
    ("expert", "expert_model_parallel_size"),
    ("recompute", "recompute_granularity"),
    ("micro batch", "micro_batch_size"),
    ("micro-batch", "micro_batch_size"),
    ("global batch", "global_batch_size"),
    ("attention heads", "num_attention_heads"),
    ("distributed optimizer", "use_distributed_optimizer"),
)
VALIDATE_FRAMES = (
    "in validate_args",
    "arguments.py",
    "in __post_init__",
    "transformer_config.py",
    "model_parallel_config.py",
    "get_num_layers_to_build",  # Megatron-Core's layer split at model construction
)
# Without its frames (a title, a PR's prose, a cut traceback) Megatron's check is known by its
# wording: a requirement ("must", "should be divisible") about a parallel setting named as
# Megatron names it (dashes, underscores or words, in any of its versions' spellings).
_REQUIREMENT_RE = re.compile(
    r"\b(?:must|should|divisible|requires?|not supported|cannot|can not|only supported)\b"
)
_PARALLEL_SETTING_RE = re.compile(
    r"(?:pipeline|tensor|context|expert|data) model parallel|sequence parallel"
    r"|(?:pipeline|tensor|context|expert) parallel(?:ism| size)"
)
_KEY_VALUE_RE = re.compile(r"\b(?:config\.|args\.)?([a-z_]+)\s*=\s*(\d+)\b")


@rule(
    "RK097",
    "Megatron's argument checks rejected the launch",
    "invalid_config",
    symptom="AssertionError / ValueError raised from Megatron's validate_args "
    "(megatron/training/arguments.py) or TransformerConfig.__post_init__ before training",
    cause="Two settings Megatron requires to agree do not (parallel sizes, layer counts, "
    "sequence parallelism with MoE + TP, recompute options)",
    confirm="The assertion's message names the rule; the frames are validate_args / __post_init__",
    fix="Change the setting the message names (see the patch); the check runs before any "
    "memory is used",
    patch={"code": "fix the argument validate_args names"},
    refs=("https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py",),
)
def _megatron_arguments(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        if e.kind != "exception" or not e.type.endswith(("AssertionError", "ValueError")):
            continue
        frames = " ".join([*e.frames, *e.context]).lower()
        message = " ".join(e.message.split()) or "(no message)"
        lower = message.lower()
        words = re.sub(r"[_-]+", " ", lower)
        framed = any(f in frames for f in VALIDATE_FRAMES)
        worded = bool(_REQUIREMENT_RE.search(words) and _PARALLEL_SETTING_RE.search(words))
        if not (framed or worded):
            continue
        keys = list(dict.fromkeys(k for w, k in ARGUMENT_WORDS if w in words))
        patch = _argument_patch(ctx, words, keys, _KEY_VALUE_RE.findall(lower))
        return Match(
            0.9 if framed else 0.8,
            f'Megatron rejected the arguments: "{message[:200]}"'
            + (f" (settings: {', '.join(keys)})." if keys else "."),
            config_patch=patch,
        )
    for message in fact(ctx, "quoted_checks") or ():
        # the check quoted from Megatron's source, not raised in a log: what the user is up
        # against, less sure than the raised error
        words = re.sub(r"[_-]+", " ", message.lower())
        if _REQUIREMENT_RE.search(words) and _PARALLEL_SETTING_RE.search(words):
            keys = list(dict.fromkeys(k for w, k in ARGUMENT_WORDS if w in words))
            return Match(
                0.5,
                f'The paste quotes a check of Megatron\'s arguments: "{message}"'
                + (f" (settings: {', '.join(keys)})." if keys else "."),
                config_patch=_argument_patch(ctx, words, keys),
            )
    refused = ctx.config_error or ""
    if _LAYOUT_REFUSED in refused:  # the kit's own check of the files' layout, before a run
        words = re.sub(r"[_-]+", " ", refused.lower())
        return Match(
            0.9,
            f'Megatron would reject this config: "{refused}"',
            config_patch=_argument_patch(ctx, words, []),
        )
    return None


# config/pipeline_layout.py's words for layers that do not split over the pipeline stages
_LAYOUT_REFUSED = "is not divisible by pipeline parallel size"


def _argument_patch(
    ctx: Context, message: str, keys: list[str], stated: list[tuple[str, str]] = ()
) -> dict:
    if "sequence parallel" in message and ("must be" in message or "must use" in message):
        return {"sequence_parallel": True}
    # the values the message states ("num_layers=60 ... pipeline_model_parallel_size=8", newer
    # Megatron-Core wording) where the paste has no config
    said = {k: int(v) for k, v in stated}
    layers = ctx.cfg.get("num_layers") or said.get("num_layers")
    pp = ctx.cfg.get("pipeline_model_parallel_size") or said.get("pipeline_model_parallel_size")
    if "layers" in message and "pipeline" in message:
        if isinstance(layers, int) and isinstance(pp, int) and pp > 1:
            inner = layers // pp
            rest = layers - inner * (pp - 2)
            return {
                "num_layers_in_first_pipeline_stage": rest // 2,
                "num_layers_in_last_pipeline_stage": rest - rest // 2,
            }
        return {
            "num_layers_in_first_pipeline_stage": "<layers on stage 0>",
            "num_layers_in_last_pipeline_stage": "<layers on the last stage>",
        }
    if keys:
        return {keys[0]: f"<a value that satisfies: {message[:80]}>"}
    return {"code": "fix the argument validate_args names"}


@rule(
    "RK150",
    "NeMo 1.x: activations_checkpoint_method / _num_layers: null override recompute_*",
    "invalid_config",
    symptom="A NeMo 1.x YAML sets recompute_method / recompute_num_layers while the "
    "template's activations_checkpoint_method / _num_layers are null; full recompute fails "
    "('Invalid activation recompute method', recompute_method must be \"block\" or "
    '"uniform")',
    cause="NeMo 1.x builds the transformer config from the activations_checkpoint_* keys; "
    "their null values replace the recompute_* ones",
    confirm="Megatron's printed arguments show recompute_method None",
    fix="Set activations_checkpoint_method / activations_checkpoint_num_layers (the keys NeMo "
    "1.x reads), or delete the null lines",
    patch={"activations_checkpoint_method": "uniform", "activations_checkpoint_num_layers": 1},
    supersedes=("RK050", "RK051", "RK053"),
)
def _nemo_null_method(ctx: Context) -> Match | None:
    over = ctx.cfg.get("activations_checkpoint_overrides") or {}
    nulled = {
        k: v["written"]
        for k, v in over.items()
        if k in ("recompute_method", "recompute_num_layers") and v.get("used") is None
    }
    if not nulled or ctx.granularity is None:
        return None
    patch = {k.replace("recompute_", "activations_checkpoint_"): v for k, v in nulled.items()}
    words = ", ".join(f"{k}: {v}" for k, v in nulled.items())
    return Match(
        0.9,
        f"The YAML sets {words}, but the activations_checkpoint_* keys NeMo 1.x reads are "
        f"null: full recompute ({ctx.granularity}) runs without a method.",
        config_patch=patch,
    )


@rule(
    "RK151",
    "A script's assertion forbids checkpointing together with another option",
    "invalid_config",
    symptom="AssertionError from the training script, or an `assert not (args.X and "
    "args.gradient_checkpointing)` line: the two options cannot be combined there",
    cause="The script (not PyTorch) refuses the combination, usually because its wrapper "
    "(Accelerate FSDP, an old PyTorch) cannot checkpoint inside the sharded module",
    confirm="The assert line names both options",
    fix="Choose one of the two in this script; for memory, native PyTorch FSDP with its "
    "activation checkpointing wrapper (apply_activation_checkpointing) combines both",
    patch={"gradient_checkpointing": False},
)
def _script_assert(ctx: Context) -> Match | None:
    lines = list(fact(ctx, "asserts") or [])
    for e in ctx.evidence.errors:
        if e.type.endswith("AssertionError") and "checkpoint" in e.message.lower():
            lines.append(e.message)
    for line in lines:
        lower = line.lower()
        if not re.search(r"(?:gradient|activation|grad)[_ ]?checkpoint", lower):
            continue
        names = [
            n
            for n in re.findall(r"(?:args|config|cfg|opt|self)\.(\w+)", line)
            if "checkpoint" not in n
        ]
        other = names[0] if names else None
        if other is None and not _COMBINATION_RE.search(lower):
            continue  # an assert about checkpointing alone (PyTorch's own internal asserts)
        patch = {other: False} if other else {"gradient_checkpointing": False}
        return Match(
            0.8,
            f'The script asserts "{line[:160]}": gradient checkpointing and '
            f"{other or 'another option'} cannot be combined there.",
            config_patch=patch,
            fix=f"Choose one: turn {other or 'the other option'} off and keep "
            "gradient_checkpointing, or the reverse; native PyTorch FSDP with "
            "apply_activation_checkpointing combines both",
        )
    return None


# The words of an assertion that forbids two options together ("don't support both options",
# "is not supported with FSDP", "cannot be used together").
_COMBINATION_RE = re.compile(
    r"\b(?:and|with|together|both|along|combin\w*|compatible|incompatible)\b"
)


def _divisor_at_most(n: int, k: int) -> int:
    return max(d for d in range(1, min(n, k) + 1) if n % d == 0)


@rule(
    "RK152",
    "recompute_num_layers does not divide the layers per stage (uniform)",
    "invalid_config",
    symptom="Full uniform recompute with a layer count per pipeline stage that is not a "
    "multiple of recompute_num_layers; the chunk loop (_checkpointed_forward) fails",
    cause="Uniform recompute checkpoints chunks of recompute_num_layers layers; the last chunk "
    "runs past the last layer (Megatron-Core < 0.17, NeMo's Hyena block and other copies of "
    "the loop do not clamp it)",
    confirm="num_layers / pipeline_model_parallel_size % recompute_num_layers != 0",
    fix="Set recompute_num_layers to a divisor of the layers per stage (1 always works), or "
    "use recompute_method block",
    patch={"recompute_method": "uniform", "recompute_num_layers": 1},
)
def _uniform_divisor(ctx: Context) -> Match | None:
    layers = ctx.cfg.get("num_layers")
    pp = ctx.cfg.get("pipeline_model_parallel_size") or 1
    vpp = ctx.cfg.get("virtual_pipeline_model_parallel_size") or 1
    n = ctx.cfg.get("recompute_num_layers")
    per_stage = None
    if isinstance(layers, int) and isinstance(pp, int) and isinstance(vpp, int) and pp * vpp:
        per_stage = layers // (pp * vpp)
    uniform = ctx.granularity == "full" and ctx.cfg.get("recompute_method") == "uniform"
    bad = uniform and isinstance(n, int) and n > 1 and per_stage and per_stage % n
    cut = next(
        (
            e
            for e in ctx.evidence.errors
            if not e.type and any("_checkpointed_forward" in f for f in e.frames)
        ),
        None,
    )
    if bad:
        k = _divisor_at_most(per_stage, n)
        index_error = any(e.type.endswith("IndexError") for e in ctx.evidence.errors)
        return Match(
            # an IndexError in Megatron's own loop is RK064's (fixed upstream); a cut or other
            # traceback, or none, is this config's
            0.8 if index_error else 0.85 if ctx.evidence.errors else 0.6,
            f"{per_stage} layers per stage are not a multiple of recompute_num_layers {n} "
            f"(uniform): the last chunk runs past the last layer. {k} divides {per_stage}.",
            config_patch={"recompute_method": "uniform", "recompute_num_layers": k},
        )
    # A cut traceback says nothing by itself: only the uniform loop's own source line
    # (`custom(layer_idx, layer_idx + self.config.recompute_num_layers)`), or the key in the
    # paste, ties it to chunks of recompute_num_layers (the block method steps one layer).
    chunked = fact(ctx, "num_layers_lines") or (
        ctx.cfg.get("recompute_num_layers") is not None
        and ctx.cfg.get("recompute_method") != "block"
    )
    if cut is not None and not _any_error_line(ctx) and chunked:
        frame = next(f for f in cut.frames if "_checkpointed_forward" in f)
        return Match(
            0.55,
            f"The traceback is cut inside the uniform recompute loop ('{frame}'), where chunks "
            "of recompute_num_layers layers are checkpointed: a recompute_num_layers that does "
            "not divide the layers per stage runs past the last layer.",
        )
    return None


def _any_error_line(ctx: Context) -> bool:
    return bool(ctx.oom) or any(e.type for e in ctx.evidence.errors)


DS_CKPT = "deepspeed/runtime/activation_checkpointing/checkpointing.py"


@rule(
    "RK153",
    "DeepSpeed contiguous activation checkpointing without number_checkpoints",
    "invalid_config",
    symptom="IndexError in DeepSpeed's partition_activations (contiguous_data_buffers) with "
    "partition_activations and contiguous_memory_optimization on",
    cause="Contiguous checkpointing sizes its buffers by number_checkpoints; when the "
    "integration (e.g. Lightning's DeepSpeedStrategy) does not pass it, the buffer list is "
    "empty",
    confirm="activation_checkpointing.number_checkpoints is unset in the DeepSpeed config "
    "the run used",
    fix="Set activation_checkpointing.number_checkpoints to the number of checkpointed "
    "layers, or contiguous_memory_optimization false",
    patch={"activation_checkpointing": {"number_checkpoints": "<checkpointed layers>"}},
    refs=("https://github.com/Lightning-AI/pytorch-lightning/issues/20329",),
)
def _contiguous_without_count(ctx: Context) -> Match | None:
    hit = None
    for e in ctx.evidence.errors:
        frames = " ".join(e.frames)
        if (
            DS_CKPT in frames
            and "partition_activations" in frames
            and (e.type.startswith("IndexErr") or not e.type)
        ):
            hit = e
            break
    contiguous = ctx.cfg.get("activation_checkpointing.contiguous_memory_optimization")
    count = ctx.cfg.get("activation_checkpointing.number_checkpoints")
    if hit is None and not (contiguous is True and count in (None, False, 0)):
        return None
    layers = ctx.cfg.get("num_layers") or ctx.cfg.get("num_hidden_layers")
    n = layers if isinstance(layers, int) else "<checkpointed layers>"
    where = (
        f"{hit.type or 'the error'} is raised in DeepSpeed's partition_activations"
        if hit
        else "contiguous_memory_optimization is on"
    )
    return Match(
        0.85 if hit else 0.6,
        f"{where}: contiguous checkpointing sizes its buffers by number_checkpoints, which "
        "was not set.",
        config_patch={
            "activation_checkpointing": {
                "number_checkpoints": n,
                "contiguous_memory_optimization": True,
            }
        },
    )


@rule(
    "RK065",
    "The training script refused its command line",
    "invalid_config",
    symptom="'error: unrecognized arguments: --...' from the script's argument parser, or "
    "Megatron-LM's '--checkpoint-activations is no longer valid'; the run stops before a step",
    cause="A flag the script's version does not define: a typo, a flag of another version, or "
    "one of Megatron-LM's removed recompute flags (--checkpoint-activations, "
    "--activations-checkpoint-method / -num-layers, --checkpoint-num-layers, "
    "--distribute-checkpointed-activations: renamed --recompute-* in 2022)",
    confirm="python pretrain_gpt.py --help | grep -- FLAG (the flag is absent); recompute-kit "
    "read SCRIPT warns on the removed recompute flags",
    fix="Replace each refused flag by its current name (--recompute-granularity, "
    "--recompute-method, --recompute-num-layers, --distribute-saved-activations) or drop it",
    refs=("megatron/training/arguments.py",),
)
def _refused_flags(ctx: Context) -> Match | None:
    refused: list[str] = []
    said = ""
    for e in ctx.evidence.errors:
        text = " ".join((f"{e.type}: {e.message}" if e.type else e.message).split())
        if "unrecognized arguments:" in text:
            refused += _FLAG_RE.findall(text.split("unrecognized arguments:", 1)[1])
            said = said or text
        elif "--checkpoint-activations is no longer valid" in text:
            refused.append("--checkpoint-activations")
            said = said or text
    read = (ctx.evidence.read or {}).get("unused") or {}
    in_files = [flag for flag in RENAMED_FLAGS if flag in read]
    if not said and not in_files:
        return None
    renamed = [f for f in dict.fromkeys([*refused, *in_files]) if f in RENAMED_FLAGS]
    fix = None
    if renamed:
        fix = (
            "Replace "
            + "; ".join(f"{f} by {RENAMED_FLAGS[f]}" for f in renamed)
            + (" (Megatron-LM renamed its recompute flags in 2022)")
        )
    if said:
        quoted = said if len(said) < 220 else said[:217] + "..."
        return Match(
            0.9, f'The log says: "{quoted}": the run stopped at argument parsing.', fix=fix
        )
    return Match(
        0.85,
        f"The launch script passes {', '.join(in_files)}, which Megatron-LM no longer defines: "
        "it stops at argument parsing.",
        fix=fix,
    )


_FLAG_RE = re.compile(r"--[A-Za-z0-9][\w-]*")
