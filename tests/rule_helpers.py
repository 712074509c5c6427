"""Shared pieces of the rule tests (tests/test_rules*.py): where each text comes from
(`SOURCES`, kept in rule_sources.py), which test covers which rule (`covers`), the doctor run
as the CLI runs it, and realistic configs. The doctor's rule catalog has one or more tests per rule.

Every rule about tool output is fed VERBATIM text from a real source through the real parsers
(`evidence.collect`, i.e. parse_log / parse_config / parse_experiments) and then `diagnose`.
The texts live in tests/data/rules/ (one file per source, the text only); `SOURCES` and a
comment in each test name where each came from. Blocks named like `oom-pt-pr99699` or
`tc-measured-*` are copied from ../shared/reference/real-formats.md (which names their URL);
`seed-001-*` is ../shared/seeds/001_ef50205b3ce230ec.txt (the NVIDIA perf-activation-recompute
skill, with its Llama3-70B experiment table). Rules about a model shape get realistic configs
written as text (Megatron-LM command lines, Megatron-Bridge / recompute-kit YAML, Hydra
overrides) and, where it matters, a real OOM message.

A few rules have no public text that shows their pattern (RK003, RK006, RK007, RK023's
experiment path, RK035, RK080) or cannot be reached through the parsers (RK076): their
positive tests build the Evidence from numbers stated in a real thread, say so, and say why.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rule_sources import SOURCES

from recompute_kit.doctor.engine import Diagnosis, Finding, diagnose
from recompute_kit.doctor.evidence import collect

DATA = Path(__file__).parent / "data" / "rules"
GIB = 2**30

# ---- which test covers which rule (checked by test_every_rule_has_a_named_test) -------------

COVERED: dict[str, list[str]] = {}


def covers(*rule_ids: str):
    def mark(fn):
        for rule_id in rule_ids:
            COVERED.setdefault(rule_id, []).append(fn.__name__)
        return fn

    return mark


# ---- helpers --------------------------------------------------------------------------------


def text(name: str) -> str:
    assert name in SOURCES, f"{name} has no source"
    return (DATA / f"{name}.txt").read_text(encoding="utf-8")


def run(
    log: str = "",
    *,
    config: str | None = None,
    config_name: str = "config.yaml",
    experiments: str | None = None,
    gpu_memory_gb: float | None = None,
    overrides: dict | None = None,
    inputs: list[str] | None = None,
) -> Diagnosis:
    """The doctor as the CLI runs it: files through `collect`, then `diagnose`; `overrides`
    are the command line's layout flags (--dp 8: {"data_parallel_size": 8}); `inputs`: real
    config inputs as --config takes them (paths, `recipe.py::fn(...)`, key=value), after
    `config`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        logs = []
        if log:
            (root / "train.log").write_text(log, encoding="utf-8")
            logs.append(str(root / "train.log"))
        config_path = experiments_path = None
        if config is not None:
            config_path = root / config_name
            config_path.write_text(config, encoding="utf-8")
        if experiments is not None:
            experiments_path = root / "experiments.md"
            experiments_path.write_text(experiments, encoding="utf-8")
        configs = [str(config_path)] if config_path else []
        evidence = collect(
            logs=logs,
            config=[*configs, *(inputs or [])] or None,
            experiments=str(experiments_path) if experiments_path else None,
            overrides=overrides,
        )
    return diagnose(evidence, gpu_memory_gb)


def ids(d: Diagnosis) -> list[str]:
    return [f.rule for f in d.findings]


def get(d: Diagnosis, rule_id: str) -> Finding:
    found = [f for f in d.findings if f.rule == rule_id]
    assert found, (
        f"{rule_id} did not fire; findings: {[(f.rule, f.confidence) for f in d.findings]}"
    )
    return found[0]


def top(d: Diagnosis) -> Finding:
    assert d.findings, "nothing fired"
    return d.findings[0]


def cites(f: Finding, *numbers: str) -> None:
    for number in numbers:
        assert number in f.evidence, f"{number!r} not in evidence: {f.evidence!r}"


