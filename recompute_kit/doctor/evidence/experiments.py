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
_OOM_MARK_RE = re.compile(r"\bOOM\b(?:[^)\]|]*?\brank\s*(\d+))?", re.I)
_MEM_UNIT_RE = re.compile(r"(?<![a-z])(gib|gb|mib|mb|kib|kb|bytes|b)(?![a-z])")


def _experiment_column(header: str) -> tuple[str, str | None]:
    """The normalised key for a column header, and the unit of a memory column."""
    h = " ".join(header.replace("_", " ").strip().lower().split())
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
    keys = {key for key, _ in columns}
    metrics = {"tflops_per_gpu", "peak_memory_bytes", "vs_golden", "result", "oom"}
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
            if (norm in EXPERIMENT_KEYS and norm not in row) or norm.startswith("recompute_"):
                row[norm] = value
                if unit:
                    units[norm] = unit
            row.setdefault(str(key), value)  # keep every key of the runner's rows
        if "status" in raw:
            row["status"] = raw["status"]
        out.append(_normalise_experiment(row, units))
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
        return _parse_experiments(text, name)
    except Exception:  # never raise on garbage
        return []


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
