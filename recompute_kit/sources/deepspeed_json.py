"""DeepSpeed JSON (config-formats.md s. 8): the ZeRO stage and offloading, the 16-bit mode, the
batch keys, and the ZeRO gradient bucket / prefetch sizes (memory/overheads.py), read with `json`
only. A value of "auto" is filled by the Hugging Face Trainer from its own flags (transformers
`integrations/deepspeed.py`): it is never reported as a value and never hides the Trainer
YAML's key of the same name; the bucket sizes' "auto" waits for the model's hidden size
(`fill_auto_buckets`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config import ConfigError
from .reading import FROM_DERIVED, Origin, Reading
from .trainer_files import _auto, _bool, _int, _Src


def read_deepspeed(
    data: dict[str, Any],
    src: _Src,
    reading: Reading,
    prefix: tuple[str, ...] = (),
    unused_prefix: str = "",
) -> None:
    """DeepSpeed keys; values already set (by the Trainer YAML) are kept."""
    handled: set[str] = set()
    unused: dict[str, Any] = {}

    def origin(*keys: str, note: str = "") -> Origin:
        return src.origin(*prefix, *keys, note=note) if prefix else src.origin(*keys, note=note)

    def put(key: str, value: Any, at: Origin) -> None:
        if key in reading and reading.get(key) != value:
            reading.warnings.append(
                f"{at.where}: {at.key} = {value!r} disagrees with {reading.origins[key].describe()}"
                f" = {reading.get(key)!r} (the Trainer raises on such a mismatch)"
            )
        reading.set(key, value, at, overwrite=False)

    zero = data.get("zero_optimization")
    handled.add("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        raise ConfigError(f"{src.path}: zero_optimization must be an object")
    zero = zero or {}
    if "stage" in zero:
        stage = zero["stage"]
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise ConfigError(f"{src.path}: zero_optimization.stage = {stage!r} (0, 1, 2 or 3)")
        put("zero_stage", stage, origin("zero_optimization", "stage"))
    for section, key in (
        ("offload_optimizer", "optimizer_offload"),
        ("offload_param", "param_offload"),
    ):
        conf = zero.get(section)
        if isinstance(conf, dict) and "device" in conf:
            device = str(conf["device"]).lower()
            put(key, device != "none", origin("zero_optimization", section, "device", note=device))
            if key == "param_offload" and device != "none" and zero.get("stage") != 3:
                reading.warnings.append(f"{src.path}: offload_param works only with ZeRO stage 3")
    _read_zero_buffers(zero, src, reading, origin, put)
    for name, field in (("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16")):
        section = data.get(name)
        handled.add(name)
        if isinstance(section, dict) and "enabled" in section:
            enabled = section["enabled"]
            if _auto(enabled):
                continue  # filled from the Trainer's bf16 / fp16 flags
            put(field, _bool(src, f"{name}.enabled", enabled), origin(name, "enabled"))
        if isinstance(section, dict):
            for key, value in section.items():
                if key != "enabled":
                    unused[f"{name}.{key}"] = value
    for key, field in (
        ("train_micro_batch_size_per_gpu", "micro_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ("train_batch_size", "global_batch_size"),
    ):
        handled.add(key)
        if key in data and not _auto(data[key]):
            put(field, _int(src, key, data[key]), origin(key))
    optimizer = data.get("optimizer")
    if isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        # DeepSpeed builds its FusedAdam for these unless params.torch_adam is true
        # (deepspeed/runtime/engine.py, _configure_basic_optimizer); the Trainer's optim is
        # then not used
        torch_adam = (optimizer.get("params") or {}).get("torch_adam") is True
        put(
            "adam_step_temporary",
            torch_adam,
            origin(
                "optimizer",
                "type",
                note="torch.optim.AdamW (torch_adam)" if torch_adam else "DeepSpeed's FusedAdam",
            ),
        )
    if "activation_checkpointing" in data:
        reading.warnings.append(
            f"{src.path}: activation_checkpointing configures DeepSpeed's own checkpointing API "
            "only; Hugging Face models checkpoint with torch.utils.checkpoint "
            "(gradient_checkpointing)"
        )
    for key, value in data.items():
        if key not in handled:
            unused[key] = value
    for key, value in zero.items():
        if key not in ("stage", "offload_optimizer", "offload_param", *ZERO_BUFFER_KEYS):
            unused[f"zero_optimization.{key}"] = value
    # "auto" says nothing of its own: the Trainer fills it from its arguments
    # (transformers integrations/deepspeed.py, HfTrainerDeepSpeedConfig.fill_match), so it is
    # never reported as a value, and never hides the Trainer YAML's key of the same name.
    unused = {key: value for key, value in unused.items() if not _auto(value)}
    first = ".".join((*prefix, unused_prefix)).strip(".")
    for key, value in unused.items():
        reading.unused[f"{first}.{key}" if first else key] = value


# zero_optimization keys that size ZeRO's gradient bucket and parameter prefetch
# (deepspeed/runtime/zero/config.py), the Config field each sets
ZERO_BUFFER_KEYS = {
    "reduce_bucket_size": "zero_reduce_bucket_size",
    "stage3_prefetch_bucket_size": "zero_prefetch_bucket_size",
    "overlap_comm": "zero_overlap_comm",
}
# "auto": the Trainer fills these from the model's hidden size h (transformers
# integrations/deepspeed.py, trainer_config_finalize): h x h and, at stage 3, 0.9 x h x h
AUTO_BUCKET_SHARE = {"zero_reduce_bucket_size": 1.0, "zero_prefetch_bucket_size": 0.9}


def _read_zero_buffers(zero: dict[str, Any], src: _Src, reading: Reading, origin, put) -> None:
    """ZeRO's bucket sizes (elements) and overlap_comm; "auto" is kept as such until the
    model's hidden size is known (`_fill_auto_buckets`)."""
    for key, field in ZERO_BUFFER_KEYS.items():
        if key not in zero:
            continue
        value = zero[key]
        at = origin("zero_optimization", key)
        if field == "zero_overlap_comm":
            put(field, _bool(src, f"zero_optimization.{key}", value), at)
        elif _auto(value):
            reading.set(field, "auto", at)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            if value != int(value):
                raise ConfigError(f"{src.path}: zero_optimization.{key} = {value!r} is not whole")
            put(field, int(value), at)
        else:
            raise ConfigError(
                f"{src.path}: zero_optimization.{key} = {value!r} is not a number of elements"
            )


def fill_auto_buckets(reading: Reading) -> None:
    h = reading.get("hidden_size")
    for field, share in AUTO_BUCKET_SHARE.items():
        if reading.get(field) != "auto":
            continue
        origin = reading.origins[field]
        if not h:  # (None, not DeepSpeed's default: the file says auto, not the default)
            reading.set(field, None, dataclasses.replace(origin, note="auto: not counted"))
            reading.warnings.append(
                f"{origin.describe()} = auto: the Trainer fills it from the model's hidden "
                "size, which nothing gives here: the bucket is not counted"
            )
            continue
        reading.set(
            field,
            int(share * h * h),
            Origin(
                FROM_DERIVED,
                f"{origin.where} {origin.key} auto: the Trainer fills {share:g} x hidden_size^2 "
                "(transformers integrations/deepspeed.py)",
            ),
        )
