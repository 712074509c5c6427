"""What the user says is wrong ranks the findings: a small table, symptom -> the categories that
explain it.

A paste often states its symptom in prose ("recompute has no effect", "it got slower since the
upgrade", "validation error", "the grads are None"). The rules read the artefacts; this table
reads the sentence, and the engine puts the findings whose category explains the stated symptom
ahead of the others (their order among themselves, by confidence, is kept). A finding outside
the symptom's categories still shows, after them: the artefacts may say something else too.

Only plain phrases are matched, case-insensitive; nothing here fires a finding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import Finding


@dataclass(frozen=True)
class Symptom:
    id: str
    pattern: re.Pattern[str]
    categories: tuple[str, ...]  # the categories that explain it, the likeliest first


_NEG = r"(?:has|had|have|makes?|made|with|shows?|showed)\s+(?:no|zero|little)"
SYMPTOMS: tuple[Symptom, ...] = (
    Symptom(
        "recompute_no_effect",
        re.compile(
            r"(?:recompute|recomputation|activation[ -]checkpointing|gradient[ -]checkpointing|"
            r"checkpointing)[^.\n]{0,40}?(?:"
            + _NEG
            + r"\s+(?:effect|difference|impact)|does(?:n'?t| not)\s+(?:\w+\s+){0,2}"
            r"(?:work|reduce|help|change|save|lower|take effect)|is\s+ignored|"
            r"(?:has|had)\s+no\s+effect|not\s+(?:taking|take)\s+effect|"
            r"does\s+nothing|no\s+memory\s+sav)",
            re.I,
        ),
        ("recompute_no_effect", "invalid_config", "framework_bug"),
    ),
    Symptom(
        "slower",
        re.compile(
            r"\b(?:slower|slow(?:ed)?\s+down|slowdown|regress(?:ed|ion)\s+in\s+(?:speed|"
            r"throughput)|throughput\s+(?:dropped|drops|decreased))\b[^.\n]{0,40}?"
            r"\b(?:since|after|when|with|once)\b",
            re.I,
        ),
        ("recompute_overhead", "framework_bug"),
    ),
    Symptom(
        "validation_error",
        re.compile(r"\b(?:validation\s+error|ValidationError|failed\s+validation)\b", re.I),
        ("invalid_config",),
    ),
    Symptom(
        "grads_none",
        re.compile(
            r"\b(?:grads?|gradients?|\.grad)\s+(?:are|is|were|was|=+|becomes?|became)\s*None\b"
            r"|\bgrad(?:ient)?s?\s*=\s*None\b|\bno\s+grad(?:ient)?s?\s+(?:for|flow)",
            re.I,
        ),
        ("checkpoint_api_misuse", "framework_bug"),
    ),
)


def stated(text: str) -> list[str]:
    """The ids of the symptoms the text states, in table order."""
    return [s.id for s in SYMPTOMS if s.pattern.search(text)]


def explaining(symptom_ids: list[str]) -> tuple[str, ...]:
    """The categories that explain the stated symptoms, likeliest first, without repeats."""
    out: list[str] = []
    for s in SYMPTOMS:
        if s.id in symptom_ids:
            out += [c for c in s.categories if c not in out]
    return tuple(out)


def rank(findings: list[Finding], symptom_ids: list[str]) -> list[Finding]:
    """The findings that explain a stated symptom first (by confidence among themselves), then
    the others in the order they came."""
    cats = explaining(symptom_ids)
    if not cats:
        return findings
    first = [f for f in findings if f.category in cats]
    return first + [f for f in findings if f.category not in cats]
