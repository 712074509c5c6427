"""The NeMo 1.x / Launcher and NeMo-RL readers: the corpus, and the tricky semantics.

Sources quoted below:
- NeMo 1.x: https://github.com/NVIDIA/NeMo/blob/8cfedd7203462cb251a914e700e5605444277561/nemo/collections/nlp/models/language_modeling/megatron_base_model.py
  (build_transformer_config: config_mapping sets recompute_* from activations_checkpoint_*;
  sequence_parallel off at TP=1; fp16/bf16 = dtype and megatron_amp_O2)
- https://github.com/NVIDIA/NeMo/blob/8cfedd7203462cb251a914e700e5605444277561/nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py
  (normalization, layernorm1p, fp8 format, get_specs: local spec without transformer_engine)
- Launcher resolvers: https://github.com/NVIDIA/NeMo-Framework-Launcher/blob/26e42fa91d9e608897ce485b4911c263a4b57008/launcher_scripts/main.py
- NeMo-RL: https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/utils/config.py
  (defaults:, _override_, add/mul/div/max) and .../nemo_rl/models/megatron/setup.py
  (activation_checkpointing + recompute_granularity)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recompute_kit.config import ConfigError
from recompute_kit.sources import nemo, nemo_rl

CORPUS = Path(__file__).parent / "corpus"
sys.path.insert(0, str(Path(__file__).parent))

CASES = [
    (module, expect)
    for folder, module in (("nemo", nemo), ("nemo_rl", nemo_rl))
    for expect in sorted((CORPUS / folder).glob("*.expect.yaml"))
]


def _read(module, path: Path):
    reading = module.read(path.read_text(), str(path))
    module.apply_defaults(reading)
    return reading


def _nemo1(tmp_path: Path, text: str):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    reading = nemo.read(text, str(path))
    nemo.apply_defaults(reading)
    return reading


BASE = """trainer:
  devices: 8
  num_nodes: 2
  precision: bf16
model:
  encoder_seq_length: 4096
  num_layers: 4
  hidden_size: 1024
  num_attention_heads: 8
