#!/usr/bin/env python3
"""Apply the skill's measurement contract to measured runs; prints one JSON document on stdout.

A candidate (one recompute setting) is a success only if all of these hold:
  fits        peak reserved <= budget x (1 - margin) on every rank it ran on, and it did not OOM
              (peak allocated is used, with a warning, when reserved was not recorded);
  throughput  TFLOP/s (or, without it, 1 / step time) >= golden x (1 - threshold);
  loss        |loss - golden loss| <= loss_rtol x |golden loss| at every rank and iteration both
              recorded (none in common: not compared, said),
              or, with --verify FILE (the output of `rk.py verify --json`), loss and grads
              bitwise equal to no recompute for that spec (no evidence either way: "unchecked",
              and the verdict is "incomplete", not "success").

Input (FILE, format by extension): recompute-kit's ablation results.jsonl, or your own rows as
JSONL, a JSON list (or {"rows": [...]}), CSV with a header or a Markdown table (.md); and/or
Megatron training logs (--log SPEC=FILE, one run each, repeatable: their iteration lines).
Columns are read by the names users log, units from the name (recompute_kit/runcolumns.py):
the setting: recompute | spec | name (or run alone; a boolean gradient_checkpointing /
activation_checkpointing column, or true/false in the setting column, is `full` on and `none`
off); rank (default 0); status ("oom" marks an OOM) or oom; peak memory: *reserved* (e.g.
peak_reserved_bytes, max_reserved_gib) else allocated / peak memory (peak_allocated_mib,
"peak memory (bytes)"), in bytes/KiB/MiB/GiB (binary) or KB/MB/GB (SI) from the name; tflops
(tflops_per_gpu, TFLOP/s/GPU); step time (time_ms, step_time_s, "elapsed time per iteration
(ms)", iter_time, seconds; no unit in the name: ms from 50 up, said); loss; for repeats and
per-iteration tables also iteration (iter, step), run (run_id/repeat/trial/seed), profiler (a
flag: that iteration was profiled), host (node), date, global_batch_size, seq_length.
GiB = 2^30 bytes. What was assumed, and the columns not used, are listed in `input_notes`; a
table with no setting column is refused in one line, a row without a setting skipped and said.

Speed is judged with its noise (recompute_kit/runstats.py): per run, warm-up iterations (read
from the data: leading iterations slower than the run's steady median by 3 x 1.4826 x MAD and
2%, at most half the run; or --warmup N) and profiled iterations are dropped and the median and
IQR taken; a setting is the median of its repeats, its noise the range of their medians (one
run: its IQR); repeats far from the others, or much noisier (IQR 3x their repeats'), are
outliers, and runs that differ in host, date (a log's timestamps), profiler, batch, sequence,
train_iters or any printed argument but the recompute ones are confounders. The
throughput check passes or fails only when the whole noise band is on one side of the
threshold, else it is null ("within noise"), and `rerun` names the re-run that would decide.
A golden that does not fit (OOM, or over the budget) is infeasible (`baseline`): the settings
that fit are compared among themselves, against the fastest, and `recommendation` names it with
its spread (decided only beyond the noise), saying which checks are still open. The
throughput check is runstats.speed_verdict, the judgement the doctor's RK033/RK237/RK238 make.
With --config FILE (the run's launch script or YAML), a measured slowdown is set against the
extra FLOPs the estimator gives its recompute setting (`expected_cost`: "as expected" or "more
than recompute explains"). A log's memory lines ("[Rank N] ... memory (MB) | ... | max
reserved: ...") give each rank's peak.

Output: {"ok": true, "budget_gib", "usable_gib", "golden", "candidates": [{"recompute",
"ranks", "binding_rank", "max_peak_reserved_gib", "max_peak_allocated_gib", "tflops",
"vs_golden_pct", "loss_rel_diff", "checks": {"fits", "throughput", "loss"}, "speed_verdict":
{state, check, text}, "expected_cost": {arm, base, predicted, measured, explained, text}, "verdict",
"reasons", "speed": {runs, median, low, high, noise, kind, unit, better, runs_detail,
comparison}}], "recommended", "recommendation": {recompute, decided, within_noise_of,
passes_contract, why}, "baseline", "outliers", "confounders", "rerun", "speed_kind",
"speed_unit", "config_note", "input_notes"}. Exit 0 when judged (whatever the verdicts), 1 for
unreadable input. Standard library only: needs no torch.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit of this skill folder

from recompute_kit.runcolumns import read_table
from recompute_kit.runstats import (
    RERUN,
    compare,
    judge_runs,
    speed_verdict,
    split_runs,
    summarize_run,
)

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


# Printed arguments that are the setting under test or the run's bookkeeping (paths, logging,
# ranks): every other argument that differs between two runs is a confounder.
_NOT_SETUP = re.compile(
    r"recompute|distribute_saved_activations|cpu_offloading|_path$|_dir$|^(save|load)(_|$)"
    r"|wandb|tensorboard|^log_|rank$|timestamp|^exit_"
)


def load_log(spec: str) -> list[dict]:
    """Rows from a Megatron training log given as SPEC=FILE: one per iteration line, the
    profiler window from the arguments it printed (--profile-step-start/end), the date from the
    iteration lines' timestamps, the planned length (train_iters) from "iteration N/ TOTAL",
    the printed arguments as the run's `setup`, and one row per rank with the peak of its
    memory reports ("[Rank 1] (after 1 iterations) memory (MB) | ... | max reserved: ...")."""
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
    date = (ev.iteration_stamps.get("first") or "")[:10] or None
    printed = ev.facts.get("args_dump") or {}
    setup = {k: v for k, v in printed.items() if not _NOT_SETUP.search(k)}
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
                "date": date,
                "global_batch_size": it.global_batch_size,
                "seq_length": cfg.get("seq_length"),
                "train_iters": it.total_iterations or cfg.get("train_iters"),
                "setup": setup,
            }
        )
    if ev.oom:
        rows.append({**(rows[-1] if rows else {}), "recompute": name, "oom": True, "run": path})
    if not rows:
        raise ValueError(f"{path}: no iteration lines with a step time or TFLOP/s")
    peaks: dict[int, dict[str, int]] = {}
    for m in ev.memory:
        mine = peaks.setdefault(m.rank or 0, {})
        for key, value in (
            ("reserved", m.max_reserved_bytes or m.reserved_bytes),
            ("allocated", m.max_allocated_bytes or m.allocated_bytes),
        ):
            if value is not None:
                mine[key] = max(mine.get(key, 0), value)
    for rank, peak in sorted(peaks.items()):  # rows without a speed: memory only
        rows.append(
            {
                **rows[0],
                "rank": rank,
                "reserved": peak.get("reserved"),
                "allocated": peak.get("allocated"),
                "tflops": None,
                "step": None,
                "loss": None,
                "iteration": None,
            }
        )
    return rows


def load_config(paths: list[str]):
    """The kit's Config of the run's config files (the shared reader, as the doctor reads
    them), or (None, why) when they give no model shape."""
    from recompute_kit.config import ConfigError
    from recompute_kit.sources.resolve import config_from_json, resolve

    try:
        cfg = config_from_json(resolve(paths, require_shape=False).to_json())
    except ConfigError as exc:
        return None, f"--config not read: {exc}"
    return cfg, None if cfg is not None else "--config gives no model shape: cost not predicted"


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
        stats = summarize_run(
            samples, warmup, run[0].get("profile_window"), higher_is_better=kind == "tflops"
        )
        if stats.get("median") is None:
            continue
        first = run[0]
        label = first["run"] if first["run"] is not None else f"run {n + 1}"
        if first["run"] is None and first["host"]:
            label = f"{label} on {first['host']}"
        fields = ("host", "date", "global_batch_size", "seq_length", "train_iters", "setup")
        extra = {f: first[f] for f in fields if first.get(f)}
        if len(samples) == 1 and any(r["profiler"] for r in run):
            extra["profiler"] = "on"  # a summary measured under the profiler: not droppable
        elif any(r["profiler"] is not None for r in run):
            extra["profiler"] = "off"  # (profiled iterations are dropped)
        out.append({"setting": name, "run": str(label), **stats, **extra})
    return out, ("tflops" if kind == "tflops" else "1/step_time")


def rank_peaks(group: list[dict]) -> dict[int, float]:
    """Each rank's peak: the largest reserved (else allocated) any of its rows recorded (a
    log's iteration rows record none, its memory rows do)."""
    out: dict[int, float] = {}
    for r in group:
        value = r["reserved"] or r["allocated"]
        if value is not None:
            out[r["rank"]] = max(out.get(r["rank"], value), value)
    return out


