"""Statistics of measured runs: is the difference between two settings larger than the noise?

Standard library only (the skill's judge.py imports it without torch). Used by
`skill/scripts/judge.py` and by the doctor's experiment reader (doctor/evidence/experiments.py).

The model: a *setting* (a recompute spec) is measured by one or more *runs* (repeats); a run is
a series of per-iteration values (step time in ms, or a throughput) or, when only a summary was
kept, one value. For each run:

* warm-up is dropped: the first `warmup` iterations when given, else, read from the data, the
  leading iterations slower than the run's steady state (median of its second half) by more
  than K_MAD robust sigmas (1.4826 x MAD) and SETTLE (compilation, allocator growth,
  data-loader start), at most half of the run;
* profiler windows are dropped: iterations flagged by a profiler column, or inside a window
  (`--profile-step-start`..`--profile-step-end` of Megatron's arguments); so is a stretch of
  two or more steps 1.5x slower than the run's median that no column explains (a profiler, a
  checkpoint save or an evaluation), said as such;
* what is left gives the run's median and IQR.

Settings are compared with their spread: the range of their repeats' medians (between-run
noise) or, for a single run, its IQR (within-run noise; a single run cannot show node-to-node
variation, and says so). A difference is *decided* only when the two settings' noise bands do
not overlap and the difference is at least `MIN_EFFECT`; a run whose median lies far from its
setting's other repeats, or whose spread (IQR) is NOISY times theirs, is an *outlier* (shown,
and left out of the comparison when at least two repeats remain); runs that differ in
host/node, date, profiler, batch/sequence, planned length (train_iters) or any printed argument
other than the recompute setting (`setup`) are *confounders* (shown; when they line up with the
settings the comparison is not decided).

`speed_verdict` is the one judgement of a setting's speed against its bar: the judge's
throughput check and the doctor's measured rules (RK033, RK237, RK238) both call it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

K_MAD = 3.0  # warm-up: leading values more than 3 robust sigmas slower than the steady median
SIGMA_PER_MAD = 1.4826  # MAD x this is the standard deviation of normal noise
SETTLE = 0.02  # ... and at least 2% slower (a run with almost no spread)
MAX_WARMUP = 0.5  # warm-up is at most half of a run
MIN_EFFECT = 0.01  # differences under 1% are never called, whatever the noise
OUTLIER = 0.10  # a repeat this far (relative) from the other repeats' median is an outlier
NOISY = 3.0  # a repeat whose IQR is this many times its repeats' is an outlier (a noisy run)
NOISY_FLOOR = 0.02  # ... when that IQR is also at least 2% of its median
CONFOUNDER_FIELDS = (
    "host",
    "node",
    "date",
    "profiler",
    "global_batch_size",
    "seq_length",
    "train_iters",  # a different planned run (Megatron's "iteration N/ TOTAL")
)
THRESHOLD = 0.10  # the contract's allowed throughput loss against the golden
SLOW_WINDOW = 1.5  # a stretch of steps this many times slower than the run's median ...
SLOW_WINDOW_MIN = 2  # ... this many in a row at least (one slow step is noise) ...
SLOW_WINDOW_MAX = 0.3  # ... and at most this share of the run is dropped as a window


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default) of non-empty `values`."""
    data = sorted(values)
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median_iqr(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, q1, q3)."""
    return statistics.median(values), quantile(values, 0.25), quantile(values, 0.75)


def warmup_length(
    values: Sequence[float], warmup: int | None = None, higher_is_better: bool | None = None
) -> tuple[int, str]:
    """How many leading values are warm-up, and why: read from the data, the leading values
    slower than the run's steady state (the median of its second half) by more than K_MAD
    robust sigmas (1.4826 x its MAD) and SETTLE, at most MAX_WARMUP of the run.
    `higher_is_better`: True for a throughput (slow is low), False for a step time (slow is
    high), None: either side."""
    if warmup is not None:
        n = max(0, min(warmup, len(values)))
        return n, f"the first {n} iteration(s) (--warmup)" if n else ""
    if len(values) < 4:
        return 0, ""
    tail = values[len(values) // 2 :]
    steady = statistics.median(tail)
    mad = statistics.median(abs(v - steady) for v in tail)
    band = max(K_MAD * SIGMA_PER_MAD * mad, SETTLE * abs(steady))

    def slow(v: float) -> bool:
        if higher_is_better is None:
            return abs(v - steady) > band
        return v < steady - band if higher_is_better else v > steady + band

    cap = int(len(values) * MAX_WARMUP)
    n = 0
    while n < cap and slow(values[n]):
        n += 1
    if not n:
        return 0, ""
    side = "off" if higher_is_better is None else "below" if higher_is_better else "above"
    capped = f" (capped at {MAX_WARMUP:.0%} of the run)" if n == cap else ""
    return n, (
        f"the first {n} iteration(s){capped}: {side} the steady median {steady:.4g} by more "
        f"than {band:.3g} ({K_MAD:g} x 1.4826 x MAD of the run's second half, at least "
        f"{SETTLE:.0%})"
    )


def summarize_run(
    samples: Sequence[dict[str, Any]],
    warmup: int | None = None,
    profile_window: tuple[int, int] | None = None,
    higher_is_better: bool | None = None,
) -> dict[str, Any]:
    """One run's statistics from its samples: {"value", "iteration" (optional), "profiler"
    (optional: a flag)}, in iteration order. A single sample is a run summary: kept as is."""
    values = [s for s in samples if s.get("value") is not None]
    out: dict[str, Any] = {"iterations": len(values), "dropped": []}
    if len(values) > 1:
        n, why = warmup_length([s["value"] for s in values], warmup, higher_is_better)
        if n:
            out["dropped"].append({"what": "warm-up", "count": n, "why": why})
        values = values[n:]
        lo, hi = profile_window or (None, None)

        def profiled(s: dict[str, Any]) -> bool:
            it = s.get("iteration")
            window = lo is not None and it is not None and lo <= it <= hi  # type: ignore[operator]
            return bool(s.get("profiler")) or window

        flagged = [s for s in values if profiled(s)]
        if flagged:
            why = (
                f"iterations {lo}-{hi}: the profiler window"
                if profile_window
                else "iterations flagged by the profiler column"
            )
            out["dropped"].append({"what": "profiler", "count": len(flagged), "why": why})
            values = [s for s in values if not profiled(s)]
        window = slow_window(values, higher_is_better)
        if window:
            first, last, ratio = window
            stretch = values[first : last + 1]
            its = [s.get("iteration") for s in stretch]
            named = f"iterations {its[0]}-{its[-1]}" if None not in its else "a stretch"
            why = (
                f"{named}: {ratio:.1f}x the run's median in a row (a profiler, a checkpoint "
                "save or an evaluation? not said by the data)"
            )
            out["dropped"].append({"what": "slow window", "count": len(stretch), "why": why})
            values = values[:first] + values[last + 1 :]
    kept = [s["value"] for s in values]
    out["kept"] = len(kept)
    if kept:
        med, q1, q3 = median_iqr(kept)
        out.update(median=med, q1=q1, q3=q3, iqr=q3 - q1)
    return out


def slow_window(
    samples: Sequence[dict[str, Any]], higher_is_better: bool | None = None
) -> tuple[int, int, float] | None:
    """The longest stretch of SLOW_WINDOW_MIN or more consecutive iterations, at most
    SLOW_WINDOW_MAX of the run, each SLOW_WINDOW times slower than the run's median (a
    profiler, a checkpoint save or an evaluation inside the timed steps): (first, last index,
    the stretch's median over the run's), or None. A single slow step is noise the median
    already ignores."""
    values = [s["value"] for s in samples]
    if len(values) < 2 * SLOW_WINDOW_MIN + 2:
        return None
    med = statistics.median(values)
    if not med:
        return None
    best: tuple[int, int] | None = None
    start = None
    for i, v in enumerate([*values, None]):
        if v is not None and _slowness(v, med, higher_is_better) >= SLOW_WINDOW:
            start = i if start is None else start
            continue
        if start is not None and (best is None or i - start > best[1] - best[0] + 1):
            best = (start, i - 1)
        start = None
    if best is None:
        return None
    n = best[1] - best[0] + 1
    if n < SLOW_WINDOW_MIN or n > SLOW_WINDOW_MAX * len(values):
        return None
    stretch = statistics.median(values[best[0] : best[1] + 1])
    return best[0], best[1], _slowness(stretch, med, higher_is_better)


def _slowness(value: float, reference: float, higher_is_better: bool | None) -> float:
    """How many times slower `value` is than `reference`: a step time's ratio, a throughput's
    inverse, the larger of the two where the direction is not known."""
    up, down = value / reference, (reference / value if value else float("inf"))
    if higher_is_better is None:
        return max(up, down)
    return down if higher_is_better else up


def split_runs(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One setting's rows as runs: by their `run` value; else per-iteration rows (an
    `iteration` value) start a new run where the iteration number goes back, per rank, host and
    date; else summary rows of one rank are repeats (rows of different ranks are one run)."""
    runs: dict[Any, list[dict[str, Any]]] = {}
    counters: dict[Any, int] = {}
    last: dict[Any, int] = {}
    for r in rows:
        if r.get("run") is not None:
            key: Any = ("run", str(r["run"]))
        elif r.get("iteration") is not None:
            where = (r.get("rank"), r.get("host"), r.get("date"))
            if where in last and r["iteration"] <= last[where]:
                counters[where] = counters.get(where, 0) + 1
            last[where] = r["iteration"]
            key = ("it", r.get("host"), r.get("date"), counters.get(where, 0))
        else:
            n = counters.get(("summary", r.get("rank")), 0)
            counters[("summary", r.get("rank"))] = n + 1
            key = ("summary", n)
        runs.setdefault(key, []).append(r)
    return list(runs.values())


