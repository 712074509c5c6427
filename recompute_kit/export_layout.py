"""Render the parallel layout and training shape a plan depends on, in a framework's own keys.

A plan fits for one layout (`--cp 4 --dp 2`) and shape (`--seq-length`, `--micro-batch-size`);
where these differ from what the inputs say, the rendered config must carry them, or the user
launches the old layout with the new recompute setting and the fit is not the one planned.
`changed_settings` picks them (Megatron-Core field names); `layout_lines` writes them for one
format of `export.FORMATS`. A setting a framework has no key for is said in a comment.

Keys, as each framework names them:
* Megatron-LM: `megatron/training/arguments.py` (`--tensor-model-parallel-size`,
  `--num-virtual-stages-per-pipeline-rank`, `--decoder-first-pipeline-num-layers`, ...). The
  data-parallel size is no flag: WORLD_SIZE / (TP x PP x CP).
* Megatron-Bridge: the model provider's TransformerConfig fields (`cfg.model.*`),
  `cfg.train.micro_batch_size`, `cfg.dataset.seq_length` beside `cfg.model.seq_length` (Bridge
  checks they are equal), `cfg.ddp.use_distributed_optimizer` and
  `cfg.optimizer.use_distributed_optimizer`.
* NeMo 1.x: `model.*` of the model config (`encoder_seq_length`); the distributed optimizer is
  `model.optim.name: distributed_fused_adam`; DP is `trainer.devices x trainer.num_nodes` / the
  model-parallel product.
* torchtitan JobConfig: `[parallelism] *_degree` (`data_parallel_shard_degree`: FSDP over the
  data-parallel ranks), `[training] seq_len / local_batch_size`.
* Hugging Face Trainer / LLaMA-Factory (`export.TRAINER_KEYS`): micro-batch and sequence length;
  data parallel is the number of processes the launcher starts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import GPUS_PER_NODE, Config

# The settings a plan's fit depends on beside recompute (Megatron-Core field names, in the
# order they are written): the parallel layout, then the training shape.
LAYOUT_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "data_parallel_size",
    "sequence_parallel",
    "use_distributed_optimizer",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "seq_length",
    "micro_batch_size",
    "attention_backend",
)


def setting(config: Config, key: str) -> Any:
    """The value of one of LAYOUT_FIELDS in `config` (ETP None: it follows TP)."""
    section = config.model if hasattr(config.model, key) else config.parallel
    return getattr(section, key)


def changed_settings(
    planned: Config,
    given: Config | None,
    overridden: Iterable[str] = (),
    read: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The LAYOUT_FIELDS whose value in `planned` differs from `given` (the config the inputs
    make on their own, without the command line's overrides). When the inputs alone make none
    (`given` None: the shape comes only from --model, the world size is left to the launcher),
    the `overridden` keys, less those the inputs already set to that value (`read`)."""
    # a dense model has no expert layout to write
    keys = [k for k in LAYOUT_FIELDS if planned.model.num_moe_experts or "expert" not in k]
    if given is None:
        read = read or {}
        return {
            key: setting(planned, key)
            for key in keys
            if key in set(overridden) and read.get(key, object()) != setting(planned, key)
        }
    return {
        key: setting(planned, key) for key in keys if setting(planned, key) != setting(given, key)
    }


def world_size(config: Config) -> int:
    p = config.parallel
    return (
        p.data_parallel_size
        * p.tensor_model_parallel_size
        * p.pipeline_model_parallel_size
        * p.context_parallel_size
    )


_MEGATRON_LM_FLAGS = {
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "virtual_pipeline_model_parallel_size": "--num-virtual-stages-per-pipeline-rank",
    "context_parallel_size": "--context-parallel-size",
    "expert_model_parallel_size": "--expert-model-parallel-size",
    "expert_tensor_parallel_size": "--expert-tensor-parallel-size",
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "seq_length": "--seq-length",
    "micro_batch_size": "--micro-batch-size",
    "attention_backend": "--attention-backend",
    "cross_entropy_fusion_impl": "--cross-entropy-fusion-impl",
}
_MEGATRON_LM_SWITCHES = {
    "cross_entropy_loss_fusion": "--cross-entropy-loss-fusion",
    "sequence_parallel": "--sequence-parallel",
    "use_distributed_optimizer": "--use-distributed-optimizer",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
}

