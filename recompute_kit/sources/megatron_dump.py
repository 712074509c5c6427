"""Megatron-LM's printed argument dump, read as a training config.

Megatron-LM prints every argument once they are parsed and validated
(`megatron/training/arguments.py` `_print_args`, the same since Megatron-LM v1):

    ------------------------ arguments ------------------------
      hidden_size ..................................... 5120
      ...
    -------------------- end of arguments ---------------------

one `name ... value` line per argparse destination, sorted by name. The dump IS the resolved
Megatron-LM arguments (DP, `recompute_granularity` after `--recompute-activations`, the
derived `ffn_hidden_size` ...), so every value is a "file" value, and the framework is
megatron-lm (its defaults fill only what a cut paste leaves out, said in a warning). Names are
mapped with the Megatron-LM script reader's own tables (`megatron_lm.VALUE_FLAGS`,
`BOOL_FLAGS`: a flag's argparse destination is its name with `_` for `-`), plus the names of
Megatron-LM before its 2022 renames, each read with a warning:

* `checkpoint_activations` (v1/v2: recompute every layer, in chunks of `checkpoint_num_layers`:
  `--recompute-granularity full --recompute-method uniform`), `checkpoint_num_layers` and
  v2's `activations_checkpoint_method` / `activations_checkpoint_num_layers`;
* `distribute_checkpointed_activations` (now `distribute_saved_activations`);
* v1's `model_parallel_size` (tensor parallelism: v1 had no pipeline) and `batch_size`
  ("Batch size per model instance (local batch size)": the micro-batch).

Beside the dump, Megatron-LM prints `using world size: 8, data-parallel size: 8, ...` (v1:
`using world size: 16 and model-parallel size: 2`) and `using torch.bfloat16 for parameters
...` (the `--bf16` / `--fp16` choice): both are read where the dump does not say it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..config import ConfigError
from .arg_dump import arg_line, args_header, world_sizes
from .megatron_lm import (
    _TOKENIZER_VOCAB,
    BOOL_FLAGS,
    VALUE_FLAGS,
    _backend,
    _fp8,
    _normalization,
    assume_tokenizer_vocab,
    moe_layer_freq,
)
from .reading import FROM_FILE, KNOWN_KEYS, Origin, Reading
from .text import _strip_prefixes

FRAMEWORKS: tuple[str, ...] = ()  # the reading's framework is megatron-lm (megatron_lm.py)
FORMAT = "Megatron-LM argument dump"

_MAX_LINE_CHARS = 1 << 16
# Argument names only Megatron-LM's dump has together: a paste without its header is a dump
# when it names two of these (DeepSpeed's config print, `zero_enabled .... True`, names none).
_TELL_NAMES = frozenset(
    {
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "micro_batch_size",
        "seq_length",
        "recompute_granularity",
        "checkpoint_activations",
        "checkpoint_num_layers",
        "model_parallel_size",
        "make_vocab_size_divisible_by",
        "distribute_checkpointed_activations",
        "distribute_saved_activations",
        "apply_query_key_layer_scaling",
        "apply_residual_connection_post_layernorm",
        "adlr_autoresume",
        "gradient_accumulation_fusion",
        "group_query_attention",
        "kv_channels",
        "init_method_std",
        "hysteresis",
        "ict_head_size",
        "lazy_mpu_init",
        "inference_batch_times_seqlen_threshold",
        "log_params_norm",
        "log_num_zeros_in_grad",
        "lr_warmup_fraction",
        "lr_decay_style",
        "encoder_seq_length",
        "recompute_method",
        "recompute_num_layers",
        "use_distributed_optimizer",
    }
)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


# argparse destination -> (field, converter) / (field, value), from the script reader's tables
_VALUE_DESTS = {_dest(flag): entry for flag, entry in VALUE_FLAGS.items()}
_BOOL_DESTS = {_dest(flag): entry for flag, entry in BOOL_FLAGS.items()}
# Destinations whose resolved value the dump prints under another name: read that one.
_RESOLVED_ELSEWHERE = {
    "main_grads_dtype": "accumulate_allreduce_grads_in_fp32",
    "megatron_fsdp_main_grads_dtype": "accumulate_allreduce_grads_in_fp32",
    "grad_reduce_in_bf16": "accumulate_allreduce_grads_in_fp32",
    "recompute_activations": "recompute_granularity",
    "encoder_seq_length": "seq_length",
    "num_layers_per_virtual_pipeline_stage": "virtual_pipeline_model_parallel_size",
    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_model_parallel_size",
}
# Known keys a Megatron-LM dump never means as recompute-kit does (Megatron-DeepSpeed prints a
# `zero_stage` of its DeepSpeed config; the layout is printed as an object): kept as unused.
_NOT_DIRECT = frozenset(
    {
        "zero_stage",
        "zero_overlap_comm",
        "zero_prefetch_bucket_size",
        "zero_reduce_bucket_size",
        "adam_step_temporary",
        "param_precision",
        "param_offload",
        "loss_implementation",
        "inference_colocated",
        "inference_gpu_memory_utilization",
        "moe_routing_imbalance",
        "megatron_core_version",
        "gradient_accumulation_steps",
        "pipeline_model_parallel_layout",
    }
)
# Fields whose printed None is a setting (no recompute, no VPP, no experts), not "unset".
_NONE_IS_A_VALUE = frozenset(
    {
        "recompute_granularity",
        "recompute_method",
        "recompute_num_layers",
        "virtual_pipeline_model_parallel_size",
        "num_moe_experts",
        "fp8",
        "q_lora_rank",
        "moe_shared_expert_intermediate_size",
        "moe_expert_capacity_factor",
    }
)
# Old names (Megatron-LM before the 2022 renames, commits cfd2e21 and bbab79f; v1's
# model-parallel and batch size): destination -> (field, what it is now).
_OLD_NAMES = {
    "checkpoint_num_layers": ("recompute_num_layers", "--recompute-num-layers"),
    "activations_checkpoint_num_layers": ("recompute_num_layers", "--recompute-num-layers"),
    "activations_checkpoint_method": ("recompute_method", "--recompute-method"),
    "distribute_checkpointed_activations": (
        "distribute_saved_activations",
        "--distribute-saved-activations",
    ),
    "model_parallel_size": (
        "tensor_model_parallel_size",
        "--tensor-model-parallel-size (v1's model parallelism was tensor parallelism)",
    ),
    "batch_size": (
        "micro_batch_size",
        "--micro-batch-size (v1: the batch size per model instance)",
    ),
}
_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
_PARAMS_DTYPE_RE = re.compile(r"^using torch\.(float16|bfloat16|float32|float) for parameters")
_OLD_WORLD_RE = re.compile(r"using world size: (\d+) and model-parallel size: (\d+)")
# megatron/training/tokenizer: "> padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)"
_PADDED_VOCAB_RE = re.compile(r"padded vocab \(size: (\d+)\) with \d+ dummy tokens")
# What an estimate needs from a dump, by the name Megatron-LM prints (newest name first).
_NEEDED = {
    "num_layers": ("num_layers",),
    "hidden_size": ("hidden_size",),
    "num_attention_heads": ("num_attention_heads",),
    "seq_length": ("seq_length",),
    "micro_batch_size": ("micro_batch_size", "batch_size"),
    "tensor_model_parallel_size": ("tensor_model_parallel_size", "model_parallel_size"),
    "pipeline_model_parallel_size": ("pipeline_model_parallel_size",),
    "data_parallel_size": ("data_parallel_size", "world_size"),
    "recompute_granularity": ("recompute_granularity", "checkpoint_activations"),
    "vocab_size": ("padded_vocab_size", "vocab_size", "tokenizer_type"),
    "bf16": ("bf16", "fp16"),
    "ffn_hidden_size": ("ffn_hidden_size",),
    "num_query_groups": ("num_query_groups", "group_query_attention"),
    "use_distributed_optimizer": ("use_distributed_optimizer",),
    "sequence_parallel": ("sequence_parallel",),
}


@dataclass
class Entry:
    value: Any
    line: int


@dataclass
class Dump:
    """The argument lines of the first dump in a text, and what is printed around it."""

    entries: dict[str, Entry] = field(default_factory=dict)
    header_line: int = 0  # 0: no `---- arguments ----` line (a part of a dump)
    end_line: int = 0  # 0: no `---- end of arguments ----` line (cut)
    last_line: int = 0
    later_dumps: int = 0
    world: dict[str, tuple[int, int]] = field(default_factory=dict)  # field -> (value, line)
    params_dtype: tuple[str, int] | None = None
    tokenizer_vocab: tuple[int, int] | None = None  # the tokenizer's size as printed, line


def scan(text: str) -> Dump:
    dump = Dump()
    in_args = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_prefixes(raw[:_MAX_LINE_CHARS])[0]
        if line.startswith(">"):
            line = line[2:] if line.startswith("> ") else line[1:]  # quoted in Markdown
        if not line.strip():
            continue
        if "---" in line and (opens := args_header(line)) is not None:
            if opens:
                if dump.header_line or dump.end_line or dump.entries:
                    dump.later_dumps += 1
                    in_args = False
                    continue
                dump.header_line = number
            elif in_args:
                dump.end_line = number
            in_args = opens and dump.later_dumps == 0
            continue
        if dump.later_dumps or dump.end_line:
            _around_the_dump(line.strip(), number, dump)
            continue
        if in_args or not dump.header_line:
            pair = arg_line(line, in_args)
            if pair is not None:
                dump.entries.setdefault(pair[0], Entry(pair[1], number))
                dump.last_line = number
                continue
        _around_the_dump(line.strip(), number, dump)
    return dump


def _around_the_dump(line: str, number: int, dump: Dump) -> None:
    if "world size" in line:
        if old := _OLD_WORLD_RE.search(line):
            dump.world.setdefault("world_size", (int(old.group(1)), number))
            dump.world.setdefault("tensor_model_parallel_size", (int(old.group(2)), number))
        for key, value in world_sizes(line).items():
            dump.world.setdefault(key, (value, number))
    elif m := _PARAMS_DTYPE_RE.match(line):
        dump.params_dtype = (m.group(1), number)
    elif (m := _PADDED_VOCAB_RE.search(line)) and dump.tokenizer_vocab is None:
        dump.tokenizer_vocab = (int(m.group(1)), number)


def sniff(text: str, path: str) -> int:
    if path.lower().endswith((".json", ".toml")):
        return 0
    dump = scan(text[:2_000_000])
    if not dump.entries:
        return 0
    tells = len(_TELL_NAMES & dump.entries.keys())
    if dump.header_line and (tells or len(dump.entries) >= 3):
        return 85
    return 65 if tells >= 2 else 0


def read(text: str, path: str) -> Reading:
    dump = scan(text)
    if not dump.entries:
        raise ConfigError(f"{path}: no Megatron-LM argument lines (`  name ..... value`) found")
    reading = Reading(framework="megatron-lm", format=FORMAT)
    entries = dump.entries

    def origin(dest: str, note: str = "") -> Origin:
        return Origin(FROM_FILE, f"{path}:{entries[dest].line}", dest, note)

    def has(dest: str) -> bool:
        return dest in entries and entries[dest].value is not None

    for dest, entry in entries.items():
        _read_one(dest, entry.value, entries, reading, origin, path)
    _special(entries, reading, origin, has, path)
    _old_names(entries, reading, origin, has, path)
    _around(dump, reading, path)
    _say_what_is_missing(dump, reading, path)
    if dump.later_dumps:
        reading.warnings.append(
            f"{path}: {dump.later_dumps + 1} argument dumps (restarts or other runs): the first, "
            f"line {dump.header_line or 1}, is read"
        )
    return reading


# names read together in `_special` / `_old_names`, not one by one
_SPECIAL = frozenset(
    {
        "group_query_attention",
        "num_query_groups",
        "vocab_size",
        "padded_vocab_size",
        "tokenizer_type",
        "tokenizer_model",
        "checkpoint_activations",
        "use_rotary_position_embeddings",
        "apply_query_key_layer_scaling",
        "bias_gelu_fusion",
        "bias_swiglu_fusion",
        "untie_embeddings_and_output_weights",
        "data_parallel_sharding_strategy",
        "cpu_offloading_num_layers",
        "accumulate_allreduce_grads_in_fp32",
        "optimizer_cpu_offload",
        "recompute_activations",
        *_OLD_NAMES,
    }
)


def _read_one(
    dest: str, value: Any, entries: dict[str, Entry], reading: Reading, origin: Any, path: str
) -> None:
    """One printed argument under its Megatron-Core field, or kept as unused."""
    if dest in _SPECIAL:
        return
    if dest in _RESOLVED_ELSEWHERE and _RESOLVED_ELSEWHERE[dest] in entries:
        reading.unused[dest] = value
        return
    try:
        pair = _field_value(dest, value)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{path}:{entries[dest].line}: {dest} {value!r} is not a valid value"
        ) from None
    if pair is None:
        reading.unused[dest] = value
        return
    name, typed = pair
    if typed is None and name not in _NONE_IS_A_VALUE:
        return  # printed None: not given, nothing Megatron resolved (the defaults say it)
    reading.set(name, typed, origin(dest))


def _field_value(dest: str, value: Any) -> tuple[str, Any] | None:
    """(field, value) of a printed argument; None when recompute-kit does not use it."""
    if dest == "num_experts":
        return "num_moe_experts", value
    if dest == "fp8":  # the destination of --fp8-format
        return "fp8", None if value is None else _fp8(str(value))
    if dest == "normalization":
        return "normalization", _normalization(str(value))
    if dest == "attention_backend":
        return "attention_backend", _backend(str(value))
    if dest == "moe_layer_freq":
        return "moe_layer_freq", value if isinstance(value, list) else moe_layer_freq(str(value))
    if dest in ("recompute_modules", "offload_modules", "cuda_graph_scope"):
        return dest, None if value is None else _names(value)
    if dest in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype") and value is not None:
        return dest, _DTYPES.get(str(value), str(value))
    if dest in _VALUE_DESTS:
        name, conv = _VALUE_DESTS[dest]
        if value is None or isinstance(value, (list, dict)):
            return name, None
        if conv is not None and name != "grad_reduce_in_fp32":
            return name, conv(str(value))
    if dest in _BOOL_DESTS:
        name, given = _BOOL_DESTS[dest]
        if name == dest:
            return (name, value) if isinstance(value, bool) else None
        return (name, given) if value is True else None
    if dest in KNOWN_KEYS and dest not in _NOT_DIRECT:
        return dest, value
    return None


def _names(value: Any) -> list[str]:
    """A printed list of names: `['core_attn', 'mlp']`, `[<CudaGraphScope.attn: 2>]`."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        text = str(item)
        enum = re.search(r"\.(\w+):", text)
        out.append(enum.group(1) if enum else text.strip("'\" <>"))
    return [x for x in out if x]