def _describe(field: str, by_setting: dict[str, set]) -> str:
    parts = [f"{name}: {', '.join(sorted(map(str, vals)))}" for name, vals in by_setting.items()]
    return f"{field} differs ({'; '.join(parts)})"


def confounders(
    runs: Iterable[dict[str, Any]], higher_is_better: bool = False
) -> list[dict[str, Any]]:
    """Fields (host, node, date, profiler, batch, sequence, train_iters, and the keys of a
    run's `setup`: the arguments it printed, its recompute keys left out) that differ between
    the runs compared; `aligned`: every setting saw one value and the settings' values differ,
    so the field and the setting cannot be told apart."""
    runs = list(runs)
    out = []
    setup_keys = dict.fromkeys(k for r in runs for k in r.get("setup") or {})
    for field in (*CONFOUNDER_FIELDS, *setup_keys):
        by_setting: dict[str, set] = {}
        for r in runs:
            value = (
                r.get(field) if field in CONFOUNDER_FIELDS else (r.get("setup") or {}).get(field)
            )
            if value not in (None, ""):
                by_setting.setdefault(r["setting"], set()).add(str(value))
        seen = set().union(*by_setting.values()) if by_setting else set()
        if len(seen) < 2:
            continue
        aligned = all(len(v) == 1 for v in by_setting.values()) and len(by_setting) > 1
        entry = {
            "field": field,
            "values": {k: sorted(v) for k, v in by_setting.items()},
            "aligned": aligned,
            "note": _describe(field, by_setting),
        }
        slower = _slower_places(runs, field, higher_is_better) if field in ("host", "node") else []
        if slower:
            entry["slower"] = slower
            entry["note"] += "; " + "; ".join(s["why"] for s in slower)
        out.append(entry)
    return out


