"""Readings of a symptom the user states in words when no artefact explains it (RK800-RK810).

"Checkpointing made it slower", "memory does not go down with recompute", "the LoRA grads are
None", "it hangs with activation checkpointing": a thread often says only that. Each rule here
reads one stated symptom (doctor/symptoms.py) and names its likeliest cause as a possible one,
with what would decide it; the engine asks them only where no finding already explains the
symptom, so they never outrank a reading of the artefacts. They patch nothing: a guess is not
a change to make, and the verdict stays `needs_evidence` (calibration caps an undecided finding).
"""

from __future__ import annotations

import re

from ..symptoms import CHECKPOINTING_WORDS
from ..types import Context, Match
from .registry import fact, rule

# A stated symptom alone is a guess between its categories (symptoms.py lists them).
STATED_CONFIDENCE = 0.4


def _said(ctx: Context, symptom: str) -> Match | None:
    lines = fact(ctx, "symptom_lines") or {}
    line = lines.get(symptom)
    if not line:
        return None
    if symptom == "slower" and "after_update" in lines and not _recompute_named(ctx, line):
        return None  # slower since an update, checkpointing never named: RK807's reading
    return Match(
        STATED_CONFIDENCE,
        f"The report says '{line}'; nothing pasted shows the cause, so this is the likeliest "
        "reading of that sentence, not a diagnosis.",
    )


def _recompute_named(ctx: Context, line: str) -> bool:
    """Checkpointing / recompute is named: in the symptom's sentence, the paste's settings or
    the config's recompute keys."""
    stated = fact(ctx, "settings_prose", "log") or {}
    return bool(
        re.search(CHECKPOINTING_WORDS, line, re.I)
        or (isinstance(stated, dict) and stated.get("gradient_checkpointing"))
        or ctx.granularity
    )


