"""Line cleaning: ANSI codes, rank and launcher prefixes, timestamps and logger heads taken off a
line of a log or a paste, and the shape of a dotted Python name.
"""

from __future__ import annotations

import re

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


_DOTTED = r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"
