"""Shared pieces of the `recompute-kit` command: output (tables, JSON), argument types,
model / parallelism / override arguments and the layout printout."""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
import sys
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from ..config import (
    ATTENTION_BACKENDS,
    Config,
    ConfigError,
    applicable_modules,
    format_spec,
    parse_spec,
)
from ..config.validation import check_expert_layout
from ..memory.layout import in_flight_words
from ..presets import PRESETS, get_preset
from ..sources.reading import OVERRIDE_FLAGS
from ..units import BYTE_MAPS, _integral, integer_bytes

# --------------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# How many documents emit_json wrote on stdout: a --json command that fails before writing one
# writes its error as one (cli/parser.py main), so a script reading stdout always gets JSON.
documents_on_stdout = 0


def emit_json(document: Any, stream: Any = None) -> None:
    """One JSON document on stdout; byte fields as integers (estimates carry fractions).

    Written as `json.dump(..., indent=2)` writes it, but streamed: a list of more than
    `_LONG_LIST` items (a 100 MB log's iteration lines) is written
    one compact item per line, each item converted and encoded (by the C encoder) only when it
    is written, so the document is never held whole as text or as dicts."""
    out = stream if stream is not None else sys.stdout
    global documents_on_stdout
    documents_on_stdout += out is sys.stdout
    writer = _JsonWriter(out)
    writer.value(document, 0)
    writer.pieces.append("\n")
    writer.flush()


_LONG_LIST = 1000


class _JsonWriter:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.pieces: list[str] = []
        self.size = 0
        self.rows: dict[type, tuple | None] = {}

    def flush(self) -> None:
        self.out.write("".join(self.pieces))
        self.pieces = []
        self.size = 0

    def put(self, text: str) -> None:
        self.pieces.append(text)
        self.size += len(text)
        if self.size > 1 << 18:
            self.flush()

    def value(self, value: Any, level: int) -> None:
        if isinstance(value, dict):
            if not value:
                self.put("{}")
                return
            pad = "\n" + "  " * (level + 1)
            first = True
            for key, item in value.items():
                self.put(("{" if first else ",") + pad + _json_key(key) + ": ")
                first = False
                if isinstance(key, str) and (key.endswith("bytes") or key in BYTE_MAPS):
                    item = _integral(item)
                self.value(item, level + 1)
            self.put("\n" + "  " * level + "}")
        elif isinstance(value, (list, tuple)):
            if not value:
                self.put("[]")
                return
            pad = "\n" + "  " * (level + 1)
            compact = len(value) > _LONG_LIST
            for n, item in enumerate(value):
                self.put(("[" if n == 0 else ",") + pad)
                if compact:
                    self.put(json.dumps(self.plain(item)))
                else:
                    self.value(item, level + 1)
            self.put("\n" + "  " * level + "]")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            self.value(self.plain(value), level)
        else:
            self.put(json.dumps(value))

    def plain(self, item: Any) -> Any:
        """An item of a long list as JSON data, byte fields as integers."""
        kind = type(item)
        known = self.rows.get(kind)
        if known is None:
            known = self.rows[kind] = _row_kind(kind)
        if known is None:
            return integer_bytes(item)
        names, get, byte_names, scalar = known
        if not scalar:
            return integer_bytes(dataclasses.asdict(item))  # nested: the general way
        row = dict(zip(names, get(item), strict=True))
        for name in byte_names:
            if type(row[name]) is float:
                row[name] = _integral(row[name])
        return row


def _row_kind(kind: type) -> tuple | None:
    """(field names, their getter, byte fields, all fields scalar) of a dataclass type."""
    if not dataclasses.is_dataclass(kind):
        return None
    found = dataclasses.fields(kind)
    names = tuple(f.name for f in found)
    nested = ("list", "dict", "Any", "tuple", "set")
    scalar = all(
        isinstance(f.type, str) and not any(word in f.type for word in nested) for f in found
    )
    return names, attrgetter(*names), tuple(n for n in names if n.endswith("bytes")), scalar


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return json.dumps(key)
    return json.dumps({key: None})[1:-7]  # 1, 1.5, true, null as json.dumps writes keys


def emit_json_read(args: argparse.Namespace, document: dict[str, Any]) -> None:
    """`emit_json`, with what the shared reader read (`read --json`'s document) under "read"
    when the command's config came from files or a model id."""
    resolved = getattr(args, "resolved", None)
    emit_json({**document, "read": resolved.to_json()} if resolved is not None else document)