def fit_check(group: list[dict], usable: float | None, margin: float) -> tuple[bool | None, str]:
    """Whether a setting fits (its OOMs, else its peaks against the usable memory), and why."""
    known = rank_peaks(group)
    if any(r["oom"] for r in group):
        return False, f"OOM on rank(s) {sorted({r['rank'] for r in group if r['oom']})}"
    if usable is None:
        return None, "no --budget-gib: fit not judged"
    if not known:
        return None, "no peak memory recorded"
    over = {k: v for k, v in known.items() if v > usable}
    if not over:
        return True, ""
    worst = max(over, key=over.get)
    return False, (
        f"rank {worst} peaks at {over[worst] / GIB:.2f} GiB > {usable / GIB:.2f} GiB usable "
        f"({margin:.0%} margin)"
    )


def speed_kind(groups: dict[str, list[dict]], golden: str | None, given: float | None) -> str:
    """TFLOP/s when the golden recorded it (or one is given), step time when it recorded that;
    a golden with neither (it did not run): TFLOP/s when any setting recorded it."""
    golden_rows = groups.get(golden, []) if golden is not None else []
    if given or any(r["tflops"] is not None for r in golden_rows):
        return "tflops"
    if any(r["step"] is not None for r in golden_rows):
        return "step"
    rows = [r for g in groups.values() for r in g]
    return "tflops" if any(r["tflops"] is not None for r in rows) else "step"


