"""The memory levers a Hugging Face Trainer run has (TRL, LLaMA-Factory; DeepSpeed or FSDP).

The Trainer has no tensor, pipeline or context parallelism and no Megatron distributed optimizer
(LLaMA-Factory's and TRL's YAMLs are TrainingArguments plus their own keys): its levers are
gradient checkpointing on or off (`search.candidates`), the per-device micro-batch at the same
global batch (gradient_accumulation_steps takes the rest), and how model states are sharded
and offloaded:

* DeepSpeed: ``zero_optimization.stage`` 0-3, ``offload_optimizer.device: cpu`` (ZeRO-Offload,
  stages 1-3) and ``offload_param.device: cpu`` (ZeRO-Infinity, stage 3 only: DeepSpeed docs,
  "offload_param ... Valid only with stage 3").
* FSDP (``fsdp: full_shard | shard_grad_op | no_shard`` + ``offload``; Accelerate's
  fsdp_sharding_strategy / fsdp_offload_params): the three strategies are ZeRO 3 / 2 / 0, and
  CPU offload moves the parameters, their gradients and the optimizer step to the host together
  (torch FSDP CPUOffload(offload_params=True)).

Their cost, beside the memory the estimate gives (`memory/model_states.py`):

* host memory: what the GPU no longer holds, on the host per GPU: the fp32 master copy and Adam
  moments (12 B/param of the shard) and the fp32 gradients the CPU optimizer steps on (4 B),
  plus the 16-bit parameter shard with parameter offload (2 B); FSDP's offload holds 16 B
  (fp32 parameters, gradients and Adam moments) and is counted as these 18 B. It must fit
  `margins.HOST_MEMORY_PER_GPU_BYTES` (an assumption, said in the row).
* host-link time per step, counted as exposed in the step time (DeepSpeed's CPU optimizer step
  runs after backward, and a parameter fetched from the host is needed before its layer runs):
  optimizer offload sends the shard's 16-bit gradients down and gets its 16-bit parameters back
  (2 B/param each way); parameter offload fetches the 16-bit shard for every forward and
  backward (and the recompute forward with checkpointing on), at `Hardware.host_link_gbps`.
  The CPU Adam step itself is NOT modelled: on a real host it adds more.
* ZeRO stage 3 / full_shard all-gathers the parameters in forward and backward: 3 x the
  parameter bytes on the data-parallel links against DDP's all-reduce 2 x (ZeRO paper, Rajbhandari
  et al. 2020, Sec. 7); data-parallel traffic is outside the step-time model (`step_time.py`),
  so that is said in words, not counted.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..config import Config
from ..memory.model_states import rank_parameters, sharding_mode
from .margins import HOST_MEMORY_PER_GPU_BYTES

GIB = 2**30
GB = 1e9
FSDP_STRATEGY = {3: "full_shard", 2: "shard_grad_op", 0: "no_shard"}


def is_trainer_run(config: Config) -> bool:
    """A Hugging Face Trainer run: the reader's loss_implementation "hf" (sources/hf_trainer.py)."""
    return config.model.loss_implementation == "hf"


def offloaded_words(optimizer: bool, params: bool) -> str:
    """What a sharded run offloads to the host, in words ('' for nothing)."""
    parts = ["optimizer"] * optimizer + ["parameters"] * params
    return " and ".join(parts)


