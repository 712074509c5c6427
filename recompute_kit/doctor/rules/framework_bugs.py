"""Known framework bugs and their workarounds."""

from __future__ import annotations

import re

from ..types import Context, Match
from .registry import (
    all_frames,
    fact,
    gib,
    is_megatron,
    patch_for,
    rule,
    zero_stage,
)

# --------------------------------------------------------------------------------------------
# Known framework bugs and their workarounds
# --------------------------------------------------------------------------------------------


@rule(
    "RK080",
    "MoE + full recompute keeps memory until the next iteration",
    "framework_bug",
    symptom="MoE model with full recompute: memory grows across iterations or is freed late; "
    "residual memory scales with recompute_num_layers",
    cause="unpermute()/CheckpointFunction kept autograd references to intermediates "
    "(Megatron-LM #3221, verl #5251)",
    confirm="max_allocated grows from iteration 1 to 2 and then plateaus high",
    fix="Upgrade Megatron-Core (PR #5197); meanwhile use selective 'moe_act' (+'mlp' on dense "
    "layers)",
    patch=patch_for("selective:layernorm,moe_act"),
    refs=("https://github.com/NVIDIA/Megatron-LM/issues/3221", "verl-project/verl PR #5251"),
)
def _moe_full_leak(ctx: Context) -> Match | None:
    if not (ctx.is_moe and ctx.granularity == "full"):
        return None
    reports = [r for r in ctx.evidence.memory if r.max_allocated_bytes]
    if (
        len(reports) >= 2
        and reports[-1].max_allocated_bytes > 1.05 * reports[0].max_allocated_bytes
    ):
        return Match(
            0.6,
            f"max allocated grew from {gib(reports[0].max_allocated_bytes)} to "
            f"{gib(reports[-1].max_allocated_bytes)} with MoE + full recompute.",
        )
    return None


@rule(
    "RK083",
    "Recomputed tensors are empty (shape [0]): a parameter released by sharding (ZeRO-3)",
    "framework_bug",
    symptom="CheckpointError: recomputed metadata shows shape torch.Size([0]) where the "
    "forward saw real shapes (DeepSpeed ZeRO-3)",
    cause="ZeRO-3 partitions parameters after use; the recompute runs with released "
    "(empty) parameters",
    confirm="The recomputed metadata in the CheckpointError has torch.Size([0]), and the run "
    "shards its parameters (DeepSpeed ZeRO-3 / FSDP)",
    fix="Use DeepSpeed's checkpointing (deepspeed.checkpointing) or use_reentrant=True with "
    "ZeRO-3, or upgrade DeepSpeed",
    supersedes=("RK075",),
    patch={"gradient_checkpointing_kwargs": {"use_reentrant": True}},
)
def _zero3_released(ctx: Context) -> Match | None:
    # the metadata lines of each error, and of a paste cut after the CheckpointError line
    # (torch prints them on their own lines: they still are the checkpoint's own report)
    texts = [f"{e.message} {e.details or ''}" for e in ctx.evidence.errors]
    texts.append(" ".join(fact(ctx, "recompute_metadata", "log") or []))
    for raw in texts:
        text = " ".join(raw.split())
        # "recomputed metadata: {'shape': torch.Size([0]), ...", or pasted shorter as
        # "saved {'shape': [1024]} vs recomputed {'shape': [0]}"
        if _EMPTY_RECOMPUTE_RE.search(text):
            saved = _SAVED_SHAPE_RE.search(text)
            shapes = "The recomputed tensors have shape [0]" + (
                f" where the forward saved [{saved.group(1)}]" if saved else ""
            )
            named = _sharding_named(ctx)
            if named:
                return Match(
                    0.9,
                    f"{shapes}, under parameter sharding ({named}): a parameter the recompute "
                    "used was already released to its shard.",
                )
            # An empty recomputed tensor is what a released shard looks like, but nothing in
            # the paste says the run shards its parameters: say so, do not assert ZeRO-3.
            return Match(
                0.6,
                f"{shapes}: the recompute saw an empty tensor. The paste does not name the "
                "framework; if the run shards parameters (DeepSpeed ZeRO-3, FSDP), a parameter "
                "the recompute used was already released to its shard.",
                fix="If the run uses DeepSpeed ZeRO-3: DeepSpeed's checkpointing "
                "(deepspeed.checkpointing) or use_reentrant=True, or upgrade DeepSpeed; if it "
                "does not, find what empties that tensor between forward and backward (a hook "
                "or an offload that resizes it to 0)",
            )
    return None


_SHARDING_RE = re.compile(
    r"deepspeed|zero[-_ ]?3|zero[-_ ]?stage[-_ ]?3|stage[-_ ]?3|fsdp|fully_shard", re.I
)


