"""The doctor's rule catalog (recompute_kit/doctor/rules.py), one or more tests per rule.

Every rule about tool output is fed VERBATIM text from a real source through the real parsers
(`evidence.collect`, i.e. parse_log / parse_config / parse_experiments) and then `diagnose`.
The texts live in tests/data/rules/ (one file per source, the text only); `SOURCES` below and a
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

import re
import tempfile
from pathlib import Path

import pytest

from recompute_kit.doctor.engine import Diagnosis, Finding, build_context, diagnose
from recompute_kit.doctor.evidence import (
    ErrorEvent,
    Evidence,
    MemoryReport,
    OOMEvent,
    collect,
    parse_config,
    parse_log,
)
from recompute_kit.doctor.rules import (
    CATEGORIES,
    EXPANDABLE,
    RULES,
    catalog_markdown,
    gib,
    patch_for,
)

DATA = Path(__file__).parent / "data" / "rules"
GIB = 2**30
TC = "https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030"
LOCAL = "reproduced with the public torch.utils.checkpoint on CPU (real-formats.md)"

# file name (without .txt) -> where the text comes from
SOURCES = {
    "oom-pt-pr99699": "https://github.com/pytorch/pytorch/pull/99699",
    "oom-pt-16417-title": "https://github.com/pytorch/pytorch/issues/16417",
    "oom-pt-16417-comment": "https://github.com/pytorch/pytorch/issues/16417",
    "oom-unilm-137": "https://github.com/microsoft/unilm/issues/137",
    "oom-mlm-525": "https://github.com/NVIDIA/Megatron-LM/issues/525",
    "oom-msswift-9191": "https://github.com/modelscope/ms-swift/issues/9191",
    "pt-71616": "https://github.com/pytorch/pytorch/issues/71616",
    "pt-175431": "https://github.com/pytorch/pytorch/issues/175431",
    "pt-35901": "https://github.com/pytorch/pytorch/issues/35901",
    "pt-111363": "https://github.com/pytorch/pytorch/issues/111363",
    "pt-pr13751": "https://github.com/pytorch/pytorch/pull/13751",
    "returnn-1469": "https://github.com/rwth-i6/returnn/issues/1469",
    "zerosearch-11": "https://github.com/Alibaba-NLP/ZeroSearch/issues/11",
    "trl-4237": "https://github.com/huggingface/trl/issues/4237",
    "vllm-10637": "https://github.com/vllm-project/vllm/issues/10637",
    "dots-ocr-196": "https://github.com/studio-dots-ai/dots.ocr/issues/196",
    "therock-1054": "https://github.com/ROCm/TheRock/issues/1054",
    "mlm-92": "https://github.com/NVIDIA/Megatron-LM/issues/92",
    "mlm-60": "https://github.com/NVIDIA/Megatron-LM/issues/60",
    "trl-pr2776": "https://github.com/huggingface/trl/pull/2776",
    "msswift-6149": "https://github.com/modelscope/ms-swift/issues/6149",
    "mlm-2294-error": "https://github.com/NVIDIA/Megatron-LM/issues/2294",
    "mlm-2294-config": "https://github.com/NVIDIA/Megatron-LM/issues/2294",
    "ppuu-21": "https://github.com/Atcold/pytorch-PPUU/issues/21",
    "chatglm-tuning-56": "https://github.com/mymusise/ChatGLM-Tuning/issues/56",
    "transformers-17464": "https://github.com/huggingface/transformers/issues/17464",
    "roformer-39": "https://github.com/JunnYu/RoFormer_pytorch/issues/39",
    "nemo-speech-14241": "https://github.com/NVIDIA-NeMo/Speech/issues/14241 (title)",
    "bnb-182": "https://github.com/bitsandbytes-foundation/bitsandbytes/issues/182",
    "unsloth-18": "https://github.com/OEvortex/unsloth/issues/18",
    "mbridge-2684": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/2684 "
    "(megatron-recompute.md section 5, row 25)",
    "mbridge-skill-cuda-graph": "Megatron-Bridge perf-activation-recompute skill / seed 001; "
    "assert message of megatron-recompute.md section 1, rule 30",
    "mlm-rule17-delayed-scaling": "megatron-recompute.md section 1, rule 17 (ValueError)",
    "mlm-rule20-fine-grained-offloading": "megatron-recompute.md section 1, rule 20 (assert)",
    "mlm-rule27-distribute-saved": "megatron-recompute.md section 1, rule 27 (arguments.py assert)",
    "mlm-rule29-cuda-graphs": "megatron-recompute.md section 1, rule 29 (ValueError)",
    "ex-args-local-v014-full": "real-formats.md ex-args-local-v014-full (Megatron-LM core_v0.14)",
    "ex-nemo-14850": "https://github.com/NVIDIA-NeMo/Speech/issues/14850",
    "ex-mlm-pr5662": "https://github.com/NVIDIA/Megatron-LM/pull/5662",
    "seed-001-perf-activation-recompute": "../shared/seeds/001_ef50205b3ce230ec.txt",
    **{f"ckpt-local-{n}": LOCAL for n in ("grad-reentrant", "no-input-grad", "ddp")},
    **{f"ckpt-local-{n}": LOCAL for n in ("use-reentrant-missing", "metadata", "kwargs-reentrant")},
    **{
        f"tc-measured-{n}": TC
        for n in (
            "full-no-method",
            "full-no-num-layers",
            "full-bad-method",
            "bad-granularity",
            "selective-with-num-layers",
            "selective-bad-module",
            "moe-act-without-grouped-gemm",
            "mla-up-proj-without-mla",
            "shared-experts-with-overlap",
            "cpu-offload-with-recompute",
            "distribute-saved-with-sp",
            "moe-layer-recompute-with-full",
        )
    },
    "i12-automodel-1975": "https://github.com/NVIDIA-NeMo/Automodel/pull/1975",
    "i12-automodel-2634": "https://github.com/NVIDIA-NeMo/Automodel/pull/2634",
    "i12-automodel-2635": "https://github.com/NVIDIA-NeMo/Automodel/pull/2635",
    "i12-nemorl-3280": "https://github.com/NVIDIA-NeMo/RL/pull/3280",
    "i12-nemorl-3280-config": "https://github.com/NVIDIA-NeMo/RL/pull/3280",
    "i12-rocm-megatron-85": "https://github.com/ROCm/Megatron-LM/pull/85",
    "i12-rocm-megatron-85-config": "https://github.com/ROCm/Megatron-LM/pull/85",
    "i12-te-3284": "https://github.com/NVIDIA/TransformerEngine/pull/3284",
    "i12-cosmosrl-388": "https://github.com/nvidia-cosmos/cosmos-rl/pull/388",
    "i12-diffusers-12776": "https://github.com/huggingface/diffusers/issues/12776",
    "i12-ds-5704": "https://github.com/deepspeedai/DeepSpeed/issues/5704",
    "i12-imgcap-57": "https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning/issues/57",
    "i12-mamba-909": "https://github.com/state-spaces/mamba/pull/909",
    "i12-modalities-361": "https://github.com/Modalities/modalities/issues/361",
    "i12-piccolo-8": "https://github.com/OpenSenseNova/piccolo-embedding/issues/8",
    "i12-pt-35901": "https://github.com/pytorch/pytorch/issues/35901",
    "i12-pt-49481": "https://github.com/pytorch/pytorch/issues/49481",
    "i12-internlm-326": "https://github.com/InternLM/InternLM-XComposer/issues/326",
    "i12-pytorch-40863": "https://github.com/pytorch/pytorch/issues/40863",
    "i12-llamafactory-1158": "https://github.com/hiyouga/LlamaFactory/issues/1158",
    "i12-llamafactory-1158-config": "https://github.com/hiyouga/LlamaFactory/issues/1158",
    "i12-nemorl-2871": "https://github.com/NVIDIA-NeMo/RL/issues/2871",
    "i12-slime-1486": "https://github.com/THUDM/slime/pull/1486",
    "i12-torchtitan-1117": "https://github.com/pytorch/torchtitan/issues/1117",
    "i12-unslothzoo-1001": "https://github.com/unslothai/unsloth-zoo/pull/1001",
    "i12-megatron-2754": "https://github.com/NVIDIA/Megatron-LM/pull/2754",
    "i12-llamafactory-1916": "https://github.com/hiyouga/LlamaFactory/issues/1916",
    "i12-mbridge-skill-expandable": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/9e12bbd5c6a27a19e6d4d92479ddcb02f7020457/skills/nemo-mbridge-perf-memory-tuning/SKILL.md",
    "i12-llamafactory-1221": "https://github.com/hiyouga/LlamaFactory/issues/1221",
    "i12-shannon-6": "https://github.com/ShannonAI/Self_Explaining_Structures_Improve_NLP_Models/issues/6",
    "i12-sglang-29838-npu": "https://github.com/sgl-project/sglang/issues/29838",
    # issue 13 (checkpoint / recompute / config): development corpus cases' pasted text
    "i13-diffusers-9850": "https://github.com/huggingface/diffusers/issues/9850",
    "i13-thunder-2116": "https://github.com/Lightning-AI/lightning-thunder/issues/2116",
    "i13-thunder-2116-config": "https://github.com/Lightning-AI/lightning-thunder/issues/2116",
    "i13-pt-71124": "https://github.com/pytorch/pytorch/issues/71124",
    "i13-olmocore-828": "https://github.com/allenai/OLMo-core/pull/828",
    "i13-olmocore-828-config": "https://github.com/allenai/OLMo-core/pull/828",
    "i13-ds-988": "https://github.com/deepspeedai/DeepSpeed/issues/988",
    "i13-openclip-573": "https://github.com/mlfoundations/open_clip/issues/573",
    "i13-openclip-573-config": "https://github.com/mlfoundations/open_clip/issues/573",
    "i13-dmd2-52": "https://github.com/tianweiy/DMD2/issues/52",
    "i13-nemo-speech-12517": "https://github.com/NVIDIA-NeMo/Speech/pull/12517",
    "i13-lightning-20329": "https://github.com/Lightning-AI/pytorch-lightning/issues/20329",
    "i13-pt-123548": "https://github.com/pytorch/pytorch/issues/123548",
    "i13-pt-128478": "https://github.com/pytorch/pytorch/issues/128478",
    "i13-llavallama3-4": "https://github.com/Victorwz/LLaVA-Llama-3/issues/4",
    "i13-unsloth-91": "https://github.com/unslothai/unsloth/issues/91",
    "i13-open-instruct-838": "https://github.com/allenai/open-instruct/pull/838",
    "i13-dsexamples-332": "https://github.com/deepspeedai/DeepSpeedExamples/issues/332",
    "i13-dsexamples-332-config": "https://github.com/deepspeedai/DeepSpeedExamples/issues/332",
    "i13-hf-47254": "https://github.com/huggingface/transformers/issues/47254",
    "i13-pt-171355": "https://github.com/pytorch/pytorch/issues/171355",
    "i13-hf-15959": "https://github.com/huggingface/transformers/issues/15959",
    "i13-megatron-pr6311": "https://github.com/NVIDIA/Megatron-LM/pull/6311",
    "ckpt-local-debug-topk": "torch.utils.checkpoint debug=True, reproduced on CPU (torch 2.13.0): "
    "a function that runs topk only in the recompute",
    "nemo-megatron-gpt-config-ac": "https://github.com/NVIDIA/NeMo/blob/main/examples/nlp/"
    "language_modeling/conf/megatron_gpt_config.yaml (Activation Checkpointing block)",
    "mlm-args-dump-recompute-none": "https://github.com/hwang2006/large-scale-lm-tutorials/blob/"
    "main/docs/06_tensor_parallelism.md (Megatron-LM argument dump of a gpt2_345m run)",
    # issue 13 (memory categories): dev corpus cases' text, and one IPEX message
    "i13-llamafactory-2379": "https://github.com/hiyouga/LlamaFactory/issues/2379",
    "i13-llamafactory-2379-config": "https://github.com/hiyouga/LlamaFactory/issues/2379",
    "i13-llamafactory-5977": "https://github.com/hiyouga/LlamaFactory/issues/5977",
    "i13-automodel-3907": "https://github.com/NVIDIA-NeMo/Automodel/issues/3907",
    "i13-talking-head-36": "https://github.com/pkhungurn/talking-head-anime-demo/issues/36",
    "i13-cbdnet-7": "https://github.com/IDKiro/CBDNet-pytorch/issues/7",
    "i13-llamafactory-922": "https://github.com/hiyouga/LlamaFactory/issues/922",
    "ipex-629": "https://github.com/intel/intel-extension-for-pytorch/issues/629",
    # default readings (RK170/RK171): dev corpus cases' pasted text
    "i17-automodel-2585": "https://github.com/NVIDIA-NeMo/Automodel/pull/2585",
    "i17-automodel-2585-config": "https://github.com/NVIDIA-NeMo/Automodel/pull/2585",
    "i17-improved-diffusion-3": "https://github.com/openai/improved-diffusion/issues/3",
    "i17-llama2-accessory-26": "https://github.com/Alpha-VLLM/LLaMA2-Accessory/issues/26",
    "i17-slime-1450-config": "https://github.com/THUDM/slime/issues/1450",
    "i17-mistral-116928-summary": "https://github.com/pytorch/pytorch/issues/116928",
    # prose reports next to an OOM (RK190/RK191): dev corpus cases' pasted text
    "i19-verl-5364": "https://github.com/verl-project/verl/pull/5364",
    "i19-skyrl-1768": "https://github.com/NovaSky-AI/SkyRL/pull/1768",
    # generic memory findings in the paste's knobs; shell variables that hold flags
    "i22-mlm-pretrain-gpt-distributed": "https://github.com/NVIDIA/Megatron-LM/blob/"
    "9e72d571f49296d7002889cc19692d97a5b0f92e/examples/pretrain_gpt_distributed.sh",
    "i22-ccf-ner-6": "https://github.com/BaberMuyu/2020CCF-NER/issues/6",
    "i22-ccf-ner-6-config": "https://github.com/BaberMuyu/2020CCF-NER/issues/6",
    "i22-pt-107667": "https://github.com/pytorch/pytorch/issues/107667",
    "i22-pt-28113": "https://github.com/pytorch/pytorch/issues/28113",
    "i22-pt-37250": "https://github.com/pytorch/pytorch/issues/37250 (beyondguo's comment)",
    # general readings (RK260-RK265) and default readings from prose: dev corpus cases' text
    "i26-hf-46822": "https://github.com/huggingface/transformers/issues/46822",
    "i26-hf-28499": "https://github.com/huggingface/transformers/issues/28499",
    "i26-attngym-32": "https://github.com/meta-pytorch/attention-gym/issues/32",
    "i26-pt-133206": "https://github.com/pytorch/pytorch/issues/133206",
    "i26-trl-3678": "https://github.com/huggingface/trl/issues/3678",
    "i26-pt-71616-report": "https://github.com/pytorch/pytorch/issues/71616",
    "i26-pt-85447": "https://github.com/pytorch/pytorch/pull/85447",
    "i26-openrlhf-384": "https://github.com/OpenRLHF/OpenRLHF/issues/384",
    "i26-openrlhf-392": "https://github.com/OpenRLHF/OpenRLHF/issues/392",
    "i26-openrlhf-392-config": "https://github.com/OpenRLHF/OpenRLHF/issues/392",
}

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
) -> Diagnosis:
    """The doctor as the CLI runs it: files through `collect`, then `diagnose`."""
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
        evidence = collect(
            logs=logs,
            config=str(config_path) if config_path else None,
            experiments=str(experiments_path) if experiments_path else None,
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


# =============================================================================================
# The catalog itself
# =============================================================================================


def test_rule_ids_are_unique_and_well_formed():
    found = [r.id for r in RULES]
    assert len(found) == len(set(found)), "duplicate rule ids"
    assert all(re.fullmatch(r"RK\d{3}", i) for i in found)
    assert found == sorted(found), "rules are listed in id order"
    assert len(RULES) >= 49


def test_rule_categories_and_docs_are_valid():
    assert len(CATEGORIES) == len(set(CATEGORIES))
    for r in RULES:
        assert r.category in CATEGORIES, (r.id, r.category)
        for part in (r.title, r.symptom, r.cause, r.confirm, r.fix):
            assert part.strip(), (r.id, "empty documentation")
        assert isinstance(r.config_patch, dict)
        assert set(r.supersedes) <= {x.id for x in RULES}, (r.id, r.supersedes)
        assert r.id not in r.supersedes
        doc = r.doc()
        assert doc["rule"] == r.id and doc["category"] == r.category


def test_catalog_markdown_lists_every_rule_in_a_well_formed_table():
    md = catalog_markdown()
    lines = md.splitlines()
    header = "| id | category | symptom | cause | confirm | fix |"
    start = lines.index(header)
    assert lines[start + 1] == "|---|---|---|---|---|---|"
    rows = [line for line in lines[start + 2 :] if line.startswith("| RK")]
    assert len(rows) == len(RULES)
    assert f"{len(RULES)} rules." in md
    for r, row in zip(RULES, rows, strict=True):
        assert row.startswith(f"| {r.id} | {r.category} | **")
        assert row.endswith(" |")
        # six cells: split on unescaped pipes only
        cells = re.split(r"(?<!\\)\|", row)[1:-1]
        assert len(cells) == 6, (r.id, cells)
        assert "\n" not in row
    # a pipe inside a cell is escaped, not a column break
    assert all(r.id in md for r in RULES)


def test_every_rule_has_a_named_test():
    missing = sorted({r.id for r in RULES} - set(COVERED))
    assert not missing, f"rules without a test: {missing}"
    unknown = sorted(set(COVERED) - {r.id for r in RULES})
    assert not unknown, f"tests name unknown rules: {unknown}"


def test_sources_exist_for_every_data_file():
    files = {p.stem for p in DATA.glob("*.txt")}
    assert files == set(SOURCES), files ^ set(SOURCES)


# =============================================================================================
# RK001-RK007: reading the OOM message
# =============================================================================================


@covers("RK001")
def test_rk001_fragmentation_in_a_pre_2_1_message():
    # https://github.com/pytorch/pytorch/issues/71616: 36.19 GiB reserved, 22.96 GiB allocated
    # at a 648 MiB request (PyTorch <= 2.0 prints no "reserved but unallocated": it is R - A).
    d = run(text("pt-71616"))
    f = top(d)
    assert f.rule == "RK001" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    assert f.config_patch["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    cites(f, "13.23 GiB", "648.00 MiB")  # 36.19 - 22.96, and the request as printed


@covers("RK001")
def test_rk001_fragmentation_in_a_current_message():
    # https://github.com/pytorch/pytorch/issues/175431 (ROCm): 14.93 GiB reserved but
    # unallocated, a 2.00 MiB request fails.
    f = top(run(text("pt-175431")))
    assert f.rule == "RK001"
    cites(f, "14.93 GiB", "2.00 MiB")
    assert f.config_patch == EXPANDABLE


@covers("RK001")
def test_rk001_hard_wrapped_message_from_the_pytorch_pr():
    # real-formats.md oom-pt-pr99699 (https://github.com/pytorch/pytorch/pull/99699), pasted
    # hard-wrapped: 410.41 MiB reserved-unallocated against 138.00 MiB.
    f = get(run(text("oom-pt-pr99699")), "RK001")
    cites(f, "410.41 MiB", "138.00 MiB")


@pytest.mark.parametrize(
    "name",
    [
        # real-formats.md oom-msswift-9191: 40.42 MiB slack, 48.00 MiB request, 139.81 GiB GPU
        "oom-msswift-9191",
        # real-formats.md oom-unilm-137 (2.0 format): 10.86 - 10.85 GiB reserved-allocated
        "oom-unilm-137",
        # real-formats.md oom-pt-16417-title (<=1.4 "cached" format): 4.68 MiB cached
        "oom-pt-16417-title",
    ],
)
@covers("RK001")
def test_rk001_not_when_reserved_unallocated_is_tiny(name):
    assert "RK001" not in ids(run(text(name)))


@covers("RK001")
def test_rk001_not_when_expandable_segments_is_already_set():
    # The same real OOM (pytorch#175431) from a job whose launcher already exports the
    # setting: the advice would be circular.
    d = run(
        text("pt-175431"),
        config="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "torchrun --nproc_per_node 8 train.py --bf16\n",
        config_name="launch.sh",
    )
    assert d.evidence.env.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    assert "RK001" not in ids(d)


@covers("RK002")
def test_rk002_other_processes_hold_the_gpu():
    # https://github.com/rwth-i6/returnn/issues/1469: 15 other workers hold 1.19 GiB each
    # ("every worker reserves memory on every GPU").
    f = top(run(text("returnn-1469")))
    assert f.rule == "RK002" and f.category == "other_processes"
    cites(f, "17.85 GiB", "31.74 GiB")  # 15 x 1.19 GiB of the 31.74 GiB GPU
    assert f.confidence >= 0.9


@pytest.mark.parametrize(
    "name, held",
    [
        # https://github.com/Alibaba-NLP/ZeroSearch/issues/11: a simulation server (30.51 GiB)
        # shares the GPU; no "this process" line, so our own process is listed too.
        ("zerosearch-11", "30.92 GiB"),
        # https://github.com/huggingface/trl/issues/4237: sibling xdist workers in CI.
        ("trl-4237", "6.46 GiB"),
    ],
)
@covers("RK002")
def test_rk002_other_processes_in_a_container(name, held):
    d = run(text(name))
    f = top(d)
    assert f.rule == "RK002"
    cites(f, held)  # listed processes minus this process's own PyTorch memory


@pytest.mark.parametrize(
    "name",
    [
        # https://github.com/vllm-project/vllm/issues/10637: "Process 6513 has 15.63 GiB" is
        # the failing vLLM process itself (13.81 GiB allocated by PyTorch): PID namespace.
        "vllm-10637",
        # https://github.com/studio-dots-ai/dots.ocr/issues/196: "Process 2684311 has 14.51
        # GiB" is the process itself (13.44 GiB + 738.96 MiB PyTorch).
        "dots-ocr-196",
        # real-formats.md oom-pt-16417-comment: no other process at all.
        "oom-pt-16417-comment",
    ],
)
@covers("RK002")
def test_rk002_not_when_the_listed_process_is_this_one(name):
    assert "RK002" not in ids(run(text(name)))


@covers("RK003")
def test_rk003_memory_outside_pytorch():
    # WEAK: no public OOM message shows a large non-PyTorch share. The numbers are those
    # measured in https://github.com/NVIDIA/TransformerEngine/issues/2111 (device memory used
    # 31.6 GB while torch.cuda.memory_allocated stays 20.42 GB), placed in an OOMEvent.
    oom = OOMEvent(process_bytes=int(31.6e9), allocated_bytes=20423514624)
    d = diagnose(Evidence(oom=[oom]))
    f = top(d)
    assert f.rule == "RK003" and f.category == "non_pytorch_memory"
    cites(f, "29.43 GiB", "19.02 GiB")  # 31.6 GB and 20.42 GB in GiB


@pytest.mark.parametrize(
    "name",
    [
        # https://github.com/pytorch/pytorch/issues/111363: 41.06 GiB in use, 39.10 GiB
        # allocated + 427.46 MiB reserved: 1.5 GiB outside PyTorch is the CUDA context.
        "pt-111363",
        # real-formats.md oom-pt-pr99699: 15.32 GiB vs 14.12 GiB + 410.41 MiB.
        "oom-pt-pr99699",
    ],
)
@covers("RK003")
def test_rk003_not_for_an_ordinary_cuda_context(name):
    assert "RK003" not in ids(run(text(name)))


@pytest.mark.parametrize(
    "name, size, total",
    [
        # https://github.com/studio-dots-ai/dots.ocr/issues/196: eager attention matrix
        ("dots-ocr-196", "74.16 GiB", "44.40 GiB"),
        # https://github.com/pytorch/pytorch/pull/13751: the PR's own example (<=1.4 format)
        ("pt-pr13751", "16.00 GiB", "11.93 GiB"),
        # https://github.com/ROCm/TheRock/issues/1054: HIP, 16 GiB on a 15.24 GiB device
        ("therock-1054", "16.00 GiB", "15.24 GiB"),
    ],
)
@covers("RK004")
def test_rk004_one_allocation_larger_than_the_gpu(name, size, total):
    f = top(run(text(name)))
    assert f.rule == "RK004" and f.category == "allocation_exceeds_device"
    cites(f, size, total)


@covers("RK004")
def test_rk004_not_for_a_request_below_half_the_gpu():
    # https://github.com/pytorch/pytorch/issues/35901: 10.84 GiB of 23.65 GiB (46%); the
    # thread's cause was a split segment (fragmentation), which RK001 reports.
    d = run(text("pt-35901"))
    assert "RK004" not in ids(d)
    assert top(d).rule == "RK001"


@covers("RK005")
def test_rk005_pytorch_allocations_fill_the_gpu():
    # real-formats.md oom-msswift-9191 (https://github.com/modelscope/ms-swift/issues/9191):
    # 138.20 GiB of 139.81 GiB allocated by PyTorch, nothing else to blame.
    d = run(text("oom-msswift-9191"))
    f = top(d)
    assert f.rule == "RK005" and f.category == "genuine_pressure"
    cites(f, "138.20 GiB", "139.81 GiB")
    assert ids(d) == ["RK005"]


@covers("RK005")
def test_rk005_superseded_when_the_model_shape_explains_it():
    # The same OOM with a Llama-3-70B 32k config: the activation finding replaces RK005.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    assert "RK010" in ids(d) and "RK005" not in ids(d)


@covers("RK006")
def test_rk006_per_process_cap():
    # WEAK: no complete public OOM message with "allowed;" was found. Numbers from
    # https://github.com/pytorch/pytorch/issues/111729 ("4.77 GiB allowed; 4.74 GiB reserved
    # in total by PyTorch" on GPUs with 12.2 GiB each).
    oom = OOMEvent(
        allowed_bytes=round(4.77 * GIB),
        reserved_bytes=round(4.74 * GIB),
        total_bytes=round(12.2 * GIB),
    )
    f = get(diagnose(Evidence(oom=[oom])), "RK006")
    assert f.category == "informational"
    cites(f, "4.77 GiB", "12.20 GiB")


@covers("RK006")
def test_rk006_not_without_a_cap():
    # Real messages without "allowed;" (pytorch#111363 used the fraction API, but its message
    # did not print the cap - the bug the issue reports).
    for name in ("pt-111363", "oom-msswift-9191", "returnn-1469"):
        assert "RK006" not in ids(run(text(name))), name


@covers("RK007")
def test_rk007_cuda_graph_private_pools():
    # WEAK: the public messages with "allocated in private pools" that carry a URL hold less
    # than 1 GiB there. Numbers from a public notebook's OOM (47.00 GiB allocated, 46.22 GiB
    # of it in private pools, 47.53 GiB GPU), found through the code index without a URL.
    oom = OOMEvent(
        requested_bytes=2 * 2**20,
        total_bytes=round(47.53 * GIB),
        allocated_bytes=round(47.00 * GIB),
        private_pool_bytes=round(46.22 * GIB),
        reserved_unallocated_bytes=round(149.10 * 2**20),
    )
    f = get(diagnose(Evidence(oom=[oom])), "RK007")
    assert f.config_patch == {"cuda_graph_impl": "none"}
    cites(f, "46.22 GiB")


@covers("RK007")
def test_rk007_not_for_small_private_pools():
    # https://github.com/vllm-project/vllm/issues/10637: 106.00 MiB in private pools.
    d = run(text("vllm-10637"))
    assert d.evidence.oom[0].private_pool_bytes == 106 * 2**20
    assert "RK007" not in ids(d)


# =============================================================================================
# RK010-RK013: which memory dominates, with a model shape
# =============================================================================================


@covers("RK010")
def test_rk010_activations_dominate_llama3_70b_at_32k():
    # Llama-3-70B, TP8 PP4 at 32k context without recompute, and the H200 OOM of
    # real-formats.md oom-msswift-9191 (139.81 GiB device).
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    f = top(d)
    assert f.rule == "RK010" and f.category == "activation_memory"
    ctx = build_context(d.evidence)
    e = ctx.estimate
    cites(f, gib(e.peak_activation_bytes), "'none'")
    cites(f, gib(e.weights_bytes + e.grads_bytes + e.optimizer_bytes))
    # the patch is the planner's choice for this GPU, and the evidence names it
    best = ctx.best.estimate.recompute
    cites(f, f"'{best}'")
    assert f.config_patch["recompute_granularity"] in ("selective", "full")
    assert f.config_patch != spec_patch(None)
    assert e.peak_activation_bytes > e.weights_bytes + e.grads_bytes + e.optimizer_bytes


LLAMA3_8B_TP4_8K = """\
num_layers: 32
hidden_size: 4096
num_attention_heads: 32
num_query_groups: 8
ffn_hidden_size: 14336
gated_linear_unit: true
normalization: RMSNorm
seq_length: 8192
micro_batch_size: 1
padded_vocab_size: 128256
share_embeddings_and_output_weights: false
position_embedding_type: rope
add_bias_linear: false
bias_activation_fusion: true
apply_rope_fusion: true
hidden_dropout: 0.0
attention_dropout: 0.0
tensor_model_parallel_size: 4
sequence_parallel: true
data_parallel_size: 8
use_distributed_optimizer: true
bf16: true
"""


@covers("RK010")
def test_rk010_recompute_makes_it_fit_though_states_are_larger():
    # The real 23.65 GiB OOM of pytorch/pytorch#16417 with Llama-3-8B on TP4 at 8k: model
    # states outweigh activations, yet the rank does not fit without recompute and does with
    # it. The shape was given: the finding must not fall back to RK005's "without a model
    # shape" advice.
    d = run(text("oom-pt-16417-comment"), config=LLAMA3_8B_TP4_8K, config_name="l8b.yaml")
    f = top(d)
    assert f.rule == "RK010" and f.category == "activation_memory"
    ctx = build_context(d.evidence)
    e = ctx.estimate
    assert e.peak_activation_bytes < e.weights_bytes + e.grads_bytes + e.optimizer_bytes
    assert e.total_bytes > ctx.gpu_bytes
    cites(f, gib(e.total_bytes), "23.65 GiB", f"'{ctx.best.estimate.recompute}'")
    assert f.config_patch["recompute_granularity"] in ("selective", "full")
    assert "RK005" not in ids(d)


@covers("RK010")
def test_rk010_needs_an_oom():
    # The same config without an OOM is a plan, not a diagnosis.
    d = run(config=LLAMA3_70B_32K, config_name="pretrain.sh", gpu_memory_gb=141)
    assert "RK010" not in ids(d)


@covers("RK011")
def test_rk011_model_states_dominate_without_the_distributed_optimizer():
    # Llama-3-70B on TP8 alone, Adam states unsharded, and the real H200 OOM
    # (oom-msswift-9191): recompute cannot help.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_TP8_NO_DISTOPT, config_name="x.sh")
    f = top(d)
    assert f.rule == "RK011" and f.category == "model_state_memory"
    assert f.config_patch == {"use_distributed_optimizer": True}
    e = build_context(d.evidence).estimate
    cites(f, gib(e.weights_bytes), gib(e.grads_bytes), gib(e.optimizer_bytes), "139.81 GiB")


@covers("RK011")
def test_rk011_not_when_states_are_small():
    # Llama-3-70B TP8 PP4 with the distributed optimizer: states are a minority of the GPU.
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_32K, config_name="pretrain.sh")
    assert "RK011" not in ids(d)


@covers("RK012")
def test_rk012_logits_of_a_large_vocabulary_at_32k():
    # Qwen2.5-7B (152064 vocabulary) at 32k tokens on TP2, 80 GiB GPUs.
    d = run(config=QWEN25_7B_32K, config_name="qwen25_7b.yaml", gpu_memory_gb=80)
    f = get(d, "RK012")
    assert f.category == "logits_memory"
    cites(f, "32768 tokens x 152064", "9.28 GiB")  # 4 B x 32768 x 152064 / TP2
    assert f.config_patch == {"cross_entropy_loss_fusion": True}


@covers("RK012")
def test_rk012_not_for_a_short_sequence():
    # The same model at 4k: 1.16 GiB of fp32 logits per rank is no concern on 80 GiB.
    short = QWEN25_7B_32K.replace("seq_length: 32768", "seq_length: 4096")
    assert "RK012" not in ids(run(config=short, config_name="q.yaml", gpu_memory_gb=80))


@covers("RK013")
def test_rk013_even_full_recompute_does_not_fit():
    # Llama-3.1-8B at 128k context without context parallelism, full recompute on, and the
    # real H200 OOM (oom-msswift-9191).
    d = run(text("oom-msswift-9191"), config=LLAMA31_8B_128K, config_name="l8b.yaml")
    f = get(d, "RK013")
    assert f.category == "model_state_memory"
    assert top(d).category == "model_state_memory"
    cites(f, "Nothing fits in 139.81 GiB")
    assert "RK010" not in ids(d)  # superseded


@covers("RK013")
def test_rk013_needs_an_oom():
    d = run(config=LLAMA31_8B_128K, config_name="l8b.yaml", gpu_memory_gb=141)
    assert "RK013" not in ids(d)


# =============================================================================================
# RK020-RK023: settings that do not do what they seem to
# =============================================================================================


@covers("RK020")
def test_rk020_core_attn_with_fused_attention():
    # --recompute-activations (selective core_attn) with TransformerEngine attention and a real
    # OOM: the setting Megatron-LM#1225/#464 report as buying almost nothing.
    d = run(text("oom-msswift-9191"), config=LLAMA3_8B_SELECTIVE, config_name="l8b.sh")
    f = get(d, "RK020")
    assert f.category == "recompute_no_effect"
    assert f.confidence == 0.7
    assert f.config_patch["recompute_modules"] == ["mlp"]
    cites(f, "'selective:mlp'")


@covers("RK020")
def test_rk020_not_with_unfused_attention():
    # With --attention-backend unfused the [b, a, s, s] scores exist and core_attn removes them.
    unfused = LLAMA3_8B_SELECTIVE.replace(
        "--transformer-impl transformer_engine", "--attention-backend unfused"
    )
    d = run(text("oom-msswift-9191"), config=unfused, config_name="l8b.sh")
    assert "RK020" not in ids(d)


@covers("RK021")
def test_rk021_mlp_recompute_on_an_all_moe_model():
    # Mixtral-8x7B recomputing 'mlp' (skipped by Megatron on MoE layers), real H200 OOM.
    d = run(text("oom-msswift-9191"), config=MIXTRAL_8X7B_MLP, config_name="mixtral.sh")
    f = get(d, "RK021")
    assert f.confidence == 0.75
    assert f.config_patch["recompute_modules"] == ["layernorm", "moe_act"]
    assert "every layer is MoE" in f.evidence


@covers("RK021")
def test_rk021_mlp_recompute_acts_only_on_the_dense_layers():
    # DeepSeek-V2-Lite: the first layer is dense, the 26 others MoE.
    d = run(text("oom-msswift-9191"), config=DEEPSEEK_V2_LITE_MLP, config_name="dsv2l.yaml")
    f = get(d, "RK021")
    assert f.confidence == 0.5 and "dense layers" in f.evidence


@covers("RK021")
def test_rk021_not_on_a_dense_model():
    cfg = LLAMA3_8B_SELECTIVE.replace(
        "--recompute-activations", "--recompute-granularity selective --recompute-modules mlp"
    )
    assert "RK021" not in ids(run(text("oom-msswift-9191"), config=cfg, config_name="x.sh"))


@covers("RK022")
def test_rk022_layernorm_recompute_still_ooms():
    # seed 001, the skill's Llama3-70B table: "Exp 3 | [core_attn, layernorm] | ... | OOM".
    d = run(experiments=text("seed-001-perf-activation-recompute"))
    f = get(d, "RK022")
    assert f.category == "recompute_no_effect"
    cites(f, "Exp 3", "layernorm")
    assert f.config_patch["recompute_granularity"] == "selective"
    assert "mlp" in f.config_patch["recompute_modules"]


@covers("RK022")
def test_rk022_not_when_no_layernorm_row_ooms():
    # The same table without the Exp 3 row (only verbatim lines removed).
    table = "\n".join(
        line
        for line in text("seed-001-perf-activation-recompute").splitlines()
        if not line.startswith("| Exp 3 |")
    )
    assert "RK022" not in ids(run(experiments=table))


@covers("RK023")
def test_rk023_recompute_num_layers_without_a_granularity():
    # A launcher that sets the method and layer count but no --recompute-granularity (Megatron
    # then recomputes nothing), with the real H200 OOM (oom-msswift-9191).
    cfg = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 32 \\
    --hidden-size 4096 \\
    --num-attention-heads 32 \\
    --seq-length 8192 \\
    --micro-batch-size 1 \\
    --tensor-model-parallel-size 2 \\
    --use-distributed-optimizer \\
    --recompute-method uniform \\
    --recompute-num-layers 1 \\
    --bf16
"""
    f = get(run(text("oom-msswift-9191"), config=cfg, config_name="train.sh"), "RK023")
    assert f.category == "recompute_no_effect"
    assert "recompute_granularity is empty" in f.evidence


