"""PyTorch / Hugging Face checkpoint API pitfalls and non-deterministic recompute."""

from __future__ import annotations

from .registry import on_message, rule

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

for _id, _title, _frags, _symptom, _cause, _fix, _patch in CKPT_RULES:
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
    )(on_message(*_frags))


rule(
    "RK075",
    "Recomputed tensors differ from the forward's",
    "nondeterministic_recompute",
    symptom="CheckpointError: 'Recomputed values for the following tensors have different "
    "metadata than during the forward pass'",
    cause="The checkpointed function is not deterministic in shape/dtype: data-dependent "
    "control flow, a global flag changed between forward and backward, or torch.compile "
    "picking another graph",
    confirm="Rerun with torch.utils.checkpoint.set_checkpoint_debug_enabled(True) to see the "
    "ops that differ",
    fix="Make the region deterministic (no state changes between "
    "forward and backward; for MoE routing replay, record and replay the routing)",
    refs=(PT_CKPT, "https://github.com/pytorch/pytorch/issues/166926"),
)(
    on_message(
        "have different metadata than during the forward pass",
        "CheckpointError: Recomputed values for the following tensors",
        "A different number of tensors was saved during the original forward and recomputation",
    )
)

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
)(on_message("does not support gradient checkpointing"))
