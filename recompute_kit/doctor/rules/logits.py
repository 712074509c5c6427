"""The logits and the loss: [tokens x vocab] tensors that recompute of transformer layers does
not touch (RK012 by the estimate, RK016 by the OOM's frames, RK620 by the paste's words), and
their fix in the run's own keys.
"""

from __future__ import annotations

from ...memory.estimate import logits_columns, loss_bytes
from ...plan.trainer_levers import is_trainer_run
from ..types import Context, Match
from .memory import EVAL_WORDS, HF_EVAL_FRAMES, HF_EVAL_LINE, activation_split
from .nothing_fits import largest_at_full_recompute, lever_patch
from .registry import all_frames, fact, gib, is_megatron, oom_errors, oom_where, rule, where_raised


@rule(
    "RK012",
    "The logits and loss need the memory",
    "logits_memory",
    symptom="OOM at the output layer or loss; a large vocabulary with a long sequence",
    cause="The fp32 log-softmax of [tokens x vocab] and its gradient are kept in full where "
    "the loss runs (the last pipeline stage, where there are several); recompute of "
    "transformer layers does not touch them",
    confirm="4 x tokens x vocab / TP bytes (recompute-kit estimate shows it under the loss); "
    "the OOM's request often equals one such tensor",
    fix="Use a fused / vocab-parallel cross-entropy (TransformerEngine, "
    "cross_entropy_loss_fusion), a smaller micro-batch, or more tensor parallelism",
    patch={"cross_entropy_loss_fusion": True},
    refs=("NVIDIA-NeMo/Megatron-Bridge PR #5508",),
)
def _logits(ctx: Context) -> Match | None:
    cfg = ctx.config
    if cfg is None or not ctx.gpu_bytes:
        return None
    m, p = cfg.model, cfg.parallel
    last = p.pipeline_model_parallel_size - 1
    if ctx.oom_stage is not None and ctx.oom_stage != last:
        return None  # the OOM's rank is on an earlier pipeline stage: no logits there
    tokens = m.seq_length * m.micro_batch_size // p.context_parallel_size
    columns = logits_columns(m, p)  # the vocabulary over TP, padded where Megatron pads it
    logits = 4 * tokens * columns  # one fp32 copy
    vocab = round(columns * p.tensor_model_parallel_size)
    padded = f" (the {m.vocab_size} padded as Megatron pads it)" if vocab != m.vocab_size else ""
    oom = ctx.oom
    # a fused linear cross-entropy outside Megatron (Liger, TRL's chunked_nll, torchtitan's
    # ChunkedLossWrapper) never makes the whole logits: a request of that size is another
    # tensor's
    whole = not (m.fused_linear_cross_entropy and m.loss_implementation != "megatron")
    hit = (
        whole
        and oom is not None
        and oom.requested_bytes
        and abs(oom.requested_bytes - logits) < 0.05 * logits
    )
    # what the run's own loss keeps and adds at its peak (the estimator's loss term: a fused
    # or TE cross-entropy keeps less than an fp32 copy and its gradients)
    saved, transient = loss_bytes(m, p, 2 if (m.bf16 or m.fp16) else 4)
    held = saved + transient
    if not hit and held < 0.15 * ctx.gpu_bytes:
        return None
    said = (
        f"The logits and loss of {tokens} tokens x {vocab} vocabulary{padded} keep "
        f"{gib(saved)} per rank for backward and {gib(held)} at their peak (the estimate's "
        f"loss term; one fp32 copy of the logits is {gib(logits)})."
    )
    conf = 0.8 if hit else 0.55
    weight = 2 * m.vocab_size * m.hidden_size / p.tensor_model_parallel_size
    if hit and abs(oom.requested_bytes - weight) < 0.05 * weight:
        # the same bytes as the 16-bit [vocab x hidden] embedding / output weight, which
        # ZeRO-3 and FSDP gather whole: the request alone does not say which of the two it is
        conf = 0.6
        said += (
            f" The request is also the size of the 16-bit [{m.vocab_size} x {m.hidden_size}] "
            "embedding / output weight, which ZeRO-3 / FSDP gather whole: the traceback's "
            "frames tell the two apart."
        )
    from .estimate_gap import estimate_overstates, overstated_words

    said += _tokens_of_the_request(ctx, tokens)
    largest = largest_at_full_recompute(ctx)
    if largest is not None and largest[0] == "edges":
        # nothing fits even with full recompute, and the logits are what is left: they lead;
        # the patch is the planner's lever that fits (a fused loss where the framework has one)
        patch, words = lever_patch(ctx)
        overstated = estimate_overstates(ctx)
        if overstated:  # "nothing fits" is the estimate's, and the rank reached far less
            said += f" But {overstated_words(ctx, overstated)}."
        return Match(
            0.55 if overstated else 0.85,
            f"{said} {ctx.plan_error[0].upper() + ctx.plan_error[1:]}. {largest[1]}",
            config_patch=patch or None,
            fix=f"{fused_loss_fix(ctx)}; or {words}",
        )
    if not hit and ctx.estimate is not None:
        # the estimate's split decides which activations dominate: transformer layers that
        # keep more than the logits make recompute the first lever (RK010), this the second
        layers, _ = activation_split(ctx.estimate)
        if layers > held:
            conf = 0.45
            said += (
                f" The transformer layers keep more ({gib(layers)} by the estimate): this is "
                "the second lever after recompute."
            )
    return Match(conf, said, fix=fused_loss_fix(ctx))


