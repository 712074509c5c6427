"""Sizes and numbers as tools print them, and the shape of an exception line. Line cleaning (rank
prefixes, timestamps, ANSI codes) lives in `recompute_kit.sources.text`; `clean_line` is
re-exported here.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import IO

from ...sources.text import _DOTTED
from ...sources.text import clean_line as clean_line
from .schema import MAX_LINE_CHARS

# --------------------------------------------------------------------------------------------
# Sizes and numbers
# --------------------------------------------------------------------------------------------

_UNIT_BYTES: dict[str, int] = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "pib": 1 << 50,
    "eib": 1 << 60,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "eb": 10**18,
}
_SIZE_RE = re.compile(
    r"\s*([-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]+)?(?![A-Za-z])"
)
_NUMBER_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)\b", re.I)


def parse_size(text: str, unit: str | None = None) -> int | None:
    """Bytes from a size: "12.50 MiB", "10.92 GiB", "512 bytes", "1.5 KiB", "3 GB" (SI: 1e9).

    A bare number takes `unit` ("58.8" with unit "GB" is 58.8e9); without one it is None, as is
    anything that is not a size. Binary units (KiB, MiB, GiB) are powers of 1024, SI units
    (KB, MB, GB) powers of 1000. The result is rounded to the nearest byte."""
    if not isinstance(text, str):
        return None
    m = _SIZE_RE.match(text)
    if m is None:
        return None
    name = (m.group(2) or unit or "").strip().lower()
    if name not in _UNIT_BYTES:
        return None
    try:
        value = Decimal(m.group(1).replace(",", "")) * _UNIT_BYTES[name]
    except (InvalidOperation, ValueError):
        return None
    if not value.is_finite() or value < 0:
        return None
    return int(value.to_integral_value())


def _size(number: str, unit: str) -> int | None:
    return parse_size(f"{number} {unit}")


def _float(text: str | None) -> float | None:
    """The first number in `text` (`~704` -> 704.0, `1.818812E+00` -> 1.818812)."""
    if not text:
        return None
    try:
        return float(text)  # the common case: " 5361.6 " (float() ignores the spaces)
    except ValueError:
        pass
    m = _NUMBER_RE.search(text)
    if m is None:
        return None
    try:
        return float(m.group(0))
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    value = _float(text)
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return int(value)


def _compact(text: str) -> str:
    """`text` without any whitespace (hard-wrapped pastes lose or add spaces at the wraps)."""
    return "".join(text.split())


_EXC_SEARCH_RE = re.compile(
    rf"(?:^|(?<=[\s:(]))({_DOTTED}(?:Error|Exception|Interrupt|Failure|Exit)):\s?(.*)$"
)


def _iter_file_lines(raw: IO[bytes], chunk_size: int = 1 << 18) -> Iterator[str]:
    """Decoded lines of a binary stream, read in chunks; \\r and \\r\\n end lines too. A line
    longer than MAX_LINE_CHARS is cut and the rest of it skipped, so memory stays bounded."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tail = ""
    held_cr = False
    skipping = False
    while True:
        block = raw.read(chunk_size)
        text = decoder.decode(block, final=not block)
        if held_cr:
            text = "\r" + text
            held_cr = False
        if block and text.endswith("\r"):
            text, held_cr = text[:-1], True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if skipping:
            cut = text.find("\n")
            if cut < 0:
                text = ""
            else:
                text, skipping = text[cut + 1 :], False
        lines = (tail + text).split("\n")
        tail = lines.pop()
        for line in lines:
            yield line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS]
        if len(tail) > MAX_LINE_CHARS:
            yield tail[:MAX_LINE_CHARS]
            tail, skipping = "", True
        if not block:
            break
    if tail:
        yield tail
