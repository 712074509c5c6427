"""Time the memory model: estimate per candidate, fake (meta-device) measurement, plan.

    .venv/bin/python benchmarks/memory_model.py [--out FILE]

Targets (issue #4): estimate < 10 ms per candidate, plan over all candidates < 1 s, fake
measurement of a 70B layer < 10 s on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from recompute_kit.config import all_specs
from recompute_kit.memory.estimate import estimate
from recompute_kit.memory.measure import measure_fake
from recompute_kit.plan import candidates, plan
from recompute_kit.presets import PRESETS


def timed(fn, repeat: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="append the Markdown table to this file")
    args = parser.parse_args()
    rows = []
    for name, preset in PRESETS.items():
        cfg = preset.config()
        specs = all_specs(cfg)
        per_candidate = timed(
            lambda cfg=cfg, specs=specs: [estimate(cfg.with_recompute(s)) for s in specs]
        ) / len(specs)
        plan_time = timed(lambda cfg=cfg: plan(cfg, 1e6))  # a budget everything fits
        fake_cfg = cfg.replace(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=1,
            expert_model_parallel_size=1,
            sequence_parallel=False,
        )
        fake_time = timed(lambda c=fake_cfg: measure_fake(c.with_recompute("none")))
        rows.append((name, len(candidates(cfg)), per_candidate * 1e3, plan_time, fake_time))
    header = (
        "| preset | candidates | estimate per candidate (ms) | plan, all candidates (s) "
        "| fake measure, one layer per kind (s) |\n|---|---|---|---|---|"
    )
    lines = [header] + [f"| {n} | {c} | {e:.2f} | {p:.3f} | {f:.2f} |" for n, c, e, p, f in rows]
    table = "\n".join(lines)
    print(table)
    print(
        f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(table + "\n")


if __name__ == "__main__":
    main()