def _band(name: str, stats: dict, unit: str) -> str:
    if stats.get("median") is None:
        return f"'{name}': no speed recorded"
    if str(stats.get("noise", "none")).startswith("none"):
        return f"'{name}' {stats['median']:.4g} {unit} (one value: its noise is not measured)"
    band = f"{stats['low']:.4g}-{stats['high']:.4g}"
    return f"'{name}' {stats['median']:.4g} {unit} ({band}, {stats['noise']})"


def judge(rows: list[dict], args: argparse.Namespace) -> dict:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["recompute"], []).append(row)
    golden = args.golden if args.golden is not None else next(iter(groups), None)
    if golden is not None and golden not in groups and args.golden_tflops is None:
        raise ValueError(f"golden {golden!r} is not among the rows: {', '.join(groups)}")
    kind = speed_kind(groups, golden, args.golden_tflops)
    higher = kind == "tflops"
    unit = "TFLOP/s" if higher else "s"
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
    measured = judge_runs(all_runs, golden, higher, reference)
    kind_name = "tflops" if higher else "step_time_s"
    usable = args.budget_gib * GIB * (1 - args.margin) if args.budget_gib else None
    fits = {name: fit_check(group, usable, args.margin) for name, group in groups.items()}

    # A golden that does not fit cannot be the bar: the settings that fit are compared among
    # themselves, against the fastest of them
    baseline = None
    against = golden
    used = measured
    if golden in fits and fits[golden][0] is False:
        fitting = [
            n
            for n in groups
            if fits[n][0] is not False and measured["settings"].get(n, {}).get("median")
        ]
        baseline = {"recompute": golden, "feasible": False, "why": fits[golden][1]}
        if fitting:
            pick = max if higher else min
            against = pick(fitting, key=lambda n: measured["settings"][n]["median"])
            used = judge_runs([r for r in all_runs if r["setting"] in fitting], against, higher)
            baseline.update(compared_among=fitting, reference=against)
        else:
            baseline.update(compared_among=[], reference=None)
    # losses are compared where both runs recorded the same rank and iteration
    golden_loss = {
        (r["rank"], r["iteration"]): r["loss"]
        for r in groups.get(golden, [])
        if r["loss"] is not None
    }
    config, config_note = load_config(args.config) if args.config else (None, None)
    steps = step_medians(groups, args.warmup) if config is not None else {}
    verified = load_verify(args.verify) if args.verify else {}

    out = []
    for name, group in groups.items():
        reasons: list[str] = []
        checks: dict[str, bool | None] = {}
        reserved = [r["reserved"] for r in group if r["reserved"] is not None]
        allocated = [r["allocated"] for r in group if r["allocated"] is not None]
        known = rank_peaks(group)
        binding = max(known, key=known.get) if known else None
        checks["fits"], why_fit = fits[name]
        if why_fit:
            reasons.append(why_fit)
        with_reserved = {r["rank"] for r in group if r["reserved"] is not None}
        if checks["fits"] and with_reserved != set(known):
            reasons.append(
                "peak reserved not recorded on every rank: judged on allocated; "
                "record torch.cuda.max_memory_reserved()"
            )
        stats = used["settings"].get(name) or measured["settings"].get(name, {})
        comparison = stats.get("comparison") or {}
        if comparison and against != golden:
            comparison = {**comparison, "against": against}
        to_golden = (measured["settings"].get(name, {}).get("comparison") or {}).get("change")
        value = stats.get("median")
        vs = comparison.get("change")
        bar = "golden" if against == golden else f"'{against}'"
        verdict_of_speed = None
        if name == golden:
            checks["throughput"] = True
        elif name == against:
            checks["throughput"] = True
            reasons.append(
                f"the fastest of the settings that fit (golden '{golden}' does not: infeasible)"
            )
        elif against != golden and comparison.get("noise_measured") is False and vs is not None:
            # against a peer, not a golden's bar: a single value decides nothing
            checks["throughput"] = None
            reasons.append(f"{vs:+.1%} vs {bar}: {comparison['why']}")
        else:
            # the one judgement the doctor's measured rules make too (runstats.speed_verdict)
            verdict_of_speed = speed_verdict(comparison, args.threshold, bar)
            checks["throughput"] = verdict_of_speed["check"]
            if verdict_of_speed["state"] == "within_noise":
                verdict_of_speed["text"] += f": {used['rerun'] or RERUN}"
            if verdict_of_speed["state"] != "passes" or checks["throughput"] is None:
                reasons.append(verdict_of_speed["text"])
            elif "single values" in verdict_of_speed["text"]:
                reasons.append("judged on single values: the run-to-run noise is not measured")
        cost = None
        if config is not None and name != golden and golden is not None:
            cost = expected_cost(config, name, golden, steps, groups)
            if cost is not None:
                reasons.append(cost["text"])
        loss_keys = {(r["rank"], r["iteration"]): r["loss"] for r in group if r["loss"] is not None}
        common = loss_keys.keys() & golden_loss.keys()
        diffs = [
            abs(loss_keys[k] - golden_loss[k]) / max(abs(golden_loss[k]), 1e-12) for k in common
        ]
        rel = max(diffs) if diffs else None
        if name == golden:
            checks["loss"] = True if loss_keys or name in verified else None
        elif rel is None and name in verified:
            checks["loss"] = verified[name]
            if not verified[name]:
                reasons.append("recompute-kit verify: loss/grads differ from no recompute")
        elif rel is None and loss_keys and golden_loss:
            # losses at different iterations say nothing about recompute: not compared
            checks["loss"] = None
            reasons.append(
                f"loss not compared: no iteration in common with golden (golden "
                f"{_iterations(golden_loss)}, this run {_iterations(loss_keys)})"
            )
        elif rel is None:
            checks["loss"] = None
            reasons.append("loss not recorded for this run and golden: unchecked")
        else:
            checks["loss"] = rel <= args.loss_rtol
            if not checks["loss"]:
                reasons.append(
                    f"loss differs from golden by {rel:.2%} > {args.loss_rtol:.2%} "
                    f"(at {len(common)} iteration(s) both recorded)"
                )
        if name == golden and checks["loss"] is None:
            reasons.append("golden has no loss recorded")
        if any(v is False for v in checks.values()):
            verdict = "fail"
        elif all(v is True for v in checks.values()):
            verdict = "success"
        else:
            verdict = "incomplete"
        tflops = [r["tflops"] for r in group if r["tflops"] is not None and not r["oom"]]
        out.append(
            {
                "recompute": name,
                "golden": name == golden,
                "ranks": sorted({r["rank"] for r in group}),
                "binding_rank": binding,
                "max_peak_reserved_gib": round(max(reserved) / GIB, 3) if reserved else None,
                "max_peak_allocated_gib": round(max(allocated) / GIB, 3) if allocated else None,
                "tflops": value if higher else (statistics.median(tflops) if tflops else None),
                "speed": {
                    **{k: v for k, v in stats.items() if k != "comparison"},
                    "kind": kind_name,
                    "unit": unit,
                    "better": "higher" if higher else "lower",
                    "comparison": comparison or None,
                    "runs_detail": [r for r in all_runs if r["setting"] == name],
                },
                "vs_golden_pct": None if to_golden is None else round(100 * to_golden, 2),
                "loss_rel_diff": rel,
                "checks": checks,
                "speed_verdict": verdict_of_speed,
                "expected_cost": cost,
                "verdict": verdict,
                "reasons": reasons,
            }
        )
    recommended, recommendation = recommend(out, used, golden, baseline, higher, unit)
    if baseline is not None:
        among = [_band(n, used["settings"].get(n, {}), unit) for n in baseline["compared_among"]]
        baseline["note"] = f"golden '{golden}' does not fit ({baseline['why']}): infeasible; " + (
            f"compared among the settings that fit, against the fastest: {'; '.join(among)}"
            if among
            else "no setting that fits recorded a speed"
        )
    return {
        "ok": True,
        "budget_gib": args.budget_gib,
        "usable_gib": None if usable is None else round(usable / GIB, 3),
        "golden": golden,
        "threshold": args.threshold,
        "candidates": out,
        "recommended": recommended,
        "recommendation": recommendation,
        "baseline": baseline,
        "outliers": measured["outliers"],
        "confounders": measured["confounders"],
        "dropped_runs": dropped_runs,
        "rerun": used["rerun"] if baseline is not None else measured["rerun"],
        "speed_kind": kind_name if groups else None,
        "speed_unit": unit if groups else None,
        "config_note": config_note,
    }


