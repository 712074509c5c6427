"""Recompute settings that do not do what they seem to."""

from __future__ import annotations

import ast
import re

from ...config import RECOMPUTE_MODULES
from ..types import Context, Match
from .registry import fact, gib, next_step, patch_for, rule

# --------------------------------------------------------------------------------------------
# Settings that do not do what they seem to
# --------------------------------------------------------------------------------------------


@rule(
    "RK020",
    "core_attn recompute with flash/fused attention buys little",
    "recompute_no_effect",
    symptom="selective core_attn (Megatron's default, --recompute-activations) barely "
    "changes peak memory",
    cause="Flash/fused attention never materialises the s x s scores the paper's saving "
    "comes from; it already recomputes them in its backward",
    confirm="recompute-kit estimate --config CONFIG --recompute none selective:core_attn: the "
    "two peaks are within a few percent",
    fix="Recompute something that holds memory (mlp, moe_act, mla_up_proj, layernorm) or "
    "use full recompute",
    refs=(
        "https://github.com/NVIDIA/Megatron-LM/issues/1225",
        "https://github.com/NVIDIA/Megatron-LM/issues/464",
    ),
)
def _core_attn_flash(ctx: Context) -> Match | None:
    warned = ctx.says("you have no need to set 'core_attn' to recompute")
    # the user's own sentence of "no effect" names core_attn (the flags beside the paste)
    stated = (fact(ctx, "symptom_lines") or {}).get("recompute_no_effect") or ""
    named = "core_attn" in stated and not ctx.modules
    if not ((("core_attn" in ctx.modules or named) and ctx.flash) or warned):
        return None
    if ctx.modules and set(ctx.modules) != {"core_attn"} and not warned:
        return None
    spec, why = next_step(ctx)
    measured = _core_attn_measured(ctx)
    conf = 0.85 if measured else 0.7 if (ctx.oom or ctx.says("out of memory")) else 0.45
    said = ctx.cfg.get("attention_backend")  # what the input says of attention, if anything
    attention = (
        f"attention is {said}" if said else "attention is flash/fused (Megatron's default "
        "backend with Transformer Engine; nothing pasted says which it is)"
    )
    return Match(
        conf,
        f"core_attn is recomputed while {attention}"
        + (" (Megatron warned about it)" if warned else "")
        + (f"; {measured}" if measured else "")
        + f". Next: '{spec}' - {why}.",
        config_patch=patch_for(spec),
    )


def _core_attn_measured(ctx: Context) -> str:
    """The measured rows say it: a core_attn run ('selective', Megatron's default modules)
    whose peak is within 2% of the run without recompute."""
    rows = [r for r in ctx.evidence.experiments if r.get("peak_memory_bytes")]
    base = [r for r in rows if (r.get("recompute") or "none") == "none"]
    arm = [r for r in rows if r.get("recompute") in ("selective", "selective:core_attn")]
    if not base or not arm:
        return ""
    b, a = base[0]["peak_memory_bytes"], arm[0]["peak_memory_bytes"]
    change = a / b - 1
    if abs(change) >= 0.02:
        return ""
    return (
        f"measured: '{arm[0]['recompute']}' peaks at {gib(a)} against {gib(b)} without "
        f"recompute ({change:+.2%})"
    )


@rule(
    "RK021",
    "'mlp' recompute does nothing on MoE layers",
    "recompute_no_effect",
    symptom="recompute_modules contains mlp on an MoE model; memory barely moves",
    cause="Megatron skips 'mlp' on MoE layers; 'moe', 'moe_act' and 'shared_experts' are "
    "the MoE units",
    confirm="recompute-kit verify --model tiny-moe --recompute selective:mlp notes the no-op",
    fix="Use moe_act (+layernorm), then moe",
    patch=patch_for("selective:layernorm,moe_act"),
)
def _mlp_on_moe(ctx: Context) -> Match | None:
    if not (ctx.is_moe and "mlp" in ctx.modules):
        return None
    freq = ctx.cfg.get("moe_layer_freq", 1)
    if (isinstance(freq, list) and 0 in freq) or (isinstance(freq, int) and freq > 1):
        return None  # dense layers: mlp recomputes their MLPs, which is not nothing
    # the run's other modules kept; the MoE units in mlp's place
    kept = [m for m in ctx.modules if m != "mlp"]
    spec = "selective:" + ",".join(dict.fromkeys([*kept, "layernorm", "moe_act"]))
    return Match(
        0.75,
        "mlp is in recompute_modules but every layer is MoE: Megatron skips it.",
        config_patch=patch_for(spec),
    )


