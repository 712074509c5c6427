"""Which column of a user's measurement table holds what, in which unit (standard library only).

Users log runs under their own column names: `step,time_ms,max_reserved_gib`,
`iteration,step_time_s,peak_reserved_gib`, Megatron's `elapsed time per iteration (ms)`, a
boolean `gradient_checkpointing` beside the run name. `read_columns` maps the headers of a
table (CSV/Markdown header, or the keys of JSON rows) to the judge's fields, takes each unit
from the header (`_ms`, `(s)`, `_gib`, `MiB`, `bytes`), and says aloud what it assumed and which
columns it did not use. Used by `skill/scripts/judge.py` and the doctor's experiment reader.

Fields: setting (the recompute spec or the run's name), checkpointing (a boolean
gradient/activation-checkpointing flag: on is `full`, off is `none`), run (repeat id),
iteration, step (seconds), tflops, reserved / allocated (bytes), loss, rank, status, oom, profiler,
host, date, global_batch_size, seq_length.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
# Binary units are powers of 1024, SI units powers of 1000 (as the doctor's parse_size)
MEMORY_UNITS = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 1e3,
    "kib": 2**10,
    "mb": 1e6,
    "mib": 2**20,
    "gb": 1e9,
    "gib": 2**30,
    "tb": 1e12,
    "tib": 2**40,
}
TIME_UNITS = {
    "us": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "millisecond": 1e-3,
    "milliseconds": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "mins": 60.0,
    "minutes": 60.0,
}
# the setting column, best first (an ablation row's "name" is its model: "recompute" wins)
SETTING_NAMES = (
    "recompute",
    "spec",
    "recompute spec",
    "setting",
    "name",
    "experiment",
    "variant",
    "arm",
    "config",
)
RUN_NAMES = ("run", "run id", "run name", "repeat", "trial", "seed", "run no")
ITERATION_NAMES = (
    "iteration",
    "iter",
    "step",
    "global step",
    "train step",
    "it",
    "iteration number",
    "step number",
)
# time columns that are not one iteration's step time
_NOT_STEP_TIME = {
    "interval",
    "std",
    "stdev",
    "total",
    "wall",
    "timestamp",
    "data",
    "estimated",
    "forward",
    "backward",
    "optimizer",
    "save",
    "load",
    "checkpoint",
    "eval",
}
# "checkpoint ..." columns that are not a checkpointing on/off flag
_NOT_A_FLAG = {"path", "dir", "interval", "save", "load", "every", "size", "time", "memory", "mem"}
_NOT_PEAK = {"estimated", "estimate", "budget", "free", "total", "capacity", "limit", "fraction"}
ON = ("1", "true", "yes", "on", "y", "t", "enabled")
OFF = ("0", "false", "no", "off", "n", "f", "disabled", "none")


@dataclass(frozen=True)
class Column:
    header: str  # as written
    key: str  # the field it holds
    scale: float | None = None  # to seconds / bytes; None where the header gives no unit
    unit: str | None = None  # the unit read from the header
    priority: int = 0  # lower wins when several columns hold one field


@dataclass
class ColumnMap:
    columns: dict[str, Column] = field(default_factory=dict)  # field -> column used
    unused: list[str] = field(default_factory=list)  # headers not used
    notes: list[str] = field(default_factory=list)  # assumptions, said aloud

    def raw(self, row: dict, key: str) -> Any:
        col = self.columns.get(key)
        if col is None:
            return None
        value = row.get(col.header)
        return None if value in (None, "", "-", "null", "None", "nan") else value

    def number(self, row: dict, key: str) -> float | None:
        value = self.raw(row, key)
        if isinstance(value, bool) or value is None:
            return None
        try:
            number = float(str(value).replace(",", "").strip())
        except (TypeError, ValueError):
            return None
        scale = self.columns[key].scale
        return number * scale if scale is not None else number


def tokens(header: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", str(header).lower())


def _unit(words: list[str], units: dict[str, float]) -> tuple[str | None, float | None]:
    for w in reversed(words):  # the unit closes the name: step_time_ms, (MiB)
        if w in units:
            return w, units[w]
    return None, None


def classify(header: str) -> Column | None:
    """The field a column header names, with its unit; None for a column the judge does not
    read."""
    words = tokens(header)
    name = " ".join(words)
    if not words:
        return None
    if name in SETTING_NAMES:
        return Column(header, "setting", priority=SETTING_NAMES.index(name))
    if (
        {"checkpointing", "checkpoint", "ckpt"} & set(words)
        and not _NOT_A_FLAG & set(words)
        and not (MEMORY_UNITS.keys() | TIME_UNITS.keys()) & set(words)
    ):
        return Column(header, "checkpointing")
    if name in RUN_NAMES:
        return Column(header, "run", priority=RUN_NAMES.index(name))
    if name in ITERATION_NAMES:
        return Column(header, "iteration", priority=ITERATION_NAMES.index(name))
    if name in ("rank", "global rank", "gpu rank"):
        return Column(header, "rank")
    if name in ("status", "result", "outcome"):
        return Column(header, "status")
    if name in ("oom", "ooms", "out of memory"):
        return Column(header, "oom")
    if name in ("profiler", "profiling", "profile", "profiled"):
        return Column(header, "profiler")
    if name in ("host", "hostname", "node", "nodes", "node list"):
        return Column(header, "host")
    if name in ("date", "day", "started", "timestamp", "start time"):
        return Column(header, "date")
    if name in ("global batch size", "gbs"):
        return Column(header, "global_batch_size")
    if name in ("seq length", "seq len", "sequence length", "seqlen"):
        return Column(header, "seq_length")
    if any(w.startswith("tflop") for w in words) and "total" not in words:
        return Column(header, "tflops", priority=0 if len(words) <= 3 else 1)
    if "loss" in words and not {"scale", "scaler", "val", "validation", "eval"} & set(words):
        return Column(header, "loss", priority=0 if name in ("loss", "lm loss") else 1)
    timed = {"time", "elapsed", "duration", "latency"} & set(words) or name in TIME_UNITS
    if timed and not _NOT_STEP_TIME & set(words) and "it" not in words[:1]:
        unit, scale = _unit(words, TIME_UNITS)
        # "step time" / "elapsed time per iteration" before a bare "time" or "seconds"
        exact = {"step", "iteration", "iter"} & set(words)
        return Column(header, "step", scale, unit, priority=0 if exact else 1)
    memory = {"mem", "memory", "reserved", "allocated", "alloc", "peak"} & set(words)
    if memory and not _NOT_PEAK & set(words):
        unit, scale = _unit(words, MEMORY_UNITS)
        if "peak" in words and not (memory - {"peak"}) and unit is None:
            return None  # "peak tflops"-like names without a memory word or unit
        key = "reserved" if "reserved" in words else "allocated"
        return Column(header, key, scale, unit, priority=0 if "peak" in words else 1)
    return None


def is_on(value: Any) -> bool | None:
    """A boolean cell: True, False, or None when it is not one."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in ON else False if text in OFF else None


