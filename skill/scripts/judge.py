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
JSONL, a JSON list (or {"rows": [...]}), CSV with a header or a Markdown table (.md); and/or
Megatron training logs (--log SPEC=FILE, one run each, repeatable: their iteration lines).
Fields per row (one row per candidate and rank, or per iteration): recompute (or spec/name),
rank (default 0), status ("oom" marks an OOM), peak_reserved_bytes | peak_reserved_gib,
peak_allocated_bytes | peak_allocated_gib | peak_memory_bytes, tflops | tflops_per_gpu,
step_time_s | step_time_ms, loss; for repeats and per-iteration tables also iteration (or
step), run (run_id/repeat/trial/seed), profiler (a flag: that iteration was profiled), host
(node), date, global_batch_size, seq_length. GiB = 2^30 bytes.

Speed is judged with its noise (recompute_kit/runstats.py): per run, warm-up iterations (until
the step time settles, or --warmup N) and profiled iterations are dropped and the median and
IQR taken; a setting is the median of its repeats, its noise the range of their medians (one
run: its IQR); repeats far from the others are outliers, and runs that differ in host, date,
profiler, batch or sequence are confounders. The throughput check passes or fails only when
the whole noise band is on one side of the threshold, else it is null ("within noise"), and
`rerun` names the re-run that would decide.

Output: {"ok": true, "budget_gib", "usable_gib", "golden", "candidates": [{"recompute",
"ranks", "binding_rank", "max_peak_reserved_gib", "max_peak_allocated_gib", "tflops",
"vs_golden_pct", "loss_rel_diff", "checks": {"fits", "throughput", "loss"}, "verdict",
"reasons", "speed": {runs, median, low, high, noise, runs_detail, comparison}}],
"recommended", "recommendation": {recompute, decided, why}, "outliers", "confounders",
"rerun"}. Exit 0 when judged (whatever the verdicts), 1 for unreadable
input. Standard library only: needs no torch.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit of this skill folder

from recompute_kit.runstats import RERUN, compare, judge_runs, split_runs, summarize_run

GIB = 2**30


def _markdown_rows(text: str) -> list[dict]:
    """The rows of the Markdown tables in `text` (header row, separator, rows)."""
    lines = [line.strip() for line in text.splitlines()]
    rows: list[dict] = []
    i = 0
    while i < len(lines) - 1:
        sep = lines[i + 1].replace("|", "").replace(":", "").replace("-", "").strip()
        if lines[i].startswith("|") and "-" in lines[i + 1] and not sep:
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip("|").split("|")]
                rows.append(dict(zip(header, cells, strict=False)))
                i += 1
        else:
            i += 1
    return rows


def load_rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return [dict(r) for r in csv.DictReader(text.splitlines())]
    if suffix in (".md", ".markdown"):
        return _markdown_rows(text)
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


def _key(row: dict, *keys: str):
    """The first of `keys` the row has (headers compared without case, spaces or dashes)."""
    folded = {str(k).strip().lower().replace(" ", "_").replace("-", "_"): v for k, v in row.items()}
    for key in keys:
        value = folded.get(key)
        if value not in (None, ""):
            return value
    return None


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y", "x", "profiled")


def normalise(row: dict) -> dict:
    row = {str(k).strip().lower().replace(" ", "_").replace("-", "_"): v for k, v in row.items()}
    name = row.get("recompute") or row.get("spec") or row.get("name") or row.get("setting")
    if name is None:
        raise ValueError(f"row without a recompute/spec/name field: {row}")
    rank = row.get("rank")
    status = str(row.get("status") or row.get("result") or "").lower()
    iteration = _key(row, "iteration", "iter", "step")
    step_ms = number(row, "step_time_ms", "elapsed_ms", "iteration_time_ms")
    step_s = number(row, "step_time_s", "step_time")
    profiler = _key(row, "profiler", "profiling", "profile", "profiled")
    return {
        "recompute": str(name),
        "rank": int(float(rank)) if rank not in (None, "") else 0,
        "oom": "oom" in status or "out of memory" in status,
        "reserved": number(row, "peak_reserved_bytes")
        or number(row, "peak_reserved_gib", scale=GIB),
        "allocated": number(row, "peak_allocated_bytes", "peak_memory_bytes")
        or number(row, "peak_allocated_gib", scale=GIB),
        "tflops": number(row, "tflops", "tflops_per_gpu", "tflop/s/gpu"),
        "step": step_s if step_s is not None else (step_ms / 1000 if step_ms else None),
        "loss": number(row, "loss", "lm_loss"),
        "iteration": int(float(iteration)) if iteration is not None else None,
        "run": _key(row, "run", "run_id", "repeat", "trial", "seed"),
        "profiler": _flag(profiler) if profiler is not None else None,
        "host": _key(row, "host", "hostname", "node", "nodes", "node_list"),
        "date": _key(row, "date", "day", "started"),
        "global_batch_size": _key(row, "global_batch_size", "gbs"),
        "seq_length": _key(row, "seq_length", "seq_len", "sequence_length"),
    }