"""


def test_nemo1_recompute_keys_are_ignored_activations_checkpoint_keys_act(tmp_path):
    # megatron_base_model.py config_mapping:
    #   'recompute_granularity': cfg.get('activations_checkpoint_granularity')
    r = _nemo1(
        tmp_path,
        BASE
        + "  recompute_granularity: full\n  recompute_method: uniform\n  recompute_num_layers: 1\n"
        + "  activations_checkpoint_granularity: selective\n",
    )
    assert r.get("recompute_granularity") == "selective"
    assert r.origins["recompute_granularity"].key == "model.activations_checkpoint_granularity"
    assert r.origins["recompute_granularity"].where.endswith("cfg.yaml:13")
    assert r.get("recompute_method") is None  # default, not the ignored key
    assert sum("is ignored by NeMo 1.x" in w for w in r.warnings) == 3
    assert r.unused["model.recompute_granularity"] == "full"
    assert r.get("recompute_modules") == ["core_attn"]


def test_nemo1_full_uniform(tmp_path):
    r = _nemo1(
        tmp_path,
        BASE
        + "  activations_checkpoint_granularity: full\n  activations_checkpoint_method: block\n"
        + "  activations_checkpoint_num_layers: 2\n",
    )
    assert (
        r.get("recompute_granularity"),
        r.get("recompute_method"),
        r.get("recompute_num_layers"),
    ) == (
        "full",
        "block",
        2,
    )


@pytest.mark.parametrize(
    ("activation", "swiglu", "note"),
    [
        ("fast-swiglu", True, "silu"),
        ("geglu", True, "gelu"),
        ("squared-relu", False, "not a gated"),
        ("gelu", False, ""),
    ],
)
def test_nemo1_activation(tmp_path, activation, swiglu, note):
    r = _nemo1(tmp_path, BASE + f"  activation: {activation}\n")
    assert r.get("swiglu") is swiglu
    assert note in r.origins["swiglu"].note


def test_nemo1_normalization_and_bias(tmp_path):
    r = _nemo1(tmp_path, BASE + "  normalization: layernorm1p\n  bias: false\n")
    assert (
        r.get("normalization") == "LayerNorm" and "zero-centred" in r.origins["normalization"].note
    )
    assert r.get("add_bias_linear") is False
    r = _nemo1(tmp_path, BASE + "  normalization: rmsnorm\n")
    assert r.get("normalization") == "RMSNorm"


@pytest.mark.parametrize(
    ("precision", "o2", "bf16", "fp16"),
    [
        ("bf16", "true", True, False),
        ("bf16-mixed", "false", False, False),
        ("16", "true", False, True),
        ("32", "true", False, False),
    ],
)
def test_nemo1_precision_needs_megatron_amp_o2(tmp_path, precision, o2, bf16, fp16):
    text = BASE.replace("precision: bf16", f"precision: {precision}") + f"  megatron_amp_O2: {o2}\n"
    r = _nemo1(tmp_path, text)
    assert (r.get("bf16"), r.get("fp16")) == (bf16, fp16)


def test_nemo1_model_precision_wins_over_trainer(tmp_path):
    r = _nemo1(tmp_path, BASE + "  precision: 16\n  megatron_amp_O2: true\n")
    assert r.get("fp16") is True and r.origins["fp16"].key == "model.precision"


def test_nemo1_world_optimizer_and_dp(tmp_path):
    r = _nemo1(
        tmp_path,
        BASE + "  tensor_model_parallel_size: 2\n  optim:\n    name: distributed_fused_adam\n",
    )
    assert r.get("world_size") == 16 and r.get("data_parallel_size") == 8
    assert r.get("use_distributed_optimizer") is True


def test_nemo1_sequence_parallel_off_at_tp1(tmp_path):
    r = _nemo1(tmp_path, BASE + "  sequence_parallel: true\n")
    assert r.get("sequence_parallel") is False
    assert r.origins["sequence_parallel"].kind == "derived"
    assert any("sequence_parallel" in w for w in r.warnings)
    r = _nemo1(tmp_path, BASE + "  sequence_parallel: true\n  tensor_model_parallel_size: 2\n")
    assert r.get("sequence_parallel") is True


def test_nemo1_fp8_format(tmp_path):
    r = _nemo1(
        tmp_path,
        BASE + "  transformer_engine: true\n  fp8: true\n  fp8_e4m3: false\n  fp8_hybrid: true\n",
    )
    assert r.get("fp8") == "hybrid"
    with pytest.raises(ConfigError):
        _nemo1(tmp_path, BASE + "  fp8: true\n  fp8_e4m3: false\n  fp8_hybrid: false\n")


def test_nemo1_interpolation_and_resolvers(tmp_path):
    r = _nemo1(
        tmp_path,
        BASE
        + "  ffn_hidden_size: ${multiply:4, ${.hidden_size}}\n"
        + "  cpu_offloading: true\n  cpu_offloading_num_layers: ${sum:${.num_layers},-1}\n"
        + "  micro_batch_size: ${divide_ceil:${model.num_layers}, 3}\n"
        + "  global_batch_size: ${divide_floor:7, 2}\n",
    )
    assert r.get("ffn_hidden_size") == 4096
    assert r.origins["ffn_hidden_size"].note.startswith("${multiply")
    assert r.get("cpu_offloading_num_layers") == 3
    assert r.get("micro_batch_size") == 2
    assert r.get("global_batch_size") == 3


def test_nemo1_oc_env_is_never_resolved(tmp_path, monkeypatch):
    monkeypatch.setenv("RK_SEQ", "8192")
    r = _nemo1(
        tmp_path, BASE.replace("encoder_seq_length: 4096", "encoder_seq_length: ${oc.env:RK_SEQ}")
    )
    assert r.origins["seq_length"].kind == "default" and r.get("seq_length") == 512
    assert any("could not be resolved" in w for w in r.warnings)
    # a key that refers to it stays unresolved too
    r = _nemo1(tmp_path, BASE + "  x: ${oc.env:RK_SEQ}\n  micro_batch_size: ${.x}\n")
    assert r.get("micro_batch_size") == 4 and r.origins["micro_batch_size"].kind == "default"


def test_nemo1_no_code_in_interpolations(tmp_path):
    r = _nemo1(
        tmp_path, BASE + "  micro_batch_size: \"${multiply:__import__('os').getpid(), 2}\"\n"
    )
    assert r.origins["micro_batch_size"].kind == "default"
    r = _nemo1(tmp_path, BASE + "  micro_batch_size: ${gpu_name:}\n")
    assert r.origins["micro_batch_size"].kind == "default"


def test_launcher_training_mount(tmp_path):
    # launcher files refer to themselves as ${training.model.*} (conf/config.yaml mounts them)
    text = (
        "run:\n  name: x\n  results_dir: ${base_results_dir}/${.name}\n"
        + BASE
        + "  ffn_hidden_size: ${multiply:${training.model.hidden_size}, 3}\n"
    )
    r = _nemo1(tmp_path, text)
    assert r.format.startswith("NeMo-Framework-Launcher")
    assert r.get("ffn_hidden_size") == 3072
    assert r.unused["run.results_dir"] == "${base_results_dir}/${.name}"


def test_nemo1_attention_backend(tmp_path):
    r = _nemo1(
        tmp_path,
        BASE + "  mcore_gpt: true\n  transformer_engine: false\n  use_flash_attention: true\n",
    )
    assert r.get("attention_backend") == "unfused"
    assert any("use_flash_attention does nothing" in w for w in r.warnings)
    r = _nemo1(tmp_path, BASE + "  transformer_engine: true\n  attention_backend: flash\n")
    assert r.get("attention_backend") == "flash"


def test_nemo1_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        nemo.read("model: [1,\n", "x.yaml")
    with pytest.raises(ConfigError, match="model"):
        nemo.read("model: 3\n", "x.yaml")
    with pytest.raises(ConfigError, match=r"cfg\.yaml:7: model\.num_layers must be an integer"):
        _nemo1(tmp_path, BASE.replace("num_layers: 4", "num_layers: four"))
    with pytest.raises(ConfigError):
        _nemo1(tmp_path, BASE.replace("precision: bf16", "precision: half"))


def test_nemo1_keys_for_assumptions():
    assert nemo.key_for("seq_length") == "model.encoder_seq_length"
    assert nemo.key_for("vocab_size") == "+model.override_vocab_size=N, or the tokenizer"
    assert nemo.key_for("num_layers") == "model.num_layers"


# --------------------------------------------------------------------------------------------
# NeMo-RL


def _rl(path: Path):
    reading = nemo_rl.read(path.read_text(), str(path))
    nemo_rl.apply_defaults(reading)
    return reading


RL_BASE = """policy:
  model_name: Qwen/Qwen2.5-1.5B
  train_micro_batch_size: 2
  max_total_sequence_length: 2048
  precision: bfloat16
  dtensor_cfg:
    enabled: false
  megatron_cfg:
    enabled: true
    tensor_model_parallel_size: 2
    pipeline_model_parallel_size: 1
    context_parallel_size: 1
    sequence_parallel: true
    activation_checkpointing: {ckpt}
    recompute_granularity: {granularity}
    recompute_modules: {modules}
    optimizer:
      use_distributed_optimizer: true
