"""PyTorch / Hugging Face checkpoint API pitfalls and non-deterministic recompute."""

from __future__ import annotations

import re

from ..types import Context, Match
from .registry import all_frames, fact, is_megatron, on_message, rule

# --------------------------------------------------------------------------------------------
# PyTorch / Hugging Face checkpoint API pitfalls
# --------------------------------------------------------------------------------------------

PT_CKPT = "https://docs.pytorch.org/docs/stable/checkpoint.html"
CKPT_RULES = [
    (
        "RK070",
        "Reentrant checkpoint with .grad() or backward(inputs=...)",
        (
            "incompatible with .grad() or passing an `inputs` parameter",
            "Checkpointing is not compatible with .grad()",
        ),
        "RuntimeError from torch.autograd.grad through a reentrant checkpoint",
        "The reentrant implementation runs its own backward inside backward",
        "Pass use_reentrant=False (or call .backward())",
        {"use_reentrant": False},
    ),
    (
        "RK071",
        "No checkpoint input requires grad",
        (
            "None of the inputs have requires_grad=True",
            "element 0 of tensors does not require grad and does not have a grad_fn",
            # the Variable-era wording, still printed by builds and forks in use
            "element 0 of variables does not require grad and does not have a grad_fn",
        ),
        "UserWarning 'None of the inputs have requires_grad=True. Gradients will be None', then "
        "'element 0 of tensors does not require grad'",
        "A reentrant checkpoint whose inputs (e.g. frozen embeddings under PEFT/LoRA) do not "
        "require grad produces outputs without grad_fn",
        "use_reentrant=False, or make the input require grad (Hugging Face: "
        "model.enable_input_require_grads())",
        {"use_reentrant": False},
    ),
    (
        "RK072",
        "use_reentrant not passed",
        (
            "the use_reentrant parameter should be passed explicitly",
            "please pass in use_reentrant=True or use_reentrant=False explicitly",
        ),
        "UserWarning asking to pass use_reentrant explicitly",
        "torch.utils.checkpoint still defaults to the reentrant variant and will start to raise",
        "Pass use_reentrant=False explicitly (Hugging Face: gradient_checkpointing_kwargs="
        "{'use_reentrant': False})",
        {"use_reentrant": False},
    ),
    (
        "RK073",
        "Keyword arguments to a reentrant checkpoint",
        ("Unexpected keyword arguments",),
        "ValueError: Unexpected keyword arguments: ...",
        "The reentrant checkpoint takes positional tensors only; when the rejected name is "
        "use_reentrant (or context_fn, determinism_check, debug) the installed PyTorch predates "
        "that parameter of checkpoint",
        "use_reentrant=False, or pass the values positionally (functools.partial for "
        "non-tensors); for 'Unexpected keyword arguments: use_reentrant' upgrade PyTorch "
        "(>= 1.11) or drop the argument",
        {"use_reentrant": False},
    ),
    (
        "RK074",
        "DDP: parameter marked ready twice",
        ("marked as ready twice", "Expected to mark a variable ready only once"),
        "RuntimeError 'Expected to mark a variable ready only once' with checkpointing under DDP",
        "Reentrant checkpoints run several backward passes that fire DDP's hooks again",
        "use_reentrant=False, or DDP(static_graph=True) / _set_static_graph()",
        {"use_reentrant": False},
    ),
]


def _failing(ctx: Context) -> bool:
    return bool(ctx.oom) or any(e.kind == "exception" and e.type for e in ctx.evidence.errors)


def _reentrant_warning(ctx: Context) -> Match | None:
    """PyTorch >= 2.4 words it as a coming error ("should be passed explicitly ... will raise
    an exception"); the exception never came (pytorch#193720), so alone, with nothing failing,
    RK672 reads it as a notice and drops this finding. The older wording ("please pass in
    use_reentrant=True or ...") counts only with a failure in the log (else RK151)."""
    new = on_message(RK072_NEW)(ctx)
    if new is not None:
        cut = [
            e for e in ctx.evidence.errors if e.kind == "exception" and not e.type
        ]  # a traceback cut before its exception line: something failed, the paste hides what
        if cut:
            return Match(
                0.45,
                new.evidence + " A traceback beside it is cut before its exception line: the "
                "warning alone does not say that the failure is the checkpoint's.",
            )
        return new
    return on_message(RK072_OLD)(ctx) if _failing(ctx) else None


