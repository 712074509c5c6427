"""Propose, for every corpus case, whether its paste alone decides a category: the `decidable`
and `decidable_why` fields of tests/corpus/cases/*.yaml.

    .venv/bin/python benchmarks/label_decidable.py [--write] [--cases DIR]

The rule (doctor/verdict.py's `deciding`): a paste is decidable when its evidence decides some
category: a full OOM message whose numbers show a cause by themselves (fragmentation worth the
name, other processes, memory outside PyTorch, a request of half the GPU), or one whose numbers
show PyTorch's own allocations filling the GPU together with an artefact that splits them (a
model shape, a memory table, the frames it failed in); a config with a model shape the estimator
can split; a memory table (memory reports, memory stats, a snapshot, nvidia-smi's process table,
Megatron's theoretical footprint); measured runs (an ablation table, timed iteration lines); a
traceback with its frames and its exception line; a framework's validation error stating a
constraint; or a config Megatron's validation rejects. Thin: prose, any other bare exception
line, an OOM title without its sizes, frames cut before their exception line, an OOM message
that shows only PyTorch's allocations and nothing that splits them, a config without a model
shape.

Only the paste (`artefacts`, `config`) is read: never the case's diagnosis, expected category or
what the doctor answers. Without --write it prints the proposals that differ from the files.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import yaml

from recompute_kit.doctor.engine import build_context
from recompute_kit.doctor.evidence import collect
from recompute_kit.doctor.verdict import deciding, full_oom, present

CASES = Path(__file__).resolve().parent.parent / "tests" / "corpus" / "cases"


def _thin_why(ctx) -> str:
    ev = ctx.evidence
    has = []
    if full_oom(ctx):
        has.append("an OOM message whose sizes show only PyTorch's allocations filling the GPU")
    elif ev.oom:
        has.append("an OOM line without its sizes")
    if any(not e.frames and "out of memory" not in e.message.lower() for e in ev.errors):
        has.append("an exception or warning line without frames")
    if any(e.frames for e in ev.errors) and "traceback" not in present(ctx):
        has.append("frames cut before their exception line")
    if ev.config:
        has.append("settings without a model shape the estimator can split")
    return "thin: " + (", ".join(has) if has else "prose only")


def propose(case: dict, workdir: Path) -> tuple[bool, str]:
    log = workdir / "case.log"
    log.write_text(str(case["artefacts"]), encoding="utf-8")
    config = None
    if case.get("config"):
        config = workdir / "case.config"
        config.write_text(str(case["config"]), encoding="utf-8")
    ctx = build_context(collect(logs=[str(log)], config=str(config) if config else None))
    kinds = deciding(ctx)
    if kinds:
        return True, "; ".join(kinds.values())
    return False, _thin_why(ctx)


_FIELD = re.compile(r"^decidable(?:_why)?:.*\n(?:[ \t]+.*\n)*", re.M)


def write(path: Path, decidable: bool, why: str) -> None:
    text = _FIELD.sub("", path.read_text(encoding="utf-8"))
    if not text.endswith("\n"):
        text += "\n"
    text += yaml.safe_dump(
        {"decidable": decidable, "decidable_why": why}, sort_keys=False, width=1000
    )
    path.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    counts = {True: 0, False: 0}
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(args.cases.glob("*.yaml")):
            case = yaml.safe_load(path.read_text(encoding="utf-8"))
            decidable, why = propose(case, Path(tmp))
            counts[decidable] += 1
            if args.write:
                write(path, decidable, why)
            elif case.get("decidable") != decidable:
                print(f"{path.stem}: decidable={decidable} ({why})")
    print(f"decidable {counts[True]}, thin {counts[False]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
