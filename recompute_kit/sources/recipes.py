"""Megatron-Bridge and NeMo 2.0 recipes in Python, read with `ast` only (never imported or run).

What is read: keyword arguments of constructor calls
(`Llama3ModelProvider8B(tensor_model_parallel_size=tensor_parallelism)`,
`run.Config(MockDataModule, seq_length=8192)`,
`TrainingConfig(micro_batch_size=...)`), attribute assignments
(`cfg.model.seq_length = 8192`,
`recipe.trainer.strategy.tensor_model_parallel_size = 2`), the recipe function's signature defaults
and the keyword arguments its calls pass to the file's other functions, module constants,
`AutoBridge.from_hf_pretrained("org/name")` / `hf_path="..."` and provider / NeMo config classes
(model names). Anything that is not a literal is left unset with a warning naming it.

Recipes that start from a shared helper (`cfg = _pretrain_common()` then `cfg.model.<key> =
...`, Megatron-Bridge's recipes since 2026): the helper is followed into the file's own functions,
into `megatron/bridge/recipes/common.py` when it is beside the file, or else into the values of
`bridge_common.py` (with a warning). Simple expressions are evaluated (`recipe_eval.py`: lists,
arithmetic, `if` tests on values already read, the file's functions' return values), so a layout
built by the file's own function is read; what cannot be evaluated is a warning naming the key.

Which recipe of a file with several is read (`path::function`, a launch command's `--recipe`,
an alias imported from another recipe module): recipe_choice.py.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError
from . import bridge_common
from .bridge import (
    BRIDGE,
    MODEL_CLASSES,
    NEMO2,
    UNDECIDED,
    Entry,
    Unresolved,
    apply_entries,
    precision_fields,
    set_model_name,
)
from .reading import FROM_ASSUMED, FROM_DEFAULT, FROM_FILE, Origin, Reading
from .recipe_choice import aliases, select
from .recipe_eval import fold

FRAMEWORKS: tuple[str, ...] = ()  # bridge.py owns the defaults

CLASS_SECTIONS = {
    "TrainingConfig": "train",
    "GPTDatasetConfig": "dataset",
    "FinetuningDatasetConfig": "dataset",
    "DistributedDataParallelConfig": "ddp",
    "OptimizerConfig": "optimizer",
    "DistributedInitConfig": "dist",
    "MixedPrecisionConfig": "mixed_precision",
    "MegatronStrategy": "strategy",
    "Trainer": "trainer",
    # TP communication overlap: Megatron-Bridge's CommOverlapConfig, NeMo 2.0's callback
    "CommOverlapConfig": "comm_overlap",
    "MegatronCommOverlapCallback": "comm_overlap",
}
# What a section class built anew sets by its own default, where an earlier object of the section
# set otherwise (`cfg.optimizer = OptimizerConfig(optimizer="dist_muon", ...)` after
# _pretrain_common()'s distributed Adam): Megatron-Core's OptimizerConfig and
# DistributedDataParallelConfig both default use_distributed_optimizer to False
_SECTION_DEFAULTS = {
    "OptimizerConfig": {"use_distributed_optimizer": False},
    "DistributedDataParallelConfig": {"use_distributed_optimizer": False},
}
# Helper calls whose effect is known (Bridge recipes/utils/optimizer_utils.py and NeMo
# recipes/optim/adam.py build a distributed optimizer; precision presets).
KNOWN_CALLS = {
    "distributed_fused_adam_with_cosine_annealing": (
        "optimizer",
        "use_distributed_optimizer",
        True,
    ),
    "bf16_mixed": ("mixed_precision", "", "bf16_mixed"),
    "bf16_mixed_plugin": ("mixed_precision", "", "bf16_mixed"),
    "fp16_mixed": ("mixed_precision", "", "fp16_mixed"),
    "fp16_mixed_plugin": ("mixed_precision", "", "fp16_mixed"),
}
# Megatron-Bridge's named precision presets (training/mixed_precision.py): the name says it all
_PRECISION_PRESET = re.compile(r"(?:bf16|fp16)\w*_mixed")
_SECTION_WORDS = {
    "strategy": "strategy",
    "trainer": "trainer",
    "data": "dataset",
    "dataset": "dataset",
    "train": "train",
    "ddp": "ddp",
    "optimizer": "optimizer",
    "optim": "optimizer",
    "dist": "dist",
    "mixed_precision": "mixed_precision",
    "comm_overlap": "comm_overlap",
    "plugins": "mixed_precision",  # NeMo 2.0: trainer.plugins is the MegatronMixedPrecision
    "model": "model",
}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:
        return "<expr>"


@dataclass(frozen=True)
class _PeftScheme:
    """What Megatron-Bridge's default_peft_config(scheme) returns: LoRA() or DoRA() for "lora" /
    "dora" or a PEFT instance (adapters on a frozen base), None for None or "none"."""

    scheme: Any

    @property
    def frozen(self) -> bool | None:
        if self.scheme is None or str(self.scheme).lower() == "none":
            return False
        if isinstance(self.scheme, str):
            return self.scheme.lower() in ("lora", "dora")
        return None  # not read: a PEFT instance or an expression


class _Section:
    """The value of `cfg.model` (or `cfg.ddp`, ...): passed to a function, its attributes are
    that section's keys (`model_cfg.pipeline_model_parallel_size`)."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Returned(Exception):
    """A `return` (or `raise`) ends the function being read."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _imports(tree: ast.Module) -> dict[str, tuple[str, int, str]]:
    """Names imported with `from M import f [as g]` -> (module, level, f)."""
    out: dict[str, tuple[str, int, str]] = {}
    for n in tree.body:
        if isinstance(n, ast.ImportFrom):
            for alias in n.names:
                out[alias.asname or alias.name] = (n.module or "", n.level, alias.name)
    return out


def _module_file(path: str, module: str, level: int) -> Path | None:
    """The file of `module` beside `path`: relative to its folder (`from ..common import`), or
    under one of its parent folders (`megatron/bridge/recipes/common.py` in a checkout)."""
    here = Path(path).resolve().parent
    rel = Path(*module.split(".")) if module else Path()
    if level:
        base = here
        for _ in range(level - 1):
            base = base.parent
        candidates = [base / rel]
    else:
        candidates = [d / rel for d in (here, *here.parents)]
        candidates += [d / "src" / rel for d in here.parents]
    for c in candidates:
        for f in (c.with_suffix(".py"), c / "__init__.py") if module else (c / "__init__.py",):
            if f.is_file():
                return f
    return None


# Said of a model provider class whose file is not in the checkout (the resolver's refusal
# names it where the shape is what is missing)
PROVIDER_UNREAD = "what it sets beyond Megatron-Bridge's GPTModelProvider is not read"
# Bridge's base providers: the reader knows their defaults (bridge.py), whatever the checkout
_BASE_PROVIDERS = frozenset(
    ("GPTModelProvider", "MLAModelProvider", "TransformerConfig", "MLATransformerConfig")
)


class _Reader:
    def __init__(self, tree: ast.Module, path: str, parent: _Reader | None = None) -> None:
        self.path = path
        self.funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.imports = _imports(tree)
        self.import_lines = {
            alias.asname or alias.name: n.lineno
            for n in tree.body
            if isinstance(n, ast.ImportFrom)
            for alias in n.names
        }
        self.consts: dict[str, Any] = {}
        for n in tree.body:
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        v = self.value(n.value, {})
                        if not isinstance(v, Unresolved):
                            self.consts[t.id] = v
        self.entries: list[Entry] = []
        self.world: dict[str, tuple[Any, int, str, str]] = {}  # (value, line, key, file:line)
        self.models: list[tuple[str, int, str]] = []
        self.stack: list[str] = []
        self.warnings: list[str] = []
        # (section, key) -> the value read so far: what `cfg.model.x` / `if cfg.model.x:` see
        self.state: dict[tuple[str, str], Any] = {}
        self.calls: dict[tuple[int, int], Any] = {}  # (call node, env) read -> its value
        self.helpers: list[str] = []  # helpers neither in the file nor found beside it
        if parent is not None:  # a helper's file: what it sets goes to the same recipe
            for name in ("entries", "world", "models", "stack", "warnings", "state", "helpers"):
                setattr(self, name, getattr(parent, name))

    # values ---------------------------------------------------------------------------------
    def value(self, node: ast.AST, env: dict[str, Any]) -> Any:
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.consts:
                return self.consts[node.id]
            return Unresolved(node.id)
        if isinstance(node, ast.Attribute):
            return self.attribute_value(node, env)
        if isinstance(node, ast.Call):
            fname = _name(node.func)
            if fname == "default_peft_config":
                return self.call(node, env)
            plugin = self.mixed_precision_plugin(node, env)
            if plugin is not None:
                return plugin
            if fname in KNOWN_CALLS:
                section, _key, v = KNOWN_CALLS[fname]
                if section == "mixed_precision":
                    return v
            if _PRECISION_PRESET.fullmatch(fname):  # bf16_with_fp8_current_scaling_mixed()
                return fname
            if isinstance(node.func, ast.Name) and (
                fname in self.funcs or (fname in self.imports and fname not in CLASS_SECTIONS)
            ):
                # the file's own function, or one imported from beside it: its return value
                # (`cfg.mixed_precision = _perf_precision("bf16")`)
                return self.call(node, env)
            if fname == "getattr" and len(node.args) == 3:  # getattr(model_cfg, "key", default)
                obj, key = self.value(node.args[0], env), self.value(node.args[1], env)
                if isinstance(obj, _Section) and isinstance(key, str):
                    return self.state.get((obj.name, key), Unresolved(_dotted(node)))
        return fold(node, lambda n: self.value(n, env))

    def mixed_precision_plugin(self, node: ast.Call, env: dict[str, Any]) -> dict | None:
        """NeMo 2.0's `run.Config(nl.MegatronMixedPrecision, precision="bf16-mixed", ...)` (or
        the class called): the precision fields it gives the model (nemo/lightning/pytorch/
        plugins/mixed_precision.py: bf16 for "bf16"/"bf16-mixed", grad_reduce_in_fp32 True,
        fp8 None and fp8_recipe "delayed" unless given); None for any other call."""
        args = node.args
        if _name(node.func) in ("Config", "Partial") and args:
            cls, args = _name(args[0]), args[1:]
        else:
            cls = _name(node.func)
        if cls != "MegatronMixedPrecision":
            return None
        given = {k.arg: k.value for k in node.keywords if k.arg}
        if args:
            given.setdefault("precision", args[0])
        fields = {"grad_reduce_in_fp32": True, "fp8": None, "fp8_recipe": "delayed"}
        for key in ("grad_reduce_in_fp32", "fp8", "fp8_recipe"):
            if key in given:
                fields[key] = self.value(given[key], env)
        precision = self.value(given["precision"], env) if "precision" in given else None
        if not isinstance(precision, (str, int)):
            return None
        precision = str(precision)
        fields["bf16"] = precision in ("bf16", "bf16-mixed")
        fields["fp16"] = precision in ("fp16", "fp16-mixed", "16", "16-mixed")
        if fields["fp8"] is None:
            del fields["fp8_recipe"]  # (no fp8: its recipe says nothing)
        else:
            fields["fp8"] = str(fields["fp8"])
        return fields

    def section_of(self, parts: list[str], env: dict[str, Any]) -> tuple[str, list[str]]:
        """`cfg.model.x` / `model_cfg.x` (model_cfg bound to cfg.model) -> ("model", ["x"])."""
        if parts[0] in env and isinstance(env[parts[0]], _Section):
            return env[parts[0]].name, parts[1:]
        for i in range(len(parts) - 1, 0, -1):
            if parts[i] in _SECTION_WORDS:
                return _SECTION_WORDS[parts[i]], parts[i + 1 :]
        return "", parts

    def attribute_value(self, node: ast.Attribute, env: dict[str, Any]) -> Any:
        parts = _dotted(node).split(".")
        if parts[0] == "torch" and len(parts) == 2:
            return _dotted(node)  # a dtype, `torch.bfloat16` (bridge.dtype_name reads it)
        section, rest = self.section_of(parts, env)
        if section and not rest:
            return _Section(section)
        if section and len(rest) == 1:
            return self.state.get((section, rest[0]), Unresolved(_dotted(node)))
        return Unresolved(_dotted(node))

    def params(self, fn: ast.FunctionDef) -> dict[str, Any]:
        env: dict[str, Any] = {}
        args = fn.args
        pos = args.posonlyargs + args.args
        for a, d in zip(pos[len(pos) - len(args.defaults) :], args.defaults, strict=True):
            env[a.arg] = self.value(d, {})
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            if d is not None:
                env[a.arg] = self.value(d, {})
        return env

    # walking --------------------------------------------------------------------------------
    def visit(self, fn: ast.FunctionDef, env: dict[str, Any]) -> Any:
        """Read `fn`'s body; its return value when that is known."""
        key = f"{self.path}::{fn.name}"  # (a function may share its name with another file's)
        if key in self.stack or len(self.stack) > 20:
            return Unresolved(f"{fn.name}()")
        self.stack.append(key)
        try:
            self.block(fn.body, env, returns=True)
        except _Returned as ret:
            return ret.value
        finally:
            self.stack.pop()
        return None

    def block(self, body: list[ast.stmt], env: dict[str, Any], returns: bool) -> None:
        for stmt in body:
            try:
                self.statement(stmt, env)
            except _Returned:
                if returns:
                    raise

    def statement(self, stmt: ast.stmt, env: dict[str, Any]) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            return
        if isinstance(stmt, (ast.Return, ast.Raise)):
            value = getattr(stmt, "value", None) if isinstance(stmt, ast.Return) else None
            for node in ast.walk(value) if value is not None else ():
                if isinstance(node, ast.Call):
                    self.call(node, env)
            raise _Returned(
                Unresolved("raise")
                if isinstance(stmt, ast.Raise)
                else (None if value is None else self.value(value, env))
            )
        if isinstance(stmt, ast.If):
            test = self.value(stmt.test, env)
            if not isinstance(test, Unresolved):  # a test on values already read decides
                self.block(stmt.body if test else stmt.orelse, env, returns=True)
                return
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            # an undecided branch: read the body (the common path), not the test; a `return`
            # in it does not end the function (the other path goes on)
            before = len(self.entries)
            self.block(
                getattr(stmt, "body", []), env, returns=isinstance(stmt, (ast.With, ast.Try))
            )
            set_there = [e.written for e in self.entries[before:]]
            if isinstance(stmt, ast.If):
                test = f"`if {ast.unparse(stmt.test)[:60]}` (line {stmt.lineno})"
                for entry in self.entries[before:]:  # said beside each value it sets
                    said = f"set inside {test}, {UNDECIDED}"
                    entry.note = f"{entry.note}; {said}" if entry.note else said
            if isinstance(stmt, ast.If) and set_there:
                # said: a perf script's `if recompute_num_layers is not None:` may be the path
                # not taken, and what it sets then does not run
                self.warnings.append(
                    f"{self.path}:{stmt.lineno}: `if {ast.unparse(stmt.test)[:80]}` is not "
                    f"decided by the values read; what its body sets is read as taken: "
                    f"{', '.join(dict.fromkeys(set_there))[:200]}"
                )
            return
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
            if names:  # `cfg = helper()`: the config the recipe builds on
                stmt.value._assigned = names[0]  # type: ignore[attr-defined]
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call):
                self.call(node, env)
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    v = self.value(stmt.value, env)
                    if not isinstance(v, Unresolved):
                        env[t.id] = v
                elif isinstance(t, ast.Attribute):
                    self.attribute(t, stmt.value, env, stmt.lineno)
        elif (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Attribute)
            and stmt.value
        ):
            self.attribute(stmt.target, stmt.value, env, stmt.lineno)

    def attribute(
        self, target: ast.Attribute, value: ast.AST, env: dict[str, Any], line: int
    ) -> None:
        parts = _dotted(target).split(".")
        if len(parts) < 2:
            return
        preset = env.get(parts[0]) if len(parts) == 2 else None
        if isinstance(preset, dict) or (
            isinstance(preset, str) and _PRECISION_PRESET.fullmatch(preset)
        ):
            # `cfg = bf16_mixed(); cfg.grad_reduce_in_fp32 = False` (perf_recipes/_common.py
            # _perf_precision): the named preset's fields, with this one changed
            fields = dict(preset) if isinstance(preset, dict) else {
                k: v for k, v, _ in precision_fields(preset, None)
            }
            fields[parts[1]] = self.value(value, env)
            env[parts[0]] = fields
            return
        key = parts[-1]
        section = ""
        if parts[0] in env and isinstance(env[parts[0]], _Section) and len(parts) == 2:
            section = env[parts[0]].name  # model_cfg.x = ..., model_cfg bound to cfg.model
        for word in reversed(parts[1:-1]):
            if section:
                break
            if word in _SECTION_WORDS:
                section = _SECTION_WORDS[word]
                break
        if key == "peft" and len(parts) == 2:
            # recipe.peft = run.Config(LoRA) / PEFT_STR2CLS["lora"] / LoRA(...): adapters on a
            # frozen base (NeMo 2.0 and Megatron-Bridge finetune recipes); None: full training
            said = _dotted(value)
            scheme = self.value(value, env)
            if isinstance(scheme, _PeftScheme):  # default_peft_config("lora"), Bridge's helper
                said = f"default_peft_config({scheme.scheme!r})"
                if scheme.frozen is None:
                    self.warnings.append(
                        f"{self.path}:{line}: peft = {_dotted(value)}: the PEFT scheme is not "
                        "read; a full fine-tune is counted (--set frozen_base=true for LoRA)"
                    )
                    return
                if not scheme.frozen:
                    return
            elif not re.search(r"\b(?:LoRA|DoRA|CanonicalLoRA|PEFT_STR2CLS)\b", said):
                return
            note = f"peft = {said[:60]}: adapters on frozen base weights"
            self.add("model", "frozen_base", True, line, _dotted(target), note=note)
            return
        if not section:
            if key in _SECTION_WORDS and len(parts) == 2:  # cfg.mixed_precision = "bf16_mixed"
                section, key = _SECTION_WORDS[key], ""
                if section == "model":
                    return  # cfg.model = Provider(...): read from the call
            else:
                return
        v = self.value(value, env)
        if isinstance(value, ast.Call) and isinstance(v, Unresolved):
            callee = _name(value.func)
            if callee in CLASS_SECTIONS:
                return  # cfg.mixed_precision = MixedPrecisionConfig(...): its call was read
            if section != "mixed_precision" and (
                callee in self.funcs
                or callee in CLASS_SECTIONS
                or callee in MODEL_CLASSES
                or callee in ("Config", "Partial", "from_hf_pretrained")
                or "Provider" in callee
            ):
                return  # a constructed object: its call was read
        if isinstance(v, _Section):
            return  # cfg.model = other_cfg.model: not a value
        self.add(section, key, v, line, _dotted(target))

    def add(
        self,
        section: str,
        key: str,
        v: Any,
        line: int,
        written: str,
        where: str = "",
        note: str = "",
    ) -> None:
        self.state[(section, key)] = v
        where = where or (f"{self.path}:{line}" if line else self.path)
        if section == "trainer":
            if key in ("devices", "num_nodes"):
                self.world[key] = (v, line, written, where)
            elif key == "plugins":
                self.entries.append(Entry("mixed_precision", "", v, line, written, where))
            return
        self.entries.append(Entry(section, key, v, line, written, where, note))

    def call(self, node: ast.Call, env: dict[str, Any]) -> Any:
        """Read what a call sets (once per call and function visit); its value when known."""
        memo = (id(node), id(env))
        if memo not in self.calls:
            self.calls[memo] = Unresolved(_dotted(node))  # (a call within its own arguments)
            self.calls[memo] = self.read_call(node, env)
        return self.calls[memo]

    def read_call(self, node: ast.Call, env: dict[str, Any]) -> Any:
        fname = _name(node.func)
        line = node.lineno
        where = f"{self.path}:{line}"
        for kw in node.keywords:
            if kw.arg == "hf_path":
                v = self.value(kw.value, env)
                if isinstance(v, str):
                    self.models.append((v, line, "hf_path"))
        if fname == "from_hf_pretrained" and node.args:
            v = self.value(node.args[0], env)
            if isinstance(v, str):
                self.models.append((v, line, "AutoBridge.from_hf_pretrained"))
            return
        if fname == "default_peft_config":  # recipes/utils/dataset_utils.py: its PEFT or None
            arg = node.args[0] if node.args else None
            arg = next((k.value for k in node.keywords if k.arg == "peft_scheme"), arg)
            return _PeftScheme(self.value(arg, env) if arg is not None else None)
        if fname in KNOWN_CALLS:
            section, key, v = KNOWN_CALLS[fname]
            if section != "mixed_precision":
                self.entries.append(Entry(section, key, v, line, f"{fname}()", where))
            return None
        if fname == bridge_common.FLEX_CALL and len(node.args) >= 2:
            self.flex_dispatcher(node, env)
            return None
        if fname in self.funcs and isinstance(node.func, ast.Name):
            # the file's own function: read it with the arguments passed
            return self.enter(self, self.funcs[fname], node, env)
        if (
            fname in self.imports
            and isinstance(node.func, ast.Name)
            and fname
            not in (
                *CLASS_SECTIONS,
                *MODEL_CLASSES,
                "ConfigContainer",
            )
            and "ModelProvider" not in fname  # a provider class: its defaults, read below
        ):
            return self.imported(fname, node, env)
        cls = fname
        if fname in ("Config", "Partial") and node.args:
            cls = _name(node.args[0])
        if cls == "ConfigContainer":
            for kw in node.keywords:
                if kw.arg == "mixed_precision":
                    self.add(
                        "mixed_precision",
                        "",
                        self.value(kw.value, env),
                        line,
                        "ConfigContainer(mixed_precision=)",
                    )
            return None
        section = CLASS_SECTIONS.get(cls)
        if section is None and cls.endswith("DataModule"):
            section = "dataset"
        if section is None and (
            cls in MODEL_CLASSES
            or cls.endswith("ModelProvider")
            or "ModelProvider" in cls
            or re.match(r"^[A-Z]\w*Config\d", cls)
            or cls in ("GPTConfig", "LlamaConfig")
        ):
            section = "model"
            if cls in MODEL_CLASSES:
                self.models.append((cls, line, cls))
            elif cls in self.imports:
                self.provider_defaults(cls)
        if section is None:
            return None
        given = {kw.arg for kw in node.keywords}
        for key, default in _SECTION_DEFAULTS.get(cls, {}).items():
            if key not in given:  # a new section object: its own default, not the one replaced
                self.add(section, key, default, line, f"{cls}() default {key}={default}")
        for kw in node.keywords:
            if kw.arg is None:
                continue
            v = self.value(kw.value, env)
            written = f"{cls}({kw.arg}=)"
            if isinstance(kw.value, ast.Name) and not isinstance(v, Unresolved):
                written = f"{cls}({kw.arg}={kw.value.id})"
            self.add(section, kw.arg, v, line, written)
        return None

    def provider_defaults(self, cls: str, depth: int = 0) -> None:
        """The class-level defaults of a model provider the recipe imports from its checkout
        (OlMoEModelProvider sets the whole shape itself), its own bases' first; the keywords
        and assignments the recipe writes after it win."""
        if cls in _BASE_PROVIDERS or cls not in self.imports or depth > 8:
            return
        module, level, name = self.imports[cls]
        found = _module_file(self.path, module, level)
        try:
            tree = ast.parse(found.read_text(encoding="utf-8")) if found else None
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            tree = None
        if tree is None:
            self.warnings.append(
                f"{self.path}: {cls} (from {'.' * level}{module}) is not beside this file: "
                f"{PROVIDER_UNREAD} (read the recipe in its Bridge checkout, or name the model: "
                "--model HF_ID or its config.json)"
            )
            return
        other = _Reader(tree, _shown(found), parent=self)  # adds to this recipe's entries
        body = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if body is None:  # re-exported (a package's __init__): follow on
            other.provider_defaults(name, depth + 1)
            return
        for base in body.bases:
            other.provider_defaults(_name(base), depth + 1)
        for stmt in body.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                v = other.value(stmt.value, {})
                if v is not None and not isinstance(v, (Unresolved, _Section)):  # None: unset
                    other.add("model", stmt.target.id, v, stmt.lineno, f"{name}.{stmt.target.id}")

    def enter(
        self, owner: _Reader, fn: ast.FunctionDef, node: ast.Call, env: dict[str, Any]
    ) -> Any:
        """Read `fn` (a function of `owner`'s file) called by `node` here, with its arguments."""
        bound = owner.params(fn)
        names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        for a, arg in zip(names, node.args, strict=False):
            bound[a] = self.value(arg, env)
        for kw in node.keywords:
            if kw.arg:
                bound[kw.arg] = self.value(kw.value, env)
        return owner.visit(fn, bound)

    def imported(self, fname: str, node: ast.Call, env: dict[str, Any]) -> Any:
        """`cfg = _pretrain_common()` imported from another file: that file's function when it
        is beside this one, else Bridge's recipes/common.py as recompute-kit knows it."""
        module, level, name = self.imports[fname]
        found = _module_file(self.path, module, level)
        if found is not None:
            try:
                tree = ast.parse(found.read_text(encoding="utf-8"), filename=str(found))
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                tree = None
            if tree is not None:
                other = _Reader(tree, _shown(found), parent=self)
                if name in other.funcs:
                    return self.enter(other, other.funcs[name], node, env)
                if name in other.imports and len(self.stack) < 20:  # re-exported: follow on
                    self.stack.append(f"import {name}")
                    try:
                        return other.imported(name, node, env)
                    finally:
                        self.stack.pop()
        if module == bridge_common.COMMON_MODULE and name in bridge_common.HELPERS:
            keys = []
            for section, key, v, hline in bridge_common.HELPERS[name]:
                written = f"{name}() {section}.{key}" if key else f"{name}() {section}"
                url = f"{bridge_common.COMMON_URL}#L{hline}"
                self.add(section, key, v, hline, written, where=url)
                keys.append(f"{section}.{key}={v}" if key else f"{section}={v}")
            self.warnings.append(
                f"{self.path}:{node.lineno}: {name}() is in {module}, not beside this file: "
                f"read as Megatron-Bridge {bridge_common.COMMON_COMMIT[:7]} sets it "
                f"({', '.join(keys)}; what the recipe assigns after it wins); another Bridge "
                "version may set other values"
            )
        elif isinstance(getattr(node, "_assigned", None), str):
            self.helpers.append(f"{fname}() ({module or '.'}) at {self.path}:{node.lineno}")
        return None

    def flex_dispatcher(self, node: ast.Call, env: dict[str, Any]) -> None:
        target, backend = self.value(node.args[0], env), self.value(node.args[1], env)
        if not isinstance(target, _Section) or target.name != "model":
            return
        if isinstance(backend, Unresolved):
            self.add("model", "moe_token_dispatcher_type", backend, node.lineno, _dotted(node))
        elif backend in bridge_common.FLEX_BACKENDS:
            note = bridge_common.FLEX_NOTE.format(backend=backend)
            for key, v in (
                ("moe_token_dispatcher_type", "flex"),
                ("moe_shared_expert_overlap", False),
            ):
                self.add("model", key, v, node.lineno, _dotted(node), note=note)