def _tokens_of_the_request(ctx: Context, tokens: int) -> str:
    """Where the OOM's request is one 16- or 32-bit [t x vocab] logits tensor for t tokens,
    fewer than the config's (a quarter of them at least) and a whole number per sample (to the
    OOM's rounding): the batch that ran held t tokens
    (padded to its longest sample), which the estimate at the config's length overstates."""
    oom, cfg = ctx.oom, ctx.config
    if oom is None or not oom.requested_bytes:
        return ""
    m, p = cfg.model, cfg.parallel
    whole = [
        oom.requested_bytes * p.tensor_model_parallel_size / (w * m.vocab_size) for w in (2, 4)
    ]
    if any(abs(t - tokens) < 0.02 * tokens for t in whole):
        return ""  # one tensor of all the config's tokens (16- or 32-bit): no shorter batch
    exact = logits_shape_of_request(
        oom.requested_bytes * p.tensor_model_parallel_size, [m.vocab_size]
    )
    full_batches = not is_trainer_run(cfg)  # Megatron, torchtitan: fixed or packed sequences
    if exact is not None and full_batches and exact[0] < tokens and tokens % exact[0] == 0:
        # a whole fraction of the micro-batch's tokens, to the OOM's rounding, where batches
        # are never padded short: a chunk of the loss or a split of the batch
        t, _, width = exact
        return (
            f" The request is one {8 * width}-bit logits tensor of {t} tokens (to the OOM's "
            f"rounding), 1/{tokens // t} of the micro-batch's {tokens}: a chunk of the loss or "
            "a split of the batch, not a shorter batch."
        )
    for width in (2, 4):
        t = oom.requested_bytes * p.tensor_model_parallel_size / (width * m.vocab_size)
        per_sample = t / m.micro_batch_size
        near = round(per_sample)
        # a quarter of the config's tokens at least: a small request is some other tensor
        if near and abs(per_sample - near) < 0.01 * near and 0.25 * tokens <= t < 0.95 * tokens:
            return (
                f" The request is one {8 * width}-bit logits tensor of about "
                f"{near * m.micro_batch_size} tokens ({m.micro_batch_size} x {near}): the batch "
                f"that failed held fewer tokens than the {tokens} estimated (padding to its "
                f"longest sample, not to the cap): `recompute-kit estimate --seq-length {near}` "
                "shows that batch; keep the cap itself as it is (lowering it truncates samples)."
            )
    return ""