@rule(
    "RK022",
    "layernorm recompute is too small to fix the OOM",
    "recompute_no_effect",
    symptom="Still OOM after adding layernorm to recompute_modules",
    cause="The norms' outputs are a few bytes per token of hidden size; the peak is elsewhere",
    confirm="Compare peak memory before/after (recompute-kit measure or the experiments "
    "table): the difference is small",
    fix="Add the module that holds the memory: mlp (dense), moe_act/moe (MoE), mla_up_proj "
    "(MLA), or full recompute",
    refs=("NVIDIA skill perf-activation-recompute",),
)
def _layernorm_small(ctx: Context) -> Match | None:
    rows = ctx.evidence.experiments
    with_ln = [
        r for r in rows if r.get("oom") and "layernorm" in (r.get("recompute_modules") or [])
    ]
    if with_ln:
        r = with_ln[0]
        spec, why = next_step(ctx)
        return Match(
            0.8,
            f"Experiment '{r.get('name')}' recomputes "
            f"{r.get('recompute_modules')} and still runs out of memory. "
            f"Next: '{spec}' - {why}.",
            config_patch=patch_for(spec),
        )
    # (torchtitan's per-op selective policy is read as ["layernorm"]: it saves matmul outputs
    # and recomputes every second one, not only the norms)
    titan = ctx.config is not None and ctx.config.model.loss_implementation == "torchtitan"
    if ctx.modules == ["layernorm"] and not titan and (ctx.oom or ctx.says("out of memory")):
        spec, why = next_step(ctx)
        return Match(
            0.6,
            f"Only layernorm is recomputed and the run still OOMs. Next: '{spec}' - {why}.",
            config_patch=patch_for(spec),
        )
    return None


@rule(
    "RK023",
    "Recompute settings never reached the model",
    "recompute_no_effect",
    symptom="Peak memory is the same with and without recompute; or full recompute 'never engages'",
    cause="The settings were set on a config object the model never saw (provider copied "
    "before the change), or the module ran in eval mode (Megatron gates full and "
    "core_attn recompute on self.training)",
    confirm="Print the model's config (Megatron's arguments dump) on rank 0 and check "
    "recompute_granularity there; check model.training is True in the step",
    fix="Set the recompute fields before the model is built (before provider.finalize()); "
    "keep the module in train mode",
    refs=("radixark/miles PR #1482", "NVIDIA-NeMo/Megatron-Bridge PR #5320"),
    patch={"code": "set recompute_* on the config before the model is built; model.train()"},
)
def _never_reached(ctx: Context) -> Match | None:
    rows = [r for r in ctx.evidence.experiments if r.get("peak_memory_bytes")]
    base = [r for r in rows if (r.get("recompute") or "none") in ("none", "selective:")]
    changed = [r for r in rows if r not in base and r.get("recompute") not in (None, "none")]
    for b in base:
        for r in changed:
            if r["peak_memory_bytes"] == b["peak_memory_bytes"] and r.get(
                "recompute", ""
            ).startswith("full"):
                return Match(
                    0.8,
                    f"'{r.get('name')}' ({r['recompute']}) peaks at exactly the "
                    f"same {gib(r['peak_memory_bytes'])} as '{b.get('name')}'.",
                )
    same = fact(ctx, "same_memory_prose") or []
    if same and not ctx.evidence.experiments:
        return Match(
            0.7,
            f"The report says memory does not move with checkpointing turned on: '{same[0]}'.",
            config_patch={
                "code": "model.gradient_checkpointing_enable(); "
                "assert model.is_gradient_checkpointing  # on the model the trainer steps"
            },
            fix="The flag did not reach the model that runs: check on the built model that "
            "checkpointing is on (model.is_gradient_checkpointing, the printed arguments, "
            "model.training); where the framework drops the flag (a worker or role that never "
            "passes it on) upgrade it (fixed upstream) or call "
            "model.gradient_checkpointing_enable() on that model yourself",
        )
    args_gran = ctx.cfg.get("recompute_granularity")
    if ctx.says("recompute never engaged") or (
        args_gran is None and ctx.cfg.get("recompute_num_layers") and ctx.oom
    ):
        return Match(
            0.6,
            "recompute_num_layers is set but recompute_granularity is empty in "
            "the config the model received.",
        )
    return None


