"""Evaluate the simple expressions of a Python recipe without running it: arithmetic, lists and
dicts built from literals (`["decoder"] * 8 + last_layer`), comparisons, `a or b`, `x if c else
y`, subscripts and a few pure builtins (`float`, `int`, `getattr`, `min`, ...).

`fold(node, value)` computes one node from the values of its children, which the caller's
`value(child)` gives (names, attributes and calls are the caller's); anything else, or any value
too large to build, is `Unresolved`. Nothing is imported, called or executed.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from .bridge import Unresolved

# A result larger than this (items or characters) is not built: a recipe's lists are small.
_MAX_ITEMS = 100_000

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_STR_METHODS = frozenset(
    {"lower", "upper", "casefold", "strip", "lstrip", "rstrip", "startswith", "endswith"}
)
_BUILTINS: dict[str, Callable[..., Any]] = {
    "float": float,
    "int": int,
    "bool": bool,
    "str": str,
    "len": len,
    "min": min,
    "max": max,
    "abs": abs,
    "round": round,
    "list": list,
    "tuple": tuple,
}


def _size(v: Any) -> int:
    return len(v) if isinstance(v, (str, list, tuple, dict)) else 0


def _too_big(op: type, a: Any, b: Any) -> bool:
    if op is ast.Mult:
        n, seq = (a, b) if isinstance(a, int) else (b, a)
        return isinstance(n, int) and _size(seq) * max(n, 0) > _MAX_ITEMS
    if op is ast.Pow:
        return not isinstance(b, (int, float)) or abs(b) > 64 or abs(a) > 2**64
    if op is ast.Add:
        return _size(a) + _size(b) > _MAX_ITEMS
    return False


def _hashable(v: Any) -> Any:
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def fold(node: ast.AST, value: Callable[[ast.AST], Any]) -> Any:
    """The value of `node` from its children's (`value(child)`), or Unresolved."""
    try:
        return _fold(node, value)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError):
        return Unresolved(ast.unparse(node))


def _fold(node: ast.AST, value: Callable[[ast.AST], Any]) -> Any:
    unresolved = Unresolved(ast.unparse(node))

    def parts(nodes: list[ast.expr]) -> list[Any] | None:
        out = []
        for n in nodes:
            if isinstance(n, ast.Starred):
                return None
            v = value(n)
            if isinstance(v, Unresolved):
                return None
            out.append(v)
        return out

    if isinstance(node, (ast.List, ast.Tuple)):
        items = parts(node.elts)
        if items is None:
            return unresolved
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):  # {**other}
            return unresolved
        keys, vals = parts(node.keys), parts(node.values)  # type: ignore[arg-type]
        if keys is None or vals is None:
            return unresolved
        return {_hashable(k): v for k, v in zip(keys, vals, strict=True)}
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = value(node.left), value(node.right)
        if isinstance(a, Unresolved) or isinstance(b, Unresolved):
            return unresolved
        if _too_big(type(node.op), a, b):
            return unresolved
        return _BINARY[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp):
        v = value(node.operand)
        if isinstance(v, Unresolved):
            return unresolved
        if isinstance(node.op, ast.Not):
            return not v
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return +v
        return unresolved
    if isinstance(node, ast.BoolOp):  # Python's own short-circuit: the deciding operand's value
        v: Any = None
        for operand in node.values:
            v = value(operand)
            if isinstance(v, Unresolved):
                return unresolved
            if bool(v) == isinstance(node.op, ast.Or):
                return v
        return v
    if isinstance(node, ast.Compare):
        left = value(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = value(right_node)
            if isinstance(left, Unresolved) or isinstance(right, Unresolved):
                return unresolved
            if isinstance(right, dict | list) and isinstance(op, (ast.In, ast.NotIn)):
                left = _hashable(left)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        test = value(node.test)
        if isinstance(test, Unresolved):
            return unresolved
        return value(node.body if test else node.orelse)
    if isinstance(node, ast.Subscript):
        base, index = value(node.value), value(node.slice)
        if isinstance(base, Unresolved) or isinstance(index, Unresolved):
            return unresolved
        return base[_hashable(index) if isinstance(base, dict) else index]
    if isinstance(node, ast.Slice):
        bounds = [None if n is None else value(n) for n in (node.lower, node.upper, node.step)]
        if any(isinstance(b, Unresolved) for b in bounds):
            return unresolved
        return slice(*bounds)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _BUILTINS.get(node.func.id)
        args = parts(node.args)
        if fn is None or args is None:
            return unresolved
        return fn(*args)
    if (  # a known string's own method: `peft_scheme.lower() == 'none'` in NeMo 2.0 recipes
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _STR_METHODS
        and not node.keywords
    ):
        base, args = value(node.func.value), parts(node.args)
        if not isinstance(base, str) or args is None or not all(isinstance(a, str) for a in args):
            return unresolved
        return getattr(base, node.func.attr)(*args)
    return unresolved
