"""`plan` on the reader corpus's real training configs (tests/sources/corpus/): for each file,
what a user gets from `recompute-kit plan --config FILE --gpu h100-80gb --json` and from the
same with `--levers`. Counts per split: planned (a setting that clears its stated error band,
with the binding stage and its reason, and a levers table beside it), refused with one line
(no shape, a layout the world cannot hold, nothing fits), or failed (a traceback: a defect).

    python benchmarks/plan_corpus.py [--verbose] [--gpu NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sources"))

from reader_corpus import cases  # noqa: E402


def run(args: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


def check(inputs: list[str], gpu: str) -> tuple[str, str]:
    """(outcome, detail) of one corpus case."""
    code, out, err = run(["plan", "--config", *inputs, "--gpu", gpu, "--json"])
    if "Traceback" in err:
        return "failed", err.strip().splitlines()[-1]
    if code != 0:
        line = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
        return "refused", line
    doc = json.loads(out)
    problems = []
    if not doc["clears_error_band"]:
        problems.append("the setting does not clear its error band")
    if not (doc.get("binding_stage") or {}).get("reason"):
        problems.append("no binding stage reason")
    code, out, err = run(["plan", "--config", *inputs, "--gpu", gpu, "--json", "--levers"])
    if "Traceback" in err:
        return "failed", "--levers: " + err.strip().splitlines()[-1]
    levers = json.loads(out)["levers"] if code == 0 else []
    if len(levers) < 2:
        problems.append(f"--levers gave {len(levers)} rows ({err.strip()[-120:]})")
    if problems:
        return "incomplete", "; ".join(problems)
    return "planned", f"{doc['best']['recompute']}, {len(levers)} levers"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="every file's outcome")
    parser.add_argument("--gpu", default="h100-80gb")
    args = parser.parse_args()
    table: dict[str, Counter] = defaultdict(Counter)
    for case in cases():
        outcome, detail = check(case.inputs, args.gpu)
        table[case.split][outcome] += 1
        if args.verbose or outcome in ("failed", "incomplete"):
            print(f"{case.name} ({case.split}): {outcome}: {detail}", flush=True)
    print("| split | files | planned | refused with one line | incomplete | failed |")
    print("|---|---|---|---|---|---|")
    for split, counts in sorted(table.items()):
        print(
            f"| {split} | {sum(counts.values())} | {counts['planned']} | {counts['refused']} "
            f"| {counts['incomplete']} | {counts['failed']} |"
        )
    return 1 if any(c["failed"] for c in table.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
