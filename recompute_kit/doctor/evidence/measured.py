"""Measurements pasted as tables or report lines, read for what they say about recompute and
memory (facts for rules/measured.py):

* `recompute_comparisons`: a table that sets a run with recompute / activation checkpointing
  beside one without (rows "1 card" and "1 card+recompute", columns `default` and `full`), as
  pairs of (baseline, recompute) values of one
  throughput or step-time metric, with the batch size and peak memory of each side when the
  table gives them.
* `logits_sizes`: sizes next to a vocabulary-sized shape (`2 × 256 × 151665`, a `seq_len` column
  beside `V_local=128256`), with the bytes per element they imply (2: bf16 logits, 4: fp32).
* `allocated_reports`: "memory allocated (GB): 32.0" lines with their label ("Before building
  vllm rollout", "after model offload").
* `offload_requested`: lines that switch parameter / optimizer offload on.
* `reserved_vs_allocated`: a table's "Reserved ..." and "Allocated ..." rows, per column.
* `vocab_memory_prose`: paragraphs that name a large vocabulary ("128K vocab", "vocab_size
  (128K)") together with memory (a shortage, a peak, a size), with the vocabulary size.
* `speed_prose`: prose lines saying the run is slow / slower, recompute named or not.
* `recompute_cost_prose`: sentences that name recompute / activation checkpointing together
  with what it costs in time ("a 3.75x slowdown", "~12% of GPU compute burned", "from 4.25
  second per training step to 3.00"), each with the time ratio it implies when it gives one.
"""

from __future__ import annotations

import re
from typing import Any

from .text import parse_size

_SEP_RE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?\s*$")
_NUM_RE = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
_THROUGHPUT_RE = re.compile(
    r"speed|throughput|\btps\b|tok(?:en)?s?/s|tokens per s|ins/s|ex/s|ex/sec|samples?/s|"
    r"tflop|\bmfu\b|it/s|\bbps\b|/sec\b"
)
_TIME_RE = re.compile(r"iter(?:ation)? time|step time|time per|elapsed|\(ms\)|s/it|latency")
_MEMORY_RE = re.compile(r"memory|\bmem\b|\bpeak\b|reserved|allocated|activation size")
_BATCH_RE = re.compile(r"batch|\bbs\b|\bmbs\b")
_RC_RE = re.compile(
    r"recomput|checkpoint|\bckpt\b|\bac\b|\bgc\b|\bfull\b|selective|remat|memory[ _]policy"
)
_NO_RC_RE = re.compile(r"without|w/o|\bno\b|\boff\b|\bnone\b|baseline|\bdefault\b|disabled")


_RC_STATE_RE = re.compile(
    r"(?:recomput\w*|checkpoint\w*|\bac\b|\bgc\b)\s*[:=]?\s*"
    r"(?:(?P<off>off|false|disabled|none|no)|on|true|enabled|yes)\b"
    r"|(?P<off2>\bno|without|w/o|disabled?)\s+(?:activation\s+)?(?:recomput|checkpoint)"
)


def _cells(line: str) -> list[str]:
    """The cells of a table row; an empty first cell ("||speed|") is kept."""
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    s = s[:-1] if s.endswith("|") else s
    return [c.strip().strip("*`").strip() for c in s.split("|")]


def _value(cell: str) -> float | None:
    m = _NUM_RE.search(cell.replace("**", ""))
    if not m:
        return None
    try:
        return float(m.group(0).replace(",", ""))
    except ValueError:
        return None


def _kind(label: str) -> str | None:
    low = label.lower()
    if _TIME_RE.search(low):
        return "time"
    if _THROUGHPUT_RE.search(low):
        return "throughput"
    if _BATCH_RE.search(low):
        return "batch"
    if _MEMORY_RE.search(low):
        return "memory"
    return None


def _recompute_side(label: str) -> bool | None:
    """True for a run with recompute, False for one without, None when the label says
    neither."""
    low = label.lower()
    # the recompute switch's own state ("overlap off, recompute on", "no recompute"), where
    # the label sets other options on or off beside it
    if m := _RC_STATE_RE.search(low):
        return not (m.group("off") or m.group("off2"))
    rc = bool(_RC_RE.search(low))
    if rc and not re.search(r"without|w/o|\bno\b|\boff\b", low):
        return True
    if _NO_RC_RE.search(low):
        return False
    return None


