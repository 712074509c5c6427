"""A finding's fix text in the keys of the framework the inputs show.

Rules write their fix prose once, with Megatron-LM's flags (`--use-distributed-optimizer`,
`--recompute-granularity`). Where the shared reader says the run is another framework (NeMo
1.x / 2.0, Megatron-Bridge, NeMo-RL, torchtitan, the Hugging Face Trainer), each such flag is
written as the key that sets the same field there, found by the patch machinery's own lookup
(`patches.framework_key`: PATCH_KEYS, else the framework reader's `key_for`), so the words and
the patch name the same keys. A flag may stand for more than one field (Megatron-LM's
`--use-distributed-optimizer` is its ZeRO-1 too: megatron_lm.key_for("zero_stage")); the first
field the framework has a key for is taken. Where it has none, the words say so instead of
naming a flag the framework does not read. Flags that are no Megatron-LM setting
(recompute-kit's own `--gpu-memory-gb`, a launcher's `--nproc_per_node`) are left as written.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from ..config import CONFIG_KEYS
from .types import Context

# `--flag-name` as a word of its own (not inside a path or a longer option), and the values
# after it when they are setting words (`--recompute-granularity selective`,
# `--recompute-modules moe_act layernorm`), not prose
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)+\b")
_MODULE_WORDS = r"core_attn|mlp|layernorm|moe_act|moe|shared_experts|mla_up_proj"
_VALUE_WORDS = rf"selective|full|uniform|block|flash|fused|unfused|auto|{_MODULE_WORDS}"
_FLAG_VALUE = re.compile(
    _FLAG.pattern + rf"(?: (?P<value>(?:{_VALUE_WORDS})(?: (?:{_MODULE_WORDS}))*)\b(?! ->))?"
)


@cache
def _flag_fields() -> dict[str, tuple[tuple[str, Any], ...]]:
    """Megatron-LM flag -> ((field, value set by the flag or None), ...), the flag's own field
    first, then the fields whose Megatron-LM spelling names the flag too."""
    from ..sources import megatron_lm
    from ..sources.reading import EXTRA_KEYS
    from .patch_keys import _MCORE_EXTRA

    out: dict[str, list[tuple[str, Any]]] = {}
    for flag, (field, value) in megatron_lm.BOOL_FLAGS.items():
        out.setdefault(flag, []).append((field, value))
    for flag, (field, _conv) in megatron_lm.VALUE_FLAGS.items():
        out.setdefault(flag, []).append((field, None))
    for field in (*CONFIG_KEYS, *_MCORE_EXTRA, *EXTRA_KEYS):
        for flag in _FLAG.findall(megatron_lm.key_for(field)):
            if all(f != field for f, _ in out.get(flag, ())):
                out.setdefault(flag, []).append((field, None))
    return {flag: tuple(fields) for flag, fields in out.items()}


def _words_for(
    framework: str, flag: str, ctx: Context, given: str | None = None
) -> str | None:
    """What `flag` (with the word after it, `given`) is in `framework`'s keys (None: the flag is
    no Megatron-LM setting). A value the framework spells with other keys too (NeMo-RL's
    `activation_checkpointing: true` beside `recompute_granularity: selective`) is written as
    those keys with their values."""
    from .patches import _is_key, _value_for, framework_key, in_llama_factory_keys, llama_factory

    fields = _flag_fields().get(flag)
    if not fields:
        return None
    if framework == "megatron-core":
        return fields[0][0]
    for field, value in fields:
        target = framework_key(framework, field, ctx)
        if target is None:
            continue
        lf = framework == "hf-trainer" and llama_factory(ctx)
        if value is not None and _is_key(target):  # a switch: the key with the value it sets
            keys = _value_for(framework, field, target, value, ctx, {})
            ((key, said),) = (in_llama_factory_keys(keys) if lf else keys).items()
            return f"{key}: {_spelled(said)}"
        if value is None and given is not None and _is_key(target):
            keys = _value_for(framework, field, target, given, ctx, {})
            if keys != {target: given}:
                return ", ".join(f"{k}: {_spelled(v)}" for k, v in keys.items())
        if lf and _is_key(target):  # LLaMA-Factory's own name for the Trainer's key
            return next(iter(in_llama_factory_keys({target: True})), target)
        return target
    return f"{fields[0][0]} (no {framework} key sets it)"


def fix_in_framework_keys(framework: str | None, fix: str, ctx: Context) -> tuple[str, dict]:
    """The fix with each Megatron-LM flag written in `framework`'s keys, and {flag: words}."""
    if framework is None or framework == "megatron-lm" or "--" not in fix:
        return fix, {}
    done: dict[str, str] = {}

    def swap(m: re.Match) -> str:
        if _LABELLED.search(fix, 0, m.start()):
            return m.group(0)  # "Megatron: --flag" in a list of each framework's key: as written
        if fix.count("`", 0, m.start()) % 2:
            return m.group(0)  # inside `a command`: recompute-kit's own options, as written
        flag, value = m.group(0).split(" ")[0], m.group("value")
        fields = _flag_fields().get(flag) or ()
        if fields and fields[0][1] is not None:  # a switch: the words after it are prose
            value = None
        words = _words_for(framework, flag, ctx, value)
        if words is None:
            return m.group(0)
        if value is None:
            rest = m.group(0)[len(flag) :]
        elif words == _words_for(framework, flag, ctx):
            # the value after the key, as the framework's files or overrides write it
            listed = fields[0][0] == "recompute_modules"
            words += _SEPARATOR.get(framework, ": ") + _value_words(framework, value, listed)
            rest = ""
        else:
            rest = ""
        done[flag] = words
        return words + rest

    return _FLAG_VALUE.sub(swap, fix), done


# a flag labelled as Megatron's own, in a list that names each framework's key
_LABELLED = re.compile(r"Megatron(?:-LM|-Core)?:\s*$")

# key and value as the framework writes them: Hydra overrides, TOML, else YAML
_SEPARATOR = {"megatron-bridge": "=", "nemo2": "=", "torchtitan": " = "}


def _value_words(framework: str, value: str, listed: bool) -> str:
    """One value as it is, a list field's (Megatron-LM's `--recompute-modules a b`) as the list
    the framework writes: `[a,b]` in a Hydra override, `["a", "b"]` in TOML, `[a, b]` in YAML."""
    items = value.split()
    if len(items) == 1 and not listed:
        return value
    if framework in ("megatron-bridge", "nemo2"):
        return "[" + ",".join(items) + "]"
    if framework == "torchtitan":
        return "[" + ", ".join(f'"{x}"' for x in items) + "]"
    return "[" + ", ".join(items) + "]"


def _spelled(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
