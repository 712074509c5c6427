"""recompute-kit: choose, verify and measure activation recomputation settings."""

from .config import (
    Config,
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RecomputeConfig,
    format_spec,
    parse_spec,
)
from .presets import PRESETS, get_preset

__version__ = "0.1.0"
__all__ = [
    "PRESETS",
    "Config",
    "ConfigError",
    "ModelConfig",
    "ParallelConfig",
    "RecomputeConfig",
    "format_spec",
    "get_preset",
    "parse_spec",
]