# torch.utils.checkpoint's own parameters, by the release that added them: a PyTorch older than
# that passes them on to the checkpointed function as **kwargs and rejects them there.
CKPT_PARAMS_SINCE = {
    "use_reentrant": "1.11",
    "context_fn": "2.1",
    "determinism_check": "2.1",
    "debug": "2.1",
}


def _unexpected_kwargs(ctx: Context) -> Match | None:
    found = on_message("Unexpected keyword arguments")(ctx)
    if found is None:
        return None
    names: list[str] = []
    for e in ctx.evidence.errors:
        m = re.search(r"Unexpected keyword arguments:\s*([\w, ]+)", e.message)
        if m:
            names += [n for n in re.split(r"[,\s]+", m.group(1)) if n]
    own = [n for n in names if n in CKPT_PARAMS_SINCE]
    if not own:
        return found
    since = max((CKPT_PARAMS_SINCE[n] for n in own), key=lambda v: tuple(map(int, v.split("."))))
    return Match(
        0.95,
        f"{found.evidence} '{own[0]}' is a parameter of torch.utils.checkpoint itself since "
        f"PyTorch {since}: the installed PyTorch is older, so it reached the reentrant "
        "checkpoint's **kwargs.",
        config_patch={"command": f"pip install -U 'torch>={since}'"},
        fix=f"Upgrade PyTorch to >= {since} (where checkpoint takes {', '.join(own)}), or drop "
        "the argument from the checkpoint call on this PyTorch",
    )


# "element N of tensors does not require grad": N is whichever output of the checkpointed block
# (or of the loss tuple) came out without grad_fn, 0 or another index; "variables" in the
# Variable-era wording; reporters who met it for two indices write "element 0 or 1".
_NO_GRAD_ELEMENT = re.compile(
    r"element \d+(?:\s*(?:or|and|,|/)\s*\d+)* of (?:tensors|variables) does not require grad"
)


def _no_input_grad(ctx: Context) -> Match | None:
    """The error (a warning alone is RK099's); quoting the first of warning and error."""
    texts = [" ".join(f"{e.type}: {e.message}".split()) for e in ctx.evidence.errors]
    if not any(_NO_GRAD_ELEMENT.search(t) for t in texts):
        said = fact(ctx, "frozen_ckpt_prose")
        if said:  # the same, said in words: frozen inputs, checkpointing, no gradients
            return Match(0.6, f"The paste says: '{said[0][:200]}'")
        return None
    for text in texts:
        if "None of the inputs have requires_grad=True" in text or _NO_GRAD_ELEMENT.search(text):
            quoted = text if len(text) < 220 else text[:217] + "..."
            return Match(0.95, f'The log says: "{quoted}"')
    return None


RK072_NEW = "the use_reentrant parameter should be passed explicitly"
RK072_OLD = "please pass in use_reentrant=True or use_reentrant=False explicitly"

for _id, _title, _frags, _symptom, _cause, _fix, _patch in CKPT_RULES:
    _check = on_message(*_frags)
    if _id == "RK071":
        _check = _no_input_grad
    if _id == "RK072":
        _check = _reentrant_warning
    if _id == "RK073":
        _check = _unexpected_kwargs
    rule(
        _id,
        _title,
        "checkpoint_api_misuse",
        symptom=_symptom,
        cause=_cause,
        confirm="The traceback names torch/utils/checkpoint.py",
        fix=_fix,
        patch=_patch,
        refs=(PT_CKPT,),
    )(_check)


_METADATA_MISMATCH = on_message(
    "have different metadata than during the forward pass",
    "CheckpointError: Recomputed values for the following tensors",
    "A different number of tensors was saved during the original forward and recomputation",
    "Something went unexpectedly wrong in activation checkpoint",
)
MOE_WORDS = ("router", "expert", "moe", "row_id_map", "topk", "dispatch", "permut")
COMPILE_WORDS = ("torch.compile", "compile", "dynamo", "inductor")
FSDP2_WORDS = ("fsdpv2", "fsdp2", "fully_shard", "mixedprecisionpolicy", "mp_policy")


