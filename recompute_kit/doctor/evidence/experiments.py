"""Experiment tables (ablation results) as JSONL, CSV or Markdown."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from ...config import ConfigError, format_spec, parse_spec
from ...runcolumns import classify, is_on
from .text import _NUMBER_RE, _float, _int, parse_size

# --------------------------------------------------------------------------------------------
# Experiments (ablation results)
# --------------------------------------------------------------------------------------------

EXPERIMENT_KEYS = (
    "name",
    "recompute_modules",
    "recompute",
    "tflops_per_gpu",
    "vs_golden",
    "peak_memory_bytes",
    "oom",
    "oom_rank",
    "result",
)
# Columns of repeated runs and per-iteration tables (aggregated by `_aggregate_runs`)
_RUN_KEYS = (
    "run",
    "iteration",
    "step_time_ms",
    "host",
    "date",
    "profiler",
    "global_batch_size",
    "seq_length",
)
_OOM_MARK_RE = re.compile(r"\bOOM\b(?:[^)\]|]*?\brank\s*(\d+))?", re.I)
_MEM_UNIT_RE = re.compile(r"(?<![a-z])(gib|gb|mib|mb|kib|kb|bytes|b)(?![a-z])")


def _experiment_column(header: str) -> tuple[str, str | None]:
    """The normalised key for a column header, and the unit of a memory column."""
    h = " ".join(header.replace("_", " ").strip().lower().split())
    col = classify(header)  # the names users log (runcolumns.py): flags and unit suffixes
    if col is not None and col.key == "checkpointing":
        return "recompute", None  # gradient_checkpointing true/false: full / none
    if col is not None and col.key == "step":  # (Megatron CI's "iteration-time": no unit)
        return "step_time_ms", "ms" if col.scale == 1e-3 else "s" if col.scale == 1.0 else "?"
    if h in (
        "experiment",
        "exp",
        "name",
        "run",
        "config",
        "configuration",
        "setting",
        "id",
        "arm",
        "variant",
    ):
        return "name", None
    if h in ("recompute modules", "modules"):
        return "recompute_modules", None
    if h in ("recompute", "spec", "recompute spec"):
        return "recompute", None
    if h in ("granularity", "recompute granularity"):
        return "recompute_granularity", None
    if h in ("method", "recompute method"):
        return "recompute_method", None
    if h in ("num layers", "recompute num layers"):
        return "recompute_num_layers", None
    if h in ("run id", "repeat", "trial", "seed", "run no", "run #"):
        return "run", None
    if re.search(r"\b(?:step|iter(?:ation)?) ?time\b|time per iter|elapsed time", h):
        unit = re.search(r"\((ms|s|sec)\)|\b(ms|s|sec)$", h)
        return "step_time_ms", (unit.group(1) or unit.group(2)) if unit else "?"
    if h in ("iteration", "iter", "step", "global step"):
        return "iteration", None
    if h in ("host", "hostname", "node", "nodes", "node list"):
        return "host", None
    if h in ("date", "day", "started"):
        return "date", None
    if h in ("profiler", "profiling", "profiled", "profile"):
        return "profiler", None
    if h in ("global batch size", "gbs"):
        return "global_batch_size", None
    if h in ("seq length", "seq len", "sequence length"):
        return "seq_length", None
    if "tflop" in h or h in ("throughput", "tflops per gpu"):
        return "tflops_per_gpu", None
    if "golden" in h or h.startswith("vs ") or h in ("vs baseline", "delta"):
        return "vs_golden", None
    memory_words = re.search(r"\b(?:mem|memory|allocated|reserved)\b", h)
    if "peak" in h or (memory_words and _MEM_UNIT_RE.search(h)):
        unit = _MEM_UNIT_RE.search(h)
        return "peak_memory_bytes", unit.group(1) if unit else None
    if h in ("result", "status", "outcome", "verdict"):
        return "result", None
    if h == "oom":
        return "oom", None
    if h == "oom rank":
        return "oom_rank", None
    return header.strip(), None


def _modules_value(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [str(v).strip().strip("'\"") for v in value if str(v).strip()]
    s = str(value).strip()
    if s.lower() in ("", "-", "none", "null", "n/a", "—"):
        return None
    return [v.strip("'\" ") for v in re.split(r"[\s,]+", s.strip("[]() ")) if v.strip("'\" ")]


def _fraction(value: Any) -> float | None:
    """`-16.4%` -> -0.164; a number without % is taken as a fraction already."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    s = str(value)
    m = _NUMBER_RE.search(s)
    if m is None:
        return None
    try:
        number = Decimal(m.group(0))
    except InvalidOperation:
        return None
    return float(number / 100) if "%" in s else float(number)