DEEPSPEED_AC_KEYS = (
    "partition_activations",
    "cpu_checkpointing",
    "contiguous_memory_optimization",
    "number_checkpoints",
)


@rule(
    "RK092",
    "DeepSpeed's activation_checkpointing block alone checkpoints nothing",
    "recompute_no_effect",
    symptom="A DeepSpeed config with an activation_checkpointing section, and memory as if "
    "nothing were checkpointed",
    cause="That section only configures deepspeed.checkpointing.checkpoint; the model code "
    "must call it (or Hugging Face's gradient_checkpointing_enable) for anything to be "
    "recomputed",
    confirm="grep the model for deepspeed.checkpointing.checkpoint / "
    "gradient_checkpointing_enable: absent",
    fix="Enable checkpointing in the model: Hugging Face gradient_checkpointing=True (or "
    "model.gradient_checkpointing_enable()), or wrap the blocks with "
    "deepspeed.checkpointing.checkpoint",
    patch={"gradient_checkpointing": True},
    refs=("https://www.deepspeed.ai/docs/config-json/#activation-checkpointing",),
)
def _deepspeed_section_only(ctx: Context) -> Match | None:
    section = [
        k
        for k in ctx.cfg
        if k.startswith("activation_checkpointing.") and k.split(".")[-1] in DEEPSPEED_AC_KEYS
    ]
    if not section:
        return None
    if any("gradient_checkpointing" in k and v for k, v in ctx.cfg.items()):
        return None
    return Match(
        0.7,
        f"The config has DeepSpeed's activation_checkpointing section ({', '.join(section[:3])}"
        ") but nothing turns checkpointing on in the model (no gradient_checkpointing).",
    )


# --------------------------------------------------------------------------------------------
# Checkpointing switched on where it cannot act
# --------------------------------------------------------------------------------------------

FROZEN_WORDS = ("lora", "peft", "adapter", "freeze", "frozen", "requires_grad_(false)")


@rule(
    "RK140",
    "Gradient checkpointing set on a module in eval mode",
    "recompute_no_effect",
    symptom="gradient_checkpointing = True (or gradient_checkpointing_enable()) and then "
    ".eval() on the same model, or a report that checkpointing is not invoked while the model "
    "is in eval mode; memory as if nothing were checkpointed",
    cause="Hugging Face transformers and diffusers blocks gate checkpointing on "
    "`self.training and self.gradient_checkpointing`: in eval mode (e.g. a frozen base model "
    "trained through adapters) the blocks run without checkpoints and keep every activation",
    confirm="Print module.training inside the step: False; or time the backward: no forward "
    "is re-run",
    fix="Keep the checkpointed modules in train() mode for the step (freeze weights with "
    "requires_grad_(False), not eval(); dropout can be set to 0 instead), or upgrade the "
    "library to a version that gates on torch.is_grad_enabled() (diffusers >= 0.32)",
    patch={"code": "model.train()  # checkpointing is gated on self.training"},
    refs=("https://github.com/huggingface/diffusers/pull/9878",),
)
def _eval_mode(ctx: Context) -> Match | None:
    on, evals = fact(ctx, "checkpointing_on"), fact(ctx, "eval")
    inactive, mode = fact(ctx, "ckpt_inactive"), fact(ctx, "eval_prose")
    if inactive and mode and not (on and evals and fact(ctx, "eval_after_train")):
        # The report says it in words: checkpointing does not run, and the module's mode.
        return Match(
            0.7,
            f"The report says checkpointing does not act ('{inactive[0]}') and names the "
            f"module's eval / training mode ('{mode[0]}'): blocks that check self.training "
            "skip the checkpoint in eval mode.",
        )
    if not on or not evals or not fact(ctx, "eval_after_train"):
        return None
    if fact(ctx, "no_grad") and not fact(ctx, "checkpoint_call"):
        return None  # inference under no_grad: nothing to checkpoint anyway (RK099's case)
    return Match(
        0.8,
        f"The snippet turns checkpointing on ('{on[0]}') and then switches the module to "
        f"eval mode ('{evals[-1]}'): blocks that check self.training skip the checkpoint.",
        config_patch={
            "code": f"{evals[-1].split('.eval')[0].strip() or 'model'}.train()  # not eval(): "
            "checkpointing is gated on self.training (or upgrade: is_grad_enabled gate)"
        },
    )


