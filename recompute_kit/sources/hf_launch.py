"""Launch commands of Hugging Face stacks: `llamafactory-cli train cfg.yaml`, `torchrun ...
train.py cfg.yaml`, `deepspeed --include localhost:0,1 train.py --model_name_or_path ... --bf16`,
`accelerate launch --num_processes 8 train.py ...`, and a script run by plain python with the
Trainer's arguments (`python run_clm.py --model_name_or_path gpt2 ...`).

The world size is the launcher's (torchrun, deepspeed, accelerate: sources/shell.py; for
llamafactory-cli the NPROC_PER_NODE x NNODES it is run with); the training settings are the
trainer config the command names (read by sources/hf_trainer.py, found beside the script) or
the command's own `--key value` arguments (HfArgumentParser's: the same keys as the YAML). A
Megatron-LM or torchtitan launch is not this reader's (their readers claim it).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError
from . import hf_trainer
from .reading import Origin, Reading
from .shell import parse_script

FRAMEWORKS: tuple[str, ...] = ()  # its readings are hf-trainer's (hf_trainer.py owns them)

_LAUNCHER = re.compile(
    r"(?m)^[^#\n]*\b(?:llamafactory-cli\s+train|torchrun|deepspeed|accelerate\s+launch|"
    r"python3?\s+-m\s+torch\.distributed\.(?:run|launch))\b"
)
# a script run by plain python (HF's examples: `python run_clm.py --model_name_or_path ...`):
# one process, which the Trainer spreads over every visible GPU with DataParallel
_PLAIN_PYTHON = re.compile(r"(?m)^[^#\n]*\bpython3?\s+(?!-m\b)\S+\.py\b")
# (`--config-file`: Megatron-Bridge's and NeMo's example scripts; TRL's is `--config`)
_NOT_OURS = re.compile(
    r"\bpretrain_\w+\.py\b|\btorchtitan\b|--num-layers\b|--hidden-size\b|--config-file\b"
)
_TRAINER_ARGS = re.compile(r"--(?:model_name_or_path|per_device_train_batch_size|deepspeed)\b")
_CONFIG_ARG = re.compile(r"\S+\.(?:ya?ml|json)\b")
# `NPROC_PER_NODE=8 NNODES=2 llamafactory-cli train cfg.yaml` (also exported before it)
_LF_COMMAND = re.compile(r"(?m)^(?:\s*\w+=\S*)*\s*llamafactory-cli\s+train\s+(?P<cfg>\S+)")
_ENV = re.compile(r"(?m)(?:^|\s)(?:export\s+)?(NPROC_PER_NODE|NNODES)=(\d+)\b")


def sniff(text: str, path: str) -> int:
    if path.lower().endswith((".yaml", ".yml", ".json", ".toml")) or _NOT_OURS.search(text):
        return 0
    if not _LAUNCHER.search(text):
        return 75 if _PLAIN_PYTHON.search(text) and _TRAINER_ARGS.search(text) else 0
    return 75 if _CONFIG_ARG.search(text) or _TRAINER_ARGS.search(text) else 0


def read(text: str, path: str) -> Reading:
    # a pasted command whose continuation backslashes were lost: the flag lines are its words
    # (a line that ends in its own backslash, `train.py\`, is continued already)
    joined = re.sub(r"(?<!\\)[ \t]*\n(?=[ \t]*--[A-Za-z])", " \\\n", text)
    if (lf := _LF_COMMAND.search(joined)) is not None:
        line = joined.count("\n", 0, lf.start("cfg")) + 1
        overrides = _llamafactory_overrides(joined[lf.end("cfg") :], path, line)
        reading = _trainer_file(lf.group("cfg"), path, line, overrides)
        reading.format = f"launch command, {reading.format}"
        _llamafactory_world(reading, joined, path, line)
        return reading
    script = parse_script(joined, path)
    if not script.launches:
        raise ConfigError(f"{path}: no training command found (torchrun, deepspeed, accelerate)")
    launch = script.launches[0]
    words = [f.text for f in launch.args]
    # the trainer config is a positional argument (`train.py cfg.yaml`), not a flag's value
    # (`--deepspeed ds_config.json` is read by the trainer reader as the YAML's key would be)
    named = next(
        (
            f
            for k, f in enumerate(launch.args)
            if _CONFIG_ARG.fullmatch(f.text)
            and not f.text.startswith("-")
            and not (k and words[k - 1].startswith("--"))
        ),
        None,
    )
    if named is None:  # TrlParser's `--config recipe.yaml` (alignment-handbook, TRL's scripts)
        named = _config_flag(launch.args)
    if named is not None:
        reading = _trainer_file(named.text, path, named.line)
    else:
        reading = _trainer_flags(launch.args, path)
    reading.warnings += script.warnings
    _accelerate_config(launch, path, reading)
    program = launch.program or ""
    trainer = _trl_trainer_in(program, path)  # a copy of TRL's script: what it builds
    trl_sft = (
        _TRL_SFT_SCRIPT.search(program)
        or (program == "trl" and words[:1] == ["sft"])
        or trainer == "SFTTrainer"
    )
    trl_dpo = (
        _TRL_DPO_SCRIPT.search(program)
        or (program == "trl" and words[:1] == ["dpo"])
        or trainer == "DPOTrainer"
    )
    if trl_sft and hf_trainer.FORMAT_LF not in reading.format:
        # TRL's SFT script: SFTConfig's defaults (gradient checkpointing on, its loss_type)
        reading.format = f"{hf_trainer.FORMAT_TRL} ({hf_trainer.TRL_SFT})"
    elif trl_dpo and hf_trainer.FORMAT_LF not in reading.format:
        # TRL's DPO script: pairs of sequences and a reference model (hf_trainer._trl_dpo)
        reading.format = f"{hf_trainer.FORMAT_TRL} ({hf_trainer.TRL_DPO})"
    reading.format = f"launch command, {reading.format}"
    if launch.world_size:
        where = Origin("file", f"{path}:{launch.world_size_line}", launch.world_size_key)
        reading.set("world_size", launch.world_size, where)
    elif not _LAUNCHER.search(joined):
        reading.warnings.append(
            f"{path}: run by plain python: one process, which the Trainer spreads over every "
            "GPU it sees with DataParallel (the batch per GPU is per_device_train_batch_size); "
            f"{GPUS_UNSAID}: give --dp"
        )
    elif words:
        reading.warnings.append(
            f"{path}: {GPUS_UNSAID} (a hostfile, an accelerate config or the environment sets "
            "it): give --dp"
        )
    return reading


# said where the command leaves its world to something else (resolve.py drops it once another
# input or --dp gives the world)
GPUS_UNSAID = "the launcher's GPU count is not on the command line"


def _accelerate_config(launch: Any, path: str, reading: Reading) -> None:
    """`accelerate launch --config_file FILE`: the Accelerate config the command runs with (its
    ZeRO / FSDP sharding, offloading, world size), read beside the script or as given; the
    trainer's arguments and the command's own --num_processes win over it, as at launch."""
    words = [f.text for f in launch.launcher]
    if "accelerate" not in words or "--config_file" not in words[:-1]:
        return
    name = words[words.index("--config_file") + 1]
    found = hf_trainer.find_beside(name, path) or (Path(name) if Path(name).is_file() else None)
    if found is None:
        reading.warnings.append(
            f"{path}: the command's --config_file {name} is not beside it: give that file too "
            "(its ZeRO / FSDP sharding and world size are not read)"
        )
        return
    from . import accelerate  # (a sibling reader)

    within = accelerate.read(found.read_text(encoding="utf-8"), str(found))
    for key, value in within.values.items():
        reading.set(key, value, within.origins[key], overwrite=False)
    reading.warnings += within.warnings
    reading.unused.update(within.unused)
    reading.read_within.append(str(found))


# TRL's own SFT entry points: trl/scripts/sft.py, and the `trl sft` command that runs it
_TRL_SFT_SCRIPT = re.compile(r"(?:^|/)trl/scripts/sft\.py$")
_TRL_DPO_SCRIPT = re.compile(r"(?:^|/)trl/scripts/dpo\.py$")


def _config_flag(args: list):
    """The field naming the YAML of `--config FILE` / `--config=FILE`, or None."""
    for k, f in enumerate(args):
        if f.text == "--config" and k + 1 < len(args) and _CONFIG_ARG.fullmatch(args[k + 1].text):
            return args[k + 1]
        if f.text.startswith("--config=") and _CONFIG_ARG.fullmatch(f.text.split("=", 1)[1]):
            return dataclasses.replace(f, text=f.text.split("=", 1)[1])
    return None


_TRL_TRAINER = re.compile(r"\b(SFTTrainer|DPOTrainer)\s*\(")


def _trl_trainer_in(program: str, path: str) -> str | None:
    """The TRL trainer a Python script beside the launch command builds (a copy of TRL's
    scripts/sft.py run as `sft.py`): SFTTrainer or DPOTrainer, else None."""
    if not program.endswith(".py"):
        return None
    found = next((p for p in (Path(path).parent / program, Path(program)) if p.is_file()), None)
    try:
        text = found.read_text(encoding="utf-8", errors="replace")[:200_000] if found else ""
    except OSError:
        return None
    if "trl" not in text:
        return None
    names = set(_TRL_TRAINER.findall(text))
    return names.pop() if len(names) == 1 else None


def _trainer_file(name: str, path: str, line: int, overrides: list | None = None) -> Reading:
    """The trainer config the command names, read beside the script, in a folder above it (a
    repository's root the script runs from) or as given; with the command's key=value
    overrides after it (llamafactory-cli's)."""
    found = hf_trainer.find_beside(name, path) or (Path(name) if Path(name).is_file() else None)
    if found is None:
        raise ConfigError(
            f"{path}:{line}: the command trains with {name}, which is not beside the script: "
            "give that file to --config too"
        )
    text = found.read_text(encoding="utf-8")
    if overrides:
        return hf_trainer.read_with_overrides(text, str(found), overrides)
    return hf_trainer.read(text, str(found))


def _llamafactory_overrides(rest: str, path: str, line: int) -> list:
    """The `key=value` words after `llamafactory-cli train cfg.yaml` on its command (its lines
    continued with a backslash), to the end of the command."""
    from .nemo_rl_overrides import Override, is_override

    command = []
    for text in rest.split("\n"):
        command.append(text.rstrip().removesuffix("\\"))
        if not text.rstrip().endswith("\\"):
            break
    try:
        words = shlex.split(" ".join(command), comments=True)
    except ValueError:
        return []
    overrides = []
    for word in words:
        if word in ("&&", "||", ";", "|", "&") or word.startswith((">", "<", "2>")):
            break
        if is_override(word) and not word.startswith(("~", "+")):
            overrides.append(Override(word, line=line, place=path))
    return overrides


def _trainer_flags(args: list, path: str) -> Reading:
    """`--key value` / `--flag` arguments (HfArgumentParser's), each origin on its line."""
    data: dict[str, Any] = {}
    lines: dict[str, int] = {}
    i = 0
    while i < len(args):
        word, line = args[i].text, args[i].line
        i += 1
        if not word.startswith("--"):
            continue
        key, eq, value = word[2:].partition("=")
        if not eq:  # a bare flag (--bf16, --do_train) is true
            takes = i < len(args) and not args[i].text.startswith("--")
            value, i = (args[i].text, i + 1) if takes else ("true", i)
        data[key] = _argument_value(value)
        lines[key] = line
    if not data:
        raise ConfigError(f"{path}: the training command has no trainer arguments to read")
    return hf_trainer.read_arguments(data, path, lines)


def _argument_value(text: str) -> Any:
    """A command-line value as HfArgumentParser gets it: a string, typed by the field it sets.
    Numbers and true / false are typed here (the fields they set take them); any other word
    stays a string (YAML would make `--evaluation_strategy no` false); a bool field's yes / no
    is read as HfArgumentParser's string_to_bool reads it (trainer_files._bool)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.startswith("[") and text.endswith("]"):  # a list some launch scripts pass
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return text
    return text


def _llamafactory_world(reading: Reading, text: str, path: str, line: int) -> None:
    """llamafactory-cli runs torchrun (with FORCE_TORCHRUN, or more than one GPU) with
    NPROC_PER_NODE x NNODES processes, NPROC_PER_NODE defaulting to the visible GPUs
    (hiyouga/LLaMA-Factory src/llamafactory/cli.py)."""
    env = {
        m.group(1): (int(m.group(2)), text.count("\n", 0, m.start(1)) + 1)
        for m in _ENV.finditer(text)
    }
    if "NPROC_PER_NODE" not in env:
        reading.warnings.append(
            f"{path}:{line}: llamafactory-cli without NPROC_PER_NODE uses every visible GPU: "
            "give --dp"
        )
        return
    nproc, at = env["NPROC_PER_NODE"]
    nodes = env.get("NNODES", (1, at))[0]
    key = "NPROC_PER_NODE" + (" x NNODES" if "NNODES" in env else "")
    reading.set("world_size", nproc * nodes, Origin("file", f"{path}:{at}", key))
