"""Hugging Face Accelerate config YAMLs (`accelerate launch --config_file X`): how a Trainer /
TRL run is sharded and launched. What they say about memory:

* `distributed_type`: DEEPSPEED (`deepspeed_config.zero_stage`, `offload_optimizer_device`,
  `offload_param_device`: cpu or nvme moves them off the GPU), FSDP (`fsdp_config.
  fsdp_sharding_strategy`: FULL_SHARD / HYBRID_SHARD = ZeRO-3, SHARD_GRAD_OP / HYBRID_SHARD_ZERO2
  = ZeRO-2, NO_SHARD = none, or the numbers 1-4 of older files; `fsdp_offload_params`), or
  MULTI_GPU / NO (DDP or one process: nothing sharded);
* `num_processes`: every process of the job (accelerate's total over `num_machines`);
* `mixed_precision`: bf16 / fp16 / no.

The reading's framework is the Trainer's (`hf-trainer`), so its defaults apply when the
config is read beside the training YAML. Source: accelerate's `accelerate config` docs and
its `ClusterConfig` fields; a real file in tests/sources/corpus/hf_trainer/.
"""

from __future__ import annotations

import re
from typing import Any

from ..config import ConfigError
from .hf_trainer import yaml_mapping
from .reading import Origin, Reading

FRAMEWORKS: tuple[str, ...] = ()  # (the Trainer's: hf_trainer.py owns the defaults)
FORMAT = "Accelerate config YAML"

_FSDP_STAGES = {
    "FULL_SHARD": 3,
    "HYBRID_SHARD": 3,
    "SHARD_GRAD_OP": 2,
    "HYBRID_SHARD_ZERO2": 2,
    "NO_SHARD": 0,
    "1": 3,
    "2": 2,
    "3": 0,
    "4": 3,
}
_OFF_GPU = ("cpu", "nvme")


def sniff(text: str, path: str) -> int:
    if not path.lower().endswith((".yaml", ".yml")):
        return 0
    keys = ("distributed_type", "compute_environment", "num_processes", "mixed_precision")
    hits = sum(bool(re.search(rf"^{k}\s*:", text, re.M)) for k in keys)
    return 95 if hits >= 3 and re.search(r"^distributed_type\s*:", text, re.M) else 0


def _origin(text: str, path: str, *keys: str, note: str = "") -> Origin:
    """The line of the last of `keys`, each searched after the one before."""
    start = 0
    for key in keys:
        match = re.compile(rf"^\s*{re.escape(key)}\s*:", re.M).search(text, start)
        if not match:
            return Origin("file", path, ".".join(keys), note)
        start = match.end()
    line = text.count("\n", 0, start) + 1
    return Origin("file", f"{path}:{line}", ".".join(keys), note)


