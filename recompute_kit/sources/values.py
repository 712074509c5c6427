"""Values and keys shared by the config and log parsers: aliases to Megatron-Core names, typed
values.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from ..config import CONFIG_KEYS

# --------------------------------------------------------------------------------------------
# Values and keys
# --------------------------------------------------------------------------------------------

_INT_RE = re.compile(r"[-+]?\d{1,30}")
_FLOAT_RE = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)")
_NONE_WORDS = frozenset({"None", "null", "Null", "NULL", "~"})
_CONFIG_KEY_SET = frozenset(CONFIG_KEYS)
# Names used by Megatron-LM's argument parser, NeMo 1 and YAML files for Megatron-Core keys.
_KEY_ALIASES = {
    "num_experts": "num_moe_experts",
    "fp8_format": "fp8",
    "activations_checkpoint_granularity": "recompute_granularity",
    "activations_checkpoint_method": "recompute_method",
    "activations_checkpoint_num_layers": "recompute_num_layers",
    "encoder_seq_length": "seq_length",
}
_LIST_KEYS = frozenset({"recompute_modules", "offload_modules", "cuda_graph_scope"})
_SECTION_WORDS = frozenset({"cfg", "config", "model", "recipe"})


def _convert_scalar(text: str) -> Any:
    """ "8" -> 8, "1e-05" -> 1e-05, "True" -> True, "None" -> None; other text unchanged."""
    s = text.strip()
    if s in _NONE_WORDS:
        return None
    if s in ("True", "true"):
        return True
    if s in ("False", "false"):
        return False
    if _INT_RE.fullmatch(s):
        return int(s)
    if len(s) < 64 and _FLOAT_RE.fullmatch(s):
        try:
            return float(s)
        except ValueError:
            return s
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _convert_value(text: str) -> Any:
    """A typed value from text: scalars as in `_convert_scalar`, plus lists written as Python
    literals (`['core_attn', 'mlp']`) or Hydra lists (`[mlp,core_attn]`)."""
    s = text.strip()
    if len(s) >= 2 and s[0] in "[(" and s[-1] in "])" and len(s) < 100_000:
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            inner = s[1:-1].strip()
            return [_convert_scalar(x) for x in inner.split(",") if x.strip()] if inner else []
        return _plain(value)
    if len(s) >= 2 and s[0] == "{" and s[-1] == "}" and len(s) < 100_000:
        try:
            return _plain(ast.literal_eval(s))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return s
    return _convert_scalar(s)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (config values are JSON-shaped)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, (bytes, complex)):
        return repr(value)
    return value


def _canonical_key(name: str) -> str:
    key = name.strip().lstrip("+~").replace("-", "_")
    return _KEY_ALIASES.get(key, key)


def _assign(out: dict[str, Any], path: str, value: Any) -> None:
    """Store `value` under the flat Megatron name of `path` (`model.recompute_modules`), or
    under the dotted path (without a leading `cfg.`/`model.`) when the key is not known."""
    parts = [p for p in path.strip().lstrip("+~").split(".") if p]
    if not parts:
        return
    leaf = _canonical_key(parts[-1])
    if leaf in _CONFIG_KEY_SET or (len(parts) == 1 and leaf):
        key = leaf
    else:
        while len(parts) > 1 and parts[0] in _SECTION_WORDS:
            parts = parts[1:]
        key = ".".join([*parts[:-1], leaf])
    out[key] = value


def _finalize_config(flat: dict[str, Any]) -> dict[str, Any]:
    """Megatron's derived settings and value normalisation on a flat config."""
    for key in _LIST_KEYS:
        value = flat.get(key)
        if isinstance(value, str):
            flat[key] = [v for v in re.split(r"[\s,]+", value.strip("[]() ")) if v]
    backend = flat.get("attention_backend")
    if isinstance(backend, str) and backend.startswith("AttnBackend."):
        flat["attention_backend"] = backend.split(".", 1)[1]
    if flat.get("recompute_activations") is True and flat.get("recompute_granularity") is None:
        flat["recompute_granularity"] = "selective"  # Megatron-LM's --recompute-activations
    layers = flat.get("cpu_offloading_num_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
        flat.setdefault("cpu_offloading", True)  # arguments.py: > 0 turns offloading on
    precision = next((flat[k] for k in ("precision", "trainer.precision") if k in flat), None)
    if isinstance(precision, (str, int)) and "bf16" not in flat and "fp16" not in flat:
        p = str(precision).lower()
        if "bf16" in p:
            flat["bf16"] = True
        elif p in ("16", "16-mixed", "fp16", "fp16-mixed", "half"):
            flat["fp16"] = True
    return flat
