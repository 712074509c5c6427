#!/usr/bin/env python3
"""Diagnose an OOM or a recompute problem: `recompute-kit doctor --json`, condensed.

Give it what you have: the training log / traceback / OOM message (--log, repeatable, '-' for
stdin), the config (YAML/JSON, a Megatron-LM command line or Hydra overrides), an experiments
table (the kit's results.jsonl, CSV or Markdown), torch.cuda.memory_stats() JSON, or a memory
snapshot pickle. Prints one JSON document on stdout:

  {"ok": true, "verdict": "diagnosed | needs_evidence | out_of_scope", "verdict_why": "...",
   "collect": [{id, what, decides}], "top": {...first finding...}, "findings": [{rule,
   category, title, confidence, evidence, cause, confirm, fix, config_patch, references}],
   "summary": "...", "assumptions": [...], "input_problems": [inputs not read, or only in
   part: say so before trusting the findings], "evidence": {"oom": [...], "counts": {...},
   "sources": [...]}}

Lead with the verdict: `diagnosed` (the evidence decides the top finding), `needs_evidence`
(the findings are possible; `collect` names what would decide them: ask the user for it) or
`out_of_scope`.

Findings are ranked, best first; `category` says what kind of problem it is (fragmentation,
activation_memory, model_state_memory, recompute_overhead, invalid_config, ...). --full adds the
doctor's complete document under "doctor". Exit 0 when the doctor ran (with or without findings),
1 when it could not (bad input, no interpreter: see "error").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _kit import cli_error, emit, run_cli

FINDING_KEYS = (
    "rule",
    "category",
    "title",
    "confidence",
    "evidence",
    "cause",
    "confirm",
    "fix",
    "config_patch",
    "patch_keys",  # the patch in the keys of the framework the inputs show: apply this one
    "patch_framework",
    "references",
)
OOM_KEYS = (
    "rank",
    "device",
    "requested_bytes",
    "total_bytes",
    "free_bytes",
    "allocated_bytes",
    "reserved_bytes",
    "reserved_unallocated_bytes",
    "process_bytes",
    "other_processes_bytes",
    "private_pool_bytes",
    "generation",
)


LAYOUT_FLAGS = {
    "dp": "data parallel size",
    "tp": "tensor parallel size",
    "pp": "pipeline parallel size",
    "cp": "context parallel size",
    "ep": "expert parallel size",
    "etp": "expert tensor parallel size",
    "vpp": "virtual pipeline size",
    "first-stage-layers": "layers on the first pipeline stage",
    "last-stage-layers": "layers on the last pipeline stage",
    "seq-length": "sequence length",
    "micro-batch-size": "micro-batch size",
}
# on/off layout settings, as plan.py takes them (--sp / --no-sp)
SWITCHES = {
    "sp": "sequence parallelism",
    "distributed-optimizer": "Megatron's distributed optimizer",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="diagnose.py",
        allow_abbrev=False,  # (`--gpu` is not a prefix of --gpu-memory-gb)
        description=__doc__.split("\n\n")[0],
        epilog="Example: diagnose.py --log train.log --config train.sh overrides.yaml "
        "--gpu-memory-gb 79.1",
    )
    p.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="FILE",
        help="training log, traceback or OOM message ('-' for stdin); repeatable",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        nargs="+",
        help="the config files the run uses, as they are (several at once: a launch script, "
        "a recipe or YAML, overrides, a DeepSpeed JSON); a pasted command line goes in a file",
    )
    p.add_argument(
        "--experiments",
        metavar="FILE",
        help="ablation results: results.jsonl, CSV or a Markdown table",
    )
    p.add_argument("--memory-stats", metavar="FILE", help="torch.cuda.memory_stats() as JSON")
    p.add_argument("--snapshot", metavar="FILE", help="torch.cuda.memory._snapshot() pickle")
    p.add_argument(
        "--gpu-memory-gb",
        type=float,
        metavar="X",
        help="GPU size in GiB when no OOM message says it",
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="a GPU whose reported memory is known (h100-80gb, a100-40gb, rtx-4090, ...: "
        "plan.py --help lists them), instead of --gpu-memory-gb",
    )
    layout = p.add_argument_group(
        "the layout the --config files leave to the launcher (a scheduler's node count), as "
        "plan.py takes it; a log that prints Megatron's 'using world size' line gives it too"
    )
    for flag, what in LAYOUT_FLAGS.items():
        layout.add_argument(f"--{flag}", type=int, metavar="N", help=what)
    for flag, what in SWITCHES.items():
        layout.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, help=what)
    layout.add_argument(
        "--model",
        metavar="NAME",
        help="the model's shape where the --config files give none (a Hugging Face id, a "
        "preset or a config.json)",
    )
    layout.add_argument(
        "--dtype",
        choices=["bf16", "fp16", "fp32"],
        help="the training dtype where the --config files do not decide it (as plan.py takes it)",
    )
    p.add_argument("--full", action="store_true", help="also include the doctor's full JSON")
    p.add_argument("--timeout", type=float, default=600, help="seconds (default 600)")
    args = p.parse_args(argv)
    if not (args.log or args.config or args.experiments or args.memory_stats or args.snapshot):
        p.error("give at least one of --log, --config, --experiments, --memory-stats, --snapshot")
    return args


def doctor_args(args: argparse.Namespace) -> list[str]:
    out = ["doctor", "--json"]
    for log in args.log:
        out += ["--log", log]
    if args.config:
        out += ["--config", *args.config]
    for flag in ("experiments", "memory_stats", "snapshot"):
        value = getattr(args, flag)
        if value:
            out += ["--" + flag.replace("_", "-"), value]
    if args.gpu_memory_gb is not None:
        out += ["--gpu-memory-gb", str(args.gpu_memory_gb)]
    for flag in (*LAYOUT_FLAGS, "model", "dtype", "gpu"):
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            out += [f"--{flag}", str(value)]
    for flag in SWITCHES:
        value = getattr(args, flag.replace("-", "_"))
        if value is not None:
            out.append(f"--{flag}" if value else f"--no-{flag}")
    return out


def _rk_path() -> str:
    """rk.py as a path that runs from where the agent is (the project, not the skill folder):
    relative where that is short, else absolute."""
    here = Path(__file__).resolve().with_name("rk.py")
    try:
        rel = os.path.relpath(here)
    except ValueError:  # another drive
        return str(here)
    return str(here) if rel.startswith("../..") else rel


def _in_skill_words(value):
    """The kit's commands as the skill runs them: `recompute-kit validate` is `rk.py validate`
    here (recompute-kit is not on the agent's PATH), at rk.py's path from the working folder."""
    if isinstance(value, str):
        return value.replace("recompute-kit ", f"python3 {_rk_path()} ")
    return value


def condense(doc: dict) -> dict:
    findings = [
        {k: _in_skill_words(f.get(k)) for k in FINDING_KEYS if k in f}
        for f in doc.get("findings", [])
    ]
    ev = doc.get("evidence", {})
    evidence = {
        "oom": [{k: o.get(k) for k in OOM_KEYS} for o in ev.get("oom", [])][:8],
        "counts": {
            k: len(ev.get(k) or [])
            for k in ("oom", "iterations", "memory", "errors", "experiments", "notes")
        },
        "config_keys": len(ev.get("config") or {}),
        "sources": ev.get("sources", []),
        "notes": (ev.get("notes") or [])[:10],
    }
    read = ev.get("read")
    if read:  # what the shared reader read from --config, in short: check the assumptions
        evidence["read"] = {
            "framework": read.get("framework"),
            "model_name": read.get("model_name"),
            "assumed": {
                k: {"value": read["config"].get(k), "set_with": s.get("key")}
                for k, s in read.get("sources", {}).items()
                if s.get("from") == "assumed"
            },
            "warnings": read.get("warnings", [])[:10],
        }
    return {
        "ok": True,
        # the verdict leads: diagnosed, needs_evidence (then `collect` says what decides it)
        # or out_of_scope
        "verdict": doc.get("verdict"),
        "verdict_why": doc.get("verdict_why"),
        "collect": [
            {k: _in_skill_words(v) for k, v in item.items()} for item in doc.get("collect", [])
        ],
        "top": findings[0] if findings else None,
        "findings": findings,
        "summary": doc.get("summary"),
        "assumptions": doc.get("assumptions", []),
        # inputs that were not read, or only partly (a config file no reader knows, a --model
        # the kit cannot have): the findings rest on less than was given
        "input_problems": [n for n in ev.get("notes") or [] if n.startswith("config")][:5],
        "evidence": evidence,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stdin = sys.stdin.read() if "-" in args.log else None
    result = run_cli(doctor_args(args), timeout=args.timeout, input_text=stdin)
    if result.get("rc") != 0:
        return emit({"ok": False, "error": cli_error(result), "python": result.get("python")}, 1)
    doc = json.loads(result["stdout"])
    out = condense(doc)
    out["python"] = result.get("python")
    if args.full:
        out["doctor"] = doc
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
