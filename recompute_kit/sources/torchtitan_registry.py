"""torchtitan's config registries: since February 2026 (pytorch/torchtitan#2386) a run is a
Python function returning `Trainer.Config(...)` in `torchtitan/models/<name>/config_registry.py`,
launched as `python -m torchtitan.train --module llama3 --config llama3_70b [--a.b value ...]`.

    def llama3_70b() -> Trainer.Config:
        model_spec = model_registry("70B")
        return Trainer.Config(
            training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=8 * 8192,
                                    max_context_length=8192),
            parallelism=ParallelismConfig(tensor_parallel_degree=8),
            activation_checkpoint=FullAC.Config(), ...)

The function is read without running it: its statements (`config = llama3_8b()`,
`config.parallelism.tensor_parallel_degree = 8`, `return Trainer.Config(...)`), the `*.Config` /
`*Config` constructors with literal arguments, `model_registry(flavor, ...)` and calls of the
file's own functions. What it says is mapped onto the TOML job config's sections and read by
the TOML reader (sources/torchtitan.py), so both forms mean the same; what the registry's
torchtitan does differently is set here, with its source:

* `training`: `num_tokens_per_microbatch_per_dp_rank` tokens in one forward of a data-parallel
  rank, packed into one row whose documents are at most `max_context_length` long:
  micro-batch = tokens / context length sequences of the context length (one sequence of the
  row where it is no whole number of them; `torchtitan/config/configs.py` TrainingConfig,
  defaults 16384 and 2048; `components/data/packing.py`). The memory follows the tokens: a
  shorter context alone saves none.
* `activation_checkpoint`: `SelectiveAC.Config` (per-op SAC, also the default when the field is
  left out), `FullAC.Config`, `MemoryBudgetAC.Config`, `None` (no AC).
* `loss=ChunkedLossWrapper.Config(num_chunks=8)`: the output layer and the loss run chunk by
  chunk, so the full logits never exist (`torchtitan/components/loss.py`).
* `model_registry(flavor, converters=[Float8LinearConverter.Config(...)], num_mtp_layers=k)`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError
from . import torchtitan
from .bridge import Unresolved
from .reading import FROM_DEFAULT, FROM_FILE, Origin, Reading
from .recipe_eval import fold
from .torchtitan_defaults import REGISTRY_FORMAT, REGISTRY_UNNAMED

FRAMEWORKS: tuple[str, ...] = ()  # torchtitan.py owns torchtitan's defaults ...
FORMAT_PREFIX = REGISTRY_FORMAT  # ... a registry reading's key names are this module's
apply_defaults = torchtitan.apply_defaults
derive_after_layout = torchtitan.derive_after_layout
UNSET_DEFAULT = torchtitan.UNSET_DEFAULT

TT_MAIN = "b5bcd76c6"  # pytorch/torchtitan main, 2026-08-21: the registry form read here
MAIN_BLOB = f"https://github.com/pytorch/torchtitan/blob/{TT_MAIN}"
CONFIGS = f"{MAIN_BLOB}/torchtitan/config/configs.py"
TRAINER = f"{MAIN_BLOB}/torchtitan/trainer.py"
LOSS = f"{MAIN_BLOB}/torchtitan/components/loss.py"

# torchtitan's defaults for the fields this reader maps (configs.py, trainer.py, loss.py)
TOKENS_PER_MICROBATCH = 16384  # TrainingConfig.num_tokens_per_microbatch_per_dp_rank
MAX_CONTEXT_LENGTH = 2048  # TrainingConfig.max_context_length
LOSS_CHUNKS = 8  # ChunkedLossWrapper.Config.num_chunks

# TOML [parallelism] keys the registry's ParallelismConfig shares (same names, same meaning;
# main counts a pipeline micro-batch in tokens, training.num_tokens_per_microbatch_per_dp_rank)
_PARALLELISM = tuple(
    k for k in torchtitan.PARALLELISM_KEYS if k != "pipeline_parallel_microbatch_size"
)
# the activation-checkpointing classes: (TOML mode, selective_ac_option)
_AC_MODES = {"SelectiveAC": ("selective", "op"), "FullAC": ("full", None)}
# model converters: (the TOML's converter name, the section its options are under)
_CONVERTERS = {
    "Float8LinearConverter": ("quantize.linear.float8", "quantize.linear.float8"),
    "MXFP8LinearConverter": ("quantize.linear.mx", "quantize.linear.mx"),
    "Float8GroupedExpertsConverter": ("quantize.grouped_mm.float8", "quantize.grouped_mm.float8"),
}
# converters that change the kernels but not what recompute-kit counts, said aloud
_UNMODELLED_CONVERTERS = {
    "NVFP4LinearConverter": "NVFP4 linears not modelled: weights, gradients and activations "
    "are counted at 16-bit sizes",
    "MXFP8GroupedExpertsConverter": "MXFP8 expert GEMMs not modelled: counted at 16-bit sizes",
}
_MAX_DEPTH = 8  # registry functions calling one another
COMMAND_LINE = -1  # the "line" of a value an override on the command line set


@dataclass
class _Config:
    """The value of a `X.Config(...)` / `XConfig(...)` call: its fields as far as they are read."""

    kind: str  # the constructor as written: "FullAC.Config", "TrainingConfig"
    line: int
    fields: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)


@dataclass
class _ModelSpec:
    """`model_registry("70B", converters=[...], num_mtp_layers=1)`."""

    flavor: Any
    line: int
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Symbol:
    """An imported name (or an attribute of one): `FullAC`, `FullAC.Config`."""

    name: str


# Trainer.Config fields whose default is a config object (trainer.py): reading
# `config.parallelism.x` of a config that never set `parallelism` gets that default, to be set.
_DEFAULT_SECTIONS = {
    "training": "TrainingConfig",
    "parallelism": "ParallelismConfig",
    "compile": "CompileConfig",
    "activation_checkpoint": "SelectiveAC.Config",
}


# Megatron field -> how a registry user sets it, where it is not the TOML key as section.key
_KEY_FOR = {
    "seq_length": "training.max_context_length",
    "micro_batch_size": "training.num_tokens_per_microbatch_per_dp_rank (sequences x "
    "max_context_length)",
    "global_batch_size": "training.num_tokens_per_train_step",
    "fp8": "model_registry(converters=[...])",
    **dict.fromkeys(
        torchtitan.MODEL_KEYS,
        "model_registry(flavor) in the config function (give "
        "torchtitan/models/<module>/config_registry.py::<config>)",
    ),
    "attention_backend": "model_registry(flavor, attn_backend=...)",
    **dict.fromkeys(
        ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"),
        "activation_checkpoint (SelectiveAC.Config(), FullAC.Config() or None)",
    ),
}


def key_for(field: str) -> str:
    return _KEY_FOR.get(field) or re.sub(r"\[(\w+)\] (\w+)", r"\1.\2", torchtitan.key_for(field))


def sniff(text: str, path: str) -> int:
    if not path.partition("::")[0].lower().endswith(".py"):
        return 0
    return 92 if re.search(r"\bTrainer\.Config\b", text) and "torchtitan" in text else 0


class _Interpreter:
    """Runs a registry function's statements over values it can read (never executing them)."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.path = path
        self.funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.warnings: list[str] = []
        self.consts: dict[str, Any] = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    value = self.value(stmt.value, {}, 0)
                    if not isinstance(value, Unresolved):
                        self.consts[target.id] = value

    def call(self, name: str, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            return Unresolved(f"{name}() (calls nested too deep)")
        returned = self.run(self.funcs[name].body, {}, depth)
        return Unresolved(f"{name}() returns nothing read") if returned is None else returned

    def run(self, body: list[ast.stmt], env: dict[str, Any], depth: int) -> Any:
        for stmt in body:
            if isinstance(stmt, ast.Return):
                return self.value(stmt.value, env, depth) if stmt.value else None
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                value = self.value(stmt.value, env, depth)
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target in targets:
                    self.assign(target, value, env, depth)
            elif isinstance(stmt, ast.If):
                test = self.value(stmt.test, env, depth)
                if isinstance(test, Unresolved):
                    self.warn(stmt, f"`if {ast.unparse(stmt.test)}` not decidable: not read")
                    continue
                returned = self.run(stmt.body if test else stmt.orelse, env, depth)
                if returned is not None:
                    return returned
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            elif not isinstance(stmt, (ast.Assert, ast.Pass, ast.Import, ast.ImportFrom)):
                self.warn(stmt, f"`{ast.unparse(stmt).splitlines()[0]}` not read")
        return None

    def warn(self, node: ast.AST, text: str) -> None:
        self.warnings.append(f"{self.path}:{getattr(node, 'lineno', '?')}: {text}")

    def assign(self, target: ast.expr, value: Any, env: dict[str, Any], depth: int) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            return
        if isinstance(target, ast.Attribute):
            owner = self.value(target.value, env, depth)
            if isinstance(owner, _Config):
                owner.fields[target.attr] = value
                owner.lines[target.attr] = target.lineno
                return
        self.warn(target, f"`{ast.unparse(target)} = ...` not read")

    def value(self, node: ast.expr, env: dict[str, Any], depth: int) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.consts:
                return self.consts[node.id]
            return {"True": True, "False": False, "None": None}.get(node.id, _Symbol(node.id))
        if isinstance(node, ast.Attribute):
            owner = self.value(node.value, env, depth)
            if isinstance(owner, _Symbol):
                return _Symbol(f"{owner.name}.{node.attr}")
            if isinstance(owner, _Config):
                if node.attr not in owner.fields and node.attr in _DEFAULT_SECTIONS:
                    owner.fields[node.attr] = _Config(_DEFAULT_SECTIONS[node.attr], node.lineno)
                return owner.fields.get(node.attr, Unresolved(ast.unparse(node)))
            return Unresolved(ast.unparse(node))
        if isinstance(node, ast.Call):
            return self.call_value(node, env, depth)
        return fold(node, lambda child: self.value(child, env, depth))

    def call_value(self, node: ast.Call, env: dict[str, Any], depth: int) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id in self.funcs and func.id not in env:
            return self.call(func.id, depth + 1)
        callee = self.value(func, env, depth)
        if not isinstance(callee, _Symbol):
            return fold(node, lambda child: self.value(child, env, depth))
        args = [self.value(a, env, depth) for a in node.args]
        kwargs = {k.arg: self.value(k.value, env, depth) for k in node.keywords if k.arg}
        name = callee.name
        if name == "model_registry" or name.endswith(".model_registry"):
            return _ModelSpec(args[0] if args else Unresolved("flavor"), node.lineno, kwargs)
        if name == "cast" and len(args) == 2:
            return args[1]
        if name.endswith(".Config") or name.endswith("Config"):
            return _Config(
                name, node.lineno, kwargs, {k.arg: k.value.lineno for k in node.keywords if k.arg}
            )
        return fold(node, lambda child: self.value(child, env, depth))


# -- the registry's config mapped onto the TOML's sections -----------------------------------


class _RegistryToml(torchtitan._Toml):
    """The TOML reader's view of a registry config: each (section, key) with the registry key
    it comes from (`training.max_context_length`), its line, and a note where the value is
    computed from it, or torchtitan's default where the function leaves it out."""

    def __init__(self, path: str) -> None:
        super().__init__({}, {}, path)
        self.keys: dict[tuple[str, str], tuple[str, str]] = {}  # -> (key as written, note)
        self.defaults: set[tuple[str, str]] = set()
        self.overridden: set[tuple[str, str]] = set()  # set on the command line
        self.warnings: list[str] = []

    def put(
        self,
        section: str,
        key: str,
        value: Any,
        line: int | None,
        written: str,
        note: str = "",
        default: str = "",
    ) -> None:
        node = self.data
        for part in section.split("."):
            node = node.setdefault(part, {})
        node[key] = value
        if line == COMMAND_LINE:
            written = f"--{written}"
            self.overridden.add((section, key))
        elif line:
            self.lines[(section, key)] = line
        self.keys[(section, key)] = (written, note)
        if default:
            self.defaults.add((section, key))
            self.keys[(section, key)] = (written, f"{default}{'; ' + note if note else ''}")

    def origin(self, section: str, key: str, note: str = "") -> Origin:
        written, why = self.keys.get((section, key), (f"{section}.{key}", ""))
        note = "; ".join(x for x in (why, note) if x)
        if (section, key) in self.defaults:
            return Origin(FROM_DEFAULT, f"torchtitan's default ({CONFIGS})", written, note)
        if (section, key) in self.overridden:
            return Origin(FROM_FILE, "the command line", written, note)
        line = self.lines.get((section, key))
        return Origin(FROM_FILE, f"{self.path}:{line}" if line else self.path, written, note)


def _field(cfg: _Config | None, name: str, default: Any) -> tuple[Any, int | None, bool]:
    """(value, line, given) of a config field; torchtitan's default where it is not given."""
    if cfg is None or name not in cfg.fields:
        return default, None, False
    value = cfg.fields[name]
    if isinstance(value, Unresolved):
        raise ConfigError(f"{name} = {value.text}: not a literal recompute-kit can read")
    return value, cfg.lines.get(name, cfg.line), True


def _section(cfg: _Config, name: str) -> _Config | None:
    value = cfg.fields.get(name)
    return value if isinstance(value, _Config) else None


def _map_training(toml: _RegistryToml, cfg: _Config) -> None:
    training, parallel = _section(cfg, "training"), _section(cfg, "parallelism")
    tokens, t_line, t_given = _field(
        training, "num_tokens_per_microbatch_per_dp_rank", TOKENS_PER_MICROBATCH
    )
    context, c_line, c_given = _field(training, "max_context_length", MAX_CONTEXT_LENGTH)
    tokens_key = "training.num_tokens_per_microbatch_per_dp_rank"
    if not isinstance(tokens, int) or not isinstance(context, int) or context < 1:
        raise ConfigError(f"{toml.path}: {tokens_key} {tokens!r} / max_context_length {context!r}")
    # the data loader packs documents into one row of `tokens` (components/data/packing.py);
    # max_context_length bounds a document (its positions restart there), whose attention is
    # its own: counted as tokens / context sequences of the context length, or, where the
    # row is no whole number of them, as one sequence of the row's length
    if tokens % context:
        micro, length = 1, tokens
        how = (
            f"{tokens} tokens in one row, not a whole number of max_context_length {context}: "
            "counted as one sequence of the row's length"
        )
    else:
        micro, length = tokens // context, context
        how = f"{tokens} tokens / max_context_length {context}: {micro} sequences in one forward"
    toml.put(
        "training",
        "seq_len",
        length,
        c_line if length == context else t_line,
        "training.max_context_length" if length == context else tokens_key,
        "" if length == context else how,
        default="" if (c_given if length == context else t_given) else "TrainingConfig",
    )
    pp, _, _ = _field(parallel, "pipeline_parallel_degree", 1)
    n_micro, _, _ = _field(parallel, "num_pp_microbatches", 1)
    default = "" if t_given else "TrainingConfig"
    if pp > 1:
        toml.put(
            "parallelism",
            "pipeline_parallel_microbatch_size",
            micro,
            t_line,
            tokens_key,
            how,
            default,
        )
        how += f" x parallelism.num_pp_microbatches {n_micro}"
    toml.put("training", "local_batch_size", micro * n_micro, t_line, tokens_key, how, default)
    step, s_line, s_given = _field(training, "num_tokens_per_train_step", -1)
    if s_given and isinstance(step, int) and step > 0:
        toml.put(
            "training",
            "global_batch_size",
            step // context,
            s_line,
            "training.num_tokens_per_train_step",
            f"{step} tokens / {context}",
        )
    for key in ("dtype", "mixed_precision_param", "enable_cpu_offload"):
        value, line, given = _field(training, key, None)
        if given:
            toml.put("training", key, value, line, f"training.{key}")


def _map_parallelism(toml: _RegistryToml, cfg: _Config) -> None:
    parallel = _section(cfg, "parallelism")
    for key in _PARALLELISM:
        value, line, given = _field(parallel, key, None)
        if given:
            toml.put("parallelism", key, value, line, f"parallelism.{key}")


def _map_activation_checkpoint(toml: _RegistryToml, cfg: _Config) -> None:
    given = "activation_checkpoint" in cfg.fields
    ac = cfg.fields.get("activation_checkpoint")
    line = cfg.lines.get("activation_checkpoint")
    written = "activation_checkpoint"
    default = (
        "" if given else f"Trainer.Config's activation_checkpoint, SelectiveAC.Config ({TRAINER})"
    )
    if ac is None and given:
        toml.put("activation_checkpoint", "mode", "none", line, written, "None: no AC")
        return
    kind = ac.kind.removesuffix(".Config") if isinstance(ac, _Config) else "SelectiveAC"
    if kind == "MemoryBudgetAC":
        toml.put("activation_checkpoint", "mode", "memory_budget", line, written)
        budget, b_line, _ = _field(ac, "memory_budget", 0.5)
        toml.put("activation_checkpoint", "memory_budget", budget, b_line or line, written)
        return
    if kind not in _AC_MODES:
        raise ConfigError(
            f"{toml.path}:{line}: activation_checkpoint = {kind}: not a torchtitan policy "
            "recompute-kit knows (SelectiveAC, FullAC, MemoryBudgetAC or None)"
        )
    mode, option = _AC_MODES[kind]
    toml.put("activation_checkpoint", "mode", mode, line, written, f"{kind}.Config", default)
    if option:
        toml.put(
            "activation_checkpoint",
            "selective_ac_option",
            option,
            line,
            written,
            f"{kind}: per-op selective AC",
            default,
        )


def _map_compile(toml: _RegistryToml, cfg: _Config) -> None:
    compile_cfg = _section(cfg, "compile")
    for key in ("enable", "components"):
        value, line, given = _field(compile_cfg, key, None)
        if given:
            toml.put("compile", key, value, line, f"compile.{key}")


def _map_model(toml: _RegistryToml, spec: _ModelSpec, name: str) -> None:
    if not isinstance(spec.flavor, str):
        raise ConfigError(f"{toml.path}:{spec.line}: model_registry's flavor is not a literal")
    toml.put("model", "name", name, spec.line, "model_spec", f"torchtitan/models/{name}")
    toml.put("model", "flavor", spec.flavor, spec.line, "model_registry(flavor)")
    names = []
    for conv in spec.kwargs.get("converters") or []:
        kind = conv.kind.removesuffix(".Config") if isinstance(conv, _Config) else str(conv)
        if kind in _UNMODELLED_CONVERTERS:
            toml.warnings.append(
                f"{toml.path}:{spec.line}: model converter {kind}: "
                f"{_UNMODELLED_CONVERTERS[kind]}"
            )
            continue
        if kind not in _CONVERTERS:
            raise ConfigError(
                f"{toml.path}:{spec.line}: model converter {kind}: not modelled by recompute-kit "
                f"(it reads {', '.join(_CONVERTERS)})"
            )
        converter, section = _CONVERTERS[kind]
        names.append(converter)
        if kind == "Float8LinearConverter":  # main's default recipe is rowwise (tensorwise before)
            recipe, r_line, given = _field(conv, "recipe_name", "rowwise")
            toml.put(
                section,
                "recipe_name",
                recipe,
                r_line,
                f"{kind}.Config recipe_name",
                default="" if given else f"{kind}.Config",
            )
    if names:
        toml.put("model", "converters", names, spec.line, "model_registry(converters)")


def _module_name(path: str, interp: _Interpreter, entry: str) -> str:
    """The model folder the registry belongs to: `torchtitan/models/<name>/config_registry.py`,
    or the registry's own functions' prefix (`llama3_70b`) for a copy outside a checkout."""
    folder = Path(path).resolve().parent.name
    known = {name for name, _ in torchtitan.HF_TWINS} | {n for n, _ in torchtitan.OWN_SHAPES}
    if folder in known:
        return folder
    for name in sorted(known, key=len, reverse=True):
        if entry.startswith(name + "_"):
            return name
    raise ConfigError(
        f"{path}: which torchtitan model this registry is for is not known (its folder "
        f"{folder!r} is none of {', '.join(sorted(known))}): read it from its place in a "
        "torchtitan checkout, torchtitan/models/<name>/config_registry.py"
    )


def _entry(selector: str, interp: _Interpreter, path: str) -> str:
    returning = [
        n
        for n, f in interp.funcs.items()
        if f.returns is not None and "Trainer.Config" in ast.unparse(f.returns)
    ]
    if not selector:
        if len(returning) == 1:
            return returning[0]
        raise ConfigError(
            f"{path}: a torchtitan config registry of {len(returning)} configs: "
            f"{REGISTRY_UNNAMED}, {path}::NAME (torchtitan's --config NAME): "
            f"{', '.join(returning)}"
        )
    if selector not in interp.funcs:
        raise ConfigError(
            f"{path}: no config {selector!r} in the registry (it has {', '.join(returning)})"
        )
    return selector


def read(text: str, path: str) -> Reading:
    return read_with_overrides(text, path, [])


def read_with_overrides(text: str, path: str, overrides: list[str]) -> Reading:
    """`overrides`: torchtitan's command-line overrides, `--section.key value` or
    `section.key=value`, applied to the config as torchtitan's parser applies them."""
    file_path, _, selector = path.partition("::")
    try:
        tree = ast.parse(text, filename=file_path)
    except SyntaxError as exc:
        raise ConfigError(f"{file_path}:{exc.lineno}: not valid Python ({exc.msg})") from None
    interp = _Interpreter(tree, file_path)
    entry = _entry(selector.strip(), interp, file_path)
    cfg = interp.call(entry, 0)
    if not isinstance(cfg, _Config):
        raise ConfigError(
            f"{file_path}: {entry}() returns no Trainer.Config recompute-kit can read"
        )
    refused = _apply_overrides(cfg, overrides, file_path)
    spec = cfg.fields.get("model_spec")
    if not isinstance(spec, _ModelSpec):
        raise ConfigError(f"{file_path}: {entry}() sets no model_spec = model_registry(flavor)")
    toml = _RegistryToml(file_path)
    name = _module_name(file_path, interp, entry)
    _map_model(toml, spec, name)
    _map_training(toml, cfg)
    _map_parallelism(toml, cfg)
    _map_activation_checkpoint(toml, cfg)
    _map_compile(toml, cfg)
    reading = Reading(framework="torchtitan", format=f"{REGISTRY_FORMAT} {entry}()")
    reading.warnings += refused
    optimizers = _optimizer_names(cfg.fields.get("optimizer"))
    if any(n.lower() not in ("adam", "adamw") for n in optimizers):
        # (resolve.py says a non-Adam optimizer's states are counted as Adam's)
        reading.unused["optimizer"] = next(n for n in optimizers if "adam" not in n.lower())
    torchtitan.read_sections(toml, reading)
    _read_beyond_the_toml(cfg, spec, name, file_path, reading)
    reading.warnings.extend(interp.warnings + toml.warnings)
    return reading


def _optimizer_names(node: Any) -> list[str]:
    """The optimizers an OptimizersContainer.Config names (its `name`, its param groups'
    `optimizer_name`: Kimi's DistMuon for the matrices beside AdamW), as written."""
    if isinstance(node, list):
        return [n for item in node for n in _optimizer_names(item)]
    if not isinstance(node, _Config):
        return []
    names = [
        v for k, v in node.fields.items() if k in ("name", "optimizer_name") and isinstance(v, str)
    ]
    return names + [n for v in node.fields.values() for n in _optimizer_names(v)]


def _read_beyond_the_toml(
    cfg: _Config, spec: _ModelSpec, name: str, path: str, reading: Reading
) -> None:
    """What the registry's torchtitan does that no TOML key said: the chunked loss, MTP."""
    loss = cfg.fields.get("loss")
    line = cfg.lines.get("loss", cfg.line)
    if isinstance(loss, _Config) and loss.kind.startswith("ChunkedLossWrapper"):
        chunks, c_line, _ = _field(loss, "num_chunks", LOSS_CHUNKS)
        at = Origin(FROM_FILE, f"{path}:{c_line or line}", "loss", f"ChunkedLossWrapper ({LOSS})")
        reading.set("fused_linear_cross_entropy", True, at)
        reading.set("fused_linear_cross_entropy_impl", "torchtitan_chunked", at)
        reading.set("fused_linear_cross_entropy_chunks", chunks, at)
    # main's model_registry takes the attention kernel (flex by default; gpt_oss varlen), all
    # fused; context parallelism takes SDPA or flex there (models/qwen3/model.py)
    attn = spec.kwargs.get("attn_backend", "varlen" if name == "gpt_oss" else "flex")
    reading.set(
        "attention_backend",
        "flash",
        Origin(
            FROM_FILE,
            f"{path}:{spec.line}",
            "model_registry(attn_backend)",
            f"attn_backend {attn}: a fused attention kernel, no s x s scores kept",
        ),
    )
    parallel = cfg.fields.get("parallelism")
    sp, sp_line, sp_given = _field(
        parallel if isinstance(parallel, _Config) else None, "enable_sequence_parallel", True
    )
    if sp_given and not sp:  # main's switch (configs.py); True, its default, is the derivation
        where = "the command line" if sp_line == COMMAND_LINE else f"{path}:{sp_line}"
        key = "parallelism.enable_sequence_parallel"
        reading.set("sequence_parallel", False, Origin(FROM_FILE, where, key))
    mtp = spec.kwargs.get("num_mtp_layers")
    if isinstance(mtp, int):
        reading.set(
            "mtp_num_layers",
            mtp,
            Origin(FROM_FILE, f"{path}:{spec.line}", "model_registry(num_mtp_layers)"),
        )
    elif "mtp_num_layers" in reading:  # deepseek_v3's model_registry(num_mtp_layers=0)
        reading.set(
            "mtp_num_layers",
            reading.get("mtp_num_layers"),
            Origin(
                FROM_DEFAULT,
                f"{MAIN_BLOB}/torchtitan/models/{name}/__init__.py",
                "model_registry(num_mtp_layers)",
                "0 by default: no MTP module",
            ),
        )
    if "moe_grouped_gemm" in reading:  # main's MoE runs its experts as grouped GEMMs
        reading.set(
            "moe_grouped_gemm",
            reading.get("moe_grouped_gemm"),
            Origin(FROM_DEFAULT, f"{MAIN_BLOB}/torchtitan/models/common/moe.py", "_grouped_mm"),
        )


_OVERRIDE = re.compile(r"^--?([A-Za-z_][\w.]*)(?:=(.*))?$")
# the policy chosen on the command line (activation_checkpoint.py ActivationCheckpointingConfig:
# subcommands selective, full, memory-budget, none)
_AC_SUBCOMMAND = re.compile(r"^activation[-_]checkpoint:(selective|full|memory-budget|none)$", re.I)
_AC_FIELD = "activation_checkpoint"
_AC_POLICY = {
    "selective": "SelectiveAC.Config",
    "full": "FullAC.Config",
    "memory-budget": "MemoryBudgetAC.Config",
}


def split_overrides(words: list[str]) -> list[str]:
    """`--a.b value` / `--a.b=value` / `a.b=value` words as `a.b=value` (a bare `--a.b` flag is
    `a.b=true`, tyro's boolean flag)."""
    out: list[str] = []
    k = 0
    while k < len(words):
        word = words[k]
        if sub := _AC_SUBCOMMAND.match(word):  # tyro's subcommand: `activation-checkpoint:full`
            out.append(f"{_AC_FIELD}={sub.group(1).lower()}")
            k += 1
            continue
        m = _OVERRIDE.match(word)
        if m and "." in m.group(1):
            if m.group(2) is not None:
                out.append(f"{m.group(1)}={m.group(2)}")
            elif k + 1 < len(words) and not words[k + 1].startswith("--"):
                out.append(f"{m.group(1)}={words[k + 1]}")
                k += 1
            else:
                out.append(f"{m.group(1)}=true")
        elif "=" in word and not word.startswith("-"):
            out.append(word)
        k += 1
    return out


def _literal(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


# The TOML era's [training] keys the config registry's TrainingConfig replaced
# (torchtitan/config/configs.py): its parser refuses them on the command line
_TOML_ERA_TRAINING = {
    "training.local_batch_size": "training.num_tokens_per_microbatch_per_dp_rank (tokens per "
    "micro-batch per data-parallel rank: samples x max_context_length)",
    "training.seq_len": "training.max_context_length",
    "training.global_batch_size": "training.num_tokens_per_train_step (tokens)",
}


def _apply_overrides(cfg: _Config, overrides: list[str], path: str) -> list[str]:
    """Apply the overrides to `cfg`; returns what was refused, in words (not applied)."""
    refused = [
        f"{word}: not an override torchtitan's parser takes (`--section.key value`, or "
        "`activation-checkpoint:none|selective|full`): not applied"
        for word in overrides
        if word.startswith("--") and "." not in word.partition("=")[0]
    ]
    for item in split_overrides(overrides):
        key, _, text = item.partition("=")
        if key in _TOML_ERA_TRAINING:
            refused.append(
                f"--{key} {text}: a TOML-era key, not a field of the config registry's "
                f"TrainingConfig (torchtitan's parser refuses it; not applied): its setting "
                f"is {_TOML_ERA_TRAINING[key]}"
            )
            continue
        if key == _AC_FIELD and (text in _AC_POLICY or text == "none"):
            policy = _Config(_AC_POLICY[text], COMMAND_LINE) if text in _AC_POLICY else None
            cfg.fields[_AC_FIELD] = policy
            cfg.lines[_AC_FIELD] = COMMAND_LINE
            continue
        *owners, last = key.split(".")
        node: Any = cfg
        for part in owners:
            if not isinstance(node, _Config):
                break
            if part not in node.fields:  # a section the function leaves at its default
                node.fields[part] = _Config(_DEFAULT_SECTIONS.get(part, part), node.line)
            node = node.fields.get(part)
        if not isinstance(node, _Config):
            raise ConfigError(f"{item}: no such section in the config of {path}")
        node.fields[last] = _literal(text)
        node.lines[last] = COMMAND_LINE
    return refused