_HEADER = "# the parallel layout and shape this plan is for (changed from the inputs):"


def _world_note(world: int, launcher: str) -> str:
    return f"# data parallel: launch on {world} GPUs ({launcher})"


@dataclass(frozen=True)
class Spelling:
    """How the run's own files spell what a rendering writes (a Trainer run): the key each
    setting was read from (LLaVA's `model_max_length` for the sequence length, where the
    Trainer's rendering would say TRL's `max_length`), and whether they are command-line
    flags (`--per_device_train_batch_size 4` in a launch script) rather than YAML."""

    keys: Mapping[str, str] = field(default_factory=dict)  # setting -> the run's key
    flags: bool = False
    # a Megatron-LM script: the flags it writes, and those it sets from a variable (the line
    # the variable is given on): "drop --x" names only flags the script has
    megatron_lm: bool = False
    written: frozenset[str] = frozenset()
    from_variables: Mapping[str, int] = field(default_factory=dict)
    # DPO (NeMo-RL's, TRL's): its batch keys count preference pairs, two sequences each
    pairs: bool = False

    def apply(self, lines: list[str]) -> list[str]:
        """`key: value` lines as `--key value` flags where the run's are flags; a Megatron-LM
        script's "drop" lists cut to the flags it has; NeMo-RL DPO's batch keys in pairs."""
        if self.megatron_lm:
            return self._megatron_lm(lines)
        if self.pairs:
            lines = [_in_pairs(line) for line in lines]
        if not self.flags:
            return lines
        return [
            line
            if line.lstrip().startswith("#") or ": " not in line
            else "--{} {}".format(*line.strip().split(": ", 1))
            for line in lines
        ]

    def _megatron_lm(self, lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            drop = _DROP.match(line)
            if drop:
                kept = [f for f in re.findall(r"--[\w-]+", drop.group(2)) if f in self.written]
                if kept:
                    named = ", ".join(kept[:-1]) + (" and " if len(kept) > 1 else "") + kept[-1]
                    out.append(f"{drop.group(1)}{named}{drop.group(3)}")
                continue
            if line.startswith("--"):
                line, kept = _without_written_switches(line, self.written)
                if kept:
                    out.append(
                        f"# {' '.join(kept)}: in the script already (Megatron-LM turns "
                        "--sequence-parallel off at TP 1; the TP above makes it take effect)"
                        if kept == ["--sequence-parallel"]
                        else f"# {' '.join(kept)}: in the script already"
                    )
                if not line:
                    continue
            flag = line.split()[0] if line.startswith("--") else ""
            if flag in self.from_variables:
                out.append(
                    f"# the script sets {flag} from a variable (line "
                    f"{self.from_variables[flag]}): change it there"
                )
            out.append(line)
        return out


def _without_written_switches(line: str, written: frozenset[str]) -> tuple[str, list[str]]:
    """A line of flags less the value-less switches the script passes already (a value flag
    the script passes is a change of its value: kept)."""
    words, kept, out = line.split(), [], []
    for i, word in enumerate(words):
        switch = word.startswith("--") and (i + 1 == len(words) or words[i + 1].startswith("--"))
        if switch and word in written:
            kept.append(word)
        else:
            out.append(word)
    return " ".join(out), kept


_PAIRED = re.compile(
    r"^(\s*(?:policy\.train_(?:micro|global)_batch_size|per_device_train_batch_size)\s*[:=]\s*)"
    r"(\d+)\s*$"
)


def _in_pairs(line: str) -> str:
    """`policy.train_micro_batch_size: 4` (sequences; TRL's per_device_train_batch_size too) as
    DPO's 2 (pairs of sequences)."""
    m = _PAIRED.match(line)
    if m is None:
        return line
    sequences = int(m.group(2))
    if sequences % 2:
        return f"{line}  # {sequences} sequences: DPO takes pairs, so not a whole number of pairs"
    return f"{m.group(1)}{sequences // 2}  # pairs: {sequences} sequences (DPO)"


# "# ...: drop --a, --b and --c (why)" (export.py's Megatron-LM comments)
_DROP = re.compile(r"^(#.*?drop )((?:--[\w-]+(?:, | and )?)+)(.*)$")


def spelling_of(reading) -> Spelling:
    """The Spelling of a run read by the shared reader: a Trainer run's keys, a Megatron-LM
    script's flags (others: none)."""
    if reading is not None and reading.framework == "megatron-lm":
        return _megatron_lm_spelling(reading)
    if reading is not None and reading.framework == "nemo-rl" and "(DPO" in reading.format:
        return Spelling(pairs=True)
    if reading is None or reading.framework != "hf-trainer":
        return Spelling()
    keys = {}
    for setting in _TRAINER_ROLES:
        origin = reading.origins.get(setting)
        if origin is not None and origin.kind == "file" and origin.key:
            keys[setting] = origin.key.removeprefix("--")
    batch = reading.origins.get("micro_batch_size")
    flags = bool(batch and (batch.key or "").startswith("--"))
    return Spelling(keys, flags=flags, pairs="(DPO" in reading.format)  # TRL's DPO: pairs


def _megatron_lm_spelling(reading) -> Spelling:
    written = {o.key for o in reading.origins.values() if o.kind == "file" and o.key}
    # a flag the script passes whose value Megatron-LM overrode (--sequence-parallel at TP 1)
    written |= {o.key for o in reading.origins.values() if o.kind == "derived" and o.key}
    written |= set(reading.unused)
    variables = {}
    for o in reading.origins.values():
        set_on = re.search(r"value set on line (\d+)", o.note or "")
        if o.kind == "file" and (o.key or "").startswith("--") and set_on:
            variables[o.key] = int(set_on.group(1))
    flags = frozenset(w for w in written if w.startswith("--"))
    return Spelling(megatron_lm=True, written=flags, from_variables=variables)


def layout_lines(
    changes: dict[str, Any], fmt: str, world: int, spelling: Spelling | None = None
) -> list[str]:
    """`changes` (changed_settings) as lines of format `fmt`; `world`: the GPUs the layout
    takes (world_size); `spelling`: a Trainer run's own keys. Empty when nothing changed."""
    if not [key for key in changes if key != SEQUENCE_TOKENS]:
        return []
    if spelling is not None and fmt in _TRAINER_FORMATS:
        return [_HEADER, *_trainer(fmt, spelling.keys)(changes, world)]
    return [_HEADER, *_WRITERS[fmt](changes, world)]


def _megatron_lm(changes: dict[str, Any], world: int) -> list[str]:
    flags, notes = [], []
    for key, value in changes.items():
        if key in _MEGATRON_LM_FLAGS:
            if value is None:
                notes.append(f"# drop {_MEGATRON_LM_FLAGS[key]} ({key} unset)")
            else:
                flags += [_MEGATRON_LM_FLAGS[key], str(value)]
        elif key in _MEGATRON_LM_SWITCHES:
            if value:
                flags.append(_MEGATRON_LM_SWITCHES[key])
            else:
                notes.append(f"# drop {_MEGATRON_LM_SWITCHES[key]}")
        elif key == "data_parallel_size":
            notes.append(
                _world_note(world, f"WORLD_SIZE = --nproc_per_node x --nnodes; DP {value}")
            )
    return notes + ([" ".join(flags)] if flags else [])


# Megatron-DeepSpeed's layout flags (megatron/arguments.py): its own expert-parallel flag; no
# context parallelism (DeepSpeed's Ulysses is --ds-sequence-parallel-size), no uneven stages,
# and under --deepspeed neither VPP nor the distributed optimizer (ZeRO shards instead)
_MDS_FLAGS = {
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "expert_model_parallel_size": "--moe-expert-parallel-size",
    "seq_length": "--seq-length",
    "micro_batch_size": "--micro-batch-size",
    "sequence_parallel": "--sequence-parallel",
}


def _megatron_deepspeed(changes: dict[str, Any], world: int) -> list[str]:
    flags, notes = [], []
    for key, value in changes.items():
        flag = _MDS_FLAGS.get(key)
        if key == "data_parallel_size":
            notes.append(_world_note(world, f"deepspeed --num_gpus x --num_nodes; DP {value}"))
        elif flag is None:
            notes.append(f"# {key} {value}: no Megatron-DeepSpeed flag")
        elif isinstance(value, bool):
            flags += [flag] if value else []
            notes += [] if value else [f"# drop {flag}"]
        else:
            flags += [flag, str(value)]
    return notes + ([" ".join(flags)] if flags else [])


_megatron_deepspeed.keys = _MDS_FLAGS


def _python(value: Any) -> str:
    return repr(value) if not isinstance(value, str) else f'"{value}"'


def _bridge(changes: dict[str, Any], world: int) -> list[str]:
    lines, notes = [], []
    for key, value in changes.items():
        if key == "data_parallel_size":
            notes.append(_world_note(world, f"torchrun --nproc_per_node x --nnodes; DP {value}"))
        elif key == "micro_batch_size":
            lines.append(f"cfg.train.micro_batch_size = {value}")
        elif key == "seq_length":
            lines += [f"cfg.model.seq_length = {value}", f"cfg.dataset.seq_length = {value}"]
        elif key == "use_distributed_optimizer":
            lines += [
                f"cfg.ddp.use_distributed_optimizer = {value}",
                f"cfg.optimizer.use_distributed_optimizer = {value}",
            ]
        elif key == "attention_backend":
            notes.append(
                f"# attention backend {value}: cfg.model.attention_backend = AttnBackend.{value}"
            )
        else:
            lines.append(f"cfg.model.{key} = {_python(value)}")
    # the same as the Hydra-style overrides a recipe's launch takes (the recompute lines' twin)
    return notes + lines + _as_overrides(lines, "cfg.", "overrides")


def _as_overrides(lines: list[str], prefix: str, said: str) -> list[str]:
    """`prefix.a.b = v` assignments again as one line of dotlist overrides (`a.b=v`)."""
    overrides = [
        _hydra_pair(line.removeprefix(prefix))
        for line in lines
        if line.startswith(prefix) and " = " in line
    ]
    return [f"# or as {said}: {' '.join(overrides)}"] if overrides else []


# NeMo 2.0: the parallel sizes sit on the recipe's MegatronStrategy, the batch and length on
# its data module, the distributed optimizer on the optimizer's config
NEMO2_STRATEGY = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
)