def _doubled_length(saved: list[str], again: list[str]) -> tuple[str, str] | None:
    """(saved, recomputed) of the first pair where one dimension past the first exactly
    doubled and the others are equal, when such pairs are most of the differing ones: the
    recompute appended to a KV cache the forward filled."""
    differing = [(a, b) for a, b in zip(saved, again, strict=False) if a != b]
    doubled = []
    for a, b in differing:
        x, y = [v.strip() for v in a.split(",")], [v.strip() for v in b.split(",")]
        if len(x) != len(y) or len(x) < 2 or not all(v.isdigit() for v in x + y):
            continue
        moved = [i for i, (u, v) in enumerate(zip(x, y, strict=True)) if u != v]
        if len(moved) == 1 and moved[0] > 0 and int(y[moved[0]]) == 2 * int(x[moved[0]]) > 2:
            doubled.append((a, b))
    if doubled and 2 * len(doubled) > len(differing):
        return doubled[0]
    return None


@rule(
    "RK075",
    "Recomputed tensors differ from the forward's",
    "nondeterministic_recompute",
    symptom="CheckpointError: 'Recomputed values for the following tensors have different "
    "metadata than during the forward pass'",
    cause="The checkpointed function is not deterministic in shape/dtype: data-dependent "
    "control flow (MoE routing, token counts), a global flag changed between forward and "
    "backward, or torch.compile picking another graph",
    confirm="Rerun with torch.utils.checkpoint.set_checkpoint_debug_enabled(True) to see the "
    "ops that differ",
    fix="Find the op that differs (set_checkpoint_debug_enabled(True)) and make the region "
    "deterministic: apply activation checkpointing before torch.compile rather than inside a "
    "compiled region, no global state changes between forward and backward, and for MoE "
    "record and replay the routing. The reentrant implementation (use_reentrant=True) does not "
    "compare saved and recomputed tensors, a workaround when the difference is harmless",
    patch={"code": "torch.utils.checkpoint.set_checkpoint_debug_enabled(True)"},
    refs=(PT_CKPT, "https://github.com/pytorch/pytorch/issues/166926"),
)
def _metadata_mismatch(ctx: Context) -> Match | None:
    found = _METADATA_MISMATCH(ctx)
    if found is None:
        # the error's "saved metadata / recomputed metadata" lines pasted without its header
        moved = [p for p in fact(ctx, "metadata_pairs") or [] if p[:2] != p[2:]]
        if not moved:
            return None
        a, d, b, d2 = moved[0]
        found = Match(
            0.6,
            f"The paste shows a tensor saved as [{a}] {d} and recomputed as [{b}] {d2}: "
            "torch.utils.checkpoint's CheckpointError lines (its header not pasted).",
        )
    text = " ".join(
        f"{e.type} {e.message} {e.details} {' '.join(e.frames)} {' '.join(e.context)}"
        for e in ctx.evidence.errors
    ).lower()
    saved = re.findall(r"saved metadata: \{'shape': torch\.size\(\[([^\]]*)\]\)", text)
    again = re.findall(r"recomputed metadata: \{'shape': torch\.size\(\[([^\]]*)\]\)", text)
    pasted = fact(ctx, "metadata_pairs") or []
    if len(pasted) > len(saved):  # pairs the paste put before the exception line too
        saved = [p[0] for p in pasted]
        again = [p[2] for p in pasted]
    differing = [(a, b) for a, b in zip(saved, again, strict=False) if a != b]
    leading = [  # only the leading (token) dimension moved: routing, capacity
        (a, b)
        for a, b in differing
        if len(a.split(",")) == len(b.split(",")) > 1
        and a.split(",")[0] != b.split(",")[0]
        and a.split(",")[1:] == b.split(",")[1:]
    ]
    # Routing changes token counts throughout; shapes of other ranks at the same positions
    # mean another sequence of ops ran (a shifted list), not routing.
    token_count = bool(leading) and 2 * len(leading) > len(differing)
    count = re.search(
        r"number of tensors saved during forward: (\d+)\s*number of tensors saved during "
        r"recomputation: (\d+)",
        text,
    )
    rich = fact(ctx, "metadata_pairs") or []
    if len(rich) > len(saved):
        saved, again = [p[0] for p in rich], [p[2] for p in rich]
    if (cache := _doubled_length(saved, again)) is not None:
        return Match(
            0.9,
            f"{found.evidence} The recompute saw a sequence length twice the forward's "
            f"({cache[0]} -> {cache[1]}, other dimensions equal): keys / values were appended "
            "to a cache the forward already filled, so the recompute attended over both.",
            config_patch={"use_cache": False},
            fix="Turn the KV cache off in training (use_cache=False, model.config.use_cache = "
            "False): a forward that updates past_key_values (global state) runs differently "
            "when the checkpoint re-runs it",
        )
    moe = next((w for w in MOE_WORDS if w in text), None) or (
        "num_moe_experts" if ctx.is_moe else None
    )
    if count is not None and not moe:
        return Match(
            0.9,
            f"{found.evidence} The forward saved {count.group(1)} tensors, the recompute "
            f"{count.group(2)}: another code path ran (data-dependent branches).",
            config_patch={
                "code": "save the router/gate outputs in the checkpoint (selective "
                "checkpointing: policy MUST_SAVE for aten.topk / the gate's mm), or keep the "
                "gate out of LoRA target_modules"
            },
            fix="Make the checkpointed region run the same ops twice: a count that differs "
            "is a data-dependent branch, most often an MoE router/gate choosing other experts "
            "in the recompute (experts that get no tokens are skipped). Save the router/gate "
            "outputs (selective checkpointing with the topk in the save list, router replay), "
            "keep the gate out of LoRA target_modules, or find the branch with "
            "set_checkpoint_debug_enabled(True)",
        )
    if moe is None and token_count:
        moe = "a token count that changed between forward and recompute"
    if moe:
        if is_megatron(ctx):
            patch = {"recompute_granularity": "selective", "recompute_modules": ["moe_act"]}
        else:
            patch = {"code": "keep the router outside the checkpoint (save its topk output)"}
        return Match(
            0.9,
            f"{found.evidence} The region holds MoE routing ('{moe}'): the recompute routed "
            "a different number of tokens per expert than the forward.",
            config_patch=patch,
            fix="Do not recompute the router: keep its topk / routing from the forward "
            "(router replay, or the router's topk in the checkpoint's save list), and "
            "recompute only the experts' activation (Megatron: recompute_modules [moe_act]); "
            "a fused dispatcher (DeepEP, flex) can count tokens differently on the re-run: "
            "a deterministic token dispatcher (alltoall) under checkpointing",
        )
    hit = next((w for w in COMPILE_WORDS if w in text), None)
    if hit:
        return Match(
            0.85,
            f"{found.evidence} torch.compile is in play ('{hit}'): the compiled region "
            "saves different tensors than its eager recompute.",
            config_patch={"compile": False},
            fix="Apply activation checkpointing before torch.compile and compile whole "
            "checkpointed blocks (or turn compile off for them); do not checkpoint inside a "
            "compiled region",
        )
    pairs = re.findall(
        r"saved metadata: \{'shape': torch\.size\(\[([^\]]*)\]\), 'dtype': torch\.(\w+).*?"
        r"recomputed metadata: \{'shape': torch\.size\(\[([^\]]*)\]\), 'dtype': torch\.(\w+)",
        text,
    )
    if len(rich) > len(pairs):
        pairs = [(a.lower(), d, b.lower(), d2) for a, d, b, d2 in rich]
    dtypes = [
        d
        for shape, d, shape2, d2 in pairs
        if shape == shape2 and d and d2 and d != d2
        for d in (d, d2)
    ]
    fsdp2 = next((w for w in FSDP2_WORDS if w in text), None) or next(
        (w for w in FSDP2_WORDS if any(w in m.lower() for m in fact(ctx, "mentions") or [])),
        None,
    )
    if dtypes and fsdp2:  # FSDP2's mixed-precision cast of the inputs skipped in recompute
        return Match(
            0.9,
            f"{found.evidence} The saved and recomputed dtypes differ "
            f"({', '.join(sorted(set(dtypes)))}) under FSDP2 ('{fsdp2}'): its "
            "mixed-precision cast of the forward inputs does not run in the recompute.",
            config_patch={"command": "pip install -U 'torch>=2.13'"},
            fix="Upgrade torch (FSDP2 casts the forward inputs in the recompute from 2.13, "
            "pytorch#182580); meanwhile wrap each layer with checkpoint_wrapper "
            "(CheckpointWrapper, NO_REENTRANT) before fully_shard, or cast the block's inputs "
            "to MixedPrecisionPolicy.param_dtype yourself",
        )
    if dtypes:  # same shapes, other dtypes: autocast, not another graph
        return Match(
            0.85,
            f"{found.evidence} The saved and recomputed dtypes differ "
            f"({', '.join(sorted(set(dtypes)))}): autocast differs between forward and "
            "recompute.",
            config_patch={"use_reentrant": False},
            fix="Enter autocast outside the checkpointed function (use_reentrant=False "
            "restores the forward's autocast state in the recompute)",
        )
    return found


