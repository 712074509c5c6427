"""NeMo-RL launch commands, as users paste them or keep them in a script:
`uv run examples/run_grpo.py --config examples/configs/grpo_math_8B_megatron.yaml
policy.max_total_sequence_length=8192 cluster.gpus_per_node=8`, `uv run python
examples/run_dpo.py --config <yaml> dpo.max_num_steps=15`, `python examples/run_sft.py ...`.

Read as NeMo-RL runs it (NVIDIA-NeMo/RL @ 7ea279ab, examples/run_grpo.py:57-94): the YAML of
`--config` (its `defaults:` chain: sources/nemo_rl.py), then the remaining words as Hydra
overrides in order (sources/nemo_rl_overrides.py), then the interpolations. Without `--config`
the script's own default (`examples/configs/<name>.yaml` beside it, e.g. run_grpo.py:82-84).
`--config` is relative to where the command runs (the repository root, as NeMo-RL's README
runs it): looked for relative to the launch file's directory and each directory above it.
A config not found is one warning naming the path; the overrides are read alone then.
"""

from __future__ import annotations

import os
import re
import shlex

from ..config import ConfigError
from . import nemo_rl
from .nemo_rl_overrides import Override, is_override
from .reading import Reading

FRAMEWORKS: tuple[str, ...] = ()  # nemo_rl.py owns NeMo-RL's defaults

# examples/run_grpo.py, examples/run_grpo_math.py (before NVIDIA-NeMo/RL 4b48248), run_dpo.py
_SCRIPT = re.compile(r"(?:^|/)run_\w+\.py$")
_COMMAND = re.compile(r"(?m)^[^#\n]*\b(?:python3?|uv\s+run)\b[^#\n]*\brun_\w+\.py\b")
# a Megatron-LM / torchrun script, or one of Hugging Face's example scripts (run_clm.py with the
# Trainer's --key arguments), that happens to run a run_*.py is not NeMo-RL's
_NOT_OURS = re.compile(
    r"--num-layers\b|--hidden-size\b|--tensor-model-parallel-size\b|\btorchrun\b|"
    r"--(?:model_name_or_path|model_type|per_device_train_batch_size|output_dir|"
    r"train_data_file|train_file)\b"
)
# an override of a NeMo-RL config's top-level section (examples/configs/*.yaml)
_SECTION_OVERRIDE = re.compile(
    r"(?:^|\s)[+~]*(?:policy|cluster|grpo|dpo|sft|rm|ppo|distillation|loss_fn|checkpointing|"
    r"logger|data|env)\.\w[\w.]*="
)
# the config each script loads without --config (examples/run_*.py @ 7ea279ab, the
# `os.path.join(os.path.dirname(__file__), "configs", ...)` line of each)
_DEFAULT_CONFIG = {
    "run_grpo.py": "grpo_math_1B.yaml",
    "run_grpo_math.py": "grpo_math_1B.yaml",
    "run_dpo.py": "dpo.yaml",
    "run_sft.py": "sft.yaml",
    "run_rm.py": "rm.yaml",
    "run_ppo.py": "ppo_math_1B.yaml",
    "run_distillation.py": "distillation_math.yaml",
}


def sniff(text: str, path: str) -> int:
    if path.partition("::")[0].lower().endswith((".yaml", ".yml", ".json", ".toml", ".py")):
        return 0
    m = _COMMAND.search(text)
    if m is None or _NOT_OURS.search(text):
        return 0
    if "examples/run_" in m.group(0) or _SECTION_OVERRIDE.search(text):
        return 85
    return 0


def _commands(text: str) -> list[list[tuple[str, int]]]:
    """Each logical command line's words with the physical line each was written on."""
    out: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        body = raw.rstrip()
        more = body.endswith("\\")
        if more:
            body = body[:-1]
        try:
            words = shlex.split(body, comments=True)
        except ValueError:
            words = body.split()
        for w in words:
            inner = _inner_command(w)
            if inner is None:
                current.append((w, number))
            else:  # a command of its own: its words end where the quoted word ends
                out.append([(i, number) for i in inner])
        if not more:
            if current:
                out.append(current)
            current = []
    if current:
        out.append(current)
    return out


_ASSIGN = re.compile(r"^[A-Za-z_]\w*=[^\s$`]*$")


def _expand(word: str, variables: dict[str, str]) -> str:
    """`${NAME}` / `$NAME` of a variable the file sets plainly; others are left as written."""

    def value(m: re.Match) -> str:
        return variables.get(m.group(1) or m.group(2), m.group(0))

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)