SLOWER_PLACE = 0.03  # a node this much slower than another for the same setting is named


def _slower_places(
    runs: Sequence[dict[str, Any]], field: str, higher_is_better: bool
) -> list[dict[str, Any]]:
    """Within one setting, a host / node whose runs are more than SLOWER_PLACE slower (by their
    medians) than another's and beyond those runs' own spread: named, so the node is seen as
    the cause (a repeat on it is no repeat of the setting)."""
    out = []
    by_setting: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        if r.get("median") is not None and r.get(field) not in (None, ""):
            by_setting.setdefault(r["setting"], {}).setdefault(str(r[field]), []).append(r)
    for setting, places in by_setting.items():
        if len(places) < 2:
            continue
        medians = {p: statistics.median(r["median"] for r in rs) for p, rs in places.items()}
        lower = not higher_is_better  # a step time: lower is better
        best = (min if lower else max)(medians, key=medians.get)
        noise = max((r.get("iqr") or 0.0) for rs in places.values() for r in rs)
        for place, med in medians.items():
            if place == best or not medians[best]:
                continue
            off = med / medians[best] - 1 if lower else medians[best] / med - 1
            if off > SLOWER_PLACE and abs(med - medians[best]) > noise:
                out.append(
                    {
                        "setting": setting,
                        field: place,
                        "against": best,
                        "slower_by": off,
                        "why": f"{place} is {off:.1%} slower than {best} for {setting}",
                    }
                )
    return out