rule(
    "RK076",
    "use_cache=True with gradient checkpointing (Hugging Face)",
    "informational",
    symptom="Warning: '`use_cache=True` is incompatible with gradient checkpointing. Setting "
    "`use_cache=False`'",
    cause="The KV cache is useless in training and conflicts with recompute; transformers "
    "turns it off",
    confirm="The warning repeats every step",
    fix="Set model.config.use_cache = False before training",
    patch={"use_cache": False},
    refs=("https://huggingface.co/docs/transformers/perf_train_gpu_one",),
)(on_message("is incompatible with gradient checkpointing", confidence=0.6))

rule(
    "RK077",
    "Gradient checkpointing on a model that does not support it (Hugging Face)",
    "invalid_config",
    symptom="ValueError: '... does not support gradient checkpointing.'",
    cause="The model class (in the installed transformers version) has "
    "supports_gradient_checkpointing = False; many classes gained support in later releases",
    confirm="type(model).supports_gradient_checkpointing; the model's changelog",
    fix="Upgrade transformers (pip install -U transformers) and turn checkpointing on with "
    "model.gradient_checkpointing_enable() rather than the old config key; if no release "
    "supports it, wrap the blocks with torch.utils.checkpoint yourself (use_reentrant=False)",
    refs=("https://huggingface.co/docs/transformers/perf_train_gpu_one",),
    patch={"command": "pip install -U transformers"},
)(on_message("does not support gradient checkpointing"))