def _milliseconds(value: Any, unit: str | None) -> float | None:
    """A step time in ms: the cell's own unit ("42.21 s", "744 ms"), else the column's; a
    column without one ("Step time") holds ms from 50 up (Megatron prints ms), else seconds."""
    if isinstance(value, str):
        own = re.search(r"\d\s*(ms|s|sec|secs|seconds?)\s*$", value.strip(), re.I)
        number = _float(value)
        if own is not None:
            unit = "ms" if own.group(1).lower() == "ms" else "s"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        return None
    if number is None:
        return None
    if unit in (None, "?"):
        unit = "ms" if number >= 50 else "s"
    return number if unit == "ms" else number * 1000.0


def _normalise_experiment(row: dict[str, Any], units: dict[str, str | None]) -> dict[str, Any]:
    """Normalise one result row in place (keys from `_experiment_column`)."""
    out = {key: None for key in EXPERIMENT_KEYS}
    out["oom"] = False
    out.update(row)
    oom = False
    oom_rank = None
    for key in ("peak_memory_bytes", "result", "status"):
        value = row.get(key)
        if isinstance(value, str):
            m = _OOM_MARK_RE.search(value)
            if m is not None:
                oom = True
                if m.group(1) is not None:
                    oom_rank = int(m.group(1))
    peak = row.get("peak_memory_bytes")
    if isinstance(peak, str):
        own_unit = parse_size(peak)
        out["peak_memory_bytes"] = (
            own_unit if own_unit is not None else parse_size(peak, units.get("peak_memory_bytes"))
        )
    elif isinstance(peak, (int, float)) and not isinstance(peak, bool):
        scale = parse_size("1", units.get("peak_memory_bytes")) or 1
        out["peak_memory_bytes"] = round(peak * scale)
    tflops = row.get("tflops_per_gpu")
    out["tflops_per_gpu"] = _float(tflops) if isinstance(tflops, str) else tflops
    if "step_time_ms" in row:
        out["step_time_ms"] = _milliseconds(row["step_time_ms"], units.get("step_time_ms"))
    if "iteration" in row:
        it = row["iteration"]
        out["iteration"] = _int(str(it)) if not isinstance(it, int) else it
    if "profiler" in row:
        out["profiler"] = str(row["profiler"]).strip().lower() in ("1", "true", "yes", "on", "y")
    out["vs_golden"] = _fraction(row.get("vs_golden"))
    status = row.get("status")
    result = row.get("result", status)
    if isinstance(result, str):
        text = result.strip()
        out["result"] = "OOM" if text.lower() == "oom" else "OK" if text.lower() == "ok" else text
    explicit = row.get("oom")
    if isinstance(explicit, bool):
        oom = oom or explicit
    elif isinstance(explicit, str):
        oom = oom or explicit.strip().lower() in ("true", "yes", "1", "oom")
    out["oom"] = oom
    if row.get("oom_rank") is not None:
        out["oom_rank"] = _int(str(row["oom_rank"]))
    elif oom_rank is not None:
        out["oom_rank"] = oom_rank
    if "recompute_modules" in row:
        out["recompute_modules"] = _modules_value(row["recompute_modules"])
    out["recompute"] = _experiment_spec(out)
    if out["recompute_modules"] is None and isinstance(out["recompute"], str):
        try:
            rc = parse_spec(out["recompute"])
        except ConfigError:
            rc = None
        if rc is not None and rc.recompute_granularity == "selective":
            out["recompute_modules"] = list(rc.modules)
    if out["name"] is None and out["recompute"]:
        out["name"] = out["recompute"]
    return out


