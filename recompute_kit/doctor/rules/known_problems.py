"""Known problems as data: one engine for the rows of doctor/known_problems.yaml.

Each row (a framework bug or a version-specific behaviour: its signature, the releases it
affects, the release that fixes it, the public link and the workaround) becomes a rule of the
catalog with the row's id, so its findings are ranked, superseded, calibrated and patch-checked
like every other rule's. The engine is version-aware: when the paste states the library's
version and that release has the fix (or predates the problem), the row does not fire as a
cause and the evidence notes say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .. import known_table
from ..types import Context, Match
from .registry import fact, rule

TABLE = known_table.TABLE
FIELDS = {
    "id",
    "title",
    "category",
    "confidence",
    "symptom",
    "cause",
    "confirm",
    "workaround",
    "patch",
    "links",
    "library",
    "affected_from",
    "fixed_in",
    "signature",
    "patch_env_drop",
    "supersedes",
}
# signature keys: `line: true` also matches a bare line of the log (evidence/known_lines.py)


@dataclass(frozen=True)
class KnownProblem:
    """One row of the table, its regexes compiled."""

    row: dict[str, Any]
    message: tuple[re.Pattern[str], ...]
    error_type: re.Pattern[str] | None
    where: re.Pattern[str] | None
    env_name: re.Pattern[str] | None

    @property
    def id(self) -> str:
        return self.row["id"]

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> KnownProblem:
        unknown = set(row) - FIELDS
        assert not unknown, f"{row.get('id')}: unknown fields {sorted(unknown)}"
        sig = row["signature"]
        env = sig.get("env") or {}
        assert sig.get("message") or env, f"{row['id']}: a signature needs a message or env"
        return cls(
            row,
            tuple(re.compile(p) for p in sig.get("message", ())),
            re.compile(sig["error_type"]) if sig.get("error_type") else None,
            re.compile(sig["where"]) if sig.get("where") else None,
            re.compile(env["name"]) if env else None,
        )

    # ---- matching ---------------------------------------------------------------------------

    def match(self, ctx: Context) -> Match | None:
        found = self._env_match(ctx) if self.env_name else self._error_match(ctx)
        if found is None:
            return None
        said = _version_said(ctx, self.row.get("library"))
        if said is not None and not self.affects(said):
            ctx.evidence.notes.append(
                f"known problem {self.id} ({self.row['title']}) matches, but "
                f"{self.row['library']} {said} is not affected "
                + (
                    f"(fixed in {self.row['fixed_in']})"
                    if self.row.get("fixed_in")
                    else f"(affected from {self.row['affected_from']})"
                )
                + ": not a cause"
            )
            return None
        if said is not None:
            found = Match(
                found.confidence,
                f"{found.evidence} {self.row['library']} {said} is an affected release"
                + (f" (fixed in {self.row['fixed_in']})." if self.row.get("fixed_in") else "."),
                found.config_patch,
                found.fix,
            )
        return found

    def affects(self, version: str) -> bool:
        """Whether `version` of the row's library has the problem (unreadable: assume it does)."""
        v = _release(version)
        if v is None:
            return True
        fixed, since = self.row.get("fixed_in"), self.row.get("affected_from")
        if fixed and (f := _release(str(fixed))) is not None and v >= f:
            return False
        return not (since and (s := _release(str(since))) is not None and v < s)

    def _error_match(self, ctx: Context) -> Match | None:
        sig = self.row["signature"]
        facts = [f for f in sig.get("where_or_facts", ()) if fact(ctx, f)]
        if sig.get("alone") and (
            ctx.oom
            or fact(ctx, "oom_mentions")
            or any(e.kind == "exception" for e in ctx.evidence.errors)  # (a cut traceback too)
        ):
            return None  # a notice that only matters where nothing failed
        line = sig.get("line") and (fact(ctx, "known_lines") or {}).get(self.id)
        if line:
            return Match(self.row["confidence"], f'The log says: "{line}"')
        for e in ctx.evidence.errors:
            if self.error_type is not None and not self.error_type.search(e.type):
                continue
            # hard wraps are spaces; the lines under the message (a CheckpointError's
            # saved / recomputed metadata) belong to it
            text = " ".join(f"{e.type}: {e.message} {e.details}".split())
            if not any(p.search(text) for p in self.message):
                continue
            if self.where is not None and not facts:
                where = " ".join([*e.frames, *e.context, e.message]).lower()
                if not self.where.search(where):
                    continue
            quoted = text if len(text) < 220 else text[:217] + "..."
            return Match(self.row["confidence"], f'The log says: "{quoted}"')
        return None

    def _env_match(self, ctx: Context) -> Match | None:
        parts = self.row["signature"]["env"]["all"]
        for name, value in ctx.evidence.env.items():
            v = value.replace(" ", "")
            if not self.env_name.search(name) or not all(p in v for p in parts):
                continue
            patch = None
            drop = self.row.get("patch_env_drop")
            if drop:
                rest = ",".join(p for p in v.split(",") if p and not p.startswith(drop))
                patch = {"env": {name: rest or next(iter(self.row["patch"]["env"].values()))}}
            return Match(
                self.row["confidence"],
                f"{name}={value} sets {' and '.join(parts)} together: a known problem "
                f"({self.row['links'][0]}).",
                config_patch=patch,
            )
        return None


def _release(version: str) -> tuple[int, ...] | None:
    """(2, 4, 0) of "2.4", "v2.4.0+cu121", "0.4.0a0+4d405a4"; None when it has no number."""
    nums = re.findall(r"\d+", version.split("+")[0].lstrip("v"))[:3]
    if not nums:
        return None
    return tuple(int(n) for n in nums) + (0,) * (3 - len(nums))


def _version_said(ctx: Context, library: str | None) -> str | None:
    """The library's version as the paste states it ("torch 2.3.1", "pytorch version 2.5")."""
    said = fact(ctx, "versions_said") or {}
    if not library or not isinstance(said, dict):
        return None
    return said.get(library)  # "pytorch 2.5" is said as torch (evidence/versions.py)


def load(text: str | None = None) -> list[KnownProblem]:
    """The table's rows (the shipped table, or `text` for a test), each checked and compiled."""
    rows = list(known_table.rows()) if text is None else known_table.parse(text)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids in the known-problems table"
    return [KnownProblem.from_row(r) for r in rows]


KNOWN_PROBLEMS = load()

for _problem in KNOWN_PROBLEMS:
    _row = _problem.row
    rule(
        _row["id"],
        _row["title"],
        _row["category"],
        symptom=_row["symptom"],
        cause=_row["cause"],
        confirm=_row["confirm"],
        fix=_row["workaround"],
        patch=_row.get("patch") or {},
        refs=tuple(_row["links"]),
        supersedes=tuple(_row.get("supersedes", ())),
    )(_problem.match)
