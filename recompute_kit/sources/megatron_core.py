"""(stub: being written)"""

from __future__ import annotations

from .reading import Reading

FRAMEWORKS: tuple[str, ...] = ()


def sniff(text: str, path: str) -> int:
    return 0


def read(text: str, path: str) -> Reading:
    raise NotImplementedError


def apply_defaults(reading: Reading) -> None:
    raise NotImplementedError


def key_for(field: str) -> str:
    return field
