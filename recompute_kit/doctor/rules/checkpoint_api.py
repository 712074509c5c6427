"""PyTorch / Hugging Face checkpoint API pitfalls and non-deterministic recompute."""

from __future__ import annotations

import re

from ..types import Context, Match
from .registry import all_frames, is_megatron, on_message, rule

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
        "The reentrant checkpoint takes positional tensors only",
        "use_reentrant=False, or pass the values positionally (functools.partial for non-tensors)",
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


def _with_error(check, error: str):
    """`check`, only when the log also has the error (a warning alone is RK099's)."""

    def gated(ctx: Context) -> Match | None:
        return check(ctx) if on_message(error)(ctx) else None

    return gated


for _id, _title, _frags, _symptom, _cause, _fix, _patch in CKPT_RULES:
    _check = on_message(*_frags)
    if _id == "RK071":
        _check = _with_error(_check, _frags[1])
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
        return None
    text = " ".join(
        f"{e.type} {e.message} {e.details} {' '.join(e.frames)} {' '.join(e.context)}"
        for e in ctx.evidence.errors
    ).lower()
    saved = re.findall(r"saved metadata: \{'shape': torch\.size\(\[([^\]]*)\]\)", text)
    again = re.findall(r"recomputed metadata: \{'shape': torch\.size\(\[([^\]]*)\]\)", text)
    token_count = any(  # only the leading (token) dimension moved: routing, capacity
        len(a.split(",")) == len(b.split(",")) > 1
        and a.split(",")[0] != b.split(",")[0]
        and a.split(",")[1:] == b.split(",")[1:]
        for a, b in zip(saved, again, strict=False)
    )
    moe = next((w for w in MOE_WORDS if w in text), None) or (
        "num_moe_experts" if ctx.is_moe else None
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
            "recompute only the experts' activation (Megatron: recompute_modules [moe_act])",
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
    dtypes = [d for shape, d, shape2, d2 in pairs if shape == shape2 and d != d2 for d in (d, d2)]
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
    "checkpoint_api_misuse",
    symptom="ValueError: '... does not support gradient checkpointing.'",
    cause="The model class has supports_gradient_checkpointing = False",
    confirm="type(model).supports_gradient_checkpointing",
    fix="Wrap the blocks with torch.utils.checkpoint yourself (use_reentrant=False) or use "
    "another model class",
    refs=("https://huggingface.co/docs/transformers/perf_train_gpu_one",),
    patch={"command": "pip install -U transformers"},
)(on_message("does not support gradient checkpointing"))


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
    "RK094",
    "Gradient reduced twice: ZeRO / DDP hooks with reentrant checkpointing",
    "checkpoint_api_misuse",
    symptom="AssertionError 'The parameter N has already been reduced. Gradient computed "
    "twice for this partition' (DeepSpeed ZeRO-2) with gradient checkpointing",
    cause="The reentrant checkpoint runs a second backward per block, so a parameter used in "
    "several blocks (shared weights) fires its gradient hook more than once",
    confirm="Turn gradient checkpointing off for one step: the assertion goes",
    fix="use_reentrant=False (one backward), or ZeRO stage 1 (no per-parameter reduce "
    "hooks), or stop checkpointing the blocks that share the weight",
    patch={
        "zero_optimization": {"stage": 1},
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    },
    refs=("https://github.com/deepspeedai/DeepSpeed/issues/988",),
)(on_message("has already been reduced", "Gradient computed twice for this partition"))

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
    "RK096",
    "FP8 state differs between forward and recompute (Transformer Engine)",
    "nondeterministic_recompute",
    symptom="KeyError 'global_fp8_buffer_pos_fwd_recompute' (or other *_recompute FP8 keys) "
    "in Transformer Engine's checkpoint",
    cause="The checkpointed callable opens its own fp8_autocast: FP8 is off at checkpoint "
    "entry and on inside, so the forward skips the FP8 stash the recompute restores",
    confirm="The checkpointed function enters te.fp8_autocast itself",
    fix="Enter fp8_autocast outside the checkpointed callable (te.checkpoint reads the FP8 "
    "state at entry), or upgrade Transformer Engine",
    patch={"code": "with te.fp8_autocast(enabled=True, fp8_recipe=recipe): te.checkpoint(fn, x)"},
    refs=("https://github.com/NVIDIA/TransformerEngine/pull/3284",),
)
def _fp8_recompute_key(ctx: Context) -> Match | None:
    for e in ctx.evidence.errors:
        if e.type.endswith("KeyError") and "fp8" in e.message and "recompute" in e.message:
            return Match(
                0.85,
                f"KeyError {e.message}: Transformer Engine's FP8 recompute "
                "stash was not written in the forward.",
            )
    return None


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
