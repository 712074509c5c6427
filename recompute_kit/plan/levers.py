"""The memory levers beside recompute, each with its per-rank memory and its step time.

At a fixed number of GPUs (tp x pp x cp x dp) and a fixed global batch, `levers` tries, one
change at a time from the run as given:

* recompute: the cheapest setting `plan` picks on the current layout;
* context x pipeline parallelism: every (cp, pp) whose product divides the GPUs left after TP
  (data parallel takes the rest), e.g. CP4 x PP4 against CP8 x PP2;
* tensor parallelism 1-8 (one node) at the run's PP x CP, with sequence parallelism;
* virtual pipeline stages (VPP) for the current PP;
* micro-batch size (fewer micro-batches per step: a larger bubble; the same memory law);
* uneven pipeline stages (`num_layers_in_first/last_pipeline_stage`);
* activation offloading (the planner's offloading candidates), priced by the host link;
* the distributed optimizer, when the run does not use it.

A Hugging Face Trainer run (TRL, LLaMA-Factory) has none of Megatron's parallelism levers: it
gets its own (`trainer_levers.py`): gradient checkpointing on or off, the micro-batch with the
accumulation steps at the same global batch, and the ZeRO stage / FSDP strategy with optimizer
and parameter offloading, each named in the framework's own keys (export.TRAINER_KEYS).

Each is estimated by the memory model (`memory/estimate.py`, every stage; the binding stage's
total is reported) and timed by `step_time.py`. A layout that does not fit with the run's own
recompute setting gets the cheapest recompute setting that fits it (`plan`), said in the row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..config import Config, ConfigError
from ..config.validation import check_expert_layout, te_cross_entropy_refused
from ..export_layout import has_key
from ..memory.estimate import Estimate, estimate
from ..memory.model_states import sharding_mode
from .margins import (
    HOST_MEMORY_PER_GPU_BYTES,
    SAFETY_MARGIN,
    error_band,
    fits_host,
    planned_bytes,
)
from .search import candidates
from .step_time import Hardware, StepTime, micro_batches_per_step, node_gpus, step_time
from .trainer_levers import (
    checkpointing_setting,
    is_trainer_run,
    micro_batch_setting,
    sharding_cost,
    sharding_settings,
    with_host_link,
)

GIB = 2**30
MAX_SPLIT = 16  # largest CP and PP sizes tried
MAX_VPP = 8
MICRO_BATCH_SIZES = (1, 2, 4, 8)
UNEVEN_SPAN = 4  # first/last stage layers tried: the even share minus 0..4, plus 1
UNEVEN_KEEP = 3  # uneven splits listed (the fastest that fit)


# A lever beats the planner's recompute pick where its step is over 2% shorter (a closer one is
# inside what the step-time model can tell apart)
CLEARLY_FASTER = 0.98


@dataclass
class Lever:
    lever: str
    setting: str
    config: Config
    estimate: Estimate
    fits: bool
    clears_band: bool
    step: StepTime
    adds: str
    recompute_added: str = ""  # the recompute setting `plan` added so that the layout fits
    baseline_seconds: float = 0.0

    @property
    def untimed(self) -> bool:
        """The row adds work the step-time model does not time (it says so in `adds`)."""
        return "not timed" in self.adds

    @property
    def relative(self) -> float:
        return self.step.seconds / self.baseline_seconds if self.baseline_seconds else 1.0

    def to_json(self) -> dict:
        p = self.config.parallel
        return {
            "lever": self.lever,
            "setting": self.setting,
            "recompute": self.estimate.recompute,
            "recompute_added": self.recompute_added or None,
            "tensor_model_parallel_size": p.tensor_model_parallel_size,
            "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": p.virtual_pipeline_model_parallel_size,
            "context_parallel_size": p.context_parallel_size,
            "data_parallel_size": p.data_parallel_size,
            "micro_batch_size": self.config.model.micro_batch_size,
            "num_layers_in_first_pipeline_stage": p.num_layers_in_first_pipeline_stage,
            "num_layers_in_last_pipeline_stage": p.num_layers_in_last_pipeline_stage,
            "use_distributed_optimizer": p.use_distributed_optimizer,
            "zero_stage": p.zero_stage,
            "optimizer_offload": p.optimizer_offload,
            "param_offload": p.param_offload,
            "binding_stage": self.estimate.stage,
            "peak_bytes": self.estimate.total_bytes,
            # what `fits` compares with the usable memory: the total and what the rank holds
            # beside it (gathered FSDP parameters, MoE imbalance, buffers)
            "held_bytes": self.estimate.held_bytes,
            "stage_total_bytes": self.estimate.stage_total_bytes,
            "fits": self.fits,
            "clears_error_band": self.clears_band,
            "step_seconds": self.step.seconds,
            "step_vs_current": self.relative,
            # a part of the step the model does not time (CPU Adam, TE's speed): at least this
            "step_is_lower_bound": self.untimed,
            "step_time": self.step.to_json(),
            "adds": self.adds,
        }


@dataclass
class LeverTable:
    rows: list[Lever]
    current: Lever
    hardware: Hardware
    global_batch_size: int
    usable_bytes: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "hardware": self.hardware.to_json(),
            "global_batch_size": self.global_batch_size,
            "usable_bytes": self.usable_bytes,
            "current": self.current.to_json(),
            "rows": [r.to_json() for r in self.rows],
            "notes": self.notes,
        }


def _world(config: Config) -> int:
    p = config.parallel
    return (
        p.tensor_model_parallel_size
        * p.pipeline_model_parallel_size
        * p.context_parallel_size
        * p.data_parallel_size
    )


def _adds(config: Config, step: StepTime, micro_batches: int = 1) -> str:
    """What the setting costs beside compute, in a few words."""
    parts = []
    if step.fsdp_exposed_s or any(s.fsdp_transfer_s for s in step.stages):
        # FSDP / ZeRO-3 gather the parameters and reduce-scatter the gradients per micro-batch
        slow = step.stages[step.slowest_stage]
        each = f" in each of {micro_batches} micro-batches" if micro_batches > 1 else ""
        who = "ZeRO-3" if sharding_mode(config) == "zero" else "FSDP"
        parts.append(
            f"{who} gathers and reduce-scatters {slow.fsdp_transfer_s:.3g} s/micro-batch{each}, "
            f"exposed {step.fsdp_exposed_s:.3g} s (overlapped with compute as modelled; "
            "not measured)"
        )
    if step.ep_exposed_s:
        parts.append(f"EP all-to-all exposed {step.ep_exposed_s:.3g} s")
    if step.bubble_fraction:
        parts.append(f"bubble {step.bubble_fraction:.1%}")
    if config.parallel.context_parallel_size > 1:
        parts.append(f"CP ring exposed {step.cp_exposed_s:.3g} s")
    if step.tp_exposed_s:
        parts.append(f"TP collectives exposed {step.tp_exposed_s:.3g} s")
    if step.offload_exposed_s or any(s.offload_transfer_s for s in step.stages):
        slow = step.stages[step.slowest_stage]
        parts.append(
            f"offload {slow.offload_transfer_s * 1e3:.3g} ms/micro-batch each way, exposed "
            f"{step.offload_exposed_s:.3g} s"
        )
    return ", ".join(parts) or "-"


def _offloaded_per_stage(config: Config) -> list[float]:
    """Bytes one micro-batch sends to the host, per stage (the estimate's `offloaded_bytes`
    is what is on the host at the peak: per micro-batch x micro-batches in flight)."""
    rc = config.recompute
    if not (rc.cpu_offloading or rc.fine_grained_activation_offloading):
        return []
    out = []
    for s in range(config.parallel.pipeline_model_parallel_size):
        e = estimate(config, stage=s)
        out.append(e.offloaded_bytes / e.micro_batches_in_flight)
    return out


def _why_not(config: Config, gbs: int) -> str:
    """Why `_evaluate` refuses the run as given, in a few words."""
    try:
        config.validate()
        check_expert_layout(config)
        estimate(config)
        micro = micro_batches_per_step(config, gbs)
    except ConfigError as exc:
        return str(exc)
    pp = config.parallel.pipeline_model_parallel_size
    return (
        f"{micro} micro-batches a step, fewer than the {pp} pipeline stages, which the "
        "interleaved schedule refuses"
    )


def _evaluate(
    lever: str,
    setting: str,
    config: Config,
    gbs: int,
    hw: Hardware,
    usable: int,
    gib: float,
    margin: float,
    version: str | None,
    plan_format: str = "megatron-bridge",
    fallback: str = "if-needed",
    keys: dict[str, str] | None = None,
) -> Lever | None:
    """One row, or None when Megatron cannot run the setting (validation, divisibility).
    `fallback`: when to take `plan`'s cheapest recompute setting for this layout ("never",
    "if-needed": only when the run's own does not fit, "always")."""
    was_on = config.recompute.recompute_granularity is not None
    fp32 = _torchtitan_without_amp(config)
    if fp32:
        config = config.replace(bf16=False, fp16=False)
    try:
        config.validate()
        check_expert_layout(config)
        est = estimate(config)
        micro = micro_batches_per_step(config, gbs)
    except ConfigError:
        return None
    if (
        micro < config.parallel.pipeline_model_parallel_size
        and (config.parallel.virtual_pipeline_model_parallel_size or 1) > 1
    ):
        # the interleaved schedule needs a micro-batch per stage at least; 1F1B runs fewer
        # (its warm-up is capped at the step's micro-batches, which never fill the pipeline)
        return None
    added = ""
    # re-planned where the run's own setting does not fit this layout or fits only within its
    # error band (a row "fits, in band" beside a pick that clears it is no fair comparison)
    band = error_band(config, est)
    short = usable - planned_bytes(est) < band.total_bytes
    if fallback == "always" or (fallback == "if-needed" and short):
        from . import NothingFits, plan  # (this package)

        try:
            best = plan(
                config, gib, margin, plan_format, stage=None, megatron_core_version=version
            ).best
            nothing_fits = False
        except NothingFits as exc:
            # the layout at the setting that needs the least memory among those Megatron
            # accepts (plan's candidates; never a refused one such as full recompute beside a
            # scoped CUDA graph): the row says it does not fit
            best, nothing_fits = exc.smallest, True
        except ConfigError:
            return None  # no recompute setting Megatron accepts runs this layout
        config = Config(config.model, config.parallel, best.recompute, config.assumptions)
        est, band = best.estimate, best.band or error_band(config, best.estimate)
        added = best.estimate.recompute + (f" + {best.offload}" if best.offload else "")
        if nothing_fits:
            added += (
                " (nothing fits: the least memory of any valid recompute setting, "
                f"{est.held_bytes / GIB:.1f} GiB held with what the rank keeps beside its total)"
            )
    step = step_time(config, micro, hw, _offloaded_per_stage(config))
    host_ok = fits_host(est)
    adds = _adds(config, step, micro)
    if est.offloaded_bytes:  # the host memory offloading takes, said on every such row
        adds += f", host memory {est.offloaded_bytes / 2**30:.0f} GiB per GPU" + (
            ""
            if host_ok
            else f" (more than {HOST_MEMORY_PER_GPU_BYTES / 2**30:.0f} GiB, a DGX H100's share)"
        )
    if fp32:
        adds += (
            ", fp32: torchtitan turns mixed precision off for TP / PP without FSDP or CP "
            "(maybe_enable_amp)"
        )
    shown = f", recompute {added}" if added else ""
    states_offloaded = config.parallel.optimizer_offload or config.parallel.param_offload
    if is_trainer_run(config) or states_offloaded:
        seconds, words, trainer_host_ok = sharding_cost(config, hw.host_link_gbps)
        step = with_host_link(step, seconds)
        host_ok = host_ok and trainer_host_ok
        adds = ", ".join(x for x in (adds, words) if x and x != "-") or "-"
    if is_trainer_run(config) and added and keys is not None:
        on = config.recompute.recompute_granularity is not None
        unchanged = on == was_on
        shown = "" if unchanged else f", {checkpointing_setting(keys, on)}"
        shown += " (nothing fits)" if "nothing fits" in added else ""
    return Lever(
        lever,
        setting + shown,
        config,
        est,
        planned_bytes(est) <= usable and host_ok,
        planned_bytes(est) + band.total_bytes <= usable and host_ok,
        step,
        adds,
        added,
    )


