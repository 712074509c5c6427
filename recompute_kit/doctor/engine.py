"""Run the rule catalog over all the evidence together and rank what it finds.

An OOM message alone says how full the GPU was; a config alone says what was asked for; the
two with a model shape let the estimator say whether activations or model states dominate and
which recompute setting would fit. The engine builds that context once, asks every rule, keeps
each rule's finding once, drops generic findings that a specific one supersedes, and ranks by
confidence.
"""

from __future__ import annotations

from typing import Any

from ..config import Config, ConfigError, config_from_dict
from ..memory.estimate import estimate
from .evidence import Evidence
from .rules import RULES
from .types import GIB, SHAPE_KEYS, Context, Diagnosis, Finding


def build_context(evidence: Evidence, gpu_memory_gb: float | None = None) -> Context:
    ctx = Context(evidence)
    if gpu_memory_gb:
        ctx.gpu_bytes = int(gpu_memory_gb * GIB)
    elif ctx.oom and ctx.oom.total_bytes:
        ctx.gpu_bytes = ctx.oom.total_bytes
    flat = dict(evidence.config)
    if flat.get("recompute_granularity") is not None or flat.get("cpu_offloading"):
        try:
            cfg, _ = config_from_dict(_known_keys(flat))
            cfg.validate()
        except ConfigError as exc:
            ctx.config_error = str(exc)
    if all(flat.get(k) for k in SHAPE_KEYS):
        ctx.config, ctx.assumptions = _config_for_estimate(flat)
        if ctx.config is not None:
            _estimate(ctx)
    return ctx


def _known_keys(flat: dict[str, Any]) -> dict[str, Any]:
    from ..config import CONFIG_KEYS

    return {k: v for k, v in flat.items() if k in CONFIG_KEYS}


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
    for key in ("hidden_dropout", "attention_dropout"):
        known.setdefault(key, 0.0)
    known.setdefault("attention_backend", "flash")
    known.setdefault("bf16", not known.get("fp16", False))
    known.setdefault("normalization", "RMSNorm" if known.get("swiglu") else "LayerNorm")
    known["recompute_num_layers"] = known.get("recompute_num_layers")
    try:
        cfg, _ = config_from_dict(known)
        cfg.validate()
        estimate(cfg)  # shapes must divide
    except (ConfigError, ValueError, ZeroDivisionError, TypeError) as exc:
        return None, [*assumptions, f"no estimate: {exc}"]
    return cfg, assumptions


def _estimate(ctx: Context) -> None:
    from ..plan import plan

    ctx.estimate = estimate(ctx.config)
    if ctx.gpu_bytes:
        try:
            ctx.best = plan(ctx.config, ctx.gpu_bytes / GIB).best
        except ConfigError as exc:
            ctx.plan_error = str(exc)


def diagnose(evidence: Evidence, gpu_memory_gb: float | None = None) -> Diagnosis:
    """Evaluate every rule over the evidence; findings ranked by confidence, best first."""
    ctx = build_context(evidence, gpu_memory_gb)
    found: list[tuple[Finding, tuple[str, ...]]] = []
    for rule in RULES:
        match = rule.check(ctx)
        if match is None:
            continue
        found.append((rule.finding(match), rule.supersedes))
    fired = {f.rule for f, _ in found}
    dropped = {old for f, sup in found for old in sup if old in fired}
    findings = sorted(
        (f for f, _ in found if f.rule not in dropped), key=lambda f: (-f.confidence, f.rule)
    )
    return Diagnosis(evidence, findings, _summary(ctx, findings), ctx.assumptions)


def _summary(ctx: Context, findings: list[Finding]) -> str:
    if findings:
        top = findings[0]
        return f"{top.rule} {top.title} (confidence {top.confidence:.0%}): {top.evidence}"
    ev = ctx.evidence
    read = (
        f"{len(ev.oom)} OOM message(s), {len(ev.iterations)} iteration line(s), "
        f"{len(ev.memory)} memory report(s), {len(ev.errors)} error/warning(s), "
        f"{len(ev.config)} config key(s), {len(ev.experiments)} experiment row(s)"
    )
    return (
        f"No known pattern. Read {read}. Collect next: the full OOM message (it says how "
        "full the GPU was), the training config or command line (model shape, parallel sizes, "
        "recompute settings), and a few iteration lines with memory reports before the failure."
    )
