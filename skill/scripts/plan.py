#!/usr/bin/env python3
"""The cheapest recompute setting that fits a GPU: `recompute-kit plan --json`, condensed.

Every option after the script's own is passed to `recompute-kit plan` unchanged: the model
(--model PRESET or --config FILE), the budget (--gpu-memory-gb X or --gpu NAME, e.g. h100-80gb;
one is required), --seq-length, --micro-batch-size, --moe-imbalance F,
--tp/--pp/--vpp/--cp/--ep/--etp/--dp, --sp/--no-sp, --distributed-optimizer, --stage N,
--attention unfused|flash|fused|auto,
--dtype, --safety-margin F (default 0.1), --megatron-core-version X.Y,
--format megatron-bridge|megatron-lm|megatron-deepspeed|nemo|torchtitan|hf-trainer|
llama-factory|automodel|nemo-rl;
--levers (and its --host-link, --global-batch-size, --measured-log ...) returns
`recompute-kit plan --levers --json`'s document as it is, under "levers"; there "fits" says a
row fits (a lever that helps), "current_fits" whether the run as given fits.
Prints one JSON document on stdout:

  {"ok": true, "fits": true, "best": {recompute, total_gib, planned_gib (total_gib and the
   terms beside it the budget is compared with), peak_activation_gib, weights_gib,
   grads_gib, optimizer_gib, recompute_flops_pct, headroom_gib, error_band_gib,
   clears_error_band, ...}, "explanation": "...", "binding_stage": "<which stage binds, why>",
   "stage_total_gib": [per pipeline stage], "stage_held_gib": [the same with what the rank
   holds beside its total (MoE imbalance, gathered parameters): what fits is judged on],
   "stage_global_ranks": [[first, last] global rank of each stage, Megatron's default rank
   order], "assumptions": [...], "warnings": [the reader's],
   "rendered": "<config to paste: the recompute setting, and the parallel layout / shape
   the fit is for where the options changed them from the inputs>", "changed_settings":
   {Megatron field: value, e.g. context_parallel_size: 4}, "usable_gib": ...,
   "fitting": [top --top rows that fit, cheapest first], "not_fitting_closest": [...],
   "candidates": N}

When nothing fits: {"ok": true, "fits": false, "error": "<by how much the smallest misses>"}
and exit 1 (as the CLI). Bad input: {"ok": false, "error": ...}, exit 1.
Estimates are analytic, per rank of the first pipeline stage; measure before you trust a margin.
"""

from __future__ import annotations

import argparse
import json
import sys

from _kit import cli_error, emit, run_cli

GIB = 2**30


def gib(value: float | None) -> float | None:
    return None if value is None else round(value / GIB, 2)


def row(c: dict) -> dict:
    return {
        "recompute": c["recompute"],
        "offload": c.get("offload"),
        # the pipeline stage the row's bytes are of (its highest total)
        "stage": c.get("stage"),
        "fits": c.get("fits"),
        "total_gib": gib(c["total_bytes"]),
        # the total the budget is compared with (MoE imbalance, gathered parameters beside it)
        "planned_gib": gib(c.get("planned_bytes", c["total_bytes"])),
        "peak_activation_gib": gib(c["peak_activation_bytes"]),
        "weights_gib": gib(c["weights_bytes"]),
        "grads_gib": gib(c["grads_bytes"]),
        "optimizer_gib": gib(c["optimizer_bytes"]),
        # the step's cost (the slowest pipeline stage's), else the binding stage's
        "recompute_flops_pct": round(
            100 * c.get("step_recompute_flops_fraction", c["recompute_flops_fraction"]), 2
        ),
        "headroom_gib": gib(c.get("headroom_bytes")),
        "error_band_gib": gib(c.get("error_band_bytes")),
        "clears_error_band": c.get("clears_error_band"),
        # the setting in the run's framework keys (the format `rendered` is in)
        "settings": c.get("settings"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="plan.py",
        description=__doc__.split("\n\n")[0],
        epilog="Example: plan.py --model llama3-70b --gpu-memory-gb 79.1 --tp 8 --pp 4 --sp "
        "--seq-length 8192 --format megatron-lm. Other options: see `rk.py plan --help`.",
    )
    p.add_argument("--top", type=int, default=8, help="rows of 'fitting' to keep (default 8)")
    p.add_argument("--timeout", type=float, default=300, help="seconds (default 300)")
    given = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(given):  # its own options, then every one it passes on
        print(p.format_help())
        print("Every option of `recompute-kit plan` is passed on:\n")
        print(run_cli(["plan", "--help"], timeout=60).get("stdout", ""))
        return 0
    args, rest = p.parse_known_args(argv)
    if not any(a.split("=")[0] in ("--gpu-memory-gb", "--gpu") for a in rest):
        p.error(
            "--gpu-memory-gb X or --gpu NAME is required (GiB per GPU as the GPU reports it: "
            "about 79.1 for an 80 GB H100, or --gpu h100-80gb)"
        )
    result = run_cli(["plan", *rest, "--json"], timeout=args.timeout)
    if result.get("rc") == 1 and "fits" in result.get("stderr", ""):  # nothing / no lever fits
        return emit({"ok": True, "fits": False, "error": cli_error(result)}, 1)
    if result.get("rc") != 0:
        return emit({"ok": False, "error": cli_error(result), "python": result.get("python")}, 1)
    doc = json.loads(result["stdout"])
    if "levers" in doc:
        return emit({"ok": True, **doc})
    candidates = doc.get("candidates", [])
    fitting = [row(c) for c in candidates if c.get("fits")]
    missing = sorted(
        (row(c) for c in candidates if not c.get("fits")), key=lambda r: r["total_gib"]
    )
    return emit(
        {
            "ok": True,
            "fits": True,
            "best": row(doc["best"]),
            "explanation": doc.get("explanation"),
            "binding_stage": (doc.get("binding_stage") or {}).get("reason"),
            "stage_total_gib": [gib(st["total_bytes"]) for st in doc.get("stages", [])],
            "stage_held_gib": [gib(st["held_bytes"]) for st in doc.get("stages", [])],
            "stage_global_ranks": [st["global_ranks"] for st in doc.get("stages", [])],
            "assumptions": doc.get("assumptions", []),
            "warnings": (doc.get("read") or {}).get("warnings", []),
            "rendered": doc.get("rendered"),
            "changed_settings": doc.get("changed_settings", {}),
            # a faster lever than this recompute setting (`--levers` prices them all)
            "better_layout": doc.get("better_layout"),
            "budget_gib": gib(doc.get("budget_bytes")),
            "usable_gib": gib(doc.get("usable_bytes")),
            "fitting": fitting[: args.top],
            "not_fitting_closest": missing[:3],
            "candidates": len(candidates),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