def _nemo2(changes: dict[str, Any], world: int) -> list[str]:
    lines, notes = [], []
    for key, value in changes.items():
        if key == "data_parallel_size":
            launcher = "recipe.trainer.num_nodes x recipe.trainer.devices"
            notes.append(_world_note(world, f"{launcher}; DP {value}"))
        elif key in NEMO2_STRATEGY:
            lines.append(f"recipe.trainer.strategy.{key} = {_python(value)}")
        elif key == "micro_batch_size":
            lines.append(f"recipe.data.micro_batch_size = {value}")
        elif key == "seq_length":
            lines += [
                f"recipe.model.config.seq_length = {value}",
                f"recipe.data.seq_length = {value}",
            ]
        elif key == "use_distributed_optimizer":
            lines.append(f"recipe.optim.config.use_distributed_optimizer = {value}")
        else:
            lines.append(f"recipe.model.config.{key} = {_python(value)}")
    return notes + lines + _as_overrides(lines, "recipe.", "NeMo-Run overrides")


def _hydra_pair(assignment: str) -> str:
    """`model.x = 2` -> `model.x=2` (None -> null, booleans lower-case)."""
    key, value = assignment.split(" = ", 1)
    value = {"None": "null", "True": "true", "False": "false"}.get(value, value.strip('"'))
    return f"{key}={value}"