@covers("RK023")
def test_rk023_full_recompute_with_the_same_peak_as_none():
    # WEAK: no public ablation table shows identical peaks. radixark/miles PR #1482 describes
    # the case ("--recompute-granularity full never engages"; ~136 GiB/GPU either way); the
    # rows below restate it.
    rows = [
        {"name": "baseline", "recompute": "none", "peak_memory_bytes": 136 * GIB},
        {"name": "full", "recompute": "full:uniform:1", "peak_memory_bytes": 136 * GIB},
    ]
    f = get(diagnose(Evidence(experiments=rows)), "RK023")
    cites(f, "'full'", "136.00 GiB", "'baseline'")


@covers("RK023")
def test_rk023_not_when_granularity_is_set():
    # The real Megatron argument dump (full, uniform, 2) and the Megatron-LM#525 OOM.
    d = run(text("ex-args-local-v014-full") + text("oom-mlm-525"))
    assert d.evidence.config["recompute_granularity"] == "full"
    assert "RK023" not in ids(d)


# =============================================================================================
# RK030-RK036: recompute that costs too much, and where the peak went
# =============================================================================================


@covers("RK030", "RK031", "RK033")
def test_rk030_rk031_rk033_the_skills_llama3_70b_table():
    # seed 001: Exp 1 [mlp] -16.4%, Exp 2 [mlp, core_attn] -17.3% at the same 55.6 GB peak.
    d = run(experiments=text("seed-001-perf-activation-recompute"))
    f30 = top(d)
    assert f30.rule == "RK030" and f30.category == "recompute_overhead"
    cites(f30, "Exp 1", "-16.4%")
    assert f30.config_patch == spec_patch("full", "block", 1)
    f31 = get(d, "RK031")
    cites(f31, "586.8", "593.6")
    assert f31.config_patch == spec_patch("selective", modules=["mlp"])
    f33 = get(d, "RK033")
    cites(f33, "Exp 2", "-17.3%")