def outliers(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeats of one setting (on one node) that are off: a median more than OUTLIER (relative)
    from the median of the other repeats' (needs three or more to say which is off), or a spread
    (IQR) more than NOISY times the other repeats' and at least NOISY_FLOOR of its median (a
    noisy run: two repeats suffice, the spread says which)."""
    out = []
    by_setting: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("median") is not None:
            # repeats on another node are a confounder, not an outlier: compared per node
            where = str(r.get("host") or r.get("node") or "")
            by_setting.setdefault((r["setting"], where), []).append(r)
    for (setting, _), group in by_setting.items():
        for r in group:
            others = [o for o in group if o is not r]
            if not others:
                continue
            med = statistics.median(o["median"] for o in others)
            entry = {
                "setting": setting,
                "run": r.get("run"),
                "median": r["median"],
                "others_median": med,
                "off_by": r["median"] / med - 1 if med else None,
            }
            if len(group) >= 3 and med and abs(r["median"] / med - 1) > OUTLIER:
                entry["why"] = f"its median is {r['median'] / med - 1:+.1%} from its repeats'"
                out.append(entry)
                continue
            spreads = [o["iqr"] for o in others if o.get("kept", 0) >= 4 and "iqr" in o]
            if r.get("kept", 0) < 4 or "iqr" not in r or not spreads:
                continue
            typical = statistics.median(spreads)
            if r["iqr"] > NOISY * typical and r["iqr"] >= NOISY_FLOOR * abs(r["median"]):
                ratio = f"{r['iqr'] / typical:.1f}x" if typical else "far above"
                entry.update(
                    iqr=r["iqr"],
                    others_iqr=typical,
                    why=(
                        f"noisy run: its IQR {r['iqr']:.4g} is {ratio} its repeats' "
                        f"{typical:.4g} (over {NOISY:g}x)"
                    ),
                )
                out.append(entry)
    return out


def setting_stats(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A setting's value (median of its repeats' medians) and noise band: the range of the
    repeats' medians, or one run's IQR."""
    meds = [r["median"] for r in runs if r.get("median") is not None]
    if not meds:
        return {"runs": len(runs), "median": None}
    out: dict[str, Any] = {"runs": len(meds), "median": statistics.median(meds)}
    if len(meds) > 1:
        out.update(low=min(meds), high=max(meds), noise="between repeats")
    else:
        one = next(r for r in runs if r.get("median") is not None)
        if one.get("kept", 1) > 1:
            out.update(low=one["q1"], high=one["q3"], noise="within one run (IQR)")
        else:
            out.update(low=meds[0], high=meds[0], noise="none: one summary value")
    return out


