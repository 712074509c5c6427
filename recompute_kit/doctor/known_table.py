"""The known-problems table (doctor/known_problems.yaml) as rows, parsed once per process: the
rule engine (rules/known_problems.py) and the evidence scan of bare lines
(evidence/known_lines.py) read the same parse."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

TABLE = "known_problems.yaml"


@functools.cache
def rows() -> tuple[dict[str, Any], ...]:
    """The shipped table's rows (read-only by convention: callers copy what they change)."""
    text = resources.files("recompute_kit.doctor").joinpath(TABLE).read_text("utf-8")
    return tuple(parse(text))


def parse(text: str) -> list[dict[str, Any]]:
    # SafeLoader's C build where PyYAML has one (the same safe constructors, 7x faster: the
    # table is read whenever the doctor starts)
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or []