def _torchtitan_without_amp(config: Config) -> bool:
    """A torchtitan layout with TP or PP and neither FSDP (data_parallel_shard_degree > 1) nor
    CP: its maybe_enable_amp (torchtitan/distributed/utils.py) turns mixed precision off, and
    the run trains in fp32."""
    p = config.parallel
    return (
        config.model.loss_implementation == "torchtitan"
        and config.model.bf16
        and p.data_parallel_size == 1
        and p.context_parallel_size == 1
        and (p.tensor_model_parallel_size > 1 or p.pipeline_model_parallel_size > 1)
    )


def _splits(config: Config) -> list[tuple[int, int, int]]:
    """(cp, pp, dp) at the same GPU count and TP, other than the current."""
    p = config.parallel
    rest = _world(config) // p.tensor_model_parallel_size
    out = []
    for cp in (2**i for i in range(5)):
        for pp in range(1, MAX_SPLIT + 1):
            if cp > MAX_SPLIT or rest % (cp * pp):
                continue
            if (cp, pp) != (p.context_parallel_size, p.pipeline_model_parallel_size):
                out.append((cp, pp, rest // (cp * pp)))
    return out


def levers(
    config: Config,
    gpu_memory_gb: float,
    safety_margin: float = SAFETY_MARGIN,
    hw: Hardware | None = None,
    global_batch_size: int | None = None,
    megatron_core_version: str | None = None,
    trainer_format: str = "hf-trainer",
    sharding_backend: str = "deepspeed",
    no_context_parallel: str | None = None,
    plan_format: str = "megatron-bridge",
) -> LeverTable:
    """Every lever's row, ranked: fits and clears the error band first, then fits, then by
    predicted step time (those that do not fit: by peak memory). A Hugging Face Trainer run
    gets its own levers (`_trainer_rows`), named in `trainer_format`'s keys
    (export.TRAINER_KEYS: "hf-trainer" or "llama-factory"), its sharding as `sharding_backend`
    ("deepspeed" or "fsdp") writes it. `no_context_parallel`: why the run cannot use context
    parallelism (its framework refuses it for this run), None where it can. `plan_format`:
    the framework the rows are written for (export.FORMATS): a row needs a key there (NeMo-RL
    has no VPP key, and full recompute only as uniform, 1 layer)."""
    hw = hw or Hardware()
    usable = int(int(gpu_memory_gb * GIB) * (1 - safety_margin))
    m, p = config.model, config.parallel
    notes = []
    if global_batch_size is None:
        global_batch_size = (
            m.micro_batch_size * p.data_parallel_size * 4 * max(p.pipeline_model_parallel_size, 2)
        )
        notes.append(
            f"global batch unknown: assumed {global_batch_size} (4 x max(pp, 2) micro-batches "
            "per data-parallel rank); give --global-batch-size"
        )
    try:
        micro_batches_per_step(config, global_batch_size)
    except ConfigError as exc:
        raise ConfigError(f"{exc}: the run as given cannot step (--global-batch-size)") from None
    # the framework the plan's pick is written for: it decides what recompute can be set
    if trainer_format == "nemo-rl-dtensor":
        plan_format = trainer_format
    args = (
        global_batch_size,
        hw,
        usable,
        gpu_memory_gb,
        safety_margin,
        megatron_core_version,
        plan_format,
    )
    current = _evaluate("current", "as given", config, *args, fallback="never")
    if current is None:
        raise ConfigError(
            f"the run as given is not a valid layout for a global batch of {global_batch_size}: "
            + _why_not(config, global_batch_size)
        )
    rows: list[Lever | None] = [current]
    # NeMo Automodel runs Hugging Face models with Megatron-like parallelism: the layout levers
    automodel = trainer_format == "automodel"
    # NeMo-RL's DTensor policy: TP / CP / SP, no pipeline, no activation offloading
    dtensor = trainer_format == "nemo-rl-dtensor"
    if dtensor:
        notes.append(
            "a NeMo-RL DTensor run: no pipeline parallelism and no activation offloading; "
            "NeMo-RL refuses context parallelism with sequence packing or sequence "
            "parallelism (policy.sequence_packing.enabled false for a CP row)"
        )
    if automodel:
        notes.append(
            "a NeMo Automodel run: the layouts are distributed.cp_size / pp_size (dp_size "
            "follows), the micro-batch step_scheduler.local_batch_size "
            "(distributed.pipeline.pp_microbatch_size under PP); no activation offloading"
        )
    if is_trainer_run(config) and not automodel:
        from ..export import TRAINER_KEYS

        keys = TRAINER_KEYS.get(trainer_format, TRAINER_KEYS["hf-trainer"])
        rows += _trainer_rows(config, args, keys, sharding_backend)
        notes.append(
            "a Hugging Face Trainer run: no tensor, pipeline or context parallelism and no "
            "distributed optimizer there; its levers are checkpointing, the micro-batch, "
            "how model states are sharded and offloaded (recompute_kit/plan/trainer_levers.py) "
            "and Liger's fused loss"
        )
        return _ranked(rows, current, hw, global_batch_size, usable, notes)
    rows.append(_evaluate("recompute", "plan's pick", config, *args, fallback="always"))
    # Where the run's recompute costs, a layout that frees memory is worth its cheaper
    # recompute: its row takes the plan's pick for that layout (else the run's own setting,
    # re-planned only where it does not fit)
    layout_fallback = "always" if current.estimate.recompute_flops_fraction > 0.02 else "if-needed"
    layout_fixed = bool(p.pipeline_model_parallel_layout) or dtensor
    titan_splits_batch = (
        m.loss_implementation == "torchtitan" and p.pipeline_model_parallel_size == 1
    )
    if not no_context_parallel and not has_key(plan_format, "context_parallel_size"):
        no_context_parallel = f"{plan_format} has no key for it"
    if not layout_fixed or dtensor:
        if no_context_parallel:
            notes.append(f"left out: context parallelism ({no_context_parallel})")
        for cp, pp, dp in _splits(config):
            if (dtensor and pp > 1) or (no_context_parallel and cp > 1):
                continue
            c = config.replace(
                context_parallel_size=cp,
                pipeline_model_parallel_size=pp,
                data_parallel_size=dp,
                virtual_pipeline_model_parallel_size=(
                    p.virtual_pipeline_model_parallel_size
                    if pp == p.pipeline_model_parallel_size
                    else None
                ),
                num_layers_in_first_pipeline_stage=None,
                num_layers_in_last_pipeline_stage=None,
            )
            setting = f"cp={cp} pp={pp} dp={dp}"
            if titan_splits_batch and pp > 1:
                # torchtitan splits the local batch into pipeline_parallel_microbatch_size
                # micro-batches (default 1); the local batch itself is unchanged
                c = c.replace(micro_batch_size=1)
                setting += " (pipeline_parallel_microbatch_size 1)"
            rows.append(_evaluate("cp x pp", setting, c, *args, fallback=layout_fallback))
            if not current.fits and c.model.micro_batch_size > 1 and (cp > 1 or pp > 1):
                # a layout and a smaller micro-batch together (the step's batch kept): each
                # alone may fall short where the two fit
                one = c.replace(micro_batch_size=1)
                rows.append(
                    _evaluate(
                        "cp x pp + micro-batch",
                        f"{setting}, micro_batch_size=1",
                        one,
                        *args,
                        fallback=layout_fallback,
                    )
                )
    rows += _tensor_parallel(config, args)
    if not layout_fixed and not dtensor:
        rows += _tensor_and_pipeline(config, args, layout_fallback)
    if m.num_moe_experts and has_key(plan_format, "expert_model_parallel_size"):
        rows += _expert_parallel(config, args)
    pp = p.pipeline_model_parallel_size
    vpp_key = has_key(plan_format, "virtual_pipeline_model_parallel_size")
    if pp > 1 and not layout_fixed and not vpp_key:
        notes.append(f"left out: vpp ({plan_format} has no key for it)")
    if pp > 1 and not layout_fixed:
        for v in range(1, MAX_VPP + 1) if vpp_key else ():
            if v != (p.virtual_pipeline_model_parallel_size or 1):
                c = config.replace(virtual_pipeline_model_parallel_size=v if v > 1 else None)
                rows.append(_evaluate("vpp", f"vpp={v}", c, *args))
        if has_key(plan_format, "num_layers_in_first_pipeline_stage"):
            rows += _uneven(config, args)
        else:
            notes.append(f"left out: uneven stages ({plan_format} has no key for them)")
    left_out = []  # levers that cannot help this run, said in one note
    larger = [b for b in MICRO_BATCH_SIZES if b > m.micro_batch_size]
    if larger and not current.fits:
        # a larger micro-batch only adds activations: no help while the run does not fit
        left_out.append(
            f"micro_batch_size {'/'.join(map(str, larger))} (a larger micro-batch adds "
            "activations and the run as given does not fit)"
        )
    for b in MICRO_BATCH_SIZES:
        if b != m.micro_batch_size and (current.fits or b < m.micro_batch_size):
            c = config.replace(micro_batch_size=b)
            rows.append(_evaluate("micro-batch", f"micro_batch_size={b}", c, *args))
    for rc, offload in candidates(config, fmt=plan_format) if not (automodel or dtensor) else ():
        if offload:
            c = Config(m, p, dataclasses.replace(rc), config.assumptions)
            row = _evaluate(
                "offload", f"{offload} + {c.recompute.spec}", c, *args, fallback="never"
            )
            rows.append(row)
    rows.append(_fused_loss(config, args, plan_format, left_out))
    states = sharding_mode(config)
    titan = m.loss_implementation == "torchtitan"
    if titan and states == "fsdp2" and not (p.optimizer_offload or p.param_offload):
        # torchtitan's FSDP2 CPUOffloadPolicy: parameters, gradients and optimizer states
        c = config.replace(optimizer_offload=True, param_offload=True)
        setting = (
            "config.training.enable_cpu_offload = True"
            if plan_format == "torchtitan-registry"
            else "[training] enable_cpu_offload = true"
        )
        rows.append(_evaluate("CPU offload", setting, c, *args))
    if states != "megatron" and not p.use_distributed_optimizer:
        # FSDP2 / ZeRO / Megatron-FSDP already shard the optimizer states over DP
        name = {"fsdp2": "FSDP2", "zero": "ZeRO", "megatron_fsdp": "Megatron-FSDP"}[states]
        left_out.append(
            f"distributed optimizer ({name} stage {p.zero_stage} already shards the model "
            "states over data parallel)"
        )
    elif not has_key(plan_format, "use_distributed_optimizer"):
        left_out.append(f"distributed optimizer ({plan_format} has no key for it)")
    elif not p.use_distributed_optimizer and p.data_parallel_size > 1:
        c = config.replace(use_distributed_optimizer=True)
        row = _evaluate("distributed optimizer", "use_distributed_optimizer", c, *args)
        if row is not None:
            row.adds = (
                "0 s: reduce-scatter + all-gather move the bytes of the all-reduce they replace"
                + ("" if row.adds == "-" else ", " + row.adds)
            )
        rows.append(row)
    if left_out:
        notes.append("left out: " + "; ".join(left_out))
    return _ranked(rows, current, hw, global_batch_size, usable, notes)


# Megatron-Core's fused cross-entropy from Transformer Engine (cross_entropy_fusion_impl "te":
# the gradient written into the logits in place, no fp32 softmax kept), in each format's keys
_FUSED_LOSS_KEYS = {
    "megatron-lm": "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te",
    "megatron-bridge": "model.cross_entropy_loss_fusion=true model.cross_entropy_fusion_impl=te",
}


def _fused_loss(config: Config, args: tuple, plan_format: str, left_out: list[str]):
    """The run's loss fused by Transformer Engine, where Megatron's loss keeps the fp32
    softmax of the logits (the unfused or the native fused loss): a lever of its own when the
    logits dominate a long-sequence or large-vocabulary run."""
    m = config.model
    if m.loss_implementation != "megatron" or (
        m.cross_entropy_loss_fusion and m.cross_entropy_fusion_impl == "te"
    ):
        return None
    setting = _FUSED_LOSS_KEYS.get(plan_format)
    if setting is None and plan_format == "nemo-rl":
        # NeMo-RL takes its own log-probs (DistributedLogprob), never Megatron's loss
        left_out.append(
            "a fused loss: NeMo-RL computes its own log-probabilities; its "
            "policy.megatron_cfg.use_fused_linear_logprobs (the logits a chunk of tokens at a "
            "time) is not priced here"
        )
        return None
    if setting is None:
        left_out.append(f"Transformer Engine's fused loss (no key for it known in {plan_format})")
        return None
    c = config.replace(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    c.megatron_core_version = args[5] or c.megatron_core_version  # (levers' version argument)
    if plan_format == "megatron-lm" and te_cross_entropy_refused(c):
        left_out.append(
            "Transformer Engine's fused loss (Megatron-LM refuses --cross-entropy-fusion-impl te "
            "from core_v0.19; its native fusion keeps the same tensors)"
        )
        return None
    refused = te_cross_entropy_refused(c)  # Megatron-LM's own check, from core_v0.19
    return _with_adds(
        _evaluate("fused loss", setting, c, *args),
        "needs Transformer Engine; its speed is not timed; the run has it off: check why "
        "(a recipe may turn it off on purpose)"
        + ("; Megatron-LM refuses the te implementation from core_v0.19" if refused else ""),
    )


def _ranked(
    rows: list[Lever | None],
    current: Lever,
    hw: Hardware,
    global_batch_size: int,
    usable: int,
    notes: list[str],
) -> LeverTable:
    found = [r for r in rows if r is not None]
    for r in found:
        r.baseline_seconds = current.step.seconds
    found.sort(
        key=lambda r: (
            not r.fits,
            not r.clears_band,
            r.step.seconds if r.fits else r.estimate.total_bytes,
            # at one step time, the larger micro-batch: fewer per-micro-batch collectives
            # (ZeRO-3 / FSDP gathers), launches and optimizer hooks, none of them timed
            -r.config.model.micro_batch_size,
        )
    )
    return LeverTable(found, current, hw, global_batch_size, usable, notes)


def _trainer_rows(
    config: Config, args: tuple, keys: dict[str, str], backend: str
) -> list[Lever | None]:
    """The Hugging Face Trainer's levers (trainer_levers.py), in the framework's keys."""
    rows: list[Lever | None] = []
    on = config.recompute.recompute_granularity is not None
    other = config.with_recompute("none" if on else "full:uniform:1")
    rows.append(
        _evaluate(
            "gradient checkpointing",
            checkpointing_setting(keys, not on),
            other,
            *args,
            fallback="never",
            keys=keys,
        )
    )
    gbs, dp = args[0], config.parallel.data_parallel_size
    pairs = config.parallel.preference_pairs
    for b in MICRO_BATCH_SIZES:
        setting = micro_batch_setting(keys, b, gbs, dp, pairs)
        if b != config.model.micro_batch_size and setting:
            c = config.replace(micro_batch_size=b)
            rows.append(_evaluate("micro-batch", setting, c, *args, keys=keys))
    lever = "FSDP sharding" if backend == "fsdp" else "ZeRO stage / offload"
    others: list[tuple[str, str, Config, str]] = []  # (lever, setting, the change, adds)
    # (Automodel shards through distributed.strategy, already FSDP2's full sharding: none)
    for setting, c in sharding_settings(config, backend) if backend != "automodel" else ():
        others.append((lever, setting, c, ""))
    if not config.model.fused_linear_cross_entropy and keys["liger"]:
        # Liger's fused linear cross-entropy: the full logits never exist (memory/estimate.py)
        fused = config.replace(fused_linear_cross_entropy=True)
        adds = "pip install liger-kernel; for the model types Liger supports"
        if keys["liger"] == "use_liger_kernel":
            # TrainingArguments has the key from huggingface/transformers#32860 (reviewed
            # 2024-08-19/20, after 4.44 was out): an older pin (LLaVA's 4.37) rejects it
            adds += "; use_liger_kernel needs transformers >= 4.45"
        if config.parallel.zero_stage >= 3:
            # Liger's loss reads lm_head.weight without calling the module, so ZeRO-3 may not
            # have gathered it (linkedin/Liger-Kernel#767: Qwen2.5-1.5B-Instruct under ZeRO-3
            # with parameter offload, ZeroDivisionError; huggingface/trl#3368, fixed for TRL's
            # GRPO in trl#5891 and its DPO / KTO in trl#6372)
            adds += (
                "; under ZeRO-3 Liger's loss can meet an ungathered lm_head.weight "
                "(linkedin/Liger-Kernel#767): run a few steps first"
            )
        others.append(("fused loss", f"{keys['liger']}: true", fused, adds))
    for name, setting, c, adds in others:
        rows.append(_with_adds(_evaluate(name, setting, c, *args, keys=keys), adds))
    least = 2 if pairs else 1  # (one pair: two sequences)
    smallest = micro_batch_setting(keys, least, gbs, dp, pairs)
    fits = any(r is not None and r.fits for r in rows)
    if not fits and smallest and config.model.micro_batch_size > least:
        # no one lever fits: each other lever at the largest smaller micro-batch that fits with
        # it (the global batch kept, the fewest extra micro-batches: a re-trial found offload
        # at micro-batch 8 fitting where only micro-batch 1 was offered), else at the least
        sizes = sorted(
            {least, *(b for b in MICRO_BATCH_SIZES if least < b < config.model.micro_batch_size)},
            reverse=True,
        )
        for name, setting, c, adds in others:
            row = None
            for b in sizes:
                label = micro_batch_setting(keys, b, gbs, dp, pairs)
                if not label:
                    continue
                both = c.replace(micro_batch_size=b)
                row = _evaluate(name, f"{label} + {setting}", both, *args, keys=keys)
                if row is not None and row.fits:
                    break
            rows.append(_with_adds(row, adds))
    return rows


def _with_adds(row: Lever | None, adds: str) -> Lever | None:
    """The row with what the setting needs besides its keys (a package, a version)."""
    if row is not None and adds:
        row.adds = adds if row.adds in ("", "-") else f"{row.adds}; {adds}"
    return row


def _tensor_parallel(config: Config, args: tuple) -> list[Lever | None]:
    """Every other TP size within a node (1-8, or the inputs' GPUs per node) that the run's
    GPUs hold at its PP x CP (data parallel takes the rest), sequence parallelism with it;
    priced with its collectives (step_time.py). Megatron's and the framework's shape rules
    refuse what cannot run."""
    p = config.parallel
    world, others = _world(config), p.pipeline_model_parallel_size * p.context_parallel_size
    rows: list[Lever | None] = []
    for t in (1, 2, 4, 8):
        if t == p.tensor_model_parallel_size or world % (t * others) or t > node_gpus(config):
            continue  # (TP's all-reduces stay inside a node)
        dp = world // (t * others)
        c = config.replace(
            tensor_model_parallel_size=t, data_parallel_size=dp, sequence_parallel=t > 1
        )
        rows.append(_evaluate("tp", f"tp={t} dp={dp}" + (" sp" if t > 1 else ""), c, *args))
    if p.tensor_model_parallel_size > 1 and not p.sequence_parallel:
        # the run's own TP with sequence parallelism: the norms', dropouts' and layer inputs'
        # activations split over TP, for the same bytes on the wire (reduce-scatter +
        # all-gather instead of the all-reduce)
        c = config.replace(sequence_parallel=True)
        rows.append(
            _evaluate("tp", f"sequence_parallel (tp={p.tensor_model_parallel_size})", c, *args)
        )
    return rows


def _tensor_and_pipeline(config: Config, args: tuple, fallback: str) -> list[Lever | None]:
    """A larger TP (with SP, within a node) and a deeper pipeline together, at the run's GPU
    count and CP: each alone may need a costly recompute where the two fit without one (a
    skill trial found TP4 PP4 by hand, better than every row listed)."""
    p = config.parallel
    world, cp = _world(config), p.context_parallel_size
    rows: list[Lever | None] = []
    for t in (2, 4, 8):
        if t <= p.tensor_model_parallel_size or t > node_gpus(config):
            continue
        for pp in (2 * p.pipeline_model_parallel_size, 4 * p.pipeline_model_parallel_size):
            if pp > MAX_SPLIT or world % (t * cp * pp):
                continue
            dp = world // (t * cp * pp)
            c = config.replace(
                tensor_model_parallel_size=t,
                sequence_parallel=True,
                pipeline_model_parallel_size=pp,
                data_parallel_size=dp,
                virtual_pipeline_model_parallel_size=None,
                num_layers_in_first_pipeline_stage=None,
                num_layers_in_last_pipeline_stage=None,
            )
            setting = f"tp={t} pp={pp} dp={dp} sp"
            rows.append(_evaluate("tp x pp", setting, c, *args, fallback=fallback))
    return rows


def _expert_parallel(config: Config, args: tuple) -> list[Lever | None]:
    """Every other power-of-two EP size that divides the experts and the ranks (TP x CP x DP
    over expert TP): fewer experts a rank holds and gathers, its all-to-alls priced
    (step_time.py). Megatron's and the framework's rules refuse what cannot run."""
    p, experts = config.parallel, config.model.num_moe_experts or 1
    ranks = p.tensor_model_parallel_size * p.context_parallel_size * p.data_parallel_size
    rows: list[Lever | None] = []
    ep = 1
    while ep <= experts:
        if ep != p.expert_model_parallel_size and experts % ep == 0 and ranks % (ep * p.etp) == 0:
            c = config.replace(expert_model_parallel_size=ep)
            row = _evaluate("ep", f"ep={ep}", c, *args)
            rows.append(row)
            b = config.model.micro_batch_size
            for smaller in sorted({b // 2, 1} - {0, b}) if row is not None and not row.fits else ():
                # with a smaller micro-batch (the step's batch kept): each alone may fall short
                c = c.replace(micro_batch_size=smaller)
                setting = f"ep={ep}, micro_batch_size={smaller}"
                rows.append(_evaluate("ep + micro-batch", setting, c, *args))
        ep *= 2
    return rows


def _uneven(config: Config, args: tuple) -> list[Lever]:
    """The fastest uneven first/last stage splits that fit (or the smallest, if none fits)."""
    p = config.parallel
    pp, layers = p.pipeline_model_parallel_size, config.model.num_layers
    base = layers // pp
    found = []
    for first in range(max(base - UNEVEN_SPAN, 1), base + 2):
        for last in range(max(base - UNEVEN_SPAN, 1), base + 2):
            rest = layers - first - last
            if pp == 2 and rest:
                continue
            if pp > 2 and (rest < pp - 2 or rest % (pp - 2)):
                continue
            cur = (p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage)
            if (first, last) == cur or (
                cur == (None, None) and first == last == base and layers % pp == 0
            ):
                continue
            c = config.replace(
                num_layers_in_first_pipeline_stage=first,
                num_layers_in_last_pipeline_stage=last,
            )
            row = _evaluate("uneven stages", f"first={first} last={last}", c, *args)
            if row is not None:
                found.append(row)
    fit = sorted((r for r in found if r.fits), key=lambda r: r.step.seconds)
    if fit:
        return fit[:UNEVEN_KEEP]
    return sorted(found, key=lambda r: r.estimate.total_bytes)[:1]