def _nemo(changes: dict[str, Any], world: int) -> list[str]:
    """Keys inside the `model:` block the recompute rendering ends with."""
    names = {"seq_length": "encoder_seq_length"}
    lines, notes = [], []
    for key, value in changes.items():
        if key == "data_parallel_size":
            notes.append(_world_note(world, f"trainer.devices x trainer.num_nodes; DP {value}"))
            if world % GPUS_PER_NODE == 0:
                notes.append(
                    f"# trainer.num_nodes: {world // GPUS_PER_NODE} with trainer.devices: "
                    f"{GPUS_PER_NODE} (the GPUs of a node)"
                )
        elif key == "use_distributed_optimizer":
            name = "distributed_fused_adam" if value else "fused_adam"
            lines += ["  optim:", f"    name: {name}"]
        elif key == "attention_backend":
            notes.append(f"# attention backend {value}: model.attention_backend (Megatron-Core)")
        else:
            shown = (
                "null"
                if value is None
                else str(value).lower()
                if isinstance(value, bool)
                else value
            )
            lines.append(f"  {names.get(key, key)}: {shown}")
    return notes + lines  # (the recompute rendering's `model:` block is last: they continue it)


_TORCHTITAN_PARALLELISM = {
    "tensor_model_parallel_size": "tensor_parallel_degree",
    "pipeline_model_parallel_size": "pipeline_parallel_degree",
    "context_parallel_size": "context_parallel_degree",
    "expert_model_parallel_size": "expert_parallel_degree",
    "expert_tensor_parallel_size": "expert_tensor_parallel_degree",
    "data_parallel_size": "data_parallel_shard_degree",
}
_TORCHTITAN_TRAINING = {
    "seq_length": "seq_len",
    "micro_batch_size": "local_batch_size",
    # kept where the local batch changes: torchtitan's -1 would follow local x DP down
    "global_batch_size": "global_batch_size",
    # FSDP2's CPUOffloadPolicy: parameters, gradients and optimizer states on the host
    "enable_cpu_offload": "enable_cpu_offload",
}
# What torchtitan sets otherwise, said where a Megatron setting has no key there.
_TORCHTITAN_NONE = {
    "sequence_parallel": "its TP plan shards the norms' sequence itself",
    "use_distributed_optimizer": "FSDP2 already shards the optimizer states",
    "virtual_pipeline_model_parallel_size": "set pipeline_parallel_schedule "
    "(Interleaved1F1B) and pipeline_parallel_layers_per_stage",
    "num_layers_in_first_pipeline_stage": "set module_fqns_per_model_part",
    "num_layers_in_last_pipeline_stage": "set module_fqns_per_model_part",
    "account_for_embedding_in_pipeline_split": "set module_fqns_per_model_part",
    "account_for_loss_in_pipeline_split": "set module_fqns_per_model_part",
    "attention_backend": "[model] flavor picks the attention",
}


