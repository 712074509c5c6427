"""From inputs to one `Config`: read each input, merge, add the model's shape, the framework's
defaults and the derived values, and say aloud what is still assumed.

The order of precedence, highest first: recompute-kit's own command-line overrides (`--tp 4`),
the inputs (a later input wins over an earlier one, and the conflict is reported), the model's
public config (registry or `config.json`) for the shape, the framework's documented defaults,
values the framework derives, and last the assumptions, each named with the key that sets it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import CONFIG_KEYS, Config, ConfigError
from . import formats, hf_launch, megatron_core, recipe_choice, recipes, registry
from .megatron_lm import WORLD_UNKNOWN
from .nemo_rl_overrides import is_override
from .reading import (
    ARCHITECTURE_KEYS,
    FROM_ARGUMENT,
    FROM_ASSUMED,
    FROM_DEFAULT,
    FROM_DERIVED,
    FROM_FILE,
    FROM_MODEL,
    MEMORY_KEYS,
    MLA_KEYS,
    MOE_KEYS,
    OVERRIDE_FLAGS,
    RECOMPUTE_KEYS,
    SHAPE_KEYS,
    SHAPE_NOT_FROM_NAME,
    Origin,
    Reading,
)
from .semantics import derive_layout, normalize
from .summary import assumption_text
from .torchtitan_defaults import REGISTRY_UNNAMED

# What recompute-kit assumes when nothing says it (said aloud, with the key that sets it):
# Megatron-Core's own defaults, except where a training run of a large model plainly differs
# (mixed precision, rotary positions) or Megatron has no default (the training shape, DP).
ASSUMED_VALUES: dict[str, Any] = {
    **megatron_core.DEFAULTS,
    "seq_length": 4096,
    "micro_batch_size": 1,
    "vocab_size": 32000,
    "data_parallel_size": 1,
    "bf16": True,
    "position_embedding_type": "rope",
    "num_query_groups": None,
    "kv_channels": None,
    "ffn_hidden_size": None,
    "moe_ffn_hidden_size": None,
    "recompute_method": None,
    "recompute_num_layers": None,
    "recompute_modules": None,
}
MCORE = "Megatron-Core's TransformerConfig default"
# Fields whose fallback is not a TransformerConfig default, said as what it is.
_DEFAULT_LABEL = {
    "grad_reduce_in_fp32": "Megatron-LM's default for a bf16 run (accumulate_allreduce_grads_"
    "in_fp32; Megatron-Core's DistributedDataParallelConfig default is False)",
    # the MLA ranks as Megatron-LM's arguments default them (MLATransformerConfig: 512 / 512)
    "q_lora_rank": "Megatron-LM's --q-lora-rank default (MLATransformerConfig's is 512)",
    "kv_lora_rank": "Megatron-LM's --kv-lora-rank default (MLATransformerConfig's is 512)",
}


@dataclass
class Resolved:
    """One Config from the inputs, with the merged reading that says where each value is from."""

    config: Config | None  # None only when asked not to require a shape and none was given
    reading: Reading
    # [{"path", "format"}], and {"parent_of": input} for a parent file an input inherits
    inputs: list[dict[str, str]] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return self.reading.warnings

    def to_json(self) -> dict[str, Any]:
        doc = self.reading.to_json()
        doc["inputs"] = self.inputs
        return doc


_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".sh", ".py", ".txt", ".cfg", ".conf")
_HINT = "give the config files you train with, or a model id"


# `torchrun ...`, `NGPU=8 python -m torchtitan.train ...`: a launch command given as one input,
# read as a one-line script run from the working folder
_LAUNCH_COMMAND = re.compile(
    r"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
    r"(?:torchrun|python3?|accelerate|deepspeed|srun|llamafactory-cli)\s+\S"
    # a Python script run directly with its flags (`scripts/training/run_recipe.py --recipe X`)
    r"|^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*\S+\.py\s+-"
)
COMMAND_LINE = "the command line"


def is_launch_command(item: str) -> bool:
    """A launch command given as one input (`torchrun ...`, `NGPU=8 python -m ...`)."""
    return bool(_LAUNCH_COMMAND.match(item)) and not _exists(item)


def _is_file(item: str | Path) -> bool:
    """Whether `item` names a file; a launch command given as one input is no file name, even
    one too long for the filesystem to look up (ENAMETOOLONG)."""
    try:
        return Path(item).is_file()
    except OSError:
        return False


def _exists(item: str | Path) -> bool:
    try:
        return Path(item).exists()
    except OSError:
        return False


def file_of(item: str) -> str:
    """The file an input names: `recipe.py::function` (one recipe of several) is recipe.py."""
    if "::" in item and not _is_file(item) and _is_file(item.partition("::")[0]):
        return item.partition("::")[0]
    return item


# Model families whose layers are not a transformer's, by their Hugging Face names (their
# config.json's model_type says it too: hf_config._NOT_MODELLED)
_NOT_MODELLED_NAMES = {
    "qwen3_next": "Gated DeltaNet linear attention + attention (Qwen3-Next)",
    "nemotron_h": "Mamba-2 + attention (Nemotron-H)",
    "jamba": "Mamba + attention (Jamba)",
    "falcon_h1": "Mamba-2 + attention (Falcon-H1)",
    "mamba": "Mamba",
}
_NOT_MODELLED_NAME = re.compile(
    r"(?i)(?P<qwen3_next>Qwen3-Next)|(?P<nemotron_h>Nemotron-H\b|Nemotron-3(?:\.\d)?-|Nemotron-Nano-(?:\d+B-)?v2)"
    r"|(?P<jamba>\bJamba)|(?P<falcon_h1>Falcon-H1)|(?P<mamba>\bmamba(?:2)?-)"
)
# The words of a reading whose model is not sized (Mamba, linear attention): the doctor reads
# them from the read's warnings
NOT_SIZED = "makes no estimate of this model"


def with_overrides(inputs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The inputs, each with the Hydra-style `key=value` items given after it (`read cfg.yaml
    policy.max_total_sequence_length=8192`): overrides of the config before them."""
    groups: list[tuple[str, list[str]]] = []
    for item in inputs:
        words = _override_file_words(item) if groups else None
        if words:  # a file of overrides alone (a paste's `++policy.x=1` lines): after a config
            groups[-1][1].extend(words)
            continue
        command = bool(_LAUNCH_COMMAND.match(item)) or script_call(item) is not None
        if is_override(item) and not _exists(item) and not command:
            if not groups:
                raise ConfigError(
                    f"{item}: a key=value override applies to the config file before it; "
                    "give that file first"
                )
            groups[-1][1].append(item)
        else:
            groups.append((item, []))
    return groups