@rule(
    "RK141",
    "Recompute flags given, but Megatron's printed arguments say None",
    "recompute_no_effect",
    symptom="The launch command or config sets --recompute-granularity (method, num layers), "
    "but the arguments Megatron prints at start-up show recompute_granularity None",
    cause="The flags never reached Megatron's parser: a line after a broken `\\` continuation "
    "or a comment, an empty shell variable, a wrapper that rebuilds argv, or a later "
    "override; what Megatron prints is what runs",
    confirm="grep the printed arguments (`recompute_granularity ....`) in the log of the run "
    "itself; echo the final command line in the launcher",
    fix="Fix the launch script so the flags reach pretrain_gpt.py (no comment or blank line "
    "inside the continued command; quote the variables that hold flags) and check the "
    "printed arguments again",
    patch=patch_for("full:uniform:1"),
)
def _flags_lost(ctx: Context) -> Match | None:
    dump = ctx.evidence.facts.get("args_dump") or {}
    if "recompute_granularity" not in dump or dump["recompute_granularity"] is not None:
        return None
    asked = {
        k: v
        for k, v in {**(fact(ctx, "recompute_flags", "log") or {}), **ctx.cfg}.items()
        if k in ("recompute_granularity", "recompute_method", "recompute_num_layers")
        and v is not None
        and dump.get(k) != v
    }
    if not asked.get("recompute_granularity"):
        return None
    spec = asked["recompute_granularity"]
    if spec == "full":
        spec = f"full:{asked.get('recompute_method') or 'uniform'}:"
        spec += str(asked.get("recompute_num_layers") or 1)
    try:
        patch = patch_for(spec)
    except Exception:  # an odd value: name it as given
        patch = dict(asked)
    words = ", ".join(f"{k} {v}" for k, v in asked.items())
    return Match(
        0.85,
        f"The run asks for {words}, but Megatron's printed arguments have "
        "recompute_granularity None: the run recomputed nothing.",
        config_patch=patch,
    )


@rule(
    "RK142",
    "NeMo 1.x: activations_checkpoint_granularity: null turns recompute_* off",
    "recompute_no_effect",
    symptom="A NeMo 1.x model YAML with recompute_granularity set and the template's "
    "activations_checkpoint_granularity: null left in; memory as without recompute",
    cause="NeMo 1.x builds the transformer config from activations_checkpoint_granularity / "
    "_method / _num_layers, so their null values win over the recompute_* keys",
    confirm="Megatron's printed arguments (or model.cfg) show recompute_granularity None",
    fix="Set the activations_checkpoint_* keys (not recompute_*) in a NeMo 1.x YAML, or "
    "delete the null activations_checkpoint_* lines",
    patch={"activations_checkpoint_granularity": "full"},
)
def _nemo_null_granularity(ctx: Context) -> Match | None:
    over = (ctx.cfg.get("activations_checkpoint_overrides") or {}).get("recompute_granularity")
    if not over or over.get("used") is not None or not over.get("written"):
        return None
    written = over["written"]
    patch = {"activations_checkpoint_granularity": written}
    for key in ("recompute_method", "recompute_num_layers"):
        value = (
            (ctx.cfg.get("activations_checkpoint_overrides") or {})
            .get(key, {})
            .get("written", ctx.cfg.get(key))
        )
        if value is not None:
            patch[key.replace("recompute_", "activations_checkpoint_")] = value
    return Match(
        0.85,
        f"The YAML sets recompute_granularity: {written} but also "
        "activations_checkpoint_granularity: null, which NeMo 1.x reads: recompute is off.",
        config_patch=patch,
    )


