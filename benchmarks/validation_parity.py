"""Validation parity table: generated configs through Megatron-Core's TransformerConfig and
`recompute-kit validate`.

    python benchmarks/validation_parity.py [--configs 1100] [--seed 0] [--list]

Prints configs generated, counted, excluded (outcome depends on Transformer Engine / CUDA),
version-changed (verdict differs between the installed Megatron-Core and the v0.19 rule the kit
follows), kit-only rule, verdict agreement, message agreement, and every disagreement.
`--list` also lists every excluded config and every differing message.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recompute_kit.engines.validation_parity import (
    ParityReport,
    compare,
    generate_configs,
    version_message_differences,
)


def _percent(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100.0 * part / max(whole, 1):.1f}%)"


def table(report: ParityReport, configs: int, seed: int) -> str:
    counted = report.counted
    agree = sum(o.verdict_agrees for o in counted)
    rejected = report.both_rejected
    messages_equal = sum(o.message_agrees for o in rejected)
    versioned = version_message_differences(report)
    rows = [
        ("megatron-core", version("megatron-core")),
        ("configs generated", f"{configs} (seed {seed})"),
        ("counted", str(len(counted))),
        ("excluded: depends on TE/CUDA", str(len(report.of("te_cuda")))),
        ("version-changed (0.16.1 vs v0.19)", str(len(report.of("version")))),
        ("kit-only rule (not counted)", str(len(report.of("kit_only")))),
        ("verdict agreement", _percent(agree, len(counted))),
        ("  accepted by Megatron", str(sum(o.megatron.accepted for o in counted))),
        ("  rejected by Megatron", str(sum(not o.megatron.accepted for o in counted))),
        ("message agreement (both reject)", _percent(messages_equal, len(rejected))),
        (
            "  same, v0.19 wording not counted",
            _percent(messages_equal, len(rejected) - len(versioned)),
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("")
    lines.append(f"verdict disagreements: {len(report.disagreements)}")
    lines += [f"  {o.name}: megatron {o.megatron} | kit {o.kit}" for o in report.disagreements]
    return "\n".join(lines)


def listing(report: ParityReport) -> str:
    lines = []
    for category in ("te_cuda", "version", "kit_only"):
        lines.append(f"\n{category}:")
        for o in report.of(category):
            lines.append(f"  {o.name}: {o.note}; kit {o.kit}")
            lines.append(f"    {o.flat}")
    lines.append("\nmessage differences (both reject):")
    for o in report.message_differences:
        lines.append(f"  {o.name}: {o.note or 'kit wording'}")
        lines.append(f"    megatron {o.megatron}")
        lines.append(f"    kit      {o.kit}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=1100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list excluded configs and messages")
    args = parser.parse_args()
    if args.configs < 1:
        parser.error("--configs must be at least 1")
    warnings.simplefilter("ignore")  # Megatron's import-time notes about missing TE/Apex
    report = compare(generate_configs(args.configs, args.seed))
    print(table(report, args.configs, args.seed))
    if args.list:
        print(listing(report))
    return 0 if not report.disagreements else 1


if __name__ == "__main__":
    sys.exit(main())