def _follow_alias(reader: _Reader, name: str) -> str:
    """Read the recipe an imported name stands for (`from megatron.bridge.recipes.qwen.h100.
    qwen3_moe import qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config as
    qwen3_30b_a3b_pretrain_config`): its module found in the checkout the file is in."""
    module, level, original = reader.imports[name]
    found = _module_file(reader.path, module, level)
    shown = f"{'.' * level}{module}.{original}"
    if found is None:
        raise ConfigError(
            f"{reader.path}: {name} is {shown}, whose file is not in the checkout this file is "
            f"in: give that recipe file (with ::{original})"
        )
    call = ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[], keywords=[])
    call.lineno = reader.import_lines.get(name, 0)
    reader.imported(name, call, {})
    return f"{_shown(found)}::{original}()"


def _shown(path: Path) -> str:
    """`path` relative to the working folder when it is under it (as the user names files)."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# What a recipe decides that its helper set when the helper could not be read.
_LEFT_TO_DEFAULTS = (
    "seq_length",
    "micro_batch_size",
    "bf16",
    "fp16",
    "use_distributed_optimizer",
    "grad_reduce_in_fp32",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "sequence_parallel",
    "recompute_granularity",
)


def _call_arguments(selector: str, path: str) -> tuple[str, dict[str, Any]]:
    """`NAME(kw=literal, ...)` (`recipe.py::finetune_recipe(peft_scheme=None, num_nodes=2)`):
    the recipe's name and the keyword arguments it is called with (literals only)."""
    if "(" not in selector:
        return selector, {}
    try:
        call = ast.parse(selector.strip(), mode="eval").body
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
            raise ValueError
        return call.func.id, {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (SyntaxError, ValueError):
        raise ConfigError(
            f"{path}::{selector}: give the recipe as NAME or NAME(key=literal, ...)"
        ) from None


def read(text: str, path: str) -> Reading:
    file_path, _, selector = path.partition("::")
    try:
        tree = ast.parse(text, filename=file_path)
    except SyntaxError as exc:
        raise ConfigError(f"{file_path}:{exc.lineno}: not valid Python ({exc.msg})") from None
    nemo = bool(re.search(r"\bnemo_run\b|from nemo\b|import nemo\b|MegatronStrategy", text))
    reading = Reading(framework=NEMO2 if nemo else BRIDGE)
    reader = _Reader(tree, file_path)
    selector, arguments = _call_arguments(selector, file_path)
    entry = select(tree, reader, selector or None, file_path, reading.warnings)
    kind = "NeMo 2.0" if nemo else "Megatron-Bridge"
    if entry is None:
        for stmt in tree.body:
            reader.statement(stmt, dict(reader.consts))
        reading.format = f"{kind} recipe (module level)"
    elif entry in reader.funcs:
        fn = reader.funcs[entry]
        env = reader.params(fn)
        unknown = sorted(set(arguments) - {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)})
        if unknown:
            raise ConfigError(f"{file_path}: {entry}() takes no argument {', '.join(unknown)}")
        reader.visit(fn, {**env, **arguments})
        given = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        reading.format = f"{kind} recipe {entry}({given})"
    else:
        reading.format = f"{kind} recipe {entry}() = {_follow_alias(reader, entry)}"
    # what a launch command's `--recipe NAME` can choose among (resolve.py, select_named)
    reading.recipe_choices = [*reader.funcs, *aliases(reader)]  # type: ignore[attr-defined]
    reading.recipe_read = entry  # type: ignore[attr-defined]
    reading.recipe_named = bool(selector)  # type: ignore[attr-defined]
    apply_entries(reading, reader.entries, file_path)
    for key, o in list(reading.origins.items()):
        if o.where.startswith(bridge_common.COMMON_URL):  # the helper as Bridge ships it, not
            reading.origins[key] = Origin(FROM_DEFAULT, o.where, o.key, o.note)  # the user's file
    reading.warnings.extend(reader.warnings)
    if reader.helpers:
        left = [k for k in _LEFT_TO_DEFAULTS if k not in reading]
        reading.warnings.append(
            f"{'; '.join(reader.helpers)}: not found beside the file, what it sets is not read"
            + (f"; left to Megatron-Bridge's defaults: {', '.join(left)}" if left else "")
        )
    for name, line, written in reader.models:
        set_model_name(reading, name, Origin(FROM_FILE, f"{file_path}:{line}", written))
    if "devices" in reader.world:
        dv, _, dwritten, dwhere = reader.world["devices"]
        nv = reader.world.get("num_nodes", (1, 0, "", ""))[0]
        if isinstance(dv, int) and isinstance(nv, int):
            reading.set(
                "world_size",
                dv * nv,
                Origin(FROM_FILE, dwhere, dwritten, f"devices {dv} x num_nodes {nv}"),
            )
        else:
            reading.warnings.append(
                f"{dwhere}: trainer devices/num_nodes not literal: world size unknown"
            )
    sized = re.search(r"_(\d+)gpus?_", str(entry or ""))
    if sized and "world_size" not in reading:
        # Bridge's performance recipes name the GPUs they are for (`..._64gpu_h100_..._config`)
        reading.set(
            "world_size",
            int(sized.group(1)),
            Origin(
                FROM_ASSUMED,
                file_path,
                "the launch's GPU count (--dp, or torchrun --nproc_per_node x --nnodes)",
                note=f"the recipe's name, {entry}, says {sized.group(1)} GPUs",
            ),
        )
    if not reading.values and reading.model_name is None:
        raise ConfigError(
            f"{file_path}: no recipe settings found (no ConfigContainer, provider or run.Config calls)"  # noqa: E501
        )
    return reading