# --------------------------------------------------------------------------------------------
# Argument types: a bad value is a usage error (exit 2) before any work
# --------------------------------------------------------------------------------------------


def spec_arg(text: str) -> str:
    """A recompute spec, checked when the command line is parsed. `selective:` alone (no
    modules, the control that equals none) is valid."""
    try:
        parse_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip()


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def text_file(path: str, flag: str, hint: str, strict: bool = True) -> None:
    """One line for a file that cannot be what the flag wants: missing, empty or binary.
    strict: the file must decode as UTF-8 (configs); otherwise only NUL bytes mark it binary
    (logs may hold a stray non-UTF-8 byte and are still worth reading)."""
    if path == "-":
        return
    # read in blocks: a 100 MB log is checked without being held (or copied) whole
    decoder = codecs.getincrementaldecoder("utf-8")() if strict else None
    blank = True
    where = -1
    offset = 0
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                if offset == 0 and block[:2] == b"\x1f\x8b":
                    return  # gzip: the doctor reads compressed logs itself
                blank = blank and not block.strip()
                if (nul := block.find(b"\x00")) >= 0:
                    where = offset + nul
                    break
                if decoder is not None:
                    held = len(decoder.getstate()[0])  # a character cut at the last block
                    try:
                        decoder.decode(block)
                    except UnicodeDecodeError as exc:
                        where = offset - held + exc.start
                        decoder = None
                        break
                offset += len(block)
            if decoder is not None and where < 0:
                try:
                    decoder.decode(b"", final=True)
                except UnicodeDecodeError as exc:
                    where = offset - len(exc.object) + exc.start
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {path}: {exc.strerror}") from None
    if blank and where < 0:
        raise ConfigError(f"{flag} {path} is empty; {hint}")
    if where >= 0:
        raise ConfigError(f"{flag} {path} is not text (binary data at byte {where}); {hint}")


# --------------------------------------------------------------------------------------------
# Shared argument handling
# --------------------------------------------------------------------------------------------


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="NAME",
        help=f"a preset ({', '.join(PRESETS)}), a registered model (`recompute-kit models`), "
        "a Hugging Face id or a config.json: the shape where the config files give none",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        nargs="+",
        help="the files you train with, as they are, several at once (later ones win): "
        "Megatron-LM scripts or YAMLs, Megatron-Bridge / NeMo YAMLs or recipes, NeMo-RL "
        "YAML, torchtitan TOML, HF config.json, HF Trainer / LLaMA-Factory YAML, DeepSpeed JSON, "
        "Accelerate config YAML",
    )


CONFIG_HINT = "give the config files you train with, or a model id"


def input_name(args: argparse.Namespace, default: str = "tiny-gpt") -> str:
    """What the command's numbers are for, in a few words (`llama3-70b`, `train.sh + a.yaml`)."""
    return " + ".join([*([args.model] if args.model else []), *(args.config or [])]) or default


def shape_only(args: argparse.Namespace) -> bool:
    """--model names a model too large to build here (a shape-only preset, a registered or
    Hugging Face model)."""
    return bool(args.model) and not (args.model in PRESETS and PRESETS[args.model].runnable)


def config_from_args(
    args: argparse.Namespace, default_model: str = "tiny-gpt", shows_layout: bool = False
) -> Config:
    """The Config a command works on: a runnable preset, or what the shared reader
    (`recompute_kit.sources`) reads from the config files and / or a model id, with the
    command's overrides; the reader's summary (what was read, assumed) is printed."""
    model = getattr(args, "model", None)
    if not args.config and (model or default_model) in PRESETS:
        cfg = apply_overrides(get_preset(model or default_model).config(), args)
        check_expert_layout(cfg)  # (the reader checks the same for files)
        return cfg
    from ..sources.resolve import resolve
    from ..sources.summary import summary_lines

    resolved = resolve(args.config or [], model=model, overrides=override_values(args))
    out = sys.stderr if getattr(args, "json", False) else sys.stdout
    # (a command that prints its layout prints the assumptions there, once)
    for line in summary_lines(resolved.reading, resolved.inputs, assumptions=not shows_layout):
        print(line, file=out)
    args.resolved = resolved  # for commands that report what was read in their JSON
    return resolved.config


