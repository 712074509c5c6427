"""torchtitan's launch script (run_train.sh, run_llama_train.sh): the GPUs torchrun starts and
the TOML it trains with (`--job.config_file`), read with the TOML reader (sources/torchtitan.py);
or, on torchtitan main (2026-02 on), the config registry function it trains with
(`-m torchtitan.train --module llama3 --config llama3_70b`, sources/torchtitan_registry.py),
found under torchtitan/models/<module>/ of the checkout the command runs in, its `--a.b value`
overrides applied.

    NGPU=${NGPU:-"8"}
    CONFIG_FILE=${CONFIG_FILE:-"./train_configs/debug_model.toml"}
    torchrun --nproc_per_node=${NGPU} ... train.py --job.config_file ${CONFIG_FILE} $overrides

The TOML is found as torchrun would open it: relative to the directory the script is run from
(taken as the script's own) or a directory above it. The GPU count is an assumption where it is
the default of an environment variable the script does not set (NGPU): the environment is
never read. `--section.key value` words after the config are torchtitan's command-line
overrides: they are said, not read (torchtitan's own parser applies them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..config import ConfigError
from . import torchtitan, torchtitan_registry
from .reading import FROM_ASSUMED, FROM_FILE, Origin, Reading
from .shell import ShellError, parse_script
from .torchtitan_defaults import REGISTRY_FORMAT

FRAMEWORKS: tuple[str, ...] = ()  # torchtitan.py owns torchtitan's defaults
_CONFIG_FLAG = "--job.config_file"


# torchtitan main's launch: `-m torchtitan.train --module llama3 --config llama3_70b`
_REGISTRY_LAUNCH = re.compile(r"torchtitan[./]train\b")


def sniff(text: str, path: str) -> int:
    if path.lower().endswith((".toml", ".yaml", ".yml", ".json", ".py")):
        return 0
    if _REGISTRY_LAUNCH.search(text) and "--module" in text and "--config" in text:
        return 90
    return 90 if _CONFIG_FLAG in text and re.search(r"\btorchrun\b", text) else 0


def _value(words: list, flags: tuple[str, ...]) -> tuple[str, object] | None:
    """(value, the field it came from) of the first of `flags`, `--flag v` or `--flag=v`."""
    for k, f in enumerate(words):
        name, eq, inline = f.text.partition("=")
        if name in flags:
            if eq:
                return inline, f
            if k + 1 < len(words):
                return words[k + 1].text, words[k + 1]
    return None


def _find(named: str, path: str) -> str | None:
    here = os.path.dirname(os.path.abspath(path))
    for folder in (here, os.path.dirname(here)):
        candidate = os.path.normpath(os.path.join(folder, named))
        if os.path.isfile(candidate):
            return candidate
    return None


def read(text: str, path: str) -> Reading:
    try:
        script = parse_script(text, path)
    except ShellError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    registry = next((x for x in script.launches if _is_registry_launch(x)), None)
    if registry is not None:
        return _read_registry_launch(registry, path)
    launch = next((x for x in script.launches if _CONFIG_FLAG in (f.text for f in x.args)), None)
    words = [*launch.launcher, *launch.args] if launch else []
    config = _value(words, (_CONFIG_FLAG,)) if words else None
    if launch is None or config is None:
        raise ConfigError(f"{path}: no torchrun command with {_CONFIG_FLAG} found")
    named, field = config
    found = _find(named, path) if "$" not in named else None
    if found is None:
        # the GPUs it starts still count beside the TOML given as another input
        reading = Reading(framework="torchtitan", format="torchtitan launch script")
        envs = "; ".join(r.describe() for r in getattr(field, "rests_on", ()))
        reading.warnings.append(
            f"{path}:{field.line}: the command trains with {_CONFIG_FLAG} {named}"
            + (f" ({envs})" if envs else "")
            + ", not found beside this script: give the TOML the run uses as another input"
        )
    else:
        with open(found, encoding="utf-8") as fh:
            reading = torchtitan.read(fh.read(), found)
        reading.launched_config = found  # type: ignore[attr-defined]  # `read` lists it
        reading.format = f"torchtitan launch script, {reading.format}"
    _world_size(launch, path, reading)
    after = [f.text for f in launch.args if f.text.startswith("--") and "." in f.text]
    extra = [w for w in after if not w.startswith(_CONFIG_FLAG)]
    if extra:
        reading.warnings.append(
            f"{path}: {', '.join(extra[:6])}: torchtitan command-line overrides, not read "
            "(put them in the TOML to have them counted)"
        )
    return reading


def _world_size(launch: Any, path: str, reading: Reading) -> None:
    """torchrun's --nproc_per_node x --nnodes (shell.py's count of the launch); an assumption
    where a count is an environment variable's default (NGPU=${NGPU:-8})."""
    n = launch.world_size
    if n is None or "world_size" in reading:
        return
    where = f"{path}:{launch.world_size_line}"
    key = launch.world_size_key or "--nproc_per_node"
    nodes = "" if "--nnodes" in key else "one node"
    if launch.world_size_rests_on:  # the environment's, which is never read
        said = "; ".join(r.describe() for r in launch.world_size_rests_on)
        flag = "--dp (at launch the environment sets it; the environment is not read)"
        note = "; ".join(x for x in (said, key, nodes) if x)
        origin = Origin(FROM_ASSUMED, where, flag, note)
    else:
        origin = Origin(FROM_FILE, where, key, nodes)
    reading.set("world_size", n, origin)