def _override_file_words(item: str) -> list[str] | None:
    """The override words of a small file that holds nothing else, else None."""
    path = Path(item)
    try:
        if not path.is_file() or path.stat().st_size > 64 * 1024:
            return None
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not formats.overrides_alone(text):
        return None
    return [w.strip("'\"") for line in text.splitlines() for w in line.split()]


_SCRIPT_CALL = re.compile(r"^\s*(?:(?:ba)?sh\s+)?(\S+\.sh)(?:\s+(.*))?$")
_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
_EXPORT = re.compile(r"^\s*export\s+([A-Za-z_][A-Za-z0-9_]*=\S*)\s*$")


@dataclass
class ScriptCall:
    """A script run with positional arguments: the script, its arguments, where they were
    given, and the variables the launching file exports before it."""

    script: Path
    argv: list[str]
    where: str
    exports: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The script with `export ...; set -- ARGS;` before its first line (on that line: every
        line keeps its number), so that its $1 ... $N, $@ and those variables are the run's."""
        text = self.script.read_text(encoding="utf-8")
        exports = "".join(f"export {e}; " for e in self.exports)
        return f"{exports}set -- {shlex.join(self.argv)}; {text}"


def script_call(item: str, text: str | None = None) -> ScriptCall | None:
    """The input `run.sh dsw A2.4B 1 8 ...` (one argument with spaces), or a file whose one
    command runs such a script (`sh run.sh dsw ...`, the way Pai-Megatron-Patch's examples
    are launched; its `export X=Y` lines go with it); None otherwise."""
    if text is None:
        if _exists(item):  # a file whose name has spaces is that file
            return None
        try:
            words = shlex.split(item) if " " in item.strip() else []
        except ValueError:  # an unclosed quote: not a command line
            return None
        # `CONFIG=llama3_70b NGPU=8 ./run_train.sh`: the script runs with those set
        exports = []
        while words and _ENV_WORD.match(words[0]):
            exports.append(words.pop(0))
        if words and words[0] in ("bash", "sh"):  # `bash run.sh A B`: the script and its args
            words = words[1:]
        if words and words[0].endswith(".py"):
            return None  # a Python script run with its flags: a launch command (python ...)
        if (len(words) > 1 or (words and exports)) and _is_file(words[0]):
            return ScriptCall(Path(words[0]), words[1:], "the command line", exports)
        return None
    joined = re.sub(r"\\\n", " ", text)  # continuation lines
    lines = [(n, line.strip()) for n, line in enumerate(joined.splitlines(), 1)]
    exports = [m.group(1) for _, line in lines if (m := _EXPORT.match(line))]
    commands = [
        (n, line)
        for n, line in lines
        if line and not line.startswith("#") and not re.match(r"(?:set|cd|export)\b", line)
    ]
    if len(commands) != 1:
        return None
    command = commands[0][1]
    while (env := re.match(r"([A-Za-z_][A-Za-z0-9_]*=\S*)\s+", command)) is not None:
        exports.append(env.group(1))  # `CONFIG=x NGPU=8 ./run_train.sh ...`: set for the script
        command = command[env.end() :]
    if not (m := _SCRIPT_CALL.match(command)):
        return None
    for base in (Path(item).parent, Path.cwd()):
        target = base / m.group(1)
        if target.is_file() and target.resolve() != Path(item).resolve():
            try:
                args = shlex.split(m.group(2) or "")
            except ValueError:
                return None
            return ScriptCall(target, args, f"{item}:{commands[0][0]}", exports)
    return None


LOG_HEAD_BYTES = 2**20  # Megatron prints its arguments at start-up


def _read_head_of_a_log(path: Path) -> bytes | None:
    """The head of a long training log that prints Megatron's arguments (all the reader takes
    from it: the dump and the start-up lines), cut at a line; None for any other file."""
    from . import megatron_dump

    if path.stat().st_size <= LOG_HEAD_BYTES:
        return None
    with open(path, "rb") as handle:
        head = handle.read(LOG_HEAD_BYTES)
    head = head[: head.rfind(b"\n") + 1] or head
    text = head.decode("utf-8", errors="replace")
    return head if megatron_dump.sniff(text, str(path)) >= 85 else None