def validate_run(cfg: Config, own_recompute_needed: bool) -> Config:
    """Megatron's validation of the run. A command that chooses recompute settings itself
    (`estimate --recompute`, `plan`) still runs where only the run's own setting is refused:
    the refusal is said, and the run goes on with no recompute in its place."""
    from ..config import RecomputeConfig

    try:
        cfg.validate()
        return cfg
    except ConfigError as exc:
        if own_recompute_needed:
            raise
        neutral = cfg.with_recompute(RecomputeConfig())
        try:
            neutral.validate()
        except ConfigError:
            raise exc from None
        print(
            f"recompute-kit: note: the run's own recompute setting ({cfg.recompute.spec}) is "
            f"refused by Megatron-Core: {exc} (compared as none here)",
            file=sys.stderr,
        )
        return neutral


def inputs_alone(args: argparse.Namespace) -> Config | None:
    """The Config the inputs make without this command line's overrides (what `plan` compares
    its layout with), or None when they make none on their own."""
    model = getattr(args, "model", None)
    try:
        if not args.config and (model or "tiny-gpt") in PRESETS:
            return get_preset(model or "tiny-gpt").config()
        from ..sources.resolve import resolve

        return resolve(args.config or [], model=model).config
    except ConfigError:
        return None  # e.g. the inputs leave the world size to --dp


def inputs_read(args: argparse.Namespace) -> dict[str, Any]:
    """The values the config files themselves set (not defaults or derived ones): what a
    layout override is compared with where the inputs make no Config alone."""
    from ..sources.reading import FROM_FILE
    from ..sources.resolve import resolve

    try:
        reading = resolve(args.config or [], require_shape=False).reading
    except ConfigError:
        return {}
    return {k: v for k, v in reading.values.items() if reading.origins[k].kind == FROM_FILE}


def inputs_spelling(args: argparse.Namespace):
    """How the input files themselves spell a Trainer run's settings (export_layout.Spelling):
    read without this command line's overrides, which would hide the file's own key; none where
    --format asks for another framework's keys."""
    from ..export_layout import Spelling, spelling_of
    from ..sources.resolve import resolve

    if getattr(args, "spelling", None) is None:  # once a command (`--levers` renders each row)
        try:
            reading = resolve(args.config, require_shape=False).reading if args.config else None
        except ConfigError:
            reading = None
        args.spelling = spelling_of(reading) if reading is not None else Spelling()
    if getattr(args, "format", None):
        # another format asked for: its own keys, but a DPO run's batches are still pairs
        return Spelling(pairs=args.spelling.pairs)
    return args.spelling


# CLI flag -> Megatron key, for the shape and parallelism overrides (sources/reading.py).
OVERRIDES = OVERRIDE_FLAGS


def add_override_args(parser: argparse.ArgumentParser, stage: bool = True) -> None:
    """The shape and layout overrides; `stage=False` leaves out --stage (a command that
    reports no single stage)."""
    group = parser.add_argument_group("overrides (Megatron keys of the model/config)")
    group.add_argument("--seq-length", type=int, metavar="S")
    group.add_argument("--micro-batch-size", type=int, metavar="B")
    for flag, what in (
        ("tp", "tensor"),
        ("pp", "pipeline"),
        ("vpp", "virtual pipeline"),
        ("cp", "context"),
        ("ep", "expert"),
        ("dp", "data"),
    ):
        group.add_argument(f"--{flag}", type=int, metavar="N", help=f"{what} parallel size")
    group.add_argument(
        "--etp", type=int, metavar="N", help="expert tensor parallel size (Megatron: = --tp)"
    )
    group.add_argument(
        "--first-stage-layers",
        type=int,
        metavar="N",
        help="layers on the first pipeline stage (num_layers_in_first_pipeline_stage)",
    )
    group.add_argument(
        "--last-stage-layers",
        type=int,
        metavar="N",
        help="layers on the last pipeline stage (num_layers_in_last_pipeline_stage)",
    )
    for flag, what in (
        ("sp", "sequence parallelism"),
        ("distributed-optimizer", "shard optimizer states over data parallel"),
        ("account-for-embedding", "count the embedding as a layer of the first stage"),
        ("account-for-loss", "count the loss as a layer of the last stage"),
        ("moe-grouped-gemm", "the experts as one grouped GEMM (moe_act recompute needs it)"),
    ):
        group.add_argument(
            f"--{flag}", action=argparse.BooleanOptionalAction, default=None, help=what
        )
    if stage:
        group.add_argument(
            "--stage",
            type=int,
            metavar="N",
            help="pipeline stage to report (default: the stage that holds the most)",
        )
    group.add_argument(
        "--moe-imbalance",
        type=float,
        metavar="F",
        help="measured MoE routing imbalance, max / mean tokens per expert rank (>= 1): sizes "
        "the experts' token copies (default: the capacity factor, else balanced)",
    )
    group.add_argument(
        "--attention",
        choices=ATTENTION_BACKENDS,
        help="Megatron's attention_backend: unfused keeps the s^2 scores; flash, fused and "
        "auto (TE picks flash or fused) keep q, k, v, the output and the softmax statistics",
    )


