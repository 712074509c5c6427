"""The planner's cheapest lever that fits, as a doctor's patch: the first row of
`plan --levers` (plan/levers.py) that fits, one ranking for the planner and the doctor."""

from __future__ import annotations

from typing import Any

from ...config import ConfigError
from ...plan.margins import SAFETY_MARGIN, planned_bytes
from ...plan.trainer_levers import is_trainer_run
from ...sources.torchtitan import context_parallel_refused
from ..types import GIB, Context
from .registry import gib, patch_for, tensor_parallel_patch

_LAYOUT_KEYS = (
    "tensor_model_parallel_size",
    "context_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size",  # the EP lever's rows (a trial: its words said ep=2, the
    # patch did not)
    "use_distributed_optimizer",
)  # (data parallelism follows from the world size in every framework: no key to set)


def lever_patch(ctx: Context, row=None) -> tuple[dict[str, Any], str]:
    """A row of `plan --levers` (by default the first that fits) as a patch and words; else the
    next tensor parallel size (which may need more GPUs), as before."""
    row = row if row is not None else first_fitting_lever(ctx)
    if row is None and is_trainer_run(ctx.config):  # no tensor parallelism in the Trainer
        return {}, (
            "no lever `plan --levers` prices fits on these GPUs (alone or at micro-batch 1): "
            "more GPUs (ZeRO-3 shards over them), a shorter sequence or a smaller model"
        )
    if row is None:
        return tensor_parallel_patch(ctx)
    cfg, new = ctx.config, row.config
    patch: dict[str, Any] = {}
    for key in _LAYOUT_KEYS:
        if getattr(new.parallel, key) != getattr(cfg.parallel, key):
            patch[key] = getattr(new.parallel, key)
    _deepspeed(ctx, new, patch)
    said = ("zero_optimization", "deepspeed_config", "fsdp_config")
    if not any(k.startswith(said) for k in patch):
        for key in ("optimizer_offload", "param_offload"):  # FSDP2's CPU offload (torchtitan)
            if getattr(new.parallel, key) != getattr(cfg.parallel, key):
                patch[key] = getattr(new.parallel, key)
    if new.model.micro_batch_size != cfg.model.micro_batch_size:
        patch["micro_batch_size"] = new.model.micro_batch_size
        gbs, dp = ctx.memo.get("lever_global_batch"), new.parallel.data_parallel_size
        if is_trainer_run(cfg) and gbs and not gbs % (new.model.micro_batch_size * dp):
            # the same global batch: the accumulation takes what the micro-batch gives up
            patch["gradient_accumulation_steps"] = gbs // (new.model.micro_batch_size * dp)
        elif (ctx.evidence.read or {}).get("framework") == "torchtitan" and gbs:
            # torchtitan's global_batch_size -1 follows local x DP: written, the step keeps it
            patch["global_batch_size"] = gbs
    if new.model.fused_linear_cross_entropy and not cfg.model.fused_linear_cross_entropy:
        patch["cross_entropy_loss_fusion"] = True  # Liger's fused loss in a Trainer's keys
    spec = row.estimate.recompute
    if spec != cfg.recompute.spec:
        patch.update({k: v for k, v in patch_for(spec).items() if v is not None})
    usable = int(ctx.gpu_bytes * (1 - SAFETY_MARGIN))
    untimed = "; " + row.adds if "not timed" in row.adds else ""
    words = (
        f"the cheapest change that fits by `plan --levers` on the run's GPUs: {row.setting}"
        + (f" with '{spec}'" if spec != cfg.recompute.spec else "")
        + f" ({gib(planned_bytes(row.estimate))} held per rank of {gib(usable)} usable, step "
        f"{row.relative:.2f}x the current{untimed})"
    )
    return patch, words


