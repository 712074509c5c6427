"""The format readers, and how a file is matched to one.

Every format module has the same small interface:

* `sniff(text, path) -> int`: 0 when the file is not of this format, higher the surer
  (a file's suffix and its tell-tale keys; 100 = certain);
* `read(text, path) -> Reading`: only what the file says, every value with
  `Origin("file", f"{path}:{line}", key_as_written)`; sets `reading.framework`,
  `reading.format`, `reading.model_name` when the file names a model, and
  `reading.warnings` / `reading.unused` for what it does not use;

and, for each framework it owns (`FRAMEWORKS` in that module, a tuple of names):

* `apply_defaults(reading)`: the framework's documented defaults and derived values for
  keys nothing set (`reading.default(...)`, `reading.derive(...)`), never overwriting;
* `key_for(field) -> str`: how a user of that framework sets a Megatron-Core field
  (`--seq-length`, `model.encoder_seq_length`, `[training] seq_len`), for the assumptions.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .reading import Reading

# Module names under recompute_kit.sources, in the order ties are broken.
FORMAT_MODULES = (
    "megatron_lm",
    "megatron_dump",
    "bridge",
    "nemo",
    "nemo_rl",
    "nemo_rl_launch",
    "automodel",
    "torchtitan",
    "torchtitan_registry",
    "torchtitan_launch",
    "llama_factory_megatron",
    "hf_trainer",
    "hf_launch",
    "accelerate",
    "hf_config",
    "megatron_core",
)


def modules() -> list[ModuleType]:
    return [importlib.import_module(f"{__package__}.{name}") for name in FORMAT_MODULES]


def framework_module(framework: str, reading_format: str = "") -> ModuleType | None:
    """The module that owns `framework`'s defaults and key names (a format that spells the
    framework's keys its own way, `FORMAT_PREFIX` in its reading's `format`, owns its names)."""
    for module in modules():
        prefix = getattr(module, "FORMAT_PREFIX", None)
        if prefix and prefix in reading_format:
            return module
    for module in modules():
        if framework in getattr(module, "FRAMEWORKS", ()):
            return module
    return None


def best_format(text: str, path: str) -> ModuleType | None:
    """The format module that claims `text` most surely (None: no reader knows it)."""
    best, best_score = None, 0
    for module in modules():
        score = module.sniff(text, path)
        if score > best_score:
            best, best_score = module, score
    return best


def _syntax_error(text: str, path: str) -> str | None:
    """The first line of the parser's complaint when a YAML / JSON / TOML file does not parse."""
    import json

    import tomllib
    import yaml

    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".json":
            json.loads(text)
        elif suffix == ".toml":
            tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:  # JSONDecodeError, TOMLDecodeError
        lines = str(exc).strip().splitlines()
        kind = {".json": "JSON", ".toml": "TOML"}.get(suffix, "YAML")
        return f"{path} is not valid {kind}: {lines[0] if lines else type(exc).__name__}"
    return None


NOT_A_CONFIG = "not a training config recompute-kit can read"


def overrides_alone(text: str) -> bool:
    """Every word of the file a Hydra override (`++policy.train_micro_batch_size=1`)."""
    from .nemo_rl_overrides import is_override

    words = [w for line in text.splitlines() for w in line.split() if not w.startswith("#")]
    return bool(words) and all(is_override(w.strip("'\"")) for w in words)


def read_file_text(text: str, path: str, overrides: Sequence[str] = ()) -> Reading:
    """`overrides`: `key=value` words given after the file on recompute-kit's command line,
    applied as the file's framework applies its command-line overrides (NeMo-RL, Megatron-Bridge,
    NeMo 1.x and their launch commands only: `read_with_overrides` of the format module)."""
    module = best_format(text, path)
    if overrides and module is not None:
        with_overrides = getattr(module, "read_with_overrides", None)
        if with_overrides is None:
            from ..config import ConfigError

            raise ConfigError(
                f"{overrides[0]}: a key=value override applies to the NeMo-RL, Megatron-Bridge "
                f"or NeMo 1.x config before it; {path} is not one "
                f"(read as {module.__name__.rsplit('.')[-1]})"
            )
        return with_overrides(text, path, list(overrides))
    if module is None:
        from ..config import ConfigError

        error = _syntax_error(text, path)
        if error:
            raise ConfigError(error)
        if overrides_alone(text):
            raise ConfigError(
                f"{path}: key=value overrides alone, with no config before them to apply to: "
                "give the config the run starts from first, then this file (NeMo-RL: the "
                "YAML its --config names, e.g. examples/configs/sft.yaml; Megatron-Bridge: the "
                "recipe; NeMo: the model YAML)"
            )
        raise ConfigError(
            f"{path}: {NOT_A_CONFIG} (Megatron-LM script, "
            "YAML or argument dump, Megatron-Bridge / NeMo YAML or recipe, NeMo-RL YAML, "
            "NeMo Automodel YAML, torchtitan TOML, Hugging Face config.json, HF Trainer / "
            "LLaMA-Factory YAML, DeepSpeed JSON, Accelerate config YAML, a torchrun / "
            "accelerate / deepspeed launch command)"
        )
    return module.read(text, path)
