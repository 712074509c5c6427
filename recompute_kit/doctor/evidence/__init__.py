"""Evidence parsed from real training artefacts, one module per format.

Every parser is tolerant of noise: rank prefixes (`[rank3]:`, ` 0: `), timestamps, ANSI colour
codes, hard-wrapped pastes, partial pastes and truncated lines. Nothing here raises on bad
input: what cannot be read is skipped (and noted), so the doctor always runs. The only errors
raised are `EvidenceError`s for files that cannot be opened and for memory snapshots that are
corrupt or unsafe to load, each with a one-line message.

Modules: `schema` (what the parsers produce), `text` (line cleaning, sizes), `oom` (PyTorch,
ROCm, XPU and Ascend NPU out-of-memory messages, every generation, with or without prefix),
`tracebacks` (frames, exception lines, warnings), `logs` (Megatron/Bridge/NeMo training logs,
streamed), `experiments` (ablation tables), `memory_stats`, `snapshots`, `unwrap` (hard-wrapped
and re-flowed pastes joined back before short logs are parsed), `cjk` (common Chinese
descriptions given their English wording alongside), and `collect` (all of them from
paths, merged into one `Evidence`). Configs (YAML/JSON, command lines, Hydra, Python, argument
dumps) are read by `recompute_kit.sources.fragments`; `parse_config` is exported here too.
"""

from ...sources.fragments import parse_config, parse_config_with_notes
from .collect import collect
from .experiments import EXPERIMENT_KEYS, parse_experiments
from .logs import parse_log, parse_log_file, parse_oom
from .memory_stats import parse_memory_stats
from .oom import OOM_GENERATIONS
from .schema import ErrorEvent, Evidence, EvidenceError, Iteration, MemoryReport, OOMEvent
from .snapshots import load_snapshot, summarize_snapshot
from .text import clean_line, parse_size

__all__ = [
    "EXPERIMENT_KEYS",
    "OOM_GENERATIONS",
    "ErrorEvent",
    "Evidence",
    "EvidenceError",
    "Iteration",
    "MemoryReport",
    "OOMEvent",
    "clean_line",
    "collect",
    "load_snapshot",
    "parse_config",
    "parse_config_with_notes",
    "parse_experiments",
    "parse_log",
    "parse_log_file",
    "parse_memory_stats",
    "parse_oom",
    "parse_size",
    "summarize_snapshot",
]