def _tables(lines: list[str]) -> list[tuple[list[str], list[list[str]]]]:
    out = []
    i = 0
    while i < len(lines) - 1:
        if "|" in lines[i] and _SEP_RE.match(lines[i + 1]):
            header = _cells(lines[i])
            rows = []
            j = i + 2
            while j < len(lines) and "|" in lines[j] and lines[j].strip():
                rows.append(_cells(lines[j]))
                j += 1
            out.append((header, rows))
            i = j
        else:
            i += 1
    return out


def _arms(header: list[str], rows: list[list[str]]) -> list[dict[str, Any]]:
    """The runs of one table: {label, rc, throughput|time, batch, memory}."""
    arms: list[dict[str, Any]] = []
    kinds = [_kind(h) for h in header]
    if any(kinds[1:]):
        # one run per row, labelled by its first cell
        for row in rows:
            if not row or not row[0]:
                continue
            arm: dict[str, Any] = {"label": row[0], "rc": _recompute_side(row[0])}
            for k, kind in enumerate(kinds):
                if kind and k < len(row):
                    value = _value(row[k])
                    if value is not None:
                        arm.setdefault(kind, value)
            arms.append(arm)
        return arms
    sides = [_recompute_side(h) for h in header[1:]]
    if True in sides or (sides.count(False) and any(_RC_RE.search(h.lower()) for h in header)):
        # one run per column, one metric per row
        for k, h in enumerate(header[1:], start=1):
            arm = {"label": h, "rc": sides[k - 1]}
            for row in rows:
                if k >= len(row):
                    continue
                kind = _kind(row[0]) or ("throughput" if "/s" in row[k] else None)
                value = _value(row[k])
                if kind and value is not None:
                    arm.setdefault(kind, value)
                    arm.setdefault(kind + "_rows", []).append(value)  # phases, sizes, ...
            arms.append(arm)
    return arms


def _base_for(arm: dict[str, Any], arms: list[dict[str, Any]]) -> dict[str, Any] | None:
    bases = [a for a in arms if a["rc"] is False or (a["rc"] is None and a is not arm)]
    stripped = re.sub(
        r"\s*\+?\s*(?:with\s+)?(?:recompute|checkpoint\w*)\b", "", arm["label"], flags=re.I
    )
    for b in bases:
        if b["label"].strip().lower() == stripped.strip().lower():
            return b
    plain = [b for b in bases if b["rc"] is False]
    return plain[0] if len(plain) == 1 else (bases[0] if len(bases) == 1 else None)


