# ruff: noqa: E501  (verbatim log lines are longer than 100 characters and must stay whole)
"""Configs (YAML/JSON, command lines, Hydra overrides, Python assignments, argument dumps) and
experiment tables, read from real text (tests/evidence_texts.py)."""

from __future__ import annotations

import json
import textwrap

import pytest
from evidence_texts import (
    ARGS_LOCAL_V014_FULL,
    ARGS_MLM_495,
    OOM_GEN4,
    SEED_BRIDGE_COMMAND,
    SEED_CFG_ASSIGNMENTS,
    SEED_CFG_DEFAULTS,
    SEED_EXPERIMENT_TABLE,
    SEED_OTHER_TABLES,
    SEED_PROVIDER_FULL,
    SEED_PROVIDER_MODULES,
)

from recompute_kit.doctor.evidence import (
    parse_config,
    parse_config_with_notes,
    parse_experiments,
)

# =============================================================================================
# Configs: YAML/JSON, command lines, Hydra overrides, Python assignments, argument dumps
# =============================================================================================


def test_config_yaml_nested_under_model_bridge_style():
    # key/values of the Megatron Bridge docs (seeds/000: recompute_granularity="full",
    # recompute_method="uniform", recompute_num_layers=4; MoE example num_moe_experts=8,
    # expert_model_parallel_size=2) written as a Megatron-Bridge YAML override file
    text = textwrap.dedent(
        """\
        model:
          recompute_granularity: full
          recompute_method: uniform
          recompute_num_layers: 4
          num_moe_experts: 8
          expert_model_parallel_size: 2
        train:
          micro_batch_size: 1
        trainer:
          devices: 8
        """
    )
    config = parse_config(text, "override.yaml")
    assert config == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 4,
        "num_moe_experts": 8,
        "expert_model_parallel_size": 2,
        "micro_batch_size": 1,
        "trainer.devices": 8,
    }


def test_config_yaml_nemo_activations_checkpoint_keys():
    # seeds/002 (NeMo docs): activations_checkpoint_granularity=full,
    # activations_checkpoint_method=block, activations_checkpoint_num_layers
    text = textwrap.dedent(
        """\
        trainer:
          precision: bf16-mixed
        model:
          activations_checkpoint_granularity: full
          activations_checkpoint_method: block
          activations_checkpoint_num_layers: 1
          sequence_parallel: true
          tensor_model_parallel_size: 8
        """
    )
    config = parse_config(text)
    assert config["recompute_granularity"] == "full"
    assert config["recompute_method"] == "block"
    assert config["recompute_num_layers"] == 1
    assert config["sequence_parallel"] is True and config["tensor_model_parallel_size"] == 8
    assert config["bf16"] is True and config["trainer.precision"] == "bf16-mixed"


def test_config_json_flat():
    # seeds/001: recompute_granularity = "selective", recompute_modules = ["core_attn", "layernorm"]
    text = json.dumps(
        {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "layernorm"]}
    )
    assert parse_config(text, "cfg.json") == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "layernorm"],
    }


def test_config_bridge_command_line_from_seed():
    # seeds/001: the skill's run_performance_workload.py command, backslash-continued
    assert parse_config(SEED_BRIDGE_COMMAND) == {
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn", "layernorm"],
    }


def test_config_megatron_flags_from_docs():
    # megatron-recompute.md: Megatron's fine-grained offloading doc example and the
    # moe-layer-recompute deprecation message (real-formats.md tc-measured-moe-layer-...)
    config = parse_config(
        "--recompute-modules layernorm moe_act --offload-modules core_attn attn_proj expert_fc1"
    )
    assert config == {
        "recompute_modules": ["layernorm", "moe_act"],
        "offload_modules": ["core_attn", "attn_proj", "expert_fc1"],
    }
    config = parse_config("--recompute-granularity selective --recompute-modules moe_layer")
    assert config == {"recompute_granularity": "selective", "recompute_modules": ["moe_layer"]}


def test_config_megatron_command_line_multiline():
    # Megatron-LM flags (names as in Megatron-LM's arguments.py) in a backslash-continued
    # torchrun command, with shell variables
    text = textwrap.dedent(
        """\
        export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
        TP=8
        torchrun --nproc_per_node 8 pretrain_gpt.py \\
            --num-layers 80 --hidden-size 8192 --num-attention-heads 64 \\
            --seq-length 8192 --micro-batch-size 1 --bf16 \\
            --tensor-model-parallel-size ${TP} --sequence-parallel \\
            --use-distributed-optimizer \\
            --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \\
            --num-experts 64 --moe-router-topk 8 --moe-grouped-gemm \\
            --multi-latent-attention --fp8-format hybrid \\
            --cpu-offloading-num-layers 2 --lr 6.0e-5 --lr-warmup-fraction .001 \\
            --no-gradient-accumulation-fusion
        """
    )
    config = parse_config(text, "train.sh")
    assert config["num_layers"] == 80 and config["hidden_size"] == 8192
    assert config["seq_length"] == 8192 and config["micro_batch_size"] == 1
    assert config["bf16"] is True and config["sequence_parallel"] is True
    assert config["tensor_model_parallel_size"] == 8  # ${TP} resolved
    assert config["use_distributed_optimizer"] is True
    assert (config["recompute_granularity"], config["recompute_method"]) == ("full", "uniform")
    assert config["recompute_num_layers"] == 1
    assert config["num_moe_experts"] == 64 and config["moe_router_topk"] == 8
    assert config["moe_grouped_gemm"] is True and config["multi_latent_attention"] is True
    assert config["fp8"] == "hybrid"
    assert config["cpu_offloading_num_layers"] == 2 and config["cpu_offloading"] is True
    assert config["lr"] == 6.0e-5 and config["lr_warmup_fraction"] == 0.001
    assert config["nproc_per_node"] == 8
    assert config["no_gradient_accumulation_fusion"] is True


