"""How well the one reader reads real training artefacts: per format and split, the values
read right out of those the corpus expects (tests/sources/corpus/, split once by a hash of
each source URL). Deterministic, a few seconds:

    python benchmarks/reader_corpus.py [--verbose]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the registry and the cache, as in the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sources"))

from reader_corpus import cases, score


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="every wrong value")
    parser.add_argument(
        "--blind", action="store_true", help="only the files whose expectations were written "
        "without looking at the reader (`blind: true`)"
    )
    args = parser.parse_args()
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for case in cases():
        if args.blind and not case.expect.get("blind"):
            continue
        result = score(case)
        row = table[(case.expect.get("framework", "?"), case.split)]
        row[0] += 1
        row[1] += result.right
        row[2] += result.expected
        row[3] += result.right == result.expected
        if args.verbose and (result.wrong or result.error):
            print(f"{case.name} ({case.split}):", *result.wrong, sep="\n  ")
            if result.error:
                print(f"  refused: {result.error}")
    print("| framework | split | files | all right | values right |")
    print("|---|---|---|---|---|")
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for (framework, split), (files, right, expected, whole) in sorted(table.items()):
        print(f"| {framework} | {split} | {files} | {whole} | {right}/{expected} |")
        for i, v in enumerate((files, right, expected, whole)):
            totals[split][i] += v
    for split, (files, right, expected, whole) in sorted(totals.items()):
        print(f"| **all** | {split} | {files} | {whole} | {right}/{expected} "
              f"({100 * right / max(expected, 1):.1f}%) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