def compare(base: dict[str, Any], arm: dict[str, Any], higher_is_better: bool) -> dict[str, Any]:
    """The arm against the base: `change` (+: the arm is better), the band of changes the two
    settings' noise allows (`change_low`..`change_high`), `decided` (the band excludes no change
    and the change is at least MIN_EFFECT) and `why`."""
    if base.get("median") is None or arm.get("median") is None or not base["median"]:
        return {"change": None, "decided": False, "why": "no value to compare"}

    def rel(a: float, b: float) -> float:
        return a / b - 1 if higher_is_better else b / a - 1

    change = rel(arm["median"], base["median"])
    ends = [rel(arm["low"], base["high"]), rel(arm["high"], base["low"])]
    unknown = [s["noise"] for s in (base, arm) if s.get("noise", "").startswith("none")]
    out = {
        "change": change,
        "change_low": min(ends),
        "change_high": max(ends),
        "noise_measured": not unknown,
    }
    if abs(change) < MIN_EFFECT:
        return {**out, "decided": False, "why": f"{change:+.1%}: under {MIN_EFFECT:.0%}"}
    if unknown:
        why = f"{change:+.1%} from a single run's value: its run-to-run noise is not measured"
        return {**out, "decided": False, "why": why}
    single = [s["noise"] for s in (base, arm) if s.get("noise", "").startswith("within one")]
    if single and abs(change) < OUTLIER:
        # one run's IQR is not run-to-run noise: repeats of one setting differ by up to
        # OUTLIER before one is called an outlier, so a smaller change between two single
        # runs is not decided by them
        why = (
            f"{change:+.1%} between single runs: under {OUTLIER:.0%}, what repeats of one "
            "setting may differ by (run-to-run noise is not measured)"
        )
        return {**out, "decided": False, "why": why}
    if out["change_low"] <= 0 <= out["change_high"]:
        why = (
            f"{change:+.1%} is within noise: {arm['low']:.4g}-{arm['high']:.4g} "
            f"({arm['noise']}) overlaps {base['low']:.4g}-{base['high']:.4g} ({base['noise']})"
        )
        return {**out, "decided": False, "why": why}
    why = f"{change:+.1%}, beyond the noise ({arm['noise']}; {base['noise']})"
    return {**out, "decided": True, "why": why}


def _same_hosts(
    runs: Sequence[dict[str, Any]], golden: str | None, name: str
) -> tuple[list[str], list[dict[str, Any]]] | None:
    """When the golden and the arm ran on several nodes and share some, the runs on the shared
    nodes (a same-node comparison); None when there is nothing to restrict."""

    def host(r: dict[str, Any]) -> str:
        return str(r.get("host") or r.get("node") or "")

    mine = [r for r in runs if r["setting"] in (golden, name)]
    a = {host(r) for r in mine if r["setting"] == golden} - {""}
    b = {host(r) for r in mine if r["setting"] == name} - {""}
    shared = a & b
    if not shared or (a | b) == shared:
        return None
    return sorted(shared), [r for r in mine if host(r) in shared]


RERUN = (
    "re-run the settings interleaved (A B A B ..., at least 3 repeats each) on the same nodes, "
    "with the profiler off and the same global batch and sequence length, and compare "
    "per-iteration step times after warm-up"
)