def _experiment_spec(row: dict[str, Any]) -> str | None:
    """The recompute spec string of a row: given, or derived from granularity/modules."""
    given = row.get("recompute")
    flag = is_on(given) if given is not None and str(given).strip().lower() != "none" else None
    if flag is not None:  # a checkpointing flag: on is full recompute of every layer
        return "full" if flag else "none"
    if isinstance(given, str) and given.strip():
        try:
            return format_spec(parse_spec(given.strip()))  # "selective:core_attn" -> "selective"
        except ConfigError:
            return given.strip()
    granularity = str(row.get("recompute_granularity") or "").strip().lower()
    if granularity == "full":
        method, layers = row.get("recompute_method"), _int(str(row.get("recompute_num_layers")))
        if method and layers:
            return f"full:{str(method).strip()}:{layers}"
        return None
    if granularity in ("none", "null"):
        return "none"
    modules = row.get("recompute_modules")
    if modules is None:
        return "selective" if granularity == "selective" else None
    spec = "selective:" + ",".join(modules)
    try:
        return format_spec(parse_spec(spec))
    except ConfigError:
        return spec


def _experiments_from_rows(header: list[str], rows: Iterable[list[str]]) -> list[dict[str, Any]]:
    columns = [_experiment_column(h) for h in header]
    names = [k for k, _ in columns if k in ("name", "recompute", "recompute_modules")]
    if len(names) > 1 and "run" in [h.strip().lower() for h in header]:
        # "run" beside a name or spec column numbers the repeats
        columns = [
            ("run", None) if h.strip().lower() == "run" else c
            for h, c in zip(header, columns, strict=True)
        ]
    keys = {key for key, _ in columns}
    metrics = {"tflops_per_gpu", "peak_memory_bytes", "vs_golden", "result", "oom", "step_time_ms"}
    if not keys & metrics or len(keys & {*metrics, "name", "recompute", "recompute_modules"}) < 2:
        return []  # not a results table (e.g. a module or symptom table)
    units = {key: unit for key, unit in columns if unit}
    out = []
    for cells in rows:
        row: dict[str, Any] = {}
        for (key, _), cell in zip(columns, cells, strict=False):
            value = cell.strip()
            if key and value:
                row[key] = value
        if any(k in row for k in keys & metrics):
            out.append(_normalise_experiment(row, units))
    if not keys & {"recompute", "recompute_modules", "recompute_granularity"}:
        _specs_from_names(out)
    return out


_NO_RECOMPUTE_RE = re.compile(r"\b(?:no|without|w/o)\s+(?:activation\s+)?recompute\b", re.I)
_FULL_RE = re.compile(
    r"\bfull(?:\s+recompute)?\s*[(:]\s*(uniform|block)\s*[,:]\s*(\d+)\s*\)?", re.I
)


def _specs_from_names(rows: list[dict[str, Any]]) -> None:
    """Recompute specs read from the names of a table without a recompute column ("no
    recompute", "full recompute (uniform, 1)"), and, without a vs-golden column, throughput
    relative to the run without recompute."""
    for row in rows:
        name = str(row.get("name") or "")
        if _NO_RECOMPUTE_RE.search(name):
            row["recompute"] = "none"
        elif (m := _FULL_RE.search(name)) is not None:
            row["recompute"] = f"full:{m.group(1).lower()}:{m.group(2)}"
    base = next((r for r in rows if r.get("recompute") == "none" and r.get("tflops_per_gpu")), None)
    if base is None or any(r.get("vs_golden") is not None for r in rows):
        return
    for row in rows:
        if isinstance(row.get("tflops_per_gpu"), (int, float)):
            row["vs_golden"] = round(row["tflops_per_gpu"] / base["tflops_per_gpu"] - 1, 4)


