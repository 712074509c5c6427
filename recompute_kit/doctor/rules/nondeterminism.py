"""Recompute that does not redo what the forward did: other ops, another dtype, other random
numbers, another kernel backend (what pasted debug output, code and tables show); and what the
reentrant checkpoint keeps alive between forward and backward (its run function)."""

from __future__ import annotations

from ..types import Context, Match
from .registry import fact, is_megatron, rule

PT_CKPT = "https://docs.pytorch.org/docs/stable/checkpoint.html"

# Ops whose output depends on the data: routing and token counts (MoE), and random ops.
ROUTING_OPS = (
    "topk",
    "sort",
    "argsort",
    "nonzero",
    "bincount",
    "histc",
    "unique",
    "_unique2",
    "masked_select",
    "cumsum",
    "argmax",
    "max",
    "scatter_add",
    "index_add",
)
RANDOM_OPS = ("native_dropout", "bernoulli", "rand", "randn", "randint", "multinomial", "uniform")
CAST_OPS = ("_to_copy", "to", "_autocast_to_reduced_precision", "_autocast_to_full_precision")


def _first_difference(forward: list[str], again: list[str]) -> tuple[int, str, str] | None:
    for i, (a, b) in enumerate(zip(forward, again, strict=False)):
        if a != b:
            return i, a, b
    if len(forward) != len(again):
        i = min(len(forward), len(again))
        a = forward[i] if i < len(forward) else "(end)"
        b = again[i] if i < len(again) else "(end)"
        return i, a, b
    return None


def _kind(op: str) -> str | None:
    name = op.split(".", 1)[-1]
    if name in ROUTING_OPS:
        return "routing"
    if name in RANDOM_OPS:
        return "random"
    if name in CAST_OPS:
        return "cast"
    return None


@rule(
    "RK145",
    "Checkpoint debug mode: the recompute ran different operators",
    "nondeterministic_recompute",
    symptom="torch.utils.checkpoint debug output (debug=True / set_checkpoint_debug_enabled): "
    "'Detected non-determinism while running activation checkpointing ... different "
    "operators were ran in the original forward and in the recomputation'",
    cause="The checkpointed region takes another path in the recompute: data-dependent ops "
    "(an MoE router's topk with ties, capacity and token-count ops such as nonzero / bincount "
    "/ sort), random ops without the RNG state restored, or casts under another autocast "
    "state",
    confirm="The op lists in the debug output: the first op that differs, and its stack trace "
    "in section 2",
    fix="Keep the data-dependent result from the forward instead of recomputing it (save the "
    "router's topk / routing map, router replay, Megatron: recompute only moe_act), keep "
    "preserve_rng_state=True for random ops, and enter autocast outside the checkpoint",
    patch={"code": "save the op's output in the checkpoint (selective checkpointing policy)"},
    refs=(PT_CKPT,),
    supersedes=("RK075",),  # the op lists say more than the metadata message
)
def _debug_ops(ctx: Context) -> Match | None:
    ops = fact(ctx, "debug_ops", "log")
    if not ops:
        return None
    diff = _first_difference(ops["forward"], ops["recompute"])
    if diff is None:
        return None
    i, a, b = diff
    kind = _kind(a) or _kind(b)
    evidence = (
        f"The debug output lists {len(ops['forward'])} ops in the forward and "
        f"{len(ops['recompute'])} in the recompute; they first differ at op {i + 1}: "
        f"{a} in the forward, {b} in the recompute."
    )
    if kind == "routing":
        patch = (
            {"recompute_granularity": "selective", "recompute_modules": ["moe_act"]}
            if is_megatron(ctx)
            else {
                "code": "save the router output: selective checkpointing with aten.topk (and "
                "the gate's mm) as MUST_SAVE, or keep the router outside the checkpoint"
            }
        )
        return Match(
            0.9,
            evidence + " A routing / token-count op: the recompute routed tokens differently "
            "(router ties, capacity).",
            config_patch=patch,
            fix="Do not recompute the routing: save the router's topk (selective "
            "checkpointing save list, router replay) or keep the router outside the "
            "checkpoint; Megatron: recompute moe_act, not the whole moe layer",
        )
    if kind == "random":
        return Match(
            0.9,
            evidence + " A random op: the recompute drew other random numbers.",
            config_patch={"preserve_rng_state": True},
            fix="Keep preserve_rng_state=True (the default) in the checkpoint calls, and the "
            "RNG tracker forked the same way in forward and recompute",
        )
    if kind == "cast":
        return Match(
            0.85,
            evidence + " A cast: autocast differs between the forward and the recompute.",
            config_patch={"use_reentrant": False},
            fix="Enter autocast outside the checkpointed function (use_reentrant=False "
            "restores the forward's autocast state, dtype included)",
        )
    return Match(0.85, evidence + " Find that op's call site in the stack traces above.")