def _sharding_named(ctx: Context) -> str | None:
    """Where the paste says the parameters are sharded (ZeRO-3 / FSDP), or None."""
    if zero_stage(ctx) == 3:
        return "ZeRO stage 3 in the config"
    for piece in (ctx.text, all_frames(ctx), " ".join(f"{k}={v}" for k, v in ctx.cfg.items())):
        m = _SHARDING_RE.search(piece)
        if m:
            return f"'{m.group(0)}'"
    return None


_EMPTY_RECOMPUTE_RE = re.compile(
    r"recomputed(?: metadata)?:?\s*\{'shape':\s*(?:torch\.Size\(\[0\]\)|\[0\])"
)
_SAVED_SHAPE_RE = re.compile(r"saved(?: metadata)?:?\s*\{'shape':\s*(?:torch\.Size\()?\[([^\]]+)\]")


@rule(
    "RK084",
    "Pipeline + CPU offloading error with offloading off",
    "framework_bug",
    symptom="'Currently there is no support for Pipeline parallelism with CPU offloading' "
    "although cpu_offloading_num_layers is 0",
    cause="A framework layer (Megatron-Bridge) set cpu_offloading from a default even though "
    "no layer is offloaded",
    confirm="The config has cpu_offloading_num_layers: 0",
    fix="Set cpu_offloading: false explicitly (or upgrade Megatron-Bridge)",
    patch={"cpu_offloading": False},
    supersedes=("RK059",),
)
def _offload_zero_layers(ctx: Context) -> Match | None:
    if not ctx.says("no support for Pipeline parallelism with CPU offloading"):
        return None
    layers = ctx.cfg.get("cpu_offloading_num_layers", ctx.cfg.get("activation_offload_layers"))
    if layers == 0:
        return Match(
            0.9, "Megatron rejects CPU offloading with PP although cpu_offloading_num_layers is 0."
        )
    return None


RECOMPUTE_FRAMES = ("checkpoint", "recompute", "save_for_backward", "_checkpointed_forward")


