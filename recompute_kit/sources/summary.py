"""What was read, in words: the short summary every command prints, and `read`'s full table
(each value beside where it came from, as `git config --show-origin` shows them)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .reading import FROM_ASSUMED, FROM_DEFAULT, MEMORY_KEYS, MLA_KEYS, MOE_KEYS, Origin, Reading

_KIND_WORDS = {
    "file": "read from the inputs",
    "argument": "from recompute-kit's options",
    "model": "from the model's config",
    "default": "framework defaults",
    "derived": "derived",
}


def summary_lines(
    reading: Reading, inputs: list[dict[str, str]], assumptions: bool = True
) -> list[str]:
    """A few lines: the inputs and their formats, how many memory-relevant values came from
    where, every assumption with the key that sets it (unless the caller prints them with the
    layout), and the warnings."""
    names = ", ".join(f"{i['path']} ({i['format']})" for i in inputs)
    lines = [f"read: {names}; framework {reading.framework or 'unknown'}"]
    if reading.model_name:
        lines[0] += f"; model {reading.model_name}"
    counts = Counter(reading.origins[k].kind for k in MEMORY_KEYS if k in reading.origins)
    parts = [f"{counts[k]} {w}" for k, w in _KIND_WORDS.items() if counts[k]]
    if parts:
        lines.append(f"  memory-relevant values: {', '.join(parts)}")
    said = set()
    for key, origin in reading.origins.items():
        if origin.kind == FROM_ASSUMED:
            said.add(text := assumption_text(key, reading.values[key], origin))
            if assumptions:
                lines.append(f"  {text}")
    # (resolve repeats each assumption among the warnings: said once above, or with the layout)
    lines += [f"  warning: {w}" for w in reading.warnings if w not in said]
    return lines


def assumption_text(key: str, value: Any, origin: Origin) -> str:
    """`assumed: data_parallel_size = 1 (nothing says it; set --dp)`: an assumption, in words."""
    note = f": {origin.note}" if origin.note else ""
    return f"assumed: {key} = {_show(value)} (nothing says it{note}; set {origin.key})"


def table_rows(reading: Reading) -> list[list[str]]:
    """One row per value: field, value, where it came from. Memory-relevant ones first; a
    default of a feature the run does not use (MLA's ranks on a model without MLA, an FP8
    recipe without FP8) is left out of the table (`read --json` keeps every value)."""
    order = [k for k in MEMORY_KEYS if k in reading.values]
    order += sorted(k for k in reading.values if k not in MEMORY_KEYS)
    unused = _unused_defaults(reading)
    return [
        [k, _show(reading.values[k]), reading.origins[k].describe()]
        for k in order
        if k not in unused
    ]


def _unused_defaults(reading: Reading) -> set[str]:
    keys: set[str] = set()
    if not reading.get("multi_latent_attention"):
        keys.update(MLA_KEYS)
    if not reading.get("num_moe_experts"):  # (num_moe_experts None itself says "dense")
        keys.update(MOE_KEYS)
        keys.update(k for k in reading.origins if k.startswith(("moe_", "expert_")))
    if not reading.get("fp8"):
        keys.add("fp8_recipe")
    if reading.framework in ("hf-trainer", "torchtitan"):
        # Megatron's DDP and optimizer options: the Trainer's and torchtitan's own decide these
        keys.update(("grad_reduce_in_fp32", "use_precision_aware_optimizer", "main_params_dtype",
                     "exp_avg_dtype", "exp_avg_sq_dtype", "use_distributed_optimizer"))
    return {k for k in keys if k in reading.origins and reading.origins[k].kind == FROM_DEFAULT}


def _show(value: Any) -> str:
    if isinstance(value, list) and len(value) > 12:
        return f"[{', '.join(map(str, value[:6]))}, ... ({len(value)} items)]"
    return repr(value) if isinstance(value, str) else str(value)
