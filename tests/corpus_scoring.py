"""Score the doctor on a corpus of real cases (tests/corpus/cases/*.yaml).

A case is one public issue or forum thread: its URL (`source`), the text users pasted there
(`artefacts`, run as the log; `config` as the config when present), the maintainers' diagnosis
as a category (`expected_category`) and the settings or values a correct fix must name
(`fix_names`). The corpus is split once, by a hash of the URL, into a development set (rules
are written against it) and a held-out set (only ever scored).

Two scores per split and category: top-1 category accuracy, and whether the top finding's fix
(its text, config patch and commands) names any of the case's `fix_names`.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import collect

REQUIRED_KEYS = ("id", "source", "artefacts", "expected_category", "fix_names")


def split_of(source_url: str) -> str:
    """'held_out' for 2 in 5 URLs by a hash fixed before any rule was written, else 'dev'."""
    bucket = int(hashlib.sha256(source_url.encode()).hexdigest()[:8], 16) % 5
    return "held_out" if bucket in (0, 1) else "dev"


@dataclass
class CaseResult:
    id: str
    source: str
    split: str
    expected: str
    got: str | None  # the top finding's category; None when nothing fired
    rule: str
    category_ok: bool
    fix_ok: bool
    in_top3: bool = False  # the expected category among the first three findings
    confidence: float | None = None  # the top finding's
    error: str = ""  # the crash, when the doctor raised
    decidable: bool | None = None  # the case's label: its paste alone decides (None: unlabelled)
    verdict: str | None = None  # diagnosed | needs_evidence | out_of_scope
    collect_decides: bool = False  # `collect` names an artefact that decides the expected category
    raw_confidence: float | None = None  # the top finding's, before calibration
    decided: bool = False  # the input decides the top finding's category (doctor/verdict.py)
    # the input holds the evidence that decides the EXPECTED category, by the doctor's own rule
    # (doctor/verdict.py `decides`): e.g. an OOM message alone does not say which tensors
    expected_decidable: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def load_case(path: Path) -> dict[str, Any]:
    """One case file; ValueError with one line when it cannot be used."""
    try:
        case = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path.name}: cannot be read: {str(exc).splitlines()[0]}") from None
    if not isinstance(case, dict):
        raise ValueError(f"{path.name}: not a mapping")
    missing = [k for k in REQUIRED_KEYS if not case.get(k)]
    if missing:
        raise ValueError(f"{path.name}: missing {', '.join(missing)}")
    return case


def load_cases(directory: Path) -> list[dict[str, Any]]:
    return [load_case(p) for p in sorted(Path(directory).glob("*.yaml"))]


def _fix_text(finding) -> str:
    """What the top finding tells the user to change: fix text, config patch (keys and
    values, commands included)."""
    return (finding.fix + " " + json.dumps(finding.config_patch, default=str)).lower()


def run_case(case: dict[str, Any], workdir: Path, calibrated: bool = True) -> CaseResult:
    from recompute_kit.doctor.verdict import COLLECT_FOR

    expected = case["expected_category"]
    split = split_of(case["source"])
    result = CaseResult(case["id"], case["source"], split, expected, None, "-", False, False)
    result.decidable = case.get("decidable")
    try:
        log = workdir / f"{case['id']}.log"
        log.write_text(str(case["artefacts"]), encoding="utf-8")
        config = None
        if case.get("config"):
            config = workdir / f"{case['id']}.config"
            config.write_text(str(case["config"]), encoding="utf-8")
        evidence = collect(logs=[str(log)], config=str(config) if config else None)
        diagnosis = diagnose(evidence, calibrated=calibrated)
    except Exception as exc:  # a crash is a result to report, not a reason to stop scoring
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    verdict = diagnosis.verdict
    result.verdict = verdict.verdict
    from recompute_kit.doctor.verdict import decides as _decides

    result.expected_decidable = _decides(expected, verdict.deciding_evidence)
    deciders = set(COLLECT_FOR.get(expected, ()))
    result.collect_decides = any(c["id"] in deciders for c in verdict.collect)
    if diagnosis.findings:
        top = diagnosis.findings[0]
        result.got, result.rule = top.category, top.rule
        result.category_ok = top.category == expected
        text = _fix_text(top)
        result.fix_ok = any(str(name).lower() in text for name in case["fix_names"])
        result.in_top3 = any(f.category == expected for f in diagnosis.findings[:3])
        result.confidence = top.confidence
        result.raw_confidence = top.raw_confidence
        from recompute_kit.doctor.verdict import decides

        result.decided = decides(top.category, verdict.deciding_evidence)
    return result


def score(directory: Path, calibrated: bool = True) -> list[CaseResult]:
    cases = load_cases(directory)
    with tempfile.TemporaryDirectory() as tmp:
        return [run_case(case, Path(tmp), calibrated) for case in cases]


# Bands of the top finding's confidence: how often the doctor is right when it is this sure.
CONFIDENCE_BANDS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 1.0))


def _band(confidence: float) -> str:
    lo, hi = next(b for b in CONFIDENCE_BANDS if confidence < b[1] or b == CONFIDENCE_BANDS[-1])
    return f"{lo:.2f}-{hi:.2f}"


def table(results: list[CaseResult]) -> dict[str, Any]:
    """{split: {category: {n, category_ok, fix_ok, in_top3, silent}, "all": {...}}}, counts as
    integers (`in_top3`: the expected category among the first three findings, which tells a
    ranking miss from a reading miss; `silent`: cases on which no rule fired at all), and
    {split}_by_confidence: {band: {n, category_ok}} (calibration of the top finding)."""
    out: dict[str, Any] = {}
    for split in ("dev", "held_out"):
        rows: dict[str, dict[str, int]] = defaultdict(
            lambda: {"n": 0, "category_ok": 0, "fix_ok": 0, "in_top3": 0, "silent": 0}
        )
        for r in results:
            if r.split != split:
                continue
            for key in (r.expected, "all"):
                rows[key]["n"] += 1
                rows[key]["category_ok"] += r.category_ok
                rows[key]["fix_ok"] += r.fix_ok
                rows[key]["in_top3"] += r.in_top3
                rows[key]["silent"] += r.got is None and not r.error
        out[split] = dict(sorted(rows.items(), key=lambda kv: (kv[0] == "all", kv[0])))
        bands = {f"{lo:.2f}-{hi:.2f}": {"n": 0, "category_ok": 0} for lo, hi in CONFIDENCE_BANDS}
        for r in results:
            if r.split == split and r.confidence is not None:
                bands[_band(r.confidence)]["n"] += 1
                bands[_band(r.confidence)]["category_ok"] += r.category_ok
        out[f"{split}_by_confidence"] = bands
        out[f"{split}_verdict"] = verdict_table([r for r in results if r.split == split])
    out["crashes"] = [f"{r.id}: {r.error}" for r in results if r.error]
    return out


def verdict_table(results: list[CaseResult]) -> dict[str, Any]:
    """Decidable and thin cases apart: decidable top-1 (and how many were `diagnosed`, and
    right when diagnosed); thin cases answered `needs_evidence` with a `collect` item that
    decides the expected category; confident findings (>= 0.85) right."""
    dec = [r for r in results if r.decidable]
    thin = [r for r in results if r.decidable is False]
    diagnosed = [r for r in results if r.verdict == "diagnosed"]
    confident = [r for r in results if r.confidence is not None and r.confidence >= 0.85]
    by_rule = [r for r in results if r.expected_decidable]
    return {
        "decidable": {
            "n": len(dec),
            "top1": sum(r.category_ok for r in dec),
            "diagnosed": sum(r.verdict == "diagnosed" for r in dec),
        },
        "evidence_decides_expected": {
            "n": len(by_rule),
            "top1": sum(r.category_ok for r in by_rule),
        },
        "thin": {
            "n": len(thin),
            "needs_evidence": sum(r.verdict == "needs_evidence" for r in thin),
            "needs_evidence_deciding_collect": sum(
                r.verdict == "needs_evidence" and r.collect_decides for r in thin
            ),
            "diagnosed": sum(r.verdict == "diagnosed" for r in thin),
            "out_of_scope": sum(r.verdict == "out_of_scope" for r in thin),
        },
        "diagnosed": {"n": len(diagnosed), "right": sum(r.category_ok for r in diagnosed)},
        "confident": {"n": len(confident), "right": sum(r.category_ok for r in confident)},
    }


def _share(k: int, n: int) -> str:
    return f"{k}/{n} ({k / n:.0%})" if n else "0/0"


def format_table(summary: dict[str, Any]) -> str:
    lines = []
    for split in ("dev", "held_out"):
        lines.append(f"{split}:")
        lines.append(
            f"  {'category':28} {'n':>4} {'top-1':>13} {'fix names it':>13} {'top-3':>13} "
            f"{'nothing':>8}"
        )
        for category, row in summary[split].items():
            n = row["n"]
            lines.append(
                f"  {category:28} {n:>4} {row['category_ok']:>4} ({row['category_ok'] / n:4.0%})"
                f" {row['fix_ok']:>4} ({row['fix_ok'] / n:4.0%})"
                f" {row['in_top3']:>4} ({row['in_top3'] / n:4.0%}) {row['silent']:>8}"
            )
    for split in ("dev", "held_out"):
        lines.append(f"{split}, reliability: top-1 right by the top finding's confidence band:")
        for band, row in summary[f"{split}_by_confidence"].items():
            share = f"({row['category_ok'] / row['n']:4.0%})" if row["n"] else ""
            lines.append(f"  {band:28} {row['n']:>4} {row['category_ok']:>4} {share}")
    for split in ("dev", "held_out"):
        v = summary.get(f"{split}_verdict")
        if not v:
            continue
        d, t = v["decidable"], v["thin"]
        lines.append(f"{split}, verdicts (decidable / thin from the cases' `decidable` labels):")
        lines.append(f"  decidable cases, top-1 right        {_share(d['top1'], d['n'])}")
        lines.append(f"  decidable cases, diagnosed           {_share(d['diagnosed'], d['n'])}")
        e = v["evidence_decides_expected"]
        lines.append(f"  evidence decides expected, top-1     {_share(e['top1'], e['n'])}")
        lines.append(
            f"  thin cases, needs_evidence           {_share(t['needs_evidence'], t['n'])}"
        )
        lines.append(
            "  thin, needs_evidence + deciding collect "
            f"{_share(t['needs_evidence_deciding_collect'], t['n'])}"
        )
        lines.append(f"  thin cases, diagnosed anyway         {_share(t['diagnosed'], t['n'])}")
        lines.append(
            f"  diagnosed verdicts right             "
            f"{_share(v['diagnosed']['right'], v['diagnosed']['n'])}"
        )
        lines.append(
            f"  confident findings (>= 0.85) right   "
            f"{_share(v['confident']['right'], v['confident']['n'])}"
        )
    lines.append(f"crashes: {len(summary['crashes'])}")
    lines.extend(f"  {c}" for c in summary["crashes"])
    return "\n".join(lines)
