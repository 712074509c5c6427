"""The doctor on real cases: logs, configs and experiment tables from public issues.

Each file in tests/scenarios/ is one case written from a public GitHub issue, PR or NVIDIA
skill document: the log text (verbatim where the thread has one; reconstructed and marked so in
the file's `why` where it does not), optionally the config and an experiments table, and the
category of the cause as the thread's maintainers diagnosed it (`expected_category`). The
expected category is the truth: when the doctor disagrees, the rules are wrong, not the case.

`test_top1_accuracy` runs every case through `evidence.collect` and `engine.diagnose`, prints a
per-case table (run with `pytest -s`; it is also written to the test's tmp dir) and fails when
top-1 accuracy drops below ACCURACY_FLOOR: the measured accuracy rounded down to 5 points (but
never below 0.6). Raise the floor when the rules improve.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import collect
from recompute_kit.doctor.rules import CATEGORIES

SCENARIOS = Path(__file__).parent / "scenarios"

REQUIRED = ("id", "source", "why", "expected_category", "log")
OPTIONAL = ("gpu_memory_gb", "config", "config_name", "experiments")

# Measured top-1 accuracy rounded down to the nearest 5%, but never below 0.6. When the suite
# was written the doctor scored 26/64 = 40.6%, so this floor fails until the rules catch up;
# raise it (in 5-point steps) as they improve.
ACCURACY_FLOOR = 0.70  # measured 45/64 = 70.3% on 2026-11-22
MIN_CASES = 40
MIN_CATEGORIES = 8


def _case_files() -> list[Path]:
    return sorted(SCENARIOS.glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _run(case: dict[str, Any], workdir: Path) -> tuple[str | None, str, float | None]:
    """Top finding's category (None when nothing fired), its rule id and confidence."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{case['id']}.log"
    log.write_text(case["log"], encoding="utf-8")
    config = experiments = None
    if case.get("config"):
        config = workdir / case["config_name"]
        config.write_text(case["config"], encoding="utf-8")
    if case.get("experiments"):
        experiments = workdir / "experiments.md"
        experiments.write_text(case["experiments"], encoding="utf-8")
    evidence = collect(
        logs=[str(log)],
        config=str(config) if config else None,
        experiments=str(experiments) if experiments else None,
    )
    diagnosis = diagnose(evidence, case.get("gpu_memory_gb"))
    if not diagnosis.findings:
        return None, "-", None
    top = diagnosis.findings[0]
    return top.category, top.rule, top.confidence


def test_scenario_files_are_valid():
    files = _case_files()
    assert len(files) >= MIN_CASES, f"only {len(files)} scenario files in {SCENARIOS}"
    seen = Counter()
    for path in files:
        case = _load(path)
        assert isinstance(case, dict), path.name
        header = path.read_text(encoding="utf-8").splitlines()[:2]
        assert header[0].startswith("# source: https://"), f"{path.name}: header names no source"
        assert header[1].startswith("# why:"), f"{path.name}: header gives no reason"
        missing = [k for k in REQUIRED if not case.get(k)]
        assert not missing, f"{path.name}: missing {missing}"
        unknown = set(case) - set(REQUIRED) - set(OPTIONAL)
        assert not unknown, f"{path.name}: unknown keys {sorted(unknown)}"
        assert case["id"] == path.stem, f"{path.name}: id {case['id']!r} is not the file name"
        assert case["source"].startswith("https://github.com/"), f"{path.name}: source URL"
        assert case["expected_category"] in CATEGORIES, f"{path.name}: category"
        assert bool(case.get("config")) == bool(case.get("config_name")), (
            f"{path.name}: config and config_name go together"
        )
        gpu = case.get("gpu_memory_gb")
        assert gpu is None or (isinstance(gpu, int | float) and gpu > 0), f"{path.name}: gpu"
        seen[case["expected_category"]] += 1
    assert len(seen) >= MIN_CATEGORIES, f"only {len(seen)} categories: {dict(seen)}"


def test_top1_accuracy(tmp_path):
    rows, errors = [], []
    for path in _case_files():
        case = _load(path)
        try:
            got, rule, conf = _run(case, tmp_path / case["id"])
        except Exception as exc:  # a crash is a miss, listed under the table
            got, rule, conf = None, "error", None
            errors.append(f"{case['id']}: {type(exc).__name__}: {exc}")
        rows.append((case["id"], case["expected_category"], got, rule, conf))

    hits = sum(expected == got for _, expected, got, _, _ in rows)
    accuracy = hits / len(rows)
    width = max(len(r[0]) for r in rows)
    lines = [
        f"{'case':<{width}}  {'expected':<26} {'got':<26} {'rule':<6} conf  ok",
        "-" * (width + 70),
    ]
    for case_id, expected, got, rule, conf in rows:
        mark = "ok" if expected == got else "MISS"
        conf_s = f"{conf:.2f}" if conf is not None else "  - "
        lines.append(
            f"{case_id:<{width}}  {expected:<26} {got or '(none)':<26} {rule:<6} {conf_s}  {mark}"
        )
    lines.extend(f"crashed: {e}" for e in errors)
    per_category = Counter(expected for _, expected, _, _, _ in rows)
    correct = Counter(expected for _, expected, got, _, _ in rows if expected == got)
    lines.append("")
    for category in CATEGORIES:
        if per_category[category]:
            lines.append(f"{category:<26} {correct[category]:>2}/{per_category[category]}")
    lines.append(f"\ntop-1 accuracy: {hits}/{len(rows)} = {accuracy:.1%}")
    report = "\n".join(lines)
    (tmp_path / "scenario_report.txt").write_text(report + "\n", encoding="utf-8")
    print("\n" + report)

    assert accuracy >= ACCURACY_FLOOR, (
        f"top-1 accuracy {accuracy:.1%} fell below {ACCURACY_FLOOR:.0%}\n{report}"
    )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q", "-s"]))