def _shard_params(config: Config) -> float:
    """Parameters of this rank's shard: dense ones over data x context parallel, expert ones
    over the expert-data-parallel ranks (TP x CP x DP / (ETP x EP)), as model_states shards."""
    p = config.parallel
    parts = rank_parameters(config)
    dp_cp = max(p.data_parallel_size * p.context_parallel_size, 1)
    edp = max(p.tensor_model_parallel_size * dp_cp // (p.etp * p.expert_model_parallel_size), 1)
    return parts["dense"] / dp_cp + parts["expert"] / edp


def _level(config: Config) -> int:
    """How far the states are sharded over data parallel: the ZeRO stage, or stage 1 for
    Megatron's distributed optimizer (its optimizer_cpu_offload moves that shard)."""
    p = config.parallel
    return max(p.zero_stage, 1 if p.use_distributed_optimizer else 0)


def host_bytes(config: Config) -> int:
    """Host memory per GPU that the run's offloading takes (module docstring)."""
    p, half = config.parallel, config.model.bf16 or config.model.fp16
    n = _shard_params(config)
    out = 0.0
    fsdp2 = sharding_mode(config) == "fsdp2"  # fp32 parameters and gradients (CPUOffloadPolicy)
    if p.optimizer_offload and _level(config) >= 1 and not p.frozen_base:
        out += (12 + 4) * n if half and not fsdp2 else (8 + 4) * n if fsdp2 else 12 * n
    if p.param_offload and p.zero_stage >= 3:
        out += (2 if half and not fsdp2 else 4) * n
    return round(out)


def host_link_seconds(config: Config, host_link_gbps: float) -> float:
    """Host-link seconds per step of the run's offloading (module docstring), per direction."""
    p, m = config.parallel, config.model
    n, b = _shard_params(config), 2 if (m.bf16 or m.fp16) else 4
    moved = 0.0
    if p.optimizer_offload and _level(config) >= 1 and not p.frozen_base:
        moved += b * n  # gradients down, parameters up: each way in parallel
    if p.param_offload and p.zero_stage >= 3:
        passes = 3 if config.recompute.recompute_granularity == "full" else 2
        moved += passes * b * n
    return moved / (host_link_gbps * GB)


def sharding_settings(config: Config, backend: str) -> list[tuple[str, Config]]:
    """(setting as the framework writes it, config) for every sharding / offload other than the
    run's. backend: "fsdp", "deepspeed" (its JSON's keys) or "accelerate" (DeepSpeed through
    an Accelerate config's deepspeed_config)."""
    p = config.parallel
    current = (p.zero_stage, bool(p.optimizer_offload), bool(p.param_offload))
    out = []
    if backend == "accelerate-fsdp":  # an Accelerate config's fsdp_config
        for stage in (3, 2):
            for offload in (False, True):
                if (stage, offload, offload) == current:
                    continue
                words = ", ".join(_accelerate_fsdp_keys(config, stage, offload))
                c = config.replace(zero_stage=stage, optimizer_offload=offload)
                out.append((words, c.replace(param_offload=offload)))
        return out
    if backend == "fsdp":
        for stage, name in FSDP_STRATEGY.items():
            # transformers FSDPOption: "offload" only with full_shard or shard_grad_op
            for offload in (False, True) if stage else (False,):
                if (stage, offload, offload) == current:
                    continue
                words = f"fsdp: {name}" + (" offload" if offload else "")
                c = config.replace(zero_stage=stage, optimizer_offload=offload)
                out.append((words, c.replace(param_offload=offload)))
        return out
    # DeepSpeed's JSON keys, or Accelerate's deepspeed_config (backend "accelerate")
    accelerate = backend == "accelerate"
    # a run without DeepSpeed (the Trainer's autocast over fp32 weights) that takes it on gets
    # DeepSpeed's mixed precision: 16-bit weights, the fp32 master copy in the optimizer
    precision = "fp32_master" if p.param_precision == "amp" else p.param_precision
    stage_key = "deepspeed_config.zero_stage" if accelerate else "zero_optimization.stage"
    opt_key = "deepspeed_config.offload_optimizer_device" if accelerate else "offload_optimizer"
    par_key = "deepspeed_config.offload_param_device" if accelerate else "offload_param"
    for stage in (0, 1, 2, 3):
        for opt in (False, True) if stage >= 1 else (False,):
            for par in (False, True) if stage == 3 and opt else (False,):
                if (stage, opt, par) == current:
                    continue
                words = f"{stage_key} {stage}"
                if opt:
                    words += f", {opt_key} cpu"
                if par:
                    words += f", {par_key} cpu"
                c = config.replace(zero_stage=stage, optimizer_offload=opt)
                out.append((words, c.replace(param_offload=par, param_precision=precision)))
    return out


def _accelerate_fsdp_keys(config: Config, stage: int, offload: bool) -> list[str]:
    """FSDP2 says full / grad-op sharding with reshard_after_forward, FSDP1 with its strategy;
    fsdp_offload_params puts parameters, gradients and the optimizer step on the host."""
    if config.parallel.use_torch_fsdp2:
        shard = f"fsdp_config.fsdp_reshard_after_forward {'true' if stage == 3 else 'false'}"
    else:
        shard = f"fsdp_config.fsdp_sharding_strategy {FSDP_STRATEGY[stage].upper()}"
    return [shard, f"fsdp_config.fsdp_offload_params {'true' if offload else 'false'}"]


def sharding_snippet(config: Config, backend: str) -> list[str]:
    """`config`'s sharding and offload as the lines to paste where `backend` reads them: the
    DeepSpeed JSON's zero_optimization, an Accelerate config's deepspeed_config, or the
    Trainer's fsdp option."""
    p = config.parallel
    if backend == "accelerate-fsdp":
        keys = _accelerate_fsdp_keys(config, p.zero_stage, bool(p.param_offload))
        return ["fsdp_config:", *(f"  {k.split('.', 1)[1].replace(' ', ': ', 1)}" for k in keys)]
    if backend == "fsdp":
        name = FSDP_STRATEGY.get(p.zero_stage)
        if name is None:
            return ["# no FSDP sharding: drop the fsdp option (plain DDP)"]
        return [f"fsdp: {name} auto_wrap" + (" offload" if p.optimizer_offload else "")]
    if backend == "accelerate":
        lines = ["deepspeed_config:", f"  zero_stage: {p.zero_stage}"]
        lines += [f"  offload_optimizer_device: {'cpu' if p.optimizer_offload else 'none'}"]
        if p.zero_stage == 3:
            lines += [f"  offload_param_device: {'cpu' if p.param_offload else 'none'}"]
        return lines
    zero: dict[str, Any] = {"stage": p.zero_stage}
    if p.optimizer_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    if p.param_offload:
        zero["offload_param"] = {"device": "cpu"}
    return [
        "# in the DeepSpeed JSON the run passes (--deepspeed / deepspeed:):",
        json.dumps({"zero_optimization": zero}),
    ]


def sharding_cost(config: Config, host_link_gbps: float) -> tuple[float, str, bool]:
    """(exposed host-link seconds per step, what the setting costs in words, fits the host).
    ZeRO-3's per-micro-batch collectives are the step time's own (plan/step_time.py)."""
    p = config.parallel
    parts = []
    seconds = host_link_seconds(config, host_link_gbps)
    host = host_bytes(config)
    fits = host <= HOST_MEMORY_PER_GPU_BYTES
    what = offloaded_words(
        bool(p.optimizer_offload and _level(config) >= 1 and not p.frozen_base),
        bool(p.param_offload and p.zero_stage >= 3),
    )
    if what:
        parts.append(
            f"{what} on the host: {host / GIB:.1f} GiB of host memory per GPU"
            + ("" if fits else f" (more than {HOST_MEMORY_PER_GPU_BYTES / GIB:.0f} GiB)")
            + f", host link {seconds:.3g} s/step, CPU Adam not timed"
        )
    return seconds, ", ".join(parts), fits


def micro_batch_setting(
    keys: dict[str, str], micro: int, gbs: int, dp: int, pairs: bool = False
) -> str | None:
    """The framework's keys for a micro-batch of `micro` sequences at the same global batch,
    or None where the accumulation steps would not be whole; `pairs`: the keys count DPO's
    preference pairs (two sequences each), so an odd `micro` has none."""
    if gbs % (micro * dp) or (pairs and micro % 2):
        return None
    shown = f"{micro // 2} (pairs)" if pairs else f"{micro}"
    if not keys["accumulation"]:  # the framework derives it from its global batch
        return f"{keys['micro_batch']}={shown}"
    return f"{keys['micro_batch']}={shown} {keys['accumulation']}={gbs // (micro * dp)}"


def with_host_link(step, seconds: float):
    """The step with `seconds` of host-link time exposed."""
    if not seconds:
        return step
    return dataclasses.replace(
        step,
        seconds=step.seconds + seconds,
        offload_exposed_s=step.offload_exposed_s + seconds,
    )


def checkpointing_setting(keys: dict[str, str], on: bool) -> str:
    """Gradient checkpointing in the framework's own key (LLaMA-Factory's is a disable flag)."""
    key = keys["checkpointing"]
    value = not on if key.startswith("disable_") else on
    return f"{key}={str(value).lower()}"
