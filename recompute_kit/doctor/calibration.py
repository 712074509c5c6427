"""Calibrated confidence: a finding's confidence is the measured chance that its category is right.

The rules state raw confidences. `calibration.json` (beside this module) maps them, per category
and per whether the input decides that category (doctor/verdict.py), to the share of findings
at that raw confidence that were right on the corpus's development split. It is a small table,
made by `benchmarks/calibrate.py` (its date and command are in the file); the held-out split is
never used to make it.

Three guards the development split cannot give, because its rules were written against it:
the table only ever lowers a rule's confidence (the split can show a rule over-confident, not
under-confident), a group with few cases is pulled towards its pooled rate, and a finding the
input does not decide is never above `UNDECIDED_CAP` (a paste that does not decide is a guess:
the issue's fresh sample of thin pastes was read right 8 times in 30).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("calibration.json")
UNDECIDED_CAP = 0.6
BANDS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.85), (0.85, 1.01))
PRIOR_WEIGHT = 4.0  # pseudo-cases pulling a small group towards its pooled rate


def band(raw: float) -> int:
    return next(i for i, (lo, hi) in enumerate(BANDS) if raw < hi or i == len(BANDS) - 1)


def key(category: str, decided: bool) -> str:
    return f"{category}|{'decided' if decided else 'undecided'}"


@lru_cache(maxsize=1)
def load(path: str = str(TABLE)) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"table": {}}


def calibrate(
    raw: float,
    category: str,
    decided: bool,
    table: dict[str, Any] | None = None,
    rule: str | None = None,
) -> float:
    """The calibrated confidence of a raw one (the raw one, capped, where the table has no
    row: an empty or missing table changes nothing but the cap): the rule's own row where the
    development split has findings of it, else its category's, else the pooled one. Rounded
    down: a confidence never states more than was measured."""
    rows = (table or load())["table"]
    row = (
        (rows.get(key(f"rule:{rule}", decided)) if rule else None)
        or rows.get(key(category, decided))
        or rows.get(key("*", decided))
    )
    # never above the rule's own value: the development split is optimistic (its rules were
    # written against it), so it can show a rule over-confident but not under-confident
    value = raw if row is None else min(raw, row[band(raw)]["p"])
    if not decided:
        value = min(value, UNDECIDED_CAP)
    return math.floor(value * 100 + 1e-9) / 100


def _pav(values: list[float], weights: list[float]) -> list[float]:
    """Pool adjacent violators: the non-decreasing sequence closest to `values`."""
    blocks = [[v, w, 1] for v, w in zip(values, weights, strict=True)]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            v1, w1, n1 = blocks[i]
            v2, w2, n2 = blocks[i + 1]
            w = w1 + w2
            blocks[i] = [(v1 * w1 + v2 * w2) / w if w else (v1 + v2) / 2, w, n1 + n2]
            del blocks[i + 1]
            i = max(i - 1, 0)
        else:
            i += 1
    out: list[float] = []
    for v, _, n in blocks:
        out += [v] * n
    return out


def fit(points: list[tuple[str, bool, float, bool, str]]) -> dict[str, Any]:
    """The table from (category, decided, raw confidence, right, rule) of top findings: per key
    and raw band, the share right, pulled towards the pooled rate of the same decided-ness (and
    that towards the pooled band rate), made non-decreasing in the raw confidence. A rule with
    findings of its own gets a row pulled from its category's towards its own record: categories
    pool rules of unlike reliability (an allocator-level reading beside a validation message)."""

    def counts(select) -> list[list[int]]:
        c = [[0, 0] for _ in BANDS]
        for cat, dec, raw, right, rule_id in points:
            if select(cat, dec, rule_id):
                c[band(raw)][0] += 1
                c[band(raw)][1] += right
        return c

    def shrunk(mine: list[list[int]], towards: list[float]) -> list[float]:
        p = [
            (r + PRIOR_WEIGHT * q) / (n + PRIOR_WEIGHT)
            for (n, r), q in zip(mine, towards, strict=True)
        ]
        return _pav(p, [n + PRIOR_WEIGHT for n, _ in mine])

    def rows(mine: list[list[int]], p: list[float]) -> list[dict[str, Any]]:
        return [{"n": n, "right": r, "p": round(v, 3)} for (n, r), v in zip(mine, p, strict=True)]

    points = [(*pt, None)[:5] for pt in points]  # a rule-less point counts for its category only
    table: dict[str, Any] = {}
    for decided in (True, False):
        pooled = counts(lambda c, d, r, dec=decided: d == dec)
        total_n = sum(n for n, _ in pooled) or 1
        overall = sum(r for _, r in pooled) / total_n
        pooled_p = _pav(
            [(r + PRIOR_WEIGHT * overall) / (n + PRIOR_WEIGHT) for n, r in pooled],
            [n + PRIOR_WEIGHT for n, _ in pooled],
        )
        table[key("*", decided)] = rows(pooled, pooled_p)
        for cat in sorted({c for c, d, *_ in points if d == decided}):
            mine = counts(lambda c, d, r, cat=cat, dec=decided: c == cat and d == dec)
            cat_p = shrunk(mine, pooled_p)
            table[key(cat, decided)] = rows(mine, cat_p)
            rules = {r for c, d, _, _, r in points if c == cat and d == decided and r}
            for rule_id in sorted(rules):
                own = counts(lambda c, d, r, rid=rule_id, dec=decided: r == rid and d == dec)
                table[key(f"rule:{rule_id}", decided)] = rows(own, shrunk(own, cat_p))
    return table
