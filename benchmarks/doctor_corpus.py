"""Score the doctor on the real-case corpus: top-1 category and "fix names the right setting",
per split (development / held-out) and category.

    .venv/bin/python benchmarks/doctor_corpus.py [--json] [--cases DIR] [--misses dev] [--raw]

It prints, per split, the reliability table (the top finding's confidence band, count, right)
and the verdicts: decidable cases' top-1, thin cases answered `needs_evidence` with a `collect`
item that decides them (the cases' `decidable` labels, benchmarks/label_decidable.py), and how
often confident findings (>= 0.85) are right. `--raw` scores the rules' own confidences
(before calibration, doctor/calibration.py).

`--misses dev` lists the development cases the doctor gets wrong (never the held-out ones:
rules are written against the development split only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the scoring tools
from corpus_scoring import format_table, score, table

CASES = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "cases"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--misses", choices=["dev"], help="list the missed development cases")
    parser.add_argument("--raw", action="store_true", help="the rules' uncalibrated confidences")
    args = parser.parse_args()
    try:
        results = score(args.cases, calibrated=not args.raw)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = table(results)
    print(json.dumps(summary, indent=1) if args.json else format_table(summary))
    if args.misses:
        for r in results:
            if r.split == "dev" and not (r.category_ok and r.fix_ok):
                got = f"{r.got} ({r.rule})"
                print(f"MISS {r.id}: expected {r.expected}, got {got}, fix_ok={r.fix_ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
