"""Hydra-style overrides of a Megatron-Bridge ConfigContainer: a text file of `key=value` lines or
a `run_recipe.py` / `pretrain_*.py` command line (`training/utils/omegaconf_utils.py`,
`scripts/training/run_recipe.py`): `model.recompute_granularity=selective`, `+key=value`,
`~key` (deletes: the recipe's value no longer applies), lists `[core_attn,mlp]`, run_recipe.py's
shorthands `-tp -pp -cp -vp -ep -etp -sl -mb -gb` and `--recipe NAME` / `--model NAME`, and
`torchrun --nproc_per_node N --nnodes M` for the world size. Parsed, never executed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError
from .bridge import (
    BRIDGE,
    EXAMPLE_SCRIPT,
    ON_RECIPE,
    UNKNOWN_RECIPE,
    Entry,
    Unresolved,
    apply_entries,
    set_model_name,
)
from .reading import FROM_ARGUMENT, FROM_FILE, Origin, Reading

FRAMEWORKS: tuple[str, ...] = ()  # bridge.py owns megatron-bridge's defaults

# run_recipe.py's convenience options -> the overrides they stand for (COMMON_OVERRIDE_FIELDS).
SHORTHANDS = {
    "-gb": "train.global_batch_size",
    "--global_batch_size": "train.global_batch_size",
    "-mb": "train.micro_batch_size",
    "--micro_batch_size": "train.micro_batch_size",
    "-sl": "dataset.seq_length",
    "--seq_length": "dataset.seq_length",
    "-tp": "model.tensor_model_parallel_size",
    "--tensor_model_parallel_size": "model.tensor_model_parallel_size",
    "-pp": "model.pipeline_model_parallel_size",
    "--pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
    "-cp": "model.context_parallel_size",
    "--context_parallel_size": "model.context_parallel_size",
    "-vp": "model.virtual_pipeline_model_parallel_size",
    "--virtual_pipeline_model_parallel_size": "model.virtual_pipeline_model_parallel_size",
    "-ep": "model.expert_model_parallel_size",
    "--expert_model_parallel_size": "model.expert_model_parallel_size",
    "-etp": "model.expert_tensor_parallel_size",
    "--expert_tensor_parallel_size": "model.expert_tensor_parallel_size",
}
# MCore fields whose dataclass default is None: deleting them (~) leaves None.
_NONE_DEFAULT = {
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "virtual_pipeline_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_moe_experts",
    "fp8",
}
_LAUNCHER_WORLD = ("--nproc_per_node", "--nproc-per-node", "--nnodes")


def sniff(text: str, path: str) -> int:
    return 0  # bridge.sniff claims these


def _value(raw: str) -> Any:
    if "${" in raw or raw.startswith("$"):
        return Unresolved(raw)
    try:
        return yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw


def _line_of(text: str, token: str, start: int) -> tuple[int, int]:
    """1-based line of `token` at or after offset `start`, and the offset after it."""
    at = text.find(token, start)
    if at < 0:
        at = text.find(token.split("=")[0], start)
    if at < 0:
        return 0, start
    return text.count("\n", 0, at) + 1, at + len(token)


# Megatron-Bridge 067f987 (since e28e1ca, 2026-07-15): the dataset's `seq_length` is the run's
# length. GPTDatasetConfig.finalize() sets MCore's `sequence_length` from it
# (src/megatron/bridge/training/config.py:304), and run_recipe.py, after the overrides
# (scripts/training/run_recipe.py:484), copies it into model.seq_length
# (run_recipe.py:515 -> scripts/training/recipe_runner.py:471-487,
# sync_model_dataset_sequence_length); other launchers stop on a mismatch
# (ConfigContainer.validate, training/config.py:1644).
_BRIDGE_AT = "Megatron-Bridge 067f987"
_FINALIZE = "src/megatron/bridge/training/config.py:304"
_SYNC = "scripts/training/run_recipe.py:515 -> recipe_runner.py:486"
_VALIDATE = "src/megatron/bridge/training/config.py:1644"


def _the_length_that_runs(
    entries: list[Entry], reading: Reading, path: str, run_recipe: bool
) -> list[Entry]:
    """Drop the sequence-length overrides Megatron-Bridge resets (`dataset.sequence_length`,
    and `model.seq_length` without `dataset.seq_length`), each with a warning naming the key
    that sets the length: the recipe's dataset.seq_length is what runs then. Where the
    launcher is not run_recipe.py (or not known), one of the two lengths set alone is a
    warning too: a launcher without run_recipe.py's copy stops at ConfigContainer.validate's
    assert."""
    dataset_given = any(e.section == "dataset" and e.key == "seq_length" for e in entries)
    model_given = any(e.section == "model" and e.key == "seq_length" for e in entries)
    copy = (
        f"run_recipe.py copies dataset.seq_length into model.seq_length after the overrides "
        f"({_BRIDGE_AT} {_SYNC}, sync_model_dataset_sequence_length)"
    )
    stop = (
        f"a launcher that calls pretrain() without that copy stops before training at "
        f"ConfigContainer.validate's assert model.seq_length == dataset.seq_length ({_VALIDATE})"
    )
    kept = []
    for e in entries:
        both = f"set dataset.seq_length={e.value} model.seq_length={e.value} together"
        if e.section == "dataset" and e.key == "sequence_length":
            reading.unused[e.written] = e.value
            reading.warnings.append(
                f"{path}:{e.line}: {e.written}={e.value} does not set the run's length: "
                f"GPTDatasetConfig.finalize() sets sequence_length from dataset.seq_length "
                f"({_BRIDGE_AT} {_FINALIZE}); {both} (or run_recipe.py's -sl {e.value})"
            )
        elif e.section == "model" and e.key == "seq_length" and not dataset_given:
            reading.unused[e.written] = e.value
            reading.warnings.append(
                f"{path}:{e.line}: {e.written}={e.value} alone does not set the run's length: "
                + (
                    f"{copy}, so the recipe's dataset.seq_length runs (the length read here)"
                    if run_recipe
                    else f"{copy}, so the recipe's dataset.seq_length runs there (the length "
                    f"read here); {stop}"
                )
                + f"; {both} (or run_recipe.py's -sl {e.value})"
            )
        else:
            alone = e.section == "dataset" and e.key == "seq_length" and not model_given
            if alone and not run_recipe:
                reading.warnings.append(
                    f"{path}:{e.line}: {e.written}={e.value} without model.seq_length: "
                    f"{copy} (the length read here); {stop} (the recipe's model.seq_length "
                    f"differs unless it is {e.value}); {both}"
                )
            kept.append(e)
    return kept


# NeMo 2.0's recipe attributes as NeMo-Run overrides name them -> the Megatron-Bridge key that
# holds the same field (the reader maps Bridge's): model.config.X is the model's field, the
# strategy's parallel sizes sit on Bridge's model, the optimizer config on its optimizer
_NEMO2_PREFIXES = (
    ("model.config.", "model."),
    ("trainer.strategy.", "model."),
    ("optim.config.", "optimizer."),
    ("data.micro_batch_size", "train.micro_batch_size"),
    ("data.global_batch_size", "train.global_batch_size"),
    ("data.seq_length", "dataset.seq_length"),
)


def _words(text: str, path: str) -> list[str]:
    """The text's shell words, line by line; a quoted value that runs over lines (a script's
    `CLI_OVERRIDES="` ... `"`) is read to its closing quote, and the overrides a variable
    holds (`CLI_OVERRIDES=" model.x=1 ..."`) are read where it is set."""
    joined = re.sub(r"\\\r?\n", " ", text)
    words: list[str] = []
    pending = ""
    for line in joined.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            split = shlex.split(pending, comments=True)
        except ValueError as exc:
            if pending.count("\n") < _MAX_QUOTED_LINES:
                continue
            raise ConfigError(f"{path}: cannot split the command line ({exc})") from None
        pending = ""
        for word in split:
            name, eq, value = word.partition("=")
            if eq and re.fullmatch(r"[A-Za-z_]\w*", name) and re.search(r"\s", value):
                words.extend(value.split())  # a variable holding overrides: its words
            elif re.search(r"\s", word) and _QUOTED_COMMAND.search(word):
                # a command quoted whole (`srun ... bash -c "... run_recipe.py --recipe X"`)
                words.extend(_words(word, path))
            else:
                words.append(word)
    if pending:
        raise ConfigError(f"{path}: cannot split the command line (no closing quotation)")
    return words


_MAX_QUOTED_LINES = 200
_QUOTED_COMMAND = re.compile(r"\brun_recipe\.py\b|(?:^|\s)--recipe\b")
_VAR_RE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


def _script_context(text: str, path: str) -> tuple[dict[str, str], list[str], tuple | None]:
    """For a launch script (Megatron-Bridge's slurm_*.sh): its variables that hold a literal,
    as the shell reader (sources/shell.py) leaves them (a `case` decided, a `for` over layouts
    read with its first), what that reader says of it (a loop read once, an `if` it could not
    decide), and the ranks its #SBATCH header asks for."""
    if not re.search(r"(?m)^\s*(?:export\s+)?[A-Za-z_]\w*=|^#SBATCH", text):
        return {}, [], None  # a bare command line or overrides file: nothing to expand
    from .shell import parse_script, sbatch_world_size, unresolved_names

    try:
        script = parse_script(text, path)
    except ConfigError:
        return {}, [], None
    literals: dict[str, str] = {}
    for name, value in script.variables.items():
        if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
            literal = "".join(str(piece) for piece, _line in value)  # `${MODEL}_sft_config`
            if not unresolved_names(literal):
                literals[name] = literal
    return literals, script.warnings, sbatch_world_size(script.sbatch)


def _nemo2_as_bridge(dotted: str) -> str:
    for nemo2, bridge in _NEMO2_PREFIXES:
        if dotted.startswith(nemo2):
            return bridge + dotted[len(nemo2) :]
    return dotted


def read(text: str, path: str) -> Reading:
    words = _words(text, path)
    literals, script_warnings, sbatch_world = _script_context(text, path)
    written = list(words)  # as the text has them, to find their lines
    if literals:  # `train.micro_batch_size=$MICRO_BATCH_SIZE` with MICRO_BATCH_SIZE=1 above
        words = [
            _VAR_RE.sub(lambda m: literals.get(m.group(1) or m.group(2), m.group(0)), w)
            for w in words
        ]
    reading = Reading(framework=BRIDGE, format="Megatron-Bridge Hydra-style overrides")
    entries: list[Entry] = []
    pos = 0
    world: dict[str, tuple[int, int, str]] = {}
    recipe: str | None = None
    mode: tuple[str, int] | None = None  # run_recipe.py --mode (pretrain, sft, lora, dora)
    config_file: tuple[str, int] | None = None  # an example script's --config-file YAML
    script: tuple[str, str, int] | None = None  # (model part of its name, the word, line)
    i = 0
    while i < len(words):
        w = words[i]
        opt, eq, inline = w.partition("=")
        nxt = words[i + 1] if i + 1 < len(words) else None
        if w.startswith("-") and (
            opt in SHORTHANDS or opt in ("--recipe", "--model", "--mode") or opt in _LAUNCHER_WORLD
        ):
            raw = inline if eq else nxt
            line, pos = _line_of(text, written[i], pos)
            if not eq:
                i += 1
                if raw is not None:
                    _, pos = _line_of(text, written[i], pos)
            if raw is None:
                raise ConfigError(f"{path}:{line}: {opt} needs a value")
            if opt == "--mode":
                mode = (raw, line)
            elif opt in ("--recipe", "--model"):
                recipe = raw
                named_at = Origin(FROM_FILE, f"{path}:{line}", opt)
                reading.recipe_origin = named_at  # type: ignore[attr-defined]
                set_model_name(reading, raw, named_at)
            elif opt in _LAUNCHER_WORLD:
                try:
                    world[opt.replace("-", "_").lstrip("_")] = (int(raw), line, opt)
                except ValueError:
                    reading.warnings.append(
                        f"{path}:{line}: {opt} {raw}: not a number, world size unknown"
                    )
            else:
                section, key = SHORTHANDS[opt].split(".")
                entries.append(Entry(section, key, _value(raw), line, opt))
        elif opt in ("--config-file", "--config_file") and (inline if eq else nxt):
            line, pos = _line_of(text, written[i], pos)
            config_file = (inline if eq else nxt, line)
            i += 0 if eq else 1
        elif (m := re.search(EXAMPLE_SCRIPT, w)) is not None and script is None:
            line, pos = _line_of(text, written[i], pos)
            script = (m.group(1), w, line)
        elif _WHOLE_PRECISION.match(w):
            # `mixed_precision=bf16_with_mxfp8_mixed`: the ConfigContainer's field set to a
            # named MixedPrecisionConfig (training/mixed_precision.py), as Bridge's docs map
            # --bf16 to mixed_precision=bf16_mixed
            line, pos = _line_of(text, written[i], pos)
            entries.append(Entry("mixed_precision", "", _value(inline), line, opt.lstrip("+")))
        elif re.match(r"^(\+\+|\+|~)?[A-Za-z_][\w]*(\.[\w]+)+(=|$)", w) and (
            eq or w.startswith("~")
        ):
            line, pos = _line_of(text, written[i], pos)
            prefix = re.match(r"^(\+\+|\+|~)?", w).group(0)
            dotted = opt[len(prefix) :]
            section, _, key = _nemo2_as_bridge(dotted).partition(".")
            if "." in key:  # deeper (model.foo.bar): not a field recompute-kit reads
                reading.unused[dotted] = inline
            elif prefix == "~":
                if key in _NONE_DEFAULT and section == "model":
                    reading.set(
                        key,
                        None,
                        Origin(
                            FROM_FILE,
                            f"{path}:{line}",
                            w,
                            "deleted: the field's default (None) applies",
                        ),
                    )
                else:
                    reading.unused[w] = None
                    reading.warnings.append(
                        f"{path}:{line}: {w} deletes {dotted}; its default applies"
                    )
            else:
                entries.append(Entry(section, key, _value(inline), line, dotted))
        i += 1
    parsed = bool(entries)  # before the length overrides Megatron-Bridge resets are dropped
    entries = _the_length_that_runs(entries, reading, path, "run_recipe.py" in text)
    if config_file is not None:
        reading = _with_config_file(reading, *config_file, path)
    apply_entries(reading, entries, path)  # the command's overrides win over the YAML's
    reading.warnings += script_warnings
    if not world and sbatch_world is not None:  # srun: one rank per task of the #SBATCH header
        ranks, line, key = sbatch_world
        reading.set("world_size", ranks, Origin(FROM_FILE, f"{path}:{line}", key))
    if world:
        n = world.get("nproc_per_node")
        m = world.get("nnodes", (1, 0, ""))
        if n is not None:
            reading.set(
                "world_size",
                n[0] * m[0],
                Origin(
                    FROM_FILE, f"{path}:{n[1]}", n[2], f"x nnodes {m[0]}" if m[2] else "one node"
                ),
            )
    _peft_mode(reading, recipe, mode, path)
    if recipe is not None:
        reading.unused[ON_RECIPE] = recipe
        reading.format = f"Megatron-Bridge Hydra-style overrides on recipe {recipe}"
    elif not parsed and not reading.values:
        raise ConfigError(f"{path}: no Megatron-Bridge overrides (key=value) found")
    else:
        reading.unused[ON_RECIPE] = UNKNOWN_RECIPE
    if script is not None and recipe is None:  # the recipe is the one the script builds
        name, word, line = script
        origin = Origin(FROM_FILE, f"{path}:{line}", word, "the example script's name")
        set_model_name(reading, name, origin)
        reading.format = f"Megatron-Bridge {word} command line (overrides on its recipe)"
    return reading


def _peft_mode(reading: Reading, recipe: str | None, mode: tuple | None, path: str) -> None:
    """run_recipe.py's training mode: `--mode lora|dora`, else the one the recipe's name encodes
    (scripts/training/recipe_metadata.py `infer_recipe_mode`: `_peft_` / `_lora_` is LoRA,
    `_dora_` DoRA): adapters on frozen base weights, which the recipe (not read here) sets."""
    if mode is not None:
        name, line, key = mode[0], mode[1], "--mode"
    elif recipe is not None:
        named = f"_{recipe.lower().strip('_')}_"
        name = next((m for m in ("dora", "peft", "lora") if f"_{m}_" in named), "")
        line, key = getattr(reading, "recipe_origin", Origin(FROM_FILE, path)).where, "--recipe"
        line = line.rpartition(":")[2]
    else:
        return
    if name.lower() in ("lora", "dora", "peft"):
        note = f"{name}: adapters on frozen base weights (run_recipe.py's mode)"
        reading.set("frozen_base", True, Origin(FROM_FILE, f"{path}:{line}", key, note))


def _with_config_file(reading: Reading, name: str, line: int, path: str) -> Reading:
    """The YAML an example script's `--config-file` names, read from beside the command's file
    (Megatron-Bridge merges it on the recipe, then the command's overrides on it); where it is
    not there, a warning that says how to give it."""
    from .bridge import read_yaml

    file = Path(name) if Path(name).is_absolute() else Path(path).parent / name
    if not file.is_file():
        reading.warnings.append(
            f"{path}:{line}: --config-file {name}: not found beside this file; its values are "
            f"not read (give it too, before the command: recompute-kit read {name} {path})"
        )
        return reading
    base = read_yaml(file.read_text(encoding="utf-8"), str(file))
    base.warnings += reading.warnings
    base.unused.update(reading.unused)
    for key, value in reading.values.items():
        base.set(key, value, reading.origins[key])
    return base


# the one ConfigContainer field an override sets whole, to a preset's name
_WHOLE_PRECISION = re.compile(r"^(\+\+|\+)?mixed_precision=\S+$")


def apply_after(reading: Reading, words: list[str], applies_to: str) -> Reading:
    """`recompute-kit read FILE key=value ...`: the overrides given after a Megatron-Bridge
    file, applied after it as Megatron-Bridge applies command-line overrides after the YAML /
    recipe (training/utils/omegaconf_utils.py); each value's origin is the override."""
    # `peft=lora`: OmegaConf overrides are section.key=value; a word that is not one is said
    dotted = re.compile(r"^(\+\+|\+|~)?[A-Za-z_]\w*(\.\w+)+(=|$)")
    plain = [w for w in words if not (dotted.match(w) or _WHOLE_PRECISION.match(w))]
    words = [w for w in words if dotted.match(w) or _WHOLE_PRECISION.match(w)]
    if words:
        over = read("\n".join(shlex.quote(w) for w in words), "command line")
    else:
        over = Reading(framework=BRIDGE)
    for w in plain:
        over.unused[w] = None
        over.warnings.append(
            f"{w}: not a section.key=value override of the ConfigContainer; not read (a "
            "finetune recipe's PEFT scheme is its peft_scheme argument, run_recipe.py --mode lora)"
        )
    for key, value in over.values.items():
        o = over.origins[key]
        at = o.where.rpartition(":")[2]
        word = words[int(at) - 1] if at.isdigit() and 0 < int(at) <= len(words) else o.key
        note = f"override of {applies_to}" + (f"; {o.note}" if o.note else "")
        reading.set(key, value, Origin(FROM_ARGUMENT, "command line", word, note))
    reading.warnings += over.warnings
    reading.unused.update({k: v for k, v in over.unused.items() if k != ON_RECIPE})
    return reading