def load_log(spec: str) -> list[dict]:
    """Rows from a Megatron training log given as SPEC=FILE: one per iteration line, the
    profiler window from the arguments it printed (--profile-step-start/end)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--log wants SPEC=FILE, not {spec!r}")
    from recompute_kit.doctor.evidence import parse_log_file

    ev = parse_log_file(path)
    cfg = ev.config
    window = None
    if str(cfg.get("profile", "")).lower() in ("true", "1") or cfg.get("profile") is True:
        try:
            window = (int(cfg["profile_step_start"]), int(cfg["profile_step_end"]))
        except (KeyError, TypeError, ValueError):
            window = None
    rows = []
    for it in ev.iterations:
        if it.elapsed_ms is None and it.tflops_per_gpu is None:
            continue
        rows.append(
            {
                "recompute": name,
                "rank": 0,
                "oom": False,
                "reserved": None,
                "allocated": None,
                "tflops": it.tflops_per_gpu,
                "step": it.elapsed_ms / 1000 if it.elapsed_ms else None,
                "loss": it.loss,
                "iteration": it.iteration,
                "run": path,
                "profiler": None,
                "profile_window": window,
                "host": None,
                "date": None,
                "global_batch_size": it.global_batch_size,
                "seq_length": cfg.get("seq_length"),
            }
        )
    if ev.oom:
        rows.append({**(rows[-1] if rows else {}), "recompute": name, "oom": True, "run": path})
    if not rows:
        raise ValueError(f"{path}: no iteration lines with a step time or TFLOP/s")
    return rows


def load_verify(path: Path) -> dict[str, bool]:
    """spec -> loss and grads bitwise equal, from `recompute-kit verify --json`."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    out = {"none": True}
    for r in doc.get("results", []):
        out[r["recompute"]] = bool(r.get("loss_match")) and bool(r.get("grads_match"))
    return out


def speed(
    name: str, rows: list[dict], warmup: int | None, kind: str | None = None
) -> tuple[list[dict], str]:
    """Per-run statistics of one setting's speed (TFLOP/s, else step time) and the kind."""
    if kind is None:
        kind = "tflops" if any(r["tflops"] is not None for r in rows) else "step"
    out = []
    for n, run in enumerate(split_runs(rows)):
        ranked = run
        if any(r["iteration"] is not None for r in run):
            low = min(r["rank"] for r in run)
            ranked = sorted((r for r in run if r["rank"] == low), key=lambda r: r["iteration"] or 0)
        samples = [
            {"value": r[kind], "iteration": r["iteration"], "profiler": r["profiler"]}
            for r in ranked
            if r[kind] is not None and not r["oom"]
        ]
        if not samples:
            continue
        stats = summarize_run(samples, warmup, run[0].get("profile_window"))
        if stats.get("median") is None:
            continue
        first = run[0]
        label = first["run"] if first["run"] is not None else f"run {n + 1}"
        if first["run"] is None and first["host"]:
            label = f"{label} on {first['host']}"
        extra = {
            f: first[f] for f in ("host", "date", "global_batch_size", "seq_length") if first[f]
        }
        if len(samples) == 1 and any(r["profiler"] for r in run):
            extra["profiler"] = "on"  # a summary measured under the profiler: not droppable
        elif any(r["profiler"] is not None for r in run):
            extra["profiler"] = "off"  # (profiled iterations are dropped)
        out.append({"setting": name, "run": str(label), **stats, **extra})
    return out, ("tflops" if kind == "tflops" else "1/step_time")


