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

A file with several recipes: `path::function` selects one; otherwise the first pretraining recipe
(`pretrain_config`, `pretrain_recipe`, `*_pretrain_config`) is read, with a warning.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from ..config import ConfigError
from .bridge import BRIDGE, MODEL_CLASSES, NEMO2, Entry, Unresolved, apply_entries, set_model_name
from .reading import FROM_FILE, Origin, Reading

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
_ENTRY_RE = re.compile(r"(^|_)pretrain_(config|recipe)$|^pretrain_config$|^pretrain_recipe$")
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


class _Reader:
    def __init__(self, tree: ast.Module, path: str) -> None:
        self.path = path
        self.funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
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
        self.world: dict[str, tuple[Any, int, str]] = {}
        self.models: list[tuple[str, int, str]] = []
        self.stack: list[str] = []

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
        if isinstance(node, ast.Call) and _name(node.func) in KNOWN_CALLS:
            section, _key, v = KNOWN_CALLS[_name(node.func)]
            if section == "mixed_precision":
                return v
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
    def visit(self, fn: ast.FunctionDef, env: dict[str, Any]) -> None:
        if fn.name in self.stack:
            return
        self.stack.append(fn.name)
        for stmt in fn.body:
            self.statement(stmt, env)
        self.stack.pop()

    def statement(self, stmt: ast.stmt, env: dict[str, Any]) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            return
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
            # the recipe's branches: read the body (the common path), not the test
            for sub in getattr(stmt, "body", []):
                self.statement(sub, env)
            return
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
        key = parts[-1]
        section = ""
        for word in reversed(parts[1:-1]):
            if word in _SECTION_WORDS:
                section = _SECTION_WORDS[word]
                break
        if not section:
            if key in _SECTION_WORDS and len(parts) == 2:  # cfg.mixed_precision = "bf16_mixed"
                section, key = _SECTION_WORDS[key], ""
                if section == "model":
                    return  # cfg.model = Provider(...): read from the call
            else:
                return
        v = self.value(value, env)
        if (
            isinstance(value, ast.Call)
            and isinstance(v, Unresolved)
            and section != "mixed_precision"
        ):
            callee = _name(value.func)
            if (
                callee in self.funcs
                or callee in CLASS_SECTIONS
                or callee in MODEL_CLASSES
                or callee in ("Config", "Partial", "from_hf_pretrained")
                or "Provider" in callee
            ):
                return  # a constructed object: its call was read
        self.add(section, key, v, line, _dotted(target))

    def add(self, section: str, key: str, v: Any, line: int, written: str) -> None:
        if section == "trainer":
            if key in ("devices", "num_nodes"):
                self.world[key] = (v, line, written)
            elif key == "plugins":
                self.entries.append(Entry("mixed_precision", "", v, line, written))
            return
        self.entries.append(Entry(section, key, v, line, written))

    def call(self, node: ast.Call, env: dict[str, Any]) -> None:
        fname = _name(node.func)
        line = node.lineno
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
        if fname in KNOWN_CALLS:
            section, key, v = KNOWN_CALLS[fname]
            if section != "mixed_precision":
                self.entries.append(Entry(section, key, v, line, f"{fname}()"))
            return
        if fname in self.funcs:  # the file's own function: read it with the arguments passed
            callee = self.funcs[fname]
            bound = self.params(callee)
            names = [a.arg for a in callee.args.posonlyargs + callee.args.args]
            for a, arg in zip(names, node.args, strict=False):
                bound[a] = self.value(arg, env)
            for kw in node.keywords:
                if kw.arg:
                    bound[kw.arg] = self.value(kw.value, env)
            self.visit(callee, bound)
            return
        cls = fname
        if fname in ("Config", "Partial") and node.args:
            cls = _name(node.args[0])
        if cls == "ConfigContainer":
            for kw in node.keywords:
                if kw.arg == "mixed_precision":
                    self.entries.append(
                        Entry(
                            "mixed_precision",
                            "",
                            self.value(kw.value, env),
                            line,
                            "ConfigContainer(mixed_precision=)",
                        )
                    )
            return
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
        if section is None:
            return
        for kw in node.keywords:
            if kw.arg is None:
                continue
            v = self.value(kw.value, env)
            written = f"{cls}({kw.arg}=)"
            if isinstance(kw.value, ast.Name) and not isinstance(v, Unresolved):
                written = f"{cls}({kw.arg}={kw.value.id})"
            self.add(section, kw.arg, v, line, written)


def _select(
    tree: ast.Module,
    funcs: dict[str, ast.FunctionDef],
    selector: str | None,
    path: str,
    warnings: list[str],
) -> ast.FunctionDef | None:
    if selector:
        if selector not in funcs:
            raise ConfigError(f"{path}: no function {selector!r} in the recipe")
        return funcs[selector]
    entries = [f for f in funcs.values() if _ENTRY_RE.search(f.name)]
    if not entries:
        return None
    if len(entries) > 1:
        warnings.append(
            f"{path}: {len(entries)} recipes ({', '.join(f.name for f in entries[:5])}...); read "
            f"{entries[0].name} (select another with {path}::NAME)"
        )
    return entries[0]


def read(text: str, path: str) -> Reading:
    file_path, _, selector = path.partition("::")
    try:
        tree = ast.parse(text, filename=file_path)
    except SyntaxError as exc:
        raise ConfigError(f"{file_path}:{exc.lineno}: not valid Python ({exc.msg})") from None
    nemo = bool(re.search(r"\bnemo_run\b|from nemo\b|import nemo\b|MegatronStrategy", text))
    reading = Reading(framework=NEMO2 if nemo else BRIDGE)
    reader = _Reader(tree, file_path)
    entry = _select(tree, reader.funcs, selector or None, file_path, reading.warnings)
    if entry is None:
        for stmt in tree.body:
            reader.statement(stmt, dict(reader.consts))
        reading.format = f"{'NeMo 2.0' if nemo else 'Megatron-Bridge'} recipe (module level)"
    else:
        reader.visit(entry, reader.params(entry))
        reading.format = f"{'NeMo 2.0' if nemo else 'Megatron-Bridge'} recipe {entry.name}()"
    apply_entries(reading, reader.entries, file_path)
    for name, line, written in reader.models:
        set_model_name(reading, name, Origin(FROM_FILE, f"{file_path}:{line}", written))
    if "devices" in reader.world:
        dv, dline, dwritten = reader.world["devices"]
        nv = reader.world.get("num_nodes", (1, 0, ""))[0]
        if isinstance(dv, int) and isinstance(nv, int):
            reading.set(
                "world_size",
                dv * nv,
                Origin(
                    FROM_FILE, f"{file_path}:{dline}", dwritten, f"devices {dv} x num_nodes {nv}"
                ),
            )
        else:
            reading.warnings.append(
                f"{file_path}:{dline}: trainer devices/num_nodes not literal: world size unknown"
            )
    if not reading.values and reading.model_name is None:
        raise ConfigError(
            f"{file_path}: no recipe settings found (no ConfigContainer, provider or run.Config calls)"  # noqa: E501
        )
    return reading