def _is_registry_launch(launch: Any) -> bool:
    return bool(_REGISTRY_LAUNCH.search(launch.program)) and all(
        _value(launch.args, (flag,)) for flag in ("--module", "--config")
    )


def _registry_file(module: str, path: str) -> str | None:
    """torchtitan/models/<module>/config_registry.py (a dotted module: under experiments/),
    in the folder the command runs from or a folder above it."""
    parts = module.split(".")
    under = ("models", *parts) if len(parts) == 1 else ("experiments", *parts)
    here = Path(os.path.abspath(path)).parent
    for folder in (here, *here.parents[:3]):
        candidate = folder.joinpath("torchtitan", *under, "config_registry.py")
        if candidate.is_file():
            return str(candidate)
    return None


def _read_registry_launch(launch: Any, path: str) -> Reading:
    """`-m torchtitan.train --module M --config C [--a.b value ...]`: the registry function C
    of model M, with the command line's overrides applied as torchtitan's parser applies them."""
    (module, mfield), (name, cfield) = (_value(launch.args, (f,)) for f in ("--module", "--config"))
    words = [f.text for f in launch.args]
    found = _registry_file(module, path) if "$" not in module + name else None
    if found is None or not re.fullmatch(r"\w+", name):
        reading = Reading(
            framework="torchtitan", format=f"torchtitan launch command ({REGISTRY_FORMAT})"
        )
        envs = "; ".join(r.describe() for r in (*mfield.rests_on, *cfield.rests_on))
        reading.warnings.append(
            f"{path}:{cfield.line}: the command trains torchtitan's --module {module} --config "
            f"{name}" + (f" ({envs})" if envs else "") + ": its config registry, "
            f"torchtitan/models/{module}/config_registry.py, is not found beside this "
            f"command; give it as another input, torchtitan/models/{module}/config_registry.py"
            f"::{name}"
        )
    else:
        overrides = [w for w in words if w not in ("--module", "--config", module, name)]
        with open(found, encoding="utf-8") as fh:
            reading = torchtitan_registry.read_with_overrides(
                fh.read(), f"{found}::{name}", overrides
            )
        reading.launched_config = found  # type: ignore[attr-defined]  # `read` lists it
        reading.format = f"torchtitan launch command, {reading.format}"
        for f in (mfield, cfield):
            if f.rests_on:
                said = "; ".join(r.describe() for r in f.rests_on)
                reading.warnings.append(
                    f"{path}:{f.line}: {f.text} is the default of an environment variable "
                    f"({said}); the environment is not read"
                )
    _world_size(launch, path, reading)
    return reading