def spec_patch(granularity, method=None, num_layers=None, modules=None) -> dict:
    return {
        "recompute_granularity": granularity,
        "recompute_method": method,
        "recompute_num_layers": num_layers,
        "recompute_modules": modules,
    }


# ---- realistic configs, written as users write them ----------------------------------------

# Llama-3-70B pretraining with Megatron-LM (shape of the public Llama-3 recipe); 32k context.
LLAMA3_70B_32K = """\
torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py \\
    --num-layers 80 \\
    --hidden-size 8192 \\
    --num-attention-heads 64 \\
    --group-query-attention \\
    --num-query-groups 8 \\
    --ffn-hidden-size 28672 \\
    --swiglu \\
    --normalization RMSNorm \\
    --seq-length 32768 \\
    --max-position-embeddings 32768 \\
    --micro-batch-size 1 \\
    --global-batch-size 512 \\
    --tensor-model-parallel-size 8 \\
    --pipeline-model-parallel-size 4 \\
    --sequence-parallel \\
    --use-distributed-optimizer \\
    --padded-vocab-size 128256 \\
    --transformer-impl transformer_engine \\
    --bf16
"""

# Llama-3-70B at 8k on TP8 only, without the distributed optimizer: model states do not fit.
LLAMA3_70B_TP8_NO_DISTOPT = """\
torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py \\
    --num-layers 80 \\
    --hidden-size 8192 \\
    --num-attention-heads 64 \\
    --group-query-attention \\
    --num-query-groups 8 \\
    --ffn-hidden-size 28672 \\
    --swiglu \\
    --normalization RMSNorm \\
    --seq-length 8192 \\
    --micro-batch-size 1 \\
    --tensor-model-parallel-size 8 \\
    --pipeline-model-parallel-size 1 \\
    --sequence-parallel \\
    --padded-vocab-size 128256 \\
    --bf16
"""

# The flags of https://github.com/NVIDIA/Megatron-LM/issues/1031 ("Throughput low for 70B
# training": 128 H100, TP8 PP8, full uniform 5, distribute-saved-activations).
LLAMA3_70B_MLM_1031 = """\
torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py \\
      --num-layers 80 \\
      --hidden-size 8192 \\
      --num-attention-heads 64 \\
      --group-query-attention \\
      --num-query-groups 8 \\
      --ffn-hidden-size 28672 \\
      --swiglu \\
      --normalization RMSNorm \\
      --seq-length 4096 \\
      --micro-batch-size 1 \\
      --tensor-model-parallel-size 8 \\
      --pipeline-model-parallel-size 8 \\
      --use-distributed-optimizer \\
      --overlap-grad-reduce \\
      --overlap-param-gather \\
      --recompute-granularity full \\
      --recompute-method uniform \\
      --recompute-num-layers 5 \\
      --distribute-saved-activations \\
      --bf16
"""

# Llama-3.1-8B with --recompute-activations (selective core_attn) and TransformerEngine.
LLAMA3_8B_SELECTIVE = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 \\
    --hidden-size 4096 \\
    --ffn-hidden-size 14336 \\
    --num-attention-heads 32 \\
    --group-query-attention \\
    --num-query-groups 8 \\
    --swiglu \\
    --normalization RMSNorm \\
    --seq-length 8192 \\
    --micro-batch-size 1 \\
    --tensor-model-parallel-size 2 \\
    --sequence-parallel \\
    --use-distributed-optimizer \\
    --padded-vocab-size 128256 \\
    --transformer-impl transformer_engine \\
    --recompute-activations \\
    --bf16