@rule(
    "RK143",
    "layernorm recompute on a Transformer Engine dense model is a no-op",
    "recompute_no_effect",
    symptom="recompute_modules contains layernorm on a dense (non-MoE) model built with "
    "Transformer Engine; memory does not move",
    cause="Transformer Engine fuses both layer norms of a dense layer into the following "
    "linear (LayerNormLinear / LayerNormMLP): the norm modules are IdentityOp and there is "
    "no norm output to discard",
    confirm="Print the model: input_layernorm and pre_mlp_layernorm are IdentityOp",
    fix="Drop layernorm from recompute_modules; recompute what holds memory (mlp, or full "
    "recompute of a few layers)",
    patch=patch_for("selective:mlp"),
    supersedes=("RK022",),
)
def _layernorm_fused(ctx: Context) -> Match | None:
    if "layernorm" not in ctx.modules or ctx.is_moe or ctx.is_mla:
        return None
    # the reader's whole config (its framework's defaults too: torchtitan and Hugging Face
    # models run torch modules), else Megatron-Core's default, Transformer Engine
    read = ctx.config.model.transformer_impl if ctx.config is not None else None
    impl = str(ctx.cfg.get("transformer_impl") or read or "transformer_engine")
    if impl != "transformer_engine":
        return None
    # only the modules Megatron knows: a pasted prose line can run on after the flag
    rest = [m for m in ctx.modules if m != "layernorm" and m in RECOMPUTE_MODULES]
    nxt = "mlp" if "mlp" not in rest else None
    mods = rest + ([nxt] if nxt else [])
    patch = {**patch_for("selective:" + ",".join(mods))} if nxt else patch_for("full:uniform:1")
    oom = bool(ctx.oom or ctx.says("out of memory"))
    return Match(
        0.7 if oom else 0.55,
        f"recompute_modules {ctx.modules} on a dense Transformer Engine model: its layer "
        "norms are fused into the linears, so 'layernorm' discards nothing.",
        config_patch=patch,
    )


COMPILE_KEYS = ("compile", "torch_compile", "use_torch_compile", "compile_model", "compiler")


@rule(
    "RK144",
    "OOM with checkpointing on under a compiler: the checkpoints may be dropped",
    "recompute_no_effect",
    symptom="Out of memory with activation checkpointing enabled and the model compiled "
    "(torch.compile, Thunder, dynamo); the same run without the compiler fits",
    cause="The compiler traces the checkpointed blocks; a version that does not keep the "
    "checkpoint regions (or recomputes nothing after partitioning) saves every activation",
    confirm="Run one step with the compiler off and with checkpointing off: if the compiled "
    "run peaks like the run without checkpointing, the compiler dropped the checkpoints",
    fix="Apply activation checkpointing before compiling (per block), or run without the "
    "compiler / on the compiler's previous version until it keeps checkpoint regions",
    patch={"compile": False},
)
def _compiled_checkpoints(ctx: Context) -> Match | None:
    if not (ctx.oom or ctx.says("out of memory")):
        return None
    on = [k for k, v in ctx.cfg.items() if v is True and _is_checkpoint_key(k)]
    if not on:
        return None
    compiled = next(
        (k for k in ctx.cfg if k.rsplit(".", 1)[-1] in COMPILE_KEYS and ctx.cfg[k]), None
    )
    if compiled is None or ctx.cfg[compiled] in ("none", "None", "eager"):
        return None
    return Match(
        0.5,
        f"The OOM happened with {on[0]} = True and {compiled} = {ctx.cfg[compiled]}: the "
        "compiled graph may not keep the checkpoint regions.",
        config_patch={compiled: False, on[0]: True},
    )


def _is_checkpoint_key(key: str) -> bool:
    name = key.rsplit(".", 1)[-1]
    return name in (
        "gradient_checkpointing",
        "activation_checkpointing",
        "checkpoint_activations",
        "grad_checkpointing",
        "use_gradient_checkpointing",
    )