@rule(
    "RK103",
    "A framework's recompute path rejects its own arguments",
    "framework_bug",
    symptom="TypeError inside a framework's checkpoint / recompute call (an unexpected "
    "keyword argument, save_for_backward given a non-tensor) with a recompute option on",
    cause="A newer feature (padding masks, packed sequences, MTP) passes arguments that the "
    "framework's checkpoint wrapper does not forward; the bug is in the framework",
    confirm="The failing frame is the framework's checkpoint / recompute function; turning "
    "that recompute module off makes it go",
    fix="Upgrade the framework (the fix binds the arguments before checkpointing); meanwhile "
    "turn off the recompute module in the traceback",
    patch={"recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
)
def _recompute_type_error(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        if not e.type.endswith("TypeError"):
            continue
        where = " ".join([*e.frames, *e.context, e.message]).lower()
        hit = next((w for w in RECOMPUTE_FRAMES if w in where), None)
        if hit is None:
            continue
        mods = [m for m in ctx.modules if m not in where] if ctx.modules else []
        patch = {"recompute_granularity": "selective", "recompute_modules": mods or ["core_attn"]}
        if "mlp" in where and not mods:
            patch["recompute_modules"] = ["core_attn"]  # without mlp: the failing wrapper
        return Match(
            0.85,
            f'{e.type}: "{e.message[:160]}" is raised in the recompute path ("{hit}").',
            config_patch=patch,
        )
    return None


COMPILED_BACKWARD = ("_aot_autograd", "compiledfunction", "runtime_wrappers", "compiled_autograd")


@rule(
    "RK460",
    "Backward twice inside a library's compiled backward",
    "framework_bug",
    symptom="RuntimeError 'Trying to backward through the graph a second time' raised in the "
    "backward of a compiled graph (torch/_functorch/_aot_autograd, CompiledFunction), with no "
    "checkpoint call of the user's in the traceback",
    cause="A training library that compiles or patches the model (its own gradient "
    "checkpointing / offloading, e.g. Unsloth) freed the compiled graph's saved tensors "
    "before its second use; the user's code calls only trainer.train()",
    confirm="Turn the library's gradient checkpointing (or compile) off for one run: the error "
    "goes; the same script runs on the library's previous release",
    fix="Upgrade the library that compiles / patches the model (Unsloth: pip install -U "
    "unsloth unsloth_zoo; transformers) or pin its last working release; meanwhile turn its "
    "gradient checkpointing off",
    patch={"gradient_checkpointing": False},
    supersedes=("RK093",),
)
def _compiled_backward_twice(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        if "backward through the graph a second time" not in e.message:
            continue
        where = " ".join([*e.frames, *e.context]).lower()
        hit = next((w for w in COMPILED_BACKWARD if w in where), None)
        if hit is None or "checkpoint(" in where or fact(ctx, "checkpoint_call"):
            continue
        return Match(
            0.8,
            f"'{e.message[:90]}' is raised in a compiled graph's backward ('{hit}'), with no "
            "checkpoint call of the user's in the traceback.",
        )
    return None


COMBINED_FEATURES = (
    ("checkpoint", "checkpointing"),
    ("recompute", "recompute"),
    ("pipelin", "pipeline parallelism"),
    ("zero", "ZeRO"),
    ("fsdp", "FSDP"),
    ("offload", "offloading"),
    ("tensor parallel", "tensor parallelism"),
)


@rule(
    "RK520",
    "Features that work one at a time fail together (said in words)",
    "framework_bug",
    symptom="The paste says checkpointing / recompute and a parallelism or offload feature "
    '(pipeline, ZeRO, FSDP, offloading) each work alone ("work individually", "any two '
    'of the three options") but fail when combined',
    cause="The framework's code path for that combination is broken or untested: a bug in "
    "the framework, not a setting of the user's",
    confirm="Turn one feature of the combination off: the run works; the combination fails "
    "on the framework's latest release too",
    fix="Upgrade the framework that implements the combination (DeepSpeed, Megatron, the "
    "trainer) and report it upstream; meanwhile run without one of the features (e.g. "
    "activation checkpointing off, or ZeRO stage lowered)",
    patch={"command": "pip install -U deepspeed"},
)
def _combined_in_words(ctx: Context) -> Match | None:
    # "work individually" (code.py), or "X together with Y" / "only when I use X with Y"
    lines = [*(fact(ctx, "combined_prose") or []), *(fact(ctx, "together_prose") or [])]
    for line in lines:
        low = line.lower()
        named = [name for word, name in COMBINED_FEATURES if word in low]
        if len(named) < 2 or not {"checkpointing", "recompute"} & set(named):
            continue
        frames = " ".join(f for e in ctx.evidence.errors for f in e.frames).lower()
        lib = "megatron" if is_megatron(ctx) else "deepspeed"
        if "deepspeed" not in frames + low and lib == "deepspeed" and "zero" not in low:
            lib = "the framework"
        command = (
            f"pip install -U {lib}" if lib != "the framework" else "pip install -U <framework>"
        )
        return Match(
            0.55,
            f"The paste says {' and '.join(named)} work one at a time but fail together "
            f"('{line[:140]}'): the framework's path for the combination is at fault.",
            config_patch={"command": command, "gradient_checkpointing": False},
        )
    return None


def _newer(a: str, b: str) -> bool:
    """Release a is later than release b ("2.11.0" vs "2.9.1"); False when unreadable."""

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])

    try:
        return key(a) > key(b)
    except ValueError:
        return False


@rule(
    "RK600",
    "Same code, another release: it worked on one version and fails on the next (a regression)",
    "framework_bug",
    symptom="The paste says the same script works (or takes less memory) on one release and "
    'fails, OOMs or takes more memory on another ("runs fine on 2.5.1 but OOMs on 2.9", '
    '"worked up until 1.7.7, stopped working from 1.8.0", "after upgrading to ...")',
    cause="A change in the library between the two releases (a cuDNN algorithm / workspace "
    "choice, an allocator or autograd change, a leak on a new code path): a regression, not a "
    "setting of the user's",
    confirm="Run the same script on both releases and compare torch.cuda.max_memory_allocated(); "
    "bisect the releases (nightlies) to the change",
    fix="Pin the release that worked and report the regression upstream with both versions; "
    "move to a release that fixes it once there is one",
    patch={"command": "pip install <library>==<the release that worked>"},
    supersedes=("RK170", "RK005"),
)
def _release_regression(ctx: Context) -> Match | None:
    said = fact(ctx, "release_regression")
    if not said:
        return None
    lib, good, bad, line = said
    package = lib or "<the library>"
    pin = good.split("+")[0]
    fix = (
        f"A regression between {lib or 'the'} releases {good} and {bad}: pin the release that "
        f"worked (pip install {package}=={pin}) and report it upstream with both versions; "
        "move to a release that fixes it once there is one"
    )
    if _newer(good, bad):
        fix = (
            f"A bug of {lib or 'the library'} {bad} that {good} no longer has: upgrade (pip "
            f"install {package}=={pin}) rather than working around it"
        )
    patch: dict = {"command": f"pip install {package}=={pin}"}
    if fact(ctx, "cudnn_said") and lib in ("torch", "cudnn", ""):
        fix += (
            "; cuDNN picks a different convolution algorithm per release: set "
            "torch.backends.cudnn.benchmark = False and torch.backends.cudnn.deterministic = True "
            "(the default algorithm, small workspace) or cap its workspace (CUDNN_CONV_WSCAP_DBG, "
            "MiB)"
        )
        patch["code"] = (
            "torch.backends.cudnn.benchmark = False; torch.backends.cudnn.deterministic = True"
        )
    wrapper, fsdp = fact(ctx, "ckpt_wrapper"), fact(ctx, "fsdp_named")
    if wrapper and fsdp:
        fix += (
            "; meanwhile apply FSDP and the checkpoint_wrapper yourself, in that order (Lightning: "
            "wrap the model with FSDP and apply_activation_checkpointing in "
            "configure_sharded_model / configure_model) instead of leaving the wrapping to "
            "the strategy"
        )
    return Match(
        0.6,
        f"The paste says the same code works on {good} and not on {bad} ('{line[:160]}'): "
        "the change is in the library between the releases.",
        config_patch=patch,
        fix=fix,
    )


@rule(
    "RK680",
    "A compiler saves more tensors for backward than the computation needs",
    "framework_bug",
    symptom="A compiled (jit / torch.compile / nvFuser) program's trace is pasted next to a "
    "count or size of the tensors saved for backward (len(grad_fn.saved_tensors)=5, 'Saved "
    "tensors size: 580 MiB') that is larger than the eager or checkpointed run's",
    cause="The compiler's rematerialization / min-cut partitioner decides what to save for "
    "backward per fusion region; when a producer feeds several consumers across regions (a "
    "residual connection, a linear left outside the fusion) it saves every intermediate "
    "instead of recomputing the cheap ones: a limitation of the compiler, not a setting of "
    "the user's",
    confirm="Compare len(out.grad_fn.saved_tensors) and their total size between the eager and "
    "compiled runs; print the forward trace and look at what its return saves",
    fix="Let the fusion region cover the matmuls so rematerialization sees one producer -> "
    "one consumer (thunder: thunder.jit(f, nv_enable_linear=True, nv_enable_matmul=True); "
    "torch.compile: lower torch._functorch.config.activation_memory_budget); report the trace "
    "to the compiler's issue tracker",
    patch={"nv_enable_linear": True, "nv_enable_matmul": True},
)
def _compiler_saves_too_much(ctx: Context) -> Match | None:
    saved, trace = fact(ctx, "saved_report"), fact(ctx, "compiled_trace")
    if not (saved and trace) or ctx.evidence.errors:
        return None
    return Match(
        0.6,
        f"The paste reports what is saved for backward ('{'; '.join(saved[:2])[:140]}') next "
        f"to a compiler's trace ('{trace[0][:90]}'): the compiler's rematerialization chose "
        "what to keep, and it keeps more than the computation needs.",
    )


@rule(
    "RK690",
    "On the recompute path an argument lands in another parameter's slot",
    "framework_bug",
    symptom="A checkpoint call (tensor_parallel.checkpoint, torch.utils.checkpoint) passes the "
    "layer's forward arguments positionally, and one of them sits where the forward expects "
    "another parameter (rotary embeddings where inference_params go)",
    cause="The recompute wrapper forwards *args positionally: when the forward's signature "
    "gains or orders a parameter differently, the checkpointed call silently hands a tensor "
    "to the wrong parameter; only the recompute path (full recompute) is affected",
    confirm="Print the argument's type inside forward with recompute on and off: it differs "
    "(or the feature it belongs to silently stops working only under recompute)",
    fix="Pass the arguments in the forward's order (None for the skipped ones) or by keyword "
    "through a closure / functools.partial; upgrade the framework to the release that fixes "
    "the call",
    patch={"code": "checkpoint(functools.partial(layer, <name>=<name>), ...)"},
    supersedes=("RK420", "RK170"),
)
def _ckpt_arg_misorder(ctx: Context) -> Match | None:
    found = fact(ctx, "ckpt_arg_misorder")
    if not found:
        return None
    passed, slot = found["passed"], found["slot"]
    return Match(
        0.6,
        f"'{found['line'][:160]}' passes {passed} positionally where the forward's "
        f"signature has {slot}: under recompute {slot} receives {passed}'s value and {passed} "
        "is dropped.",
        config_patch={
            "code": f"checkpoint(..., {slot}=None, {passed}={passed}) "
            "# or functools.partial(fn, " + f"{passed}={passed})",
            "command": "pip install -U <the framework>",
        },
        fix=f"A bug on the recompute path: pass {passed} in its own slot (None for {slot}) or "
        f"by keyword (functools.partial(fn, {passed}={passed})); upgrade the framework to a "
        "release that fixes the checkpoint call, or turn full recompute off meanwhile",
    )