def override_values(args: argparse.Namespace) -> dict[str, Any]:
    """The Megatron keys this command line sets (--tp 4, --dtype bf16, ...)."""
    flat = {
        key: getattr(args, flag)
        for flag, key in OVERRIDES.items()
        if getattr(args, flag, None) is not None
    }
    if getattr(args, "dtype", None) in ("bf16", "fp16", "fp32"):
        flat["bf16"], flat["fp16"] = args.dtype == "bf16", args.dtype == "fp16"
    return flat


def apply_overrides(cfg: Config, args: argparse.Namespace) -> Config:
    flat = override_values(args)
    # the preset's SP was for its own TP: Megatron-LM turns it off at TP=1 with a warning
    tp1 = flat.get("tensor_model_parallel_size") == 1 and "sequence_parallel" not in flat
    if tp1 and cfg.parallel.sequence_parallel:
        flat["sequence_parallel"] = False
        cfg.assumptions.append("sequence_parallel turned off: TP=1 (as Megatron-LM does)")
    return cfg.replace(**flat) if flat else cfg


def layout_of(cfg: Config, est: Any = None) -> dict[str, Any]:
    """The parallel layout a per-rank number is for (JSON `layout`)."""
    p = cfg.parallel
    out: dict[str, Any] = {
        "tensor_model_parallel_size": p.tensor_model_parallel_size,
        "sequence_parallel": p.sequence_parallel,
        "pipeline_model_parallel_size": p.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline_model_parallel_size,
        "context_parallel_size": p.context_parallel_size,
        "expert_model_parallel_size": p.expert_model_parallel_size,
        "expert_tensor_parallel_size": p.etp,
        "data_parallel_size": p.data_parallel_size,
        "use_distributed_optimizer": p.use_distributed_optimizer,
        # the GPUs the layout makes: TP x PP x CP x DP (check it against the job's)
        "world_size": p.tensor_model_parallel_size
        * p.pipeline_model_parallel_size
        * p.context_parallel_size
        * p.data_parallel_size,
    }
    if est is not None:
        out.update(
            stage=est.stage,
            stage_layers=[est.layers[0], est.layers[-1]] if est.layers else [],
            micro_batches_in_flight=est.micro_batches_in_flight,
        )
    return out


def print_layout(cfg: Config, est: Any = None) -> None:
    """One line saying which layout (and stage) the numbers are for, then the assumptions."""
    p = cfg.parallel
    parts = [f"TP{p.tensor_model_parallel_size}" + (" SP" if p.sequence_parallel else "")]
    parts.append(f"PP{p.pipeline_model_parallel_size}")
    if p.virtual_pipeline_model_parallel_size:
        parts.append(f"VPP{p.virtual_pipeline_model_parallel_size}")
    parts += [f"CP{p.context_parallel_size}", f"DP{p.data_parallel_size}"]
    if cfg.model.num_moe_experts:
        parts += [f"EP{p.expert_model_parallel_size}", f"ETP{p.etp}"]
    from ..memory.model_states import shard_groups, sharding_mode

    mode = sharding_mode(cfg)
    if mode == "megatron":
        states = f"distributed optimizer {'on' if p.use_distributed_optimizer else 'off'}"
        if p.use_distributed_optimizer and cfg.model.num_moe_experts:
            # a trial asked why the optimizer states stayed large with it on: the experts'
            # are sharded over the expert data-parallel group only
            dense, expert = shard_groups(cfg)
            states += (
                f" (dense states sharded over DP x CP {dense}, expert states over expert-DP "
                f"{expert}" + (": not sharded" if expert == 1 else "") + ")"
            )
    else:
        name = {"zero": "ZeRO", "fsdp2": "FSDP2", "megatron_fsdp": "Megatron-FSDP"}[mode]
        from ..plan.trainer_levers import offloaded_words

        offloaded = offloaded_words(bool(p.optimizer_offload), bool(p.param_offload))
        states = f"{name} stage {p.zero_stage}" + (
            f" ({offloaded} offloaded to the host)" if offloaded else ""
        )
    world = layout_of(cfg)["world_size"]
    line = f"layout: {' '.join(parts)} ({world} GPUs), {states}"
    if est is not None and est.layers:
        held = est.stage_held_bytes
        which = " (the stage that holds the most)" if held and est.held_bytes >= max(held) else ""
        line += (
            f"; per rank of pipeline stage {est.stage}{which}: {layer_span(est.layers)}, "
            f"{in_flight_words(est.micro_batches_in_flight, est.chunk_micro_batches)}"
        )
    print(line)
    for note in cfg.assumptions:
        print(f"assumed: {note}")