def fused_loss_fix(ctx: Context) -> str:
    """RK012/RK016's fix in the run's terms: Megatron's fused / vocab-parallel cross-entropy
    and tensor parallelism where it is Megatron; elsewhere a fused linear cross-entropy (the
    flag is written as the framework's key by doctor/fix_words.py, or said to have none)."""
    # a batch of one cannot be lowered: then only the sequence is left to shorten
    one = ctx.config is not None and ctx.config.model.micro_batch_size == 1
    smaller = "a shorter sequence" if one else "a smaller micro-batch or sequence"
    if is_megatron(ctx):
        return (
            "Use a fused / vocab-parallel cross-entropy (TransformerEngine, "
            f"cross_entropy_loss_fusion), {smaller}, or more tensor parallelism"
        )
    m = ctx.config.model if ctx.config is not None else None
    if m is not None and m.fused_linear_cross_entropy and m.loss_implementation != "megatron":
        # the loss is already chunked: the lever is a smaller chunk, or fewer tokens
        n = m.fused_linear_cross_entropy_chunks
        chunk = (
            f"more chunks (torchtitan's ChunkedLossWrapper.Config(num_chunks=...), now {n}: "
            "each holds the logits of 1/num_chunks of the tokens)"
            if m.fused_linear_cross_entropy_impl == "torchtitan_chunked"
            else "smaller chunks"
        )
        return (
            "The loss already runs in chunks, never the full logits: "
            f"{chunk}, or fewer tokens per micro-batch; recompute of transformer layers does "
            "not touch the logits"
        )
    # framework unknown: no key of one framework named as if it were the run's
    known = (ctx.evidence.read or {}).get("framework") is not None
    how = (
        "--cross-entropy-loss-fusion"
        if known
        else "Liger's fused linear cross-entropy: use_liger_kernel in the Hugging Face Trainer, "
        "enable_liger_kernel in LLaMA-Factory; Megatron's cross_entropy_loss_fusion"
    )
    if trl_sft(ctx):
        how = (
            "TRL's loss_type chunked_nll (trl >= 1.4, its default from 1.7.0; on an older trl, "
            "Liger's use_liger_kernel: true)"
        )

    return (
        "Never hold the full fp32 logits: a fused linear cross-entropy that computes the loss "
        f"in chunks ({how}), or {smaller}; recompute of transformer layers does not touch "
        "the logits"
    )


def trl_sft(ctx: Context) -> bool:
    """The run is TRL's SFT (the shared reader read its script or YAML; not its DPO, whose
    loss_type names DPO objectives)."""
    fmt = str((ctx.evidence.read or {}).get("format", ""))
    return "TRL" in fmt and "DPO" not in fmt


FLOAT16_UPCAST = ("float16_to_fp32", "in float_conversion")
LOGITS_WORDS = (
    "cross_entropy",
    "log_softmax",
    "logits",
    "logprob",
    "log_prob",
    "lm_head",
    "output_layer",
    "post_language_model_processing",
    "vocab_parallel",
    # Megatron's Float16Module upcasting the last stage's output: the logits, where the model
    # returns them (RL log-probs, no labels passed), made fp32 at once (float_conversion is
    # float16_to_fp32's inner function, the frame a cut paste keeps)
    *FLOAT16_UPCAST,
)


@rule(
    "RK016",
    "The OOM happens in the logits / loss",
    "logits_memory",
    symptom="The OOM traceback runs through the output layer, logits, log-softmax or cross-entropy",
    cause="[tokens x vocab] tensors (logits, their fp32 copy, log-probabilities, gradients) "
    "are the largest single allocations of an LLM step",
    confirm="The failing frames name the loss / logits; the requested size is about tokens "
    "x vocab x 4 bytes",
    fix="Fused or chunked cross-entropy (no full fp32 logits), vocab-parallel loss, a "
    "smaller micro-batch or sequence; recompute of transformer layers does not help",
    patch={"cross_entropy_loss_fusion": True},
    supersedes=("RK004", "RK002", "RK005", "RK001"),
)
def _oom_in_logits(ctx: Context) -> Match | None:
    for e in oom_errors(ctx):
        where = where_raised(e)
        hit = next((w for w in LOGITS_WORDS if w in where), None)
        if hit:
            frame = next((f for f in reversed(e.frames) if hit in f.lower()), hit)
            return _in_logits(ctx, f"The OOM is raised under '{frame}'.", 0.9, hit)
    # a paste with the frames apart from the OOM line, or the OOM said only in words (a title
    # "... 报错oom" above frames that end in the loss)
    if ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions"):
        where = oom_where(ctx) + " " + all_frames(ctx)
        hit = next((w for w in LOGITS_WORDS if w in where), None)
        if hit:
            said = f"The pasted traceback runs through '{hit}' next to the OOM."
            return _in_logits(ctx, said, 0.8, hit)
    return None


