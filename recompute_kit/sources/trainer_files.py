"""Where a value of a Hugging Face Trainer YAML or DeepSpeed JSON sits (its line, its key path)
and the typed reading of one value, shared by the trainer readers (hf_trainer.py,
deepspeed_json.py): a value of the wrong type is one line naming the file and the key."""

from __future__ import annotations

import re
from typing import Any

from ..config import ConfigError
from .reading import FROM_ARGUMENT, FROM_FILE, Origin


def _yaml_line(text: str, key: str) -> int | None:
    match = re.search(rf"^{re.escape(key)}\s*:", text, re.M)
    return text.count("\n", 0, match.start()) + 1 if match else None


def _json_line(text: str, keys: tuple[str, ...]) -> int | None:
    """Line of the last of `keys`, each searched after the line of the one before."""
    start = 0
    for key in keys:
        match = re.compile(rf'"{re.escape(key)}"\s*:').search(text, start)
        if not match:
            return None
        start = match.end()
    return text.count("\n", 0, start) + 1


class _Src:
    def __init__(self, text: str, path: str, kind: str, overrides: dict | None = None) -> None:
        self.text, self.path, self.kind = text, path, kind
        # top-level key -> the key=value override (nemo_rl_overrides.Override) that set it
        self.overrides = overrides or {}

    def origin(self, *keys: str, note: str = "") -> Origin:
        o = self.overrides.get(keys[0])
        if o is not None:  # as the NeMo-RL overrides are said: where, and as written
            on = f"override of {self.path}" + (f"; {note}" if note else "")
            return Origin(FROM_FILE if o.place else FROM_ARGUMENT, o.where, o.written, on)
        if self.kind == "json":
            line = _json_line(self.text, keys)
            key = ".".join(keys)
        else:
            line = _yaml_line(self.text, keys[0])
            key = keys[0]
        return Origin("file", f"{self.path}:{line}" if line else self.path, key, note)


_TRUE_WORDS = ("yes", "true", "t", "y", "1")  # transformers' string_to_bool
_FALSE_WORDS = ("no", "false", "f", "n", "0")


def _bool(src: _Src, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE_WORDS + _FALSE_WORDS:
        return value.lower() in _TRUE_WORDS  # a command line's `--bf16 yes`
    raise ConfigError(f"{src.path}: {key} = {value!r} is not true or false")


def _int(src: _Src, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{src.path}: {key} = {value!r} is not an integer >= {minimum}")
    return value


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value.lower() == "auto"
