"""The analytic commands (`estimate`, `plan`, `validate`, `doctor` without a model run) never
import torch and start fast: measured in a fresh interpreter, as a user runs them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
# CPU seconds of the whole command in a fresh process, interpreter start excluded. CPU time,
# not wall time: a loaded machine stretches wall time, not the work done. torch alone costs
# over 1 s here. The doctor compiles its rule catalog's ~450 regular expressions and reads the
# known-problems table at start (about 0.2 s on this 2-core machine; another process beside
# it adds up to 0.05): its own budget.
BUDGET_S = 0.2
DOCTOR_BUDGET_S = 0.3
PROBE = """
import io, json, sys, time, contextlib
start = time.process_time()
from recompute_kit.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    rc = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "numpy", "matplotlib") if m in sys.modules)
print(json.dumps({"rc": rc, "cpu_s": time.process_time() - start, "heavy": heavy}))
"""


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text("num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 32\n")
    return path


COMMANDS = {
    "validate": ["validate", "{config}"],
    "estimate": ["estimate", "--model", "llama3-8b", "--recompute", "none", "selective"],
    "plan": ["plan", "--model", "llama3-8b", "--tp", "4", "--gpu-memory-gb", "80"],
    "doctor": ["doctor", "--log", str(DATA / "rules" / "oom-pt-16417-comment.txt")],
}


@pytest.mark.parametrize("command", ["validate", "estimate", "plan", "doctor"])
def test_analytic_commands_never_import_torch_and_start_fast(command, tmp_path):
    args = [a.format(config=config_file(tmp_path)) for a in COMMANDS[command]]
    # Bytecode as a user has it: compiled once into a private cache, then measured (CI sets
    # PYTHONDONTWRITEBYTECODE, which would make every run recompile the whole package).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    # the first run compiles the bytecode; the least CPU of the next three is the command's
    # own (another process on the 2 cores inflates a single reading)
    results = []
    for _ in range(4):
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result = min(results[1:], key=lambda r: r["cpu_s"])
    assert result["rc"] == 0
    assert result["heavy"] == [], f"{command} imported {result['heavy']}"
    budget = DOCTOR_BUDGET_S if command == "doctor" else BUDGET_S
    assert result["cpu_s"] < budget, f"{command} took {result['cpu_s']:.3f} s of CPU"


def test_the_cli_module_itself_imports_no_torch():
    """The CLI imports torch-dependent modules only inside the commands that run a model."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, recompute_kit.cli; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "False", proc.stderr
