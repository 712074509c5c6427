"""Patches that cannot hurt (issue #21): every config of the reader corpus
(tests/sources/corpus/, read through the shared reader) diagnosed with a real OOM message
(tests/data/rules/i12-automodel-1975.txt, https://github.com/NVIDIA-NeMo/Automodel/pull/1975),
counting the rules' patches as written (before doctor/patches.py) and as shown (after it):

- foreign: an entry in another framework's keys (use_liger_kernel for Megatron-Bridge,
  gradient_checkpointing for NeMo-RL, zero_optimization for NeMo 1.x);
- already: an entry whose value the inputs already have;
- harmful: a change the estimator shows raises the peak, that lowers recompute, or that
  Megatron-Core's validation rejects, on a finding whose point is not that trade;
- unkeyed: a Megatron-Core field the framework has no key for.

"After" re-checks the shown patches: a check that finds nothing more is idempotent.

    PYTHONPATH=. python benchmarks/doctor_patches.py
"""

from __future__ import annotations

import copy
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recompute_kit.doctor import engine, patches  # noqa: E402
from recompute_kit.doctor.evidence import collect  # noqa: E402

LOG = ROOT / "tests" / "data" / "rules" / "i12-automodel-1975.txt"


def _kind(reason: str) -> str:
    if reason.startswith("already"):
        return "already"
    if "does not read it" in reason:
        return "foreign"
    if reason.startswith("dropped:"):
        return "harmful"
    return "unkeyed"


def main() -> None:
    files = sorted(
        p
        for p in (ROOT / "tests" / "sources" / "corpus").glob("*/*")
        if p.is_file() and not p.name.endswith(".expect.yaml") and p.name != "README.md"
    )  # (a repository checkout such as bridge_checkout/src is a folder: its files are inputs
    # of other tests)
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    shown = translated = 0
    real = engine.check_patches
    for path in files:
        engine.check_patches = lambda ctx, findings: None  # the rules' patches as written
        try:
            evidence = collect(logs=[str(LOG)], config=str(path))
            ctx = engine.build_context(evidence)
            diagnosis = engine.diagnose(evidence)
        finally:
            engine.check_patches = real
        raw = [f for f in diagnosis.findings if f.config_patch]
        checked = copy.deepcopy(raw)
        patches.check_patches(ctx, checked)
        for f in checked:
            for d in f.patch_check.get("dropped", []):
                before[_kind(d["reason"])] += 1
            shown += bool(f.config_patch)
            translated += bool(f.patch_keys) and f.patch_keys != f.config_patch
        again = copy.deepcopy(checked)
        patches.check_patches(ctx, again)
        for f in again:
            for d in f.patch_check.get("dropped", []):
                after[_kind(d["reason"])] += 1
    print(
        f"{len(files)} configs, a real OOM each; findings with a patch: shown {shown}, "
        f"written in the framework's own keys {translated}"
    )
    print(f"{'entry':<10} {'before':>7} {'after':>6}")
    for kind in ("foreign", "already", "harmful", "unkeyed"):
        print(f"{kind:<10} {before[kind]:>7} {after[kind]:>6}")


if __name__ == "__main__":
    main()