"""

# Mixtral-8x7B (Megatron-LM MoE example flags) recomputing 'mlp', which MoE layers ignore.
MIXTRAL_8X7B_MLP = """\
torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \\
    --num-layers 32 \\
    --hidden-size 4096 \\
    --ffn-hidden-size 14336 \\
    --num-attention-heads 32 \\
    --group-query-attention \\
    --num-query-groups 8 \\
    --seq-length 4096 \\
    --max-position-embeddings 32768 \\
    --swiglu \\
    --normalization RMSNorm \\
    --untie-embeddings-and-output-weights \\
    --num-experts 8 \\
    --moe-router-topk 2 \\
    --moe-router-load-balancing-type aux_loss \\
    --moe-aux-loss-coeff 1e-2 \\
    --moe-grouped-gemm \\
    --moe-token-dispatcher-type alltoall \\
    --expert-model-parallel-size 8 \\
    --tensor-model-parallel-size 1 \\
    --pipeline-model-parallel-size 4 \\
    --micro-batch-size 1 \\
    --global-batch-size 256 \\
    --use-distributed-optimizer \\
    --recompute-granularity selective \\
    --recompute-modules mlp \\
    --padded-vocab-size 32000 \\
    --bf16
"""

# DeepSeek-V2-Lite shape (first layer dense, MLA, 64 experts top-6) in Megatron-Bridge YAML.
DEEPSEEK_V2_LITE_MLP = """\
model:
  num_layers: 27
  hidden_size: 2048
  ffn_hidden_size: 10944
  moe_ffn_hidden_size: 1408
  num_attention_heads: 16
  num_moe_experts: 64
  moe_router_topk: 6
  moe_shared_expert_intermediate_size: 2816
  moe_layer_freq: [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
  moe_grouped_gemm: true
  multi_latent_attention: true
  kv_lora_rank: 512
  qk_head_dim: 128
  qk_pos_emb_head_dim: 64
  v_head_dim: 128
  vocab_size: 102400
  seq_length: 4096
  normalization: RMSNorm
  swiglu: true
  bf16: true
  expert_model_parallel_size: 8
  recompute_granularity: selective
  recompute_modules: [mlp]
"""

# Qwen2.5-7B at 32k context (recompute-kit YAML with the data-parallel size).
QWEN25_7B_32K = """\
model:
  num_layers: 28
  hidden_size: 3584
  ffn_hidden_size: 18944
  num_attention_heads: 28
  num_query_groups: 4
  kv_channels: 128
  vocab_size: 152064
  seq_length: 32768
  normalization: RMSNorm
  swiglu: true
  bf16: true
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  sequence_parallel: true
  data_parallel_size: 8
  use_distributed_optimizer: true
  micro_batch_size: 1
  recompute_granularity: full
  recompute_method: uniform
  recompute_num_layers: 1
"""

# Llama-3.1-8B at 128k context on one GPU per replica, full recompute already on.
LLAMA31_8B_128K = """\
model:
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  vocab_size: 128256
  seq_length: 131072
  normalization: RMSNorm
  swiglu: true
  bf16: true
  tensor_model_parallel_size: 1
  pipeline_model_parallel_size: 1
  data_parallel_size: 64
  use_distributed_optimizer: true
  micro_batch_size: 1
  recompute_granularity: full
  recompute_method: uniform
  recompute_num_layers: 1
"""

# Llama-3.1-8B at 8k recomputing 'mlp' on TP2 with room to spare.
LLAMA31_8B_MLP = """\
model:
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  vocab_size: 128256
  seq_length: 8192
  normalization: RMSNorm
  swiglu: true
  bf16: true
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  sequence_parallel: true
  data_parallel_size: 4
  use_distributed_optimizer: true
  micro_batch_size: 1
  recompute_granularity: selective
  recompute_modules: [mlp]
"""


def intended_patch(f: Finding) -> dict:
    """The setting the rule advised: the shown `config_patch` plus the entries the patch check
    (doctor/patches.py) left out because the inputs already have that value."""
    already = {
        d["key"]: d["value"]
        for d in f.patch_check.get("dropped", [])
        if d["reason"].startswith("already")
    }
    return {**already, **f.config_patch}


def llava_inputs() -> list[str]:
    """LLaVA-1.5 13B's run as tests/data/launch/llava holds it (verbatim): Llama 2 13B's
    config.json, scripts/v1_5/finetune.sh and its ZeRO-3 JSON."""
    llava = Path(__file__).parent / "data" / "launch" / "llava"
    return [
        str(llava / "llama2_13b_config.json"),
        str(llava / "scripts" / "v1_5" / "finetune.sh"),
        str(llava / "scripts" / "zero3.json"),
    ]
