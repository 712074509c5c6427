"""What `plan` and `estimate` print: the rendered config carries the layout the fit is for,
and the text names the loss and the overheads the numbers include.

Real inputs (verbatim, sources in their .expect.yaml): torchtitan's llama3_8b.toml
(pytorch/torchtitan torchtitan/models/llama3/train_configs/llama3_8b.toml) and Megatron-LM's
examples/mixtral/train_mixtral_8x7b_distributed.sh."""

from __future__ import annotations

import json
from pathlib import Path

import tomllib
import yaml

from recompute_kit.cli import main
from recompute_kit.sources.resolve import resolve

CORPUS = Path(__file__).parent / "sources" / "corpus"
TITAN = CORPUS / "torchtitan" / "llama3_8b.toml"
MIXTRAL = CORPUS / "megatron_lm" / "blind_mixtral_8x7b_distributed.sh"


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_torchtitan_plan_renders_the_parallel_layout_it_fits_for(capsys, tmp_path):
    # A skill trial: 8 x A100 40GB at 16k; the fit needs CP4 x DP2 but the TOML printed only
    # [activation_checkpoint]: launched as written, the run is CP1 and does not fit.
    layout = ["--seq-length", "16384", "--cp", "4", "--dp", "2", "--gpu", "a100-40gb"]
    doc = _json(capsys, ["plan", "--config", str(TITAN), *layout, "--format", "torchtitan"])
    assert doc["changed_settings"] == {
        "context_parallel_size": 4,
        "data_parallel_size": 2,
        "seq_length": 16384,
    }
    toml = tomllib.loads(doc["rendered"])
    assert toml["parallelism"] == {"context_parallel_degree": 4, "data_parallel_shard_degree": 2}
    assert toml["training"] == {"seq_len": 16384}
    # read back over the user's file, the kit's own reader gets the planned layout and setting
    patch = tmp_path / "plan.toml"
    patch.write_text(doc["rendered"])
    cfg = resolve([str(TITAN), str(patch)]).config
    assert (cfg.parallel.context_parallel_size, cfg.parallel.data_parallel_size) == (4, 2)
    assert cfg.model.seq_length == 16384
    assert cfg.recompute.spec == doc["best"]["recompute"]


def test_megatron_plans_render_the_layout_in_each_formats_keys(capsys, tmp_path):
    argv = ["plan", "--config", str(MIXTRAL), "--dp", "8", "--cp", "2"]
    argv += ["--gpu-memory-gb", "79.1", "--format"]
    lm = _json(capsys, [*argv, "megatron-lm"])
    assert lm["changed_settings"] == {"context_parallel_size": 2, "data_parallel_size": 8}
    flags = [line for line in lm["rendered"].splitlines() if not line.startswith("#")]
    assert "--context-parallel-size 2" in " ".join(flags)
    # TP1 x PP4 x CP2 x DP8: the world the launcher must start, said where no flag sets it
    assert "launch on 64 GPUs" in lm["rendered"]
    nemo = yaml.safe_load(_json(capsys, [*argv, "nemo"])["rendered"])
    assert nemo["model"]["context_parallel_size"] == 2
    bridge = _json(capsys, [*argv, "megatron-bridge"])["rendered"]
    assert "cfg.model.context_parallel_size = 2" in bridge.splitlines()


def test_plan_without_overrides_renders_no_layout(capsys):
    doc = _json(capsys, ["plan", "--model", "llama3-70b", "--gpu-memory-gb", "79.1"])
    assert doc["changed_settings"] == {}
    assert "parallel layout" not in doc["rendered"]