def read_columns(headers: Iterable[str], rows: list[dict] | None = None) -> ColumnMap:
    """The columns to read, from a table's headers (and its rows, to guess a unit a header
    does not give). Raises ValueError (one line) when no column names the setting."""
    out = ColumnMap()
    headers = list(dict.fromkeys(str(h) for h in headers))
    found: dict[str, list[Column]] = {}
    for h in headers:
        col = classify(h)
        if col is None:
            out.unused.append(h)
        else:
            found.setdefault(col.key, []).append(col)
    for key, cols in found.items():
        cols.sort(key=lambda c: c.priority)
        out.columns[key] = cols[0]
        for c in cols[1:]:
            out.unused.append(c.header)
            out.notes.append(f"column '{c.header}' also holds {key}: '{cols[0].header}' is read")
    setting = out.columns.get("setting")
    if setting is not None and "checkpointing" in out.columns and setting.priority >= 4:
        # a descriptive name beside a checkpointing flag labels the run; the flag is the setting
        del out.columns["setting"]
        if "run" in out.columns:
            out.unused.append(setting.header)
        else:
            out.columns["run"] = Column(setting.header, "run")
            out.notes.append(f"'{setting.header}' is read as the run's label")
    if "setting" not in out.columns and "checkpointing" not in out.columns:
        if "run" not in out.columns:
            raise ValueError(
                "no column names the setting (recompute, spec, name, run, or a boolean "
                f"gradient_checkpointing/activation_checkpointing); columns: {', '.join(headers)}"
            )
        out.columns["setting"] = out.columns.pop("run")
        out.notes.append(f"each '{out.columns['setting'].header}' is its own setting")
    if "checkpointing" in out.columns:
        col = out.columns["checkpointing"]
        out.notes.append(
            f"'{col.header}' on is read as full recompute ('full': every layer's activations "
            "recomputed, as Hugging Face/PyTorch gradient checkpointing does), off as 'none'"
        )
    rows = rows or []
    if "setting" in out.columns and "checkpointing" not in out.columns:
        values = {str(out.raw(r, "setting")).strip().lower() for r in rows} - {"none"}
        if values and all(is_on(v) is not None for v in values):
            out.notes.append(
                f"'{out.columns['setting'].header}' holds true/false: read as a checkpointing "
                "flag, on as full recompute ('full'), off as 'none'"
            )
    for key, what in (("step", "step time"), ("reserved", "memory"), ("allocated", "memory")):
        col = out.columns.get(key)
        if col is None or col.scale is not None:
            continue
        values = [v for v in (out.number(r, key) for r in rows) if v is not None]
        mid = statistics.median(values) if values else 0.0
        if key == "step":
            unit, scale = ("ms", 1e-3) if mid >= 50 else ("s", 1.0)
            why = "values from 50 up" if unit == "ms" else "values under 50"
        else:
            unit, scale = ("bytes", 1.0) if mid >= 2**20 else ("GiB", float(GIB))
            why = "values from 2^20 up" if unit == "bytes" else "values under 2^20"
        out.columns[key] = Column(col.header, key, scale, unit, col.priority)
        out.notes.append(f"'{col.header}' gives no unit: {what} read in {unit} ({why})")
    if out.unused:
        out.notes.append(f"columns not used: {', '.join(out.unused)}")
    return out


