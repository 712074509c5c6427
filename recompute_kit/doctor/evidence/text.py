"""Line cleaning (rank prefixes, timestamps, ANSI codes), sizes and numbers as tools print them,
and the shape of an exception line.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import IO

from .schema import MAX_LINE_CHARS

# --------------------------------------------------------------------------------------------
# Line cleaning
# --------------------------------------------------------------------------------------------

_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_PREFIX_RE = re.compile(
    r"\s*(?:"
    r"\[rank(?P<rank>\d+)\]:"  # torch.distributed: [rank3]:
    r"|\[(?P<role>[A-Za-z_]+)(?P<local>\d+)\]:"  # torchrun --tee: [default0]:
    r"|(?P<task>\d{1,5}):(?=\s|$)"  # srun --label: " 0: "
    r"|\d{1,3}(?:\.\d{1,3}){3}:(?=\s|$)"  # pdsh / DeepSpeed launcher: "192.168.0.32: "
    r"|\[?(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?"
    r"|\[NeMo (?P<level>[A-Z]) [^\]]*\]"  # [NeMo I 2025-01-01 12:00:00 file:12]
    r"|(?P<quote>>{1,3})(?=[ \t]|$)"  # GitHub / mail quote markers "> ", "> > ", ">> "
    r")[ \t]?"
)
_PREFIX_FIRST = frozenset(" \t[0123456789>")
# What a logging format puts between the timestamp and the message: Python logging's
# "%(asctime)s - %(name)s - %(levelname)s - ", loguru's "| ERROR    | mod:func:12 - ",
# "[ERROR] ", "ERROR " (read only right after a timestamp).
_LEVELS = r"DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
_LOGGER_RE = re.compile(
    r"\s*(?:[-|]\s*)?(?:[\w.<>-]{1,60}\s[-|]\s)?\[?(?P<level>" + _LEVELS + r")\]?"
    r"(?:\s*[-|:]\s(?:[\w.<>-]{1,60}:[\w.<>-]{1,60}:\d{1,6}\s-\s)?|\s+(?!\d\d-\d\d\s))"
)  # (vLLM's own "WARNING 07-29 15:39:27 [file.py:17] " is left to the log parser)


def _unbacktick(line: str) -> str:
    """A whole line quoted as inline code in Markdown (`` `ValueError: ...` ``) without its
    backticks; a code fence or a line with code inside it is left as it is."""
    s = line.strip()
    if len(s) > 2 and s[0] == "`" == s[-1] and "`" not in s[1:-1]:
        return s[1:-1]
    return line


def _strip_prefixes(line: str) -> tuple[str, int | None, str, str]:
    """Remove ANSI codes and leading rank/timestamp prefixes.

    Returns (text, rank, stamp, level): the rank from `[rankN]:` (or a launcher's
    `[defaultN]:` / srun's `N:` when there is no `[rankN]:`), the timestamp removed ("" when
    none: a stamp starts a new log record unless the line before had the very same stamp) and
    the log level letter ("W" for warnings: NeMo's `[NeMo W ...]`, a logger's WARNING)."""
    if "\x1b" in line:
        line = _ANSI_RE.sub("", line)
    if "`" in line:
        line = _unbacktick(line)
    if not line or line[0] not in _PREFIX_FIRST:
        return line, None, "", ""
    rank: int | None = None
    other_rank: int | None = None
    stamp = ""
    level = ""
    for _ in range(8):
        m = _PREFIX_RE.match(line)
        if m is None:
            break
        if m.group("rank") is not None:
            rank = int(m.group("rank"))
        elif m.group("local") is not None:
            other_rank = int(m.group("local"))
        elif m.group("task") is not None:
            if other_rank is None:
                other_rank = int(m.group("task"))
        elif m.group("ts") is not None:
            stamp = m.group("ts")
        elif m.group("level") is not None:
            level = m.group("level")
            stamp = m.group(0).strip()
        line = line[m.end() :]
        if not line:
            break
        if m.group("ts") is not None and (lm := _LOGGER_RE.match(line)) is not None:
            level = level or ("W" if lm.group("level").startswith("WARN") else "")
            line = line[lm.end() :]
            if not line:
                break
    return line, rank if rank is not None else other_rank, stamp, level


def clean_line(line: str) -> str:
    """A log line without ANSI escape codes, rank prefixes (`[rank3]:`, `[default0]:`, srun's
    ` 0: `), leading timestamps (`[2025-01-01 12:00:00,123]`, `2025-01-01 12:00:00.123`) and
    NeMo's `[NeMo I ...]` prefix. Indentation after a prefix is kept."""
    return _strip_prefixes(line)[0]


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


_DOTTED = r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"
_EXC_SEARCH_RE = re.compile(
    rf"(?:^|(?<=[\s:(]))({_DOTTED}(?:Error|Exception|Interrupt|Failure|Exit)):\s?(.*)$"
)


def _iter_file_lines(raw: IO[bytes], chunk_size: int = 1 << 20) -> Iterator[str]:
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