def _in_logits(ctx: Context, said: str, confidence: float, hit: str) -> Match:
    if "nemo_rl" in all_frames(ctx):
        # NeMo-RL's Megatron policy computes the log-probs itself: its own levers, not
        # Megatron's loss fusion (a trial got cross_entropy_loss_fusion for a float() of the
        # logits under nemo_rl's policy worker)
        return Match(
            confidence,
            said + " NeMo-RL's policy worker holds the logits for its log-probs.",
            config_patch={"logprob_chunk_size": 1024, "defer_fp32_logits": True},
            fix="Compute the log-probs in chunks of the sequence (policy.logprob_chunk_size) and "
            "cast to fp32 inside each chunk (defer_fp32_logits), or a smaller micro-batch / "
            "sequence; recompute of transformer layers does not help",
        )
    if hit in FLOAT16_UPCAST:
        # megatron/core/transformer/module.py Float16Module.forward: on the last pipeline stage
        # the output is upcast to fp32 unless fp32_output=False (Megatron-Core >= 0.15.0,
        # NVIDIA/Megatron-LM a6c6250f9c); with labels the output is the per-token loss, small
        return Match(
            confidence,
            said + " Megatron's Float16Module upcasts the last stage's output to fp32: where "
            "the model returns its logits (no labels passed: log-probs for RL, evaluation) "
            "that is a whole fp32 copy of [tokens x vocabulary / TP].",
            config_patch={"code": "model(..., fp32_output=False)  # Megatron-Core >= 0.15"},
            fix="Keep the logits in 16 bits out of the model (Float16Module's "
            "fp32_output=False, Megatron-Core >= 0.15) and compute the log-probs in chunks of "
            "the sequence, or pass labels so the model returns the per-token loss; else fewer "
            "tokens per forward micro-batch, or more tensor parallelism (the vocabulary is "
            "split over TP); recompute of transformer layers does not help",
        )
    return Match(confidence, said, fix=_fused_fix(ctx))


def _fused_fix(ctx: Context) -> str | None:
    """RK016's fix: its own words for Megatron runs, the framework-neutral ones elsewhere."""
    return None if is_megatron(ctx) else fused_loss_fix(ctx)


@rule(
    "RK620",
    "Memory blamed on a large vocabulary or on the loss",
    "logits_memory",
    symptom="The paste blames the memory (an OOM, 'insufficient memory', a peak, a size) on a "
    "large vocabulary ('vocab_size (128K)', '250K vocab', 'a 128k vocab ... 1 GiB * "
    "batch_size') or on the loss itself ('the cross entropy loss is causing huge spikes in "
    "peak memory') without a traceback or a sized tensor",
    cause="The logits are tokens x vocabulary: with a 128K-256K vocabulary they (and their "
    "fp32 copy and gradient) outgrow a layer's activations; recompute does not touch them",
    confirm="tokens x vocab x 2 (bf16) or 4 (fp32) bytes against the peak; the peak drops by "
    "about that much with a fused / chunked cross-entropy",
    fix="Never hold the full logits: a fused linear cross-entropy (use_liger_kernel; LLaMA-"
    "Factory enable_liger_kernel), the loss "
    "computed in chunks of the batch / sequence, or a smaller micro-batch",
    patch={"use_liger_kernel": True},
)
def _vocab_blamed(ctx: Context) -> Match | None:
    found = list(fact(ctx, "vocab_memory_prose", "log") or [])
    if not ctx.evidence.read:  # a config the reader read is settings, not someone's words
        found += fact(ctx, "vocab_memory_prose", "config") or []
    if not found:
        return None
    top = next((f for f in found if f["vocab"]), found[0])
    vocab = top["vocab"]
    said = (
        f"The paste ties the memory to a {vocab // 1000}K vocabulary ('{top['line'][:160]}'): "
        f"every 1,000 tokens hold {gib(1000 * vocab * 4)} of fp32 logits."
        if vocab
        else f"The paste ties the memory to the loss / logits ('{top['line'][:160]}'): they "
        "are [tokens x vocabulary], kept in fp32 for the loss."
    )
    return Match(
        0.6,
        said,
        fix="Never hold the full logits: a fused linear cross-entropy (use_liger_kernel / "
        "cross_entropy_loss_fusion) or the loss computed in chunks of the batch / sequence "
        "(a chunk count of 2 or more), or a smaller micro-batch",
    )


# a logits tensor's tokens are a round number (batch x a sequence length, packed or padded)
_TOKEN_GRAIN = 256


def logits_shape_of_request(requested: int, vocabs: list[int]) -> tuple[int, int, int] | None:
    """(tokens, vocab, bytes per value) where `requested` is one [tokens x vocab] tensor of
    32- or 16-bit values, tokens a multiple of 256 (at least 1024), within the rounding of the
    OOM's two decimals (of GiB from 1 GiB, of MiB below); None when no vocabulary gives one."""
    unit = 2**30 if requested >= 2**30 else 2**20
    for width in (4, 2):
        for vocab in vocabs:
            tokens = requested / (vocab * width)
            nearest = round(tokens / _TOKEN_GRAIN) * _TOKEN_GRAIN
            slack = 0.005 * unit / (vocab * width) + 0.5
            if nearest >= 1024 and abs(tokens - nearest) <= slack:
                return nearest, vocab, width
    return None


