#!/usr/bin/env python3
"""Run any `recompute-kit` subcommand from this skill folder, with the bootstrapped interpreter.

  rk.py SUBCOMMAND [ARGS...]      e.g. rk.py estimate --model llama3-70b --json

Subcommands: read, models, presets, validate, verify, estimate, measure, plan, ablate, doctor,
rules, notebook
(`rk.py SUBCOMMAND --help` for each). Add --json for one JSON document on stdout (every
subcommand has it; `rules` also has --markdown). stdout, stderr and the exit status are the
command's own: 0 done, 1 invalid input or impossible goal (one line on stderr), 2 usage error.
If no interpreter can run the kit, prints {"ok": false, "error": ...} and exits 1.
"""

from __future__ import annotations

import subprocess
import sys

from _kit import cli_argv, emit, find_python

SUBCOMMANDS = (
    "read",
    "models",
    "presets",
    "validate",
    "verify",
    "estimate",
    "measure",
    "plan",
    "ablate",
    "doctor",
    "rules",
    "notebook",
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args else 2
    if args[0] not in SUBCOMMANDS:
        print(
            f"rk.py: unknown subcommand {args[0]!r}; choose from {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return 2
    python, source = find_python()
    if python is None:
        from _kit import BOOTSTRAP_HINT

        return emit({"ok": False, "error": f"{source}; {BOOTSTRAP_HINT}"}, 1)
    return subprocess.run(cli_argv(python, args), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