def _markdown_tables(text: str) -> list[dict[str, Any]]:
    lines = text.splitlines()
    out: list[dict[str, Any]] = []
    sep = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?\s*$")
    i = 0
    while i < len(lines) - 1:
        if "|" in lines[i] and sep.match(lines[i + 1]):
            header = _table_cells(lines[i])
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                rows.append(_table_cells(lines[j]))
                j += 1
            out.extend(_experiments_from_rows(header, rows))
            i = j
        else:
            i += 1
    return out


def _table_cells(line: str) -> list[str]:
    cells = line.rstrip().split("|")
    if cells and not cells[-1].strip():
        cells = cells[:-1]
    return cells


def _experiments_from_json(rows: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for raw in rows:
        if not isinstance(raw, dict):
            continue
        row: dict[str, Any] = {}
        units: dict[str, str | None] = {}
        for key, value in raw.items():
            norm, unit = _experiment_column(str(key))
            if (
                (norm in EXPERIMENT_KEYS or norm in _RUN_KEYS) and norm not in row
            ) or norm.startswith("recompute_"):
                row[norm] = value
                if unit:
                    units[norm] = unit
            row.setdefault(str(key), value)  # keep every key of the runner's rows
        if "status" in raw:
            row["status"] = raw["status"]
        out.append(_normalise_experiment(row, units))
    return out


def _aggregate_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repeated runs (a run column) and per-iteration rows (an iteration column) as one row
    per setting, judged with their noise (recompute_kit/runstats.py): warm-up and profiled
    iterations dropped, the setting's value the median of its runs' medians, `vs_golden` from
    it, and `measured`: the runs, the noise band, the comparison with the golden setting
    (`decided`, `why`), outliers, confounders and the re-run that would decide. Other tables
    are returned as they are."""
    if not any(r.get("iteration") is not None or r.get("run") is not None for r in rows):
        return rows
    from ...runstats import judge_runs, speed_verdict, split_runs, summarize_run

    by_setting: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_setting.setdefault(str(r.get("recompute") or r.get("name")), []).append(r)
    kind = "tflops_per_gpu" if any(r.get("tflops_per_gpu") for r in rows) else "step_time_ms"
    runs: list[dict[str, Any]] = []
    for setting, group in by_setting.items():
        for n, run in enumerate(split_runs(group), start=1):
            samples = [
                {
                    "value": r.get(kind),
                    "iteration": r.get("iteration"),
                    "profiler": r.get("profiler"),
                }
                for r in sorted(run, key=lambda r: r.get("iteration") or 0)
                if isinstance(r.get(kind), (int, float)) and not r.get("oom")
            ]
            stats = (
                summarize_run(samples, higher_is_better=kind == "tflops_per_gpu") if samples else {}
            )
            first = run[0]
            extra = {
                f: first[f]
                for f in ("host", "date", "global_batch_size", "seq_length")
                if first.get(f) not in (None, "")
            }
            if len(samples) == 1 and first.get("profiler"):
                extra["profiler"] = "on"
            elif any("profiler" in r for r in run):
                extra["profiler"] = "off"
            label = str(first["run"]) if first.get("run") is not None else f"run {n}"
            runs.append({"setting": setting, "run": label, **stats, **extra})
    # summaries measured under the profiler leave the comparison while other repeats remain
    profiled = {(r["setting"], r["run"]) for r in runs if r.get("profiler") == "on"}
    for key in list(profiled):
        if not any(
            r["setting"] == key[0] and (r["setting"], r["run"]) not in profiled for r in runs
        ):
            profiled.discard(key)
    compared = [r for r in runs if (r["setting"], r["run"]) not in profiled]
    names = list(by_setting)
    golden = next(
        (n for n in names if n == "none" or re.search(r"golden|baseline|no recompute", n, re.I)),
        names[0] if names else None,
    )
    measured = judge_runs(compared, golden, kind == "tflops_per_gpu")
    measured.update(
        golden=golden,
        metric=kind,
        dropped_runs=[
            {"setting": s, "run": r, "why": "measured with the profiler on"}
            for s, r in sorted(profiled)
        ],
    )
    out = []
    for setting, group in by_setting.items():
        stats = measured["settings"].get(setting, {})
        comparison = stats.get("comparison") or {}
        row = dict(group[0])
        for key in ("iteration", "run", "profiler", "host", "date"):  # per run: in `measured`
            row.pop(key, None)
        row[kind] = stats.get("median")
        peaks = [r["peak_memory_bytes"] for r in group if r.get("peak_memory_bytes")]
        row["peak_memory_bytes"] = max(peaks) if peaks else None
        row["oom"] = any(r.get("oom") for r in group)
        if comparison.get("change") is not None:  # (a per-run vs-golden column is one run's)
            row["vs_golden"] = round(comparison["change"], 4)
        # the judge's judgement (runstats.speed_verdict): a regression beyond the bar is one
        # even on single values; what it does not decide is "within noise" (or confounded)
        verdict = speed_verdict(comparison) if setting != golden else None
        row["speed_verdict"] = verdict
        row["within_noise"] = (
            setting != golden
            and not comparison.get("decided", False)
            and (verdict or {}).get("state") != "regression"
        )
        row["measured"] = {
            **{k: v for k, v in stats.items() if k != "comparison"},
            "comparison": comparison or None,
            "runs_detail": [r for r in runs if r["setting"] == setting],
        }
        out.append(row)
    if out:
        out[0]["measured_summary"] = {
            k: measured[k]
            for k in ("golden", "metric", "outliers", "confounders", "rerun", "dropped_runs")
        }
    return out


def parse_experiments(text: str, name: str = "") -> list[dict[str, Any]]:
    """Ablation results as rows with normalised keys (`EXPERIMENT_KEYS`): name,
    recompute_modules, recompute (spec string), tflops_per_gpu, vs_golden (fraction),
    peak_memory_bytes, oom, oom_rank, result; other columns are kept under their own names.

    Reads JSONL (one object per line: recompute-kit's ablation output; every key is kept),
    a JSON list, CSV/TSV with a header, or Markdown tables (only tables with result columns).
    `~704` is 704.0, `58.8 (OOM rank0)` in a `(GB)` column is 58.8e9 bytes and an OOM on rank 0.
    Never raises; unreadable text gives []."""
    try:
        rows = _parse_experiments(text, name)
    except Exception:  # never raise on garbage
        return []
    try:
        return _aggregate_runs(rows)
    except Exception:  # rows that do not aggregate are kept as they are
        return rows


def _parse_experiments(text: str, name: str) -> list[dict[str, Any]]:
    if not isinstance(text, str) or not text.strip():
        return []
    stripped = text.strip()
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict):
            data = next((data[k] for k in ("rows", "experiments", "results") if k in data), [data])
        if isinstance(data, list):
            return _experiments_from_json(data)
    objects = []
    for line in stripped.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                objects.append(json.loads(line))
            except ValueError:
                continue
    if objects:
        return _experiments_from_json(objects)
    rows = _markdown_tables(text)
    if rows or "|" in stripped.splitlines()[0] or name.endswith(".md"):
        return rows
    first = stripped.splitlines()[0]
    delimiter = "\t" if "\t" in first else ";" if ";" in first and "," not in first else ","
    if delimiter not in first:
        return []
    table = list(csv.reader(io.StringIO(stripped), delimiter=delimiter))
    return _experiments_from_rows(table[0], table[1:]) if table else []