@rule(
    "RK160",
    "Checkpointing requested, but the run's printed arguments have it off",
    "recompute_no_effect",
    symptom="The command line or config turns gradient / activation checkpointing on, while "
    "the arguments the run printed (TrainingArguments, the script's args) say "
    "gradient_checkpointing=False; per-step peaks as without checkpointing",
    cause="The flag never reached the model: a script that parses its own flags and ignores "
    "this one, a misspelt key, a later default that overwrites it, or a launcher that drops "
    "arguments after a broken line continuation",
    confirm="Print model.is_gradient_checkpointing (Hugging Face) or the script's parsed args "
    "in the run itself",
    fix="Pass the flag the script actually reads (or call model.gradient_checkpointing_enable() "
    "after loading the model), then check the printed arguments again",
    patch={"gradient_checkpointing": True},
)
def _flag_printed_off(ctx: Context) -> Match | None:
    asked = fact(ctx, "checkpointing_on", "config") or [
        line for line in (fact(ctx, "checkpointing_on", "log") or []) if "--" in line
    ]
    printed = [
        line
        for line in (fact(ctx, "checkpointing_off", "log") or [])
        if "--" not in line and "disable" not in line
    ]
    if not asked or not printed:
        return None
    return Match(
        0.8,
        f"Checkpointing is asked for ('{asked[0]}') but the run printed '{printed[0]}': the "
        "model trained without it.",
        config_patch={
            "gradient_checkpointing": True,
            "code": "model.gradient_checkpointing_enable()",
        },
    )


# ---- checkpointing that silently yields no gradient: its inputs need none ------------------

_NAME_RE = re.compile(r"\b([A-Za-z_]\w*)\b")


def _call_args(line: str) -> set[str]:
    """The names a pasted checkpoint call passes (after its opening parenthesis)."""
    args = line.split("(", 1)[1] if "(" in line else ""
    return set(_NAME_RE.findall(args))


@rule(
    "RK651",
    "Reentrant checkpoint called on inputs that need no gradient: its output needs none",
    "checkpoint_api_misuse",
    symptom="Pasted code calls checkpoint() on tensors built without requires_grad "
    "(torch.randn / zeros / ones ...) without use_reentrant=False, and looks at the "
    "result's requires_grad / grad (or the report says gradients are None), with no error",
    cause="The reentrant checkpoint (the default before PyTorch 2.4, use_reentrant=True) runs "
    "the function under no_grad and ties its output to the graph only through inputs that "
    "require grad: with none, the output has requires_grad False and the parameters inside "
    "the function get no gradient, although function(*args) alone would give them one",
    confirm="print(out.requires_grad) with and without checkpoint, or with x.requires_grad_()",
    fix="Pass use_reentrant=False to checkpoint (it keeps the parameters' gradients whatever "
    "the inputs), or make one input require grad (x.requires_grad_(); Hugging Face: "
    "model.enable_input_require_grads())",
    patch={"use_reentrant": False},
)
def _inputs_need_no_grad(ctx: Context) -> Match | None:
    if ctx.oom or any(e.kind == "exception" and e.type for e in ctx.evidence.errors):
        return None
    if fact(ctx, "use_reentrant", "log") is False:
        return None  # non-reentrant: the parameters' gradients do not hang on the inputs
    calls = fact(ctx, "checkpoint_call", "log") or []
    plain = {ln.split("=", 1)[0].strip(): ln for ln in fact(ctx, "plain_inputs", "log") or []}
    hit = next(((c, n) for c in calls for n in sorted(_call_args(c) & set(plain))), None)
    if hit is None:
        return None
    probe = fact(ctx, "grad_probe", "log") or fact(ctx, "grads_lost", "log")
    if not probe:
        return None
    call, name = hit
    return Match(
        0.6,
        f"The code checkpoints '{call[:100]}' on {name}, built without requires_grad "
        f"('{plain[name][:80]}'), with the reentrant checkpoint (no use_reentrant=False), and "
        f"looks at the gradient ('{probe[0][:80]}'): the output needs no gradient, so the "
        "parameters inside the checkpointed function get none.",
        config_patch={"use_reentrant": False},
        fix=f"Pass use_reentrant=False to the checkpoint call, or {name}.requires_grad_() "
        "before it (an input that requires grad ties the output to the graph)",
    )


