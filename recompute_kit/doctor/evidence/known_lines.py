"""Lines a known problem is recognised by where they are not an error or a warning the log
parser reads: a bare notice ("Invalidate trace cache @ step 0 ...", "SOLUTION: Use
torch.compile(flex_attention)(...)"). The rows of doctor/known_problems.yaml with `line: true`
name them; this scan records, per row id, the first line of a short log that matches one of
the row's message patterns (rules/known_problems.py reads the fact `known_lines`)."""

from __future__ import annotations

import functools
import re

from .. import known_table


@functools.cache
def _line_patterns() -> dict[str, tuple[tuple[re.Pattern[str], ...], re.Pattern[str] | None]]:
    """{row id: (its message patterns, its `where` pattern or None)}."""
    return {
        r["id"]: (
            tuple(re.compile(p) for p in r["signature"].get("message", ())),
            re.compile(r["signature"]["where"]) if r["signature"].get("where") else None,
        )
        for r in known_table.rows()
        if r["signature"].get("line")
    }


def scan_known_lines(text: str) -> dict[str, str]:
    """{row id: the first matching line} for the table's line-signature rows; a row with a
    `where` pattern also needs it somewhere in the (lower-case) text."""
    found: dict[str, str] = {}
    lower = text.lower()
    rows = {
        rid: regexes
        for rid, (regexes, where) in _line_patterns().items()
        if where is None or where.search(lower)
    }
    for line in text.splitlines():
        for rid, regexes in rows.items():
            if rid not in found and any(p.search(line) for p in regexes):
                found[rid] = " ".join(line.split())[:300]
    return found