def judge(rows: list[dict], args: argparse.Namespace) -> dict:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["recompute"], []).append(row)
    golden = args.golden if args.golden is not None else next(iter(groups), None)
    if golden is not None and golden not in groups and args.golden_tflops is None:
        raise ValueError(f"golden {golden!r} is not among the rows: {', '.join(groups)}")
    golden_rows = groups.get(golden, [])
    kind = (
        "tflops"
        if args.golden_tflops or any(r["tflops"] is not None for r in golden_rows)
        else "step"
    )
    all_runs: list[dict] = []
    dropped_runs: list[dict] = []
    for name, group in groups.items():
        runs, _ = speed(name, group, args.warmup, kind)
        clean = [r for r in runs if r.get("profiler") != "on"]
        if clean and len(clean) < len(runs):  # summaries measured under the profiler
            dropped_runs += [
                {"setting": name, "run": r["run"], "why": "measured with the profiler on"}
                for r in runs
                if r.get("profiler") == "on"
            ]
            runs = clean
        all_runs += runs
    reference = None
    if args.golden_tflops:
        value = args.golden_tflops
        reference = {"runs": 1, "median": value, "low": value, "high": value, "noise": "given"}
    measured = judge_runs(all_runs, golden, kind == "tflops", reference)
    kind_name = "tflops" if kind == "tflops" else "1/step_time"
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
        stats = measured["settings"].get(name, {})
        comparison = stats.get("comparison") or {}
        value = stats.get("median")
        vs = comparison.get("change")
        if name == golden:
            checks["throughput"] = True
        elif value is None or vs is None:
            checks["throughput"] = None
            reasons.append("no TFLOP/s or step time to compare with golden")
        elif comparison.get("confounded"):
            checks["throughput"] = None
            reasons.append(f"throughput not judged: {comparison['why']}")
        elif comparison.get("noise_measured") is False or "noise" not in stats:
            # single summary values: judged on the values, the noise unknown
            checks["throughput"] = vs >= -args.threshold
            if not checks["throughput"]:
                reasons.append(f"{vs:+.1%} vs golden, beyond -{args.threshold:.0%}: regression")
            reasons.append("judged on single values: the run-to-run noise is not measured")
        else:
            low, high = comparison["change_low"], comparison["change_high"]
            if low >= -args.threshold:
                checks["throughput"] = True
            elif high < -args.threshold:
                checks["throughput"] = False
                reasons.append(
                    f"{vs:+.1%} vs golden ({low:+.1%} to {high:+.1%} with the noise), beyond "
                    f"-{args.threshold:.0%}: regression"
                )
            else:
                checks["throughput"] = None
                reasons.append(
                    f"{vs:+.1%} vs golden is within noise of the -{args.threshold:.0%} "
                    f"threshold ({low:+.1%} to {high:+.1%}): {measured['rerun']}"
                )
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
                "speed": {
                    **{k: v for k, v in stats.items() if k != "comparison"},
                    "kind": kind_name,
                    "comparison": comparison or None,
                    "runs_detail": [r for r in all_runs if r["setting"] == name],
                },
                "vs_golden_pct": None if vs is None else round(100 * vs, 2),
                "loss_rel_diff": rel,
                "checks": checks,
                "verdict": verdict,
                "reasons": reasons,
            }
        )
    winners = [c for c in out if c["verdict"] == "success"]
    best = max(winners, key=lambda c: c["vs_golden_pct"] or 0.0) if winners else None
    recommendation = None
    if best is not None:
        ties = [
            c["recompute"]
            for c in winners
            if c is not best
            and not compare(
                measured["settings"].get(c["recompute"], {}),
                measured["settings"].get(best["recompute"], {}),
                kind == "tflops",
            )["decided"]
        ]
        if ties:
            why = (
                f"'{best['recompute']}' is not faster than {', '.join(map(repr, ties))} beyond "
                f"the noise: all pass the contract; {RERUN} to choose on speed"
            )
        else:
            why = f"'{best['recompute']}' passes the contract"
        recommendation = {"recompute": best["recompute"], "within_noise_of": ties, "why": why}
    return {
        "ok": True,
        "budget_gib": args.budget_gib,
        "usable_gib": None if usable is None else round(usable / GIB, 3),
        "golden": golden,
        "threshold": args.threshold,
        "candidates": out,
        "recommended": best["recompute"] if best else None,
        "recommendation": recommendation,
        "outliers": measured["outliers"],
        "confounders": measured["confounders"],
        "dropped_runs": dropped_runs,
        "rerun": measured["rerun"],
        "speed_kind": kind_name if groups else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="judge.py",
        description=__doc__.split("\n\n")[0],
        epilog="Example: judge.py runs/abl/results.jsonl --budget-gib 80 --golden selective:",
    )
    p.add_argument(
        "file", type=Path, nargs="?", help="results.jsonl, or rows as .jsonl/.json/.csv/.md"
    )
    p.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="SPEC=FILE",
        help="a Megatron training log of one run of SPEC (repeatable: repeats, settings)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        help="iterations to drop at the start of each run (default: until the step time settles)",
    )
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
        if args.file is None and not args.log:
            raise ValueError("give a results FILE or --log SPEC=FILE")
        rows = [normalise(r) for r in load_rows(args.file)] if args.file else []
        for spec in args.log:
            rows += load_log(spec)
        if not rows:
            raise ValueError("no rows")
        doc = judge(rows, args)
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        json.dump({"ok": False, "error": f"{args.file or 'judge'}: {exc}"}, sys.stdout)
        sys.stdout.write("\n")
        return 1
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