@rule(
    "RK622",
    "The OOM's request is one logits tensor of the model the paste names",
    "logits_memory",
    symptom="An OOM whose request is exactly tokens x vocabulary x 4 (or 2) bytes for the "
    "vocabulary of the model family the paste names (Qwen 151936, Llama-3 128256, ...), no "
    "config given",
    cause="The logits (and their fp32 copy for the loss or the log-probabilities) are one "
    "[tokens x vocabulary] tensor: with a 100K-260K vocabulary it is larger than any layer's "
    "activations, and recompute does not touch it",
    confirm="requested bytes / (vocab x 4) is the micro-batch's tokens (batch x sequence); "
    "the OOM moves or goes with half the tokens per forward (a smaller micro-batch or "
    "log-prob batch) or a chunked loss",
    fix="Never hold the whole logits: a fused / chunked cross-entropy or log-prob computation, "
    "fewer tokens per forward (micro-batch, log-prob batch), or more tensor parallelism",
)
def _request_is_named_models_logits(ctx: Context) -> Match | None:
    oom = ctx.oom
    if oom is None or not oom.requested_bytes or oom.requested_bytes < 256 * 2**20:
        return None
    if ctx.config is not None:
        return None  # the config's own vocabulary and tokens: RK012 reads it
    families = fact(ctx, "model_families", "log") or {}
    vocabs = sorted({v for family_vocabs in families.values() for v in family_vocabs})
    found = logits_shape_of_request(oom.requested_bytes, vocabs)
    if found is None:
        return None
    tokens, vocab, width = found
    family = next(f for f, v in families.items() if vocab in v)
    said = (
        f"The failed request ({gib(oom.requested_bytes)}) is one {8 * width}-bit "
        f"[{tokens} x {vocab}] tensor: {tokens} tokens of logits over the {vocab}-entry "
        f"vocabulary of the {family} models the paste names."
    )
    # the request is what broke the step; memory other processes hold explains the headroom
    mine = oom.process_bytes or oom.allocated_bytes or 0
    conf = 0.75 if mine >= (oom.other_processes_bytes or 0) else 0.55
    return Match(conf, said, fix=fused_loss_fix(ctx))


@rule(
    "RK621",
    "The Trainer's evaluation loop keeps every batch's logits on the GPU",
    "logits_memory",
    symptom="An OOM in (or right at) evaluation of a Hugging Face Trainer / LLaMA-Factory run "
    "that trains fine: the traceback runs through transformers/trainer.py's evaluation loop, or "
    "the paste says the OOM comes at the evaluation steps",
    cause="The Trainer's evaluation_loop runs under no_grad but gathers every batch's logits "
    "([batch, sequence, vocabulary]) on the GPU until eval_accumulation_steps moves them to "
    "the CPU (unset: never, until the evaluation ends)",
    confirm="The memory climbs batch after batch during evaluation and falls after it; "
    "eval_accumulation_steps: 1 keeps it flat",
    fix="eval_accumulation_steps (1: move the predictions to the CPU after every batch), "
    "preprocess_logits_for_metrics (keep the argmax, not the logits) or prediction_loss_only "
    "(no predictions kept); a smaller per_device_eval_batch_size",
    patch={"eval_accumulation_steps": 1},
    refs=("https://github.com/huggingface/transformers/issues/12878",),
    supersedes=("RK005", "RK087", "RK266", "RK170"),
)
def _trainer_eval_logits(ctx: Context) -> Match | None:
    if not (ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions")):
        return None
    where = " " + oom_where(ctx) + " " + all_frames(ctx)
    hit = next((w for w in EVAL_WORDS if w in where), None)
    frames = all_frames(ctx)
    if hit is not None and "backward" not in where and any(t in frames for t in HF_EVAL_FRAMES):
        return Match(
            0.6,
            f"The OOM is raised under '{hit.strip()}' in the Trainer's own evaluation loop, "
            "which runs under no_grad: the logits it gathers across batches fill the GPU.",
        )
    prose = fact(ctx, "eval_memory_prose")
    managed = [line for line in fact(ctx, "managed_eval_loop") or [] if HF_EVAL_LINE.search(line)]
    if prose and managed and "backward" not in where:
        return Match(
            0.45,
            f"The paste places the OOM in evaluation ('{prose[0]}') of a Trainer run "
            f"('{managed[0]}'), whose evaluation loop gathers every batch's logits on the GPU "
            "until eval_accumulation_steps moves them.",
        )
    return None
