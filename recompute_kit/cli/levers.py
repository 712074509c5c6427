"""`plan --levers`: the memory levers beside recompute, ranked by predicted step time."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError
from ..plan import same_setting
from ..units import byte_unit, in_unit
from .common import emit_json_read, format_table, layout_of, with_layout_assumptions

GIB = 2**30


def add_lever_args(p: argparse.ArgumentParser) -> None:
    # (no import of the planner here: the parser is built for every command; the defaults
    # live in recompute_kit/plan/step_time.py and are applied in cmd_levers)
    g = p.add_argument_group(
        "levers (--levers: context/pipeline parallelism, VPP, micro-batch, "
        "uneven stages, offloading, distributed optimizer, with step times)"
    )
    g.add_argument(
        "--levers",
        action="store_true",
        help="weigh the other memory levers beside recompute in one step-time model "
        "(recompute_kit/plan/step_time.py) and print them ranked",
    )
    g.add_argument(
        "--tflops-per-gpu",
        type=float,
        default=None,
        metavar="X",
        help="executed TFLOP/s each GPU sustains (default 400: an assumption, ~40%% of an H100 "
        "SXM's dense BF16 peak); a measured step overrides it",
    )
    g.add_argument(
        "--host-link",
        metavar="LINK",
        help="the GPU-host link that offloading uses: pcie5 (64 GB/s per direction, the "
        "default), pcie4 (32), pcie3 (16), nvlink-c2c (450, GH200), or GB/s per direction",
    )
    g.add_argument(
        "--cp-link-gbps",
        type=float,
        metavar="X",
        help="GB/s per direction of the context-parallel ring (default 450: NVLink 4 on H100 SXM)",
    )
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="the run overlaps its TP collectives with compute (Megatron's tp_comm_overlap, "
        "Transformer Engine userbuffers): they cost nothing in the step time (default: as the "
        "files say, Megatron-LM's --tp-comm-overlap; else exposed)",
    )
    g.add_argument(
        "--price-recompute",
        metavar="SPEC",
        help="price the run with this recompute setting instead of its own (`full:uniform:1`, "
        "`selective:layernorm,moe`): the `current` row's step time and memory are then that "
        "setting's, the other rows ranked against it",
    )
    g.add_argument(
        "--global-batch-size",
        type=int,
        metavar="N",
        help="global batch (default: the config's; it sets the micro-batches per step)",
    )
    g.add_argument(
        "--measured-step-seconds",
        type=float,
        metavar="X",
        help="a step time measured on the config as given: calibrates the TFLOP/s",
    )
    g.add_argument(
        "--measured-log",
        metavar="FILE",
        help="a Megatron-LM log of the config as given: its iteration lines calibrate the TFLOP/s",
    )


def cmd_levers(args: argparse.Namespace, cfg: Config, gib: float, version: str | None) -> int:
    from ..plan.levers import levers
    from ..plan.step_log import measured_step_seconds
    from ..plan.step_time import calibrate_tflops, hardware_for, micro_batches_per_step

    own_recompute = cfg.recompute
    if args.price_recompute:
        cfg = cfg.with_recompute(args.price_recompute)
        cfg.validate()
    gbs = args.global_batch_size
    resolved = getattr(args, "resolved", None)
    if gbs is None and resolved is not None:
        gbs = resolved.reading.get("global_batch_size")
    trainer = _trainer_options(args, resolved)
    hw = hardware_for(
        getattr(args, "gpu", None),
        args.tflops_per_gpu,
        args.host_link,
        args.cp_link_gbps,
        # the flag, else what the files say (Megatron-LM --tp-comm-overlap)
        tp_comm_overlap=args.tp_comm_overlap
        or bool(resolved is not None and resolved.reading.get("tp_comm_overlap")),
    )
    calibration: dict[str, Any] | None = None
    measured, source = args.measured_step_seconds, "--measured-step-seconds"
    if args.measured_log:
        measured, used = measured_step_seconds(Path(args.measured_log).read_text(errors="replace"))
        source = f"{args.measured_log}: median of {used} iteration lines"
    if measured is not None:
        table = levers(cfg, gib, args.safety_margin, hw, gbs, version, **trainer)  # gbs, offload
        micro = micro_batches_per_step(table.current.config, table.global_batch_size)
        from ..plan.levers import _offloaded_per_stage

        tflops = calibrate_tflops(
            table.current.config, micro, hw, measured, _offloaded_per_stage(cfg)
        )
        calibration = {
            "measured_step_seconds": measured,
            "source": source,
            "tflops_per_gpu": tflops,
            "instead_of": hw.tflops_per_gpu,
        }
        hw = dataclasses.replace(hw, tflops_per_gpu=tflops)
    table = levers(cfg, gib, args.safety_margin, hw, gbs, version, **trainer)
    if any(r.config.parallel.context_parallel_size > 1 for r in table.rows):
        table.notes += _untimed_cp_comm(resolved)
    fits = any(r.fits for r in table.rows)
    if args.json:
        doc = table.to_json()
        for row_doc, row in zip(doc["rows"], table.rows, strict=True):
            row_doc["rendered"] = _rendered(
                args, cfg, row.config, table.global_batch_size, trainer.get("sharding_backend")
            )
        emit_json_read(
            args,
            {
                # as without --levers, "fits": a setting offered fits (a row here); whether
                # the run as given fits is "current_fits"
                "fits": fits,
                "current_fits": table.current.fits,
                # what "current" is: the run as given, or priced with another recompute
                "current_is": _current_is(args, same_setting(own_recompute, cfg.recompute)),
                "layout": layout_of(cfg),
                # the config's, then what the run's own estimate assumes (as plain `plan`
                # says them; the CUDA context and NCCL's buffers are the safety margin's)
                "assumptions": [
                    *cfg.assumptions,
                    *(
                        a
                        for a in table.current.estimate.overhead_assumptions
                        if not a.startswith(("CUDA context", "NCCL buffers"))
                    ),
                ],
                "megatron_core_version": version,
                "calibration": calibration,
                "levers": doc,
            },
        )
    else:
        _print(table, calibration)
    if not fits:
        raise with_layout_assumptions(
            ConfigError(
                f"no lever fits in {gib:g} GiB ({table.usable_bytes / GIB:.1f} GiB usable): add "
                "GPUs (tensor or data parallelism) or shorten the sequence"
            ),
            cfg,
        )
    return 0


def _rendered(
    args: argparse.Namespace,
    given: Config,
    row: Config,
    global_batch: int,
    sharding_backend: str | None = None,
) -> str | None:
    """A lever row as the config snippet of the run's framework (`plan`'s `rendered`): its
    recompute settings, what it changes of the layout and, for a Trainer run, of the model
    states' sharding and offload; None where it cannot be written."""
    from ..export import render
    from ..export_layout import (
        LAYOUT_FIELDS,
        changed_settings,
        nemo_rl_companions,
        setting,
        world_size,
    )
    from ..plan.trainer_levers import sharding_snippet
    from .common import default_format, inputs_spelling, override_values

    changes = changed_settings(row, given)
    for key in override_values(args):  # the command line's --seq-length, --cp: changes too
        if key in LAYOUT_FIELDS and key not in changes:
            changes[key] = setting(row, key)
    fmt = default_format(args)
    if fmt in ("hf-trainer", "llama-factory"):
        # the Trainer's accumulation keeps the global batch; Liger's fused loss is its flag
        per = row.model.micro_batch_size * row.parallel.data_parallel_size
        if "micro_batch_size" in changes and per and not global_batch % per:
            changes["gradient_accumulation_steps"] = global_batch // per
        fused = row.model.fused_linear_cross_entropy
        if fused != given.model.fused_linear_cross_entropy:
            changes["fused_linear_cross_entropy"] = fused
    if fmt == "nemo-rl":
        nemo_rl_companions(row, changes)
    titan = fmt in ("torchtitan", "torchtitan-registry")
    if titan and ({"micro_batch_size", "data_parallel_size"} & set(changes)):
        # the step's global batch stays: torchtitan's -1 would follow local x DP instead
        changes["global_batch_size"] = global_batch
    per_step = row.model.micro_batch_size * row.parallel.data_parallel_size
    if fmt == "torchtitan-registry":  # its batches are in tokens: sequences x this length
        from ..export_layout import SEQUENCE_TOKENS

        changes[SEQUENCE_TOKENS] = row.model.seq_length
    if fmt == "torchtitan-registry" and row.parallel.pipeline_model_parallel_size > 1:
        # main's pipeline runs parallelism.num_pp_microbatches (default 1) per accumulation
        # step: the step-time model's micro-batches all in one pipeline
        changes["num_pp_microbatches"] = max(1, global_batch // per_step) if per_step else 1
    for key in ("cross_entropy_loss_fusion", "cross_entropy_fusion_impl"):  # the fused-loss row
        if fmt not in ("hf-trainer", "llama-factory") and getattr(row.model, key) != getattr(
            given.model, key
        ):
            changes[key] = getattr(row.model, key)
    offloaded = row.parallel.param_offload and row.parallel.optimizer_offload
    if titan and offloaded and not given.parallel.param_offload:
        changes["enable_cpu_offload"] = True  # the CPU-offload lever's own key
    try:
        text = render(
            row.recompute,
            fmt,
            num_layers=row.model.num_layers // row.parallel.pipeline_model_parallel_size,
            layout=changes,
            world_size=world_size(row),
            spelling=inputs_spelling(args),
        )
    except ConfigError:
        return None
    sharding = ("zero_stage", "optimizer_offload", "param_offload")
    resharded = any(getattr(row.parallel, k) != getattr(given.parallel, k) for k in sharding)
    if resharded and sharding_backend != "automodel" and fmt in ("hf-trainer", "llama-factory"):
        text += "\n".join(sharding_snippet(row, sharding_backend or "deepspeed")) + "\n"
    return text


def layout_hint(
    args: argparse.Namespace, cfg: Config, gib: float, version: str | None
) -> dict | None:
    """The fastest lever beside recompute (`plan --levers`: a CP x PP split, VPP, the
    micro-batch, ...) that fits, clears the band and beats the planner's recompute pick by
    more than 2% of the step; None where none does (or the levers cannot be priced)."""
    from ..plan.levers import CLEARLY_FASTER, levers

    resolved = getattr(args, "resolved", None)
    gbs = args.global_batch_size
    if gbs is None and resolved is not None:
        gbs = resolved.reading.get("global_batch_size")
    try:
        table = levers(
            cfg, gib, args.safety_margin, None, gbs, version, **_trainer_options(args, resolved)
        )
    except ConfigError:
        return None
    pick = next((r for r in table.rows if r.lever == "recompute"), None)
    if pick is None:
        return None
    better = [
        r
        for r in table.rows
        if r.lever not in ("current", "recompute")
        and r.fits
        and r.clears_band
        and (not pick.fits or r.step.seconds < CLEARLY_FASTER * pick.step.seconds)
    ]
    if not better:
        return None
    r = min(better, key=lambda r: r.step.seconds)
    usable = int(gib * GIB * (1 - args.safety_margin))
    return {
        "lever": r.lever,
        "setting": r.setting,
        "peak_bytes": r.estimate.total_bytes,
        "held_bytes": r.estimate.held_bytes,
        # a faster row with less room than the pick is a trade, said with both headrooms
        "headroom_bytes": usable - r.estimate.held_bytes,
        "recompute_pick_headroom_bytes": usable - pick.estimate.held_bytes,
        "step_vs_recompute_pick": r.step.seconds / pick.step.seconds if pick.step.seconds else None,
        "recompute_pick_fits": pick.fits,
        "needs": _nemo_rl_needs(args, cfg, r.config, resolved),
    }


def _nemo_rl_needs(args: argparse.Namespace, given: Config, row: Config, resolved: Any) -> str:
    """What a NeMo-RL run must change beside the layout itself (its rendering's companions):
    sequence packing for context parallelism, unless the run packs already."""
    from ..export_layout import changed_settings, nemo_rl_companions
    from .common import default_format

    if default_format(args) != "nemo-rl":
        return ""
    changes = changed_settings(row, given)
    nemo_rl_companions(row, changes)
    unused = getattr(getattr(resolved, "reading", None), "unused", None) or {}
    if (
        changes.get("sequence_packing")
        and unused.get("policy.sequence_packing.enabled") is not True
    ):
        return (
            "policy.sequence_packing.enabled: true (NeMo-RL's Megatron policy asserts it for "
            "context parallelism; it changes how micro-batches are formed)"
        )
    return ""


def hint_line(hint: dict) -> str:
    """The layout hint in words."""
    faster = (
        f", step {hint['step_vs_recompute_pick']:.2f}x the recompute pick's"
        if hint["recompute_pick_fits"] and hint["step_vs_recompute_pick"]
        else ""
    )
    room = ""
    if "headroom_bytes" in hint:
        room = f", headroom {hint['headroom_bytes'] / GIB:.1f} GiB"
        if hint["recompute_pick_fits"]:
            pick_room = hint["recompute_pick_headroom_bytes"] / GIB
            room += f" against the recompute pick's {pick_room:.1f}"
    # the setting names its lever already ("tp=2 dp=128 sp"), except some ("first=39 last=41")
    lever = "" if hint["setting"].startswith(hint["lever"].split()[0]) else f"{hint['lever']}: "
    needs = f"; it needs {hint['needs']}" if hint.get("needs") else ""
    return (
        f"a layout does better: {lever}{hint['setting']} (peak "
        f"{hint['peak_bytes'] / GIB:.1f} GiB{room}{faster}{needs}; step times from the "
        "step-time model, `plan --levers` prices every lever)"
    )


def _current_is(args: argparse.Namespace, own_recompute: bool) -> str:
    """What the "current" row is: the run as its files give it, or changed by the command line
    (--tp, --pp, ... overrides; --price-recompute, unless it names the run's own setting)."""
    from .common import OVERRIDES

    changed = []
    for flag in OVERRIDES:
        value, name = getattr(args, flag, None), flag.replace("_", "-")
        if value is not None:
            changed.append(
                (f"--{name}" if value else f"--no-{name}")
                if isinstance(value, bool)
                else f"--{name} {value}"
            )
    said = "the run as given" + (f", with {' '.join(changed)}" if changed else "")
    if args.price_recompute and own_recompute:
        said += f" (recompute {args.price_recompute}, its own setting)"
    elif args.price_recompute:
        said += f" and recompute {args.price_recompute} (--price-recompute), not its own setting"
    return said


def _trainer_options(args: argparse.Namespace, resolved: Any) -> dict[str, str]:
    """The framework the rows are written for (--format, else the files read) and, for a
    Hugging Face Trainer run, whose keys name its levers (LLaMA-Factory's or the Trainer's)
    and whether it shards with FSDP or DeepSpeed."""
    from ..sources.torchtitan import context_parallel_refused
    from .common import default_format

    fmt = default_format(args)
    trainers = ("hf-trainer", "llama-factory", "automodel", "nemo-rl-dtensor")
    out = {"trainer_format": fmt if fmt in trainers else "hf-trainer", "plan_format": fmt}
    if fmt == "automodel":  # FSDP2 / Megatron-FSDP through distributed.strategy
        out["sharding_backend"] = "automodel"
        return out
    if resolved is not None:
        attention = resolved.reading.origins.get("attention_backend")
        refused = context_parallel_refused(
            resolved.reading.framework,
            attention.note if attention else "",
            attention.where if attention else "",
        )
        if refused:
            out["no_context_parallel"] = refused
    if resolved is None:
        return out
    stage = resolved.reading.origins.get("zero_stage")
    # what a file says (a default's note names both backends as what a launcher might add)
    said = f"{stage.key} {stage.note}".lower() if stage and stage.kind == "file" else ""
    accelerate = str(resolved.reading.unused.get("distributed_type", "")).upper()
    if said.startswith("fsdp_config") or accelerate == "FSDP":
        out["sharding_backend"] = "accelerate-fsdp"  # FSDP set in an Accelerate config
    elif "fsdp" in said:
        out["sharding_backend"] = "fsdp"
    elif said.startswith("deepspeed_config") or accelerate == "DEEPSPEED":
        out["sharding_backend"] = "accelerate"  # DeepSpeed set in an Accelerate config
    return out


def _print(table: Any, calibration: dict | None) -> None:
    rows = table.rows
    unit, scale = byte_unit([r.estimate.total_bytes for r in rows])
    print(
        format_table(
            [
                "lever",
                "setting",
                f"peak ({unit})",
                f"held ({unit})",
                "stage",
                "fits",
                "step (s)",
                "vs current",
                "adds",
            ],
            [
                (
                    r.lever,
                    r.setting,
                    in_unit(r.estimate.total_bytes, scale, 2),
                    in_unit(r.estimate.held_bytes, scale, 2),
                    r.estimate.stage,
                    ("yes" if r.clears_band else "in band") if r.fits else "no",
                    (">=" if r.untimed else "") + f"{r.step.seconds:.3g}",
                    (">=" if r.untimed else "") + f"{r.relative:.3f}",
                    r.adds,
                )
                for r in rows
            ],
        )
    )
    hw = table.hardware
    print(
        f"\nstep time = (m + (pp-1)/vpp) x the slowest stage's micro-batch (executed FLOPs at "
        f"{hw.tflops_per_gpu:.4g} TFLOP/s per GPU, + exposed CP ring at {hw.cp_link_gbps:g} "
        f"GB/s inside a node and {hw.internode_gbps:g} GB/s once TP x CP spans nodes, + "
        + ("" if hw.tp_comm_overlap else "exposed TP collectives, + ")
        + "exposed FSDP / ZeRO-3 collectives and EP all-to-alls, + "
        + f"exposed offload at {hw.host_link_gbps:g} GB/s); global batch "
        f"{table.global_batch_size}; usable {table.usable_bytes / GIB:.1f} GiB per GPU; "
        "'peak' is the binding stage's total, 'held' that and what the rank holds beside it "
        "(gathered FSDP parameters, MoE imbalance, buffers): what 'fits' compares with the "
        "usable memory. The model: recompute_kit/plan/step_time.py."
        + (
            " '>=': the row adds work the model does not time (its 'adds' says which): at least "
            "this long"
            if any(r.untimed for r in rows)
            else ""
        )
    )
    if calibration:
        print(
            f"calibrated: {calibration['measured_step_seconds']:.4g} s measured ("
            f"{calibration['source']}) -> {calibration['tflops_per_gpu']:.4g} TFLOP/s per GPU "
            f"(instead of {calibration['instead_of']:g})"
        )
    for note in table.notes:
        print(f"note: {note}")


def _untimed_cp_comm(resolved) -> list[str]:
    """The step-time model prices context parallelism as the p2p ring; a run that says another
    cp_comm_type (all-gather, a2a: Megatron's TransformerConfig.cp_comm_type) is said."""
    unused = resolved.reading.unused if resolved is not None else {}
    said = {
        k: v
        for k, v in unused.items()
        if k.rsplit(".", 1)[-1].lstrip("-").replace("-", "_") == "cp_comm_type"
        and v not in (None, "p2p")
    }
    return [
        f"{key} {value!r}: CP's communication is timed as the p2p ring, not as {value!r}"
        for key, value in said.items()
    ]
