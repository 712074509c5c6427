"""NeMo Automodel recipe YAMLs (sources/automodel.py), read from verbatim files of
NVIDIA-NeMo/Automodel @ 36044ad3 (tests/data/read/README.md gives each URL):

* automodel_gemma4_31b.yaml: examples/vlm_finetune/gemma4/gemma4_31b.yaml (FSDP2 + AC, the
  file an Automodel OOM issue runs);
* automodel_qwen3_moe_30b_te_packed_sequence.yaml: EP 8, packed sequences of 1024, AC;
* automodel_llama_3_3_70b_instruct_squad.yaml: TP 4 x PP 2, pp_microbatch_size 1, TE FusedAdam.

Before this reader they were read as serialized Megatron-Bridge ConfigContainers (framework
megatron-bridge, no recompute, activation_checkpointing / the model id / strategy unused), and
the doctor patched ddp.use_distributed_optimizer into an FSDP2 run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import collect
from recompute_kit.sources import formats
from recompute_kit.sources.resolve import resolve

DATA = Path(__file__).parent / "data" / "read"
GEMMA = DATA / "automodel_gemma4_31b.yaml"
QWEN = DATA / "automodel_qwen3_moe_30b_te_packed_sequence.yaml"
LLAMA = DATA / "automodel_llama_3_3_70b_instruct_squad.yaml"
OOM = Path(__file__).parent / "data" / "rules" / "i12-automodel-1975.txt"


def read(path: Path, text: str | None = None, name: str | None = None):
    text = path.read_text() if text is None else text
    return formats.read_file_text(text, name or str(path))


@pytest.mark.parametrize("path", [GEMMA, QWEN, LLAMA])
def test_an_automodel_yaml_is_read_as_automodel_from_its_keys_not_its_name(path: Path):
    for name in (str(path), "config.yaml", "run.yml"):
        reading = read(path, name=name)
        assert reading.framework == "automodel", name
        assert reading.format == "NeMo Automodel recipe YAML"


def test_gemma4_fsdp2_activation_checkpointing_is_every_layer_fully_checkpointed():
    r = read(GEMMA)
    assert r.model_name == "google/gemma-4-31B-it"
    assert r.model_name_origin.key == "model.pretrained_model_name_or_path"
    assert r.get("recompute_granularity") == "full"
    assert r.get("recompute_method") == "uniform" and r.get("recompute_num_layers") == 1
    origin = r.origins["recompute_granularity"]
    assert origin.key == "distributed.activation_checkpointing" and origin.where.endswith(":65")
    # strategy fsdp2: FSDP2 shards parameters, gradients and optimizer states
    assert r.get("zero_stage") == 3 and r.get("use_torch_fsdp2") is True
    assert r.get("use_distributed_optimizer") is False
    assert r.origins["zero_stage"].key == "distributed.strategy"
    assert r.get("micro_batch_size") == 1
    assert r.origins["micro_batch_size"].key == "step_scheduler.local_batch_size"
    # dp_size: none is the world over tp x pp x cp: not a value the file gives
    assert "data_parallel_size" not in r
    # torch_dtype torch.bfloat16 with torch.optim.AdamW: no fp32 master copy
    assert r.get("bf16") is True and r.get("param_precision") == "pure"
    assert r.get("exp_avg_dtype") == "bf16"
    assert r.get("attention_backend") == "unfused"  # attn_implementation: eager
    for key in (
        "distributed.activation_checkpointing",
        "distributed.strategy",
        "model.pretrained_model_name_or_path",
        "step_scheduler.local_batch_size",
    ):
        assert key not in r.unused, key
    assert "ci.recipe_owner" in r.unused


def test_qwen3_moe_packed_sequence_resolves_with_the_registry_shape():
    res = resolve([str(QWEN)])
    cfg, r = res.config, res.reading
    assert r.framework == "automodel"
    assert cfg.model.num_layers == 48 and cfg.model.num_moe_experts == 128
    assert cfg.model.seq_length == 1024
    assert r.origins["seq_length"].key == "packed_sequence.packed_sequence_size"
    assert cfg.model.micro_batch_size == 4
    p = cfg.parallel
    assert p.expert_model_parallel_size == 8 and p.tensor_model_parallel_size == 1
    assert p.zero_stage == 3 and p.use_torch_fsdp2 and not p.use_distributed_optimizer
    assert cfg.recompute.recompute_granularity == "full"
    assert cfg.recompute.recompute_method == "uniform"
    assert cfg.recompute.recompute_num_layers == 1
    assert cfg.model.loss_implementation == "hf"
    # what the file leaves out is said with the Automodel key that sets it
    dp = r.origins["data_parallel_size"]
    assert dp.kind == "assumed" and dp.key.startswith("distributed.dp_size")
    assert any("distributed.pipeline is set but pp_size is 1" in w for w in r.warnings)
    assert any("model.torch_dtype not set" in w for w in r.warnings)
    assert "FSDP2Config" in r.origins["bf16"].where


def test_llama70b_pipeline_microbatch_packed_sequence_and_te_fused_adam():
    r = read(LLAMA)
    assert r.get("tensor_model_parallel_size") == 4
    assert r.get("pipeline_model_parallel_size") == 2
    # under PP the stage holds one pipeline microbatch, not the local batch of 2
    assert r.get("micro_batch_size") == 1
    assert r.origins["micro_batch_size"].key == "distributed.pipeline.pp_microbatch_size"
    assert r.get("seq_length") == 1024
    # bf16 storage, but TE FusedAdam master_weights keeps fp32 master and Adam states
    assert r.get("param_precision") == "fp32_master"
    assert r.get("store_param_remainders") is True and r.get("exp_avg_dtype") == "fp32"
    assert r.unused["distributed.pipeline.pp_schedule"] == "interleaved1f1b"  # VPP: see below


def test_selective_ddp_and_a_bad_value(tmp_path: Path):
    text = GEMMA.read_text()
    sel = text.replace("activation_checkpointing: true", "activation_checkpointing: selective")
    sel = sel.replace("strategy: fsdp2", "strategy: ddp")
    assert sel != text
    r = read(GEMMA, sel)
    assert r.get("recompute_granularity") == "selective"
    assert r.get("recompute_modules") == ["layernorm"]
    assert r.get("zero_stage") == 0
    off = read(
        GEMMA, text.replace("activation_checkpointing: true", "activation_checkpointing: false")
    )
    assert off.get("recompute_granularity") is None
    bad = text.replace("activation_checkpointing: true", "activation_checkpointing: sometimes")
    with pytest.raises(ConfigError, match=r"distributed\.activation_checkpointing 'sometimes'"):
        read(GEMMA, bad)


def test_doctor_patches_an_automodel_run_in_automodel_keys_never_megatron_bridge():
    d = diagnose(collect(logs=[str(OOM)], config=str(QWEN)), None)
    assert d.evidence.read["framework"] == "automodel"
    assert d.findings
    for f in d.findings:
        assert f.patch_framework == "automodel"
        for key in f.patch_keys or {}:
            assert not key.startswith(("ddp.", "model.", "train.", "dist.")), (f.rule, key)
        # use_distributed_optimizer has no Automodel key: never patched for an FSDP2 run
        assert "use_distributed_optimizer" not in (f.config_patch or {})


def test_a_recompute_patch_is_written_in_automodel_keys():
    from recompute_kit.doctor import patches

    ctx = type("Ctx", (), {"evidence": type("E", (), {"read": {"framework": "automodel"}})()})()
    drops: list = []
    keys = patches._translate(
        "automodel",
        {"recompute_granularity": "full", "micro_batch_size": 1, "tensor_model_parallel_size": 2},
        ctx,
        lambda k, v, why: drops.append(k),
    )
    assert keys == {
        "distributed.activation_checkpointing": True,
        "step_scheduler.local_batch_size": 1,
        "distributed.tp_size": 2,
    }
    off = patches._translate("automodel", {"recompute_granularity": None}, ctx, print)
    assert off == {"distributed.activation_checkpointing": False}
    patches._translate("automodel", {"use_distributed_optimizer": True}, ctx,
                       lambda k, v, why: drops.append(k))  # fmt: skip
    assert drops == ["use_distributed_optimizer"]


def test_plan_writes_automodels_own_keys(capsys):
    # the planner's snippet and levers for an Automodel run are in Automodel's keys, never
    # Megatron-Bridge's (cfg.model.recompute_granularity was printed before)
    from recompute_kit.cli import main

    path = str(DATA / "automodel_qwen3_moe_30b_te_packed_sequence.yaml")
    assert main(["plan", "--config", path, "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "distributed.activation_checkpointing: true" in out
    assert "recompute_granularity" not in out.split("# recompute-kit:")[1]
    assert main(["plan", "--config", path, "--gpu", "h100-80gb", "--levers", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["levers"]
    settings = {r["setting"] for r in table["rows"]}
    # Automodel's layouts are tried (it has CP / PP), never the Trainer's ZeRO / FSDP keys
    assert any(
        s.startswith("cp x pp") for s in {r["lever"] + " " + r["setting"] for r in table["rows"]}
    )
    assert not any("zero_optimization" in s or "fsdp:" in s for s in settings)
    assert any("NeMo Automodel run" in n for n in table["notes"])


def test_an_interleaved_schedule_gets_its_virtual_stages():
    # NVIDIA-NeMo/Automodel llama_3_3_70b_instruct_squad.yaml: interleaved1f1b, layers_per_stage
    # 4, pp_size 2: ceil(80 / 4) = 20 stages, 10 per rank (calculate_virtual_stages); the shape
    # from the registry's Llama-3.1-70B (Llama-3.3-70B has the same architecture)
    from recompute_kit.sources.resolve import resolve

    r = resolve(
        [str(DATA / "automodel_llama_3_3_70b_instruct_squad.yaml")],
        model="meta-llama/Meta-Llama-3.1-70B",
        overrides={"data_parallel_size": 2},
    )
    assert r.config.parallel.virtual_pipeline_model_parallel_size == 10
    assert r.reading.origins["virtual_pipeline_model_parallel_size"].kind == "derived"