# One reading per stated symptom (doctor/symptoms.py's ids): the symptom's likeliest category,
# and what decides it. Registered by `_register` below, each as its own rule.
READINGS = (
    dict(
        id="RK800",
        title="Stated: recompute / checkpointing does not lower memory",
        category="recompute_no_effect",
        symptom="The report says activation checkpointing or recompute has no effect on memory, "
        "with no config or memory figures that show why",
        cause="The setting never reaches the model that runs (a config key the framework ignores, "
        "a flag set after the model is built, a role or worker that drops it), or what it "
        "recomputes holds little memory (core attention under flash attention, layernorm only)",
        confirm="Print the resolved config the framework uses and check the recompute keys there; "
        "check model.is_gradient_checkpointing / the printed arguments on the built model; "
        "compare torch.cuda.max_memory_allocated() for one step with it on and off",
        fix="Set the key the framework reads (Megatron: recompute_granularity / "
        "recompute_modules; Hugging Face: gradient_checkpointing) before the model is built, and "
        "recompute something that holds memory (full recompute, or mlp / moe_act modules)",
        reads_stated="recompute_no_effect",
    ),
    dict(
        id="RK801",
        title="Stated: training is slower with recompute / checkpointing",
        category="recompute_overhead",
        symptom="The report says the run got slower with checkpointing on (or since a change), "
        "with no timings that show by how much",
        cause="Recompute re-runs the forward of each checkpointed block in the backward: full "
        "recompute of every layer adds about one forward pass (~1.3x the step); more when blocks "
        "are recomputed twice (nested checkpoints) or the model is small and memory-bound",
        confirm="Time a few steps with checkpointing on and off at the same batch (interleaved); "
        "if the slowdown came with an upgrade, time both versions",
        fix="Recompute less: selective recompute or fewer checkpointed layers "
        "(recompute_num_layers, a checkpointing interval), or none where the run fits without it",
        reads_stated="slower",
    ),
    dict(
        id="RK802",
        title="Stated: gradients are None under checkpointing",
        category="checkpoint_api_misuse",
        symptom="The report says parameters' gradients are None (LoRA adapters, a frozen base) "
        "with checkpointing on",
        cause="Reentrant checkpointing (use_reentrant=True) only backpropagates through a segment "
        "whose inputs require grad; with a frozen embedding no input does, so the adapters inside "
        "get no gradient",
        confirm="Check use_reentrant and whether the checkpointed block's input requires grad "
        "(print hidden_states.requires_grad inside the block)",
        fix="Use non-reentrant checkpointing (gradient_checkpointing_kwargs={'use_reentrant': "
        "False}) or make the inputs require grad (model.enable_input_require_grads())",
        reads_stated="grads_none",
    ),
    dict(
        id="RK803",
        title="Stated: loss or gradients differ (NaN) with checkpointing",
        category="nondeterministic_recompute",
        symptom="The report says the loss or gradients differ, diverge or turn NaN when "
        "checkpointing is on",
        cause="The recomputed forward is not the forward that ran: random state (dropout) not "
        "restored, a module whose behaviour depends on a call count or cache, or a different "
        "code path (autocast, eval-mode switches) during recompute",
        confirm="Run one step with checkpointing on and off from the same seed and compare the "
        "gradients; set torch.utils.checkpoint's determinism_check / debug=True",
        fix="Keep preserve_rng_state=True (the default), make the checkpointed function free of "
        "side effects, and upgrade the framework if it is a known recompute bug",
        reads_stated="diverges_with_recompute",
    ),
    dict(
        id="RK804",
        title="Stated: training hangs with checkpointing",
        category="framework_bug",
        symptom="The report says training hangs or deadlocks with checkpointing on",
        cause="A collective inside a checkpointed block runs in the forward but not in the "
        "recompute on some rank (or in another order), or reentrant checkpointing interacts with "
        "DDP / FSDP hooks; usually a framework bug fixed in a later version",
        confirm="py-spy dump every rank while it hangs, with NCCL_DEBUG=INFO and "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL; note the torch and framework versions",
        fix="Use non-reentrant checkpointing (use_reentrant=False), wrap checkpointing outside "
        "FSDP's own units, and upgrade the framework",
        reads_stated="hangs_with_recompute",
    ),
    dict(
        id="RK805",
        title="Stated: memory grows step after step",
        category="framework_bug",
        symptom="The report says memory keeps growing every step or speaks of a leak",
        cause="Something keeps references from one step to the next: a reference cycle holding "
        "saved tensors, a loss accumulated with its graph (total += loss instead of "
        "loss.item()), a cache that grows; in frameworks, a known leak fixed in a later version",
        confirm="Log torch.cuda.memory_allocated() after every step; a steady rise is a leak; "
        "call gc.collect() after the step: if the rise stops, it is a reference cycle",
        fix="Accumulate loss.item(), not the loss tensor; break the cycle (gc.collect() as a "
        "test); upgrade the framework if it is a known leak",
        reads_stated="memory_grows",
    ),
    dict(
        id="RK806",
        title="Stated: out of memory while loading, resuming or saving",
        category="model_state_memory",
        symptom="The report says the OOM happens while loading a model or checkpoint, resuming, "
        "saving or exporting",
        cause="Loading or saving holds a second copy of the model states on the GPU: a checkpoint "
        "mapped to the GPU and kept after load_state_dict, a full (unsharded) state dict gathered "
        "on one rank, optimizer states deep-copied on load",
        confirm="The traceback's frames (load_state_dict, from_pretrained, state_dict gather); "
        "torch.cuda.memory_allocated() before and after the load",
        fix="Load to CPU (map_location='cpu') and free the loaded dict after load_state_dict; "
        "save sharded state dicts (or offload the full one to CPU rank 0 only)",
        reads_stated="oom_loading_or_saving",
    ),
    dict(
        id="RK809",
        title="Stated: enabling checkpointing raises an error",
        category="framework_bug",
        symptom="The report says turning gradient / activation checkpointing on makes the run "
        "fail with an error, with no traceback that shows where",
        cause="The model's code or the framework does not support checkpointing on this path "
        "(a custom layer that keeps state or a cache between calls, a forward that takes "
        "arguments the checkpoint wrapper does not pass on), or a version where it is broken",
        confirm="The full traceback with checkpointing on; whether the model class sets "
        "supports_gradient_checkpointing (Hugging Face) and the versions in use",
        fix="Upgrade the model code / framework to a version that supports checkpointing for "
        "this model, or checkpoint only the standard layers; report it upstream with the "
        "traceback",
        reads_stated="error_with_recompute",
    ),
    dict(
        id="RK810",
        title="Stated: a smaller batch does not help",
        category="model_state_memory",
        symptom="The report says the OOM stays with a smaller batch (or even at batch size 1)",
        cause="What fills the GPU does not scale with the batch: weights, gradients and "
        "optimizer states (trainable parameters that could be frozen, a model too large for "
        "one GPU), or a fixed buffer; activations shrink with the batch",
        confirm="torch.cuda.memory_allocated() after the model and optimizer are built, before "
        "the first step: if it already fills most of the GPU, the model states are the term",
        fix="Fewer trainable parameters (freeze parts, LoRA), shard the states (ZeRO-3 / FSDP "
        "over more GPUs) or offload the optimizer; a smaller model or lower precision",
        reads_stated="batch_no_help",
    ),
    dict(
        id="RK807",
        title="Stated: out of memory (or slower) since an update",
        category="framework_bug",
        symptom="The report ties the OOM or slowdown to an update of the software, naming no "
        "release the known-problems table or the regression rules could match",
        cause="A framework release changed what the step holds (a regression, a changed default); "
        "the same job ran before the update",
        confirm="Run the same job on the version before and after the update (pip freeze of "
        "both); the first version that fails narrows it to a release",
        fix="Pin the last version that worked and report the regression upstream with both "
        "versions; look for a default the release changed (its release notes)",
        reads_stated="after_update",
    ),
    dict(
        id="RK811",
        title="Stated: the activations are what grows",
        category="activation_memory",
        symptom="The report says the activation memory is large or grows (with the sequence, "
        "the batch), with no config or memory figures that size it",
        cause="Activations scale with tokens per rank (sequence x micro-batch / context "
        "parallelism) and with what each layer keeps for backward; the model states do not",
        confirm="recompute-kit estimate --config CFG splits the per-rank peak into activations "
        "and model states; the same step at half the sequence should free about half of the "
        "activations",
        fix="Recompute more (full recompute of some or all layers, or selective mlp / moe_act), "
        "context parallelism for long sequences, a smaller micro-batch, or activation "
        "offloading (`plan --levers` prices each)",
        reads_stated="activations_grow",
    ),
    dict(
        id="RK813",
        title="Stated: sharding the model states raised the memory",
        category="framework_bug",
        symptom="The report says turning on FSDP, ZeRO or the distributed optimizer made the "
        "run use more GPU memory than without it, with no figures that split the states",
        cause="Sharding divides weights, gradients and optimizer states by the data-parallel "
        "size, so a rise means something was not sharded: usually a framework or optimizer bug "
        "(states created with the full parameter's shape instead of the shard's), or buffers "
        "the sharding adds (all-gather / reduce-scatter buckets, a gathered unit) that outgrow "
        "what it saves on a small model or DP size",
        confirm="torch.cuda.memory_allocated() after the optimizer's first step with and "
        "without sharding, and the optimizer states' shapes (a shard's numel x DP = the "
        "parameter's); the versions of the framework and of TransformerEngine / the optimizer",
        fix="Upgrade the framework / optimizer to a release that shards the states (or pin the "
        "last that did) and report it with both measurements; shrink the communication buckets "
        "where they are the rise",
        reads_stated="sharding_raises_memory",
    ),
    dict(
        id="RK812",
        title="Stated: FP8 does not lower the memory",
        category="model_state_memory",
        symptom="The report says training in FP8 (TransformerEngine, torchao float8) takes as "
        "much memory as bf16, or more, with no memory figures that split it",
        cause="FP8 changes the matmuls, not what is stored: the weights stay in bf16 / fp32 (and "
        "the optimizer's fp32 master copy and states beside them), and TransformerEngine keeps "
        "FP8 copies of the weights (with their transposes on Hopper) on top; only the matmul "
        "inputs saved for backward shrink, about half of the activations",
        confirm="torch.cuda.memory_allocated() after the model and optimizer are built, bf16 "
        "against FP8: the same (or more) means the weights and states set it; then the peak of "
        "one step for the activations",
        fix="Keep only FP8 weights: TransformerEngine's fp8_model_init() around the model's "
        "construction, Megatron's --fp8-param-gather (fp8_param_gather) with the distributed "
        "optimizer; shard the states (distributed optimizer, FSDP) for the rest",
        reads_stated="fp8_memory_not_lower",
    ),
    dict(
        id="RK808",
        title="Stated: LoRA fits, full fine-tuning runs out of memory",
        category="model_state_memory",
        symptom="The report says the run works with LoRA (or another adapter) and runs out of "
        "memory as a full fine-tune",
        cause="A full fine-tune keeps gradients and optimizer states for every weight (about 16 "
        "bytes per parameter with Adam in mixed precision) where LoRA keeps them for the adapters "
        "only; the activations are about the same in both",
        confirm="Weights x 16 bytes against the GPU: a 7B model's full fine-tune needs ~112 GB of "
        "model states before activations",
        fix="Shard the model states (DeepSpeed ZeRO-3 / FSDP over more GPUs), offload the "
        "optimizer, or keep LoRA",
        reads_stated="full_fails_lora_works",
    ),
)


def _register(reading: dict) -> None:
    symptom = reading["reads_stated"]

    def check(ctx: Context) -> Match | None:
        return _said(ctx, symptom)

    fields = dict(reading)
    rule(fields.pop("id"), fields.pop("title"), fields.pop("category"), **fields)(check)


for _reading in READINGS:
    _register(_reading)
