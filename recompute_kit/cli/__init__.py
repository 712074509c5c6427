"""The `recompute-kit` command. Thin: every decision lives in the package.

Human tables by default, `--json` for one JSON document on stdout. Exit 0 when the command did
its job, 1 for invalid input or an impossible goal (one line on stderr, no traceback), 2 for a
usage error.
"""

from .parser import build_parser, main

__all__ = ["build_parser", "main"]