def test_config_recompute_activations_means_selective():
    # megatron-recompute.md rule 26: --recompute-activations => recompute_granularity selective
    config = parse_config(
        "python pretrain_gpt.py --recompute-activations --tensor-model-parallel-size 8"
    )
    assert config["recompute_granularity"] == "selective"
    assert config["tensor_model_parallel_size"] == 8


def test_config_hydra_overrides():
    config = parse_config(
        "model.recompute_modules=[mlp,core_attn] model.recompute_granularity=selective trainer.devices=8"
    )
    assert config == {
        "recompute_modules": ["mlp", "core_attn"],
        "recompute_granularity": "selective",
        "trainer.devices": 8,
    }
    # seeds/002 NeMo keys and seeds/001 settings, one override per line
    config = parse_config(
        "model.activations_checkpoint_granularity=full\n"
        "model.activations_checkpoint_method=block\n"
        "model.activations_checkpoint_num_layers=2\n"
        "distribute_saved_activations=True\n"
        "sequence_parallel=True\n"
        "+model.cpu_offloading=True\n"
        "model.recompute_modules=null\n"
    )
    assert config == {
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 2,
        "distribute_saved_activations": True,
        "sequence_parallel": True,
        "cpu_offloading": True,
        "recompute_modules": None,
    }


def test_config_python_assignments_from_seeds():
    # seeds/001 cfg.model.* lines and seeds/000 GPTModelProvider(...) keyword arguments
    assert parse_config(SEED_CFG_ASSIGNMENTS) == {
        "recompute_modules": ["core_attn", "layernorm"],
        "recompute_method": "uniform",
    }
    assert parse_config(SEED_CFG_DEFAULTS) == {
        "recompute_granularity": None,
        "recompute_modules": None,
        "fine_grained_activation_offloading": False,
    }
    assert parse_config(SEED_PROVIDER_FULL) == {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 4,
    }
    assert parse_config(SEED_PROVIDER_MODULES) == {
        "recompute_granularity": "selective",
        "recompute_modules": [
            "core_attn",
            "mlp",
            "layernorm",
            "moe",
            "moe_act",
            "shared_experts",
            "mla_up_proj",
        ],
    }


def test_config_argument_dump():
    # ex-args-local-v014-full and ex-args-mlm-495 as config files
    config, notes = parse_config_with_notes(ARGS_LOCAL_V014_FULL, "args.txt")
    assert config["recompute_granularity"] == "full" and config["recompute_num_layers"] == 2
    assert config["recompute_modules"] is None and config["world_size"] == 8
    assert "argument dump" in notes[0]
    assert parse_config(ARGS_MLM_495)["hidden_size"] == 5120


@pytest.mark.parametrize(
    "garbage",
    ["", "   \n", "\x00\x01\x02", "{not json", ": : :", "- a\n- b", OOM_GEN4, "[[[[[[[[[["],
)
def test_config_garbage_gives_a_dict(garbage):
    config, notes = parse_config_with_notes(garbage)
    assert isinstance(config, dict)
    assert notes
    if garbage.strip() in ("", "{not json", ": : :", "- a\n- b"):
        assert config == {}


# =============================================================================================
# Experiments
# =============================================================================================

SEED_ROWS = [
    # name, modules, recompute, tflops, vs_golden, peak GB, oom, oom_rank, result
    ("Baseline", ["core_attn"], "selective", 704.0, -0.008, 58.8, True, 0, "OOM"),
    ("Exp 1", ["mlp"], "selective:mlp", 593.6, -0.164, 55.6, False, None, "Perf regression"),
    (
        "Exp 2",
        ["mlp", "core_attn"],
        "selective:mlp,core_attn",
        586.8,
        -0.173,
        55.6,
        False,
        None,
        "Perf regression",
    ),
    (
        "Exp 3",
        ["core_attn", "layernorm"],
        "selective:core_attn,layernorm",
        702.0,
        -0.011,
        59.6,
        True,
        0,
        "OOM",
    ),
]