def judge_runs(
    runs: Sequence[dict[str, Any]],
    golden: str | None,
    higher_is_better: bool,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Settings compared with the golden one. `runs`: dicts with "setting", "run" and a
    `summarize_run` result (plus confounder fields). Returns {"settings": {name: stats and
    the comparison}, "outliers", "confounders", "rerun" (None when every comparison is
    decided)}. `reference`: the golden's stats when it is a given number, not a run."""
    flagged = outliers(runs)
    off = {(o["setting"], o["run"]) for o in flagged}
    kept = [r for r in runs if (r["setting"], r.get("run")) not in off]
    # an outlier is left out only while two repeats of its setting remain
    for o in flagged:
        if sum(1 for r in kept if r["setting"] == o["setting"]) < 2:
            kept.extend(r for r in runs if (r["setting"], r.get("run")) == (o["setting"], o["run"]))
    found = confounders(kept, higher_is_better)
    aligned = [c for c in found if c["aligned"]]
    settings: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["setting"] for r in runs):
        settings[name] = setting_stats([r for r in kept if r["setting"] == name])
    base = reference if reference is not None else settings.get(golden)  # type: ignore[arg-type]
    undecided = False
    for name, stats in settings.items():
        if name == golden or base is None:
            continue
        verdict = compare(base, stats, higher_is_better)
        same = _same_hosts(kept, golden, name) if reference is None else None
        if same is not None:
            hosts, pair = same
            base_same = setting_stats([r for r in pair if r["setting"] == golden])
            arm_same = setting_stats([r for r in pair if r["setting"] == name])
            verdict = compare(base_same, arm_same, higher_is_better)
            verdict["same_hosts"] = hosts
            verdict["why"] += f" (runs on the node(s) both ran on: {', '.join(hosts)})"
        verdict["confounded"] = False
        mine = [c for c in aligned if {name, golden} <= set(c["values"])]
        if mine and verdict.get("change") is not None:
            verdict.update(
                decided=False,
                confounded=True,
                why=f"{verdict['why']}, but confounded: " + "; ".join(c["note"] for c in mine),
            )
        stats["comparison"] = verdict
        undecided = undecided or not verdict["decided"]
        if stats["runs"] < 2 or base["runs"] < 2:
            stats.setdefault("notes", []).append(
                "one run: node-to-node and run-to-run noise are not measured"
            )
    return {
        "settings": settings,
        "outliers": flagged,
        "confounders": found,
        "rerun": RERUN if undecided else None,
    }


def speed_verdict(
    comparison: dict[str, Any] | None, threshold: float = THRESHOLD, bar: str = "golden"
) -> dict[str, Any]:
    """The one judgement of a setting's speed against its bar (a `compare` / `judge_runs`
    comparison), for the judge's throughput check and the doctor's measured rules alike.
    `state`: "confounded" (the runs differ in more than the setting: nothing is decided),
    "regression" (the whole noise band, or with the noise unmeasured the single value, is
    below -threshold), "passes" (the band is at or above it), "within_noise" (the band
    straddles it) or "no_value"; `check`: True / False / None; `text`: why, in words."""
    c = comparison or {}
    vs = c.get("change")
    if vs is None:
        return {
            "state": "no_value",
            "check": None,
            "text": f"no TFLOP/s or step time to compare with {bar}",
        }
    if c.get("confounded"):
        return {"state": "confounded", "check": None, "text": f"throughput not judged: {c['why']}"}
    if c.get("noise_measured") is False or "change_low" not in c:
        ok = vs >= -threshold
        said = f"{vs:+.1%} vs {bar}" + ("" if ok else f", beyond -{threshold:.0%}: regression")
        return {
            "state": "passes" if ok else "regression",
            "check": ok,
            "text": f"{said}; judged on single values: the run-to-run noise is not measured",
        }
    low, high = c["change_low"], c["change_high"]
    band = f"{low:+.1%} to {high:+.1%} with the noise"
    if low >= -threshold:
        return {"state": "passes", "check": True, "text": f"{vs:+.1%} vs {bar} ({band})"}
    if high < -threshold:
        text = f"{vs:+.1%} vs {bar} ({band}), beyond -{threshold:.0%}: regression"
        return {"state": "regression", "check": False, "text": text}
    text = f"{vs:+.1%} vs {bar} is within noise of the -{threshold:.0%} threshold ({band})"
    return {"state": "within_noise", "check": None, "text": text}
