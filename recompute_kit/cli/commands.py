"""The `recompute-kit` subcommands, one `cmd_*` function each. Thin: every decision lives in
the package; torch-dependent modules are imported inside the commands that run a model."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from ..config import (
    Config,
    ConfigError,
    all_specs,
    parse_spec,
)
from ..config.validation import batch_split_problem
from ..config.versions import held_beyond_estimate, ignored_settings, known_broken, parse_version
from ..export_layout import changed_settings, nemo_rl_companions
from ..plan.margins import planned_bytes
from ..presets import PRESETS
from ..units import byte_unit, in_unit
from .breakdown import loss_at_peak_bytes, loss_line, overhead_terms, overheads_line, step_line
from .common import (
    config_from_args,
    default_format,
    emit_json,
    emit_json_read,
    format_table,
    input_name,
    inputs_alone,
    inputs_read,
    inputs_spelling,
    layer_span,
    layout_of,
    note_inapplicable,
    override_values,
    print_layout,
    shape_only,
    specs_for,
    text_file,
    validate_run,
    with_layout_assumptions,
)


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


def cmd_read(args: argparse.Namespace) -> int:
    """Every memory-relevant value of the inputs, beside where it came from."""
    from ..sources.resolve import resolve
    from ..sources.summary import summary_lines, table_rows

    if not args.inputs and not args.model:
        raise ConfigError("read: give the config files, a model id, or --model NAME")
    resolved = resolve(
        args.inputs, model=args.model, overrides=override_values(args), require_shape=False
    )
    if args.json:
        emit_json(resolved.to_json())
        return 0
    print(format_table(["field", "value", "from"], table_rows(resolved.reading)))
    print()
    for line in summary_lines(resolved.reading, resolved.inputs):
        print(line)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from ..sources.registry import list_models

    models = list_models()
    if args.json:
        emit_json({"models": [{"id": i, "source": src} for i, src in models]})
        return 0
    print(format_table(["id", "source"], models))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from ..sources.reading import FROM_ASSUMED, FROM_DEFAULT
    from ..sources.resolve import resolve
    from ..sources.summary import summary_lines

    try:
        if not args.config_file and not args.model:
            raise ConfigError("give the config files you train with, or --model NAME")
        resolved = resolve(args.config_file, model=args.model, overrides=override_values(args))
    except ConfigError as exc:
        if args.json:  # a document even when the layout is refused: scripts read stdout
            emit_json(
                {
                    "valid": False,
                    "errors": [str(exc)],
                    "warnings": [],
                    "normalized": None,
                    "read": None,
                }
            )
        raise
    cfg = resolved.config
    if args.megatron_core_version:
        cfg.megatron_core_version = args.megatron_core_version
    if args.recompute:  # the setting to check, in place of the files' own
        try:
            cfg = cfg.with_recompute(parse_spec(args.recompute))
        except ConfigError as exc:
            print(f"recompute-kit: error: --recompute {args.recompute}: {exc}", file=sys.stderr)
            return 2
    warnings = list(resolved.warnings)
    if not args.json:
        for line in summary_lines(resolved.reading, resolved.inputs):
            if not line.startswith("  warning:"):
                print(line)
    errors: list[str] = []
    try:
        modules = resolved.reading.origins.get("recompute_modules")
        given = modules is not None and modules.kind not in (FROM_DEFAULT, FROM_ASSUMED)
        # (`recompute_modules = None` written is Megatron's default list, not a choice)
        given = given and resolved.reading.get("recompute_modules") is not None
        given = given and not args.recompute
        # a Megatron-LM script runs under Megatron-LM's own argument checks: they apply to it
        framework = resolved.reading.framework
        strict = args.strict or framework == "megatron-lm"
        if strict and framework not in (None, "megatron-lm", "megatron-core"):
            # Megatron-LM's command-line rules bind only runs its arguments.py parses: another
            # framework's run that breaks one is told so, not refused
            try:
                cfg.validate(strict=True, modules_given=given)
            except ConfigError as exc:
                warnings.append(
                    f"Megatron-LM's command line refuses: {exc} ({framework} does "
                    "not run Megatron-LM's argument checks)"
                )
                strict = False
        warnings += cfg.validate(strict=strict, modules_given=given)
        # (checked where the batch and the layout were read, not assumed: a data-parallel size
        # the kit assumed is no reason to refuse the run)
        if _batch_and_layout_read(resolved.reading) and (problem := batch_split_problem(cfg)):
            raise ConfigError(problem)
        if not strict:  # what Megatron accepts but does not act on is said either way
            written = cfg.recompute.recompute_modules if given else None
            warnings += [w for w in ignored_settings(cfg, written) if w not in warnings]
            version = parse_version(cfg.megatron_core_version)
            warnings += [w for w in held_beyond_estimate(cfg, version) if w not in warnings]
    except ConfigError as exc:
        errors.append(str(exc))
    if args.recompute:  # a setting the run's own keys cannot write is no choice for it
        from ..export import format_for
        from ..plan.search import unexpressible

        reading = resolved.reading
        why = unexpressible(cfg.recompute, format_for(reading.framework, reading.format))
        if why:
            errors.append(f"--recompute {args.recompute}: {why}")
    if not errors and cfg.megatron_core_version is not None:
        # Megatron's checks accept these, but on the version named the run fails (an
        # IndexError at the first step): not a valid setting for that run
        for line in known_broken(cfg, parse_version(cfg.megatron_core_version)):
            warnings = [w for w in warnings if w != line]
            errors.append(f"{line} (Megatron's checks accept it; the run fails on this version)")
    if not args.json:  # the summary above said the assumptions already
        warnings = [w for w in warnings if not w.startswith("assumed: ")]
    if args.json:
        emit_json(
            {
                "valid": not errors,
                "errors": errors,
                "warnings": warnings,
                "normalized": cfg.to_flat(),
                "read": resolved.to_json(),
            }
        )
    else:
        for warning in warnings:
            print(f"warning: {warning}")
        for error in errors:
            print(f"error: {error}")
        if not errors:
            names = ", ".join(args.config_file) or args.model
            print(f"valid: {names} (recompute: {cfg.recompute.spec})")
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
    from ..verify import verify  # imports torch: keep `presets`/`validate` fast

    cfg = config_from_args(args)
    if shape_only(args):
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
        emit_json_read(
            args,
            {
                "model": input_name(args),
                "device": args.device,
                "dtype": args.dtype,
                "seed": args.seed,
                "all_match": ok,
                "results": [asdict(r) for r in results],
            },
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
    from ..memory.estimate import estimate

    cfg = validate_run(config_from_args(args, shows_layout=True), not args.recompute)
    from ..plan.search import unexpressible

    results, rejected = [], []
    specs = specs_for(cfg, args)
    # a what-if the run's keys cannot write is estimated, and said (its format: the inputs')
    fmt = default_format(args) if args.recompute and getattr(args, "resolved", None) else None
    for spec in specs:
        candidate = cfg.with_recompute(spec)
        try:
            candidate.validate()
        except ConfigError as exc:
            if len(specs) == 1:
                raise
            # one spec Megatron refuses does not stop the others: it is said and skipped
            rejected.append({"recompute": spec, "error": str(exc)})
            print(f"recompute-kit: note: {spec} not estimated: {exc}", file=sys.stderr)
            continue
        if fmt and (why := unexpressible(candidate.recompute, fmt)):
            print(f"recompute-kit: note: {spec}: {why}", file=sys.stderr)
        shown = estimate(candidate, stage=args.stage)
        if args.stage is not None:  # every stage's totals beside the stage asked for
            every = estimate(candidate)
            shown.stage_total_bytes = every.stage_total_bytes
            shown.stage_held_bytes = every.stage_held_bytes
        results.append(shown)
    if not results:
        raise ConfigError(rejected[0]["error"])
    if args.json:
        emit_json_read(
            args,
            {
                "layout": layout_of(cfg, results[0]),
                # the config's, then what the estimates assume (each estimate says its own in
                # overhead_assumptions): one list, as `plan` gives it
                "assumptions": [
                    *cfg.assumptions,
                    *dict.fromkeys(a for e in results for a in e.overhead_assumptions),
                ],
                "estimates": [e.to_json() for e in results],
                "rejected": rejected,
            },
        )
        return 0
    unit, scale = byte_unit([e.total_bytes for e in results])
    # each row is its own worst stage: where they differ, the table says which
    stages = len({e.stage for e in results}) > 1
    # what `plan` compares, where the rank holds more than its total (MoE imbalance, FSDP's
    # gathered weights): a column of its own
    held = any(e.held_bytes != e.total_bytes for e in results)
    print(
        format_table(
            [
                "recompute",
                *(["stage"] if stages else []),
                f"act/layer ({unit})",
                f"activations ({unit})",
                f"peak act ({unit})",
                f"weights ({unit})",
                f"grads ({unit})",
                f"optimizer ({unit})",
                f"total ({unit})",
                *([f"held ({unit})"] if held else []),
                f"logits/loss ({unit})",
                f"overheads ({unit})",
                f"total+overheads ({unit})",
                "recompute FLOPs (%)",
            ],
            [
                (
                    e.recompute,
                    *([str(e.stage)] if stages else []),
                    in_unit(e.per_layer_activation_bytes, scale),
                    in_unit(e.activation_bytes, scale),
                    in_unit(e.peak_activation_bytes, scale),
                    in_unit(e.weights_bytes, scale),
                    in_unit(e.grads_bytes, scale),
                    in_unit(e.optimizer_bytes, scale),
                    in_unit(e.total_bytes, scale),
                    *([in_unit(e.held_bytes, scale)] if held else []),
                    in_unit(loss_at_peak_bytes(e), scale) if e.logits_shape else "-",
                    in_unit(e.overhead_bytes, scale),
                    in_unit(e.total_with_overheads_bytes, scale),
                    f"{100 * e.recompute_flops_fraction:.2f}",
                )
                for e in results
            ],
        )
    )
    # what the columns beyond the model states hold, named (cli/breakdown.py)
    last = next((e for e in results if e.logits_shape), None)
    if last is not None:
        print(loss_line(last, [e.recompute for e in results if e.loss_sets_peak]))
    if (step := step_line(results)) is not None:
        print(step)
    if held:
        print(
            "held: the total and what the rank holds beside it (MoE routing imbalance, gathered "
            "or autocast weight copies): what `plan` compares with the usable memory"
        )
    elementwise = {"layernorm", "moe_act"}
    if any(
        set(e.recompute.split(":")[1].split(",")) & elementwise
        for e in results
        if e.recompute.startswith("selective:")
    ):
        print(
            "recompute FLOPs: the matmuls replayed; layernorm and moe_act replay elementwise "
            "kernels (memory-bound: time the FLOPs do not show)"
        )
    same = len({tuple(overhead_terms(e).items()) for e in results}) == 1
    for e in results[:1] if same else results:
        print(overheads_line(e))
    print()
    print_layout(cfg, None if stages else results[0])
    if stages:
        print("per rank of the stage that holds the most in each row (column stage); --stage N")
    if cfg.parallel.pipeline_model_parallel_size > 1:
        # a skill trial read +2.7% for a setting that costs the step 17% (its dense layers on
        # another stage): the step waits for the slowest stage
        print(
            "recompute FLOPs (%): that stage's; the step's cost is the slowest stage's "
            "(`plan` ranks by it, `plan --levers` times it)"
        )
    print("bytes per module and layer, every stage's total: --json")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from ..memory.measure import measure, measure_fake

    cfg = config_from_args(args, shows_layout=True)
    cfg.validate()
    if args.engine == "megatron":
        return measure_with_megatron(cfg, args)
    if not args.fake and shape_only(args):
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
    if args.fake and cfg.model.attention_backend != "unfused":
        # meta tensors take scaled_dot_product_attention's math kernel, which saves the
        # [b, heads, s, s] probabilities for backward; a flash / TE kernel keeps none
        whole += (
            "; on the meta device attention runs torch's math kernel, which keeps the "
            "[b, heads, s, s] scores a flash or fused kernel does not: core_attn and the "
            f"per-layer bytes are over-counted against the run's {cfg.model.attention_backend} "
            "attention (estimate counts that kernel)"
        )
    parallel = max(
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.context_parallel_size,
        p.expert_model_parallel_size,
    )
    if args.json:
        emit_json_read(
            args, {"engine": "kit", "note": whole, "measurements": [r.to_json() for r in results]}
        )
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
    from ..engines import megatron

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
        emit_json_read(
            args,
            {
                "engine": "megatron-core",
                "layout": layout_of(cfg),
                "assumptions": cfg.assumptions,
                "measurements": [{"recompute": spec, **r.to_json()} for spec, r in rows],
            },
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


def _layout_hint(args, cfg, gib, version, nothing_fits: bool = False) -> dict | None:
    """`cli.levers.layout_hint` where the inputs allow it (not for a pipeline stage asked
    for alone, where the levers' whole-step view does not apply)."""
    if args.stage is not None:
        return None
    from .levers import layout_hint

    return layout_hint(args, cfg, gib, version)


def cmd_plan(args: argparse.Namespace) -> int:
    from ..gpus import GPUS
    from ..plan import plan

    cfg = validate_run(config_from_args(args, shows_layout=True), False)
    gpu = GPUS[args.gpu] if args.gpu else None
    gib = gpu.usable_gib if gpu else args.gpu_memory_gb
    version = args.megatron_core_version or cfg.megatron_core_version
    if args.levers:
        from .levers import cmd_levers

        return cmd_levers(args, cfg, gib, version)
    # a model alone (no config file) says no layout: what the command line gives is the
    # layout, written whole (an override equal to an assumed default too)
    given = inputs_alone(args) if args.config else None
    read = inputs_read(args) if given is None and args.config else None
    changes = changed_settings(cfg, given, override_values(args), read)
    if default_format(args) == "nemo-rl":
        nemo_rl_companions(cfg, changes)
    titan = default_format(args) in ("torchtitan", "torchtitan-registry")
    p = cfg.parallel
    megatron_reading = cfg.model.loss_implementation != "torchtitan" and not p.zero_stage
    if titan and megatron_reading and p.data_parallel_size > 1 and not args.json:
        # a Megatron reading rendered for torchtitan: its figures are not FSDP2's
        print(
            "recompute-kit: note: the figures are this config's (weights and gradients "
            "whole on every data-parallel rank); torchtitan shards them and the optimizer "
            "states over those ranks by default (FSDP2, data_parallel_shard_degree -1): "
            "give its TOML (or `--config` a torchtitan registry) for its figures",
            file=sys.stderr,
        )
    if titan and {"micro_batch_size", "data_parallel_size"} & set(changes):
        # the step's global batch stays: torchtitan's -1 would follow local x DP instead
        before = given or cfg
        global_batch = getattr(args, "global_batch_size", None) or before.parallel.global_batch_size
        if global_batch:
            changes["global_batch_size"] = global_batch
        elif not args.json:
            print(
                "recompute-kit: note: the local batch or DP changes and the inputs give no "
                "global batch: torchtitan's -1 (global_batch_size, in a registry "
                "training.num_tokens_per_train_step) follows local x DP; give "
                "--global-batch-size to keep the step's batch in the rendered config",
                file=sys.stderr,
            )
    try:
        result = plan(
            cfg,
            gib,
            args.safety_margin,
            default_format(args),
            args.stage,
            version,
            changes,
            inputs_spelling(args),
        )
    except ConfigError as exc:
        exc = with_layout_assumptions(exc, cfg)
        hint = _layout_hint(args, cfg, gib, version, nothing_fits=True)
        if hint:
            from .levers import hint_line

            exc = ConfigError(f"{exc}; {hint_line(hint)}")
        if args.json:  # a document even when nothing fits: scripts read stdout
            emit_json_read(
                args,
                {
                    "fits": False,
                    "error": str(exc),
                    "best": None,
                    "candidates": [],
                    "layout": layout_of(cfg),
                    "assumptions": cfg.assumptions,
                    "better_layout": hint,
                },
            )
        raise exc from None
    # recompute that costs, or offloading: a layout (`plan --levers`) may do better
    costly = result.best.step_cost > 0.02 or bool(result.best.offload)
    hint = _layout_hint(args, cfg, gib, version) if costly else None
    if args.json:
        emit_json_read(
            args,
            {
                "fits": True,
                "layout": layout_of(cfg, result.best.estimate),
                # the config's, then what the chosen estimate itself assumes (dropless MoE
                # routing balanced, a dispatcher's buffers not modelled, ...); the CUDA context
                # and NCCL's buffers are the plan's band and safety margin (its explanation)
                "assumptions": [
                    *cfg.assumptions,
                    *(
                        a
                        for a in result.best.estimate.overhead_assumptions
                        if not a.startswith(("CUDA context", "NCCL buffers"))
                    ),
                ],
                "budget_bytes": result.budget_bytes,
                "usable_bytes": result.usable_bytes,
                "gpu": None
                if gpu is None
                else {"name": gpu.name, "usable_gib": gpu.usable_gib, "source": gpu.source},
                "megatron_core_version": result.megatron_core_version,
                "headroom_bytes": result.headroom_bytes,
                "error_band_bytes": result.error_band.total_bytes,
                "error_band": result.error_band.to_json(),
                "clears_error_band": result.best.clears_band,
                "ties": result.ties,
                "stages": [s.to_json() for s in result.stages],
                "binding_stage": {
                    "stage": min(result.stages, key=lambda s: s.headroom_bytes).stage,
                    "reason": result.binding,
                },
                "excluded": [{"recompute": spec, "reason": why} for spec, why in result.excluded],
                "candidates": [c.to_json() for c in result.candidates],
                "best": result.best.to_json(),
                "explanation": result.explanation,
                "rendered": result.rendered,
                # the layout and shape settings changed from the inputs (in `rendered` too)
                "changed_settings": result.changes,
                # the fastest lever beside recompute that beats the pick (`plan --levers`)
                "better_layout": hint,
            },
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
                f"vs usable ({unit})",
                f"peak act ({unit})",
                f"headroom ({unit})",
                f"band ({unit})",
                "recompute FLOPs (%)",
            ],
            [
                (
                    c.estimate.recompute,
                    c.offload or "-",
                    ("yes" if c.clears_band else "in band") if c.fits else "no",
                    in_unit(c.estimate.total_bytes, scale, 2),
                    in_unit(planned_bytes(c.estimate), scale, 2),
                    in_unit(c.estimate.peak_activation_bytes, scale, 2),
                    in_unit(c.headroom_bytes, scale, 2),
                    in_unit(c.band.total_bytes, scale, 2) if c.band else "-",
                    f"{100 * c.step_cost:.2f}",
                )
                for c in shown
            ],
        )
    )
    hidden = len(result.candidates) - len(shown)
    if hidden:
        print(f"({hidden} more candidates: --top N or --json)")
    print(
        f"vs usable: the total and the terms beside it (MoE imbalance, dispatcher buffers, "
        f"gathered weight copies), compared with the usable {result.usable_bytes / 2**30:.1f} GiB "
        f"(the budget, {result.budget_bytes / 2**30:.1f} GiB, less the safety margin, which "
        "covers the CUDA context and NCCL's buffers with the band)"
    )
    fmt = default_format(args)
    if fmt not in ("megatron-lm", "megatron-bridge"):  # specs are Megatron's: say them as the run
        print(f"\nas {fmt} sets them:")
        for c in shown:
            print(f"  {c.estimate.recompute:<28} {c.settings}")
    print(f"\nper pipeline stage, {result.best.estimate.recompute}:")
    unit, scale = byte_unit([s.total_bytes for s in result.stages])
    print(
        format_table(
            [
                "stage",
                "layers",
                "MoE layers",
                "in flight",
                f"peak act ({unit})",
                f"model states ({unit})",
                f"total ({unit})",
                f"held ({unit})",
                f"headroom ({unit})",
                "global ranks",
            ],
            [
                (
                    s.stage,
                    layer_span(s.layers, word=""),
                    s.moe_layers,
                    f"{s.micro_batches_in_flight:g}",
                    in_unit(s.peak_activation_bytes, scale, 2),
                    in_unit(s.model_state_bytes, scale, 2),
                    in_unit(s.total_bytes, scale, 2),
                    in_unit(s.held_bytes, scale, 2),
                    in_unit(s.headroom_bytes, scale, 2),
                    f"{s.ranks[0]}-{s.ranks[1]}",
                )
                for s in result.stages
            ],
        )
    )
    print(
        "held: the total and what the rank holds beside it (MoE imbalance, gathered weights), "
        "what fits is judged on; global ranks: Megatron-Core's default rank order "
        "(tp-cp-ep-dp-pp), the pipeline stage varying slowest"
    )
    print(f"binding: {result.binding}")
    if gpu is not None:
        print(f"budget: {gpu.name}, {gpu.usable_gib:g} GiB as the GPU reports it ({gpu.source})")
    if cfg.model.loss_implementation == "megatron":  # (not a Trainer or torchtitan run)
        print(f"Megatron-Core version: {result.megatron_core_version}")
    print()
    print_layout(cfg, result.best.estimate)
    print(f"\n{result.explanation}\n\n{result.rendered}", end="")
    if hint:
        from .levers import hint_line

        print(f"\nnote: {hint_line(hint)}")
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    from ..ablation import ABLATION_EXAMPLE_SIZES, AblationSetup, run_ablation

    if not args.config and not args.command_template and not shape_only(args):
        # a runnable preset: the sizes the ablation notebook runs it at, unless given
        for key, value in ABLATION_EXAMPLE_SIZES.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
                say = f"{key} {value}: a preset's ablation size (--{key.replace('_', '-')})"
                print(say, file=sys.stderr if args.json else sys.stdout)
    cfg = config_from_args(args)
    cfg.validate()
    name = input_name(args)
    if args.command_template:
        from ..external import external_runner

        runner = external_runner(args.command_template, args.timeout, args.out)
    else:
        if shape_only(args):
            raise ConfigError(
                f"preset {args.model!r} is shape-only; ablate a runnable preset here, or your own "
                "training with --command-template"
            )
        from ..ablation import run_config as runner
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
        emit_json_read(args, {"out": args.out, "rows": rows})
    else:
        print((Path(args.out) / "summary.md").read_text(), end="")
        print(f"\nresults: {Path(args.out) / 'results.jsonl'}; plots: {args.out}/*.png")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor.engine import diagnose
    from ..doctor.evidence import EvidenceError, collect

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
    if override_values(args) and not (args.config or args.model):
        raise ConfigError(
            "--dp, --tp, --seq-length, ... complete a model: give --config FILE (the launch "
            "script or recipe the run uses) or --model NAME (a preset or Hugging Face id)"
        )
    from ..sources.nemo_rl_overrides import is_override
    from ..sources.resolve import file_of, is_launch_command, script_call

    for path in args.config or []:
        if is_override(path) or is_launch_command(path):  # `FILE key=value` (Hydra style):
            continue  # applied to the file before it; a quoted launch command: read as one
        called = script_call(path)  # 'run.sh ARGS': the script with its positional arguments
        text_file(
            str(called.script) if called else file_of(path),  # (recipe.py::fn reads recipe.py)
            "--config",
            "give the config files you train with, or a Megatron command line",
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
            overrides=override_values(args),
            model=args.model,
        )
    except EvidenceError as exc:
        raise ConfigError(str(exc)) from None
    from ..gpus import GPUS

    gpu_gb = GPUS[args.gpu].usable_gib if args.gpu else args.gpu_memory_gb
    diagnosis = diagnose(evidence, gpu_gb, gpu=args.gpu)
    if args.json:
        emit_json(diagnosis.to_json(rows=False))  # rows streamed, not held as dicts
        return 0
    if evidence.read:
        from ..sources.resolve import reading_from_json
        from ..sources.summary import summary_lines

        for line in summary_lines(reading_from_json(evidence.read), evidence.read["inputs"]):
            print(line)
        print()
    if diagnosis.verdict is not None:  # the verdict leads (doctor/verdict.py)
        for line in diagnosis.verdict.lines():
            print(line)
        print()
    print(diagnosis.summary)
    for f in diagnosis.findings:
        print(f"\n[{f.rule}] {f.title}  ({f.category}, confidence {f.confidence:.0%})")
        print(f"  evidence: {f.evidence}")
        print(f"  cause:    {f.cause}")
        print(f"  confirm:  {f.confirm}")
        print(f"  fix:      {f.fix}")
        # in the keys of the framework the inputs show (doctor/patches.py), where known
        shown = f.patch_keys or f.config_patch
        if shown:
            own = " (in the run's own keys)" if f.patch_keys and shown != f.config_patch else ""
            if f.patch_keys is None and f.patch_framework is None:
                own = " (the setting, not a key: no input shows the framework; see fix)"
            print(f"  patch:    {json.dumps(shown)}{own}")
    for note in diagnosis.assumptions + evidence.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from ..doctor.rules import RULES, catalog_markdown

    if args.markdown:
        sys.stdout.write(catalog_markdown())
    elif args.json:
        emit_json({"rules": [r.doc() for r in RULES]})
    else:
        print(
            format_table(["id", "category", "title"], [(r.id, r.category, r.title) for r in RULES])
        )
    return 0