rule(
    "RK078",
    "Checkpointing switched on by hand, not by gradient_checkpointing_enable() (Hugging Face)",
    "checkpoint_api_misuse",
    symptom="AttributeError: '... object has no attribute '_gradient_checkpointing_func'' from "
    "a transformers model's forward",
    cause="transformers (4.35 and later) checkpoints a layer through the function "
    "gradient_checkpointing_enable() installs on each module; setting the module's "
    "`gradient_checkpointing = True` by hand (or a wrapper that does) turns the branch on "
    "without the function",
    confirm="grep the training code for `gradient_checkpointing = True` assigned to a model "
    "or layer; hasattr(model.model, '_gradient_checkpointing_func') is False before the step",
    fix="Call model.gradient_checkpointing_enable() on the model (with "
    "gradient_checkpointing_kwargs={'use_reentrant': False}) instead of setting the flag, "
    "outside the forward, before training starts",
    patch={"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    refs=("https://huggingface.co/docs/transformers/perf_train_gpu_one",),
)(on_message("has no attribute '_gradient_checkpointing_func'"))


@rule(
    "RK093",
    "Backward through the graph twice under checkpointing",
    "checkpoint_api_misuse",
    symptom="RuntimeError: 'Trying to backward through the graph a second time' with "
    "checkpointed blocks",
    cause="A tensor computed outside the checkpoint (often inside a tuple or dict argument, "
    "which the reentrant checkpoint does not see) carries a graph that two checkpointed "
    "blocks backpropagate through",
    confirm="Pass the tensor as a direct argument, or detach what is shared; the error moves "
    "or goes",
    fix="Use the non-reentrant checkpoint (use_reentrant=False) and pass tensors that need "
    "gradients as direct arguments, not inside tuples",
    patch={"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    refs=(PT_CKPT,),
)
def _backward_twice(ctx: Context) -> Match | None:
    found = on_message("Trying to backward through the graph a second time")(ctx)
    if found is None:
        return None
    uses_checkpoint = "checkpoint" in all_frames(ctx) or any(
        "checkpoint" in str(k) and v for k, v in ctx.cfg.items()
    )
    return Match(0.85 if uses_checkpoint else 0.6, found.evidence)


rule(
    "RK095",
    "ctx.saved_tensors unpacked twice in a checkpointed custom Function",
    "checkpoint_api_misuse",
    symptom="CheckpointError: 'Unpack is being triggered for a tensor that was already "
    "unpacked once'",
    cause="A custom autograd.Function's backward reads ctx.saved_tensors twice; the "
    "non-reentrant checkpoint's unpack hooks allow one access",
    confirm="grep the Function's backward for a second ctx.saved_tensors",
    fix="Read ctx.saved_tensors once at the top of backward and reuse the tuple",
    patch={"code": "saved = ctx.saved_tensors  # once, at the top of backward"},
    refs=(PT_CKPT,),
)(on_message("Unpack is being triggered for a tensor that was already unpacked once"))


@rule(
    "RK099",
    "'None of the inputs have requires_grad=True' alone: usually harmless",
    "informational",
    symptom="UserWarning 'None of the inputs have requires_grad=True. Gradients will be None' "
    "from torch/utils/checkpoint.py, with training otherwise running",
    cause="A checkpointed block ran on inputs that need no gradient: under torch.no_grad "
    "(evaluation, generation), or a frozen first block. It only matters with the reentrant "
    "checkpoint and trainable parameters inside the block (then they get no gradient)",
    confirm="Training loss falls and the trainable parameters' .grad are set after backward",
    fix="No fix needed for evaluation or frozen blocks; to silence it and be safe with "
    "adapters inside checkpointed blocks use use_reentrant=False (or "
    "disable_gradient_checkpointing around no_grad inference)",
    patch={"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    refs=(PT_CKPT,),
)
def _no_input_grad_warning(ctx: Context) -> Match | None:
    warned = on_message("None of the inputs have requires_grad=True", confidence=0.6)(ctx)
    if warned is None:
        return None
    if any(e.kind == "exception" and e.type for e in ctx.evidence.errors) or ctx.oom:
        return None  # a real failure is in the log: other rules speak to it
    return warned


@rule(
    "RK148",
    "A traceback cut inside the reentrant checkpoint's backward under DeepSpeed / DDP",
    "checkpoint_api_misuse",
    symptom="A traceback (its exception line cut off) through DeepSpeed or DDP that ends in "
    "torch/utils/checkpoint.py `backward` -> torch.autograd.backward: the reentrant "
    "checkpoint's own backward",
    cause="The reentrant checkpoint runs a second, nested backward per block; hooks that "
    "expect one gradient per parameter per step (DeepSpeed ZeRO's reduction hooks, DDP's "
    "ready marks) fire again there, e.g. for weights shared between blocks",
    confirm="The full error names a parameter reduced twice / marked ready twice; it goes "
    "with use_reentrant=False or with checkpointing off for one step",
    fix="Use the non-reentrant checkpoint (use_reentrant=False), or stop checkpointing the "
    "blocks that share weights; with DeepSpeed ZeRO-2/3 and shared weights use ZeRO stage 1 "
    "(zero_stage 1)",
    patch={"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    refs=("https://github.com/deepspeedai/DeepSpeed/issues/988", PT_CKPT),
)
def _cut_in_reentrant_backward(ctx: Context) -> Match | None:
    if _failing(ctx):
        return None  # the error line is there: the rules that read it speak
    for e in ctx.evidence.errors:
        if e.kind != "exception" or e.type:
            continue
        frames = [f for f in e.frames if "utils/checkpoint.py" in f and f.endswith(" backward")]
        if not frames:
            continue
        deepspeed = any("deepspeed" in f for f in e.frames)
        ddp = any("nn/parallel/distributed.py" in f for f in e.frames)
        if not (deepspeed or ddp):
            # Only a wrapper that reduces gradients from per-parameter hooks makes the nested
            # backward itself the failure; any other cut traceback through a checkpoint (an
            # OOM in the recompute, a shape error) says nothing about which.
            continue
        evidence = (
            f"The traceback stops in the reentrant checkpoint's backward ('{frames[-1]}')"
            + (", under DeepSpeed's loss scaler" if deepspeed else ", under DDP")
            + "; its exception line is cut off."
        )
        patch: dict = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
        if deepspeed:
            patch["zero_optimization"] = {"stage": 1}
            evidence += (
                " DeepSpeed ZeRO reduces each gradient from a hook, which a nested backward "
                "fires twice for shared weights."
            )
        return Match(0.5, evidence, config_patch=patch)
    return None


# Signs that the blocks' inputs need no gradient for a harmless reason (frozen base, no_grad).
HARMLESS_WORDS = ("lora", "peft", "adapter", "freeze", "frozen", "finetuning_type", "no_grad")


@rule(
    "RK149",
    "'None of the inputs have requires_grad=True' in full training: gradients are lost",
    "checkpoint_api_misuse",
    symptom="UserWarning 'None of the inputs have requires_grad=True. Gradients will be None' "
    "while training every parameter with gradient checkpointing on (no adapters, no frozen "
    "base, no torch.no_grad); or a report that with checkpointing on the gradients are None / "
    "the parameters (adapters) are not updated",
    cause="With the reentrant checkpoint a block whose inputs do not require grad produces "
    "outputs without grad_fn: the parameters inside it get no gradient, silently (the first "
    "block after an embedding without grad, or inputs built outside autograd)",
    confirm="After one backward, print the parameters of the first checkpointed block whose "
    ".grad is None",
    fix="Use the non-reentrant checkpoint (use_reentrant=False) in the checkpoint calls, or "
    "make the first block's input require grad (Hugging Face: "
    "model.enable_input_require_grads())",
    patch={"use_reentrant": False},
    refs=("https://github.com/mlfoundations/open_clip/issues/573", PT_CKPT),
    supersedes=("RK099",),
)
def _lost_gradients(ctx: Context) -> Match | None:
    warned = on_message("None of the inputs have requires_grad=True")(ctx)
    if _failing(ctx):
        return None
    lost = fact(ctx, "grads_lost")
    if lost and (warned is not None or fact(ctx, "mentions") or fact(ctx, "checkpointing_on")):
        # The reporter sees it: gradients None / parameters not updated, with the warning or
        # with checkpointing named (adapters or not: those inside the blocks lose theirs too).
        said = warned.evidence + " " if warned is not None else ""
        return Match(
            0.7,
            f"{said}The report says the gradients are lost ('{lost[0]}') with gradient "
            "checkpointing: the reentrant checkpoint gives a block whose inputs need no "
            "gradient outputs without grad_fn, so the parameters inside it get none.",
        )
    if warned is None:
        return None
    on = fact(ctx, "checkpointing_on", "config")
    if not on or fact(ctx, "no_grad") or fact(ctx, "eval"):
        return None
    settings = " ".join(f"{k}={v}" for k, v in ctx.cfg.items()).lower()
    if any(w in settings for w in HARMLESS_WORDS):
        return None
    if fact(ctx, "use_reentrant") is False:
        return None  # non-reentrant already: the warning cannot lose gradients
    return Match(
        0.65,
        f"{warned.evidence} The config trains with checkpointing on ('{on[0]}') and nothing "
        "is frozen or run under no_grad: with the reentrant checkpoint the parameters in that "
        "block get no gradient.",
    )
