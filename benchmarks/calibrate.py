"""Make the doctor's calibration table (recompute_kit/doctor/calibration.json) from the corpus's
development split only: per category and per whether the input decides it, the share of top
findings right at each raw confidence band.

    .venv/bin/python benchmarks/calibrate.py [--cases DIR] [--check]

`--check` prints the table it would write without writing it. The held-out split is never read
for this (its cases are skipped before the doctor runs on them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

from recompute_kit.doctor.calibration import BANDS, PRIOR_WEIGHT, TABLE, UNDECIDED_CAP, fit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the scoring tools
from corpus_scoring import load_cases, run_case, split_of

CASES = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "cases"
COMMAND = "python benchmarks/calibrate.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    dev = [c for c in load_cases(args.cases) if split_of(c["source"]) == "dev"]
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_case(c, Path(tmp), calibrated=False) for c in dev]
    points = [
        (r.got, r.decided, r.raw_confidence, r.category_ok, r.rule)
        for r in results
        if r.got is not None and r.raw_confidence is not None
    ]
    doc = {
        "produced": datetime.date.today().isoformat(),
        "command": COMMAND,
        "split": "dev",
        "cases": len(dev),
        "points": len(points),
        "bands": [list(b) for b in BANDS],
        "prior_weight": PRIOR_WEIGHT,
        "undecided_cap": UNDECIDED_CAP,
        "table": fit(points),
    }
    text = json.dumps(doc, indent=1) + "\n"
    if args.check:
        print(text)
    else:
        TABLE.write_text(text, encoding="utf-8")
        print(f"wrote {TABLE} from {len(points)} development findings", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