def recompute_comparisons(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for header, rows in _tables(lines):
        arms = _arms(header, rows)
        if not any(a["rc"] for a in arms):
            continue
        for arm in arms:
            if not arm["rc"]:
                continue
            base = _base_for(arm, arms)
            if base is None:
                continue
            for kind in ("throughput", "time"):
                if not (arm.get(kind) and base.get(kind)):
                    continue
                # a column per run may hold one row per phase / size: compare each
                pairs = list(
                    zip(
                        base.get(kind + "_rows", [base[kind]]),
                        arm.get(kind + "_rows", [arm[kind]]),
                        strict=False,
                    )
                )
                batches = list(
                    zip(
                        base.get("batch_rows", [base.get("batch")]),
                        arm.get("batch_rows", [arm.get("batch")]),
                        strict=False,
                    )
                )
                for n, (b, a) in enumerate(pairs):
                    if not a or not b:
                        continue
                    change = a / b - 1 if kind == "throughput" else b / a - 1  # +: arm faster
                    bb, ab = batches[n] if n < len(batches) else (None, None)
                    out.append(
                        {
                            "base": base["label"],
                            "arm": arm["label"],
                            "kind": kind,
                            "base_value": b,
                            "arm_value": a,
                            "change": change,
                            "base_batch": bb,
                            "arm_batch": ab,
                            "base_memory": base.get("memory"),
                            "arm_memory": arm.get("memory"),
                            "header": " | ".join(header),
                        }
                    )
                break
    return out[:24]


_VOCAB_RE = re.compile(
    r"(?:v_local|vocab(?:_size)?|vocabulary)\s*[=:(]?\s*[`(]?\s*(\d[\d,]{4,})", re.I
)
_PRODUCT_RE = re.compile(r"(\d[\d,]*)\s*[×x*]\s*(\d[\d,]*)(?:\s*[×x*]\s*(\d[\d,]*))?")
_SIZE_RE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*(GiB|MiB|GB|MB|KiB|KB)\b")
_SEQ_HEADER_RE = re.compile(r"seq(?:uence)?[ _]?len|seq\b|tokens|length", re.I)
_B_RE = re.compile(r"\bB\s*=\s*(\d+)")


def _bytes(number: str, unit: str) -> float:
    return float(parse_size(number, unit) or 0)


def _per_element(size: float, elements: float) -> float | None:
    if elements <= 0:
        return None
    ratio = size / elements
    for width in (2.0, 4.0):
        if 0.85 * width <= ratio <= 1.15 * width:
            return width
    return None


def logits_sizes(lines: list[str]) -> list[dict[str, Any]]:
    """Sizes that equal a logits tensor: elements x 2 or 4 bytes with a vocabulary-sized
    factor (>= 30,000)."""
    out: list[dict[str, Any]] = []
    text = "\n".join(lines)
    vocab = next((int(m.replace(",", "")) for m in _VOCAB_RE.findall(text)), None)
    batch = int(m.group(1)) if (m := _B_RE.search(text)) else 1
    for line in lines:
        low = line.lower()
        if "logit" in low or "vocab" in low:
            for p in _PRODUCT_RE.finditer(line):
                factors = [int(f.replace(",", "")) for f in p.groups() if f]
                if max(factors) < 30000:
                    continue
                elements = 1.0
                for f in factors:
                    elements *= f
                for s in _SIZE_RE.finditer(line[p.end() :]):
                    width = _per_element(_bytes(*s.groups()), elements)
                    if width:
                        out.append(
                            {
                                "line": line.strip()[:160],
                                "elements": elements,
                                "bytes_per": width,
                                "size": _bytes(*s.groups()),
                                "vocab": max(factors),
                            }
                        )
                        break
    if vocab and vocab >= 30000:
        for header, rows in _tables(lines):
            seq_col = next((k for k, h in enumerate(header) if _SEQ_HEADER_RE.search(h)), None)
            if seq_col is None:
                continue
            for row in rows:
                if seq_col >= len(row) or (seq := _value(row[seq_col])) is None:
                    continue
                for k, cell in enumerate(row):
                    s = _SIZE_RE.search(cell)
                    if k == seq_col or not s:
                        continue
                    elements = batch * seq * vocab
                    width = _per_element(_bytes(*s.groups()), elements)
                    if width:
                        out.append(
                            {
                                "line": " | ".join(row)[:160],
                                "elements": elements,
                                "bytes_per": width,
                                "size": _bytes(*s.groups()),
                                "vocab": vocab,
                                "seq": int(seq),
                                "column": header[k] if k < len(header) else "",
                            }
                        )
                        break
    return out[:12]


_ALLOCATED_RE = re.compile(
    r"(?P<label>[A-Za-z][\w ,./-]{0,60}?)[,:]?\s*\**memory allocated \(GB\)\**:\s*\**"
    r"(?P<gb>\d+(?:\.\d+)?)",
    re.I,
)
_OFFLOAD_ON_RE = re.compile(
    r"(?:param|optimizer|adam|optim(?:izer)?_cpu|offload)_?offload\w*\s*[=:]\s*(?:true|1|cpu)\b|"
    r"--(?:adam|param|optimizer)_offload\b|\"offload_(?:optimizer|param)\"\s*:\s*\{\s*\"device\"\s*:"
    r"\s*\"cpu\"|after (?:model |optimizer )?offload",
    re.I,
)


def allocated_reports(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if "memory allocated (gb)" not in line.lower():
            continue
        m = _ALLOCATED_RE.search(line)
        if m:
            out.append(
                {
                    "label": m.group("label").strip(),
                    "gb": float(m.group("gb")),
                    "line": line.strip()[:200],
                }
            )
    return out[:12]


def reserved_vs_allocated(lines: list[str]) -> list[dict[str, Any]]:
    """Tables with a "Reserved ..." row and an "Allocated ..." row: per column, both sizes."""
    out = []
    for header, rows in _tables(lines):
        reserved = next((r for r in rows if r and "reserved" in r[0].lower()), None)
        allocated = next((r for r in rows if r and "allocated" in r[0].lower()), None)
        if not reserved or not allocated:
            continue
        unit = next((u for u in ("GiB", "MiB", "GB", "MB") if u in " ".join(reserved)), None)
        if unit is None:
            continue
        unit_bytes = parse_size("1", unit)
        for k in range(1, min(len(reserved), len(allocated))):
            r, a = _value(reserved[k]), _value(allocated[k])
            if r is not None and a is not None:
                out.append(
                    {
                        "column": header[k] if k < len(header) else str(k),
                        "reserved": r * unit_bytes,
                        "allocated": a * unit_bytes,
                        "label": reserved[0],
                    }
                )
    return out[:8]


# Recompute / activation (gradient) checkpointing named in prose, in any framework's spelling
_CKPT_PROSE_RE = re.compile(
    r"(?:gradient|activation)[ _-]?checkpoint|checkpoint(?:ing)?[ _-]interval|recomput|"
    r"\bremat|grad[ _-]?ckpt|\bAC\b"
)
# What it costs in time: a ratio ("3.75x slowdown"), a share of the compute ("12% of GPU
# compute", "20% slower"), or two per-step times ("from 4.25 second per step to 3.00")
_RATIO_COST_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*[x×]\s*(?:training\s+|step\s+)?(?:slow(?:down|er)|overhead|longer)"
)
_SHARE_COST_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*%\s*(?:slower|overhead|more time|longer|of (?:the )?(?:GPU |total |step )?"
    r"(?:compute|time|FLOPs))",
    re.I,
)
_TIMES_COST_RE = re.compile(
    r"from\s+(\d+(?:\.\d+)?)\s*(?:s|sec|secs|seconds?|ms)\b[^.;]*?\bto\s+(\d+(?:\.\d+)?)\s*"
    r"(?:s|sec|secs|seconds?|ms)\b",
    re.I,
)
_NO_COST_RE = re.compile(r"\bno\s+(?:noticeable\s+|measurable\s+)?(?:slowdown|overhead)", re.I)
# "25% faster without gradient checkpointing": the cost said from the other side
_FASTER_WITHOUT_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*%\s*(?:or so\s+|or more\s+)?faster\s+(?:\w+\s+){0,2}without", re.I
)
# "throughput drops (factor >100)", "a factor of 3 slower"
_FACTOR_COST_RE = re.compile(
    r"(?:slow|throughput|speed)\w*[^.;]{0,40}?factor\s*(?:of\s*)?[>~≈]?\s*(\d+(?:\.\d+)?)", re.I
)
# The cost said without a number: "super slow with gradient checkpointing", "throughput drop"
_SLOW_WORDS_RE = re.compile(
    r"\b(?:(?:very|super|much|extremely|really|so|significantly)\s+slow(?:er)?|slow(?:s)?\s+"
    r"down|slowdown|slower|throughput\s+drops?|drops?\s+in\s+throughput|faster\s+without)\b",
    re.I,
)