def _torchtitan(changes: dict[str, Any], world: int) -> list[str]:
    parallelism, training, notes = [], [], []
    piped = (changes.get("pipeline_model_parallel_size") or 1) > 1
    for key, value in changes.items():
        if key == "micro_batch_size" and piped:
            # under PP the micro-batch is the pipeline's; the local batch stays as it is
            parallelism.append(f"pipeline_parallel_microbatch_size = {value}")
        elif key in _TORCHTITAN_PARALLELISM:
            parallelism.append(f"{_TORCHTITAN_PARALLELISM[key]} = {value}")
            if key == "data_parallel_size":
                notes += [
                    f"# data_parallel_shard_degree {value}: FSDP over the data-parallel ranks,",
                    f"# {world} GPUs in all (-1, its default, is the same where the world is",
                    f"# {world}; with HSDP, replicate x shard degrees = {value})",
                ]
        elif key in _TORCHTITAN_TRAINING:
            shown = str(value).lower() if isinstance(value, bool) else value
            training.append(f"{_TORCHTITAN_TRAINING[key]} = {shown}")
        else:
            notes.append(
                f"# {key} {value}: no torchtitan key ({_TORCHTITAN_NONE.get(key, 'not exported')})"
            )
    lines = notes
    if parallelism:
        lines += ["[parallelism]", *parallelism]
    if training:
        lines += ["[training]", *training]
    return lines


