"""One reader for every command: the same real file gives the same shape and layout in `read`,
`validate`, `estimate`, `plan`, `measure --fake` and `doctor` (through their JSON)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "corpus"
# One real file per family of formats, each with a model shape the reader finds offline.
FILES = [
    "megatron_lm/blind_ft_moe_mla_selective_recompute.yaml",
    "megatron_lm/pretrain_gpt_distributed_with_mp.sh",
    "nemo/launcher_llama3_8b.yaml",
    "nemo_rl/grpo_math_8B_megatron.yaml",
    "bridge/deepseek_v3_pretrain_h100_fp8_sc_v1.yaml",
    "torchtitan/llama3_70b.toml",
    "hf_trainer/blind_llama3_fp8_deepspeed_sft.yaml",
]
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size")
LAYOUT = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "sequence_parallel",
    "data_parallel_size",
    "use_distributed_optimizer",
)


def run(*args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "recompute_kit.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", FILES)
def test_every_command_reads_the_same(name):
    path = str(CORPUS / name)
    read = run("read", path)
    want = {k: read["config"][k] for k in (*SHAPE, *LAYOUT)}
    assert read["sources"]["num_layers"]["from"] in ("file", "model")

    validate = run("validate", path)
    assert {k: validate["normalized"][k] for k in want} == want
    for command in (["estimate"], ["plan", "--gpu-memory-gb", "79"], ["measure", "--fake"]):
        doc = run(*command, "--config", path)
        assert {k: doc["read"]["config"][k] for k in want} == want, command
        layout = {k: doc["layout"][k] for k in LAYOUT if k in doc.get("layout", {})}
        assert layout == {k: want[k] for k in layout}, command
    doctor = run("doctor", "--config", path)
    assert {k: doctor["evidence"]["read"]["config"][k] for k in want} == want


def test_json_carries_values_the_reader_could_not_resolve():
    # A recipe sets a key from a variable (`cfg.model.seq_length = seq_length`): the reader
    # leaves it unresolved, and every command's JSON still writes (the text of the value).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recompute_kit.cli",
            "plan",
            "--config",
            str(CORPUS / "bridge" / "bridge_llama3_8b.py"),
            "--gpu",
            "h100-80gb",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert any("<unresolved" in json.dumps(v) for v in doc["read"]["unused"].values())


def test_read_takes_the_layout_flags_the_other_commands_take():
    # a skill trial: `read llama3_8b.toml --dp 8` was "unrecognized arguments" while estimate,
    # plan and doctor take --dp; the world size a torchtitan TOML leaves to the launcher
    path = str(CORPUS / "torchtitan" / "llama3_70b.toml")
    doc = run("read", path, "--dp", "8", "--tp", "8")
    assert (doc["config"]["data_parallel_size"], doc["config"]["tensor_model_parallel_size"]) == (
        8,
        8,
    )
    assert doc["sources"]["data_parallel_size"]["from"] == "argument"
    assert not [w for w in doc["warnings"] if w.startswith("assumed: data_parallel_size")]
    alone = run("read", path)
    assert [w for w in alone["warnings"] if w.startswith("assumed: data_parallel_size")]