cluster:
  gpus_per_node: 8
  num_nodes: 2
"""


def _rl_text(tmp_path, name="c.yaml", **kw):
    values = {"ckpt": "false", "granularity": "full", "modules": "null", **kw}
    path = tmp_path / name
    path.write_text(RL_BASE.format(**values))
    return path


def test_rl_activation_checkpointing_switch(tmp_path):
    # setup.py: granularity is used only when activation_checkpointing is true
    r = _rl(_rl_text(tmp_path, ckpt="false", granularity="selective"))
    assert r.get("recompute_granularity") is None
    r = _rl(_rl_text(tmp_path, ckpt="true", granularity="full"))
    assert (
        r.get("recompute_granularity"),
        r.get("recompute_method"),
        r.get("recompute_num_layers"),
    ) == (
        "full",
        "uniform",
        1,
    )
    r = _rl(_rl_text(tmp_path, ckpt="true", granularity="selective", modules="[core_attn, mlp]"))
    assert r.get("recompute_granularity") == "selective" and r.get("recompute_modules") == [
        "core_attn",
        "mlp",
    ]
    r = _rl(_rl_text(tmp_path, ckpt="true", granularity="selective"))
    assert (
        r.get("recompute_modules") == ["core_attn"]
        and r.origins["recompute_modules"].kind == "default"
    )
    with pytest.raises(ConfigError, match="recompute_granularity"):
        _rl(_rl_text(tmp_path, ckpt="true", granularity="block"))


def test_rl_megatron_values(tmp_path):
    r = _rl(_rl_text(tmp_path))
    assert r.model_name == "Qwen/Qwen2.5-1.5B"
    assert r.get("world_size") == 16 and r.get("data_parallel_size") == 8
    assert r.get("seq_length") == 2048 and r.get("micro_batch_size") == 2
    assert r.get("sequence_parallel") is True and r.get("zero_stage") == 0


def test_rl_defaults_inheritance_and_override(tmp_path):
    _rl_text(tmp_path, name="parent.yaml")
    child = tmp_path / "sub" / "child.yaml"
    child.parent.mkdir()
    # the parent named by a relative path that does not exist here: its copy beside it is
    # used, and a warning says it is not the path named
    (child.parent / "parent.yaml").write_text((tmp_path / "parent.yaml").read_text())
    child.write_text(
        "defaults: ../../elsewhere/parent.yaml\n"
        "policy:\n  max_total_sequence_length: ${mul:${policy.train_micro_batch_size}, 1024}\n"
        "  megatron_cfg:\n    pipeline_model_parallel_size: 2\n"
        "cluster:\n  _override_: true\n  gpus_per_node: 4\n"
    )
    r = _rl(child)
    assert r.get("seq_length") == 2048
    assert r.get("pipeline_model_parallel_size") == 2
    assert r.get("tensor_model_parallel_size") == 2
    assert r.origins["tensor_model_parallel_size"].where.endswith("sub/parent.yaml:10")
    # _override_: cluster.num_nodes of the parent is dropped
    assert r.get("world_size") == 4
    said = [w for w in r.warnings if "DistributedLogprob" not in w]  # (said of every run)
    assert len(said) == 1 and "not the path named" in said[0]


def test_rl_missing_parent_warns(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "defaults: ../../grpo_math_1B.yaml\npolicy:\n  model_name: meta-llama/Llama-3.2-1B\n"
    )
    r = _rl(path)
    assert any("not read" in w for w in r.warnings)
    assert r.model_name == "meta-llama/Llama-3.2-1B"
    assert r.format == nemo_rl.DTENSOR and r.get("zero_stage") == 3


def test_rl_dtensor(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(
        "policy:\n  model_name: /models/local\n  dtensor_cfg:\n    enabled: true\n"
        "    cpu_offload: true\n    activation_checkpointing: true\n"
        "    tensor_parallel_size: 2\n    context_parallel_size: 2\n"
        "  megatron_cfg:\n    enabled: false\n    tensor_model_parallel_size: 8\n"
        "cluster:\n  gpus_per_node: 8\n  num_nodes: 1\n"
    )
    r = _rl(path)
    assert r.model_name is None and any("not a Hugging Face id" in w for w in r.warnings)
    assert r.get("tensor_model_parallel_size") == 2 and r.get("data_parallel_size") == 2
    assert r.get("recompute_granularity") == "full" and r.get("recompute_num_layers") == 1
    assert r.get("param_offload") is True and r.get("optimizer_offload") is True
    assert r.get("use_distributed_optimizer") is False
    assert r.unused["policy.megatron_cfg.tensor_model_parallel_size"] == 8


def test_rl_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="policy"):
        nemo_rl.read("cluster:\n  num_nodes: 1\n", "x.yaml")
    with pytest.raises(ConfigError, match=r"policy\.precision"):
        nemo_rl.read("policy:\n  precision: half\n", "x.yaml")


def test_sniff_keeps_the_formats_apart():
    rl = (CORPUS / "nemo_rl" / "grpo_math_1B.yaml").read_text()
    n1 = (CORPUS / "nemo" / "megatron_gpt_config.yaml").read_text()
    assert nemo.sniff(rl, "grpo_math_1B.yaml") == 0 and nemo_rl.sniff(rl, "grpo_math_1B.yaml") > 0
    assert nemo_rl.sniff(n1, "x.yaml") == 0 and nemo.sniff(n1, "x.yaml") > 0
    assert nemo.sniff("a: 1\n", "x.yaml") == 0 and nemo_rl.sniff("a: 1\n", "x.yaml") == 0


def test_no_environment_is_read(monkeypatch, tmp_path):
    assert "RK_UNSET" not in os.environ
    path = tmp_path / "e.yaml"
    path.write_text("policy:\n  train_micro_batch_size: ${oc.env:RK_UNSET,7}\n")
    r = _rl(path)
    # not the environment's 7; the file names no algorithm, so no base's default either
    assert "micro_batch_size" not in r.values


def test_nemo_cross_entropy_loss_fusion_is_read():
    # NeMo-Framework-Launcher llama2_70b.yaml line 129 (a TransformerConfig field NeMo 1.x
    # passes by name); a skill trial saw it reported as the default False
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parent / "corpus" / "nemo" / "blind_launcher_llama2_70b.yaml"
    resolved = resolve([str(path)])
    assert resolved.config.model.cross_entropy_loss_fusion is True
    assert resolved.reading.origins["cross_entropy_loss_fusion"].where.endswith(":129")


def test_a_nemo1_yaml_takes_hydra_overrides_as_its_script_and_the_launcher_do():
    # A skill trial: `read llama2_70b.yaml trainer.num_nodes=16` (and the launcher's own
    # `training.trainer.num_nodes=16`) was refused as "not a NeMo-RL or Megatron-Bridge config";
    # NeMo 1.x scripts and NeMo-Framework-Launcher take Hydra overrides of this file.
    from recompute_kit.sources.resolve import read_input

    path = str(CORPUS / "nemo" / "blind_launcher_llama2_70b.yaml")
    for word in ("trainer.num_nodes=16", "training.trainer.num_nodes=16"):
        reading, _ = read_input(path, [word, "model.micro_batch_size=2"])
        assert reading.get("world_size") == 16 * 8, word
        assert "trainer.num_nodes=16" in reading.origins["world_size"].note
        assert reading.get("micro_batch_size") == 2
        assert reading.origins["micro_batch_size"].where == "command line"
    # struct mode: a key the file lacks needs `+` (as Hydra says), and is not applied
    reading, _ = read_input(path, ["model.no_such_key=1", "+model.recompute_modules=[mlp]"])
    assert any("needs +model.no_such_key=1" in w for w in reading.warnings)
    assert reading.get("recompute_modules") == ["mlp"]
    # a null the file writes is read from the file (NeMo passes it on), not a default
    reading, _ = read_input(path, ["model.activations_checkpoint_method=null"])
    assert reading.get("recompute_method") is None
    assert reading.origins["recompute_method"].where == "command line"
    reading, _ = read_input(path)
    assert reading.origins["recompute_num_layers"].where.endswith(":123")


def test_launcher_nemotron_340b_reads_its_gradient_dtype_and_tokenizer_size():
    # A skill trial on NeMo-Framework-Launcher's nemotron_340b.yaml (tests/data/read/README.md):
    # optim.grad_sync_dtype bf16 was left unused and fp32 gradients counted (9.8 GiB per rank
    # too many; megatron_gpt_model.py: grad_reduce_in_fp32=(optim.grad_sync_dtype == 'fp32')),
    # and the vocabulary was 32000 where its tokenizer is nemotron_2_256k.model.
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parents[1] / "data" / "read" / "launcher_nemotron_340b.yaml"
    r = resolve([str(path)]).reading
    assert r.get("grad_reduce_in_fp32") is False
    assert r.origins["grad_reduce_in_fp32"].key == "model.optim.grad_sync_dtype"
    assert "model.optim.grad_sync_dtype" not in r.unused
    assert r.get("vocab_size") == 256000 and r.origins["vocab_size"].kind == "assumed"
    assert "override_vocab_size" in r.origins["vocab_size"].key


def test_deferred_embedding_wgrad_is_said_as_not_counted(tmp_path):
    # A skill trial on the launcher's nemotron_340b.yaml (defer_embedding_wgrad_compute with
    # wgrad_deferral_limit 22): about 5.8 GiB the last stage keeps until the flush went unsaid.
    # Said for every format that writes it (a YAML key, a Megatron-LM flag).
    from recompute_kit.sources.resolve import resolve

    path = Path(__file__).parents[1] / "data" / "read" / "launcher_nemotron_340b.yaml"
    said = [w for w in resolve([str(path)]).reading.warnings if "until the pipeline flush" in w]
    assert said and said[0].startswith("model.defer_embedding_wgrad_compute")
    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 "
        "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 "
        "--pipeline-model-parallel-size 2 --defer-embedding-wgrad-compute\n"
    )
    r = resolve([str(script)], overrides={"data_parallel_size": 1}).reading
    assert any(w.startswith("--defer-embedding-wgrad-compute: the last stage") for w in r.warnings)
    script.write_text(script.read_text().replace(" --defer-embedding-wgrad-compute", ""))
    r = resolve([str(script)], overrides={"data_parallel_size": 1}).reading
    assert not any("until the pipeline flush" in w for w in r.warnings)