def setting_of(cmap: ColumnMap, row: dict) -> str | None:
    """The row's setting: the setting column (a boolean there is a checkpointing flag), else
    the checkpointing flag as `full`/`none`."""
    value = cmap.raw(row, "setting")
    if value is not None and not isinstance(value, (dict, list)):
        flag = is_on(value) if isinstance(value, bool) or str(value).lower() != "none" else None
        if flag is not None:
            return "full" if flag else "none"
        return str(value).strip()
    flag_value = cmap.raw(row, "checkpointing")
    if flag_value is None:
        return None
    flag = is_on(flag_value)
    if flag is None:
        return str(flag_value).strip()  # a named granularity ("selective"): kept as written
    return "full" if flag else "none"


def _flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y", "x", "profiled")


def read_table(raw_rows: list) -> tuple[list[dict], list[str]]:
    """The judge's rows (skill/scripts/judge.py) from a table's rows, and what was assumed or
    left out (one line each): columns mapped by their names and units; a row without a setting
    is skipped and said."""
    dicts = [r for r in raw_rows if isinstance(r, dict)]
    if not dicts:
        raise ValueError("no rows (a table with a header row, or JSON objects)")
    headers = [k for r in dicts for k in r]
    cmap = read_columns(headers, dicts)
    notes = list(cmap.notes)
    rows, skipped = [], []
    for n, row in enumerate(dicts, start=1):
        out = normalise(row, cmap)
        if out is None:
            skipped.append(n)
        else:
            rows.append(out)
    if skipped:
        notes.append(f"row(s) {', '.join(map(str, skipped))}: no setting: skipped")
    if not rows:
        raise ValueError("no row names a setting")
    return rows, notes


def normalise(row: dict, cmap: ColumnMap) -> dict | None:
    name = setting_of(cmap, row)
    if name is None:
        return None
    rank = cmap.number(row, "rank")
    status = str(cmap.raw(row, "status") or "").lower()
    oom_flag = cmap.raw(row, "oom")
    iteration = cmap.number(row, "iteration")
    profiler = cmap.raw(row, "profiler")
    run = cmap.raw(row, "run")
    return {
        "recompute": name,
        "rank": int(rank) if rank is not None else 0,
        "oom": "oom" in status
        or "out of memory" in status
        or (oom_flag is not None and is_on(oom_flag) is True),
        "reserved": cmap.number(row, "reserved"),
        "allocated": cmap.number(row, "allocated"),
        "tflops": cmap.number(row, "tflops"),
        "step": cmap.number(row, "step"),
        "loss": cmap.number(row, "loss"),
        "iteration": int(iteration) if iteration is not None else None,
        "run": str(run) if run is not None else None,
        "profiler": _flag(profiler) if profiler is not None else None,
        "host": cmap.raw(row, "host"),
        "date": cmap.raw(row, "date"),
        "global_batch_size": cmap.raw(row, "global_batch_size"),
        "seq_length": cmap.raw(row, "seq_length"),
    }
