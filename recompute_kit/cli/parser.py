"""The `recompute-kit` argument parser and entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..config import (
    OFFLOAD_MODULES,
    SPEC_HELP,
    ConfigError,
)
from ..export import FORMATS
from ..gpus import GPUS, gpu_names
from . import common
from .commands import (
    cmd_ablate,
    cmd_doctor,
    cmd_estimate,
    cmd_measure,
    cmd_models,
    cmd_notebook,
    cmd_plan,
    cmd_presets,
    cmd_read,
    cmd_rules,
    cmd_validate,
    cmd_verify,
)
from .common import (
    add_model_args,
    add_override_args,
    positive_float,
    positive_int,
    spec_arg,
)
from .levers import add_lever_args


def add_recompute_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--recompute",
        metavar="SPEC",
        nargs="+",
        action="extend",
        type=spec_arg,
        help=f"{what}Repeatable: every --recompute adds its specs. {SPEC_HELP}",
    )


def add_version_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--megatron-core-version",
        metavar="X.Y",
        help="the Megatron-Core version the run uses (else what the config says; unknown: "
        "settings broken in any version are avoided, e.g. full:uniform:N with N not dividing "
        "a pipeline chunk's layers before 0.17)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recompute-kit",
        description="Choose, verify and measure activation recomputation settings "
        "(Megatron-Core semantics).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("presets", help="list the named model shapes")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser(
        "read", help="what the reader reads from your files: every value and where it came from"
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="FILE",
        help="config files as you train with them (several at once; later ones win) and / or "
        "model ids (none: --model alone)",
    )
    p.add_argument("--model", metavar="NAME", help="a model id giving the shape")
    add_override_args(p, stage=False)  # the layout as estimate / plan / doctor take it (--dp)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("models", help="the model registry: public models by Hugging Face id")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("validate", help="check a config against Megatron-Core's rules")
    p.add_argument(
        "config_file",
        metavar="CONFIG",
        nargs="*",
        help="the config files you train with (any format `read` takes); none with --model: "
        "the model at Megatron-Core's defaults and the options given",
    )
    p.add_argument("--model", metavar="NAME", help="a model id giving the shape")
    p.add_argument(
        "--strict",
        action="store_true",
        help="also apply the rules only Megatron-LM's command line enforces, and warn about "
        "settings broken on the Megatron-Core version or ignored by Megatron",
    )
    p.add_argument(
        "--recompute",
        metavar="SPEC",
        help="validate this recompute setting instead of the files' (a spec as `estimate` "
        "takes it: selective:moe_act, full:block:7, none)",
    )
    add_override_args(p)  # the layout as estimate / plan take it (--dp for a scheduler's nodes)
    add_version_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("verify", help="prove each recompute spec gives the same loss and grads")
    add_model_args(p)
    add_recompute_arg(p, "specs to check (default: every valid spec). ")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--cpu-offloading-num-layers",
        type=int,
        metavar="N",
        help="offload the saved activations of the first N layers (cpu_offloading)",
    )
    p.add_argument(
        "--offload-modules",
        nargs="+",
        metavar="MOD",
        help=f"fine-grained activation offloading of: {', '.join(OFFLOAD_MODULES)}",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("estimate", help="analytic memory per rank for recompute specs")
    add_model_args(p)
    add_override_args(p)
    add_recompute_arg(p, "")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="training dtype")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser("measure", help="measure saved activations and the peak of a real step")
    add_model_args(p)
    add_override_args(p)
    add_recompute_arg(p, "")
    p.add_argument(
        "--fake",
        action="store_true",
        help="shape-only run on the meta device: any model size, nothing allocated",
    )
    p.add_argument(
        "--engine",
        choices=["kit", "megatron"],
        default="kit",
        help="kit: the reference layers on one device (the whole model); megatron: real "
        "Megatron-Core per rank (gloo processes on a CPU; with --fake one rank of N on the "
        "meta device)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser("plan", help="the cheapest recompute setting that fits a GPU")
    add_model_args(p)
    add_override_args(p)
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument(
        "--gpu-memory-gb",
        type=positive_float,
        metavar="X",
        help="memory per GPU in GiB as the GPU reports it (torch.cuda.mem_get_info's total, "
        "the 'total capacity' of PyTorch's OOM message: about 79.1 for an H100 80GB, not 80)",
    )
    budget.add_argument(
        "--gpu",
        choices=gpu_names(),
        metavar="NAME",
        help="a GPU whose reported memory is known: "
        + ", ".join(f"{g.name} ({g.usable_gib:g} GiB)" for g in GPUS.values()),
    )
    add_version_arg(p)
    p.add_argument(
        "--safety-margin",
        type=float,
        default=0.1,
        metavar="F",
        help="fraction of the GPU kept free for the allocator and NCCL (default 0.1)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="the config snippet to print (default: the framework the inputs were read as: "
        "megatron-lm, nemo, torchtitan, hf-trainer, or llama-factory for a LLaMA-Factory YAML; "
        "megatron-bridge otherwise)",
    )
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="training dtype")
    p.add_argument("--top", type=positive_int, default=12, help="rows of the table (default 12)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    add_lever_args(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("ablate", help="run a grid of recompute settings: throughput, memory")
    add_model_args(p)
    add_override_args(p)
    add_recompute_arg(p, "specs to run (default: every valid spec). ")
    p.add_argument(
        "--steps",
        type=positive_int,
        default=20,
        help="timed rounds per config, interleaved over the configs (default 20; from 6 on the "
        "interval of the median reaches 95%% confidence)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument(
        "--cpu-threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="torch threads on CPU (default 1: steadier timings on a shared machine)",
    )
    p.add_argument(
        "--memory-budget-gb",
        type=positive_float,
        metavar="X",
        help="GiB per GPU: CUDA caps the process; CPU marks configs above it OOM",
    )
    golden = p.add_mutually_exclusive_group()
    golden.add_argument(
        "--golden",
        default="none",
        type=spec_arg,
        metavar="SPEC",
        help="the reference config for 'vs golden' (default none)",
    )
    golden.add_argument(
        "--golden-tflops",
        type=positive_float,
        metavar="X",
        help="a reference TFLOP/s/GPU instead of a run",
    )
    p.add_argument(
        "--regression-threshold",
        type=float,
        default=0.10,
        metavar="F",
        help="slower than golden by more than this is a perf regression (0.10)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="results.jsonl, summary.md, PNGs")
    p.add_argument("--resume", action="store_true", help="skip configs already in DIR")
    p.add_argument(
        "--command-template",
        metavar="CMD",
        help="run your own training per config; placeholders {megatron_lm}, "
        "{bridge}, {spec}, {recompute_granularity}, ... (see README)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=3600,
        metavar="S",
        help="seconds per config for --command-template (default 3600)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("doctor", help="diagnose OOMs and recompute problems from real artefacts")
    p.add_argument(
        "--log",
        action="append",
        metavar="FILE",
        help="a training log, traceback or OOM message ('-' for stdin); repeatable",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        nargs="+",
        help="the config files you train with, any format `recompute-kit read` takes "
        "(several at once); a pasted command line or Hydra overrides go in a file",
    )
    p.add_argument(
        "--experiments",
        metavar="FILE",
        help="ablation results: the kit's results.jsonl, CSV or a Markdown table",
    )
    p.add_argument("--memory-stats", metavar="FILE", help="torch.cuda.memory_stats() as JSON")
    p.add_argument(
        "--snapshot",
        metavar="FILE",
        help="torch.cuda.memory._snapshot() pickle (read without running code)",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--gpu-memory-gb",
        type=positive_float,
        metavar="X",
        help="GPU size in GiB when no OOM message says it",
    )
    budget.add_argument(
        "--gpu",
        choices=gpu_names(),
        metavar="NAME",
        help="a GPU whose reported memory is known, as plan takes it: " + ", ".join(gpu_names()),
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument(
        "--model",
        metavar="NAME",
        help="the model's shape where the --config files give none (a preset, a registered "
        "model, a Hugging Face id or a config.json), as estimate and plan take it",
    )
    # the layout a launch script leaves to the scheduler (--dp), as estimate and plan take it
    add_override_args(p, stage=False)
    p.add_argument(
        "--dtype",
        choices=["bf16", "fp16", "fp32"],
        help="the training dtype where the config files do not decide it (as plan takes it)",
    )
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser(
        "notebook",
        help="run the OOM-diagnosis or ablation notebook in batch (papermill)",
        description="Run a notebook with papermill: a bad parameter is one line, and a failed "
        "run leaves no output notebook. Its report lands in the notebook's out_dir.",
    )
    p.add_argument("name", choices=["oom", "ablation"], help="which notebook")
    p.add_argument("output", metavar="OUT.ipynb", help="the executed notebook to write")
    p.add_argument(
        "-p",
        dest="pairs",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a parameter, as papermill -p reads it (None, True, numbers, else a string)",
    )
    p.add_argument("-y", dest="yaml_text", metavar="YAML", help="parameters as a YAML mapping")
    p.add_argument("-f", dest="yaml_file", metavar="FILE", help="parameters from a YAML file")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_notebook)

    p = sub.add_parser("rules", help="the doctor's rule catalog")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON document on stdout")
    out.add_argument(
        "--markdown",
        action="store_true",
        help="the symptom/cause/confirm/fix table the agent skill ships",
    )
    p.set_defaults(func=cmd_rules)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except BrokenPipeError:  # `--help | head`: stop quietly
        sys.stderr.close()
        return 0
    # this command's documents only: main() runs many times in one process (tests, notebooks)
    written = common.documents_on_stdout
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"recompute-kit: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False) and common.documents_on_stdout == written:
            common.emit_json({"error": str(exc)})  # scripts read stdout: one document, always
        return 1
    except KeyboardInterrupt:
        print("recompute-kit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        sys.stderr.close()
        return 0