def _special(entries: dict[str, Entry], reading: Reading, origin: Any, has: Any, path: str) -> None:
    value = {dest: entry.value for dest, entry in entries.items()}.get
    # GQA: core_transformer_config_from_args passes num_query_groups only with
    # --group-query-attention (otherwise MHA), but the dump prints its default (1) always.
    if value("group_query_attention") is True and has("num_query_groups"):
        reading.set("num_query_groups", int(value("num_query_groups")), origin("num_query_groups"))
    elif "num_query_groups" in entries:
        reading.unused["num_query_groups"] = value("num_query_groups")
    # Vocabulary: the embedding has padded_vocab_size rows when the dump prints it; otherwise
    # --vocab-size counts only with the tokenizers that take it (as in the script reader).
    tok_type = value("tokenizer_type")
    if "tokenizer_type" in entries:
        reading.unused["tokenizer_type"] = tok_type
    if has("padded_vocab_size"):
        reading.set(
            "vocab_size",
            int(value("padded_vocab_size")),
            origin("padded_vocab_size", "the vocabulary padded as the embedding holds it"),
        )
    elif has("vocab_size") and tok_type in (
        None,
        "NullTokenizer",
        "TikTokenizer",
        "NullMultimodalTokenizer",
    ):
        reading.set("vocab_size", int(value("vocab_size")), origin("vocab_size"))
    elif tok_type in _TOKENIZER_VOCAB:
        assume_tokenizer_vocab(
            reading,
            tok_type,
            f"{path}:{entries['tokenizer_type'].line} tokenizer_type {tok_type}",
            "the tokenizer.model tokenizer_model names",
        )
    tok_id = value("tokenizer_model")
    hf_id = isinstance(tok_id, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", tok_id)
    if tok_type == "HuggingFaceTokenizer" and hf_id:
        reading.tokenizer, reading.tokenizer_origin = tok_id, origin("tokenizer_model")
    for dest in ("vocab_size", "padded_vocab_size", "tokenizer_model"):
        if dest in entries and not (dest == "padded_vocab_size" and has(dest)):
            reading.unused.setdefault(dest, value(dest))

    if value("untie_embeddings_and_output_weights") is not None:
        untie = value("untie_embeddings_and_output_weights")
        reading.set(
            "share_embeddings_and_output_weights",
            not untie,
            origin("untie_embeddings_and_output_weights", "tied unless untied"),
        )
    if value("recompute_activations") is True and "recompute_granularity" not in entries:
        # arguments.py: --recompute-activations means selective, whatever else is set
        reading.set("recompute_granularity", "selective", origin("recompute_activations"))
    if value("use_rotary_position_embeddings") is True and "position_embedding_type" not in entries:
        reading.set("position_embedding_type", "rope", origin("use_rotary_position_embeddings"))
    elif "use_rotary_position_embeddings" in entries:
        reading.unused["use_rotary_position_embeddings"] = value("use_rotary_position_embeddings")
    if value("apply_query_key_layer_scaling") is True:
        # Megatron turns the softmax to fp32 with query-key layer scaling (validate_args;
        # before core, ParallelSelfAttention.__init__)
        reading.set(
            "attention_softmax_in_fp32",
            True,
            origin("apply_query_key_layer_scaling", "query-key layer scaling: softmax in fp32"),
        )
    if isinstance(value("accumulate_allreduce_grads_in_fp32"), bool):
        reading.set(
            "grad_reduce_in_fp32",
            value("accumulate_allreduce_grads_in_fp32"),
            origin("accumulate_allreduce_grads_in_fp32"),
        )
    if isinstance(value("optimizer_cpu_offload"), bool):
        reading.set(
            "optimizer_offload", value("optimizer_cpu_offload"), origin("optimizer_cpu_offload")
        )
    # The fused bias-activation Megatron uses: bias_swiglu_fusion with --swiglu, else gelu's
    fusion = "bias_swiglu_fusion" if value("swiglu") is True else "bias_gelu_fusion"
    if isinstance(value(fusion), bool):
        reading.set("bias_activation_fusion", value(fusion), origin(fusion))
    n = value("cpu_offloading_num_layers")
    if isinstance(n, int) and not isinstance(n, bool):
        reading.set("cpu_offloading_num_layers", n, origin("cpu_offloading_num_layers"))
        if "cpu_offloading" not in reading:
            note = "> 0 turns cpu_offloading on"
            reading.set("cpu_offloading", n > 0, origin("cpu_offloading_num_layers", note))
    strategy = value("data_parallel_sharding_strategy")
    if strategy is not None:
        reading.unused["data_parallel_sharding_strategy"] = strategy
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if value("use_megatron_fsdp") is True and str(strategy) in stage:
            note = "Megatron-FSDP's sharding strategy"
            reading.set(
                "zero_stage", stage[str(strategy)], origin("data_parallel_sharding_strategy", note)
            )


def _old_names(
    entries: dict[str, Entry], reading: Reading, origin: Any, has: Any, path: str
) -> None:
    """The argument names of Megatron-LM before the 2022 renames, read as their successors
    where the dump does not print the new name, each with a warning."""
    value = {dest: entry.value for dest, entry in entries.items()}.get
    old_said = []
    if "checkpoint_activations" in entries and "recompute_granularity" not in entries:
        on = value("checkpoint_activations") is True
        note = "old name: recompute every layer (in chunks of checkpoint_num_layers)"
        reading.set(
            "recompute_granularity",
            "full" if on else None,
            origin("checkpoint_activations", note if on else "old name: no recompute"),
        )
        if on and not has("activations_checkpoint_method"):
            reading.set(
                "recompute_method",
                "uniform",
                origin(
                    "checkpoint_activations",
                    "old name: chunks of checkpoint_num_layers layers, the only method then",
                ),
            )
        old_said.append(
            "checkpoint_activations (now --recompute-granularity full --recompute-method "
            "uniform" + (")" if on else "; off here)")
        )
    for dest, (name, now) in _OLD_NAMES.items():
        if dest not in entries or not has(dest):
            continue
        new_dest = next((d for d, (n, _c) in _VALUE_DESTS.items() if n == name), name)
        if new_dest in entries or (
            name in reading and reading.origins[name].key != "checkpoint_activations"
        ):
            continue  # the dump prints the new name too: that one is read
        v = value(dest)
        typed = bool(v) if name == "distribute_saved_activations" else v
        if name == "micro_batch_size" and not isinstance(v, int):
            continue
        reading.set(name, typed, origin(dest, f"old name of {now}"))
        old_said.append(f"{dest} (now {now})")
    if old_said:
        reading.warnings.append(
            f"{path}: the dump uses Megatron-LM's old argument names (before its 2022 "
            f"renames): read as their successors: {'; '.join(old_said)}"
        )


def _around(dump: Dump, reading: Reading, path: str) -> None:
    """The `using world size` and `using torch.X for parameters` lines, where the dump does
    not print the value itself."""
    for name, (value, line) in dump.world.items():
        if name not in reading:
            reading.set(name, value, Origin(FROM_FILE, f"{path}:{line}", "using world size"))
    vocab = reading.origins.get("vocab_size")
    if dump.tokenizer_vocab and (vocab is None or vocab.kind != FROM_FILE):
        # the built tokenizer's size, printed before Megatron pads it (an assumption from
        # the tokenizer type, or none, gives way to it)
        size, line = dump.tokenizer_vocab
        reading.set(
            "vocab_size", size, Origin(FROM_FILE, f"{path}:{line}", "padded vocab (size: N)")
        )
    if dump.params_dtype and "bf16" not in reading and "fp16" not in reading:
        dtype, line = dump.params_dtype
        where = Origin(FROM_FILE, f"{path}:{line}", f"using torch.{dtype} for parameters")
        reading.set("bf16", dtype == "bfloat16", where)
        reading.set("fp16", dtype == "float16", where)


def _say_what_is_missing(dump: Dump, reading: Reading, path: str) -> None:
    """A paste cut before `end of arguments` (or begun after the header) lacks the arguments
    that sort after (before) its lines: name the ones an estimate needs."""
    missing = [
        name
        for name, dests in _NEEDED.items()
        if name not in reading and not any(d in dump.entries for d in dests)
    ]
    if dump.end_line and dump.header_line:
        return
    keys = list(dump.entries)
    first, last = keys[0], keys[-1]
    if not dump.end_line:
        after = [m for m in missing if _NEEDED[m][0].lower() > last.lower()]
        reading.warnings.append(
            f"{path}: the argument dump stops at line {dump.last_line} (`{last}`) before its "
            "`end of arguments` line: a cut paste; the arguments Megatron prints after it "
            "(alphabetically) are not read" + (f", among them {', '.join(after)}" if after else "")
        )
    if not dump.header_line:
        before = [m for m in missing if _NEEDED[m][0].lower() < first.lower()]
        reading.warnings.append(
            f"{path}: no `---- arguments ----` line: a part of the dump, from `{first}`"
            + (f"; not in it: {', '.join(before)}" if before else "")
        )
