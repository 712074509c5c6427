"""`recompute_kit.sources.fragments` (pasted configs) and `arg_dump` (Megatron's argument dump):
below the doctor, and reading a dump as the doctor's log parser does."""

import os
import subprocess
import sys
from pathlib import Path

from recompute_kit.doctor.evidence import parse_config_with_notes, parse_log
from recompute_kit.sources.arg_dump import parse_arg_dump

DUMP = """\
[rank0]: using world size: 16, data-parallel size: 2, context-parallel size: 1, \
tensor-model-parallel size: 4, pipeline-model-parallel size: 2
[rank0]: ------------------------ arguments ------------------------
[rank0]:   hidden_size ..................................... 5120
[rank0]:   recompute_granularity ........................... full
[rank0]:   recompute_modules ............................... None
[rank0]:   num_experts ..................................... 8
[rank0]:   data_parallel_size .............................. 4
[rank0]:   recompute_method  uniform
[rank0]: -------------------- end of arguments ---------------------
"""


def test_sources_readers_import_nothing_above_them():
    code = (
        "import sys, recompute_kit.sources.fragments, recompute_kit.sources.arg_dump;"
        "print(sorted(m for m in sys.modules if m.startswith('recompute_kit.')))"
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    for above in ("doctor", "memory", "plan", "cli"):
        assert f"'recompute_kit.{above}" not in out, out


def test_arg_dump_reads_as_the_log_parser():
    flat = parse_arg_dump(DUMP)
    assert flat == parse_log(DUMP).config
    assert flat["hidden_size"] == 5120
    assert flat["num_moe_experts"] == 8
    assert flat["recompute_method"] == "uniform"  # dots lost inside the section
    assert flat["data_parallel_size"] == 4  # the argument wins over the world-size line
    assert flat["tensor_model_parallel_size"] == 4
    config, notes = parse_config_with_notes(DUMP)
    assert config == flat
    assert notes == ["read as a Megatron argument dump"]


def test_a_flag_named_in_a_sentence_is_not_a_setting():
    # Megatron-LM's own exit message (megatron/training/arguments.py) names flags in prose:
    # "--recompute-granularity and" is not recompute_granularity = "and"
    text = (
        "--checkpoint-activations is no longer valid, use --recompute-activations, or, for "
        "more control, --recompute-granularity and --recompute-method."
    )
    assert parse_config_with_notes(text)[0] == {}
    assert parse_config_with_notes("--recompute-granularity full --recompute-method uniform")[
        0
    ] == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
    }