def read(text: str, path: str) -> Reading:
    data = yaml_mapping(text, path, "an Accelerate config")
    reading = Reading(framework="hf-trainer", format=FORMAT)
    kind = str(data.get("distributed_type", "NO")).upper()
    where = lambda *keys, note="": _origin(text, path, *keys, note=note)  # noqa: E731
    if kind == "DEEPSPEED":
        ds: dict[str, Any] = data.get("deepspeed_config") or {}
        if ds.get("deepspeed_config_file"):
            reading.unused["deepspeed_config.deepspeed_config_file"] = ds["deepspeed_config_file"]
            reading.warnings.append(
                f"{path}: deepspeed_config_file {ds['deepspeed_config_file']}: give that JSON "
                "too (its ZeRO stage and offloading are not in this file)"
            )
        if ds.get("zero_stage") is not None:
            stage = ds["zero_stage"]
            if not isinstance(stage, int) or not 0 <= stage <= 3:
                raise ConfigError(f"{path}: deepspeed_config.zero_stage = {stage!r} is not 0-3")
            reading.set("zero_stage", stage, where("deepspeed_config", "zero_stage"))
        for key, field in (
            ("offload_optimizer_device", "optimizer_offload"),
            ("offload_param_device", "param_offload"),
        ):
            if ds.get(key) is not None:
                on = str(ds[key]).lower() in _OFF_GPU
                reading.set(field, on, where("deepspeed_config", key))
    elif kind == "FSDP":
        fsdp: dict[str, Any] = data.get("fsdp_config") or {}
        strategy = fsdp.get("fsdp_sharding_strategy")
        version = fsdp.get("fsdp_version", 1)
        if version == 2:
            # FSDP2 (fully_shard): its parameters are fp32 shards, computed in bf16
            reading.set("use_torch_fsdp2", True, where("fsdp_config", "fsdp_version"))
        reshard = fsdp.get("fsdp_reshard_after_forward")
        if strategy is None and version == 2:
            # FSDP2 has no sharding strategy: reshard_after_forward true is FULL_SHARD, false
            # SHARD_GRAD_OP (accelerate's FullyShardedDataParallelPlugin; its default: true)
            stage = 2 if reshard is False else 3
            note = "FSDP2 reshard_after_forward " + (
                f"{str(reshard).lower()}" if reshard is not None else "true (its default)"
            )
            keys = (
                ("fsdp_config", "fsdp_reshard_after_forward")
                if reshard is not None
                else ("fsdp_config", "fsdp_version")
            )
            reading.set("zero_stage", stage, where(*keys, note=note))
        elif strategy is None:
            note = "FSDP FULL_SHARD (accelerate's default sharding strategy)"
            reading.set("zero_stage", 3, where("distributed_type", note=note))
        if fsdp.get("fsdp_activation_checkpointing") is True:
            # accelerate wraps every transformer layer in a checkpoint (the Trainer warns that
            # gradient_checkpointing on top adds a redundant AllGather)
            origin = where("fsdp_config", "fsdp_activation_checkpointing", note="every layer")
            reading.set("recompute_granularity", "full", origin)
            reading.set("recompute_method", "uniform", origin)
            reading.set("recompute_num_layers", 1, origin)
        if strategy is not None:
            stage = _FSDP_STAGES.get(str(strategy).upper())
            if stage is None:
                raise ConfigError(f"{path}: fsdp_sharding_strategy {strategy!r} is not known")
            origin = where("fsdp_config", "fsdp_sharding_strategy", note=f"FSDP {strategy}")
            reading.set("zero_stage", stage, origin)
            if str(strategy).upper().startswith("HYBRID"):
                reading.warnings.append(
                    f"{path}: {strategy}: states are sharded within a node and replicated "
                    "across nodes; the estimate shards them over every data-parallel rank"
                )
        if fsdp.get("fsdp_offload_params") is not None:
            on = bool(fsdp["fsdp_offload_params"])
            for field in ("param_offload", "optimizer_offload"):
                reading.set(field, on, where("fsdp_config", "fsdp_offload_params"))
        prefetch = [
            f"{k} {fsdp[k]}"
            for k in ("fsdp_backward_prefetch", "fsdp_forward_prefetch")
            if fsdp.get(k) not in (None, False, "NO_PREFETCH")
        ]
        if prefetch:
            reading.warnings.append(
                f"{path}: {', '.join(prefetch)}: the next unit's parameters are gathered while "
                "one computes (one more gathered unit in flight), not counted"
            )
        handled = {
            "fsdp_sharding_strategy",
            "fsdp_version",
            "fsdp_reshard_after_forward",
            "fsdp_activation_checkpointing",
            "fsdp_offload_params",
        }
        for key, value in fsdp.items():  # said, not dropped: what the estimate does not use
            if key not in handled:
                reading.unused[f"fsdp_config.{key}"] = value
    elif kind in ("MULTI_GPU", "NO"):
        reading.set("zero_stage", 0, where("distributed_type", note=f"{kind}: nothing sharded"))
    else:
        reading.unused["distributed_type"] = data["distributed_type"]
    if isinstance(data.get("num_processes"), int) and data["num_processes"] >= 1:
        note = "accelerate's num_processes: every process of the job"
        reading.set("world_size", data["num_processes"], where("num_processes", note=note))
    precision = str(data.get("mixed_precision", "")).lower()
    if precision in ("bf16", "fp16", "no"):
        for field in ("bf16", "fp16"):
            reading.set(field, precision == field, where("mixed_precision"))
    used = {"distributed_type", "deepspeed_config", "fsdp_config", "num_processes"}
    used |= {"mixed_precision"}
    for key, value in data.items():
        if key not in used:
            reading.unused[key] = value
    return reading


def apply_defaults(reading: Reading) -> None:
    """(The Trainer's defaults: hf_trainer.apply_defaults, by the reading's framework.)"""


def key_for(field: str) -> str:
    return {
        "zero_stage": "deepspeed_config.zero_stage / fsdp_config.fsdp_sharding_strategy",
        "world_size": "num_processes",
    }.get(field, field)
