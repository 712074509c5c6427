#!/usr/bin/env python3
"""Apply the skill's measurement contract to measured runs; prints one JSON document on stdout.

A candidate (one recompute setting) is a success only if all of these hold:
  fits        peak reserved <= budget x (1 - margin) on every rank it ran on, and it did not OOM
              (peak allocated is used, with a warning, when reserved was not recorded);
  throughput  TFLOP/s (or, without it, 1 / step time) >= golden x (1 - threshold);
  loss        |loss - golden loss| <= loss_rtol x |golden loss| on every rank both recorded,
              or, with --verify FILE (the output of `rk.py verify --json`), loss and grads
              bitwise equal to no recompute for that spec (no evidence either way: "unchecked",
              and the verdict is "incomplete", not "success").

Input (FILE, format by extension): recompute-kit's ablation results.jsonl, or your own rows as
JSONL, a JSON list (or {"rows": [...]}) or CSV with a header. Fields per row (one row per
candidate and rank): recompute (or spec/name), rank (default 0), status ("oom" marks an OOM),
peak_reserved_bytes | peak_reserved_gib, peak_allocated_bytes | peak_allocated_gib |
peak_memory_bytes, tflops | tflops_per_gpu, step_time_s, loss. GiB = 2^30 bytes.

Output: {"ok": true, "budget_gib", "usable_gib", "golden", "candidates": [{"recompute",
"ranks", "binding_rank", "max_peak_reserved_gib", "max_peak_allocated_gib", "tflops",
"vs_golden_pct", "loss_rel_diff", "checks": {"fits", "throughput", "loss"}, "verdict",
"reasons"}], "recommended"}. Exit 0 when judged (whatever the verdicts), 1 for unreadable
input. Standard library only: needs no torch.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

GIB = 2**30


def load_rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return [dict(r) for r in csv.DictReader(text.splitlines())]
    if suffix == ".json":
        doc = json.loads(text)
        rows = doc.get("rows", doc.get("results")) if isinstance(doc, dict) else doc
        if not isinstance(rows, list):
            raise ValueError("a .json file must hold a list of rows or {'rows': [...]}")
        return rows
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def number(row: dict, *keys: str, scale: float = 1.0) -> float | None:
    for key in keys:
        value = row.get(key)
        if value in (None, "", "-", "null"):
            continue
        try:
            return float(value) * scale
        except (TypeError, ValueError):
            continue
    return None


def normalise(row: dict) -> dict:
    name = row.get("recompute") or row.get("spec") or row.get("name")
    if name is None:
        raise ValueError(f"row without a recompute/spec/name field: {row}")
    rank = row.get("rank")
    status = str(row.get("status") or row.get("result") or "").lower()
    return {
        "recompute": str(name),
        "rank": int(float(rank)) if rank not in (None, "") else 0,
        "oom": "oom" in status or "out of memory" in status,
        "reserved": number(row, "peak_reserved_bytes")
        or number(row, "peak_reserved_gib", scale=GIB),
        "allocated": number(row, "peak_allocated_bytes", "peak_memory_bytes")
        or number(row, "peak_allocated_gib", scale=GIB),
        "tflops": number(row, "tflops", "tflops_per_gpu"),
        "step": number(row, "step_time_s"),
        "loss": number(row, "loss"),
    }


def load_verify(path: Path) -> dict[str, bool]:
    """spec -> loss and grads bitwise equal, from `recompute-kit verify --json`."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = {"none": True}
    for r in doc.get("results", []):
        out[r["recompute"]] = bool(r.get("loss_match")) and bool(r.get("grads_match"))
    return out


def speed(rows: list[dict]) -> tuple[float | None, str]:
    tflops = [r["tflops"] for r in rows if r["tflops"] is not None]
    if tflops:
        return statistics.median(tflops), "tflops"
    steps = [r["step"] for r in rows if r["step"]]
    if steps:
        return 1.0 / statistics.median(steps), "1/step_time"
    return None, ""