@covers("RK030")
def test_rk030_from_the_flop_model_without_experiments():
    # Llama-3.1-8B recomputing mlp, no table: the FLOP model prices it (> 12%).
    d = run(config=LLAMA31_8B_MLP, config_name="l8b.yaml", gpu_memory_gb=80)
    f = get(d, "RK030")
    assert re.search(r"adds \d+\.\d% to the step's FLOPs", f.evidence)
    assert f.confidence == 0.5


@covers("RK031", "RK033")
def test_rk031_rk033_not_without_the_regressing_rows():
    # The seed table without Exp 1 and Exp 2 (verbatim lines removed): only -0.8% and -1.1%.
    table = "\n".join(
        line
        for line in text("seed-001-perf-activation-recompute").splitlines()
        if not line.startswith(("| Exp 1 |", "| Exp 2 |"))
    )
    d = run(experiments=table)
    assert not {"RK030", "RK031", "RK033"} & set(ids(d))


@covers("RK032")
def test_rk032_full_recompute_where_selective_fits():
    # The flags of Megatron-LM#1031 on 80 GiB H100s: full/uniform/5 re-runs every layer.
    d = run(config=LLAMA3_70B_MLM_1031, config_name="pretrain_llama70b.sh", gpu_memory_gb=80)
    f = top(d)
    assert f.rule == "RK032" and f.category == "recompute_overhead"
    assert "RK090" not in ids(d)  # the same advice, superseded
    best = build_context(d.evidence, 80).best.estimate
    cites(f, f"'{best.recompute}'", f"{best.recompute_flops_fraction:.1%}")
    assert f.config_patch == patch_for(best.recompute)
    assert (
        best.recompute_flops_fraction
        < build_context(d.evidence, 80).estimate.recompute_flops_fraction
    )


@covers("RK032")
def test_rk032_never_advises_less_recompute_after_an_oom():
    d = run(text("oom-msswift-9191"), config=LLAMA3_70B_MLM_1031, config_name="x.sh")
    assert "RK032" not in ids(d)


@covers("RK034")
def test_rk034_uniform_groups_of_two_layers():
    # The real Megatron argument dump (real-formats.md ex-args-local-v014-full: full, uniform,
    # recompute_num_layers 2) followed by the Megatron-LM#525 OOM.
    d = run(text("ex-args-local-v014-full") + text("oom-mlm-525"))
    f = get(d, "RK034")
    assert f.category == "activation_memory"
    cites(f, "Groups of 2 layers")
    assert f.config_patch == spec_patch("full", "uniform", 1)


@covers("RK034")
def test_rk034_not_for_one_layer_per_group():
    one = LLAMA3_70B_MLM_1031.replace("--recompute-num-layers 5", "--recompute-num-layers 1")
    d = run(text("oom-mlm-525"), config=one, config_name="x.sh")
    assert "RK034" not in ids(d)


@covers("RK035")
def test_rk035_oom_on_different_ranks():
    # WEAK: no public log with OOMs of one job on several pipeline ranks was found; the two
    # events carry the fields of real-formats.md oom-msswift-9191 on ranks 0 and 97.
    base = parse_log(text("oom-msswift-9191")).oom[0]
    other = OOMEvent(**{**base.__dict__, "rank": 0})
    f = get(diagnose(Evidence(oom=[other, base])), "RK035")
    cites(f, "[0, 97]")


@covers("RK035")
def test_rk035_not_without_pipeline_stages():
    # Data-parallel replicas all OOM together; with PP = 1 there is no stage to move to.
    base = parse_log(text("oom-msswift-9191")).oom[0]
    other = OOMEvent(**{**base.__dict__, "rank": 0})
    cfg = parse_config(LLAMA3_70B_TP8_NO_DISTOPT, "x.sh")
    assert cfg["pipeline_model_parallel_size"] == 1
    assert "RK035" not in ids(diagnose(Evidence(oom=[other, base], config=cfg)))


@covers("RK035")
def test_rk035_not_for_a_single_rank():
    # oom-msswift-9191 is printed by rank 97 only; the seed table's OOMs are both on rank 0.
    d = run(text("oom-msswift-9191"), experiments=text("seed-001-perf-activation-recompute"))
    assert d.evidence.oom[0].rank == 97
    assert "RK035" not in ids(d)


@covers("RK036", "RK110")
def test_rk036_oom_in_the_optimizer_step():
    # https://github.com/huggingface/trl/pull/2776: the OOM is raised in AdamW's step. RK110
    # (optimizer states, issue 13) reads the same frames and supersedes RK036.
    d = run(text("trl-pr2776"))
    f = top(d)
    assert f.rule == "RK110" and f.category == "model_state_memory"
    cites(f, "adamw.py:606 in _multi_tensor_adamw")
    # TRL (Hugging Face / DeepSpeed, no Megatron keys, no stage): ZeRO-3, not Megatron's key
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    assert {"rule": "RK036", "reason": "superseded by RK110"} in d.dropped


@covers("RK036")
def test_rk036_oom_in_megatron_gradient_all_reduce():
    # https://github.com/NVIDIA/Megatron-LM/issues/60: allreduce_params in backward_step.
    f = get(run(text("mlm-60")), "RK036")
    assert "_flatten_dense_tensors" in f.evidence


@covers("RK036")
def test_rk036_not_for_an_oom_in_the_forward():
    # https://github.com/NVIDIA/Megatron-LM/issues/92: the OOM is in the loss, in forward.
    d = run(text("mlm-92"))
    assert "RK036" not in ids(d)
    # one 9.33 GiB tensor on a 10.76 GiB GPU, raised under post_language_model_processing: the
    # logits rule (RK016) names the cause and supersedes the generic RK004
    assert top(d).rule == "RK016" and "RK004" not in ids(d)


# =============================================================================================
# RK050-RK064: Megatron's validation messages
# =============================================================================================

VALIDATION_CASES = [
    # (rule, data file, expected patch or None) - the tc-measured-* blocks are Megatron's
    # messages measured on core_v0.14.0 and main (real-formats.md, TransformerConfig).
    ("RK050", "tc-measured-full-no-method", spec_patch("full", "uniform", 1)),
    ("RK051", "tc-measured-full-no-num-layers", spec_patch("full", "uniform", 1)),
    ("RK052", "tc-measured-selective-with-num-layers", None),
    ("RK053", "tc-measured-full-bad-method", None),
    ("RK053", "tc-measured-bad-granularity", None),
    ("RK054", "tc-measured-selective-bad-module", None),
    ("RK055", "tc-measured-moe-act-without-grouped-gemm", {"moe_grouped_gemm": True}),
    ("RK056", "tc-measured-mla-up-proj-without-mla", None),
    ("RK057", "tc-measured-shared-experts-with-overlap", {"moe_shared_expert_overlap": False}),
    ("RK058", "mlm-rule17-delayed-scaling", {"fp8_recipe": "tensorwise"}),
    ("RK059", "tc-measured-cpu-offload-with-recompute", {"cpu_offloading": False}),
    ("RK060", "tc-measured-distribute-saved-with-sp", {"distribute_saved_activations": False}),
    ("RK060", "mlm-rule27-distribute-saved", {"distribute_saved_activations": False}),
    ("RK061", "mlm-rule20-fine-grained-offloading", None),
    ("RK062", "mlm-rule29-cuda-graphs", {"cuda_graph_impl": "none"}),
    ("RK062", "mbridge-skill-cuda-graph", {"cuda_graph_impl": "none"}),
    (
        "RK063",
        "tc-measured-moe-layer-recompute-with-full",
        spec_patch("selective", None, None, ["moe"]),
    ),
]


@pytest.mark.parametrize("rule_id, name, patch", VALIDATION_CASES)
@covers(*sorted({c[0] for c in VALIDATION_CASES}))
def test_megatron_validation_message(rule_id, name, patch):
    d = run(text(name))
    f = top(d)
    assert f.rule == rule_id and f.category == "invalid_config"
    assert f.confidence == 0.95
    # the evidence quotes Megatron's message
    message = next(e.message for e in d.evidence.errors)
    assert message[:60] in f.evidence
    if patch is not None:
        assert f.config_patch == patch


CONFIG_CASES = [
    # (rule, config text, name, quoted message) - configs Megatron would reject, caught
    # before a run by the kit's own validation (Megatron's messages).
    (
        "RK050",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  recompute_granularity: full\n  recompute_num_layers: 1\n",
        "bridge.yaml",
        'recompute_method must be "block" or "uniform"',
    ),
    (
        "RK055",
        "model.num_layers=32 model.hidden_size=4096 model.num_attention_heads=32 "
        "model.num_moe_experts=8 model.moe_router_topk=2 model.recompute_granularity=selective "
        "model.recompute_modules=[moe_act,layernorm]",
        "overrides.txt",
        "only supported with moe_grouped_gemm",
    ),
    (
        "RK058",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  num_moe_experts: 64\n  moe_grouped_gemm: true\n  fp8: hybrid\n  fp8_recipe: delayed\n"
        "  recompute_granularity: selective\n  recompute_modules: [moe_act, layernorm]\n",
        "fp8.yaml",
        "Delayed scaling does not support",
    ),
    (
        "RK059",
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
        "--cpu-offloading-num-layers 8 --recompute-activations",
        "train.sh",
        "CPU offloading does not work when activation recomputation is enabled",
    ),
    (
        "RK061",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  cpu_offloading: true\n  cpu_offloading_num_layers: 4\n"
        "  fine_grained_activation_offloading: true\n  offload_modules: [core_attn]\n",
        "offload.yaml",
        "cannot be enabled with cpu_offloading",
    ),
]