# Speed said to suffer, with or without recompute named: "not optimal for speed", "slower",
# "throughput drops", "lower MFU"
_SPEED_PROSE_RE = re.compile(
    r"\bnot\s+(?:optimal|good|ideal|efficient)\s+(?:for|in)\s+(?:speed|throughput|performance)"
    r"|\bsub-?optimal\s+(?:for\s+)?(?:speed|throughput|performance)"
    r"|\bslow(?:er|s|ed|down)?\b|\b(?:lower|worse|reduced)\s+(?:throughput|MFU|speed|tokens)"
    r"|\b(?:throughput|MFU|speed)\s+(?:drops?|decreases?|regress\w*|is\s+worse)",
    re.I,
)


def speed_prose(lines: list[str]) -> list[str]:
    """Prose lines (not code, frames or tables) saying the run got slower / is not fast."""
    out = []
    for line in lines:
        s = line.strip()
        if not s or 'File "' in s or s.count("|") >= 3 or s.startswith(("#", ">>>")):
            continue
        if re.search(r"[=(]\s*$|^\w[\w.]*\s*=|^(?:def|class|import|from|return)\b", s):
            continue  # code
        if _SPEED_PROSE_RE.search(s):
            out.append(" ".join(s.split())[:200])
    return out[:6]


def recompute_cost_prose(lines: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if 'File "' in line or _SEP_RE.match(line) or line.count("|") >= 3:
            continue  # frames and tables are other facts' (recompute_comparisons)
        # a sentence wrapped over lines: the line with up to two lines above it in the same
        # paragraph (a blank line ends it)
        start = i
        while start > max(0, i - 2) and lines[start - 1].strip():
            start -= 1
        near = " ".join(x.strip() for x in lines[start : i + 1])
        if not _CKPT_PROSE_RE.search(near) or _NO_COST_RE.search(line):
            continue
        ratio: float | None = None
        if m := _RATIO_COST_RE.search(line):
            ratio = float(m.group(1))
        elif m := _TIMES_COST_RE.search(line):
            a, b = float(m.group(1)), float(m.group(2))
            ratio = max(a, b) / min(a, b) if min(a, b) > 0 else None
        elif m := _SHARE_COST_RE.search(line) or _FASTER_WITHOUT_RE.search(line):
            ratio = 1 + float(m.group(1)) / 100
        elif m := _FACTOR_COST_RE.search(line):
            ratio = float(m.group(1))
        elif _SLOW_WORDS_RE.search(line):
            # slower, no number: a cost all the same (ratio unknown)
            out.append({"line": " ".join(line.split())[:200], "ratio": None})
            continue
        else:
            continue
        if ratio is None or ratio <= 1.02:
            continue
        out.append({"line": " ".join(line.split())[:200], "ratio": round(ratio, 2)})
    # a number beats the same cost said in words
    return sorted(out, key=lambda c: c["ratio"] is None)[:6]


# A large vocabulary in shorthand or in full: "vocab_size (128K)", "250K vocab", "128k vocab
# size", "vocab_size=151936"
_BIG_VOCAB_RE = re.compile(
    r"vocab\w*\s*(?:size\s*)?[=:(]?\s*\(?\s*(\d{2,3})\s*[kK]\b|(\d{2,3})\s*[kK]\)?\s*"
    r"(?:\w+\s+)?vocab|vocab\w*\s*[=:(]?\s*\(?\s*(\d{5,6})\b|(\d{5,6})\s*\(?vocab",
    re.I,
)
# Memory named next to it: a shortage, a peak, a size
_MEMORY_WORD_RE = re.compile(
    r"memory|VRAM|\bOOM\b|out of memory|\d(?:\.\d+)?\s*(?:G|GB|GiB)\b", re.I
)


# The loss / logits blamed for the memory in words: "the cross entropy loss is causing huge
# spikes in peak memory", "OOM in the cross-entropy"
_LOSS_BLAMED_RE = re.compile(
    r"(?:cross[ _-]?entropy|\bCE\s+loss|log[_ ]?softmax|\blogits\b)[^.\n]{0,60}?"
    r"\b(?:caus\w*|spik\w*|peak\w*|dominat\w*|tak(?:es|ing)|consum\w*|blow\w*|explod\w*)"
    r"[^.\n]{0,40}?\b(?:memory|VRAM|OOM)\b"
    r"|\b(?:OOM|out of memory)\s+(?:in|at|during|inside|from)\s+(?:the\s+)?"
    r"(?:cross[ _-]?entropy|loss|log[_ ]?softmax|logits)\b",
    re.I,
)


def vocab_memory_prose(lines: list[str]) -> list[dict[str, Any]]:
    """Paragraphs that blame memory on a large vocabulary (>= 30k, "128K" or "151936"), or on
    the loss / logits themselves (then no vocabulary: "vocab" None)."""
    out: list[dict[str, Any]] = []
    paragraph: list[str] = []
    # a short paste (a PR or issue text) is one argument: memory named in any paragraph
    short = sum(1 for line in lines if line.strip()) <= 20
    anywhere = short and bool(_MEMORY_WORD_RE.search(" ".join(lines)))
    for line in [*lines, ""]:
        if line.strip():
            paragraph.append(line.strip())
            continue
        joined = " ".join(paragraph)
        paragraph = []
        for m in _BIG_VOCAB_RE.finditer(joined):
            k, k2, full, full2 = m.groups()
            vocab = int(k or k2) * 1000 if (k or k2) else int(full or full2)
            if 30_000 <= vocab <= 300_000 and (anywhere or _MEMORY_WORD_RE.search(joined)):
                out.append({"line": joined[:200], "vocab": vocab})
                break
        else:
            if m := _LOSS_BLAMED_RE.search(joined):
                start = max(0, m.start() - 60)
                out.append({"line": joined[start : start + 200], "vocab": None})
    return out[:4]


def scan_measured(lines: list[str]) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    if comparisons := recompute_comparisons(lines):
        facts["recompute_comparisons"] = comparisons
    if sizes := logits_sizes(lines):
        facts["logits_sizes"] = sizes
    if vocab := vocab_memory_prose(lines):
        facts["vocab_memory_prose"] = vocab
    if costs := recompute_cost_prose(lines):
        facts["recompute_cost_prose"] = costs
    if speed := speed_prose(lines):
        facts["speed_prose"] = speed
    if pairs := reserved_vs_allocated(lines):
        facts["reserved_vs_allocated"] = pairs
    if reports := allocated_reports(lines):
        facts["allocated_reports"] = reports
    offload = [line.strip()[:160] for line in lines if _OFFLOAD_ON_RE.search(line)]
    if offload:
        facts["offload_requested"] = offload[:8]
    return facts