# the TOML's batch keys (in sequences; the pipeline's micro-batch is a [parallelism] key there)
# as the registry's TrainingConfig keys (in tokens)
_REGISTRY_TOKENS = {
    "local_batch_size": "num_tokens_per_microbatch_per_dp_rank",
    "pipeline_parallel_microbatch_size": "num_tokens_per_microbatch_per_dp_rank",
    "global_batch_size": "num_tokens_per_train_step",
}
# the sequence length the batches are counted in (the plan's), given by the caller
SEQUENCE_TOKENS = "_sequence_tokens"


def _torchtitan_registry(changes: dict[str, Any], world: int) -> list[str]:
    """The TOML writer's settings as `config.<section>.<key> = value` lines of a registry
    function (torchtitan main), the batches in tokens (sequences x the plan's sequence length,
    `SEQUENCE_TOKENS` in `changes`), each also as the command-line override that wins over
    the function."""
    out, section = [], ""
    changes = dict(changes)
    pp_micro = changes.pop("num_pp_microbatches", None)
    seq = changes.pop(SEQUENCE_TOKENS, None) or changes.get("seq_length")
    flags = []
    for line in _torchtitan(changes, world):
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if line.startswith("#"):
            out.append(line)
            continue
        key, _, value = (x.strip() for x in line.partition("="))
        value = {"true": "True", "false": "False"}.get(value, value)
        if key == "seq_len":
            key = "max_context_length"
        elif key in _REGISTRY_TOKENS:
            if seq is None:
                out.append(f"# {key} {value} sequences: the sequence length is not known here")
                continue
            key, value = _REGISTRY_TOKENS[key], str(int(value) * int(seq))
            out.append(f"config.training.{key} = {value}")
            flags.append(f"--training.{key} {value}")
            continue
        out.append(f"config.{section}.{key} = {value}")
        flags.append(f"--{section}.{key} {value}")
    if pp_micro is not None:
        out.append(f"config.parallelism.num_pp_microbatches = {pp_micro}")
        flags.append(f"--parallelism.num_pp_microbatches {pp_micro}")
    if flags:  # a flag on the command line wins over the function: the same, as flags
        out.append(f"# or on the command line (it wins over the function): {' '.join(flags)}")
    return out


# a setting -> its role in export.TRAINER_KEYS
_TRAINER_ROLES = {
    "seq_length": "seq_length",
    "micro_batch_size": "micro_batch",
    "gradient_accumulation_steps": "accumulation",
}
_TRAINER_FORMATS = ("hf-trainer", "llama-factory")


