"""Run the rule catalog over all the evidence together and rank what it finds.

An OOM message alone says how full the GPU was; a config alone says what was asked for; the
two with a model shape let the estimator say whether activations or model states dominate and
which recompute setting would fit. The engine builds that context once, asks every rule, keeps
each rule's finding once, drops generic findings that a specific one supersedes, and ranks by
confidence. Fallback rules (default readings, rules/fallback.py) are asked only when no other
rule fired, so they never outrank a specific finding.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from ..config import Config, ConfigError, config_from_dict
from ..memory.estimate import estimate
from .calibration import calibrate
from .evidence import Evidence
from .patches import check_patches
from .rules import RULES
from .rules.allocator import fragmentation_worth_the_name
from .rules.memory import activation_split
from .rules.registry import fact, oom_errors, steps_without_oom
from .symptoms import explaining
from .symptoms import rank as rank_by_symptom
from .types import GIB, MEMORY_CATEGORIES, SHAPE_KEYS, Context, Diagnosis, Finding
from .verdict import decides, judge, present


def build_context(evidence: Evidence, gpu_memory_gb: float | None = None) -> Context:
    ctx = Context(evidence)
    if gpu_memory_gb:
        ctx.gpu_bytes = int(gpu_memory_gb * GIB)
        said = ctx.oom.total_bytes if ctx.oom else None
        if said and abs(said - ctx.gpu_bytes) > 0.02 * said:
            # the budget given is not the GPU that failed: said, so the numbers can be read
            ctx.assumptions.append(
                f"the GPU is taken as {gpu_memory_gb:g} GiB (--gpu-memory-gb) while the OOM "
                f"message says its GPU has {said / GIB:.2f} GiB: the findings' figures are for "
                "the GPU given"
            )
    elif ctx.oom and ctx.oom.total_bytes:
        ctx.gpu_bytes = ctx.oom.total_bytes
    elif device := fact(ctx, "device_bytes", "log"):
        # torchtitan's step line gives its memory as a share of the device's
        ctx.gpu_bytes = device
        ctx.assumptions.append(
            f"the GPU is taken as {device / GIB:.1f} GiB: the log's step lines give their "
            "memory as a share of the device's (torchtitan's 'memory: X GiB(Y%)')"
        )
    flat = dict(evidence.config)
    read, refused = _config_read_from_files(evidence)
    # Megatron's validation of what the paste sets; where the shared reader read the files,
    # its config is what runs (the framework's own adjustments applied: Megatron-LM drops
    # sequence parallelism at TP 1) and it validated above, or its refusal is the error
    if refused:
        ctx.config_error = refused
    elif read is None and (
        flat.get("recompute_granularity") is not None or flat.get("cpu_offloading")
    ):
        refusal = _refusal(_known_keys(flat))
        if refusal and _refused_whatever_unset(flat):
            ctx.config_error = refusal
        elif refusal:
            ctx.assumptions.append(
                f"Megatron would refuse the settings the paste shows as they stand "
                f'("{refusal}"), but they leave {" and ".join(_unset_recompute(flat))} unset, '
                "and the paste is no whole config: the run's own value is not read"
            )
    if read is not None:  # the config files, read as every command reads them
        ctx.config, ctx.assumptions = read, [*ctx.assumptions, *read.assumptions]
        _trl_before_chunked_loss(ctx)
        _estimate(ctx)
    elif not refused and not _unsized(evidence) and all(flat.get(k) for k in SHAPE_KEYS):
        # a config pasted into the log
        ctx.config, assumed = _config_for_estimate(flat)
        ctx.assumptions = [*ctx.assumptions, *assumed]
        if ctx.config is not None:
            _estimate(ctx)
    return ctx


# TRL's SFT computes the lm_head and loss in chunks from this release (sft_config.py loss_type
# "chunked_nll", huggingface/trl b58947c7e); before it the full fp32 logits exist
TRL_CHUNKED_LOSS = (1, 7)


def _trl_before_chunked_loss(ctx: Context) -> None:
    """Where the reader took SFTConfig's chunked loss as TRL's default and the paste says an
    older trl, or the OOM's request is one whole logits tensor (which the chunked loss never
    makes), the run computes the full logits: the estimate keeps them, and says why."""
    source = ((ctx.evidence.read or {}).get("sources") or {}).get("fused_linear_cross_entropy")
    if not (isinstance(source, dict) and "chunked_nll" in str(source.get("where"))):
        return
    if source.get("key", "").startswith("the command's"):
        return  # set on the command line: the run's own word
    said = (fact(ctx, "versions_said") or {}).get("trl")
    release = tuple(int(p) for p in re.findall(r"\d+", said or "")[:2])
    if len(release) == 2 and release < TRL_CHUNKED_LOSS:
        why = f"the paste says trl {said}: its SFT computes the full logits"
    elif _request_is_whole_logits(ctx):
        why = (
            f"the OOM's request ({ctx.oom.requested_bytes / 2**30:.2f} GiB) is one logits tensor "
            "of the micro-batch's tokens, which TRL's chunked loss never makes: the run "
            "computes the full logits (trl before 1.7, or loss_type nll)"
        )
    else:
        return
    ctx.config = ctx.config.replace(fused_linear_cross_entropy=False)
    ctx.assumptions.append(
        f"{why} (loss_type chunked_nll is the default from trl 1.7.0), so the estimate keeps them"
    )


def _request_is_whole_logits(ctx: Context) -> bool:
    """The OOM asked for one 16- or 32-bit [micro-batch tokens x vocabulary] tensor."""
    oom, m = ctx.oom, ctx.config.model if ctx.config else None
    if oom is None or m is None or not oom.requested_bytes or not m.vocab_size:
        return False
    cells = m.micro_batch_size * m.seq_length * m.vocab_size
    return any(abs(oom.requested_bytes - width * cells) < 0.02 * width * cells for width in (2, 4))


def _config_read_from_files(evidence: Evidence) -> tuple[Config | None, str]:
    """The Config the shared reader made of the --config files, when they give a model shape
    and a layout the estimator can split (else the paste's keys are used, as before), and
    why Megatron refuses the files' config where it does ("": it does not)."""
    from ..sources.resolve import config_from_json

    if not evidence.read:
        return None, ""
    unsized = _unsized(evidence)
    if unsized:  # layers the estimator does not model: no figures, and no config error
        evidence.notes.append(f"config: no estimate from the files: {unsized}")
        return None, ""
    cfg = config_from_json(evidence.read)
    if cfg is None:
        return None, ""
    try:
        cfg.validate()
        estimate(cfg)
    except (ConfigError, ValueError, ZeroDivisionError, TypeError) as exc:
        evidence.notes.append(f"config: no estimate from the files: {exc}")
        return None, str(exc) if isinstance(exc, ConfigError) else ""
    return cfg, ""


def _unsized(evidence: Evidence) -> str | None:
    """The read's words where its model has layers the estimator does not model."""
    from ..sources.resolve import NOT_SIZED

    return next((w for w in (evidence.read or {}).get("warnings") or [] if NOT_SIZED in w), None)


def _refusal(keys: dict[str, Any]) -> str | None:
    """Megatron's validation message for these settings, or None where it accepts them."""
    try:
        cfg, _ = config_from_dict(keys)
        cfg.validate()
    except ConfigError as exc:
        return str(exc)
    return None


# The recompute keys full recompute needs, and a value of each that Megatron accepts
_RECOMPUTE_COMPANIONS = {"recompute_method": "uniform", "recompute_num_layers": 1}


def _unset_recompute(flat: dict[str, Any]) -> list[str]:
    return [k for k in _RECOMPUTE_COMPANIONS if k not in flat]  # (an args dump's None is read)


def _refused_whatever_unset(flat: dict[str, Any]) -> bool:
    """Whether a paste's settings are refused whatever the recompute keys it does not show
    are: a fragment pasted from a command (`--recompute-granularity full` in a sentence) is
    not the whole command, and a key it leaves out may be set in the run."""
    unset = _unset_recompute(flat)
    whole = all(flat.get(k) for k in SHAPE_KEYS)  # a config pasted whole: unset is the default
    if whole or not unset or flat.get("recompute_granularity") != "full":
        return True
    filled = {**_known_keys(flat), **{k: _RECOMPUTE_COMPANIONS[k] for k in unset}}
    return _refusal(filled) is not None


def _known_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """The keys `config_from_dict` reads: the kit's, and Megatron's other names for them
    (gated_linear_unit, padded_vocab_size, ...)."""
    from ..config import ALIASES, CONFIG_KEYS

    return {k: v for k, v in flat.items() if k in CONFIG_KEYS or k in ALIASES}


def _config_for_estimate(flat: dict[str, Any]) -> tuple[Config | None, list[str]]:
    assumptions = []
    known = _known_keys(flat)
    if "vocab_size" not in known:
        vocab = flat.get("padded_vocab_size")
        known["vocab_size"] = int(vocab) if vocab else 32000
        if not vocab:
            assumptions.append("vocab_size not given: assumed 32000")
    if "micro_batch_size" not in known:
        known["micro_batch_size"] = 1
        assumptions.append("micro_batch_size not given: assumed 1")
    if "bf16" not in known and "fp16" not in known:
        known["bf16"] = True  # an OOM'd training run: mixed precision, not Megatron's fp32
        assumptions.append("bf16/fp16 not given: assumed bf16")
    known["recompute_num_layers"] = known.get("recompute_num_layers")
    try:
        # Every other missing key takes Megatron's default, listed in cfg.assumptions.
        cfg, _ = config_from_dict(known)
        cfg.validate()
        estimate(cfg)  # shapes must divide
    except (ConfigError, ValueError, ZeroDivisionError, TypeError) as exc:
        return None, [*assumptions, f"no estimate: {exc}"]
    return cfg, [*assumptions, *cfg.assumptions]


def _estimate(ctx: Context) -> None:
    from ..plan import NothingFits, plan

    ctx.oom_stage = _stage_of_the_oom(ctx)
    ctx.estimate = estimate(ctx.config, stage=ctx.oom_stage)
    if ctx.gpu_bytes:
        try:
            result = plan(ctx.config, ctx.gpu_bytes / GIB, fmt=ctx.plan_format)
            ctx.best = result.best
            ctx.best_keeping = _keeping_current(result, ctx.config)
        except ConfigError as exc:
            ctx.plan_error = str(exc)
            if isinstance(exc, NothingFits):
                ctx.plan_smallest = exc.smallest
                ctx.full_refused = exc.full_refused


def _covered(modules: list[str]) -> set[str]:
    """The modules a selective list recomputes: `moe` checkpoints the whole MoE layer, its
    expert activation and shared experts included (listing them beside it changes nothing)."""
    out = set(modules)
    if "moe" in out:
        out |= {"moe_act", "shared_experts"}
    return out


def _stage_of_the_oom(ctx: Context) -> int | None:
    """The pipeline stage of the rank the OOM names (`[rank250]:`): Megatron's default order
    (tp-cp-ep-dp-pp) puts the pipeline outermost, so stage = rank // (world / PP). None (the
    stage that holds the most) without stages, a rank, or with ranks of several stages."""
    p = ctx.config.parallel
    pp = p.pipeline_model_parallel_size
    ranks = {o.rank for o in ctx.evidence.oom if o.rank is not None}
    if pp < 2 or not ranks:
        return None
    per_stage = p.tensor_model_parallel_size * p.context_parallel_size * p.data_parallel_size
    if max(ranks) >= per_stage * pp:
        ctx.evidence.notes.append(
            f"the OOM names rank {max(ranks)}, beyond the {per_stage * pp} ranks of the "
            "config's layout: the estimate is of the stage that holds the most"
        )
        return None
    stages = {r // per_stage for r in ranks}
    if len(stages) != 1:
        return None
    stage = stages.pop()
    ctx.evidence.notes.append(
        f"the OOM is on rank {min(ranks)}: pipeline stage {stage} of {pp} (Megatron's default "
        f"order, the pipeline outermost: {per_stage} ranks a stage); the estimate is that stage's"
    )
    return stage


def _keeping_current(result, config: Config):
    """The planner's best among the settings that recompute at least what the run does (an
    OOM's fix never drops a module the run recomputes); the overall best when none fits."""
    rc = config.recompute
    if rc.recompute_granularity != "selective":
        return result.best
    current = set(rc.modules)
    for c in result.candidates:  # ranked: fitting (clearing the band first), cheapest first
        if not c.fits:
            break
        every_layer = c.recompute.recompute_method == "uniform"  # (block N leaves layers out)
        if every_layer or (
            c.recompute.recompute_granularity == "selective"
            and current <= _covered(c.recompute.modules)
        ):
            return c
    return result.best


def diagnose(
    evidence: Evidence,
    gpu_memory_gb: float | None = None,
    calibrated: bool = True,
    gpu: str | None = None,
) -> Diagnosis:
    """Evaluate every rule over the evidence; findings ranked by confidence, best first, those
    that explain the symptom the user states ahead (doctor/symptoms.py); confidences calibrated
    (doctor/calibration.py, `calibrated=False` keeps the rules' raw ones) and the verdict
    (doctor/verdict.py) given. `gpu`: the GPU by name (gpus.py), for the step-time model's
    rates when levers are priced (as `plan --levers --gpu` prices them)."""
    ctx = build_context(evidence, gpu_memory_gb)
    ctx.gpu_name = gpu
    found: list[tuple[Finding, tuple[str, ...]]] = []
    for fallback in (False, True):  # default readings only when nothing specific fired
        # (a harmless notice is no reading of the failure: the default one still follows it)
        if fallback and any(f.category != "informational" for f, _ in found):
            break
        for rule in RULES:
            if rule.fallback != fallback or rule.reads_stated:
                continue
            match = rule.check(ctx)
            if match is None:
                continue
            found.append((rule.finding(match), rule.supersedes))
    fired = {f.rule for f, _ in found}
    superseded = {old for f, sup in found for old in sup if old in fired}
    findings = [f for f, _ in found]
    dropped: list[dict[str, str]] = []
    slack = _fragmentation_slack(ctx)
    if slack is not None and "RK001" in superseded and slack >= 2 * (ctx.oom.requested_bytes or 0):
        superseded.discard("RK001")  # a specific site does not explain away free memory in pieces
    for f in findings:
        if f.rule in superseded:
            by = next(g.rule for g, sup in found if f.rule in sup)
            dropped.append({"rule": f.rule, "reason": f"superseded by {by}"})
    findings = [f for f in findings if f.rule not in superseded]
    findings, ruled_out = _reconcile(ctx, findings, slack)
    dropped += ruled_out
    findings.sort(key=lambda f: (-f.confidence, f.rule))
    stated = evidence.facts.get("log", {}).get("symptoms", [])
    findings += _stated_readings(ctx, findings, stated)
    findings = rank_by_symptom(findings, stated)
    kinds = present(ctx)
    for f in findings:
        f.raw_confidence = f.confidence
        if calibrated:
            f.confidence = calibrate(
                f.confidence, f.category, decides(f.category, kinds), rule=f.rule
            )
    for above, f in itertools.pairwise(findings):
        # the table is of top findings: one ranked lower is no likelier than the one above it
        f.confidence = min(f.confidence, above.confidence)
    check_patches(ctx, findings)  # framework keys, never already set, never raises the peak
    verdict = judge(ctx, findings)
    diagnosis = Diagnosis(evidence, findings, _summary(ctx, findings), ctx.assumptions, dropped)
    diagnosis.verdict = verdict
    return diagnosis


def _stated_readings(ctx: Context, findings: list[Finding], stated: list[str]) -> list[Finding]:
    """The readings of the symptoms the user states that no finding explains (rules/stated.py):
    a possible cause each, so that a paste with a symptom and no artefact is never silent."""
    unexplained = [s for s in stated if not any(f.category in explaining([s]) for f in findings)]
    out = []
    for rule in RULES:
        if rule.reads_stated in unexplained and (match := rule.check(ctx)) is not None:
            out.append(rule.finding(match))
    return out




def _fragmentation_slack(ctx: Context) -> int | None:
    """Reserved-but-unallocated bytes of the OOM (None without a message that says)."""
    oom = ctx.oom
    if oom is None or not oom.requested_bytes:
        return None
    if oom.reserved_unallocated_bytes is not None:
        return oom.reserved_unallocated_bytes
    if oom.reserved_bytes is not None and oom.allocated_bytes is not None:
        return max(0, oom.reserved_bytes - oom.allocated_bytes)
    return None


def _reconcile(
    ctx: Context, findings: list[Finding], slack: int | None
) -> tuple[list[Finding], list[dict[str, str]]]:
    """Findings that contradict the evidence or each other go, with a reason; findings never
    ask for input that was given."""
    dropped: list[dict[str, str]] = []
    kept: list[Finding] = []
    memory = [f for f in findings if f.category in MEMORY_CATEGORIES]
    oom = ctx.oom
    for f in findings:
        if f.rule == "RK001" and memory and slack is not None and oom is not None:
            req, total = oom.requested_bytes or 0, oom.total_bytes or 0
            if slack < req and slack < 0.1 * total:  # a sliver, not enough even in one piece
                dropped.append(
                    {
                        "rule": f.rule,
                        "reason": f"fragmentation ruled out: {slack / GIB:.2f} GiB reserved but "
                        f"unallocated is less than the {req / GIB:.2f} GiB request and under 10% "
                        f"of the GPU, while {memory[0].rule} explains the OOM",
                    }
                )
                continue
            top = max(m.confidence for m in memory)
            # the cache holds a real share of the GPU and, with the device's free memory, the
            # request: in one piece it would have fitted (on a GPU not too small for the work)
            joined = (
                slack >= 0.1 * total
                and not any(m.rule == "RK102" for m in memory)
                and oom.free_bytes is not None
                and slack + oom.free_bytes >= req
            )
            if fragmentation_worth_the_name(slack, req, total) or joined:
                # free memory in pieces, several times the request and a real share of the GPU
                f.confidence = max(f.confidence, top + 0.01)
            else:  # a sliver of a full GPU: the memory finding explains the OOM, RK001 follows
                f.confidence = round(min(f.confidence, top - 0.05), 2)
        kept.append(f)
    est, gpu = ctx.estimate, ctx.gpu_bytes
    if est is not None and gpu:
        states = est.model_state_bytes
        if states >= gpu:  # nothing else can fit: the model-state finding leads
            top = max((f.confidence for f in kept), default=0.0)
            for f in kept:
                if f.category == "model_state_memory":
                    f.confidence = round(min(0.99, top + 0.01), 2)
    _where_is_not_why(ctx, kept)
    _the_estimate_fits(ctx, kept)
    _the_run_steps(ctx, kept)
    _the_request_is_not_this_step(ctx, kept)
    if ctx.cfg:  # a config was given: confirm steps must not ask for one
        for f in kept:
            f.confirm = f.confirm.replace(
                "Pass the config to recompute-kit doctor --config, or run", "Run"
            )
    return kept, dropped


# Findings that say, from the estimate alone, that the run cannot fit the GPU
_PREDICTS_NO_FIT = ("RK010", "RK011", "RK013", "RK024")


def _the_run_steps(ctx: Context, findings: list[Finding]) -> None:
    """A log of a run that steps and printed no OOM contradicts an estimate that says it cannot
    fit: the estimate is then above what the run holds (a sequence length read as the longest
    sample, batches padded shorter; an assumed input). Those findings say so and stay possible."""
    if not steps_without_oom(ctx):
        return
    _only_possible(
        findings,
        _PREDICTS_NO_FIT,
        0.4,
        " But the log shows the run stepping without an OOM: the estimate is above what it "
        "holds (the sequence length read is the longest a sample may have; batches padded to "
        "their own longest are shorter), so this is an upper bound.",
    )


def _only_possible(findings: list[Finding], rules: tuple[str, ...], cap: float, why: str) -> None:
    """The findings of `rules` stay possible, at most `cap`, and say `why`."""
    for f in findings:
        if f.rule in rules:
            f.confidence = round(min(f.confidence, cap), 2)
            f.evidence += why


# The default readings (rules/fallback.py): a knob of the step's own memory set the peak
_DEFAULT_READINGS = ("RK170", "RK171")
FITS_SHARE = 0.75  # an estimate under this share of the GPU leaves room for the estimate's error


def _the_estimate_fits(ctx: Context, findings: list[Finding]) -> None:
    """An OOM said in words, beside a config whose estimated step takes well under the GPU
    (the capacity from --gpu): the settings read do not explain it by themselves, so the
    default readings that blame the step's own knobs stay possible, below what the estimate
    does not size (a skill trial's NeMo-RL run: 41.8 GiB estimated of 79.1, and the doctor led
    with 'recompute more')."""
    est, gpu, oom = ctx.estimate, ctx.gpu_bytes, ctx.oom
    if est is None or not gpu or (oom is not None and oom.requested_bytes):
        return  # an OOM's numbers are read against the estimate by rules/estimate_gap.py
    peak = est.total_with_overheads_bytes or est.total_bytes
    if peak >= FITS_SHARE * gpu:
        return
    _only_possible(
        findings,
        _DEFAULT_READINGS,
        0.2,
        f" But the estimate of this step as configured is {peak / GIB:.1f} GiB of the "
        f"{gpu / GIB:.1f} GiB GPU: the settings read do not explain an OOM by themselves. What "
        "the estimate does not size is more likely: an inference engine or another process on "
        "the GPU, longer samples than the cap read, another pass (evaluation, "
        "log-probabilities, generation); the OOM message says which.",
    )


def _the_request_is_not_this_step(ctx: Context, findings: list[Finding]) -> None:
    """An OOM whose failed request is larger than any one tensor of the estimated step (even
    the whole optimizer states as one buffer) was not raised by the step the config describes:
    another config ran, or another phase or a mis-sized tensor asked. The findings that rest
    on the estimate stay possible, not confident (a skill trial fed an NPU log's 26 GiB
    request beside a Mixtral script and was told 85% 'recompute more')."""
    est, oom = ctx.estimate, ctx.oom
    if est is None or oom is None or not oom.requested_bytes:
        return
    rows, columns = (est.logits_shape or [0, 0])[:2]
    largest = max(
        est.per_layer_activation_bytes,
        4 * rows * columns,  # the fp32 logits
        est.loss_transient_bytes,
        est.weights_bytes,
        est.grads_bytes,
        est.optimizer_bytes,
    )
    if oom.requested_bytes <= 1.5 * largest:
        return
    _only_possible(
        findings,
        _PREDICTS_NO_FIT,
        0.5,
        f" But the failed request, {oom.requested_bytes / GIB:.2f} GiB, is larger than any one "
        f"tensor of the step this config describes (the largest, {largest / GIB:.2f} GiB, "
        "counts a whole model-state term as one buffer): the run that failed is not the one "
        "the config describes, or something outside the training step asked for it.",
    )


def _where_is_not_why(ctx: Context, findings: list[Finding]) -> None:
    """An OOM raised in the loss says where the step ran out, not what filled the GPU: where
    the estimate puts the embedding, logits and loss at under a quarter of the activations and
    an activation finding explains the rest, the logits findings follow it, and say so."""
    est = ctx.estimate
    act = [f for f in findings if f.category == "activation_memory"]
    if est is None or not act or not est.peak_activation_bytes:
        return
    layers, edges = activation_split(est)
    if edges >= 0.25 * est.peak_activation_bytes:
        return
    top = max(f.confidence for f in act)
    for f in findings:
        if f.category == "logits_memory":
            f.confidence = round(min(f.confidence, top - 0.05), 2)
            # (the loss is where the step ran out only where an OOM says it ran out)
            why = (
                "the loss is where the step ran out, the layers' activations are why"
                if ctx.oom is not None or oom_errors(ctx)
                else "the layers' activations, not the logits, fill the GPU"
            )
            f.evidence += (
                f" The estimate puts the embedding, logits and loss at {edges / GIB:.2f} GiB of "
                f"the {est.peak_activation_bytes / GIB:.2f} GiB of activations at peak (the "
                f"transformer layers {layers / GIB:.2f} GiB): {why}."
            )


def _summary(ctx: Context, findings: list[Finding]) -> str:
    if findings:
        top = findings[0]
        return f"{top.rule} {top.title} (confidence {top.confidence:.0%}): {top.evidence}"
    ev = ctx.evidence
    series = len(fact(ctx, "memory_series", "log") or [])
    read = (
        f"{len(ev.oom)} OOM message(s), {len(ev.iterations)} iteration line(s)"
        + (f", {series} step line(s) with memory" if series else "")
        + f", {len(ev.memory)} memory report(s), {len(ev.errors)} error/warning(s), "
        f"{len(ev.config)} config key(s), {len(ev.experiments)} experiment row(s)"
    )
    config = (
        "the training config or command line (model shape, parallel sizes, recompute settings)"
    )
    if not (ctx.oom or oom_errors(ctx) or fact(ctx, "oom_mentions") or ev.errors):
        # nothing failed: the question is how much memory the run holds, and where
        return (
            f"No known pattern. Read {read}. Nothing in it failed: collect {config}, and the "
            "peak of each run compared (torch.cuda.max_memory_allocated() and "
            "max_memory_reserved() after a few steps) or a memory snapshot "
            "(torch.cuda.memory._dump_snapshot -> recompute-kit doctor --snapshot)."
        )
    return (
        f"No known pattern. Read {read}. Collect next: the full OOM message (it says how "
        f"full the GPU was), {config}, and a few iteration lines with memory reports before "
        "the failure."
    )