@pytest.mark.parametrize("rule_id, config, name, quoted", CONFIG_CASES)
@covers(*sorted({c[0] for c in CONFIG_CASES}))
def test_megatron_validation_of_a_config(rule_id, config, name, quoted):
    d = run(config=config, config_name=name)
    f = top(d)
    assert f.rule == rule_id and f.category == "invalid_config"
    assert f.confidence == 0.9
    assert f.evidence.startswith("Megatron would reject this config")
    cites(f, quoted)


@covers("RK050", "RK051", "RK052", "RK053", "RK054", "RK055", "RK056", "RK057")
def test_validation_rules_silent_on_valid_configs():
    # Megatron-LM#1031's full/uniform/5 and the 8B selective launcher are valid.
    for cfg in (LLAMA3_70B_MLM_1031, LLAMA3_8B_SELECTIVE, MIXTRAL_8X7B_MLP):
        d = run(config=cfg, config_name="x.sh", gpu_memory_gb=80)
        assert not [f for f in d.findings if f.category == "invalid_config"], ids(d)


@covers("RK064")
def test_rk064_index_error_inside_megatron_recompute():
    # https://github.com/modelscope/ms-swift/issues/6149: IndexError from _get_layer under
    # tensor_parallel.checkpoint (Megatron core_v0.13.1).
    f = top(run(text("msswift-6149")))
    assert f.rule == "RK064" and f.category == "framework_bug"
    cites(f, "index 36 is out of range")


@covers("RK064")
def test_rk064_names_the_non_divisible_layer_count():
    # https://github.com/NVIDIA/Megatron-LM/issues/2294: the error and the issue's config.
    d = run(text("mlm-2294-error"), config=text("mlm-2294-config"), config_name="repro.py")
    f = top(d)
    assert f.rule == "RK064"
    cites(f, "index 24 is out of range", "24 layers", "recompute_num_layers 7")


@covers("RK064")
def test_rk064_not_for_an_index_error_in_a_data_loader():
    # https://github.com/Atcold/pytorch-PPUU/issues/21: "list index out of range" in
    # dataloader.py - nothing to do with recompute.
    d = run(text("ppuu-21"))
    assert d.evidence.errors and d.evidence.errors[0].type == "IndexError"
    assert "RK064" not in ids(d)


# =============================================================================================
# RK070-RK077: PyTorch / Hugging Face checkpoint API
# =============================================================================================