def _trainer(fmt: str, own: Mapping[str, str] | None = None):
    def write(changes: dict[str, Any], world: int) -> list[str]:
        from .export import TRAINER_KEYS  # (export imports this module)

        keys = dict(TRAINER_KEYS[fmt])
        for setting, key in (own or {}).items():  # the keys the run's own files use
            if keys.get(_TRAINER_ROLES[setting]):
                keys[_TRAINER_ROLES[setting]] = key
        lines, notes = [], []
        for key, value in changes.items():
            if key == "micro_batch_size":
                lines.append(f"{keys['micro_batch']}: {value}")
            elif key == "gradient_accumulation_steps" and keys["accumulation"]:
                lines.append(f"{keys['accumulation']}: {value}")
            elif key == "fused_linear_cross_entropy" and keys["liger"]:
                lines.append(f"{keys['liger']}: {str(value).lower()}")
            elif key == "seq_length":
                lines.append(f"{keys['seq_length']}: {value}")
            elif key == "data_parallel_size":
                launcher = f"torchrun --nproc_per_node / accelerate num_processes; DP {value}"
                notes.append(_world_note(world, launcher))
            else:
                notes.append(f"# {key} {value}: no Trainer key (the launcher or model sets it)")
        return notes + lines

    return write


def _keyed(framework: str, keys: dict[str, str], launcher: str, comments: dict[str, str]):
    """A writer of dotted `key: value` lines in a framework's keys (`keys`: Megatron name ->
    the framework's key), `comments` after some of them, the world said through `launcher`."""

    def write(changes: dict[str, Any], world: int) -> list[str]:
        lines, notes = [], []
        for key, value in changes.items():
            if key in keys:
                shown = str(value).lower() if isinstance(value, bool) else value
                comment = f"  # {comments[key]}" if key in comments else ""
                lines.append(f"{keys[key]}: {shown}{comment}")
            elif key == "data_parallel_size":
                notes.append(_world_note(world, f"{launcher}; DP {value}"))
            else:
                notes.append(f"# {key} {value}: no {framework} key")
        return notes + lines

    write.keys = keys  # what the framework can set (has_key)
    return write


# NeMo Automodel's keys for the layout (recipes/_dist_utils.py, recipes/llm/train_ft.py)
_automodel = _keyed(
    "Automodel",
    {
        "tensor_model_parallel_size": "distributed.tp_size",
        "pipeline_model_parallel_size": "distributed.pp_size",
        "context_parallel_size": "distributed.cp_size",
        "expert_model_parallel_size": "distributed.ep_size",
        "micro_batch_size": "step_scheduler.local_batch_size",
        "sequence_parallel": "distributed.sequence_parallel",
        "seq_length": "packed_sequence.packed_sequence_size",
    },
    "distributed.dp_size or the launcher",
    {"seq_length": "dataset.seq_length if not packing"},
)
# NeMo-RL's keys for the layout (its Megatron policy; examples/configs/*.yaml)
_nemo_rl = _keyed(
    "NeMo-RL",
    {
        "tensor_model_parallel_size": "policy.megatron_cfg.tensor_model_parallel_size",
        "pipeline_model_parallel_size": "policy.megatron_cfg.pipeline_model_parallel_size",
        "num_layers_in_first_pipeline_stage": (
            "policy.megatron_cfg.num_layers_in_first_pipeline_stage"
        ),
        "num_layers_in_last_pipeline_stage": (
            "policy.megatron_cfg.num_layers_in_last_pipeline_stage"
        ),
        "context_parallel_size": "policy.megatron_cfg.context_parallel_size",
        "expert_model_parallel_size": "policy.megatron_cfg.expert_model_parallel_size",
        "expert_tensor_parallel_size": "policy.megatron_cfg.expert_tensor_parallel_size",
        "sequence_parallel": "policy.megatron_cfg.sequence_parallel",
        "use_distributed_optimizer": "policy.megatron_cfg.optimizer.use_distributed_optimizer",
        "micro_batch_size": "policy.train_micro_batch_size",
        "seq_length": "policy.max_total_sequence_length",
        # what the layout asks of NeMo-RL beside it (nemo_rl_companions)
        "sequence_packing": "policy.sequence_packing.enabled",
        "sequence_length_multiple": "policy.make_sequence_length_divisible_by",
    },
    "cluster.num_nodes x cluster.gpus_per_node",
    {
        # nemo_rl/models/megatron/setup.py: "Sequence Packing must be enabled to use Context
        # Parallelism with MCore."
        "sequence_packing": "NeMo-RL's Megatron policy asserts it for CP",
        "sequence_length_multiple": "sequences padded to a multiple of TP (with SP) x 2 CP",
    },
)


