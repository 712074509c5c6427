"""The `recompute-kit` command. Thin: every decision lives in the package.

Human tables by default, `--json` for one JSON document on stdout. Exit 0 when the command did
its job, 1 for invalid input or an impossible goal (one line on stderr, no traceback), 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import (
    ATTENTION_BACKENDS,
    OFFLOAD_MODULES,
    SPEC_HELP,
    Config,
    ConfigError,
    all_specs,
    applicable_modules,
    load_config,
    parse_spec,
)
from .presets import PRESETS, get_preset
from .units import byte_unit, in_unit, integer_bytes

FORMATS = ("megatron-bridge", "megatron-lm", "nemo", "torchtitan")  # export.FORMATS


# --------------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit_json(document: Any) -> None:
    """One JSON document on stdout; byte fields as integers (estimates carry fractions)."""
    json.dump(integer_bytes(document), sys.stdout, indent=2)
    sys.stdout.write("\n")


# --------------------------------------------------------------------------------------------
# Argument types: a bad value is a usage error (exit 2) before any work
# --------------------------------------------------------------------------------------------


def spec_arg(text: str) -> str:
    """A recompute spec, checked when the command line is parsed. `selective:` alone (no
    modules, the control that equals none) is valid."""
    try:
        parse_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def text_file(path: str, flag: str, hint: str, strict: bool = True) -> None:
    """One line for a file that cannot be what the flag wants: missing, empty or binary.
    strict: the file must decode as UTF-8 (configs); otherwise only NUL bytes mark it binary
    (logs may hold a stray non-UTF-8 byte and are still worth reading)."""
    if path == "-":
        return
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc.strerror}") from None
    if not data.strip():
        raise ConfigError(f"{flag} {path} is empty; {hint}")
    if data[:2] == b"\x1f\x8b":
        return  # gzip: the doctor reads compressed logs itself
    where = data.find(b"\x00")
    if strict and where < 0:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = exc.start
    if where >= 0:
        raise ConfigError(f"{flag} {path} is not text (binary data at byte {where}); {hint}")


# --------------------------------------------------------------------------------------------
# Shared argument handling
# --------------------------------------------------------------------------------------------


def add_model_args(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="PRESET", help=f"a preset: {', '.join(PRESETS)}")
    source.add_argument(
        "--config", metavar="FILE", help="a YAML/JSON config (flat or under model:)"
    )


CONFIG_HINT = "give a YAML or JSON config (flat Megatron keys, or under model:)"


def config_from_args(args: argparse.Namespace, default_model: str = "tiny-gpt") -> Config:
    if args.config:
        text_file(args.config, "--config", CONFIG_HINT)
        cfg, warnings = load_config(args.config)
        for warning in warnings:
            print(f"recompute-kit: warning: {warning}", file=sys.stderr)
    else:
        cfg = get_preset(args.model or default_model).config()
    return apply_overrides(cfg, args)


# CLI flag -> Megatron key, for the shape and parallelism overrides.
OVERRIDES = {
    "seq_length": "seq_length",
    "micro_batch_size": "micro_batch_size",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "dp": "data_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "first_stage_layers": "num_layers_in_first_pipeline_stage",
    "last_stage_layers": "num_layers_in_last_pipeline_stage",
    "sp": "sequence_parallel",
    "distributed_optimizer": "use_distributed_optimizer",
    "account_for_embedding": "account_for_embedding_in_pipeline_split",
    "account_for_loss": "account_for_loss_in_pipeline_split",
    "attention": "attention_backend",
}


def add_override_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("overrides (Megatron keys of the model/config)")
    group.add_argument("--seq-length", type=int, metavar="S")
    group.add_argument("--micro-batch-size", type=int, metavar="B")
    for flag, what in (
        ("tp", "tensor"),
        ("pp", "pipeline"),
        ("vpp", "virtual pipeline"),
        ("cp", "context"),
        ("ep", "expert"),
        ("dp", "data"),
    ):
        group.add_argument(f"--{flag}", type=int, metavar="N", help=f"{what} parallel size")
    group.add_argument(
        "--etp", type=int, metavar="N", help="expert tensor parallel size (Megatron: = --tp)"
    )
    group.add_argument(
        "--first-stage-layers",
        type=int,
        metavar="N",
        help="layers on the first pipeline stage (num_layers_in_first_pipeline_stage)",
    )
    group.add_argument(
        "--last-stage-layers",
        type=int,
        metavar="N",
        help="layers on the last pipeline stage (num_layers_in_last_pipeline_stage)",
    )
    for flag, what in (
        ("sp", "sequence parallelism"),
        ("distributed-optimizer", "shard optimizer states over data parallel"),
        ("account-for-embedding", "count the embedding as a layer of the first stage"),
        ("account-for-loss", "count the loss as a layer of the last stage"),
    ):
        group.add_argument(
            f"--{flag}", action=argparse.BooleanOptionalAction, default=None, help=what
        )
    group.add_argument(
        "--stage",
        type=int,
        metavar="N",
        help="pipeline stage to report (default: the stage with the highest total)",
    )
    group.add_argument(
        "--attention",
        choices=ATTENTION_BACKENDS,
        help="Megatron's attention_backend: unfused keeps the s^2 scores; flash, fused and "
        "auto (TE picks flash or fused) keep q, k, v, the output and the softmax statistics",
    )


def apply_overrides(cfg: Config, args: argparse.Namespace) -> Config:
    flat = {
        key: getattr(args, flag)
        for flag, key in OVERRIDES.items()
        if getattr(args, flag, None) is not None
    }
    if getattr(args, "dtype", None) in ("bf16", "fp16", "fp32"):
        flat["bf16"], flat["fp16"] = args.dtype == "bf16", args.dtype == "fp16"
    return cfg.replace(**flat) if flat else cfg


def layout_of(cfg: Config, est: Any = None) -> dict[str, Any]:
    """The parallel layout a per-rank number is for (JSON `layout`)."""
    p = cfg.parallel
    out: dict[str, Any] = {
        "tensor_model_parallel_size": p.tensor_model_parallel_size,
        "sequence_parallel": p.sequence_parallel,
        "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline_model_parallel_size,
        "context_parallel_size": p.context_parallel_size,
        "expert_model_parallel_size": p.expert_model_parallel_size,
        "expert_tensor_parallel_size": p.etp,
        "data_parallel_size": p.data_parallel_size,
        "use_distributed_optimizer": p.use_distributed_optimizer,
    }
    if est is not None:
        out.update(
            stage=est.stage,
            stage_layers=[est.layers[0], est.layers[-1]] if est.layers else [],
            micro_batches_in_flight=est.micro_batches_in_flight,
        )
    return out


def print_layout(cfg: Config, est: Any = None) -> None:
    """One line saying which layout (and stage) the numbers are for, then the assumptions."""
    p = cfg.parallel
    parts = [f"TP{p.tensor_model_parallel_size}" + (" SP" if p.sequence_parallel else "")]
    parts.append(f"PP{p.pipeline_model_parallel_size}")
    if p.virtual_pipeline_model_parallel_size:
        parts.append(f"VPP{p.virtual_pipeline_model_parallel_size}")
    parts += [f"CP{p.context_parallel_size}", f"DP{p.data_parallel_size}"]
    if cfg.model.num_moe_experts:
        parts += [f"EP{p.expert_model_parallel_size}", f"ETP{p.etp}"]
    opt = "on" if p.use_distributed_optimizer else "off"
    line = f"layout: {' '.join(parts)}, distributed optimizer {opt}"
    if est is not None and est.layers:
        which = " (the stage with the highest total)" if est.stage_total_bytes else ""
        line += (
            f"; per rank of pipeline stage {est.stage}{which}: layers {est.layers[0]}-"
            f"{est.layers[-1]}, {est.micro_batches_in_flight:g} micro-batch"
            f"{'' if est.micro_batches_in_flight == 1 else 'es'} in flight"
        )
    print(line)
    for note in cfg.assumptions:
        print(f"assumed: {note}")


def specs_for(cfg: Config, args: argparse.Namespace) -> list[str]:
    """--recompute SPEC ... (repeatable, accumulated) or, by default, the config's own setting.
    A note for selective modules this model does not have: they recompute nothing."""
    specs = list(dict.fromkeys(args.recompute)) if args.recompute else [cfg.recompute.spec]
    note_inapplicable(cfg, specs)
    return specs


def note_inapplicable(cfg: Config, specs: Sequence[str]) -> None:
    present = set(applicable_modules(cfg))
    for spec in specs:
        rc = parse_spec(spec)
        try:
            cfg.with_recompute(rc).validate()
        except ConfigError:
            continue  # the command reports it as the error it is
        absent = [m for m in rc.recompute_modules or [] if m not in present]
        if rc.recompute_granularity == "selective" and absent:
            kind = "MoE" if cfg.model.num_moe_experts else "dense"
            print(
                f"recompute-kit: note: {spec}: this {kind} model has no {', '.join(absent)} "
                "modules, so they recompute nothing here",
                file=sys.stderr,
            )


# --------------------------------------------------------------------------------------------
# Subcommands
# --------------------------------------------------------------------------------------------


def cmd_presets(args: argparse.Namespace) -> int:
    if args.json:
        emit_json(
            {
                "presets": [
                    {
                        "name": p.name,
                        "description": p.description,
                        "runnable": p.runnable,
                        "source": p.source,
                        "config": p.config().to_flat(),
                    }
                    for p in PRESETS.values()
                ]
            }
        )
        return 0
    rows = [
        (
            p.name,
            "yes" if p.runnable else "shape only",
            p.model.num_layers,
            p.model.hidden_size,
            p.model.num_attention_heads,
            p.model.kv_groups,
            p.model.seq_length,
            p.description,
        )
        for p in PRESETS.values()
    ]
    print(
        format_table(
            ["preset", "runs here", "layers", "hidden", "heads", "kv groups", "seq", "description"],
            rows,
        )
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    text_file(args.config_file, "config file", CONFIG_HINT)
    cfg, warnings = load_config(args.config_file)
    errors: list[str] = []
    try:
        warnings += cfg.validate(strict=args.strict)
    except ConfigError as exc:
        errors.append(str(exc))
    if args.json:
        emit_json(
            {
                "valid": not errors,
                "errors": errors,
                "warnings": warnings,
                "normalized": cfg.to_flat(),
            }
        )
    else:
        for warning in warnings:
            print(f"warning: {warning}")
        for error in errors:
            print(f"error: {error}")
        if not errors:
            print(f"valid: {args.config_file} (recompute: {cfg.recompute.spec})")
    return 1 if errors else 0


def verify_table(results: list) -> str:
    unit, scale = byte_unit([r.baseline_saved_activation_bytes for r in results])
    columns = [
        ("recompute", lambda r: r.recompute),
        ("loss equal", lambda r: "yes" if r.loss_match else "NO"),
        ("grads equal", lambda r: "yes" if r.grads_match else "NO"),
        ("max |dgrad|", lambda r: f"{r.max_grad_abs_diff:.3g}"),
        (f"saved act ({unit})", lambda r: f"{r.saved_activation_bytes / scale:.3f}"),
        (
            "saved vs none (%)",
            lambda r: (
                f"{100 * (1 - r.saved_activation_bytes / r.baseline_saved_activation_bytes):.1f}"
            ),
        ),
    ]
    if any(r.offloaded_bytes for r in results):
        columns.append((f"offloaded ({unit})", lambda r: f"{r.offloaded_bytes / scale:.3f}"))
    columns.append(("notes", lambda r: "; ".join(r.notes)))
    return format_table([c[0] for c in columns], [[c[1](r) for c in columns] for r in results])


def cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify  # imports torch: keep `presets`/`validate` fast

    cfg = config_from_args(args)
    if args.model and not get_preset(args.model).runnable:
        raise ConfigError(
            f"preset {args.model!r} is shape-only (too large to run here); verify a runnable "
            f"preset: {', '.join(p.name for p in PRESETS.values() if p.runnable)}"
        )
    if args.cpu_offloading_num_layers:
        cfg = cfg.replace(
            cpu_offloading=True, cpu_offloading_num_layers=args.cpu_offloading_num_layers
        )
    if args.offload_modules:
        cfg = cfg.replace(
            fine_grained_activation_offloading=True, offload_modules=list(args.offload_modules)
        )
    cfg.validate()
    if args.recompute:
        note_inapplicable(cfg, args.recompute)
    results = verify(cfg, args.recompute, device=args.device, dtype=args.dtype, seed=args.seed)
    ok = all(r.loss_match and r.grads_match for r in results)
    if args.json:
        emit_json(
            {
                "model": args.model or args.config,
                "device": args.device,
                "dtype": args.dtype,
                "seed": args.seed,
                "all_match": ok,
                "results": [asdict(r) for r in results],
            }
        )
    else:
        print(verify_table(results))
        where = "on the device " if any(r.offloaded_bytes for r in results) else ""
        print(
            f"\nthe no-recompute step keeps {results[0].baseline_saved_activation_bytes:,} bytes "
            f"{where}for backward; {'every spec matches it bitwise' if ok else 'SOME SPECS DIFFER'}"
        )
    return 0 if ok else 1


def cmd_estimate(args: argparse.Namespace) -> int:
    from .memory.estimate import estimate

    cfg = config_from_args(args)
    cfg.validate()
    results = []
    for spec in specs_for(cfg, args):
        candidate = cfg.with_recompute(spec)
        candidate.validate()
        results.append(estimate(candidate, stage=args.stage))
    if args.json:
        emit_json(
            {
                "layout": layout_of(cfg, results[0]),
                "assumptions": cfg.assumptions,
                "estimates": [e.to_json() for e in results],
            }
        )
        return 0
    unit, scale = byte_unit([e.total_bytes for e in results])
    print(
        format_table(
            [
                "recompute",
                f"act/layer ({unit})",
                f"activations ({unit})",
                f"peak act ({unit})",
                f"weights ({unit})",
                f"grads ({unit})",
                f"optimizer ({unit})",
                f"total ({unit})",
                "recompute FLOPs (%)",
            ],
            [
                (
                    e.recompute,
                    in_unit(e.per_layer_activation_bytes, scale),
                    in_unit(e.activation_bytes, scale),
                    in_unit(e.peak_activation_bytes, scale),
                    in_unit(e.weights_bytes, scale),
                    in_unit(e.grads_bytes, scale),
                    in_unit(e.optimizer_bytes, scale),
                    in_unit(e.total_bytes, scale),
                    f"{100 * e.recompute_flops_fraction:.2f}",
                )
                for e in results
            ],
        )
    )
    print()
    print_layout(cfg, results[0])
    print("bytes per module and layer, every stage's total: --json")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from .memory.measure import measure, measure_fake

    cfg = config_from_args(args)
    cfg.validate()
    if args.engine == "megatron":
        return measure_with_megatron(cfg, args)
    if not args.fake and args.model and not get_preset(args.model).runnable:
        raise ConfigError(
            f"preset {args.model!r} is shape-only; measure it with --fake (meta device, nothing "
            "allocated) or pick a runnable preset"
        )
    results = []
    for spec in specs_for(cfg, args):
        candidate = cfg.with_recompute(spec)
        candidate.validate()
        print(f"measuring {spec} ...", file=sys.stderr)
        if args.fake:
            results.append(measure_fake(candidate, args.dtype))
        else:
            results.append(measure(candidate, args.device, args.dtype or "fp32", args.seed))
    p = cfg.parallel
    whole = (
        "the kit's reference layers on one device: the whole model, no TP/PP/CP/EP split "
        "(per rank: --engine megatron, or estimate)"
    )
    parallel = max(
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.context_parallel_size,
        p.expert_model_parallel_size,
    )
    if args.json:
        emit_json({"engine": "kit", "note": whole, "measurements": [r.to_json() for r in results]})
        return 0
    unit, scale = byte_unit([r.peak_activation_bytes for r in results])
    print(
        format_table(
            [
                "recompute",
                "device",
                f"act/layer ({unit})",
                f"activations ({unit})",
                f"peak act ({unit})",
            ],
            [
                (
                    r.recompute,
                    r.device,
                    f"{r.per_layer_activation_bytes / scale:.3f}",
                    f"{r.activation_bytes / scale:.3f}",
                    f"{r.peak_activation_bytes / scale:.3f}",
                )
                for r in results
            ],
        )
    )
    if parallel > 1:
        print(f"\nnote: {whole}")
    return 0


def measure_with_megatron(cfg: Config, args: argparse.Namespace) -> int:
    """`measure --engine megatron`: real Megatron-Core, per rank."""
    from .engines import megatron

    if not megatron.available():
        raise ConfigError(
            "megatron-core is not installed: pip install megatron-core==0.16.1 (make setup)"
        )
    dtype = args.dtype or ("bf16" if cfg.model.bf16 else "fp32")
    rows = []
    for spec in specs_for(cfg, args):
        candidate = cfg.with_recompute(spec)
        candidate.validate()
        print(f"measuring {spec} with Megatron-Core ...", file=sys.stderr)
        if args.fake:
            ranks = [megatron.measure_one_rank(candidate, dtype, args.stage or 0)]
        else:
            ranks = megatron.measure(candidate, dtype, args.seed)
        rows += [(spec, r) for r in ranks]
    if args.json:
        emit_json(
            {
                "engine": "megatron-core",
                "layout": layout_of(cfg),
                "assumptions": cfg.assumptions,
                "measurements": [{"recompute": spec, **r.to_json()} for spec, r in rows],
            }
        )
        return 0
    unit, scale = byte_unit([max(r.saved_per_layer, default=0) for _, r in rows])
    print(
        format_table(
            ["recompute", "rank", "stage", "layers", f"act/layer ({unit})", "parameters"],
            [
                (
                    spec,
                    r.rank,
                    r.pp_rank,
                    f"{r.layer_numbers[0]}-{r.layer_numbers[-1]}" if r.layer_numbers else "-",
                    in_unit(sum(r.saved_per_layer) / len(r.saved_per_layer), scale)
                    if r.saved_per_layer
                    else "not run",
                    f"{r.parameters:,}",
                )
                for spec, r in rows
            ],
        )
    )
    print()
    print_layout(cfg)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import plan

    cfg = config_from_args(args)
    cfg.validate()
    try:
        result = plan(cfg, args.gpu_memory_gb, args.safety_margin, args.format, args.stage)
    except ConfigError as exc:
        if args.json:  # a document even when nothing fits: scripts read stdout
            emit_json(
                {
                    "fits": False,
                    "error": str(exc),
                    "best": None,
                    "candidates": [],
                    "layout": layout_of(cfg),
                    "assumptions": cfg.assumptions,
                }
            )
        raise
    if args.json:
        emit_json(
            {
                "fits": True,
                "layout": layout_of(cfg, result.best.estimate),
                "assumptions": cfg.assumptions,
                "budget_bytes": result.budget_bytes,
                "usable_bytes": result.usable_bytes,
                "candidates": [c.to_json() for c in result.candidates],
                "best": result.best.to_json(),
                "explanation": result.explanation,
                "rendered": result.rendered,
            }
        )
        return 0
    shown = result.candidates[: args.top]
    unit, scale = byte_unit([c.estimate.total_bytes for c in shown])
    print(
        format_table(
            [
                "recompute",
                "offload",
                "fits",
                f"total ({unit})",
                f"peak act ({unit})",
                "recompute FLOPs (%)",
            ],
            [
                (
                    c.estimate.recompute,
                    c.offload or "-",
                    "yes" if c.fits else "no",
                    in_unit(c.estimate.total_bytes, scale, 2),
                    in_unit(c.estimate.peak_activation_bytes, scale, 2),
                    f"{100 * c.estimate.recompute_flops_fraction:.2f}",
                )
                for c in shown
            ],
        )
    )
    hidden = len(result.candidates) - len(shown)
    if hidden:
        print(f"({hidden} more candidates: --top N or --json)")
    print()
    print_layout(cfg, result.best.estimate)
    print(f"\n{result.explanation}\n\n{result.rendered}", end="")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from .ablation import AblationSetup, run_ablation

    cfg = config_from_args(args)
    cfg.validate()
    name = args.model or args.config or "tiny-gpt"
    if args.command_template:
        from .external import external_runner

        runner = external_runner(args.command_template, args.timeout, args.out)
    else:
        if args.model and not get_preset(args.model).runnable:
            raise ConfigError(
                f"preset {args.model!r} is shape-only; ablate a runnable preset here, or your own "
                "training with --command-template"
            )
        from .ablation import run_config as runner
    setup = AblationSetup(
        config=cfg,
        name=name,
        specs=specs_for(cfg, args) if args.recompute else all_specs(cfg),
        steps=args.steps,
        warmup=args.warmup,
        device=args.device,
        dtype=args.dtype,
        memory_budget_gb=args.memory_budget_gb,
        golden=None if args.golden_tflops is not None else args.golden,
        golden_tflops=args.golden_tflops,
        regression_threshold=args.regression_threshold,
        cpu_threads=args.cpu_threads,
    )
    rows = run_ablation(setup, args.out, resume=args.resume, runner=runner)
    if args.json:
        emit_json({"out": args.out, "rows": rows})
    else:
        print((Path(args.out) / "summary.md").read_text(), end="")
        print(f"\nresults: {Path(args.out) / 'results.jsonl'}; plots: {args.out}/*.png")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor.engine import diagnose
    from .doctor.evidence import EvidenceError, collect

    logs = list(args.log or [])
    stdin_text = sys.stdin.read() if "-" in logs else None
    if not (logs or args.config or args.experiments or args.memory_stats or args.snapshot):
        raise ConfigError(
            "give the doctor something to read: --log FILE (or -), --config FILE, "
            "--experiments FILE, --memory-stats FILE or --snapshot FILE"
        )
    log_hint = (
        "pass the training log as text (stdout/stderr of the run, or the OOM message); "
        "a memory snapshot pickle goes to --snapshot"
    )
    for path in logs:
        text_file(path, "--log", log_hint, strict=False)
    if stdin_text is not None and not stdin_text.strip():
        raise ConfigError(f"--log - (stdin) is empty; {log_hint}")
    if args.config:
        text_file(
            args.config,
            "--config",
            "give a YAML/JSON config or a Megatron command line",
            strict=False,
        )
    try:
        evidence = collect(
            logs,
            args.config,
            args.experiments,
            args.memory_stats,
            args.snapshot,
            stdin_text=stdin_text,
        )
    except EvidenceError as exc:
        raise ConfigError(str(exc)) from None
    diagnosis = diagnose(evidence, args.gpu_memory_gb)
    if args.json:
        emit_json(diagnosis.to_json())
        return 0
    print(diagnosis.summary)
    for f in diagnosis.findings:
        print(f"\n[{f.rule}] {f.title}  ({f.category}, confidence {f.confidence:.0%})")
        print(f"  evidence: {f.evidence}")
        print(f"  cause:    {f.cause}")
        print(f"  confirm:  {f.confirm}")
        print(f"  fix:      {f.fix}")
        if f.config_patch:
            print(f"  patch:    {json.dumps(f.config_patch)}")
    for note in diagnosis.assumptions + evidence.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from .doctor.rules import RULES, catalog_markdown

    if args.markdown:
        sys.stdout.write(catalog_markdown())
    elif args.json:
        emit_json({"rules": [r.doc() for r in RULES]})
    else:
        print(
            format_table(["id", "category", "title"], [(r.id, r.category, r.title) for r in RULES])
        )
    return 0


# --------------------------------------------------------------------------------------------
# Parser and entry point
# --------------------------------------------------------------------------------------------


def add_recompute_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--recompute",
        metavar="SPEC",
        nargs="+",
        action="extend",
        type=spec_arg,
        help=f"{what}Repeatable: every --recompute adds its specs. {SPEC_HELP}",
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

    p = sub.add_parser("validate", help="check a config file against Megatron-Core's rules")
    p.add_argument("config_file", metavar="CONFIG", help="YAML or JSON, flat or under model:")
    p.add_argument(
        "--strict",
        action="store_true",
        help="also apply the rules only Megatron-LM's command line enforces",
    )
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
    p.add_argument(
        "--gpu-memory-gb",
        type=positive_float,
        required=True,
        metavar="X",
        help="memory per GPU in GiB (80 for an 80 GB H100)",
    )
    p.add_argument(
        "--safety-margin",
        type=float,
        default=0.1,
        metavar="F",
        help="fraction of the GPU kept free for the allocator and NCCL (default 0.1)",
    )
    p.add_argument(
        "--format",
        default="megatron-bridge",
        choices=FORMATS,
        help="the config snippet to print (default megatron-bridge)",
    )
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="training dtype")
    p.add_argument("--top", type=positive_int, default=12, help="rows of the table (default 12)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
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
        help="YAML/JSON config, Megatron-LM command line or Hydra overrides",
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
    p.add_argument(
        "--gpu-memory-gb",
        type=positive_float,
        metavar="X",
        help="GPU size in GiB when no OOM message says it",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_doctor)

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
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"recompute-kit: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("recompute-kit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
