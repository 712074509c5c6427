"""Make the doctor's calibration table (recompute_kit/doctor/calibration.json) from the corpus's
development split only: per category and per whether the input decides it, the share of top
findings right at each raw confidence band.

It also prints how optimistic that is: a finding made by a rule whose tests cite the case (the
rule was written against it) is right nearly always, the others far less often. The table is
fitted on both (a fit on the uncited cases alone left a Megatron validation message's own rule
at 0.72, below a diagnosis); the held-out split's reliability table is the measure of it.

    .venv/bin/python benchmarks/calibrate.py [--cases DIR] [--check]

`--check` prints the table it would write without writing it. The held-out split is never read
for this (its cases are skipped before the doctor runs on them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import tempfile
from pathlib import Path

import yaml

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
    founding = rules_written_against()
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_case(c, Path(tmp), calibrated=False) for c in dev]
    found = [r for r in results if r.got is not None and r.raw_confidence is not None]
    for own in (True, False):
        part = [r for r in found if (r.rule in founding.get(r.source, ())) == own]
        high = [r for r in part if r.decided and r.raw_confidence >= 0.85]
        print(
            f"findings by a rule {'whose' if own else 'none of whose'} tests cite the case: "
            f"{sum(r.category_ok for r in part)}/{len(part)} right; decided at raw >= 0.85: "
            f"{sum(r.category_ok for r in high)}/{len(high)}",
            file=sys.stderr,
        )
    points = [(r.got, r.decided, r.raw_confidence, r.category_ok, r.rule) for r in found]
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


URL = re.compile(r"https?://[^\s\"'<>)\]`]+")


def rules_written_against() -> dict[str, set[str]]:
    """Source URL -> the rules whose tests cite it: per test function (split at `def test_` and
    `@covers`), the RK ids it names and the URLs it quotes, reads by `text("name")`
    (rule_sources.py) or runs by `scenario("id")` (tests/scenarios/*.yaml)."""
    tests = CASES.parent.parent
    from rule_sources import SOURCES

    scenarios: dict[str, str] = {}
    for path in (tests / "scenarios").glob("*.yaml"):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("source"):
            scenarios[str(data.get("id", path.stem))] = str(data["source"])

    def first_url(text: str) -> set[str]:
        return {u.rstrip(".,;:") for u in URL.findall(text)[:1]}

    out: dict[str, set[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        for chunk in re.split(r"\n(?=@covers|def test_)", path.read_text(encoding="utf-8")):
            rules = set(re.findall(r"RK\d{3}", chunk))
            if not rules:
                continue
            urls = {u.rstrip(".,;:") for u in URL.findall(chunk)}
            for name in re.findall(r'text\("([^"]+)"\)', chunk):
                urls |= first_url(SOURCES.get(name, ""))
            for name in re.findall(r'scenario\("([^"]+)"\)', chunk):
                urls |= first_url(scenarios.get(name, ""))
            for url in urls:
                out.setdefault(url, set()).update(rules)
    return out


if __name__ == "__main__":
    sys.exit(main())
