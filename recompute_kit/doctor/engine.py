"""Run the rule catalog over all the evidence together and rank what it finds.

An OOM message alone says how full the GPU was; a config alone says what was asked for; the
two with a model shape let the estimator say whether activations or model states dominate and
which recompute setting would fit. The engine builds that context once, asks every rule, keeps
each rule's finding once, drops generic findings that a specific one supersedes, and ranks by
confidence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, ConfigError, config_from_dict
from ..memory.estimate import Estimate, estimate
from .evidence import Evidence, OOMEvent

GIB = 2**30
# The keys without which no memory estimate is worth making.
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")


@dataclass
class Context:
    """What the rules look at: the evidence and what the kit can derive from it."""

    evidence: Evidence
    config: Config | None = None  # a kit Config, when the evidence has a model shape
    config_error: str | None = None  # Megatron's validation message for the given config
    gpu_bytes: int | None = None  # from --gpu-memory-gb or the OOM's total capacity
    estimate: Estimate | None = None  # the current setting, per rank
    best: Any = None  # the planner's best candidate when a budget is known
    plan_error: str | None = None  # why nothing fits, when nothing does
    assumptions: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """Every error and warning message, for message-based rules."""
        return "\n".join(f"{e.type}: {e.message}" for e in self.evidence.errors)

    def says(self, *fragments: str) -> bool:
        text = self.text
        return any(f in text for f in fragments)

    @property
    def oom(self) -> OOMEvent | None:
        return self.evidence.oom[-1] if self.evidence.oom else None

    @property
    def cfg(self) -> dict[str, Any]:
        return self.evidence.config

    @property
    def granularity(self) -> str | None:
        return self.cfg.get("recompute_granularity")

    @property
    def modules(self) -> list[str]:
        mods = self.cfg.get("recompute_modules")
        if self.granularity != "selective":
            return []
        return ["core_attn"] if mods is None else list(mods)

    @property
    def is_moe(self) -> bool:
        """An MoE model: from the config, or (no config) from MoE modules in the experiments."""
        if self.cfg.get("num_moe_experts"):
            return True
        moe_units = {"moe", "moe_act", "shared_experts"}
        return any(
            moe_units & set(r.get("recompute_modules") or []) for r in self.evidence.experiments
        )

    @property
    def is_mla(self) -> bool:
        return bool(self.cfg.get("multi_latent_attention"))

    @property
    def flash(self) -> bool:
        """Fused/flash attention (Megatron's default with TransformerEngine)."""
        return self.cfg.get("attention_backend", "auto") != "unfused"


@dataclass
class Finding:
    rule: str
    category: str
    title: str
    symptom: str
    cause: str
    confirm: str
    fix: str
    config_patch: dict[str, Any]
    confidence: float
    references: list[str]
    evidence: str  # two or three sentences citing the input's numbers

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Diagnosis:
    evidence: Evidence
    findings: list[Finding]
    summary: str
    assumptions: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "evidence": self.evidence.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary,
            "assumptions": self.assumptions,
        }


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
    from .rules import RULES

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