def _iterations(losses: dict) -> str:
    its = sorted(k[1] for k in losses if k[1] is not None)
    return f"{its[0]}-{its[-1]}" if its else "a summary value"


def step_medians(groups: dict[str, list[dict]], warmup: int | None) -> dict:
    """Each setting's step time (median of its runs' medians, warm-up dropped) and TFLOP/s:
    what the measured slowdown is read from."""
    out = {}
    for name, group in groups.items():
        steps, _ = speed(name, group, warmup, "step")
        meds = [r["median"] for r in steps if r.get("profiler") != "on"]
        has_tflops = any(r["tflops"] is not None for r in group)
        rates, _ = speed(name, group, warmup, "tflops") if has_tflops else ([], "")
        tflops = [r["median"] for r in rates if r.get("profiler") != "on"]
        out[name] = {
            "step": statistics.median(meds) if meds else None,
            "tflops": statistics.median(tflops) if tflops else None,
        }
    return out


def expected_cost(config, arm: str, base: str, steps: dict, groups: dict) -> dict | None:
    """The measured slowdown of `arm` over `base` beside what its recompute FLOPs predict
    (recompute_kit/plan/measured_cost.py)."""
    from recompute_kit.plan.measured_cost import explain_slowdown, measured_time_change

    a, b = steps.get(arm, {}), steps.get(base, {})
    tflops = any(r["tflops"] is not None for r in groups.get(base, []))
    change, read_from = measured_time_change(
        b.get("step"), a.get("step"), b.get("tflops") if tflops else None, a.get("tflops")
    )
    return explain_slowdown(config, arm, base, change, read_from)


