"""Configuration: model shape, parallel sizes and recompute settings, with Megatron-Core's names.

A `Config` bundles three dataclasses:

* `ModelConfig`     - the architecture and the training shape (seq_length, micro_batch_size, dtype);
* `ParallelConfig`  - TP/PP/VPP/CP/EP/DP sizes and sequence parallelism;
* `RecomputeConfig` - recompute_granularity/method/num_layers/modules and activation offloading.

`Config.validate()` applies Megatron-Core's `TransformerConfig.__post_init__` rules for these
fields, in Megatron's order and with Megatron's own messages (typos included), as `ValueError`.
`strict=True` adds the rules that only Megatron-LM's command line enforces.

Recompute spec strings (`none`, `selective`, `selective:mlp,layernorm`, `full:uniform:2`, ...) are
the short form used by the CLI and the notebooks; `parse_spec` and `format_spec` convert both ways.
"""

from .files import ALIASES, MEGATRON_DEFAULTS, config_from_dict, load_config
from .model import (
    ATTENTION_BACKENDS,
    CONFIG_KEYS,
    GPUS_PER_NODE,
    NORMAL_CHECKPOINT_MODULES,
    NORMALIZATIONS,
    OFFLOAD_MODULES,
    OUTPUT_DISCARDING_MODULES,
    RECOMPUTE_MODULES,
    Config,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RecomputeConfig,
)
from .specs import (
    SPEC_HELP,
    all_specs,
    applicable_modules,
    format_spec,
    full_recompute_chunks,
    parse_spec,
    parse_spec_list,
)
from .validation import validate

__all__ = [
    "ALIASES",
    "ATTENTION_BACKENDS",
    "CONFIG_KEYS",
    "GPUS_PER_NODE",
    "MEGATRON_DEFAULTS",
    "NORMALIZATIONS",
    "NORMAL_CHECKPOINT_MODULES",
    "OFFLOAD_MODULES",
    "OUTPUT_DISCARDING_MODULES",
    "RECOMPUTE_MODULES",
    "SPEC_HELP",
    "Config",
    "ConfigError",
    "ModelConfig",
    "ParallelConfig",
    "RecomputeConfig",
    "all_specs",
    "applicable_modules",
    "config_from_dict",
    "format_spec",
    "full_recompute_chunks",
    "load_config",
    "parse_spec",
    "parse_spec_list",
    "validate",
]