@rule(
    "RK146",
    "Autocast dtype lost in the recompute (bfloat16 recomputed as float16)",
    "nondeterministic_recompute",
    symptom="torch.utils.checkpoint under autocast(dtype=torch.bfloat16) with the dtypes "
    "printed: the recompute in backward runs in float16 (printed dtypes differ), or the saved "
    "and recomputed dtypes differ",
    cause="Before PyTorch 1.11 the reentrant checkpoint re-entered autocast with its default "
    "dtype (float16), not the forward's dtype; a checkpointed function that enters its own "
    "autocast has the same effect in any version",
    confirm="Print the dtype inside the checkpointed module in forward and in backward",
    fix="Upgrade torch (>= 1.11 propagates the full autocast state), use the non-reentrant "
    "checkpoint (use_reentrant=False), and enter autocast outside the checkpointed function",
    patch={"use_reentrant": False, "command": "pip install -U torch"},
    refs=("https://github.com/pytorch/pytorch/pull/71169",),
)
def _autocast_dtype(ctx: Context) -> Match | None:
    calls, dtypes = fact(ctx, "checkpoint_call"), fact(ctx, "autocast_dtypes") or []
    if not calls or "bfloat16" not in dtypes:
        return None
    printed = fact(ctx, "printed_dtypes") or []
    if not printed:
        # checkpoint + bf16 autocast is every other training script: only a paste that prints
        # the dtypes (the reporter looking at them) is about the recompute's dtype
        return None
    if fact(ctx, "use_reentrant") is False and len(set(printed)) < 2:
        return None  # the non-reentrant checkpoint restores the autocast state
    both = {"bfloat16", "float16"} <= set(printed)
    return Match(
        0.85 if both else 0.6,
        f"The code checkpoints ('{calls[0]}') under autocast with bfloat16 "
        f"('{(fact(ctx, 'autocast') or [''])[0]}')"
        + (
            "; the printed dtypes show both bfloat16 and float16: the recompute ran in float16."
            if both
            else ": the reentrant checkpoint of older PyTorch recomputes in float16."
        ),
    )


@rule(
    "RK147",
    "Dropout in checkpointed blocks without the RNG state preserved",
    "nondeterministic_recompute",
    symptom="Loss differs with activation checkpointing on vs off (same seed and data) while "
    "the model uses dropout; or preserve_rng_state=False with dropout",
    cause="The recompute re-runs dropout; without the RNG state of the forward restored it "
    "draws fresh masks, so the gradients belong to another sample than the loss",
    confirm="Set dropout to 0 for one run: the on/off difference goes",
    fix="Keep preserve_rng_state=True in the checkpoint calls (the default; a framework may "
    "hard-code False), or disable dropout in the checkpointed blocks",
    patch={"preserve_rng_state": True},
    refs=("https://github.com/allenai/OLMo-core/pull/828", PT_CKPT),
)
def _dropout_rng(ctx: Context) -> Match | None:
    dropout = dict(fact(ctx, "dropout") or {})
    dropout.update(
        {k: v for k, v in ctx.cfg.items() if "dropout" in k and isinstance(v, float) and 0 < v < 1}
    )
    preserve = fact(ctx, "preserve_rng_state")
    ac = fact(ctx, "ac_loss")
    shift = None
    if ac and ac["off"]:
        shift = (ac["on"] - ac["off"]) / abs(ac["off"])
    prose = fact(ctx, "rng_not_restored") or []
    if prose and (dropout or fact(ctx, "dropout_named")):
        return Match(
            0.85,
            f"Dropout in the checkpointed blocks, and the recompute runs without the forward's "
            f"RNG state: '{prose[0]}'.",
        )
    if preserve is not False and not (shift is not None and abs(shift) > 0.02):
        return None
    if not (dropout or fact(ctx, "dropout_named")) and not (
        shift is not None and abs(shift) > 0.02
    ):
        return None  # preserve_rng_state=False with nothing random recomputed is harmless
    words = []
    if dropout:
        key, value = next(iter(dropout.items()))
        words.append(f"{key} = {value}")
    if preserve is False:
        words.append("preserve_rng_state = False")
    if shift is not None and abs(shift) > 0.02:
        words.append(
            f"mean {ac['column']} {ac['on']:.3f} with checkpointing on vs {ac['off']:.3f} off "
            f"({shift:+.1%})"
        )
    confidence = 0.85 if dropout and (preserve is False or shift) else 0.6
    return Match(
        confidence,
        "Dropout is recomputed without the forward's RNG state: " + "; ".join(words) + ".",
    )