def judge(rows: list[dict], args: argparse.Namespace) -> dict:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["recompute"], []).append(row)
    golden = args.golden if args.golden is not None else next(iter(groups), None)
    if golden is not None and golden not in groups and args.golden_tflops is None:
        raise ValueError(f"golden {golden!r} is not among the rows: {', '.join(groups)}")
    golden_speed, golden_kind = (
        (args.golden_tflops, "tflops") if args.golden_tflops else speed(groups.get(golden, []))
    )
    golden_loss = {r["rank"]: r["loss"] for r in groups.get(golden, []) if r["loss"] is not None}
    verified = load_verify(args.verify) if args.verify else {}
    usable = args.budget_gib * GIB * (1 - args.margin) if args.budget_gib else None

    out = []
    for name, group in groups.items():
        reasons: list[str] = []
        checks: dict[str, bool | None] = {}
        reserved = [r["reserved"] for r in group if r["reserved"] is not None]
        allocated = [r["allocated"] for r in group if r["allocated"] is not None]
        peaks = {r["rank"]: r["reserved"] or r["allocated"] for r in group}
        known = {k: v for k, v in peaks.items() if v is not None}
        binding = max(known, key=known.get) if known else None
        if any(r["oom"] for r in group):
            checks["fits"] = False
            ranks = sorted({r["rank"] for r in group if r["oom"]})
            reasons.append(f"OOM on rank(s) {ranks}")
        elif usable is None:
            checks["fits"] = None
            reasons.append("no --budget-gib: fit not judged")
        elif not known:
            checks["fits"] = None
            reasons.append("no peak memory recorded")
        else:
            if len(reserved) < len(group):
                reasons.append(
                    "peak reserved not recorded on every rank: judged on allocated; "
                    "record torch.cuda.max_memory_reserved()"
                )
            over = {k: v for k, v in known.items() if v > usable}
            checks["fits"] = not over
            if over:
                worst = max(over, key=over.get)
                reasons.append(
                    f"rank {worst} peaks at {over[worst] / GIB:.2f} GiB > "
                    f"{usable / GIB:.2f} GiB usable ({args.margin:.0%} margin)"
                )
        value, kind = speed(group)
        vs = None
        if name == golden:
            checks["throughput"] = True
        elif value is None or golden_speed is None:
            checks["throughput"] = None
            reasons.append("no TFLOP/s or step time to compare with golden")
        elif kind != golden_kind:
            checks["throughput"] = None
            reasons.append(f"speed recorded as {kind} here but {golden_kind} for golden")
        else:
            vs = value / golden_speed - 1
            checks["throughput"] = vs >= -args.threshold
            if not checks["throughput"]:
                reasons.append(f"{vs:+.1%} vs golden, beyond -{args.threshold:.0%}: regression")
        losses = {r["rank"]: r["loss"] for r in group if r["loss"] is not None}
        diffs = [
            abs(v - golden_loss[k]) / max(abs(golden_loss[k]), 1e-12)
            for k, v in losses.items()
            if k in golden_loss
        ]
        rel = max(diffs) if diffs else None
        if name == golden:
            checks["loss"] = True if losses or name in verified else None
        elif rel is None and name in verified:
            checks["loss"] = verified[name]
            if not verified[name]:
                reasons.append("recompute-kit verify: loss/grads differ from no recompute")
        elif rel is None:
            checks["loss"] = None
            reasons.append("loss not recorded for this run and golden: unchecked")
        else:
            checks["loss"] = rel <= args.loss_rtol
            if not checks["loss"]:
                reasons.append(f"loss differs from golden by {rel:.2%} > {args.loss_rtol:.2%}")
        if name == golden and checks["loss"] is None:
            reasons.append("golden has no loss recorded")
        if any(v is False for v in checks.values()):
            verdict = "fail"
        elif all(v is True for v in checks.values()):
            verdict = "success"
        else:
            verdict = "incomplete"
        out.append(
            {
                "recompute": name,
                "golden": name == golden,
                "ranks": sorted({r["rank"] for r in group}),
                "binding_rank": binding,
                "max_peak_reserved_gib": round(max(reserved) / GIB, 3) if reserved else None,
                "max_peak_allocated_gib": round(max(allocated) / GIB, 3) if allocated else None,
                "tflops": value if kind == "tflops" else None,
                "vs_golden_pct": None if vs is None else round(100 * vs, 2),
                "loss_rel_diff": rel,
                "checks": checks,
                "verdict": verdict,
                "reasons": reasons,
            }
        )
    winners = [c for c in out if c["verdict"] == "success"]
    best = max(winners, key=lambda c: c["vs_golden_pct"] or 0.0) if winners else None
    return {
        "ok": True,
        "budget_gib": args.budget_gib,
        "usable_gib": None if usable is None else round(usable / GIB, 3),
        "golden": golden,
        "threshold": args.threshold,
        "candidates": out,
        "recommended": best["recompute"] if best else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="judge.py",
        description=__doc__.split("\n\n")[0],
        epilog="Example: judge.py runs/abl/results.jsonl --budget-gib 80 --golden selective:",
    )
    p.add_argument("file", type=Path, help="results.jsonl, or rows as .jsonl/.json/.csv")
    p.add_argument("--budget-gib", type=float, help="GPU memory per rank in GiB (80 for H100)")
    p.add_argument("--margin", type=float, default=0.10, help="kept free (default 0.10)")
    p.add_argument("--golden", help="the reference recompute spec (default: the first row's)")
    p.add_argument("--golden-tflops", type=float, help="a reference TFLOP/s instead of a row")
    p.add_argument(
        "--threshold",
        type=float,
        default=0.10,
        help="allowed throughput loss vs golden (default 0.10)",
    )
    p.add_argument(
        "--loss-rtol",
        type=float,
        default=0.01,
        help="allowed relative loss difference vs golden (default 0.01)",
    )
    p.add_argument(
        "--verify",
        type=Path,
        metavar="FILE",
        help="`rk.py verify --json` output: counts as the loss check per spec",
    )
    args = p.parse_args(argv)
    try:
        rows = [normalise(r) for r in load_rows(args.file)]
        if not rows:
            raise ValueError("no rows")
        doc = judge(rows, args)
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        json.dump({"ok": False, "error": f"{args.file}: {exc}"}, sys.stdout)
        sys.stdout.write("\n")
        return 1
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