def read_input(item: str, overrides: Sequence[str] = ()) -> tuple[Reading, str]:
    """One input: a file (any known format) or a model id / registry name; `overrides`: the
    `key=value` items given after it (a NeMo-RL / Megatron-Bridge config's). A script given
    with its positional arguments (`script_call`) is read with them."""
    called = script_call(item)
    # a file whose one command runs a script (`run.sh ...`, `CONFIG=x ./run_train.sh ...`)
    script_like = item.endswith((".sh", ".txt")) or not Path(item).suffix
    if called is None and _is_file(file_of(item)) and script_like:
        try:
            called = script_call(item, Path(item).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            called = None
    if called is not None:
        try:
            text = called.text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {called.script}: {exc}") from None
        reading = formats.read_file_text(text, str(called.script), overrides)
        # the script itself, given again beside this file, is not read again on its own
        # defaults (run_train.sh's CONFIG=llama3_debugmodel): it was read here, with arguments
        reading.read_within.append(str(called.script))
        n = len(called.argv)
        exported = f", and its exports {' '.join(called.exports)}" if called.exports else ""
        reading.warnings.insert(
            0,
            f"{called.script} read with the {n} positional arguments {called.where} gives it "
            f"($1..${n}: {shlex.join(called.argv)}){exported}",
        )
        return reading, f"{reading.format or 'script'} with arguments"
    path = Path(file_of(item))
    is_file = _is_file(path)
    looks_like_path = item.startswith(("/", ".", "~")) or item.lower().endswith(_FILE_SUFFIXES)
    if is_file:
        try:
            data = _read_head_of_a_log(path) or path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {item}: {exc.strerror}") from None
        if not data.strip():
            raise ConfigError(f"{item} is empty; {_HINT}")
        where = data.find(b"\x00")
        if where < 0:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                where = exc.start
        if where >= 0:
            raise ConfigError(f"{item} is not text (binary data at byte {where}); {_HINT}")
        reading = formats.read_file_text(text, item, overrides)
        return reading, reading.format or "config"
    if overrides:
        raise ConfigError(
            f"{overrides[0]}: a key=value override applies to the NeMo-RL, Megatron-Bridge "
            f"or NeMo 1.x config file before it; {item} is not a file"
        )
    if _exists(path):
        raise ConfigError(f"{item} is not a file")
    if _LAUNCH_COMMAND.match(item) and " " in item.strip():  # one quoted launch command
        reading = formats.read_file_text(item, COMMAND_LINE, overrides)
        return reading, reading.format or "launch command"
    if looks_like_path:
        raise ConfigError(f"cannot read {item}: No such file or directory")
    from . import hf_config

    preset = _preset_reading(item)
    if preset is not None:
        return preset, "recompute-kit preset"
    if "/" not in item and registry.model_reading(item) is None:
        raise ConfigError(
            f"unknown model {item!r}: not a file, not a preset and not in the registry "
            "(`recompute-kit models`); give a Hugging Face id (org/name) or its config.json"
        )

    reading = hf_config.read_model_id(item)  # raises ConfigError naming what to pass instead
    return reading, reading.format or "model id"


def _preset_reading(name: str) -> Reading | None:
    """A preset of `recompute-kit presets` named as a model: its architecture (the shape, the
    MoE and MLA fields), never its sequence length or layout."""
    from ..presets import PRESETS

    preset = PRESETS.get(name) or next(
        # a Hugging Face id whose config.json a preset was made from (Meta-Llama-3-70B)
        (p for p in PRESETS.values() if p.source.split(" ", 1)[0].lower() == name.lower()),
        None,
    )
    if preset is None:
        return None
    model = dataclasses.asdict(preset.model)
    keys = {*SHAPE_KEYS, *ARCHITECTURE_KEYS, *MOE_KEYS, *MLA_KEYS}
    reading = Reading(format="recompute-kit preset", model_name=name)
    origin = Origin(FROM_MODEL, f"recompute-kit preset {preset.name} ({preset.source})", name)
    for key in sorted(keys & set(model)):
        # an MLA rank of None says something (q_lora_rank None: a plain q_proj, no q latent)
        if model[key] is not None or (key in MLA_KEYS and model.get("multi_latent_attention")):
            reading.set(key, model[key], origin)
    return reading


def _assumed_where_a_setting_was_not_read(reading: Reading) -> None:
    """A framework default for a field the input writes where it cannot be read (`if [ $PR =
    bf16 ]; then pr_options="--bf16"` on an argument it is not given; `--tensor-model-parallel-
    size $TP` with TP unset): said as an assumption, with the line that may set it, never as
    the run's value."""
    module = formats.framework_module(reading.framework or "megatron-core", reading.format)
    for key, why in reading.unread_settings.items():
        origin = reading.origins.get(key)
        if origin is None or origin.kind != FROM_DEFAULT:
            continue
        flag = module.key_for(key) if module is not None else key
        reading.set(key, reading.values[key], Origin(FROM_ASSUMED, origin.where, flag, why))


def merge(readings: Sequence[Reading]) -> Reading:
    """Later readings win; a value two inputs give differently is reported."""
    merged = Reading()
    for reading in readings:
        for key, value in reading.values.items():
            origin = reading.origins[key]
            if key in merged.values and merged.values[key] != value:
                before = merged.origins[key]
                if before.kind == FROM_FILE and origin.kind == FROM_FILE:
                    merged.warnings.append(
                        f"conflict: {key} is {merged.values[key]!r} in {before.describe()} "
                        f"and {value!r} in {origin.describe()}: the later input's value is used"
                    )
            if origin.kind == FROM_DEFAULT and merged.origins.get(key, origin).kind != FROM_DEFAULT:
                continue  # a default a reader filled never hides what another input wrote
            if origin.kind == FROM_ASSUMED and merged.origins.get(key, origin).kind not in (
                FROM_DEFAULT,
                FROM_ASSUMED,
            ):
                continue  # nor does a guess (a script's unread tokenizer: the model's vocab)
            merged.set(key, value, origin)
        # (a file a script reads and also given itself says its warnings once)
        merged.warnings += [w for w in reading.warnings if w not in merged.warnings]
        merged.not_modelled += reading.not_modelled
        merged.unused.update(reading.unused)
        merged.unread_settings.update(reading.unread_settings)
        if reading.tokenizer:
            merged.tokenizer, merged.tokenizer_origin = reading.tokenizer, reading.tokenizer_origin
        if reading.model_name:  # a later input names the model the run uses
            if merged.model_name not in (None, reading.model_name):
                merged.warnings.append(
                    f"conflict: the model is {merged.model_name} in an earlier input and "
                    f"{reading.model_name} in a later one: the later is used"
                )
            merged.model_name, merged.model_name_origin = (
                reading.model_name,
                reading.model_name_origin,
            )
        if reading.framework and reading.framework != "hf-config":
            merged.framework = merged.framework or reading.framework
        if reading.format:
            merged.format = " + ".join(f for f in (merged.format, reading.format) if f)
    if merged.framework is None and readings:
        merged.framework = readings[0].framework
    whole = [r for r in readings if r.format and _writes_the_model(r)]
    if len(whole) >= 2 and len({r.format for r in whole}) == 1:
        # two whole configs of one kind are more likely two runs (an ablation's arms) than
        # one run in two files: merged, the estimate is of a run neither of them is
        merged.warnings.append(
            f"{len(whole)} inputs each write a whole model ({whole[0].format}): they are "
            "merged as one run, later values winning; for separate runs (an ablation's arms) "
            "give one run's files at a time"
        )
    return merged


def _writes_the_model(reading: Reading) -> bool:
    return all(
        (o := reading.origins.get(k)) is not None and o.kind == FROM_FILE
        for k in ("num_layers", "hidden_size")
    )


def _drop_inputs_read_within(items: list[str], readings: list, described: list[dict]) -> None:
    """An input that another input already read as its `defaults:` parent, as the `--config`
    of its launch command or as the DeepSpeed JSON its Trainer arguments name is not applied
    again: read again after that input, it would undo
    what the child (or the launch's overrides) sets over it. `read` lists it as read once."""
    within: dict[str, str] = {}
    for item, reading in zip(items, readings, strict=True):
        launched = getattr(reading, "launched_config", None)
        for path in (launched, *getattr(reading, "parents", ()), *reading.read_within):
            if path:
                within.setdefault(os.path.abspath(path), item)
    overridden = {d["override_of"] for d in described if "override_of" in d}
    for index in reversed(range(len(items))):
        item = items[index]
        owner = within.get(os.path.abspath(file_of(item)))
        if owner is None or owner == item or item in overridden:
            continue
        del items[index], readings[index]
        entry = next(d for d in described if d["path"] == item and len(d) == 2)
        entry["format"] = f"read once, within {owner}: not applied again"
        described[:] = [d for d in described if d.get("parent_of") != item]


def _a_script_beside_configs(item: str, pairs: list) -> bool:
    """A .py file (no `::function`) given with other inputs: SKILL.md asks for every file of the
    run, the training script included; the others say its settings."""
    return item.endswith(".py") and "::" not in item and len(pairs) > 1


def resolve(
    inputs: Sequence[str],
    model: str | None = None,
    overrides: dict[str, Any] | None = None,
    require_shape: bool = True,
) -> Resolved:
    """Read `inputs` (files or model ids, in order), optionally `model` (an id or registry
    name that gives the shape when no input does), and recompute-kit's own overrides
    (`{"tensor_model_parallel_size": 4}`), into one Config. Raises ConfigError (one line),
    also when nothing gives the model's shape, unless require_shape=False (`read` shows
    what a DeepSpeed JSON or an overrides file says on its own: then `config` is None)."""
    readings, described, items = [], [], []
    if model:
        named = _NOT_MODELLED_NAME.search(model)
        try:
            reading, what = read_input(model)
        except ConfigError:
            if not named:
                raise
            # a hybrid's name alone: read as that name, refused where it would be sized
            reading, what = Reading(model_name=model), "a model id (not sized: see below)"
        readings.append(reading)
        items.append(model)
        described.append({"path": model, "format": what})
    left_out: list[str] = []  # a training script passed beside the files it runs with
    unnamed: dict[str, ConfigError] = {}  # registries of several configs, none named here
    pairs = list(with_overrides(inputs))
    for item, given in pairs:
        try:
            reading, what = read_input(item, given)
        except ConfigError as exc:
            if REGISTRY_UNNAMED in str(exc) and len(pairs) > 1:
                unnamed[item] = exc  # a launch beside it may name the config (checked below)
                continue
            if not (_a_script_beside_configs(item, pairs) and formats.NOT_A_CONFIG in str(exc)):
                raise
            left_out.append(
                f"{item}: a Python training script, not a config: left out (its settings are "
                "the command line's and the config files')"
            )
            described.append({"path": item, "format": "left out: a training script"})
            continue
        readings.append(reading)
        items.append(item)
        described.append({"path": item, "format": what})
        # `FILE key=value`: which input each override applied to
        described += [{"path": o, "format": "override", "override_of": item} for o in given]
        # the YAML a NeMo-RL launch command names (`--config`) was read too
        if getattr(reading, "launched_config", None):
            config = reading.launched_config
            described.append(
                {"path": config, "format": f"the --config of {item}", "config_of": item}
            )
        # the parents a file inherits from (NeMo-RL's `defaults:`) were read too
        child = getattr(reading, "launched_config", None) or item
        described += [
            {"path": parent, "format": f"the defaults: parent of {child}", "parent_of": item}
            for parent in getattr(reading, "parents", ())
        ]
    launched = {
        os.path.realpath(r.launched_config): item
        for item, r in zip(items, readings, strict=True)
        if getattr(r, "launched_config", None)
    }
    for item, exc in unnamed.items():
        owner = launched.get(os.path.realpath(file_of(item)))
        if owner is None:
            raise exc  # no launch among the inputs says which config of it runs
        described.append({"path": item, "format": f"read once, within {owner}: its --config"})
    if not readings:
        raise ConfigError("nothing to read: give a config file or a model id")
    _drop_inputs_read_within(items, readings, described)
    # a launch command's --recipe NAME with no recipe file given: its file in the checkout
    for found in recipe_choice.from_the_checkout(items, readings):
        reading, what = read_input(found)
        readings.insert(0, reading)
        items.insert(0, found)
        by = f"{what} (found in the checkout by --recipe)"
        described.insert(0, {"path": found, "format": by})
    # a launch command's --recipe NAME chooses the function of a recipe file given beside it
    for index, (reading, what) in recipe_choice.select_named(items, readings, read_input).items():
        readings[index] = reading
        next(d for d in described if d["path"] == items[index])["format"] = what
    merged = merge(recipe_choice.apply_on_the_read_recipe(readings))
    merged.warnings += left_out
    if model and readings[0].model_name and merged.model_name != readings[0].model_name:
        # --model is the user's explicit choice for the shape: it wins over a file's model
        merged.warnings = [w for w in merged.warnings if not w.startswith("conflict: the model")]
        merged.warnings.append(
            f"the shape is {readings[0].model_name}'s (--model); the files name {merged.model_name}"
        )
        merged.model_name = readings[0].model_name
        merged.model_name_origin = readings[0].model_name_origin
    if model:  # the files' unreadable model names are not what the shape comes from
        merged.warnings = [
            w.split(SHAPE_NOT_FROM_NAME)[0] + f"the shape is {model}'s (--model)"
            if SHAPE_NOT_FROM_NAME in w
            else w
            for w in merged.warnings
        ]
    for key, value in (overrides or {}).items():
        flag = _FLAG_OF.get(key) or "--" + key.replace("_", "-")
        merged.set(key, value, Origin(FROM_ARGUMENT, "recompute-kit", flag))
    if "world_size" in merged.values or "data_parallel_size" in (overrides or {}):
        # another input (an accelerate config's num_processes) or --dp gave the world
        merged.warnings = [
            w for w in merged.warnings if hf_launch.GPUS_UNSAID not in w and WORLD_UNKNOWN not in w
        ]
    named = _NOT_MODELLED_NAME.search(merged.model_name or "")
    if named and not merged.not_modelled:  # said before asking for a config.json to refuse
        merged.not_modelled.append(
            f"{merged.model_name}: {_NOT_MODELLED_NAMES[named.lastgroup]} layers (by its name)"
        )
    try:
        _add_model_shape(merged)
    except ConfigError as exc:  # the named model's config.json cannot be had
        if require_shape and not merged.not_modelled:
            raise
        merged.warnings.append(str(exc))
    _add_tokenizer_vocabulary(merged)
    framework = formats.framework_module(merged.framework or "megatron-core", merged.format)
    if framework is not None:
        framework.apply_defaults(merged)
    _assumed_where_a_setting_was_not_read(merged)
    normalize(merged)
    derive_layout(merged, overrides or {}, strict=require_shape)
    _assumed_if_the_world_is(merged)
    if framework is not None and hasattr(framework, "derive_after_layout"):
        framework.derive_after_layout(merged)  # what needs the data-parallel size
    deferred = next(
        (k for k, v in merged.unused.items() if _DEFERRED_WGRAD.search(str(k)) and _on(v)), None
    )
    if deferred:
        # tensor_parallel/layers.py: each micro-batch's grad_output and input are kept for the
        # output layer's weight gradient until the pipeline flushes
        merged.warnings.append(
            f"{deferred}: the last stage keeps each micro-batch's output-layer gradient ([s, b, "
            "vocab/tp] in 16 bits) and input until the pipeline flush, up to "
            "wgrad_deferral_limit of them (0: every micro-batch of the step); not in the estimate"
        )
    regather = next(
        (k for k, v in merged.unused.items() if _REGATHER.search(str(k)) and _on(v)), None
    )
    if regather and "lora_input_regather" not in merged:
        merged.set("lora_input_regather", True, Origin(FROM_FILE, "inputs", regather))
    if merged.get("frozen_base"):
        bits = merged.get("base_weight_bits")
        base = (
            f"the base's layers at {bits} bits (with bitsandbytes' block scales), its "
            "embedding and output layer in 16 bits, are"
            if bits
            else "the base's 16-bit weights are"
        )
        merged.warnings.append(
            "frozen_base: the adapters' own parameters, gradients and optimizer states (LoRA "
            f"rank x the targeted layers' widths, about 18 B a parameter with Adam) are not "
            f"counted; {base}"
        )
    optimizer = next(
        (
            (k, v)
            for k, v in merged.unused.items()
            if _OPTIMIZER_KEY.search(str(k)) and _NOT_ADAM.search(str(v))
        ),
        None,
    ) or next(  # LLaMA-Factory's own switches (hparams/finetuning_args.py): use_muon: true
        (
            (k, k.removeprefix("use_"))
            for k, v in merged.unused.items()
            if k in _LF_OPTIMIZER_SWITCHES and v is True
        ),
        None,
    )
    if optimizer:
        key, name = optimizer
        muon = ""
        if "muon" in str(name).lower():
            muon = "; Muon keeps one momentum for the linear weights (Adam for the rest)"
            if "dist" in str(name).lower():
                muon += (
                    ", and its layer-wise distributed form leaves each data-parallel rank the "
                    "parameters it owns"
                )
        merged.warnings.append(
            f"{key} {name}: the optimizer states are counted as Adam's (a master copy and two "
            f"moments){muon}: the optimizer figure is an upper bound"
        )
    vision = _vision_language(merged)
    if vision:
        merged.warnings.append(
            f"{vision}: a vision-language model; the estimate is its language model's: the "
            "vision tower, the projector and the image / video tokens (which lengthen the "
            "sequence) are not modelled"
        )
    if merged.get("fp8"):
        # not measured here (no Transformer Engine on CPU): said, never silently
        recipe = f"{merged.get('fp8_recipe')} recipe; " if merged.get("fp8_recipe") else ""
        merged.warnings.append(
            f"fp8 ({merged.get('fp8')}, {recipe}{merged.origins['fp8'].describe()}): the "
            "estimate counts activations at 16-bit sizes; Transformer Engine's fp8 linears "
            "keep some saved inputs in fp8 (1 byte), not modelled, so the real activations "
            "can be lower"
        )
    if merged.get("mtp_num_layers") and merged.get("loss_implementation", "megatron") != (
        "megatron"
    ):
        # Megatron's engine counts MTP on its stage (memory/mtp.py); the others build none.
        mtp = merged.get("mtp_num_layers")
        merged.warnings.append(
            f"mtp_num_layers {mtp} ({merged.origins['mtp_num_layers'].describe()}): "
            f"multi-token-prediction layers are not in the estimate: only Megatron-Core builds "
            f"them, this run's loss is {merged.get('loss_implementation')}'s"
        )
    if merged.not_modelled:
        # never a transformer's figures for layers that are not a transformer's
        said = (
            f"{'; '.join(merged.not_modelled)}: recompute-kit models transformer, MoE and MLA "
            f"layers only, so it {NOT_SIZED} (its readings are shown, not sized)"
        )
        merged.warnings.append(said)
    try:
        _check_shape(merged, framework, described)
    except ConfigError as exc:
        if require_shape and merged.not_modelled:
            raise ConfigError(merged.warnings[-1]) from None  # (not "add num_layers")
        if require_shape:
            raise
        if not merged.not_modelled:  # (no shape to add: the model is not sized at all)
            merged.warnings.append(str(exc))
        _assume_the_rest(merged, framework)
        _say_the_assumptions(merged)
        return Resolved(None, merged, described)
    _assume_the_rest(merged, framework)
    _say_the_assumptions(merged)
    config = _to_config(merged)
    if merged.not_modelled:  # validated and measured, never sized
        config.model.not_modelled = merged.warnings[
            next(i for i, w in enumerate(merged.warnings) if NOT_SIZED in w)
        ]
    return Resolved(config, merged, described)


# the recompute-kit flag that sets a key (`--dp`, not `--data-parallel-size`)
_FLAG_OF = {key: "--" + dest.replace("_", "-") for dest, key in OVERRIDE_FLAGS.items()}


def _say_the_assumptions(reading: Reading) -> None:
    """Every value nothing says (an assumption: each is one the estimate needs) becomes a
    warning too, naming the key or flag that sets it: a JSON reader sees it without walking
    `sources`."""
    for key, origin in reading.origins.items():
        if origin.kind == FROM_ASSUMED:
            text = assumption_text(key, reading.values[key], origin)
            if text not in reading.warnings:
                reading.warnings.append(text)


def _assumed_if_the_world_is(reading: Reading) -> None:
    """A DP derived from an assumed world size (a launch script's node count that is an
    environment variable's default) is an assumption too, set by what sets the world."""
    world, dp = reading.origins.get("world_size"), reading.origins.get("data_parallel_size")
    if world is None or dp is None or world.kind != FROM_ASSUMED or dp.kind != FROM_DERIVED:
        return
    note = f"{dp.where}; the world size is assumed: {world.note}"
    dp_value = reading.values["data_parallel_size"]
    reading.set("data_parallel_size", dp_value, Origin(FROM_ASSUMED, world.where, world.key, note))


def _add_tokenizer_vocabulary(reading: Reading) -> None:
    """A run that names its Hugging Face tokenizer has that model's vocabulary (the registry's
    config.json vocab_size: the embedding's rows, which Megatron pads further)."""
    if "vocab_size" in reading or not reading.tokenizer:
        return
    from . import registry

    model = registry.model_reading(reading.tokenizer)
    if model is None or "vocab_size" not in model:
        reading.warnings.append(
            f"the vocabulary is the tokenizer's ({reading.tokenizer}), not in the registry: "
            "vocab_size is not read"
        )
        return
    where = reading.tokenizer_origin.describe() if reading.tokenizer_origin else ""
    reading.set(
        "vocab_size",
        model.values["vocab_size"],
        dataclasses.replace(
            model.origins["vocab_size"], note=f"the tokenizer the run names ({where})"
        ),
    )


def _add_model_shape(reading: Reading) -> None:
    """The named model's public config fills what the inputs leave out (never overrides)."""
    if reading.model_name is None or all(k in reading for k in SHAPE_KEYS):
        return
    from . import hf_config

    name = reading.model_name
    # a local checkpoint folder (from_pretrained's own first reading of the name, relative to
    # where the run starts: here), then the registry, a preset made from that model's
    # config.json, and the Hub
    local = Path(name) / "config.json"
    if local.is_file():
        model = hf_config.read(local.read_text(encoding="utf-8"), str(local))
    else:
        model = (
            registry.model_reading(name) or _preset_reading(name) or hf_config.read_model_id(name)
        )
    for key, value in model.values.items():
        reading.set(key, value, model.origins[key], overwrite=False)
    # what the config.json says of itself (gpt-oss's sliding window, counted as global), but
    # not its capacity as a sequence length where the files give one
    seq_given = "seq_length" in reading and reading.origins["seq_length"].kind != FROM_MODEL
    reading.warnings += [
        w
        for w in model.warnings
        if w not in reading.warnings and not (seq_given and "max_position_embeddings" in w)
    ]
    reading.not_modelled += [n for n in model.not_modelled if n not in reading.not_modelled]


# What says a run trains a vision-language model: its keys (LLaMA-Factory's, a config.json's
# vision_config, Bridge's VL providers) or its model's name
_VISION_KEYS = re.compile(
    r"(?:^|\.)(?:image_max_pixels|video_max_pixels|freeze_vision_tower|"
    r"freeze_multi_modal_projector|vision_config|vision_tower)$"
)
_VISION_NAME = re.compile(r"(?i)(?:-VL\b|VL-|llava|-Vision\b|-Omni\b|InternVL|Qwen3\.5-VL)")


# An optimizer named beside the inputs that is not Adam: its states are not Adam's
_OPTIMIZER_KEY = re.compile(r"(?:^|[.(\s-])optimizer(?:=\))?$|^--optimizer$")
# LLaMA-Factory's optimizer switches (src/llamafactory/hparams/finetuning_args.py) other than
# Adam's: Muon, GaLore and APOLLO (low-rank projected states), BAdam (one block at a time)
_LF_OPTIMIZER_SWITCHES = ("use_muon", "use_galore", "use_apollo", "use_badam")
_NOT_ADAM = re.compile(
    r"(?i)^(?:dist_?)?(?:muon|sgd|lion|adafactor|soap|shampoo|galore|apollo|badam)\b"
)
_DEFERRED_WGRAD = re.compile(r"defer[_-]embedding[_-]wgrad[_-]compute$")
_REGATHER = re.compile(r"sequence_parallel_input_regather$")  # Megatron-Bridge's LoRA


def _on(value: Any) -> bool:
    """A key's value as written is on: true (a flag given alone reads as True)."""
    return str(value).strip().lower() in ("true", "1", "yes")


def _vision_language(reading: Reading) -> str:
    """Where the inputs say the model is a vision-language one ("" where they do not)."""
    keys = [k for k in reading.unused if _VISION_KEYS.search(str(k))]
    if keys:
        return ", ".join(keys[:3])
    if reading.model_name and _VISION_NAME.search(reading.model_name):
        return reading.model_name
    return ""


def _check_shape(reading: Reading, framework: Any, described: list[dict[str, str]]) -> None:
    missing = [k for k in SHAPE_KEYS if not reading.get(k)]
    if not missing:
        return
    names = ", ".join(d["path"] for d in described)
    keys = _keys_in_words([_key_for(framework, k) for k in missing])
    if reading.model_name:
        raise ConfigError(
            f"{names}: no model shape: the model {reading.model_name} is not in the registry "
            "(`recompute-kit models`) and its config.json could not be had; pass its "
            f"config.json beside the files, or set {keys}"
        )
    # the file names and what was read in them (`recipe gpt_oss_120b_pretrain_..._config()`)
    said = [f"{Path(d['path']).stem} {d['format']}" for d in described]
    named = registry.named_in(" ".join(said))
    example = named or "meta-llama/Llama-3.1-8B"
    # a provider class whose file was not found: the shape it sets is what is missing
    unread = [w.split(": ", 1)[1] for w in reading.warnings if recipes.PROVIDER_UNREAD in w]
    if unread and not named:
        raise ConfigError(f"{names}: no model shape ({keys} not given): {unread[0]}")
    # a model named by what is no Hugging Face id (a local path, a placeholder)
    unnamed = [w for w in reading.warnings if SHAPE_NOT_FROM_NAME in w]
    if unnamed:
        raise ConfigError(
            f"no model shape: {unnamed[0]}; name the model (--model {named or 'HF_ID'}, a "
            f"registry name, or its config.json), or set {keys}"
        )
    raise ConfigError(
        f"{names}: no model shape ({keys} not given) and no model named; add them, or name "
        f"the model (--model {example}, a registry name, or its config.json)"
        + (f"; the file or recipe name suggests {named}" if named else "")
    )


def _keys_in_words(keys: list[str]) -> str:
    """The keys that set some values, once each, a way that all share said once ("the
    model's config.json, or model_overrides.num_layers, ...hidden_size")."""
    keys = list(dict.fromkeys(keys))
    shared = {k.rpartition(", or ")[0] for k in keys}
    if len(keys) > 1 and len(shared) == 1 and "" not in shared:
        return f"{shared.pop()}, or " + ", ".join(k.rpartition(", or ")[2] for k in keys)
    return ", ".join(keys)


def _needed_keys(reading: Reading) -> list[str]:
    keys = list(MEMORY_KEYS)
    if reading.get("num_moe_experts"):
        keys += MOE_KEYS
    if reading.get("multi_latent_attention"):
        # MLA's heads have their own widths: Megatron's MLA layers read neither of these
        keys = [k for k in keys if k not in ("num_query_groups", "kv_channels")] + list(MLA_KEYS)
    granularity = reading.get("recompute_granularity")
    if granularity == "selective":  # (Megatron ignores the modules under full, and the
        keys.append("recompute_modules")  # method and layer count under selective)
    elif granularity == "full":
        keys += [k for k in RECOMPUTE_KEYS if k != "recompute_modules"]
    return keys


# Fusions the training framework decides and the activations depend on: Megatron-Core's
# dataclass has them off, Megatron-LM's arguments and Megatron-Bridge's providers turn them on;
# with a model alone (no framework's file read) they are assumptions, said with what sets them.
_FRAMEWORK_FUSIONS = {
    "bias_activation_fusion": "Megatron-Core's default off (the activation's input and output "
    "both kept); Megatron-LM fuses SwiGLU unless --no-bias-swiglu-fusion: give the run's "
    "config to read it",
    "apply_rope_fusion": "Megatron-Core's default off; Megatron-LM applies RoPE fused unless "
    "--no-rope-fusion: give the run's config to read it",
    # (the training dtype: every byte of the estimate scales with it)
    "bf16": "Megatron-Core's default bf16 False, fp16 False: fp32 training; --dtype bf16 for a "
    "bf16 run, or give the run's config to read it",
}


def _assume_the_rest(reading: Reading, framework: Any) -> None:
    shapeless = not all(reading.get(k) for k in SHAPE_KEYS)
    for key in _needed_keys(reading):
        if key in reading or key not in ASSUMED_VALUES:
            continue
        if shapeless and key in ARCHITECTURE_KEYS:
            continue  # no model: its architecture is not guessed either
        value, note = ASSUMED_VALUES[key], ""
        if key == "data_parallel_size":
            value, note = _smallest_data_parallel(reading)
        reading.set(
            key, value, Origin(FROM_ASSUMED, "recompute-kit", _key_for(framework, key), note)
        )
    if reading.framework == "torchtitan":
        _shard_over_the_assumed_data_parallel(reading, framework)
    # The remaining fields take Megatron-Core's own defaults (the dataclasses hold them), said
    # as such. Never the shape: the dataclasses' shape is a tiny test model's, and a reading
    # without one stays without one.
    # A framework that is not Megatron's (torchtitan) names these as recompute-kit's assumption.
    defaults = Config().to_flat()
    unset = getattr(framework, "UNSET_DEFAULT", None)
    no_framework = reading.framework in (None, "hf-config")  # a model alone: no trainer read
    for key, why in _FRAMEWORK_FUSIONS.items() if no_framework else ():
        origin = reading.origins.get(key)
        if origin is not None and origin.kind == FROM_DEFAULT:  # (Megatron-Core's, filled above)
            reading.set(key, reading.values[key], Origin(FROM_ASSUMED, "recompute-kit", key, why))
    for key in CONFIG_KEYS:
        if key not in reading and key not in _NEVER_DEFAULTED:
            if no_framework and key in _FRAMEWORK_FUSIONS:
                why = _FRAMEWORK_FUSIONS[key]
                reading.set(key, defaults[key], Origin(FROM_ASSUMED, "recompute-kit", key, why))
                continue
            label = unset or _DEFAULT_LABEL.get(key, MCORE)
            reading.set(key, defaults[key], Origin(FROM_DEFAULT, label))


def _shard_over_the_assumed_data_parallel(reading: Reading, framework: Any) -> None:
    """torchtitan's data_parallel_shard_degree -1 (its default) shards over every data-parallel
    rank: with the DP assumed, the ZeRO stage assumed follows it (FSDP2, stage 3, when DP x CP
    > 1), as it would from a given world size (sources/torchtitan.py)."""
    dp, stage = reading.origins.get("data_parallel_size"), reading.origins.get("zero_stage")
    if dp is None or stage is None or stage.kind != FROM_ASSUMED:
        return
    cp = reading.get("context_parallel_size") or 1
    if reading.get("data_parallel_size") * cp <= 1:
        return
    itself = ", itself assumed" if dp.kind == FROM_ASSUMED else ""
    note = f"dp_shard -1 shards over the data-parallel size {reading.get('data_parallel_size')}"
    note += itself
    key = _key_for(framework, "zero_stage")
    reading.set("zero_stage", 3, Origin(FROM_ASSUMED, "recompute-kit", key, note))
    reading.set("use_torch_fsdp2", True, Origin(FROM_ASSUMED, "recompute-kit", key, note))


def _smallest_data_parallel(reading: Reading) -> tuple[int, str]:
    """With no world size: DP 1, or the smallest DP the expert layout can be built on (EP x
    expert-TP must divide TP x CP x DP)."""
    if not reading.get("num_moe_experts"):
        return 1, ""
    tp = reading.get("tensor_model_parallel_size") or 1
    cp = reading.get("context_parallel_size") or 1
    experts = (reading.get("expert_model_parallel_size") or 1) * (
        reading.get("expert_tensor_parallel_size") or tp
    )
    dp = experts // math.gcd(experts, tp * cp)
    note = f"the smallest the expert layout allows (EP x expert TP = {experts})" if dp > 1 else ""
    world, pp = reading.get("world_size"), reading.get("pipeline_model_parallel_size") or 1
    if dp > 1 and world and world != dp * tp * cp * pp:
        # say it with the DP: a world of 8 beside DP 8 x PP 4 reads as a contradiction
        note += f"; the world of {world} GPUs given cannot hold it: it takes {dp * tp * cp * pp}"
    return dp, note


_NEVER_DEFAULTED = frozenset(
    {
        *SHAPE_KEYS,
        "seq_length",
        "micro_batch_size",
        "vocab_size",
        "attention_backend",
        # DeepSpeed's own (its reader gives DeepSpeed's defaults); other runs have none
        "zero_reduce_bucket_size",
        "zero_overlap_comm",
        "zero_prefetch_bucket_size",
        # the Trainer's optimizer (its reader says the default); Megatron's is fused
        "adam_step_temporary",
        # known only where an input says it (None in the Config: the pipeline's steady state)
        "global_batch_size",
    }
)


def _key_for(framework: Any, key: str) -> str:
    if framework is not None:
        return framework.key_for(key)
    return key


def reading_from_json(doc: dict[str, Any]) -> Reading:
    """The Reading of a `Resolved.to_json()` document (`read --json`)."""
    reading = Reading(
        framework=doc.get("framework"),
        format=doc.get("format") or "",
        values=dict(doc.get("config") or {}),
        warnings=list(doc.get("warnings") or []),
        model_name=doc.get("model_name"),
    )
    reading.origins = {
        k: Origin(o["from"], o.get("where", ""), o.get("key", ""), o.get("note", ""))
        for k, o in (doc.get("sources") or {}).items()
    }
    return reading


def config_from_json(doc: dict[str, Any]) -> Config | None:
    """The Config of a `Resolved.to_json()` document, or None when it has no model shape (a
    DeepSpeed JSON, an overrides file read alone)."""
    reading = reading_from_json(doc)
    if not all(reading.get(k) for k in SHAPE_KEYS):
        return None
    return _to_config(reading)


def _to_config(reading: Reading) -> Config:
    values = {k: v for k, v in reading.values.items() if k in CONFIG_KEYS}
    cfg = Config().replace(**values)
    cfg.assumptions = [
        f"{key} = {reading.values[key]!r} (nothing says it"
        f"{': ' + origin.note if origin.note else ''}; set {origin.key})"
        for key, origin in reading.origins.items()
        if origin.kind == FROM_ASSUMED
    ]
    version = reading.values.get("megatron_core_version")
    cfg.megatron_core_version = None if version is None else str(version)
    return cfg