def _inner_command(word: str) -> list[str] | None:
    """A command kept in a variable or passed to a shell (`COMMAND="uv run ./examples/run_dpo.py
    --config ..."` in NeMo-RL's README, ray.sub runs it): its own words."""
    inner = word.partition("=")[2] if re.match(r"^\w+=", word) else word
    if not (re.search(r"\s", inner) and re.search(r"run_\w+\.py\b", inner)):
        return None
    try:
        return shlex.split(inner, comments=True)
    except ValueError:
        return inner.split()


def _find_config(named: str, path: str) -> str | None:
    """The file `named` relative to the launch file's directory or a directory above it (the
    repository root the command runs from), or as given."""
    if os.path.isabs(named):
        return named if os.path.isfile(named) else None
    here = os.path.dirname(os.path.abspath(path))
    while True:
        candidate = os.path.join(here, named)
        if os.path.isfile(candidate):
            return os.path.relpath(candidate) if not os.path.isabs(path) else candidate
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return named if os.path.isfile(named) else None


def read_with_overrides(text: str, path: str, words: list[str]) -> Reading:
    """`launch.sh key=value ...` on recompute-kit's command line: after the command's own."""
    return read(text, path, [Override(w, applies_to=path) for w in words])


def read(text: str, path: str, extra: list[Override] = ()) -> Reading:
    """`extra`: overrides given to recompute-kit after this file (they come last)."""
    launches: list[tuple[list[tuple[str, int]], int]] = []
    variables: dict[str, str] = {}  # `NUM_ACTOR_NODES=32` on a line of its own, before
    for words in _commands(text):
        at = next((k for k, (w, _) in enumerate(words) if _SCRIPT.search(w)), None)
        if at is not None:
            expanded = [(_expand(w, variables), line) for w, line in words]
            launches.append((expanded, at))
            continue
        plain = [w for w, _ in words if w != "export"]
        if plain and all(_ASSIGN.match(w) for w in plain):
            variables.update(w.split("=", 1) for w in plain)  # type: ignore[misc]
    if not launches:
        raise ConfigError(f"{path}: no NeMo-RL launch command (examples/run_*.py) found")
    words, at = launches[0]
    script, script_line = words[at]
    warnings: list[str] = []
    if len(launches) > 1:
        warnings.append(
            f"{path}:{launches[1][0][launches[1][1]][1]}: another NeMo-RL command; only the "
            f"first ({path}:{script_line}) is read"
        )
    config: tuple[str, int] | None = None
    overrides: list[Override] = []
    rest = words[at + 1 :]
    i = 0
    while i < len(rest):
        word, line = rest[i]
        i += 1
        if word in ("|", "||", "&&", ";", "&") or re.match(r"^\d?>|^<", word):
            break  # the command ends (a pipe to tee, a redirection to a log)
        if word == "--config" or word.startswith("--config="):
            value = word.partition("=")[2] if "=" in word else None
            if value is None and i < len(rest):
                value, line = rest[i]
                i += 1
            if not value:
                raise ConfigError(f"{path}:{line}: --config needs a file")
            config = (value, line)
        elif "$" in word:
            warnings.append(
                f"{path}:{line}: {word}: a shell variable; its value is not known here, not read"
            )
        elif is_override(word):
            overrides.append(Override(word, line, path))
        else:
            # parse_known_args hands every unknown word to Hydra, which cannot parse it
            warnings.append(
                f"{path}:{line}: {word}: not a Hydra override (key=value); NeMo-RL passes it to "
                "parse_hydra_overrides, which stops on it; not read"
            )
    if config is None:
        name = os.path.basename(script)
        default = _DEFAULT_CONFIG.get(name)
        if default is None:
            raise ConfigError(
                f"{path}:{script_line}: {script} without --config: which config it loads by "
                "default is not known here; give --config"
            )
        config = (os.path.join(os.path.dirname(script), "configs", default), script_line)
        warnings.append(
            f"{path}:{script_line}: no --config: {script} loads {config[0]} (its default)"
        )
    named, config_line = config
    everything = [*overrides, *extra]
    found = _find_config(named, path)
    if found is None:
        if not everything:
            raise ConfigError(
                f"{path}:{config_line}: the command trains with {named}, which is not found "
                "(relative to this file's directory or a directory above it), and gives no "
                "overrides: give that file"
            )
        reading = nemo_rl.read("", named, everything, absent=os.path.basename(named))
        reading.warnings.insert(
            0,
            f"{path}:{config_line}: --config {named} is not found (relative to "
            f"{os.path.dirname(path) or '.'} or a directory above it): only the command's "
            f"overrides are read ({len(everything)}); what the YAML sets is not",
        )
    else:
        with open(found, encoding="utf-8") as fh:
            reading = nemo_rl.read(fh.read(), found, everything)
        reading.launched_config = found  # type: ignore[attr-defined]  # `read` lists it
    reading.warnings = warnings + reading.warnings
    reading.format = f"NeMo-RL launch command, {reading.format}"
    return reading