def cmd_notebook(args: argparse.Namespace) -> int:
    from .. import notebook_run

    values = notebook_run.parameters(args.pairs, args.yaml_text, args.yaml_file)
    out = notebook_run.run(args.name, args.output, values)
    out_dir = values.get("out_dir")
    if args.json:
        emit_json({"notebook": str(out), "out_dir": out_dir})
    else:
        print(
            f"ran {notebook_run.NAMES[args.name]} into {out}"
            + (
                f"; its report is in {out_dir}"
                if out_dir
                else "; its report is in the notebook's default out_dir"
            )
        )
    return 0


def _batch_and_layout_read(reading) -> bool:
    """The global batch and the data-parallel size both come from the inputs (or the kit's
    command line): a DP derived from a world size the inputs give counts, an assumed one not."""
    from ..sources.reading import FROM_ARGUMENT, FROM_DERIVED, FROM_FILE

    def said(key: str) -> bool:
        origin = reading.origins.get(key)
        return origin is not None and origin.kind in (FROM_FILE, FROM_ARGUMENT)

    dp = reading.origins.get("data_parallel_size")
    dp_read = said("data_parallel_size") or (
        dp is not None and dp.kind == FROM_DERIVED and said("world_size")
    )
    return said("global_batch_size") and dp_read