def _enable_kwargs(line: str) -> dict:
    """The gradient_checkpointing_kwargs dict a pasted enable call passes, {} if unreadable."""
    m = re.search(r"gradient_checkpointing_kwargs\s*=\s*(\{[^{}]*\})", line)
    if not m:
        return {}
    try:
        value = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


@rule(
    "RK652",
    "The trainer re-enables checkpointing and drops the model's gradient_checkpointing_kwargs",
    "checkpoint_api_misuse",
    symptom="Code enables checkpointing on the model with gradient_checkpointing_kwargs "
    "(use_reentrant=False) and also passes gradient_checkpointing=True (or a variable) to the "
    "trainer's arguments without gradient_checkpointing_kwargs",
    cause="The Hugging Face Trainer calls model.gradient_checkpointing_enable() itself when "
    "gradient_checkpointing is on, with its own gradient_checkpointing_kwargs (None: the "
    "reentrant default), overriding the kwargs set on the model: the run uses the reentrant "
    "checkpoint, whose blocks with inputs that need no gradient (LoRA on a frozen base) give "
    "none, and the memory differs from what the kwargs meant",
    confirm="Print model.model.layers[0]._gradient_checkpointing_func (or the warning about "
    "use_reentrant) after trainer creation; set the kwargs on the trainer and compare",
    fix="Pass gradient_checkpointing_kwargs to the trainer's arguments "
    "(TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs="
    "{'use_reentrant': False})) instead of (or as well as) on the model",
    patch={"gradient_checkpointing_kwargs": {"use_reentrant": False}},
)
def _trainer_resets_kwargs(ctx: Context) -> Match | None:
    found = fact(ctx, "trainer_resets_gc", "log")
    if not found:
        return None
    enable, arg = found[0], found[1]
    kwargs = _enable_kwargs(enable) or {"use_reentrant": False}
    return Match(
        0.75,
        f"The code enables checkpointing on the model with kwargs ('{enable[:110]}') and "
        f"also hands the trainer '{arg[:60]}' without gradient_checkpointing_kwargs: the "
        "trainer enables it again with its default kwargs, so the model's are overridden "
        f"(use_reentrant back to the reentrant default).",
        config_patch={"gradient_checkpointing_kwargs": kwargs},
        fix="Pass gradient_checkpointing_kwargs="
        f"{kwargs} in the trainer's arguments next to gradient_checkpointing (the trainer's "
        "enable call is the one that counts)",
    )


@rule(
    "RK681",
    "A compiled backward keeps its saved tensors and the incoming gradient alive through the "
    "recomputation",
    "recompute_no_effect",
    symptom="A compiled backward trace is pasted (def backward_fn(saved_for_backward, "
    "cotangents), an AOT autograd backward graph with tangents_N inputs) because memory in "
    "backward stays high with recomputation on",
    cause="With recomputation the compiled backward first recomputes the forward's "
    "intermediates and only then consumes the incoming gradient (cotangent) and the saved "
    "tensors, so they stay alive through the whole recompute and the peak does not drop; "
    "without it the first op consumes the gradient and frees it",
    confirm="Read the trace: find where the cotangent (the loss gradient) and each saved "
    "tensor are last used and deleted (del / clear_mutable_collection) relative to the "
    "recomputed ops; compare torch.cuda.max_memory_allocated() with recomputation on and off",
    fix="Let the compiler recompute what it saves for backward instead of keeping it "
    "(thunder: thunder.jit(fn, enable_saved_for_backward_recomputation=True); torch.compile: "
    "lower torch._functorch.config.activation_memory_budget) and report the trace's "
    "ordering upstream",
    patch={"enable_saved_for_backward_recomputation": True},
)
def _compiled_backward_keeps(ctx: Context) -> Match | None:
    trace = fact(ctx, "backward_trace")
    if not trace or ctx.evidence.errors or ctx.evidence.oom:
        return None
    return Match(
        0.45,
        f"A compiled backward's trace is pasted ('{trace[0][:100]}'): its inputs, the tensors "
        "saved for backward and the cotangents, live until their last use in the trace, which "
        "recomputation moves after the recomputed ops.",
    )
