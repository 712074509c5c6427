"""Megatron's argument dump (`------------------------ arguments ------------------------`, then
`  hidden_size ..................................... 5120` a line) and its `using world size: 8,
data-parallel size: 8, ...` line, to flat Megatron-Core keys.

A log parser reads these lines one at a time (`arg_line`, `args_header`,
`world_sizes`) among the other records of a log; `parse_arg_dump` reads a whole pasted dump.
"""

from __future__ import annotations

import re
from typing import Any

from .text import _strip_prefixes
from .values import _assign, _convert_value, _finalize_config

_ARG_RE = re.compile(r"^(\s*)([A-Za-z_][\w.-]*) (\.+)(?: (.*))?$")
_ARG_LONG_RE = re.compile(r"^\s+([A-Za-z_][\w.-]*)\s\s+(\S.*)$")
_ARGS_HEADER_RE = re.compile(r"^-{3,} (.+?) -{3,}\s*$")
_WORLD_RE = re.compile(r"(?<![\w-])([\w-]+) size: (\d+)")
_WORLD_KEYS = {
    "world": "world_size",
    "data-parallel": "data_parallel_size",
    "context-parallel": "context_parallel_size",
    "tensor-model-parallel": "tensor_model_parallel_size",
    "pipeline-model-parallel": "pipeline_model_parallel_size",
    "expert-model-parallel": "expert_model_parallel_size",
}
_MAX_LINE_CHARS = 1 << 16  # longer lines are cut, as the log parser cuts them


def arg_line(text: str, in_args: bool) -> tuple[str, Any] | None:
    """(key, typed value) of a line of the dump, `  hidden_size ........ 5120`; inside the
    dump's section (`in_args`) a line whose dots were lost, `  hidden_size   5120`, too. None
    when `text` is no such line."""
    m = _ARG_RE.match(text)
    if m is not None:
        indent, key, dots, value = m.groups()
        if not (indent or len(dots) >= 3):
            return None
        value = (value or "").rstrip()
    elif in_args:
        m2 = _ARG_LONG_RE.match(text)
        if m2 is None:
            return None
        key, value = m2.group(1), m2.group(2).rstrip()
    else:
        return None
    return key, _convert_value(value or "")


def args_header(text: str) -> bool | None:
    """For a `---- title ----` line, whether the lines after it are the dump's arguments
    (`arguments`: True; `end of arguments` or another title: False); None for other lines."""
    header = _ARGS_HEADER_RE.match(text.strip())
    if header is None:
        return None
    title = header.group(1)
    return "argument" in title and not title.startswith("end of")


def world_sizes(text: str) -> dict[str, int]:
    """The parallel sizes of Megatron's `using world size: 8, data-parallel size: 8, ...`
    line, as Megatron-Core keys (the first of a name counts)."""
    out: dict[str, int] = {}
    for name, value in _WORLD_RE.findall(text):
        key = _WORLD_KEYS.get(name)
        if key:
            out.setdefault(key, int(value))
    return out


def parse_arg_dump(text: str) -> dict[str, Any]:
    """Flat Megatron-Core keys from a pasted argument dump (rank prefixes, timestamps and ANSI
    codes taken off each line): every argument line, and the sizes of a `using world size`
    line where no argument gives them."""
    config: dict[str, Any] = {}
    in_args = False
    for raw in text.splitlines():
        text_line = _strip_prefixes(raw[:_MAX_LINE_CHARS])[0]
        if not text_line or text_line.isspace():
            continue
        if " ." in text_line or in_args:
            pair = arg_line(text_line, in_args)
            if pair is not None:
                _assign(config, *pair)
                continue
        if "---" in text_line and (opens := args_header(text_line)) is not None:
            in_args = opens
            continue
        if "using world size" in text_line:
            for key, value in world_sizes(text_line).items():
                config.setdefault(key, value)
    return _finalize_config(config) if config else config