def check_seed_rows(rows):
    assert len(rows) == 4
    for row, (name, mods, spec, tflops, vs, peak, oom, oom_rank, result) in zip(
        rows, SEED_ROWS, strict=True
    ):
        assert row["name"] == name
        assert row["recompute_modules"] == mods
        assert row["recompute"] == spec
        assert row["tflops_per_gpu"] == tflops
        assert row["vs_golden"] == vs
        assert row["peak_memory_bytes"] == round(peak * 1e9)
        assert row["oom"] is oom and row["oom_rank"] == oom_rank
        assert row["result"] == result


def test_experiments_markdown_table_from_seed():
    # seeds/001 (NVIDIA skill perf-activation-recompute): the Llama3-70B experiment table
    check_seed_rows(parse_experiments(SEED_EXPERIMENT_TABLE))


def test_experiments_only_result_tables_count():
    # the skill page's granularity, module and symptom tables give no rows
    assert parse_experiments(SEED_OTHER_TABLES) == []
    check_seed_rows(parse_experiments(SEED_OTHER_TABLES + SEED_EXPERIMENT_TABLE, "skill.md"))


def test_experiments_csv():
    # the seed table's cells, written out with the csv module
    import csv
    import io

    lines = [line for line in SEED_EXPERIMENT_TABLE.splitlines() if line.startswith("|")]
    header = [
        "Experiment",
        "recompute_modules",
        "TFLOP/s/GPU",
        "vs Golden",
        "Peak Mem (GB)",
        "Result",
    ]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for line in lines[1:]:
        writer.writerow([cell.strip() for cell in line.strip("|").split("|")])
    check_seed_rows(parse_experiments(out.getvalue(), "results.csv"))
    # and as TSV
    tsv = io.StringIO()
    csv.writer(tsv, delimiter="\t").writerows(csv.reader(io.StringIO(out.getvalue())))
    check_seed_rows(parse_experiments(tsv.getvalue()))


def test_experiments_jsonl_keeps_every_key():
    # recompute-kit's ablation rows: one JSON object per line
    rows = [
        {
            "recompute": "selective",
            "tflops_per_gpu": 704.0,
            "peak_memory_bytes": 58_800_000_000,
            "status": "oom",
            "oom_rank": 0,
            "seconds": 12.5,
        },
        {
            "recompute": "selective:mlp",
            "tflops_per_gpu": 593.6,
            "peak_memory_bytes": 55_600_000_000,
            "status": "ok",
            "vs_golden": -0.164,
            "seed": 1234,
        },
        {"recompute": "full:uniform:1", "status": "error", "error": "ValueError: ..."},
    ]
    text = "\n".join(json.dumps(r) for r in rows) + "\nnot json\n"
    parsed = parse_experiments(text, "ablation.jsonl")
    assert [r["name"] for r in parsed] == ["selective", "selective:mlp", "full:uniform:1"]
    assert [r["recompute_modules"] for r in parsed] == [["core_attn"], ["mlp"], None]
    assert [r["oom"] for r in parsed] == [True, False, False]
    assert [r["result"] for r in parsed] == ["OOM", "OK", "error"]
    assert parsed[0]["oom_rank"] == 0 and parsed[0]["seconds"] == 12.5
    assert parsed[1]["seed"] == 1234 and parsed[1]["vs_golden"] == -0.164
    assert parsed[1]["peak_memory_bytes"] == 55_600_000_000
    assert parsed[2]["error"] == "ValueError: ..."
    # a JSON list of the same rows reads the same
    assert parse_experiments(json.dumps(rows)) == parsed


def test_experiments_memory_column_names():
    # figures of NVIDIA/Megatron-LM#1225 (megatron-recompute.md, issue table row 3):
    # --recompute-activations moved max allocated only from 25.52 to 24.94 GB
    text = (
        "| run | recompute | max allocated (GB) |\n|---|---|---|\n"
        "| baseline | none | 25.52 |\n| --recompute-activations | selective:core_attn | 24.94 |\n"
    )
    rows = parse_experiments(text)
    assert [(r["recompute"], r["peak_memory_bytes"]) for r in rows] == [
        ("none", 25_520_000_000),
        ("selective", 24_940_000_000),
    ]
    assert rows[1]["recompute_modules"] == ["core_attn"]


@pytest.mark.parametrize("garbage", ["", "|", "| a |\n|---|", "a,b\n1,2", "{]", "\x00" * 10])
def test_experiments_garbage(garbage):
    assert parse_experiments(garbage) == []


def test_a_quoted_array_element_holding_a_flag_and_its_value_is_both():
    # Megatron-LM's examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh writes its array
    # elements as one quoted string each ("--fp8-format hybrid"); a skill trial found keys
    # such as 'fp8_format hybrid': True in the doctor's evidence
    from recompute_kit.sources.fragments import parse_config

    script = 'ARGS=(\n    "--fp8-format hybrid"\n    "--num-layers 32"\n)\ntorchrun pretrain_gpt.py ${ARGS[@]}\n'
    flat = parse_config(script, "train.sh")
    assert flat.get("fp8") == "hybrid" and flat.get("num_layers") == 32
    assert not [k for k in flat if " " in k]
