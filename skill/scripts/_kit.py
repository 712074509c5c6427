"""Shared helpers for the skill's scripts (standard library only).

The skill folder is the recompute-kit source tree (SKILL.md, pyproject.toml, recompute_kit/), so
the kit runs from here with any interpreter that has torch and PyYAML. Which interpreter, in order:

1. ``$RECOMPUTE_KIT_PYTHON`` (an interpreter you choose, e.g. your training environment's);
2. the bootstrap venv: ``$RECOMPUTE_KIT_VENV`` or ``<skill>/.venv`` (made by bootstrap.py);
3. the interpreter running this script, if torch and yaml are importable from it.

The kit is always imported from this skill folder (it goes first on sys.path), never from a
different copy installed elsewhere, and never from the current directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

# `plan.py --help | head`: a reader that closes the pipe ends the script quietly, as it ends
# any shell tool (Python's default turns SIGPIPE into a BrokenPipeError traceback)
if hasattr(signal, "SIGPIPE"):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parents[1]  # the skill folder: SKILL.md, pyproject.toml, recompute_kit/

BOOTSTRAP_HINT = (
    f"run `python3 {SCRIPTS / 'bootstrap.py'}` first (it finds or creates an interpreter with "
    "torch), or set RECOMPUTE_KIT_PYTHON to a python that has torch and PyYAML"
)

# Runs recompute_kit.cli.main() from ROOT with the remaining argv; sys.path[0] would otherwise be
# the current directory ('' for -c), where another recompute_kit/ could shadow ours.
_RUN_CLI = (
    "import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; "
    "sys.argv[0] = 'recompute-kit'; "
    "from recompute_kit.cli import main; raise SystemExit(main(sys.argv[1:]))"
)


def venv_dir() -> Path:
    return Path(os.environ.get("RECOMPUTE_KIT_VENV") or ROOT / ".venv").expanduser()


def venv_python(venv: Path) -> Path:
    if os.name == "nt":
        return venv / "Scripts" / "python.exe"
    return venv / "bin" / "python"


def find_python() -> tuple[str | None, str]:
    """(interpreter, where it came from), or (None, reason) when none is usable."""
    explicit = os.environ.get("RECOMPUTE_KIT_PYTHON")
    if explicit:
        return explicit, "RECOMPUTE_KIT_PYTHON"
    venv_py = venv_python(venv_dir())
    if venv_py.exists():
        return str(venv_py), f"venv {venv_dir()}"
    if all(importlib.util.find_spec(m) is not None for m in ("torch", "yaml")):
        return sys.executable, "current python"
    return None, "no interpreter with torch and PyYAML found"


def cli_argv(python: str, args: list[str]) -> list[str]:
    """The argv that runs `recompute-kit ARGS` from this skill folder with `python`."""
    return [python, "-c", _RUN_CLI, str(ROOT), *args]


def run_cli(
    args: list[str], timeout: float | None = None, input_text: str | None = None
) -> dict[str, Any]:
    """Run `recompute-kit ARGS` (stdin: `input_text`); returns rc, stdout, stderr, python and
    the command. Never raises for the command's own failures: rc None plus "error" when it could
    not run at all."""
    python, source = find_python()
    if python is None:
        return {"rc": None, "error": f"{source}; {BOOTSTRAP_HINT}", "python": None}
    argv = cli_argv(python, args)
    try:
        proc = subprocess.run(
            argv,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError:
        error = f"interpreter not found: {python} ({source})"
        return {"rc": None, "error": error, "python": python}
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": f"timed out after {timeout} s", "python": python}
    result = {
        "rc": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
        "python": python,
        "python_source": source,
        "command": ["recompute-kit", *args],
    }
    if proc.returncode != 0 and "No module named" in proc.stderr:
        result["error"] = f"{_last_line(proc.stderr)} (python: {python}); {BOOTSTRAP_HINT}"
    return result


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def cli_error(result: dict[str, Any]) -> str:
    """One line saying why a CLI run failed."""
    if result.get("error"):
        return result["error"]
    line = _last_line(result.get("stderr", ""))
    return line.removeprefix("recompute-kit: error: ") or f"exit status {result.get('rc')}"


def emit(document: dict[str, Any], rc: int = 0) -> int:
    """Print one JSON document on stdout; return the exit status to use."""
    try:
        json.dump(document, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader (e.g. head) closed the pipe: stop quietly
        sys.stderr.close()
    return rc