_RECOMPUTING = ("compile", "checkpoint", "recompute", "partitioner", "memory_budget")
_RANDOM_WORDS = ("rng", "dropout", "random", "seed", "bernoulli")


@rule(
    "RK653",
    "Gradients differ from eager's with random ops: the recompute drew fresh random numbers",
    "nondeterministic_recompute",
    symptom="The paste reports that gradients differ (grad match: False, 'differs from eager') "
    "between a compiled / checkpointed run and eager, and names random ops (dropout, RNG, "
    "a mask), with no error",
    cause="The recompute (torch.compile's partitioner when it recomputes under an "
    "activation_memory_budget, or a checkpoint without preserved RNG state) redraws random "
    "ops instead of replaying the forward's: backward applies another dropout mask and the "
    "gradients are silently wrong",
    confirm="Set dropout to 0 (or torch._functorch.config.activation_memory_budget = 1.0): "
    "if the gradients then match, the recomputed random ops are the cause",
    fix="Upgrade torch (partitioner fixes that save the forward's RNG outputs); meanwhile "
    "activation_memory_budget 1.0 (no forced recompute of random ops), or keep "
    "preserve_rng_state=True on checkpoints",
    patch={"command": "pip install -U torch", "activation_memory_budget": 1.0},
    refs=(PT_CKPT,),
)
def _grads_differ_with_rng(ctx: Context) -> Match | None:
    if ctx.oom or any(e.kind == "exception" and e.type for e in ctx.evidence.errors):
        return None
    lines = fact(ctx, "grad_mismatch") or []
    said = set(fact(ctx, "grad_mismatch_words") or [])
    if not lines or not (said & set(_RECOMPUTING) or fact(ctx, "mentions")):
        return None
    if not (said & set(_RANDOM_WORDS) or fact(ctx, "dropout_named")):
        return None
    return Match(
        0.6,
        f"The paste says the gradients differ ('{lines[0][:160]}') with recompute / compile "
        "and random ops named: the recompute drew fresh random numbers (another dropout mask) "
        "instead of the forward's.",
        config_patch={"command": "pip install -U torch", "activation_memory_budget": 1.0},
        fix="Upgrade torch; meanwhile torch._functorch.config.activation_memory_budget = 1.0 "
        "(no forced recompute of random ops) or preserve_rng_state=True, and confirm with "
        "dropout 0",
    )


# --------------------------------------------------------------------------------------------
# Another kernel in the recompute: a backend picked per call
# --------------------------------------------------------------------------------------------

_INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


def _kernel_signs(pairs: list[tuple[str, str, str, str]]) -> list[str]:
    """What in CheckpointError's (saved shape, dtype, recomputed shape, dtype) pairs only
    another kernel explains: integer tensors of another integer dtype (autocast casts floats
    only: a fused kernel's RNG seed / offset, int64 scalars in one backend, a uint64 pair in
    another), or a shape that differs only by a trailing 1 (a softmax statistic laid out
    [..., S, 1] by one attention backend and [..., S] by another)."""
    signs = []
    for shape, dtype, shape2, dtype2 in pairs:
        a = [v.strip() for v in shape.split(",") if v.strip()]
        b = [v.strip() for v in shape2.split(",") if v.strip()]
        if dtype != dtype2 and {dtype, dtype2} <= _INT_DTYPES:
            signs.append(f"{dtype} saved, {dtype2} recomputed")
        elif (
            a != b
            and len(a) > 1
            and len(b) > 1
            and ((a[:-1] == b and a[-1] == "1") or (b[:-1] == a and b[-1] == "1"))
        ):
            signs.append(f"[{', '.join(a)}] saved, [{', '.join(b)}] recomputed")
    return signs


