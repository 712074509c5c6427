"""DeepSpeed ZeRO's gradient bucket(s) and stage 3's parameter prefetch: read from the JSON with
DeepSpeed's own defaults and the Trainer's "auto", counted beside the estimate's total and
against the usable memory (memory/overheads.py).

Real files: hiyouga/LLaMA-Factory @ ff6d4d12 examples/deepspeed/ds_z2_config.json
(reduce_bucket_size 5e8, overlap_comm false) and ds_z3_config.json (reduce_bucket_size and
stage3_prefetch_bucket_size "auto"): tests/sources/corpus/hf_trainer, URLs in their .expect.yaml.
Buffers: deepspeed/runtime/zero/stage_1_and_2.py backward() (one bucket, a second with
overlap_comm), stage3.py (`__ipg_bucket_flat_buffer`, once); "auto" = hidden^2 and
0.9 x hidden^2 (transformers integrations/deepspeed.py trainer_config_finalize)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.memory.estimate import estimate
from recompute_kit.memory.model_states import model_states
from recompute_kit.plan.margins import planned_bytes
from recompute_kit.sources.resolve import resolve

HERE = Path(__file__).parent / "sources" / "corpus"
Z2 = str(HERE / "hf_trainer" / "blind_ds_z2_config.json")
Z3 = str(HERE / "hf_trainer" / "ds_z3_config.json")
QWEN3 = str(HERE / "hf_config" / "Qwen--Qwen3-8B.config.json")  # hidden_size 4096


def _config(*files, **overrides):
    return resolve([*files, QWEN3], overrides={"data_parallel_size": 8, **overrides}).config


def test_stage2_bucket_is_read_and_single_without_overlap_comm():
    cfg = _config(Z2)
    p = cfg.parallel
    assert (p.zero_reduce_bucket_size, p.zero_overlap_comm) == (500_000_000, False)
    e = estimate(cfg)
    width = 4 if not (cfg.model.bf16 or cfg.model.fp16) else 2  # the run's 16-bit or fp32 dtype
    assert e.zero_buffers_bytes == width * 500_000_000
    assert planned_bytes(e) - e.total_bytes >= e.zero_buffers_bytes
    assert e.overhead_bytes - e.cuda_context_bytes - e.nccl_buffers_bytes == e.zero_buffers_bytes


def test_overlap_comm_double_buffers_the_stage2_bucket(tmp_path):
    doc = json.loads(Path(Z2).read_text())
    doc["zero_optimization"]["overlap_comm"] = True
    doc["bf16"]["enabled"] = True
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(doc))
    e = estimate(_config(str(path)))
    assert e.zero_buffers_bytes == 2 * 2 * 500_000_000


def test_stage3_auto_is_the_trainers_hidden_squared():
    cfg = _config(Z3)
    h = cfg.model.hidden_size
    assert cfg.parallel.zero_reduce_bucket_size == h * h
    assert cfg.parallel.zero_prefetch_bucket_size == int(0.9 * h * h)
    e = estimate(cfg)
    width = 4 if not (cfg.model.bf16 or cfg.model.fp16) else 2
    assert e.zero_buffers_bytes == width * (h * h + int(0.9 * h * h))  # one bucket at stage 3


def test_deepspeeds_default_bucket_when_the_json_says_none(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    resolved = resolve([str(path), QWEN3], overrides={"data_parallel_size": 8})
    origin = resolved.reading.origins["zero_reduce_bucket_size"]
    assert origin.kind == "default" and "DeepSpeed" in origin.where
    assert estimate(resolved.config).zero_buffers_bytes == 2 * 500_000_000


def test_runs_without_deepspeed_have_no_bucket_term():
    assert estimate(_config(Z2, zero_stage=0)).zero_buffers_bytes == 0


def test_a_bucket_that_is_not_a_number_is_one_clear_error(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}}))
    with pytest.raises(ConfigError, match="reduce_bucket_size = 'big' is not a number"):
        resolve([str(path), QWEN3])


def test_the_zero_optimizer_step_is_counted_where_it_sets_the_peak(tmp_path):
    """A skill trial (LLaMA-Factory's llama3_full_sft.yaml + ds_z2_config.json, Llama-3.1-8B
    over 8 GPUs) was told the run fits a 40 GB A100 with 3 GiB to spare, while the words beside
    the estimate left out DeepSpeed's step: the fp32 copy of the gradient partition
    (stage_1_and_2.py step(): flatten(...).to(fp32)) and, with torch's foreach AdamW
    (optim adamw_torch), a temporary of one moment's size. With checkpointing on the
    activations are smaller than those, so the step sets the peak: the total counts it."""
    corpus = Path(__file__).parent / "sources" / "corpus" / "hf_trainer"
    recipe = (corpus / "qwen3_full_sft.yaml").read_text()

    def run(ds: str, optim: str | None = None):
        yaml_path = tmp_path / f"run_{Path(ds).stem}_{optim}.yaml"
        text = recipe.replace("examples/deepspeed/ds_z3_config.json", str(corpus / ds))
        yaml_path.write_text(text + (f"optim: {optim}\n" if optim else ""))
        cfg = resolve([str(yaml_path)], model="Qwen/Qwen3-4B", overrides={"world_size": 2})
        return cfg.config, estimate(cfg.config)

    config, e = run("blind_ds_z2_config.json")
    states = model_states(config, 0, "hf")
    assert not config.parallel.adam_step_temporary  # optim unset: transformers' fused default
    assert e.optimizer_step_bytes == states.step_fp32_grads > 0
    assert e.step_sets_peak and e.total_bytes == (
        e.weights_bytes + e.grads_bytes + e.optimizer_bytes + e.optimizer_step_bytes
    )
    assert any("counted in the total" in a for a in e.overhead_assumptions)
    # optim adamw_torch: foreach AdamW's moment-sized temporary on top
    config, e2 = run("blind_ds_z2_config.json", "adamw_torch")
    assert config.parallel.adam_step_temporary
    assert e2.optimizer_step_bytes == states.step_fp32_grads + round(states.optimizer / 3)
    # a DeepSpeed optimizer block builds FusedAdam: the Trainer's optim is not used
    ds = json.loads((corpus / "blind_ds_z2_config.json").read_text())
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": "auto"}}
    (tmp_path / "with_opt.json").write_text(json.dumps(ds))
    config, e3 = run(str(tmp_path / "with_opt.json"), "adamw_torch")
    assert not config.parallel.adam_step_temporary
    assert e3.optimizer_step_bytes == states.step_fp32_grads
    # adapters on a frozen base: no gradient partition to copy
    lora = resolve([str(corpus / "qwen3_lora_sft.yaml")], model="Qwen/Qwen3-4B").config
    assert estimate(lora).optimizer_step_bytes == 0