SELECTIVE_DEFAULT = {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
CHECKPOINT_CASES = [
    ("RK070", "ckpt-local-grad-reentrant", "checkpoint_api_misuse", {"use_reentrant": False}),
    ("RK071", "ckpt-local-no-input-grad", "checkpoint_api_misuse", {"use_reentrant": False}),
    # The warning alone (no error): usually harmless (frozen blocks, no_grad), RK099 says so.
    (
        "RK099",
        "bnb-182",
        "informational",
        {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    ),
    (
        "RK072",
        "ckpt-local-use-reentrant-missing",
        "checkpoint_api_misuse",
        {"use_reentrant": False},
    ),
    ("RK073", "ckpt-local-kwargs-reentrant", "checkpoint_api_misuse", {"use_reentrant": False}),
    ("RK074", "ckpt-local-ddp", "checkpoint_api_misuse", {"use_reentrant": False}),
    (
        "RK075",
        "ckpt-local-metadata",
        "nondeterministic_recompute",
        {"code": "torch.utils.checkpoint.set_checkpoint_debug_enabled(True)"},
    ),
    (
        "RK077",
        "chatglm-tuning-56",
        "invalid_config",
        {"command": "pip install -U transformers"},
    ),
    (
        "RK077",
        "transformers-17464",
        "invalid_config",
        {"command": "pip install -U transformers"},
    ),
    ("RK081", "roformer-39", "framework_bug", SELECTIVE_DEFAULT),
    ("RK081", "nemo-speech-14241", "framework_bug", SELECTIVE_DEFAULT),
    (
        "RK082",
        "mbridge-2684",
        "invalid_config",
        {"cpu_offloading_activations": True, "cpu_offloading_weights": False},
    ),
]


@pytest.mark.parametrize("rule_id, name, category, patch", CHECKPOINT_CASES)
@covers(*sorted({c[0] for c in CHECKPOINT_CASES}))
def test_message_rules(rule_id, name, category, patch):
    d = run(text(name))
    f = top(d)
    assert f.rule == rule_id and f.category == category
    assert f.config_patch == patch
    assert f.evidence.startswith('The log says: "')
    first = d.evidence.errors[0]
    assert first.message[:50] in f.evidence


@covers("RK070", "RK071", "RK072", "RK073", "RK074", "RK075", "RK077", "RK081", "RK082")
def test_message_rules_silent_on_an_oom():
    # None of the message rules fires on a plain OOM (real-formats.md oom-pt-16417-comment).
    d = run(text("oom-pt-16417-comment"))
    message_rules = {c[0] for c in CHECKPOINT_CASES} | {c[0] for c in VALIDATION_CASES}
    assert not message_rules & set(ids(d))


@covers("RK076")
def test_rk076_use_cache_warning_through_the_parser():
    # transformers logs this warning as a bare line (logger.warning_once); the parser knows it.
    # https://github.com/OEvortex/unsloth/issues/18: the warning behind a tqdm bar.
    assert "RK076" in ids(run(text("unsloth-18")))


@covers("RK076")
def test_rk076_use_cache_warning_as_an_event():
    # The same verbatim message (unsloth#18), handed over as the warning event it is.
    line = text("unsloth-18").strip()
    message = line[line.index("`use_cache") :]
    d = diagnose(Evidence(errors=[ErrorEvent("WARNING", message, kind="warning")]))
    f = top(d)
    assert f.rule == "RK076" and f.category == "informational"
    assert f.config_patch == {"use_cache": False}
    cites(f, "`use_cache=True` is incompatible with gradient checkpointing")


# =============================================================================================
# RK080-RK090: framework bugs, and headroom
# =============================================================================================

# Megatron-LM#3221's MOE_ARGS (verbatim flags, EP resolved to 8) on a small GPT with full
# recompute, as in the issue.
MOE_FULL_RECOMPUTE = """\
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    --num-layers 16 \\
    --hidden-size 2048 \\
    --num-attention-heads 16 \\
    --seq-length 4096 \\
    --micro-batch-size 1 \\
    --expert-model-parallel-size 8 \\
    --num-experts 4 \\
    --moe-token-dispatcher-type alltoall \\
    --moe-router-topk 2 \\
    --moe-aux-loss-coeff 0.02 \\
    --recompute-granularity full \\
    --recompute-method uniform \\
    --recompute-num-layers 1 \\
    --bf16
"""


@covers("RK080")
def test_rk080_moe_full_recompute_memory_grows():
    # WEAK: Megatron-LM#3221 shows the growth as a memory-snapshot screenshot; no text log of
    # growing "max allocated" was found. The two reports restate its 6.6 GiB snapshot rising
    # by the freed-late activations (illustrative numbers, marked as such).
    cfg = parse_config(MOE_FULL_RECOMPUTE, "train.sh")
    reports = [
        MemoryReport(iteration=1, max_allocated_bytes=round(6.6 * GIB)),
        MemoryReport(iteration=2, max_allocated_bytes=round(7.5 * GIB)),
    ]
    f = get(diagnose(Evidence(config=cfg, memory=reports)), "RK080")
    assert f.category == "framework_bug"
    cites(f, "6.60 GiB", "7.50 GiB")
    assert f.config_patch["recompute_modules"] == ["layernorm", "moe_act"]


@covers("RK080")
def test_rk080_not_when_peak_memory_is_flat():
    # NeMo progress lines of https://github.com/NVIDIA-NeMo/Speech/issues/14850: the
    # max_memory_allocated stays 53930270720 over iterations 8-11.
    d = run(text("ex-nemo-14850"), config=MOE_FULL_RECOMPUTE, config_name="train.sh")
    assert {m.max_allocated_bytes for m in d.evidence.memory} == {53930270720}
    assert "RK080" not in ids(d)


@covers("RK090")
def test_rk090_headroom_while_recomputing():
    # Llama-3.1-8B with mlp recompute on 80 GiB, and a real Megatron iteration/memory line
    # (real-formats.md ex-mlm-pr5662): the run fits, and no recompute would fit too.
    d = run(text("ex-mlm-pr5662"), config=LLAMA31_8B_MLP, config_name="l8b.yaml", gpu_memory_gb=80)
    f = get(d, "RK090")
    assert f.category == "informational"
    best = build_context(d.evidence, 80).best.estimate
    cites(f, f"'{best.recompute}'", "0.0%")
    assert f.config_patch == patch_for(best.recompute)


@covers("RK090")
def test_rk090_not_after_an_oom():
    d = run(
        text("oom-msswift-9191"), config=LLAMA31_8B_MLP, config_name="l8b.yaml", gpu_memory_gb=80
    )
    assert "RK090" not in ids(d)


# =============================================================================================
# Ranking: a specific finding outranks the generic ones on the same input
# =============================================================================================


def test_summary_names_the_top_finding():
    d = run(text("pt-71616"))
    assert d.summary.startswith("RK001 ")
    assert "13.23 GiB" in d.summary


def test_nothing_known_asks_for_more_evidence():
    # real-formats.md oom-pt-16417-title: 9.28 GiB free yet OOM (a driver issue): no rule
    # explains it, so the doctor says what to collect next.
    d = run(text("oom-pt-16417-title"))
    assert d.findings == []
    assert d.summary.startswith("No known pattern.")


# =============================================================================================
# Rules added for the scenario corpus: their inputs are the corpus's real cases
# (tests/scenarios/*.yaml, each with its source URL in the file)
# =============================================================================================

SCENARIOS = Path(__file__).parent / "scenarios"


def scenario(name: str) -> Diagnosis:
    import yaml

    case = yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())
    return run(
        case.get("log") or "",
        config=case.get("config"),
        config_name=case.get("config_name") or "config.yaml",
        experiments=case.get("experiments"),
        gpu_memory_gb=case.get("gpu_memory_gb"),
    )


@covers("RK008")
def test_rk008_oom_far_below_capacity_from_the_experiments():
    # NVIDIA skill perf-activation-recompute (Llama3-70B): OOM at a 58.8 GB peak on 80 GB.
    d = scenario("frag_llama3_70b_vpp_vs_expandable")
    assert top(d).category == "fragmentation"  # RK105 (the expandable row passes) leads
    f = get(d, "RK008")
    assert f.config_patch == {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    assert "RK011" not in ids(d)


@covers("RK009")
def test_rk009_nccl_could_not_allocate():
    # cosmos-rl PR #731: "NCCL WARN Cuda failure 2 'out of memory'" with no torch OOM.
    f = top(scenario("frag_cosmos_rl_nccl_calloc"))
    assert f.rule == "RK009" and f.category == "fragmentation"


@covers("RK009")
def test_rk009_blas_handle_allocation_on_cuda_and_rocm():
    # PyTorch's message when cuBLAS cannot allocate its handle's workspace
    # (https://github.com/QwenLM/Qwen3/issues/873: "解决了，用单卡去跑，显存充足就可以" - fixed
    # with a GPU that had enough free memory), and the same call hipified on ROCm
    # (https://github.com/ROCm/TheRock/issues/1708): one rule for both spellings.
    cuda = (
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    )
    rocm = (
        "RuntimeError: CUDA error: HIPBLAS_STATUS_ALLOC_FAILED when calling `hipblasCreate(handle)`"
    )
    for line in (cuda, rocm):
        f = top(run(line + "\n"))
        assert f.rule == "RK009" and f.config_patch == EXPANDABLE


@covers("RK014")
def test_rk014_oom_with_gradient_checkpointing_off():
    # TRL: gradient_checkpointing defaults to off; OOM on Mistral-7B.
    f = top(scenario("act_trl_gradient_checkpointing_default_off"))
    assert f.rule == "RK014" and f.category == "activation_memory"
    cites(f, "gradient_checkpointing")


@covers("RK015")
def test_rk015_selective_oom_full_fits():
    # Megatron-Bridge PR #5506 (Gemma-4 VL): selective OOMs, full/uniform/1 fits.
    f = top(scenario("act_mbridge_gemma4_vl_selective_oom"))
    assert f.rule == "RK015" and f.category == "activation_memory"
    assert f.config_patch["recompute_granularity"] == "full"


@covers("RK016")
def test_rk016_oom_in_the_logits():
    # Megatron-LM#92: vocab-parallel cross-entropy on output.float().
    f = top(scenario("logits_megatron_large_vocab_ce"))
    assert f.rule == "RK016" and f.category == "logits_memory"
    cites(f, "post_language_model_processing")


@covers("RK017")
def test_rk017_oom_while_building_the_model():
    # ms-swift#9191: OOM inside build_module -> GroupedLinear.__init__.
    f = top(scenario("ms_msswift_glm5_oom_at_model_build"))
    assert f.rule == "RK017" and f.category == "model_state_memory"


@covers("RK083")
def test_rk083_zero3_released_parameters():
    # DeepSpeed ZeRO-3: recomputed metadata torch.Size([0]).
    d = scenario("fb_deepspeed_zero3_frozen_recompute")
    assert top(d).rule == "RK083" and "RK075" not in ids(d)


@covers("RK084")
def test_rk084_pp_offload_error_with_no_offloaded_layer():
    # Megatron-Bridge: the PP + CPU offloading ValueError with activation_offload_layers: 0.
    d = scenario("fb_mbridge_offload_zero_layers_pp")
    assert top(d).rule == "RK084" and "RK059" not in ids(d)


# =============================================================================================
# RK085-RK100 (issue 12): partial pastes, frames as evidence, recompute silently off, checkpoint
# errors, numbers-derived fixes. Texts are tests/data/rules/i12-*.txt, verbatim from the URLs
# in SOURCES; those from the corpus (tests/corpus/cases) are all in its development split, and
# "[... cut by corpus ...]" marks where the case's author cut the thread's text.
# =============================================================================================


@covers("RK086")
def test_rk086_oom_in_validate_without_no_grad():
    d = run(text("i12-imgcap-57"))
    f = top(d)
    assert f.rule == "RK086" and f.category == "activation_memory"
    assert "validate" in f.evidence and "no_grad" in f.fix and f.config_patch


@covers("RK087")
def test_rk087_bare_training_oom_gets_numbers_and_a_patch():
    d = run(text("i12-automodel-1975"))
    f = top(d)
    assert f.rule == "RK087" and f.category == "activation_memory"
    cites(f, "4.34 GiB", "2.59 GiB", "79.11 GiB")
    assert f.config_patch.get("gradient_checkpointing") is True
    assert "seq_length" in f.evidence


@covers("RK088")
def test_rk088_step_peaks_far_above_rest():
    d = run(text("i12-automodel-2634"))
    f = top(d)
    assert f.rule == "RK088"
    cites(f, "73.94 GiB", "10.33 GiB", "63.61 GiB")
    assert f.config_patch


@covers("RK089")
def test_rk089_old_message_most_of_the_gpu_held_elsewhere():
    d = run(text("i12-pytorch-40863"))
    (oom,) = d.evidence.oom
    assert oom.reserved_bytes == 530 * 2**20 and oom.free_bytes == round(12.50 * 2**20)
    f = top(d)
    assert f.rule == "RK089" and f.category == "other_processes"
    cites(f, "10.64 GiB", "95%", "530.00 MiB")
    assert "CUDA_VISIBLE_DEVICES" in str(f.config_patch)


@covers("RK101")
def test_rk101_13b_full_fine_tuning_with_zero2_on_4_gpus():
    d = run(
        text("i12-llamafactory-1158"),
        config=text("i12-llamafactory-1158-config"),
        config_name="train.sh",
    )
    f = top(d)
    assert f.rule == "RK101" and f.category == "model_state_memory"
    # 13e9 x (2 + 14/4) bytes = 66.59 GiB of states per GPU on a 79.35 GiB GPU; ZeRO-3: 48.43
    cites(f, "13.0B", "ZeRO stage 2 on 4 GPU(s)", "66.59 GiB", "79.35 GiB", "48.43 GiB")
    assert f.config_patch == {"zero_optimization": {"stage": 3}}


@covers("RK102")
def test_rk102_partial_old_message_on_a_small_gpu():
    # The paste starts at "Tried to allocate": no "RuntimeError: CUDA out of memory." head.
    d = run(text("i12-shannon-6"))
    (oom,) = d.evidence.oom
    assert oom.requested_bytes == 20 * 2**20 and oom.reserved_bytes == round(1.25 * GIB)
    assert oom.held_elsewhere_bytes == round(1.96 * GIB) - round(2.88 * 2**20) - round(1.25 * GIB)
    f = top(d)
    assert f.rule == "RK102" and f.category == "genuine_pressure"
    cites(f, "1.96 GiB", "20.00 MiB", "2.88 MiB")
    assert "RK089" not in ids(d)  # 724 MiB outside PyTorch on a desktop GPU: display/context


def test_npu_message_parses_and_no_memory_is_unaccounted():
    d = run(text("i12-sglang-29838-npu"))
    (oom,) = d.evidence.oom
    assert oom.backend == "npu" and not oom.truncated and oom.device == 0
    assert oom.requested_bytes == 72 * 2**20
    assert oom.held_elsewhere_bytes == round(61.27 * GIB) - round(5.04 * 2**20) - round(58.39 * GIB)
    assert "RK089" not in ids(d)  # 2.87 GiB of 61.27 is under a quarter of the device


@covers("RK091")
def test_rk091_nvidia_smi_contexts_on_gpu0():
    d = run(text("i12-pt-49481"))
    f = top(d)
    assert f.rule == "RK091" and f.category == "other_processes"
    assert "set_device" in f.fix and "LOCAL_RANK" in str(f.config_patch)
    cites(f, "GPU 0", "871.00 MiB")


@covers("RK092")
def test_rk092_deepspeed_activation_checkpointing_section_alone():
    d = run("", config=text("i12-ds-5704"), config_name="ds_config.json")
    f = top(d)
    assert f.rule == "RK092" and f.category == "recompute_no_effect"
    assert f.config_patch == {"gradient_checkpointing": True}


@covers("RK093")
def test_rk093_backward_twice():
    f = top(run(text("i12-diffusers-12776")))
    assert f.rule == "RK093" and "use_reentrant" in str(f.config_patch)


@covers("RK094")
def test_rk094_parameter_reduced_twice_deepspeed():
    f = top(run(text("i12-piccolo-8")))
    assert f.rule == "RK094" and f.category == "checkpoint_api_misuse"
    assert f.config_patch["zero_optimization"] == {"stage": 1}


@covers("RK095")
def test_rk095_saved_tensors_unpacked_twice():
    f = top(run(text("i12-mamba-909")))
    assert f.rule == "RK095" and "saved_tensors" in f.fix


@covers("RK096")
def test_rk096_te_fp8_recompute_keyerror():
    f = top(run(text("i12-te-3284")))
    assert f.rule == "RK096" and f.category == "nondeterministic_recompute"
    assert "fp8_autocast" in f.fix


@covers("RK097")
def test_rk097_megatron_validate_args_moe_tp_needs_sp():
    d = run(
        text("i12-rocm-megatron-85"),
        config=text("i12-rocm-megatron-85-config"),
        config_name="launch.sh",
    )
    assert d.evidence.config["tensor_model_parallel_size"] == 2
    f = top(d)
    assert f.rule == "RK097" and f.category == "invalid_config"
    assert f.config_patch == {"sequence_parallel": True}
    assert "sequence_parallel" in f.evidence


@covers("RK098")
def test_rk098_reserved_far_above_allocated_lines():
    f = top(run(text("i12-cosmosrl-388")))
    assert f.rule == "RK098" and f.category == "fragmentation"
    cites(f, "118.25 GiB", "56.75 GiB")
    assert f.config_patch == EXPANDABLE


def test_rk098_memory_summary_table():
    d = run(text("i12-pt-35901"))
    summary = [m for m in d.evidence.memory if m.source == "memory_summary"]
    assert summary and summary[0].max_allocated_bytes == 4877 * 10**6
    assert summary[0].reserved_bytes == 12420 * 10**6
    assert top(d).rule == "RK098"


@covers("RK099")
def test_rk099_requires_grad_warning_alone_is_informational():
    f = top(run(text("i12-internlm-326")))
    assert f.rule == "RK099" and f.category == "informational"
    assert "RK071" not in ids(run(text("i12-internlm-326")))


@covers("RK100")
def test_rk100_vllm_cumem_oom():
    d = run(text("i12-nemorl-3280"))
    assert d.evidence.oom and d.evidence.oom[0].generation == "cuda_error"
    f = top(d)
    assert f.rule == "RK100" and "gpu_memory_utilization" in f.config_patch


@covers("RK075")
def test_rk075_moe_router_metadata_mismatch_names_the_router():
    f = top(run(text("i12-automodel-2635")))
    assert f.rule == "RK075" and "router" in f.fix.lower()
    assert f.config_patch


def test_rk075_compile_metadata_mismatch_names_compile():
    f = top(run(text("i12-modalities-361")))
    # The artefact does not say torch.compile (the thread does): shapes change wholesale, so
    # the generic fix, which names compile first, not the autocast one.
    assert f.rule == "RK075" and "torch.compile" in f.fix and "autocast" not in f.fix


# ---- ranking (issue 12 item 3): constructed events, not real text ---------------------------


def _oom_in_loss(reserved_unallocated: int, requested: int) -> Evidence:
    oom = OOMEvent(
        requested_bytes=requested,
        total_bytes=80 * GIB,
        free_bytes=GIB // 4,
        allocated_bytes=60 * GIB,
        reserved_unallocated_bytes=reserved_unallocated,
        process_bytes=60 * GIB + reserved_unallocated,
        generation="gen5_expandable",
    )
    error = ErrorEvent(
        type="torch.OutOfMemoryError",
        message="CUDA out of memory.",
        frames=["train.py:10 in step", "loss.py:5 in cross_entropy"],
    )
    return Evidence(oom=[oom], errors=[error])


def test_ranking_large_slack_keeps_fragmentation_first_over_logits():
    d = diagnose(_oom_in_loss(reserved_unallocated=8 * GIB, requested=2 * GIB))
    assert ids(d)[:2] == ["RK001", "RK016"]


def test_ranking_small_slack_drops_fragmentation_with_a_reason():
    d = diagnose(_oom_in_loss(reserved_unallocated=3 * GIB, requested=2 * GIB))
    assert "RK001" not in ids(d) and top(d).rule == "RK016"
    assert any(x["rule"] == "RK001" for x in d.dropped)


def test_call_chain_pasted_before_the_oom_is_evidence():
    # NeMo-RL's issue pastes the call chain as "-> f (file:line)" lines, then the OOM line.
    d = run(text("i12-nemorl-2871"))
    assert any("get_next_token_logprobs_from_logits" in line for line in d.evidence.oom[0].context)
    f = top(d)
    assert f.rule == "RK016" and f.category == "logits_memory"


def test_validate_args_frame_cut_from_its_file_line_is_evidence():
    # slime's paste starts mid-frame ('Megatron-LM/megatron/training/arguments.py", line 561').
    f = top(run(text("i12-slime-1486")))
    assert f.rule == "RK097" and f.category == "invalid_config"
    assert "num_layers_in_first_pipeline_stage" in f.config_patch


def test_rk075_token_count_change_gets_the_routing_fix():
    # torchtitan: only the leading dimension moved (965 -> 964 tokens): MoE routing.
    f = top(run(text("i12-torchtitan-1117")))
    assert f.rule == "RK075" and "router" in f.fix.lower()
    assert "token count" in f.evidence


def test_rk075_internal_assert_after_a_compile_recompile_limit():
    # Unsloth: torch.compile fell back to eager (a context line), then checkpoint's assert.
    f = top(run(text("i12-unslothzoo-1001")))
    assert f.rule == "RK075" and f.config_patch == {"compile": False}


@covers("RK103")
def test_rk103_type_error_in_megatrons_mlp_recompute():
    f = top(run(text("i12-megatron-2754")))
    assert f.rule == "RK103" and f.category == "framework_bug"
    assert "padding_mask" in f.evidence and "Upgrade" in f.fix
    assert f.config_patch["recompute_modules"] == ["core_attn"]


# verbatim from https://github.com/NVIDIA/nccl/issues/1284 (the issue's title, quoted there)
NCCL_1284 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory"
)


def test_rk004_more_than_1eb_is_a_corrupted_size():
    d = run(NCCL_1284)
    assert d.evidence.oom[0].requested_bytes == 10**18
    f = top(d)
    assert f.rule == "RK004" and "NCCL" in f.evidence
    assert f.config_patch["env"]["NCCL_DEBUG"] == "INFO"


@covers("RK104")
def test_rk104_old_checkpointing_format_warning_is_informational():
    d = run(text("i12-llamafactory-1916"))
    assert d.evidence.errors and d.evidence.errors[0].kind == "warning"
    f = top(d)
    assert f.rule == "RK104" and f.category == "informational" and f.config_patch


@covers("RK105")
def test_rk105_table_pasted_in_the_log_shows_expandable_segments_fix_it():
    # The table is pasted into the log (not given with --experiments): collect reads it.
    d = run(text("i12-mbridge-skill-expandable"))
    assert d.evidence.experiments[0]["name"] == "Baseline"
    f = top(d)
    assert f.rule == "RK105" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    cites(f, "'Baseline' runs out of memory", "Baseline + expandable_segments", "704")


# =============================================================================================
# RK140-RK160 (issue 13): checkpointing that does not act, recompute that differs, configs
# =============================================================================================


@covers("RK140")
def test_rk140_gradient_checkpointing_then_eval():
    # diffusers#9850: `block.gradient_checkpointing = True` then `block.eval()`.
    f = top(run(text("i13-diffusers-9850")))
    assert f.rule == "RK140" and f.category == "recompute_no_effect"
    cites(f, "block.gradient_checkpointing = True", "block.eval()")
    assert "block.train()" in f.config_patch["code"]


def test_rk140_not_for_inference_under_no_grad():
    # trl PR #4636's snippet: train(), gradient_checkpointing_enable(), then no_grad inference.
    snippet = (
        "model.train()\nmodel.gradient_checkpointing_enable()\n"
        "with torch.no_grad():\n    output = model(input_ids=input_ids)\nmodel.eval()\n"
    )
    assert "RK140" not in ids(run(snippet))


@covers("RK141")
def test_rk141_flags_given_but_the_argument_dump_says_none():
    # Megatron-LM's printed arguments of a run without recompute (large-scale-lm-tutorials)
    # next to the flags of Megatron-LM#1031 (full, uniform, 5).
    d = run(text("mlm-args-dump-recompute-none"), config=LLAMA3_70B_MLM_1031, config_name="run.sh")
    f = top(d)
    assert f.rule == "RK141" and f.category == "recompute_no_effect"
    assert f.config_patch == spec_patch("full", "uniform", 5)
    cites(f, "recompute_granularity full", "recompute_num_layers 5")


def test_rk141_not_when_the_dump_agrees():
    # real-formats.md ex-args-local-v014-full: the dump itself says full.
    assert "RK141" not in ids(run(text("ex-args-local-v014-full")))


@covers("RK142")
def test_rk142_nemo_null_granularity_overrides_recompute_granularity():
    # NeMo's megatron_gpt_config.yaml block, with the Megatron-Core keys a user adds under it.
    yaml_text = (
        "model:\n"
        + text("nemo-megatron-gpt-config-ac")
        + "  recompute_granularity: full\n  recompute_method: uniform\n  recompute_num_layers: 1\n"
    )
    d = run(config=yaml_text)
    assert d.evidence.config["recompute_granularity"] is None
    f = get(d, "RK142")
    assert f.category == "recompute_no_effect"
    assert f.config_patch["activations_checkpoint_granularity"] == "full"
    assert f.config_patch["activations_checkpoint_method"] == "uniform"
    # pasted into a log instead of given as the config: the same
    assert "RK142" in ids(run(yaml_text))


@covers("RK150")
def test_rk150_nemo_null_method_with_full_granularity():
    yaml_text = (
        "model:\n"
        + text("nemo-megatron-gpt-config-ac").replace(
            "activations_checkpoint_granularity: null", "activations_checkpoint_granularity: full"
        )
        + "  recompute_method: block\n  recompute_num_layers: 4\n"
    )
    f = top(run(config=yaml_text))
    assert f.rule == "RK150" and f.category == "invalid_config"
    assert f.config_patch == {
        "activations_checkpoint_method": "block",
        "activations_checkpoint_num_layers": 4,
    }


@covers("RK143")
def test_rk143_layernorm_recompute_on_a_dense_te_model():
    # The skill's Llama3-70B Exp 3 (seed 001): [core_attn, layernorm] is as large as the
    # baseline; dense Llama with Transformer Engine fuses both norms.
    config = LLAMA3_70B_32K + "    --recompute-granularity selective \\\n"
    config += "    --recompute-modules core_attn layernorm\n"
    d = run(config=config, config_name="run.sh")
    f = get(d, "RK143")
    assert f.category == "recompute_no_effect"
    assert f.config_patch["recompute_modules"] == ["core_attn", "mlp"]
    assert "RK143" not in ids(run(config=MIXTRAL_8X7B_MLP.replace(" mlp ", " layernorm ")))


@covers("RK144")
def test_rk144_oom_with_checkpointing_under_a_compiler():
    # lightning-thunder#2116: OOM with --checkpoint_activations=True and --compile dynamo_thunder.
    d = run(text("i13-thunder-2116"), config=text("i13-thunder-2116-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK144" and f.category == "recompute_no_effect"
    assert f.config_patch == {"compile": False, "checkpoint_activations": True}


@covers("RK145")
def test_rk145_debug_mode_names_the_first_different_op():
    # torch.utils.checkpoint(debug=True) output, reproduced on CPU: topk only in the recompute.
    d = run(text("ckpt-local-debug-topk"))
    f = top(d)
    assert f.rule == "RK145" and f.category == "nondeterministic_recompute"
    cites(f, "aten.cos in the forward, aten.topk in the recompute", "A routing / token-count op")
    assert "router" in f.fix and "RK075" not in ids(d)
    assert "aten.topk" in f.config_patch["code"]


@covers("RK146")
def test_rk146_checkpoint_under_bf16_autocast():
    # pytorch#71124: checkpoint(b, x) inside torch.cuda.amp.autocast(dtype=torch.bfloat16).
    f = top(run(text("i13-pt-71124")))
    assert f.rule == "RK146" and f.category == "nondeterministic_recompute"
    assert "upgrade torch" in f.fix.lower() and f.config_patch["use_reentrant"] is False
    cites(f, "x = checkpoint(b, x)", "autocast(dtype=torch.bfloat16)")


def test_rk146_not_on_code_alone():
    # pytorch#71124's script without its printed output: checkpoint + bf16 autocast is how many
    # training scripts read; without dtypes printed the paste is not about the recompute's dtype.
    code = text("i13-pt-71124").split("Output dtype: torch.bfloat16")[0]
    assert "autocast(dtype=torch.bfloat16)" in code and "checkpoint(b, x)" in code
    assert "RK146" not in ids(run(code))


@covers("RK147")
def test_rk147_dropout_without_rng_state_shifts_the_loss():
    # OLMo-core PR #828: CE 2.49 with AC on vs 2.19 off, residual dropout 0.1.
    d = run(text("i13-olmocore-828"), config=text("i13-olmocore-828-config"))
    f = top(d)
    assert f.rule == "RK147" and f.category == "nondeterministic_recompute"
    assert f.config_patch == {"preserve_rng_state": True}
    cites(f, "response_residual_dropout = 0.1", "2.491", "2.194")


@covers("RK148")
def test_rk148_traceback_cut_in_the_reentrant_backward_under_deepspeed():
    # DeepSpeed#988: the loss scaler's backward into torch/utils/checkpoint.py backward.
    f = top(run(text("i13-ds-988")))
    assert f.rule == "RK148" and f.category == "checkpoint_api_misuse"
    assert f.config_patch["zero_optimization"] == {"stage": 1}
    assert f.config_patch["gradient_checkpointing_kwargs"] == {"use_reentrant": False}


def test_rk148_not_without_a_hook_reducing_wrapper():
    # The tail of DeepSpeed#988's traceback, from torch/_tensor.py on (a paste that starts
    # below the DeepSpeed frames): the same cut backward through the reentrant checkpoint, but
    # nothing that reduces gradients from hooks; any error (an OOM in the recompute, a shape
    # error) could end it, so RK148 stays silent.
    tail = "\n".join(text("i13-ds-988").splitlines()[3:])
    assert "deepspeed" not in tail and "utils/checkpoint.py" in tail
    assert "RK148" not in ids(run(tail))


@covers("RK149")
def test_rk149_requires_grad_warning_in_full_training():
    # open_clip#573: the warning with a plain training command (--grad-checkpointing).
    d = run(text("i13-openclip-573"), config=text("i13-openclip-573-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"use_reentrant": False} and "RK099" not in ids(d)
    # the same warning alone (InternLM-XComposer#326) stays informational
    assert top(run(text("i12-internlm-326"))).rule == "RK099"


@covers("RK151")
def test_rk151_script_assert_forbids_fsdp_with_checkpointing():
    # DMD2#52: `assert not (train_args.fsdp and train_args.gradient_checkpointing), ...`
    f = top(run(text("i13-dmd2-52")))
    assert f.rule == "RK151" and f.category == "invalid_config"
    assert f.config_patch == {"fsdp": False}


def test_rk151_not_on_pytorchs_internal_checkpoint_assert():
    # unsloth-zoo PR #1001 (https://github.com/unslothai/unsloth-zoo/pull/1001), a dev case of
    # nondeterministic_recompute: "AssertionError: Something went unexpectedly wrong in
    # activation checkpoint." is torch.utils.checkpoint's own assert, not a script forbidding
    # two options together.
    d = run(text("i12-unslothzoo-1001"))
    assert "RK151" not in ids(d)


@covers("RK152")
def test_rk152_traceback_cut_in_the_uniform_chunk_loop():
    # NeMo Speech PR #12517: Hyena's _checkpointed_forward -> te_checkpoint, cut.
    f = top(run(text("i13-nemo-speech-12517")))
    assert f.rule == "RK152" and f.category == "invalid_config"
    assert f.config_patch == {"recompute_method": "uniform", "recompute_num_layers": 1}


def test_rk152_cut_traceback_needs_the_chunk_loop():
    # The same NeMo traceback cut one line earlier, before the loop's source line
    # (`custom(layer_idx, layer_idx + self.config.recompute_num_layers)`): a traceback cut in
    # _checkpointed_forward alone (an OOM or a shape error in the recompute could end it) does
    # not name chunks of recompute_num_layers.
    head = "\n".join(text("i13-nemo-speech-12517").splitlines()[:4])
    assert "_checkpointed_forward" in head and "recompute_num_layers" not in head
    assert "RK152" not in ids(run(head))


def test_rk152_config_with_a_non_dividing_recompute_num_layers():
    # Megatron-LM#2294's config: 24 layers, uniform 7 -> 6 is the largest divisor below 7.
    # Its IndexError in Megatron's own loop stays RK064's (fixed upstream) first.
    d = run(text("mlm-2294-error"), config=text("mlm-2294-config"))
    f = get(d, "RK152")
    assert f.config_patch == {"recompute_method": "uniform", "recompute_num_layers": 6}
    assert "not a multiple of recompute_num_layers 7" in f.evidence
    assert top(d).rule == "RK064"


@covers("RK153")
def test_rk153_deepspeed_contiguous_checkpointing_index_error():
    # pytorch-lightning#20329: IndexError in partition_activations (the line cut at "IndexErro").
    f = top(run(text("i13-lightning-20329")))
    assert f.rule == "RK153" and f.category == "invalid_config"
    assert "number_checkpoints" in f.config_patch["activation_checkpointing"]


@covers("RK154")
def test_rk154_max_split_with_expandable_segments():
    # pytorch#123548: PYTORCH_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True.
    f = top(run(text("i13-pt-123548")))
    assert f.rule == "RK154" and f.category == "framework_bug"
    assert f.config_patch == {"env": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}}


@covers("RK155")
def test_rk155_checkpoint_on_xpu_hits_the_cuda_path():
    # pytorch#128478: test_gradient_checkpointing - RuntimeError: PyTorch was compiled without
    # CUDA support.
    f = top(run(text("i13-pt-128478")))
    assert f.rule == "RK155" and f.category == "framework_bug"
    assert "DefaultDeviceType" in f.fix and "upgrade torch" in f.fix.lower()


@covers("RK156")
def test_rk156_old_use_reentrant_notice_alone():
    # ChatGLM / LLaVA-Llama-3#4's first warning alone (the older wording).
    line = text("i13-llavallama3-4").splitlines()[0]
    f = top(run(line))
    assert f.rule == "RK156" and f.category == "informational"
    # the newer wording (PyTorch >= 2.4: "will raise an exception") stays RK072's
    assert top(run(text("ckpt-local-use-reentrant-missing"))).rule == "RK072"
    # both warnings of LLaVA-Llama-3#4 together: informational, not misuse
    assert top(run(text("i13-llavallama3-4"))).category == "informational"


@covers("RK157")
def test_rk157_library_fallback_notice():
    # unsloth#91: "Unsloth: Vocab size of 102400 exceeds the max CUDA blocksize of 65536 ..."
    f = top(run(text("i13-unsloth-91")))
    assert f.rule == "RK157" and f.category == "informational"
    assert f.config_patch == {"command": "pip install -U unsloth"}
    assert "no fix needed" in f.fix.lower()


def test_rk157_prose_about_memory_is_not_a_library_notice():
    # pytorch#28113 (a non_pytorch_memory dev case): the reporter's own sentence says memory
    # usage and "using"; only a library's voice (a logger prefix, "falling back to") is a notice.
    from recompute_kit.doctor.evidence.code import scan_snippets

    line = (
        "The nvidia-smi will show an increase in memory usage, while the torch.cuda says it's "
        "using 0 memory."
    )
    assert "notices" not in scan_snippets(line)


@covers("RK158")
def test_rk158_nccl_cumem_warning_from_vllm():
    # open-instruct PR #838: vLLM's "WARNING 07-29 15:39:27 [env_override.py:17] ..." line.
    d = run(text("i13-open-instruct-838"))
    assert d.evidence.errors[0].frames == ["env_override.py:17"]
    f = top(d)
    assert f.rule == "RK158" and f.category == "informational"


@covers("RK159")
def test_rk159_checkpointing_works_the_reading_was_wrong():
    # DeepSpeedExamples#332: 6.4G both ways by one measure, MaxMemAllocated 11.76 vs 44.23 GB.
    config = text("i13-dsexamples-332-config")
    d = run(text("i13-dsexamples-332"), config=config, config_name="x.sh")
    f = top(d)
    assert f.rule == "RK159" and f.category == "informational"
    cites(f, "max_seq_len 64")
    assert "MaxMemAllocated" in f.fix


@covers("RK160")
def test_rk160_flag_given_but_printed_false():
    # DeepSpeedExamples#332's command (--gradient_checkpointing) with the script's own printed
    # arguments saying the opposite (as transformers prints TrainingArguments).
    log = "TrainingArguments(\n_n_gpu=1,\ngradient_checkpointing=False,\nlearning_rate=9.65e-06,\n"
    d = run(log, config=text("i13-dsexamples-332-config"), config_name="x.sh")
    f = top(d)
    assert f.rule == "RK160" and f.category == "recompute_no_effect"
    cites(f, "gradient_checkpointing=False")


# ---- widened existing rules (issue 13) ------------------------------------------------------


def test_rk083_zero3_shape_zero_in_a_shortened_paste():
    # transformers#47254: "saved {'shape': [1024]} vs recomputed {'shape': [0]}".
    d = run(text("i13-hf-47254"))
    f = top(d)
    assert f.rule == "RK083" and f.category == "framework_bug" and "RK075" not in ids(d)
    cites(f, "[1024]")


def test_rk075_tensor_count_mismatch_names_the_gate():
    # pytorch#171355: 2634 tensors saved in the forward, 884 in the recompute.
    f = top(run(text("i13-pt-171355")))
    assert f.rule == "RK075" and "gate" in f.fix and "target_modules" in f.fix
    cites(f, "2634", "884")


def test_rk077_old_transformers_is_a_config_matter():
    # transformers#15959: "DebertaV2Model does not support gradient checkpointing!"
    f = top(run(text("i13-hf-15959")))
    assert f.rule == "RK077" and f.category == "invalid_config"
    assert "upgrade transformers" in f.fix.lower()


def test_rk033_table_arms_named_by_their_recompute():
    # Megatron-LM PR #6311: "no overlap, no recompute" 225.1 vs full recompute 184.2 TFLOP/s.
    d = run(text("i13-megatron-pr6311"))
    rows = d.evidence.experiments
    assert rows[0]["recompute"] == "none" and rows[1]["recompute"] == "full:uniform:1"
    assert rows[1]["vs_golden"] == pytest.approx(184.2 / 225.1 - 1, abs=1e-3)
    f = top(d)
    assert f.rule == "RK033" and f.category == "recompute_overhead"
    cites(f, "-18.2%")


def test_rk053_invalid_activation_recompute_method_sets_a_method():
    # Megatron-Core's layer loop: ValueError("Invalid activation recompute method.")
    f = top(run("ValueError: Invalid activation recompute method."))
    assert f.rule == "RK053" and f.config_patch["recompute_method"] == "uniform"


@covers("RK110")
def test_rk110_source_line_of_adam_pasted_before_the_oom():
    # https://github.com/hiyouga/LlamaFactory/issues/1221: only Adam's source line ("denom =
    # (exp_avg_sq.sqrt() ...") precedes the OOM (kept as its context). The maintainer: ZeRO-2
    # needs 80G; the reporter ran with ZeRO-3.
    d = run(text("i12-llamafactory-1221"))
    f = top(d)
    assert f.rule == "RK110" and f.category == "model_state_memory"
    assert "exp_avg_sq" in f.evidence
    cites(f, "3.14 GiB", "28.28 GiB", "31.75 GiB")
    assert "ZeRO-3" in f.fix and f.config_patch == {"zero_optimization": {"stage": 3}}
    assert {"rule": "RK036", "reason": "superseded by RK110"} in d.dropped


@covers("RK110")
def test_rk110_not_for_an_oom_outside_the_optimizer():
    # pytorch#35901's OOM (no optimizer frame) and a real traceback through the loss
    # (Megatron-LM#92): not the optimizer step.
    assert "RK110" not in ids(run(text("i12-pt-35901")))
    assert "RK110" not in ids(run(text("mlm-92")))


@covers("RK101")
def test_rk101_lora_under_ddp_replicates_weights_above_any_80gb_gpu():
    # https://github.com/hiyouga/LlamaFactory/issues/2379: Mixtral-8x7B LoRA on 8 GPUs with
    # accelerate's MULTI_GPU (DDP, no ZeRO); no OOM message and no GPU size pasted. The
    # maintainer: launch with DeepSpeed ZeRO-3.
    d = run(text("i13-llamafactory-2379"), config=text("i13-llamafactory-2379-config"))
    assert d.evidence.config["finetuning_type"] == "lora"  # read from the pasted command
    f = top(d)
    assert f.rule == "RK101" and f.category == "model_state_memory"
    cites(f, "56.0B", "8 GPU(s)", "104.31 GiB", "80.00 GiB")
    assert f.config_patch == {"zero_optimization": {"stage": 3}} and "ZeRO-3" in f.fix


@covers("RK101")
def test_rk101_not_when_zero3_and_the_gpu_count_are_unknown():
    # https://github.com/hiyouga/LlamaFactory/issues/5977: full fine-tuning of Llama-3-8B with
    # ds_z3_config.json, pasted YAML only: ZeRO-3 shards over GPUs the paste does not count, so
    # no per-GPU figure can be claimed.
    d = run(text("i13-llamafactory-5977"))
    assert d.evidence.config["deepspeed"].endswith("ds_z3_config.json")
    assert "RK101" not in ids(d)


def test_pasted_command_line_joins_the_config():
    # https://github.com/hiyouga/LlamaFactory/issues/922: the launch command is all the paste.
    d = run(text("i13-llamafactory-922"))
    cfg = d.evidence.config
    assert cfg["per_device_train_batch_size"] == 4 and cfg["finetuning_type"] == "lora"
    assert cfg["visible_devices"] == 1  # CUDA_VISIBLE_DEVICES=0
    # an explicit config wins over what the log pastes
    d = run(text("i13-llamafactory-922"), config="per_device_train_batch_size: 1\n")
    assert d.evidence.config["per_device_train_batch_size"] == 1


@covers("RK001", "RK005")
def test_fragmentation_follows_when_the_slack_is_a_sliver_of_a_full_gpu():
    # https://github.com/NVIDIA-NeMo/Automodel/issues/3907: 2.00 GiB reserved-unallocated
    # against a 720 MiB request, but 171.63 GiB of 184.31 GiB allocated: the slack is 1% of
    # the GPU. RK001 stays listed, after the memory finding.
    d = run(text("i13-automodel-3907"))
    assert ids(d)[0] == "RK005" and "RK001" in ids(d)
    assert get(d, "RK001").confidence < top(d).confidence


@covers("RK102")
def test_rk102_leads_on_a_2gb_gpu_with_51mib_slack():
    # https://github.com/pkhungurn/talking-head-anime-demo/issues/36: 2.00 GiB GPU, 20 MiB
    # request, 51.20 MiB reserved-unallocated; the maintainer: batch is already 1, the GPU is
    # too small.
    d = run(text("i13-talking-head-36"))
    f = top(d)
    assert f.rule == "RK102" and "larger GPU" in f.fix
    assert ids(d).index("RK001") > 0


@covers("RK089", "RK102")
def test_rk089_not_for_a_1x_message_whose_cached_memory_is_pytorchs():
    # https://github.com/IDKiro/CBDNet-pytorch/issues/7 (PyTorch <= 1.4 "cached" format):
    # 10.85 GiB allocated + 128.66 MiB cached + 56.62 MiB free of 11.92 GiB leaves 0.89 GiB
    # outside PyTorch (the CUDA context and display), not 11.74 GiB. Maintainer: the input
    # image is too big for an 11 GiB GPU.
    d = run(text("i13-cbdnet-7"))
    oom = d.evidence.oom[0]
    assert oom.reserved_unallocated_bytes == round(128.66 * 2**20)
    assert 0.85 * GIB < oom.held_elsewhere_bytes < 0.95 * GIB
    assert "RK089" not in ids(d)
    f = top(d)
    assert f.rule == "RK102" and "smaller inputs" in f.fix


@covers("RK004")
def test_rk004_ipex_per_allocation_limit():
    # https://github.com/intel/intel-extension-for-pytorch/issues/629: a 6.85 GiB tensor on a
    # 15.56 GiB Intel GPU fails because one block may not exceed 4 GB.
    d = run(text("ipex-629"))
    oom = d.evidence.oom[0]
    assert oom.backend == "xpu" and oom.allocation_limit_bytes == 4 * GIB
    f = top(d)
    assert f.rule == "RK004"
    cites(f, "6.85 GiB", "4.00 GiB")


# =============================================================================================
# RK170-RK171: default readings when no specific rule fires. Texts are tests/data/rules/i17-*
# (and two i13 ones), verbatim from dev corpus cases (URLs in SOURCES); "[... cut by corpus ...]"
# marks where the case's author cut the thread's text.
# =============================================================================================


@covers("RK170")
def test_rk170_llamafactory_command_halves_the_batch_and_keeps_the_global_one():
    # https://github.com/hiyouga/LlamaFactory/issues/922: only the launch command is pasted;
    # maintainer: one over-long sample blew up the GPU, reduce the batch size.
    d = run(text("i13-llamafactory-922"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory" and len(d.findings) == 1
    assert f.config_patch == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
    assert f.evidence.startswith("Default reading")
    cites(f, "per_device_train_batch_size = 4", "gradient_accumulation_steps = 4", "LoRA")
    cites(f, "LlamaFactory's default: on")  # checkpointing absent: on in LlamaFactory
    assert f.fix.startswith("Activation memory, cheapest change first: 1. ")
    assert "2. cap the tokens per sample (cutoff_len" in f.fix


@covers("RK170")
def test_rk170_checkpointing_switched_off_in_the_config_under_its_own_key():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2585: "CUDA OOM" in a results table, and a
    # config with distributed.activation_checkpointing false; the merged fix turns it on.
    d = run(text("i17-automodel-2585"), config=text("i17-automodel-2585-config"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert f.config_patch == {"distributed.activation_checkpointing": True}
    cites(f, "CUDA OOM", "(off)")
    # the table's header names the switch (comparing on with off): not a state of the run
    d = run(text("i17-automodel-2585"))
    assert top(d).config_patch == {"activation_checkpointing": True}
    assert "CUDA OOM" in top(d).evidence


@covers("RK170")
def test_rk170_plain_argparse_flags_batch_first_and_checkpointing_absent_is_off():
    # https://github.com/openai/improved-diffusion/issues/3: TRAIN_FLAGS="--lr 1e-4
    # --batch_size 4"; maintainer: try --microbatch or --use-checkpoint.
    d = run(text("i17-improved-diffusion-3"))
    f = top(d)
    assert f.rule == "RK170" and f.config_patch == {"batch_size": 2}
    cites(f, "batch_size = 4", "gradient checkpointing: not in the paste (off")
    assert "global batch halves unless the script accumulates" in f.fix
    assert "2. activation (gradient) checkpointing" in f.fix


@covers("RK170")
def test_rk170_names_the_sequence_caps_the_paste_sets():
    # https://github.com/THUDM/slime/issues/1450: the rollout length caps; the OOM came from a
    # sample longer than rollout_max_context_len that SFT rollout did not truncate.
    d = run(config=text("i17-slime-1450-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK170"
    cites(f, "rollout_max_context_len = 8192", "no OOM message pasted")
    assert "rollout_max_context_len 8192 -> 4096" in f.fix and f.config_patch


@covers("RK171")
def test_rk171_full_fine_tune_at_batch_1_with_zero3_offloads_the_optimizer():
    # https://github.com/hiyouga/LlamaFactory/issues/5977: full fine-tuning of Llama-3-8B with
    # ds_z3_config.json OOMs on 3090s, ds_z3_offload_config.json runs (maintainer: normal).
    d = run(text("i13-llamafactory-5977"))
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory" and len(d.findings) == 1
    assert f.config_patch == {"deepspeed": "examples/deepspeed/ds_z3_offload_config.json"}
    cites(f, "~8.0B parameters", "per_device_train_batch_size = 1", "ZeRO stage 3")
    cites(f, "119.21 GiB", "does not count the GPUs")
    assert "finetuning_type: lora" in f.fix and "recompute cannot free" in f.fix


@covers("RK171")
def test_rk171_model_size_unnamed_but_batch_1_and_checkpointing_on():
    # https://github.com/Alpha-VLLM/LLaMA2-Accessory/issues/26: --batch_size 1 --checkpointing
    # --model_parallel_size 2 on 2 GPUs; maintainer: optimizer states of a full fine-tune need
    # more GPUs, or parameter-efficient tuning.
    d = run(text("i17-llama2-accessory-26"))
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory"
    assert f.config_patch == {"model_parallel_size": 4, "nproc_per_node": 4}
    cites(f, "batch_size = 1", "checkpointing = True (on)", "full training assumed")
    assert "LoRA" in f.fix


def test_default_readings_only_when_nothing_else_fires():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/1975: a real OOM message makes RK087 fire;
    # with LlamaFactory#922's command added the default readings stay silent.
    d = run(text("i12-automodel-1975") + "\n" + text("i13-llamafactory-922"))
    assert d.findings and not {"RK170", "RK171"} & set(ids(d))
    # https://github.com/pytorch/pytorch/issues/116928: a memory summary saying
    # "CUDA OOMs: 0" is no OOM, and it has no training knobs: no RK170/RK171; its peak is read
    # by the memory-figures default reading RK265 alone
    assert ids(run(text("i17-mistral-116928-summary"))) == ["RK265"]
    # real-formats.md oom-pt-16417-title: 9.28 GiB free yet OOM: no default reading either
    assert run(text("oom-pt-16417-title")).findings == []


@covers("RK170", "RK171")
def test_batch_1_with_checkpointing_disabled_is_still_an_activation_reading():
    # https://github.com/hiyouga/LlamaFactory/issues/5977's YAML with LlamaFactory's switch
    # disable_gradient_checkpointing set: activations still have room, so RK170 (not RK171)
    # and the first step is the framework's own key.
    d = run(text("i13-llamafactory-5977"), config="disable_gradient_checkpointing: true\n")
    f = top(d)
    assert f.rule == "RK170" and "RK171" not in ids(d)
    assert f.config_patch == {"disable_gradient_checkpointing": False}
    cites(f, "disable_gradient_checkpointing = True (off)")


# =============================================================================================
# RK190-RK191: what a report states in prose next to an OOM. Texts are tests/data/rules/i19-*,
# verbatim from dev corpus cases (URLs in SOURCES).
# =============================================================================================


@covers("RK190")
def test_rk190_pr_places_the_oom_at_the_first_optimizer_step():
    # https://github.com/verl-project/verl/pull/5364: "Baseline can OOM at the first optimizer
    # step due to Adam lazy state init"; the PR streams optimizer states per layer.
    d = run(text("i19-verl-5364"))
    f = top(d)
    assert f.rule == "RK190" and f.category == "model_state_memory"
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    cites(f, "first optimizer step")
    assert "optimizer_offload" in f.fix and "Recompute cannot free them" in f.fix
    # a Megatron command names its own key
    d = run(text("i19-verl-5364"), config="tensor_model_parallel_size: 2\n")
    assert top(d).config_patch == {"use_distributed_optimizer": True}
    # an OOM line that names no optimizer is not this rule's
    assert "RK190" not in ids(run("Baseline can OOM at step 2 of the rollout\n"))


@covers("RK191")
def test_rk191_pr_quantifies_reserved_but_unallocated_memory():
    # https://github.com/NovaSky-AI/SkyRL/pull/1768: "the baseline OOMs at step 2 (~20 GiB
    # reserved-but-unallocated); the trainer flag makes all 5 steps pass" (expandable_segments).
    d = run(text("i19-skyrl-1768"))
    f = top(d)
    assert f.rule == "RK191" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    cites(f, "20 GiB reserved but unallocated")
    # under a GiB stranded is no diagnosis; PyTorch's own wording is RK001's, not this rule's
    assert "RK191" not in ids(run("the run OOMs (~300 MiB reserved-but-unallocated)\n"))


# Generic memory findings (RK087, RK005, RK004, RK102) in the paste's own knobs
# (rules/knob_advice.py); launch scripts whose flags sit in shell variables.
# =============================================================================================


def test_megatron_example_script_flags_in_quoted_shell_variables():
    # NVIDIA/Megatron-LM examples/pretrain_gpt_distributed.sh, verbatim (SOURCES): every flag
    # sits in a quoted, backslash-continued variable (GPT_ARGS="..."), expanded on the torchrun
    # line as $GPT_ARGS; GPUS_PER_NODE=8 is expanded inside DISTRIBUTED_ARGS.
    script = text("i22-mlm-pretrain-gpt-distributed")
    for flat in (parse_config(script, "pretrain_gpt_distributed.sh"), run(script).evidence.config):
        assert flat["micro_batch_size"] == 8 and flat["global_batch_size"] == 64
        assert flat["num_layers"] == 24 and flat["seq_length"] == 1024 and flat["fp16"] is True
        assert flat["nproc_per_node"] == 8 and flat["split"] == "949,50,1"
    # The default reading then names the script's own knob with its value.
    f = top(run(config=script, config_name="pretrain_gpt_distributed.sh"))
    assert f.rule == "RK170" and "micro_batch_size = 8" in f.evidence
    assert f.config_patch == {"micro_batch_size": 4}


def test_shell_variable_with_flags_on_its_first_line_is_read_where_expanded():
    # The same script's GPT_ARGS block as users paste it with the first flag on the opening
    # line (the quote, then --num-layers): read where the launch line expands $GPT_ARGS, a
    # flag before it not taking "$GPT_ARGS" as its value.
    script = text("i22-mlm-pretrain-gpt-distributed")
    block = script[script.index("GPT_ARGS=") : script.index("DATA_ARGS=")]
    block = block.replace('GPT_ARGS="\n    --num-layers', 'GPT_ARGS="--num-layers')
    pasted = block + "torchrun pretrain_gpt.py --use-distributed-optimizer $GPT_ARGS\n"
    for flat in (parse_config(pasted, "run.sh"), run(pasted).evidence.config):
        assert flat["num_layers"] == 24 and flat["micro_batch_size"] == 8
        assert flat["use_distributed_optimizer"] is True


@covers("RK087")
def test_rk087_names_the_scripts_knobs_and_patches_them():
    # A real training OOM (https://github.com/NVIDIA-NeMo/Automodel/pull/1975: 4.34 GiB
    # request, 2.59 GiB free) with the Megatron-LM example script as the config: the finding
    # names micro_batch_size = 8, patches it and Megatron's own recompute key, and relates
    # the change to the request.
    d = run(
        text("i12-automodel-1975"),
        config=text("i22-mlm-pretrain-gpt-distributed"),
        config_name="pretrain_gpt_distributed.sh",
    )
    f = get(d, "RK087")
    assert f.config_patch == {"micro_batch_size": 4, "recompute_granularity": "selective"}
    cites(f, "micro_batch_size = 8", "seq_length = 1024", "1.75 GiB", "2.17 GiB")
    assert "micro_batch_size 8 -> 4" in f.fix and "selective" in f.fix
    assert "halve micro_batch_size" in f.fix  # the rule's own fix text is kept


@covers("RK102")
def test_rk102_halves_the_pasted_batch_and_says_what_it_frees():
    # https://github.com/BaberMuyu/2020CCF-NER/issues/6 (dev corpus case): a 294 MiB request
    # with 61.62 MiB free on a 7.79 GiB GPU, batch_size 16; the author: lower batch_size.
    d = run(text("i22-ccf-ner-6"), config=text("i22-ccf-ner-6-config"))
    f = get(d, "RK102")
    # 617.88 MiB "cached" (split blocks) is twice the request but under 10% of the GPU: not
    # fragmentation worth the name, so the small-GPU reading leads and RK001 follows
    assert top(d).rule == "RK102" and ids(d).index("RK001") > 0
    assert f.config_patch == {"batch_size": 8}  # a plain script: no checkpoint key to set
    cites(f, "batch_size = 16", "232.38 MiB", "147.00 MiB", "6.27 GiB")
    assert "batch_size 16 -> 8" in f.fix and "larger GPU" in f.fix


# =============================================================================================
# RK220: nvidia-smi shows more than PyTorch holds (rules/outside_allocator.py)
# =============================================================================================


@covers("RK220")
def test_rk220_smi_above_torch_counters_is_the_cuda_context():
    # https://github.com/pytorch/pytorch/issues/28113 (dev corpus case): torch says 0, nvidia-smi
    # 200+ to 700+ MB; maintainer: "That is the size of the CUDA context."
    d = run(text("i22-pt-28113"))
    f = top(d)
    assert f.rule == "RK220" and f.category == "non_pytorch_memory"
    cites(f, "667.57 MiB", "0.00 MiB", "700+mb")
    assert "CUDA context" in f.fix and "mem_get_info" in f.confirm
    assert f.config_patch == {"env": {"CUDA_MODULE_LOADING": "LAZY"}}


@covers("RK220")
def test_rk220_memory_fraction_does_not_cap_the_context():
    # https://github.com/pytorch/pytorch/issues/107667 (dev corpus case): a 100MB cap with
    # set_per_process_memory_fraction, 430MB in nvidia-smi; ptrblck: the CUDA context.
    d = run(text("i22-pt-107667"))
    f = top(d)
    assert f.rule == "RK220"
    cites(f, "410.08 MiB", "95.37 MiB", "314.71 MiB", "set_per_process_memory_fraction")
    assert "never the context" in f.fix


def test_rk220_not_for_gigabytes_over_memory_allocated_alone():
    # https://github.com/pytorch/pytorch/issues/37250: memory_allocated() 0 after `del model`,
    # nvidia-smi 12433MiB; the answer there is the allocator's cache (max_memory_reserved is
    # close to nvidia-smi), not memory outside it.
    d = run(text("i22-pt-37250"))
    facts = d.evidence.facts["log"]
    assert facts["smi_bytes"] == 12433 * 2**20  # the device row, not the 81920MiB total
    assert "torch_bytes" not in facts  # "it shows `0`" names no PyTorch counter on its line
    assert "RK220" not in ids(d)
    # Said on one line, the gap is still gigabytes over memory_allocated alone: not RK220.
    d = run(text("i22-pt-37250").replace("it shows `0`.", "torch.cuda.memory_allocated() shows 0."))
    assert d.evidence.facts["log"]["torch_bytes"] == 0 and "RK220" not in ids(d)


def test_knobs_read_framework_names_not_lookalikes():
    # Key names as the frameworks document them (verl's ppo_trainer.yaml `trainer:` section,
    # Lightning's Trainer arguments, an LSTM's input_size): a `trainer.*` key alone is not
    # Lightning, and a feature size is not a sequence cap.
    from recompute_kit.doctor.rules.knobs import read_knobs

    def knobs(config: dict):
        return read_knobs(build_context(Evidence(config=config)))

    verl = knobs({"trainer.n_gpus_per_node": 8, "trainer.nnodes": 1, "max_prompt_length": 512})
    assert verl.framework == "script" and verl.seq == [("max_prompt_length", 512)]
    assert knobs({"trainer.accumulate_grad_batches": 4}).framework == "lightning"
    assert knobs({"trainer.devices": 2, "batch_size": 8}).framework == "lightning"
    assert knobs({"input_size": 128, "hidden_size": 256, "batch_size": 4}).seq == []


def test_pasted_document_with_glued_lines_does_not_crash():
    # The NVIDIA perf-activation-recompute skill (seed-001) pasted as a log: its scraped lines
    # run `--recompute_modules core_attn layernorm \` on into glued prose and a table header.
    # Only module names are read (no crash in RK143's patch, no "Megatron would reject" from
    # garbage), and the table's findings lead as they do when it is given as experiments.
    d = run(text("seed-001-perf-activation-recompute"))
    assert d.evidence.config["recompute_modules"] == ["core_attn", "layernorm"]
    assert top(d).category == "recompute_overhead" and "RK054" not in ids(d)


# =============================================================================================
# Pasted measurements (rules/measured.py, evidence/measured.py): recompute on/off tables
# (RK230, RK231), logits-sized sizes (RK232), OOM inside Module.to (RK233), offload that does
# not take effect (RK234), reserved far above allocated (RK235), optimizer states loaded onto
# the GPU at resume (RK236). Sources: development corpus cases, quoted verbatim from their
# threads (each test names the URL).
# =============================================================================================

CASES_DIR = Path(__file__).parent / "corpus" / "cases"


def corpus_text(case_id: str) -> str:
    """The verbatim artefacts of a development corpus case (never a held-out one)."""
    import yaml

    from recompute_kit.doctor.corpus import split_of

    case = yaml.safe_load((CASES_DIR / f"{case_id}.yaml").read_text(encoding="utf-8"))
    assert split_of(case["source"]) == "dev", case_id
    return case["artefacts"]


@covers("RK230")
def test_rk230_table_with_and_without_recompute_measures_its_cost():
    # https://github.com/PaddlePaddle/PaddleFleetX/pull/135: "1 card 247.27 ins/s | 380" vs
    # "1 card+recompute 189.78 ins/s | 780": recompute doubles the batch, costs ~23%.
    f = top(run(corpus_text("e_paddlefleetx_135_resnet_recompute_speed_drop_batch_doubles")))
    assert f.rule == "RK230" and f.category == "recompute_overhead"
    cites(f, "1450.6", "1896.03", "-23.5%", "batch 370 vs 760")
    assert f.config_patch == {"recompute": False, "batch_size": 370}
    assert "without recompute" in f.fix and "selective" in f.fix
    # https://github.com/pytorch/torchtitan/pull/3429: columns `default` and `full`: TPS -11.2%
    f = top(run(corpus_text("e_torchtitan_3429_full_recompute_policy_tps_minus_10pct")))
    assert f.rule == "RK230" and f.config_patch == {"recompute_granularity": "selective"}
    cites(f, "'full'", "'default'", "-11.2%", "52.44 -> 32.07")
    # within 5% it is no cost worth a finding
    cheap = corpus_text("e_torchtitan_3429_full_recompute_policy_tps_minus_10pct")
    for slow, fast in (
        ("5,933", "6,500"),
        ("7,006", "7,800"),
        ("34.74%", "38.5%"),
        ("41.02%", "45.9%"),
    ):
        cheap = cheap.replace(slow, fast)
    assert "RK230" not in ids(run(cheap))


@covers("RK231")
def test_rk231_recompute_of_cheap_ops_costs_nothing_and_buys_batch():
    # https://github.com/microsoft/onnxruntime/pull/4402: Phase 1 max BS 64 -> 80 with GeLU +
    # attention-dropout recompute, throughput 186.792 -> 191.111 ex/sec.
    case = corpus_text("e_ort_4402_localized_recompute_gelu_dropout_batch_throughput")
    f = top(run(case))
    assert f.rule == "RK231" and f.category == "informational"
    cites(f, "191.111", "186.792", "batch 64 vs 80")
    assert f.config_patch == {
        "recompute": "gelu_checkpoint + attention_dropout_checkpoint",
        "batch_size": 80,
    }
    # one recompute run 6% slower makes it a cost (RK230), not a free lunch
    slow = case.replace("| 36.0144 |", "| 34.2 |")
    assert "RK231" not in ids(run(slow)) and top(run(slow)).rule == "RK230"


@covers("RK232")
def test_rk232_size_equals_tokens_times_vocabulary_fp32():
    # https://github.com/NVIDIA-NeMo/RL/pull/2883: pre-fix peak 16219 MiB at seq_len 32768 with
    # V_local=128256, B=1: 32768 x 128256 x 4 bytes, the fp32 logits held whole.
    case = corpus_text("e_nemorl_2883_distillation_topk_fp32_logits_grows_with_seqlen")
    f = top(run(case))
    assert f.rule == "RK232" and f.category == "logits_memory"
    cites(f, "32768", "128256", "4 bytes")
    assert f.config_patch == {"logprob_chunk_size": 1024, "defer_fp32_logits": True}
    # https://github.com/huggingface/trl/issues/3678: `2 × 256 × 151665` next to 310 MB
    f = top(run(corpus_text("b_trl_3678_grpo_qwen3_06b_oom_full_vocab_logits")))
    assert f.rule == "RK232" and "use_liger_kernel" in f.fix
    # sizes that are not tokens x vocabulary x 2 or 4 bytes are not logits
    assert "RK232" not in ids(run(case.replace("V_local=128256", "V_local=50000")))


@covers("RK233")
def test_rk233_oom_inside_module_to_is_the_model_moved_whole():
    # https://github.com/l294265421/alpaca-rlhf/issues/6: OOM in module.py `convert`
    # (t.to(device, ...)) with --actor_zero_stage 3 --critic_zero_stage 3 on 8x V100 32 GB.
    case = corpus_text("e_alpacarlhf_6_v100_step3_zero3_models_loaded_whole_per_gpu")
    f = top(run(case))
    assert f.rule == "RK233" and f.category == "model_state_memory"
    cites(f, "30.95 GiB of 31.75 GiB")
    assert f.config_patch["map_location"] == "cpu" and "zero.Init" in f.fix
    # the same OOM raised elsewhere (no convert frame) is not this rule's
    cut = "\n".join(
        line for line in case.splitlines() if "convert" not in line and "t.to(" not in line
    )
    assert "RK233" not in ids(run(cut))


@covers("RK234")
def test_rk234_offload_on_but_memory_allocated_stays():
    # https://github.com/verl-project/verl/issues/2822: param_offload=True and
    # optimizer_offload=True, yet "memory allocated (GB): 32.006..." before the rollout.
    case = corpus_text("e_verl_2822_fsdp2_param_optimizer_offload_no_effect")
    f = top(run(case))
    assert f.rule == "RK234" and f.category == "framework_bug"
    cites(f, "32.01 GB")
    assert f.config_patch == {"actor_rollout_ref.actor.fsdp_config.offload_policy": True}
    # https://github.com/modelscope/ms-swift/pull/7821: ZeRO-3, "after model offload, memory
    # allocated (GB): 52.63"
    f = top(run(corpus_text("e_swift_7821_zero3_optimizer_offload_param_groups_empty")))
    assert f.rule == "RK234" and "optimizer.state" in f.fix
    # a report that dropped to ~1 GB is an offload that worked
    assert "RK234" not in ids(run(case.replace("32.006070613861084", "1.2")))


@covers("RK235")
def test_rk235_reserved_far_above_allocated_after_a_load():
    # https://github.com/PrimeIntellect-ai/prime-rl/pull/2154: reserved after load 14,362 MB vs
    # allocated 2,884 MB before the fix.
    case = corpus_text("e_primerl_2154_resume_cpu_offload_optimizer_reserved_not_returned")
    f = top(run(case))
    assert f.rule == "RK235" and f.category == "fragmentation"
    cites(f, "13.38 GiB reserved", "2.69 GiB allocated")
    assert "empty_cache" in f.fix and f.config_patch["env"] == EXPANDABLE["env"]
    # reserved close to allocated is no held cache
    assert "RK235" not in ids(run(case.replace("| 14,362 MB |", "| 3,100 MB |")))


@covers("RK236")
def test_rk236_optimizer_states_loaded_onto_the_gpu_at_resume():
    # https://github.com/NVIDIA/Megatron-LM/issues/380: load_checkpoint ->
    # optimizer.load_state_dict -> deepcopy(state_dict), "would cause gpu oom sometimes".
    case = corpus_text("e_megatron_380_distopt_load_state_dict_deepcopy_oom")
    f = top(run(case))
    assert f.rule == "RK236" and f.category == "framework_bug"
    cites(f, "megatron", "deep-copies")
    assert f.config_patch == {"map_location": "cpu"} and "upgrade megatron" in f.fix
    # without the optimizer's load_state_dict frames it is not this rule's
    cut = "\n".join(line for line in case.splitlines() if "load_state_dict" not in line)
    assert "RK236" not in ids(run(cut))
# RK260-RK265: general readings of a phenomenon (rules/general.py, facts from
# evidence/signals.py), and default readings from sizes stated in prose. Texts are
# tests/data/rules/i26-*, verbatim from dev corpus cases (URLs in SOURCES).
# =============================================================================================


@covers("RK260")
def test_rk260_traceback_cut_inside_a_library_on_a_sharding_path():
    # https://github.com/huggingface/transformers/issues/46822: from_pretrained's frames end in
    # transformers' _initialize_missing_keys under deepspeed.zero.GatheredParameters; the
    # exception line is cut. Root cause: transformers gathers every missing key at once.
    d = run(text("i26-hf-46822"))
    f = top(d)
    assert f.rule == "RK260" and f.category == "framework_bug"
    assert f.config_patch["command"] == "pip install -U transformers"
    assert f.config_patch["zero_optimization"] == {"stage": 2}
    cites(f, "transformers's own code", "_initialize_missing_keys", "GatheredParameters")
    assert "upgrade transformers" in f.fix and "paste it to confirm" in f.evidence
    # the same frames in the user's own script: not a library's bug
    mine = text("i26-hf-46822").replace(".../transformers/modeling_utils.py", "/home/me/train.py")
    assert "RK260" not in ids(run(mine))


@covers("RK260")
def test_rk260_needs_a_recompute_offload_or_sharding_path():
    # https://github.com/huggingface/transformers/issues/28499: Trainer -> accelerate ->
    # torch.autograd backward frames, cut before the exception: no feature in the frames, so
    # no framework-bug reading (the paste does not say which feature failed).
    assert "RK260" not in ids(run(text("i26-hf-28499")))


@covers("RK260", "RK103")
def test_rk260_ranks_below_the_specific_recompute_type_error():
    # https://github.com/NVIDIA/Megatron-LM/pull/2754: TypeError from Megatron's own
    # tensor_parallel.checkpoint; the specific RK103 leads, the general RK260 follows.
    d = run(text("i12-megatron-2754"))
    assert ids(d)[0] == "RK103"
    f = get(d, "RK260")
    assert f.confidence < top(d).confidence and f.config_patch["command"].endswith("megatron")


@covers("RK261")
def test_rk261_square_mask_of_a_long_sequence():
    # https://github.com/meta-pytorch/attention-gym/issues/32: q/k/v [2, 12, 93600, 128] and
    # "materialize [93600, 93600] mask causes OOM"; maintainer: pass _compile to
    # create_block_mask.
    d = run(text("i26-attngym-32"))
    f = top(d)
    assert f.rule == "RK261" and f.category == "allocation_exceeds_device"
    cites(f, "[93600, 93600]", "8.16 GiB", "[2, 12, 93600, 93600]", "783.29 GiB")
    assert "_compile=True" in f.config_patch["code"] and "create_block_mask" in f.fix


@covers("RK261")
def test_rk261_the_failing_line_computes_the_full_scores():
    # https://github.com/pytorch/pytorch/issues/133206: the OOM line of flex_attention run
    # uncompiled; the reporter: "the problem was I had to compile the function".
    f = top(run(text("i26-pt-133206")))
    assert f.rule == "RK261" and "torch.compile(flex_attention)" in f.config_patch["code"]
    assert f.confidence < 0.85  # no size in the paste: less sure than with [N, N]


@covers("RK262")
def test_rk262_logits_with_a_vocabulary_sized_dimension():
    # https://github.com/huggingface/trl/issues/3678: the full logits [B, logits_to_keep,
    # vocab] (2 x 256 x 151665) dominate the logprob forward; the answer: use_liger_kernel.
    # Here the pasted size is 2 x 256 x 151665 x 4 bytes: RK232 says so and RK262, the same
    # logits only named, steps aside; with a size that is not the product, RK262 reads them.
    assert top(run(text("i26-trl-3678"))).rule == "RK232"
    assert "RK262" not in ids(run(text("i26-trl-3678")))
    d = run(text("i26-trl-3678").replace("**310 MB**", "**500 MB**"))
    f = top(d)
    assert f.rule == "RK262" and f.category == "logits_memory"
    assert f.config_patch == {"use_liger_kernel": True}
    cites(f, "151665")
    assert "logits_to_keep" in f.fix and "chunked" in f.fix
    # the logits named with no size and no OOM next to them: no reading
    assert "RK262" not in ids(run("full logits tensor `[B, logits_to_keep, vocab]`\n"))


@covers("RK263", "RK001")
def test_rk263_side_stream_communication_outranks_fragmentation():
    # https://github.com/pytorch/pytorch/issues/71616: the OOM (36.19 GiB reserved, 22.96 GiB
    # allocated) in a job that overlaps NCCL communication on separate streams; the fix was
    # per-stream event queues (PR #71745) and fewer queued comms in flight.
    d = run(text("i26-pt-71616-report"))
    f = top(d)
    assert f.rule == "RK263" and f.category == "framework_bug"
    cites(f, "36.19 GiB", "22.96 GiB", "13.23 GiB", "NCCL")
    assert f.config_patch["env"] == {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
    assert "record_stream" in f.fix and "in flight" in f.fix
    assert ids(d)[1] == "RK001"  # the reserved-but-unallocated reading stays, second
    # the OOM line alone (no side streams in the paste): fragmentation leads, as before
    assert top(run(text("pt-71616"))).rule == "RK001"


@covers("RK264")
def test_rk264_memory_allocated_nonzero_after_freeing_is_cublas_workspace():
    # https://github.com/pytorch/pytorch/pull/85447: after deleting the model and garbage
    # collection memory_allocated() stays non-zero; the PR moved cuBLAS workspaces into the
    # caching allocator ("This is expected").
    f = top(run(text("i26-pt-85447")))
    assert f.rule == "RK264" and f.category == "informational"
    assert f.config_patch["code"] == "torch._C._cuda_clearCublasWorkspaces()"
    assert "CUBLAS_WORKSPACE_CONFIG" in f.config_patch["env"]
    # gigabytes left over are references the program holds, not a workspace
    big = text("i26-pt-85447").replace("returns non-zero", "returns non-zero (12 GB)")
    assert "RK264" not in ids(run(big))


@covers("RK265")
def test_rk265_memory_summary_peak_without_an_oom():
    # https://github.com/pytorch/pytorch/issues/116928: torch.cuda.memory_summary() with a
    # 23806 MiB peak and no OOM; ptrblck: the script needs ~24GB, so an 8GB cap OOMs.
    f = top(run(text("i17-mistral-116928-summary")))
    assert f.rule == "RK265" and f.category == "genuine_pressure"
    cites(f, "23.25 GiB", "14.02 GiB", "set_per_process_memory_fraction")
    assert f.config_patch == {"batch_size": "half of the current one"}


@covers("RK170")
def test_rk170_sharded_states_small_on_the_stated_gpu_and_eager_attention():
    # https://github.com/OpenRLHF/OpenRLHF/issues/384: DPO of glm-4-9b with ZeRO-3,
    # micro_train_batch_size 1 and gradient checkpointing on "A100-80Gx8"; the fix was
    # --flash_attn. ZeRO-3 over 8 GPUs leaves ~17 GiB of states per 80 GiB GPU: activations.
    d = run(text("i26-openrlhf-384"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert d.evidence.facts["log"]["gpu_prose"]["count"] == 8
    cites(f, "~9.0B parameters", "16.76 GiB per GPU")
    assert "flash_attn" in f.fix and "max_len 2048 -> 1024" in f.fix


@covers("RK171", "RK100")
def test_rk171_states_of_a_model_named_in_prose_not_a_separate_inference_engine():
    # https://github.com/OpenRLHF/OpenRLHF/issues/392: "16B模型", zero_stage 3 over
    # actor_num_gpus_per_node 4; maintainer: without Adam offload a large model OOMs. vLLM
    # runs on engines of its own (vllm_num_engines): no colocated-engine reading.
    d = run(text("i26-openrlhf-392"), config=text("i26-openrlhf-392-config"), config_name="run.sh")
    assert "RK100" not in ids(d)
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory"
    cites(f, "~16.0B parameters", "59.60 GiB per GPU over 4 GPU(s)")
    assert "offload_optimizer" in f.fix
    # ref_reward_offload offloads the frozen models, not the actor's optimizer
    assert "offload on" not in f.evidence


@covers("RK266")
def test_rk266_allocated_memory_rising_every_step_is_a_leak():
    # https://github.com/pytorch/pytorch/issues/115255 (labels: module: checkpoint, module:
    # memory usage): a saved-tensor-hook loop prints "memory (MB) | allocated: ..." once per
    # step, 20.4, 20.5, 20.5, 20.6, ... 21.0 MB, never settling. No public paste of this
    # shape is in the corpus, so the reports are built from the thread's numbers.
    mb = [20.4, 20.5, 20.5, 20.6, 20.6, 20.6, 20.7, 20.7, 20.8, 20.8, 20.9, 20.9, 21.0, 21.0, 21.1]
    reports = [MemoryReport(allocated_bytes=int(v * 2**20)) for v in mb]
    d = diagnose(Evidence(memory=reports))
    f = top(d)
    assert f.rule == "RK266" and f.category == "framework_bug"
    cites(f, "20.40 MiB -> 21.10 MiB", "14 steps")
    assert "gc.collect()" in f.config_patch["code"] and "upgrade" in f.fix
    # the same figures settling after warm-up: a peak, not a leak
    settled = [MemoryReport(allocated_bytes=int(v * 2**20)) for v in mb[:5] + [20.6] * 6]
    assert "RK266" not in ids(diagnose(Evidence(memory=settled)))


@covers("RK266")
def test_rk266_reads_step_numbered_lines_and_yields_to_specific_growth_rules():
    # pytorch#123548 (dev corpus text): reserved grows per cycle under max_split_size_mb with
    # expandable_segments; the specific RK154 leads, whatever else reads the growth.
    assert top(run(text("i13-pt-123548"))).rule == "RK154"
    from recompute_kit.doctor.evidence.signals import scan_signals

    # a Megatron report line without a step on it counts in print order
    facts = scan_signals(["[Rank 0] memory (MB) | allocated: 20.4 | max allocated: 21.8"])
    assert facts["memory_series"][0][:3] == (0, 20_400_000, "allocated")