@rule(
    "RK701",
    "The recompute ran another kernel backend (SDPA / fused attention picked per call)",
    "nondeterministic_recompute",
    symptom="CheckpointError 'Recomputed values ... have different metadata' where integer "
    "tensors change dtype (int64 saved, uint64 recomputed; scalars vs a pair) or a shape "
    "differs only by a trailing 1 ([B, H, S, 1] vs [B, H, S])",
    cause="A kernel chosen at run time (scaled_dot_product_attention's backend: cuDNN "
    "attention, flash, memory-efficient; a MoE dispatcher's fused kernel) is picked again in "
    "the recompute and the choice differs: each backend saves its own tensors for backward "
    "(its RNG seed / offset as int64 scalars or a uint64 pair, its logsumexp with or without "
    "a trailing 1), so the recomputed set no longer matches the forward's. Autocast cannot "
    "explain it: it casts floating tensors only",
    confirm="Pin one backend for the whole step (torch.nn.attention.sdpa_kernel) and rerun: "
    "the error goes",
    fix="Pin the attention backend so forward and recompute use the same kernel: exclude "
    "SDPBackend.CUDNN_ATTENTION when activation_checkpointing is on "
    "(torch.backends.cuda.enable_cudnn_sdp(False), or wrap the step in "
    "sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])); a framework "
    "that selects kernels per call (MoE dispatchers) needs its deterministic choice under "
    "activation_checkpointing",
    patch={"code": "torch.backends.cuda.enable_cudnn_sdp(False)"},
    refs=(PT_CKPT, "https://github.com/NVIDIA-NeMo/RL/pull/1676"),
    supersedes=("RK075",),
)
def _kernel_backend(ctx: Context) -> Match | None:
    pairs = fact(ctx, "metadata_pairs") or []
    signs = _kernel_signs(pairs)
    if not signs:
        return None
    text = " ".join(f"{e.message} {e.details} {' '.join(e.frames)}" for e in ctx.evidence.errors)
    moe = any(w in text.lower() for w in ("dispatch", "router", "moe", "expert", "permut"))
    if moe:
        return None  # token counts per expert: RK075 reads routing
    return Match(
        0.85,
        f"The CheckpointError lists {len(pairs)} tensor(s) whose metadata changed, "
        f"{len(signs)} of them as only another kernel changes them ({'; '.join(signs[:3])}): "
        "integer dtypes autocast does not touch, a trailing 1 of a softmax statistic. The "
        "recompute ran another backend than the forward (scaled_dot_product_attention picks "
        "cuDNN attention, flash or memory-efficient per call).",
        config_patch={"code": "torch.backends.cuda.enable_cudnn_sdp(False)"},
        fix="Pin the attention backend for forward and recompute alike: disable "
        "SDPBackend.CUDNN_ATTENTION while activation_checkpointing is on "
        "(torch.backends.cuda.enable_cudnn_sdp(False)), or wrap the step in "
        "sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])",
    )


# --------------------------------------------------------------------------------------------
# What the reentrant checkpoint keeps alive
# --------------------------------------------------------------------------------------------


@rule(
    "RK702",
    "A reentrant checkpoint's output stored where its run function reaches: a reference cycle",
    "checkpoint_api_misuse",
    symptom="Memory grows step after step (max_memory_allocated rises) with "
    "checkpoint(fn, ..., use_reentrant=True) whose output is stored in an object fn refers to "
    "(a closure's dict, self for a bound method); gc.collect() frees it",
    cause="The reentrant CheckpointFunction keeps run_function on its autograd ctx; the "
    "output's graph reaches ctx, ctx the function, the function its closure / self, and that "
    "object the output: a cycle. Python's gc only looks one hop into the autograd graph past "
    "a tensor, so reference counting never frees it and the activations stay until a full "
    "gc.collect()",
    confirm="Call gc.collect() each step: the growth stops; or pass use_reentrant=False",
    fix="Use the non-reentrant checkpoint (use_reentrant=False: it keeps no run_function on "
    "the graph), or do not store the checkpoint's output in an object the function captures; "
    "gc.collect() after backward as a stopgap",
    patch={"use_reentrant": False},
    refs=(PT_CKPT, "https://github.com/pytorch/pytorch/issues/84413"),
)
def _output_cycle(ctx: Context) -> Match | None:
    cycle = fact(ctx, "ckpt_output_cycle")
    if not cycle or fact(ctx, "use_reentrant") is False:
        return None
    call, store, container = cycle
    return Match(
        0.8,
        f"The checkpointed call '{call[:100]}' is reentrant, and its output is stored in "
        f"'{container}' ('{store[:80]}'), which the checkpointed function refers to: output "
        f"-> graph -> ctx.run_function -> {container} -> output is a reference cycle only "
        "gc.collect() frees, so each step's activations stay.",
        config_patch={"use_reentrant": False},
        fix="Pass use_reentrant=False to the checkpoint (no run_function kept on the graph), "
        f"or keep the output out of '{container}'; gc.collect() after backward as a stopgap",
    )