def recommend(
    out: list[dict],
    measured: dict,
    golden: str | None,
    baseline: dict | None,
    higher: bool,
    unit: str,
) -> tuple[str | None, dict | None]:
    """The recommended setting (it passes the contract) and the recommendation: decided only
    when it is faster than the other passing settings beyond the noise. With an infeasible
    golden, the fastest setting that fits is named even while a check is still open, saying
    which."""
    winners = [c for c in out if c["verdict"] == "success"]
    if baseline is not None and baseline.get("reference"):
        winners = [
            c
            for c in out
            if c["recompute"] in baseline["compared_among"]
            # the throughput check is against the fastest of them: ranked, not a veto
            and c["checks"]["fits"] is not False
            and c["checks"]["loss"] is not False
        ]
    if not winners:
        return None, None
    settings = measured["settings"]

    def pace(c: dict) -> float:
        med = settings.get(c["recompute"], {}).get("median")
        if med is None:
            return float("-inf")
        return med if higher else -med

    if baseline is None:
        best = max(winners, key=lambda c: c["vs_golden_pct"] or 0.0)
    else:
        best = max(winners, key=pace)
    ties = [
        c["recompute"]
        for c in winners
        if c is not best
        and not compare(
            settings.get(c["recompute"], {}), settings.get(best["recompute"], {}), higher
        )["decided"]
    ]
    open_checks = [k for k, v in best["checks"].items() if v is None]
    if ties:
        why = (
            f"'{best['recompute']}' is not faster than {', '.join(map(repr, ties))} beyond "
            f"the noise: all pass the contract; {RERUN} to choose on speed"
        )
    else:
        why = f"'{best['recompute']}' passes the contract"
    if baseline is not None:
        others = [c["recompute"] for c in winners if c is not best]
        lead = f"golden '{golden}' does not fit ({baseline['why']}): infeasible; "
        if not others:
            why = lead + f"'{best['recompute']}' is the only setting that fits and passes"
        elif ties:
            why = (
                lead + f"among the settings that fit, '{best['recompute']}' is the fastest but "
                f"within noise of {', '.join(map(repr, ties))}: {RERUN}"
            )
        else:
            why = lead + f"'{best['recompute']}' is the fastest setting that fits, beyond the noise"
        why += f" ({_band(best['recompute'], settings.get(best['recompute'], {}), unit)})"
        if open_checks:
            why += f"; still unchecked: {', '.join(open_checks)}"
            if "loss" in open_checks:
                why += " (run `recompute-kit verify` and pass --verify FILE)"
    recommendation = {
        "recompute": best["recompute"],
        "decided": not ties,
        "within_noise_of": ties,
        "passes_contract": best["verdict"] == "success",
        "why": why,
    }
    return (best["recompute"] if best["verdict"] == "success" else None), recommendation


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
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="the run's config (launch script, YAML; repeatable): the model shape with which "
        "a measured slowdown is set against the FLOPs its recompute setting adds",
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
        rows, notes = read_table(load_rows(args.file)) if args.file else ([], [])
        for spec in args.log:
            rows += load_log(spec)
        if not rows:
            raise ValueError("no rows")
        doc = judge(rows, args)
        doc["input_notes"] = notes
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        json.dump({"ok": False, "error": f"{args.file or 'judge'}: {exc}"}, sys.stdout)
        sys.stdout.write("\n")
        return 1
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
