"""Which recipe of a Python recipe file is read: the one `FILE::NAME` or a launch command's
`run_recipe.py --recipe NAME` names, else the file's first pretraining recipe, with a warning
listing the others. A recipe may be the file's own function or a name it imports from another
recipe module (`recipes/qwen/qwen3_moe.py` aliases `recipes/qwen/h100/qwen3_moe.py`'s)."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ConfigError
from .bridge import ON_RECIPE, UNKNOWN_RECIPE, YAML_ON_RECIPE
from .reading import Reading

_ENTRY_RE = re.compile(r"(^|_)(pretrain|finetune)_(config|recipe)$")


def recipe_names(tree: ast.Module, reader: Any) -> list[str]:
    """The file's recipes, the one read by default first: its functions (and the names it
    imports from another recipe module, `from .h100.qwen3_moe import x_config as
    x_pretrain_config`) named as pretraining recipes are, then those of its `__all__`, else its
    functions returning a ConfigContainer, pretraining first."""
    known = [*reader.funcs, *aliases(reader)]
    named = sorted((n for n in known if _ENTRY_RE.search(n)), key=lambda n: "pretrain" not in n)
    others = [n for n in _exported(tree) if n in known] or [
        f.name for f in reader.funcs.values() if _returns_config(f)
    ]
    others.sort(key=lambda n: "pretrain" not in n)  # stable: pretraining first
    return list(dict.fromkeys([*named, *others]))


def aliases(reader: Any) -> list[str]:
    """Names the file imports from another recipe module (an alias of a recipe there)."""
    return [
        name
        for name, (module, level, _) in reader.imports.items()
        if level or re.match(r"megatron\.bridge\.recipes\.(?!utils\b|common\b)", module)
    ]


def select(
    tree: ast.Module, reader: Any, selector: str | None, path: str, warnings: list[str]
) -> str | None:
    names = recipe_names(tree, reader)
    if selector:
        if selector not in reader.funcs and selector not in aliases(reader):
            close = difflib.get_close_matches(selector, names, n=1)
            if close:  # a misspelt name: the one meant, not the whole list
                raise ConfigError(
                    f"{path}: no recipe {selector!r} in the file; did you mean {close[0]!r}?"
                )
            listed = ", ".join(names) if names else "none found"
            raise ConfigError(f"{path}: no recipe {selector!r} in the file (its recipes: {listed})")
        return selector
    if not names:
        return None
    if len(names) > 1:
        warnings.append(
            f"{path}: {len(names)} recipes and none named: read {names[0]} (name another with "
            f"{path}::NAME, or give the launch command whose --recipe names it); the others: "
            + ", ".join(names[1:])
        )
    return names[0]


def _exported(tree: ast.Module) -> list[str]:
    """The names in the file's `__all__`, in order."""
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets
        ):
            try:
                names = ast.literal_eval(n.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return []
            return (
                [x for x in names if isinstance(x, str)] if isinstance(names, list | tuple) else []
            )
    return []


def _returns_config(fn: ast.FunctionDef) -> bool:
    node = fn.returns
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name == "ConfigContainer"


def select_named(
    items: list[str], readings: list[Reading], read: Callable[[str], tuple[Reading, str]]
) -> dict[int, tuple[Reading, str]]:
    """A launch command's `run_recipe.py --recipe NAME` (scripts/training/run_recipe.py) names
    the recipe the run loads: a recipe file read beside it, with no `::NAME` of its own, is
    read again at that function (as FILE::NAME reads it). Returns {index: (reading, format)} for
    the inputs read again; a named recipe the file does not hold is a warning."""
    named = [
        (r.unused[ON_RECIPE], getattr(r, "recipe_origin", None))
        for r in readings
        if r.unused.get(ON_RECIPE) not in (None, UNKNOWN_RECIPE)
    ]
    again: dict[int, tuple[Reading, str]] = {}
    for index, (item, reading) in enumerate(zip(items, readings, strict=True)):
        choices = getattr(reading, "recipe_choices", None)
        if choices is None:
            continue
        for name, origin in named:
            by = origin.describe() if origin is not None else "the launch command"
            if name == reading.recipe_read:  # type: ignore[attr-defined]
                pass
            elif reading.recipe_named:  # type: ignore[attr-defined]
                reading.warnings.append(
                    f"{item} reads recipe {reading.recipe_read}, {by} names {name}: the run "  # type: ignore[attr-defined]
                    "loads the named one; these values are the file's"
                )
                continue
            elif name in choices:
                reading, what = read(f"{item}::{name}")
                reading.warnings.insert(0, f"{item}: read {name}, the recipe {by} names")
                again[index] = (reading, what)
            else:
                reading.warnings.append(
                    f"{by} names recipe {name}, which {item} does not hold (its recipes: "
                    f"{', '.join(choices)}): {reading.recipe_read} is read, not the run's recipe"  # type: ignore[attr-defined]
                )
                continue
            for other in readings:  # the recipe the overrides apply on is read: its keys are
                if other.unused.get(ON_RECIPE) == name:  # read, not left to it
                    del other.unused[ON_RECIPE]
                    other.applies_on = name  # type: ignore[attr-defined]
    return again


def from_the_checkout(items: list[str], readings: list[Reading]) -> list[str]:
    """The recipe file a launch command's `--recipe NAME` loads when no recipe file is given:
    the file of Megatron-Bridge's src/megatron/bridge/recipes that defines NAME, in the checkout
    the command runs from (the working folder, or one above a launch script given), as
    `FILE::NAME`. None found: nothing (the overrides stay on an unread recipe, said so)."""
    if any(getattr(r, "recipe_choices", None) is not None for r in readings):
        return []
    names = {
        r.unused[ON_RECIPE]
        for r in readings
        if r.unused.get(ON_RECIPE) not in (None, UNKNOWN_RECIPE)
    }
    found: list[str] = []
    for name in sorted(n for n in names if isinstance(n, str) and n.isidentifier()):
        define = re.compile(rf"^def {re.escape(name)}\(", re.M)
        for root in _checkout_roots(items):
            hits = [
                f
                for f in sorted((root / "src" / "megatron" / "bridge" / "recipes").rglob("*.py"))
                if define.search(f.read_text(encoding="utf-8", errors="replace"))
            ]
            if hits:
                found.append(f"{hits[0]}::{name}")
                break
    return found


def _is_file(item: str) -> bool:
    try:  # (a launch command given as one input may be too long to be a path)
        return Path(item).is_file()
    except OSError:
        return False


def _checkout_roots(items: list[str]) -> list[Path]:
    """The working folder and the folders above each input file, that hold a Bridge checkout's
    recipes (src/megatron/bridge/recipes)."""
    starts = [Path.cwd()] + [Path(i).resolve().parent for i in items if _is_file(i)]
    roots: list[Path] = []
    for start in starts:
        for folder in (start, *start.parents):
            if (folder / "src" / "megatron" / "bridge" / "recipes").is_dir():
                if folder not in roots:
                    roots.append(folder)
                break
    return roots


def apply_on_the_read_recipe(readings: list[Reading]) -> list[Reading]:
    """An overrides file that names no recipe (`model.seq_length=8192 ...`, a YAML of
    overrides) read beside a recipe file applies on top of that recipe, as run_recipe.py
    applies its overrides to the recipe it loads: what the overrides leave out is the recipe's
    (read), not "set by an unknown recipe" (then assumed). Returns the readings in the order
    they apply (merge: the later wins): such overrides given before the recipe move after it."""
    at = next((i for i, r in enumerate(readings) if getattr(r, "recipe_read", None)), None)
    if at is None:
        return list(readings)
    name = readings[at].recipe_read  # type: ignore[attr-defined]
    on_it = [
        i
        for i, r in enumerate(readings)
        if r.unused.get(ON_RECIPE) == UNKNOWN_RECIPE or getattr(r, "applies_on", None) == name
    ]
    for i in on_it:
        r = readings[i]
        r.unused.pop(ON_RECIPE, None)
        r.warnings = [
            w.replace(YAML_ON_RECIPE, f"a YAML of overrides, applied on top of recipe {name}")
            for w in r.warnings
        ]
    # given first, applied after the recipe all the same (run_recipe.py loads the recipe,
    # then applies its overrides)
    before = [i for i in on_it if i < at]
    order = [i for i in range(len(readings)) if i not in before]
    where = order.index(at) + 1
    order[where:where] = before
    return [readings[i] for i in order]
