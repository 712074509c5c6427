"""How well the doctor's top category survives the way a paste is cut, on development cases.

    .venv/bin/python benchmarks/doctor_robustness.py [--json] [--misses KIND]

For every development case the doctor gets right unperturbed, deterministic variants of its
text (recompute_kit/doctor/paste_variants.py: the tail from the first error line, the first
half, no exception head, rank / launcher / logger prefixes, hard- and word-wrapped at 80
columns, the middle elided, config without error and error without config, Markdown fences,
quote markers, collapsed whitespace) are diagnosed again; a variant keeps the case when the top
finding has the case's category. Prints the share kept per kind and per category; `--misses
KIND` lists the cases lost under a kind (held-out cases are never perturbed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the scoring tools
from paste_variants import VARIANTS, robustness, summarize

CASES = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "cases"


def _table(title: str, rows: dict[str, dict[str, int]]) -> str:
    lines = [f"  {title:28} {'n':>4} {'kept':>12}"]
    for key, row in rows.items():
        n = row["n"]
        lines.append(f"  {key:28} {n:>4} {row['kept']:>4} ({row['kept'] / n:4.0%})")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--misses", choices=[*VARIANTS, "all"], help="list the cases lost")
    args = parser.parse_args()
    rows = robustness(args.cases)
    kinds, categories = summarize(rows, "kind"), summarize(rows, "expected")
    if args.json:
        print(json.dumps({"kinds": kinds, "categories": categories}, indent=1))
    else:
        print("per variant kind:")
        print(_table("kind", kinds))
        print("per category (all kinds):")
        print(_table("category", categories))
    if args.misses:
        for row in rows:
            if not row["kept"] and args.misses in ("all", row["kind"]):
                got = f"{row['got']} ({row['rule']})" + (f" {row['error']}" if row["error"] else "")
                print(f"LOST {row['kind']} {row['id']}: expected {row['expected']}, got {got}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