def sequence_multiple(config: Config) -> int:
    """What a sequence's length must divide by for this layout: 2 x CP (each rank takes two
    chunks) times TP under sequence parallelism (NeMo-RL's megatron/data.py minimum_pad_factor,
    Megatron's own checks)."""
    p = config.parallel
    cp = p.context_parallel_size
    tp = p.tensor_model_parallel_size if p.sequence_parallel else 1
    return (2 * cp if cp > 1 else 1) * tp


def nemo_rl_companions(planned: Config, changes: dict[str, Any]) -> None:
    """The NeMo-RL keys a layout change needs beside its own: sequence packing for CP, and the
    padding multiple (policy.make_sequence_length_divisible_by) for a new TP x SP or CP (a
    recipe that pins it to the old TP refuses or breaks the new layout)."""
    keys = {"tensor_model_parallel_size", "sequence_parallel", "context_parallel_size"}
    if planned.parallel.context_parallel_size > 1 and "context_parallel_size" in changes:
        changes["sequence_packing"] = True
    if keys & set(changes) and sequence_multiple(planned) > 1:
        changes["sequence_length_multiple"] = sequence_multiple(planned)


# NeMo-RL's DTensor (FSDP2) policy: TP, CP and SP in dtensor_cfg, no pipeline parallelism
_nemo_rl_dtensor = _keyed(
    "NeMo-RL DTensor",
    {
        "tensor_model_parallel_size": "policy.dtensor_cfg.tensor_parallel_size",
        "context_parallel_size": "policy.dtensor_cfg.context_parallel_size",
        "sequence_parallel": "policy.dtensor_cfg.sequence_parallel",
        "micro_batch_size": "policy.train_micro_batch_size",
        "seq_length": "policy.max_total_sequence_length",
    },
    "cluster.num_nodes x cluster.gpus_per_node",
    {},
)


# LLaMA-Factory on its Megatron backend: Megatron's names at the YAML's top level, the batch
# and length in its Trainer keys
_llama_factory_megatron = _keyed(
    "LLaMA-Factory (Megatron backend)",
    {
        # (data parallel is the launcher's: said as a note)
        **{
            k: k
            for k in LAYOUT_FIELDS
            if k not in ("micro_batch_size", "seq_length", "data_parallel_size")
        },
        "micro_batch_size": "per_device_train_batch_size",
        "seq_length": "cutoff_len",
    },
    "torchrun --nproc_per_node x --nnodes (FORCE_TORCHRUN=1)",
    {},
)


def layout_key(fmt: str, key: str) -> str | None:
    """The key format `fmt`'s layout writer writes `key` as (None: it has none listed)."""
    return (getattr(_WRITERS.get(fmt), "keys", None) or {}).get(key)


def has_key(fmt: str, megatron_key: str) -> bool:
    """Whether the layout writer of `fmt` has a key for this Megatron setting (the formats
    written in Megatron's own names have every one)."""
    keys = getattr(_WRITERS.get(fmt), "keys", None)
    return keys is None or megatron_key in keys


_WRITERS = {
    "megatron-bridge": _bridge,
    "nemo2": _nemo2,
    "megatron-lm": _megatron_lm,
    "megatron-deepspeed": _megatron_deepspeed,
    "nemo": _nemo,
    "torchtitan": _torchtitan,
    "torchtitan-registry": _torchtitan_registry,
    "hf-trainer": _trainer("hf-trainer"),
    "llama-factory": _trainer("llama-factory"),
    "automodel": _automodel,
    "nemo-rl": _nemo_rl,
    "llama-factory-mca": _llama_factory_megatron,
    "llama-factory-mbridge": _llama_factory_megatron,
    "nemo-rl-dtensor": _nemo_rl_dtensor,
}
