"""The doctor's shared types: what rules look at (`Context`), what they return (`Match`), what a
rule is (`Rule`) and what the engine hands back (`Finding`, `Diagnosis`).

Both `engine.py` and the rule modules import these; neither imports the other's internals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..memory.estimate import Estimate
from .evidence import Evidence, OOMEvent

GIB = 2**30
# The categories that say which memory fills the GPU (the engine's reconciliation, patches)
MEMORY_CATEGORIES = ("activation_memory", "model_state_memory", "logits_memory", "genuine_pressure")
# The keys without which no memory estimate is worth making.
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")


@dataclass
class Context:
    """What the rules look at: the evidence and what the kit can derive from it."""

    evidence: Evidence
    config: Config | None = None  # a kit Config, when the evidence has a model shape
    config_error: str | None = None  # Megatron's validation message for the given config
    gpu_bytes: int | None = None  # from --gpu-memory-gb or the OOM's total capacity
    gpu_name: str | None = None  # --gpu NAME (gpus.py): the step-time model's rates
    estimate: Estimate | None = None  # the current setting, per rank
    oom_stage: int | None = None  # the pipeline stage of the rank the OOM names (engine.py)
    best: Any = None  # the planner's best candidate when a budget is known
    # the planner's best among those recomputing at least what the run does (an OOM's fix)
    best_keeping: Any = None
    plan_error: str | None = None  # why nothing fits, when nothing does
    plan_smallest: Any = None  # then the planner's smallest candidate (plan.Candidate)
    full_refused: str | None = None  # then why full recompute was no candidate, if it was not
    assumptions: list[str] = field(default_factory=list)
    memo: dict[str, Any] = field(default_factory=dict)  # what several rules derive, made once

    @property
    def text(self) -> str:
        """Every error and warning message, for message-based rules."""
        return "\n".join(f"{e.type}: {e.message}" for e in self.evidence.errors)

    def says(self, *fragments: str) -> bool:
        text = self.text
        return any(f in text for f in fragments)

    @property
    def plan_format(self) -> str:
        """The framework the inputs were read as, named as export's formats (Megatron-Bridge's
        where none is known): the planner's picks must have keys there (NeMo-RL: full
        recompute only as uniform, 1 layer)."""
        from ..export import format_for

        read = self.evidence.read or {}
        return format_for(read.get("framework"), str(read.get("format") or ""))

    @property
    def oom(self) -> OOMEvent | None:
        return self.evidence.oom[-1] if self.evidence.oom else None

    @property
    def cfg(self) -> dict[str, Any]:
        return self.evidence.config

    @property
    def _read_recompute(self):
        """The recompute the shared reader resolved from the files, where it read them (a
        child YAML over its parent; NeMo-RL's activation_checkpointing as full recompute)."""
        read = self.evidence.read or {}
        source = (read.get("sources") or {}).get("recompute_granularity") or {}
        if self.config is None or not read.get("config") or source.get("from") != "file":
            return None  # (nothing a file sets: the paste's own keys, as written)
        return self.config.recompute

    @property
    def granularity(self) -> str | None:
        rc = self._read_recompute
        return rc.recompute_granularity if rc is not None else self.cfg.get("recompute_granularity")

    @property
    def modules(self) -> list[str]:
        rc = self._read_recompute
        mods = rc.recompute_modules if rc is not None else self.cfg.get("recompute_modules")
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
    # the rule's own confidence; `confidence` is its calibrated value (doctor/calibration.py)
    raw_confidence: float | None = None
    # The patch as checked by doctor/patches.py (after the rules ran): the framework the inputs
    # show (None: unknown), the patch in that framework's own keys (None: unknown framework),
    # and what the check did ({"keys", "dropped": [{key, value, reason}], "notes", estimate}).
    patch_framework: str | None = None
    patch_keys: dict[str, Any] | None = None
    patch_check: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Diagnosis:
    evidence: Evidence
    findings: list[Finding]
    summary: str
    assumptions: list[str]
    # findings the evidence rules out: {"rule": id, "reason": why}
    dropped: list[dict[str, str]] = field(default_factory=list)
    verdict: Any = None  # doctor/verdict.py's Verdict: diagnosed | needs_evidence | out_of_scope

    def to_json(self, rows: bool = True) -> dict[str, Any]:
        """`rows=False`: see `Evidence.to_json` (for a streaming writer)."""
        out = {
            "evidence": self.evidence.to_json(rows),
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary,
            "assumptions": self.assumptions,
            "dropped": self.dropped,
        }
        if self.verdict is not None:  # verdict, verdict_why, deciding_evidence, collect, ...
            out.update(self.verdict.to_json())
        return out


@dataclass(frozen=True)
class Match:
    confidence: float
    evidence: str
    config_patch: dict[str, Any] | None = None  # replaces the rule's default patch
    fix: str | None = None  # replaces the rule's default fix text


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    category: str
    symptom: str
    cause: str
    confirm: str
    fix: str
    check: Callable[[Context], Match | None]
    config_patch: dict[str, Any] = field(default_factory=dict)
    references: tuple[str, ...] = ()
    supersedes: tuple[str, ...] = ()  # generic rules this one makes redundant when both fire
    fallback: bool = False  # a default reading: asked only when no other rule fired
    reads_stated: str | None = None  # a stated symptom's reading: asked when nothing explains it

    def finding(self, match: Match) -> Finding:
        return Finding(
            rule=self.id,
            category=self.category,
            title=self.title,
            symptom=self.symptom,
            cause=self.cause,
            confirm=self.confirm,
            fix=match.fix or self.fix,
            config_patch=match.config_patch
            if match.config_patch is not None
            else self.config_patch,
            confidence=round(match.confidence, 2),
            references=list(self.references),
            evidence=match.evidence,
        )

    def doc(self) -> dict[str, Any]:
        return {
            "rule": self.id,
            "title": self.title,
            "category": self.category,
            "symptom": self.symptom,
            "cause": self.cause,
            "confirm": self.confirm,
            "fix": self.fix,
            "config_patch": self.config_patch,
            "references": list(self.references),
        }