def first_fitting_lever(ctx: Context):
    from ...plan.levers import levers
    from ...plan.step_time import hardware_for

    if ctx.config is None or not ctx.gpu_bytes:
        return None
    if "first_fitting_lever" not in ctx.memo:  # three rules ask; the table is made once
        read = ctx.evidence.read or {}
        config = read.get("config") or {}
        gbs = config.get("global_batch_size")  # the run's, as read
        fmt = "llama-factory" if "LLaMA-Factory" in str(read.get("format")) else "hf-trainer"
        backend = (
            "accelerate-fsdp"
            if _accelerate_fsdp(ctx)
            else "accelerate"
            if _accelerate_deepspeed(ctx)
            else "deepspeed"
        )
        rows = []
        # the run's global batch; where it does not divide the layout as read (an assumed
        # world size), the levers' own assumption
        for batch in dict.fromkeys((gbs, None)):
            try:
                table = levers(
                    ctx.config,
                    ctx.gpu_bytes / GIB,
                    hw=hardware_for(
                        ctx.gpu_name, tp_comm_overlap=bool(config.get("tp_comm_overlap"))
                    ),
                    global_batch_size=batch,
                    trainer_format=fmt,
                    sharding_backend=backend,
                    plan_format=ctx.plan_format,
                    no_context_parallel=context_parallel_refused(
                        read.get("framework"),
                        (read.get("sources") or {}).get("attention_backend", {}).get("note", ""),
                        (read.get("sources") or {}).get("attention_backend", {}).get("where", ""),
                    ),
                )
            except (ConfigError, ValueError, ZeroDivisionError):
                continue
            rows = table.rows
            ctx.memo["lever_global_batch"] = table.global_batch_size
            break
        ctx.memo["lever_rows"] = rows
        ctx.memo["first_fitting_lever"] = next(
            (r for r in rows if r.fits and r.lever != "current"), None
        )
    return ctx.memo["first_fitting_lever"]


def lever_rows(ctx: Context) -> list:
    """Every row of `plan --levers` for the run (fastest first), made once."""
    first_fitting_lever(ctx)
    return ctx.memo.get("lever_rows", [])


def _deepspeed(ctx: Context, new, patch: dict[str, Any]) -> None:
    """A ZeRO stage / offload lever as the DeepSpeed JSON's own section, where the run uses
    DeepSpeed (a Trainer run with a `zero_optimization` section or a `deepspeed` file)."""
    p, q = ctx.config.parallel, new.parallel
    if (p.zero_stage, p.optimizer_offload, p.param_offload) == (
        q.zero_stage,
        q.optimizer_offload,
        q.param_offload,
    ):
        return
    if _accelerate_fsdp(ctx):  # FSDP set in an Accelerate config: its fsdp_config keys
        if q.param_offload != p.param_offload:
            patch["fsdp_config.fsdp_offload_params"] = q.param_offload
        if q.zero_stage != p.zero_stage and q.zero_stage in (2, 3):
            if new.parallel.use_torch_fsdp2:
                patch["fsdp_config.fsdp_reshard_after_forward"] = q.zero_stage == 3
            else:
                name = {3: "FULL_SHARD", 2: "SHARD_GRAD_OP"}[q.zero_stage]
                patch["fsdp_config.fsdp_sharding_strategy"] = name
        return
    if _accelerate_deepspeed(ctx):  # DeepSpeed set in an Accelerate config: its keys
        patch["deepspeed_config.zero_stage"] = q.zero_stage
        if q.optimizer_offload != p.optimizer_offload:
            patch["deepspeed_config.offload_optimizer_device"] = (
                "cpu" if q.optimizer_offload else "none"
            )
        if q.param_offload != p.param_offload:
            patch["deepspeed_config.offload_param_device"] = "cpu" if q.param_offload else "none"
        return
    if not (ctx.cfg.get("deepspeed") or any(k.startswith("zero_optimization") for k in ctx.cfg)):
        return
    section: dict[str, Any] = {"stage": q.zero_stage}
    if q.optimizer_offload:
        section["offload_optimizer"] = {"device": "cpu"}
    if q.param_offload:
        section["offload_param"] = {"device": "cpu"}
    patch["zero_optimization"] = section


def _accelerate_fsdp(ctx: Context) -> bool:
    """The sharding is an Accelerate config's fsdp_config (distributed_type FSDP)."""
    sources = (ctx.evidence.read or {}).get("sources") or {}
    return str((sources.get("zero_stage") or {}).get("key", "")).startswith("fsdp_config") or (
        str(ctx.cfg.get("distributed_type", "")).upper() == "FSDP"
    )


def _accelerate_deepspeed(ctx: Context) -> bool:
    """The ZeRO stage is set in an Accelerate config's deepspeed_config (not a DeepSpeed
    JSON): its patches are written in Accelerate's keys."""
    sources = (ctx.evidence.read or {}).get("sources") or {}
    return str((sources.get("zero_stage") or {}).get("key", "")).startswith("deepspeed_config")