def layer_span(layers: Sequence[int], word: str = "layers ") -> str:
    """`layers 0-7`, or under virtual pipelining `8 layers (0, 4, 8, ..., 28)`."""
    if not layers:
        return "-"
    if list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{word}{layers[0]}-{layers[-1]}"
    shown = ", ".join(map(str, layers[:3])) + (f", ..., {layers[-1]}" if len(layers) > 3 else "")
    return f"{len(layers)} layers ({shown})"


def default_format(args: argparse.Namespace) -> str:
    if getattr(args, "format", None):  # (`estimate` has no --format: the inputs' own)
        return args.format
    from ..export import format_for

    resolved = getattr(args, "resolved", None)
    if resolved is None:
        return format_for(None)
    return format_for(resolved.reading.framework, resolved.reading.format)


def specs_for(cfg: Config, args: argparse.Namespace) -> list[str]:
    """--recompute SPEC ... (repeatable, accumulated) or, by default, the config's own setting.
    A note for selective modules this model does not have: they recompute nothing."""
    if not args.recompute:
        return [cfg.recompute.spec]
    specs: dict[str, str] = {}  # the canonical spec (as the rows are labelled) -> as given
    for given in args.recompute:
        try:
            canonical = format_spec(parse_spec(given))
        except ConfigError:
            canonical = given  # the estimate says what is wrong with it
        if canonical in specs and specs[canonical] != given:
            print(
                f"recompute-kit: note: {given} is {specs[canonical]} (the same setting, "
                f"labelled {canonical}): estimated once",
                file=sys.stderr,
            )
        specs.setdefault(canonical, given)
    out = list(specs.values())
    note_inapplicable(cfg, out)
    return out


def note_inapplicable(cfg: Config, specs: Sequence[str]) -> None:
    selective = [s for s in specs if parse_spec(s).recompute_granularity == "selective"]
    if cfg.model.loss_implementation == "torchtitan" and len(selective) > 1:
        moe = cfg.model.num_moe_experts
        print(
            f"recompute-kit: note: {', '.join(selective)}: torchtitan has one selective mode "
            "(per-op: SelectiveAC, a TOML's selective_ac_option \"op\"); its dense blocks are "
            "counted as that mode whatever the modules"
            + (
                ", its MoE blocks by the modules given (torchtitan's own is read as "
                "layernorm, moe): only that setting is torchtitan's"
                if moe
                else ""
            ),
            file=sys.stderr,
        )
        return
    present = set(applicable_modules(cfg))
    for spec in specs:
        rc = parse_spec(spec)
        try:
            cfg.with_recompute(rc).validate()
        except ConfigError:
            continue  # the command reports it as the error it is
        absent = [m for m in rc.recompute_modules or [] if m not in present]
        if rc.recompute_granularity == "selective" and absent:
            kind = "MoE" if cfg.model.num_moe_experts else "dense"
            print(
                f"recompute-kit: note: {spec}: this {kind} model has no {', '.join(absent)} "
                "modules, so they recompute nothing here",
                file=sys.stderr,
            )


# Assumed values that decide what fits per rank: a refusal resting on them says so.
_LAYOUT_ASSUMPTIONS = (
    "data_parallel_size",
    "zero_stage",
    "use_distributed_optimizer",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


def with_layout_assumptions(exc: ConfigError, cfg: Config) -> ConfigError:
    """`exc` with the layout assumptions it rests on (`nothing fits` on an assumed DP of 1 is
    a question about the world size, not advice to add parallelism)."""
    said = [a for a in cfg.assumptions if a.split(" ", 1)[0] in _LAYOUT_ASSUMPTIONS]
    if not said:
        return exc
    return ConfigError(f"{exc}. This rests on assumed values: " + "; ".join(said))
