"""Megatron-LM: launch scripts (bash), argument lists, and functional-test `model_config.yaml`.

The flags are Megatron-LM's (`megatron/training/arguments.py` and, since core_v0.16, the
flags generated from `TransformerConfig`), read with Megatron-LM's semantics: see
/work/shared/reference/config-formats.md sections 1 and 2 (Megatron-LM @ d98e8a64):

* `--recompute-activations` sets `recompute_granularity = "selective"` (whatever
  `--recompute-granularity` says);
* `--num-query-groups` counts only with `--group-query-attention` (otherwise MHA);
* `--untie-embeddings-and-output-weights` unties (tied by default); `--disable-bias-linear`;
* `--moe-layer-freq` an int or a list expression such as `"([0]*3+[1]*58)"`, evaluated here
  with `ast` allowing only int lists, `+` and `*` (Megatron-LM `eval`s it);
* `--num-layers-per-virtual-pipeline-stage N`: VPP = num_layers / PP / N (1 -> None);
* `--pipeline-model-parallel-layout`: VPP = stages / PP;
* `--vocab-size` sizes the vocabulary only with the NullTokenizer / TikTokenizer
  (`megatron/core/tokenizers/utils/build_tokenizer.py`); other tokenizers bring their own;
* `--use-flash-attn` is read by no code under `megatron/` on main: the backend is
  `--attention-backend` (default auto).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

import yaml

from ..config import ConfigError
from ..config.pipeline_layout import expand_layout
from .reading import (
    FROM_ASSUMED,
    FROM_DEFAULT,
    FROM_FILE,
    MLA_KEYS,
    MOE_KEYS,
    RECOMPUTE_KEYS,
    Origin,
    Reading,
)
from .shell import (
    Field,
    Launch,
    parse_script,
    sbatch_unsized,
    sbatch_world_size,
    shown,
    unresolved_names,
    unset_because,
)

FRAMEWORKS = ("megatron-lm",)
FORMAT_SCRIPT = "Megatron-LM launch script"
FORMAT_YAML = "Megatron-LM functional-test model_config.yaml"
FORMAT_ARGS = "Megatron-LM argument list"

ARGS_PY = "megatron/training/arguments.py"
DEFAULT_WHERE = f"Megatron-LM's default ({ARGS_PY})"
MCORE_WHERE = "Megatron-Core's TransformerConfig default (core/transformer/transformer_config.py)"


# ----------------------------------------------------------------------- flag table


def _int(v: str) -> int:
    return int(v)


def _float(v: str) -> float:
    return float(v)


def _str(v: str) -> str:
    return v


# flag -> (field, converter) for flags taking one value
VALUE_FLAGS: dict[str, tuple[str, Any]] = {
    "--num-layers": ("num_layers", _int),
    "--hidden-size": ("hidden_size", _int),
    "--num-attention-heads": ("num_attention_heads", _int),
    "--kv-channels": ("kv_channels", _int),
    "--ffn-hidden-size": ("ffn_hidden_size", _int),
    "--seq-length": ("seq_length", _int),
    "--encoder-seq-length": ("seq_length", _int),
    "--micro-batch-size": ("micro_batch_size", _int),
    "--global-batch-size": ("global_batch_size", _int),
    "--hidden-dropout": ("hidden_dropout", _float),
    "--attention-dropout": ("attention_dropout", _float),
    "--make-vocab-size-divisible-by": ("make_vocab_size_divisible_by", _int),
    "--transformer-impl": ("transformer_impl", _str),
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", _int),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", _int),
    "--context-parallel-size": ("context_parallel_size", _int),
    "--expert-model-parallel-size": ("expert_model_parallel_size", _int),
    "--expert-tensor-parallel-size": ("expert_tensor_parallel_size", _int),
    "--decoder-first-pipeline-num-layers": ("num_layers_in_first_pipeline_stage", _int),
    "--decoder-last-pipeline-num-layers": ("num_layers_in_last_pipeline_stage", _int),
    "--moe-router-topk": ("moe_router_topk", _int),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", _int),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", _int),
    "--moe-router-score-function": ("moe_router_score_function", _str),
    "--moe-expert-capacity-factor": ("moe_expert_capacity_factor", _float),
    "--moe-router-load-balancing-type": ("moe_router_load_balancing_type", _str),
    "--q-lora-rank": ("q_lora_rank", _int),
    "--kv-lora-rank": ("kv_lora_rank", _int),
    "--qk-head-dim": ("qk_head_dim", _int),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", _int),
    "--v-head-dim": ("v_head_dim", _int),
    "--recompute-method": ("recompute_method", _str),
    "--recompute-num-layers": ("recompute_num_layers", _int),
    "--fp8-recipe": ("fp8_recipe", _str),
    "--cuda-graph-impl": ("cuda_graph_impl", _str),
    "--mtp-num-layers": ("mtp_num_layers", _int),
    "--cross-entropy-fusion-impl": ("cross_entropy_fusion_impl", _str),
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", _str),
    # precision-aware optimizer dtypes (choices fp32 / fp16 / bf16 / fp8, the kit's names)
    "--main-params-dtype": ("main_params_dtype", _str),
    "--exp-avg-dtype": ("exp_avg_dtype", _str),
    "--exp-avg-sq-dtype": ("exp_avg_sq_dtype", _str),
    # arguments.py: bf16 main grads leave accumulate_allreduce_grads_in_fp32 off
    "--main-grads-dtype": ("grad_reduce_in_fp32", lambda v: v == "fp32"),
    # Megatron-FSDP's own main-gradient buffer dtype (DistributedDataParallelConfig
    # megatron_fsdp_main_grads_dtype)
    "--megatron-fsdp-main-grads-dtype": ("grad_reduce_in_fp32", lambda v: v == "fp32"),
}
# Flags that change memory in a way the estimate does not model: said where the script sets them
NOT_MODELLED_FLAGS = {
    "--quick-geglu": "a gated MLP with quick_gelu, counted as SwiGLU (the same fc1 of 2 x ffn; "
    "the unfused quick_gelu keeps a little more for its backward)",
    "--fp8-param-gather": "the weights are kept in fp8 for the all-gather; the estimate counts "
    "them at 16 bits",
    "--moe-router-force-load-balancing": "the router is forced to balanced routing (a "
    "benchmark mode): the estimate's balanced routing holds for this run; a run with real "
    "routing has a busiest expert rank that holds more (plan --moe-imbalance)",
    "--fsdp-double-buffer": "Megatron-FSDP's double buffer keeps a second gathered unit "
    "(prefetch), not in the estimate",
}
# store_true flags -> (field, value)
BOOL_FLAGS: dict[str, tuple[str, Any]] = {
    "--swiglu": ("swiglu", True),
    "--moe-router-force-load-balancing": ("moe_router_force_load_balancing", True),
    # argument_utils.py: gated_linear_unit with quick_gelu: fc1 is 2 x ffn, as SwiGLU's
    "--quick-geglu": ("swiglu", True),
    "--disable-bias-linear": ("add_bias_linear", False),
    "--untie-embeddings-and-output-weights": ("share_embeddings_and_output_weights", False),
    "--qk-layernorm": ("qk_layernorm", True),
    "--bf16": ("bf16", True),
    "--fp16": ("fp16", True),
    "--moe-grouped-gemm": ("moe_grouped_gemm", True),
    "--moe-permute-fusion": ("moe_permute_fusion", True),
    "--moe-pad-expert-input-to-capacity": ("moe_pad_expert_input_to_capacity", True),
    "--moe-router-pre-softmax": ("moe_router_pre_softmax", True),
    "--moe-shared-expert-overlap": ("moe_shared_expert_overlap", True),
    "--multi-latent-attention": ("multi_latent_attention", True),
    "--sequence-parallel": ("sequence_parallel", True),
    "--use-distributed-optimizer": ("use_distributed_optimizer", True),
    "--tp-comm-overlap": ("tp_comm_overlap", True),
    "--overlap-moe-expert-parallel-comm": ("overlap_moe_expert_parallel_comm", True),
    "--use-megatron-fsdp": ("use_megatron_fsdp", True),
    "--use-torch-fsdp2": ("use_torch_fsdp2", True),
    "--distribute-saved-activations": ("distribute_saved_activations", True),
    "--moe-layer-recompute": ("moe_layer_recompute", True),
    "--cross-entropy-loss-fusion": ("cross_entropy_loss_fusion", True),
    "--fine-grained-activation-offloading": ("fine_grained_activation_offloading", True),
    "--grad-reduce-in-bf16": ("grad_reduce_in_fp32", False),
    "--accumulate-allreduce-grads-in-fp32": ("grad_reduce_in_fp32", True),
    "--use-precision-aware-optimizer": ("use_precision_aware_optimizer", True),
    "--optimizer-cpu-offload": ("optimizer_offload", True),
    "--account-for-embedding-in-pipeline-split": ("account_for_embedding_in_pipeline_split", True),
    "--account-for-loss-in-pipeline-split": ("account_for_loss_in_pipeline_split", True),
    "--no-masked-softmax-fusion": ("masked_softmax_fusion", False),
    "--no-rope-fusion": ("apply_rope_fusion", False),
    "--attention-softmax-in-fp32": ("attention_softmax_in_fp32", True),
    "--apply-query-key-layer-scaling": ("attention_softmax_in_fp32", True),
    "--use-rotary-position-embeddings": ("position_embedding_type", "rope"),
    "--fp8-e4m3": ("fp8", "e4m3"),  # legacy (pre-TE-recipe) flags
    "--fp8-hybrid": ("fp8", "hybrid"),
}
# Recompute flags Megatron-LM removed (renamed in 2022, commits cfd2e21 and bbab79f): its
# argparse refuses them ("error: unrecognized arguments"), except --checkpoint-activations,
# which it still parses only to exit with "--checkpoint-activations is no longer valid, use
# --recompute-activations, or, for more control, --recompute-granularity and
# --recompute-method." (megatron/training/arguments.py). Flag -> what replaced it.
RENAMED_FLAGS = {
    "--checkpoint-activations": "--recompute-activations (selective), or "
    "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    "--activations-checkpoint-method": "--recompute-method",
    "--activations-checkpoint-num-layers": "--recompute-num-layers",
    "--checkpoint-num-layers": "--recompute-num-layers",
    "--distribute-checkpointed-activations": "--distribute-saved-activations",
}
# Megatron-LM v1's names (and DeepSpeedExamples' copy of it) for what today's flags set; today's
# Megatron-LM refuses them ("--model-parallel-size is no longer valid, use
# --tensor-model-parallel-size instead", megatron/training/arguments.py). A script passing one
# is written for v1, where --checkpoint-activations recomputed every layer too.
V1_FLAGS = {
    "--model-parallel-size": ("tensor_model_parallel_size", "--tensor-model-parallel-size"),
    "--batch-size": ("micro_batch_size", "--micro-batch-size"),
}
V1_WHERE = "Megatron-LM v1 (its --model-parallel-size / --batch-size era)"
# Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed): its launch flags, and the flags it reads
# its own way (the rest are Megatron-LM's)
DEEPSPEED_TELLS = ("--deepspeed", "--deepspeed_config", "--deepspeed-config")
MDS_FLAGS = frozenset(
    {
        "--checkpoint-activations",
        "--checkpoint-num-layers",
        "--deepspeed-activation-checkpointing",
        "--partition-activations",
        "--checkpoint-in-cpu",
        "--contigious-checkpointing",
        "--synchronize-each-layer",
        "--profile-backward",
        "--use-flash-attn",
        "--use-flash-attn-v1",
        "--use-flash-attn-v2",
        "--use-flash-attn-triton",
        "--num-key-value-heads",
    }
)
MDS_WHERE = "Megatron-DeepSpeed (megatron/arguments.py, megatron/model/transformer.py)"
# Flags handled by hand below (read, then interpreted together).
SPECIAL_FLAGS = (
    "--group-query-attention",
    "--num-query-groups",
    "--vocab-size",
    "--padded-vocab-size",
    "--tokenizer-type",
    "--normalization",
    "--position-embedding-type",
    "--attention-backend",
    "--use-flash-attn",
    "--fp8-format",
    "--num-experts",
    "--moe-layer-freq",
    "--moe-aux-loss-coeff",
    "--recompute-activations",
    "--recompute-granularity",
    "--recompute-modules",
    "--offload-modules",
    "--cuda-graph-scope",
    "--cpu-offloading-num-layers",
    "--cpu-offloading",
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout",
    "--data-parallel-sharding-strategy",
    "--no-bias-gelu-fusion",
    "--no-bias-swiglu-fusion",
    "--no-position-embedding",
)
_KEY_FOR = {
    "num_query_groups": "--group-query-attention --num-query-groups",
    "vocab_size": "--vocab-size (NullTokenizer) or the tokenizer",
    "normalization": "--normalization",
    "position_embedding_type": "--position-embedding-type",
    "attention_backend": "--attention-backend",
    "fp8": "--fp8-format",
    "num_moe_experts": "--num-experts",
    "moe_layer_freq": "--moe-layer-freq",
    "recompute_granularity": "--recompute-granularity (or --recompute-activations)",
    "recompute_modules": "--recompute-modules",
    "cpu_offloading": "--cpu-offloading-num-layers",
    "cpu_offloading_num_layers": "--cpu-offloading-num-layers",
    "virtual_pipeline_model_parallel_size": "--num-layers-per-virtual-pipeline-stage",
    "data_parallel_size": "WORLD_SIZE (torchrun --nnodes x --nproc-per-node)",
    "world_size": "torchrun --nnodes x --nproc-per-node",
    "zero_stage": "--use-distributed-optimizer / --use-megatron-fsdp",
    "bias_activation_fusion": "--no-bias-swiglu-fusion / --no-bias-gelu-fusion",
    "moe_aux_loss_coeff": "--moe-aux-loss-coeff",
}
for _flag, (_field, _conv) in VALUE_FLAGS.items():
    _KEY_FOR.setdefault(_field, _flag)
for _flag, (_field, _value) in BOOL_FLAGS.items():
    _KEY_FOR.setdefault(_field, _flag)


def key_for(field: str) -> str:
    """How a Megatron-LM user sets a Megatron-Core field."""
    return _KEY_FOR.get(field, "--" + field.replace("_", "-"))


# ----------------------------------------------------------------------- sniffing

_FLAG_TELLS = re.compile(
    r"--(num-layers|hidden-size|num-attention-heads|tensor-model-parallel-size|"
    r"pipeline-model-parallel-size|micro-batch-size|seq-length|recompute-granularity|"
    r"recompute-modules|recompute-method|recompute-num-layers|recompute-activations)\b"
)


_HF_ID = re.compile(r"[\w.-]+/[\w.-]+")  # org/name, not a path


# --tokenizer-type -> (the vocabulary it brings, whose it is): a tokenizer type made for one
# model's vocabulary. Megatron-Core builds Llama2Tokenizer as a SentencePiece tokenizer
# (megatron/core/tokenizers/text/utils/build_tokenizer.py, SP_TOKENIZERS) of Llama 2's
# tokenizer.model: 32000 pieces (meta-llama/Llama-2-7b-hf
# config.json vocab_size, https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json).
def assume_tokenizer_vocab(reading: Reading, tok_type: str, where: str, key: str) -> None:
    """The vocabulary a tokenizer type implies (_TOKENIZER_VOCAB), as an assumption: the
    tokenizer.model file itself is not read."""
    size, whose = _TOKENIZER_VOCAB[tok_type]
    note = f"{tok_type} is {whose}; another model file would differ"
    reading.set("vocab_size", size, Origin(FROM_ASSUMED, where, key, note))


_TOKENIZER_VOCAB = {
    "Llama2Tokenizer": (32000, "Llama 2's SentencePiece tokenizer.model, 32000 pieces"),
    # GPT-2's BPE files (gpt2-vocab.json): 50257 tokens (openai-community/gpt2 config.json)
    "GPT2BPETokenizer": (50257, "GPT-2's BPE vocabulary (gpt2-vocab.json), 50257 tokens"),
}
_HYDRA_SECTION_KEYS = re.compile(
    r"(?:^|\s)[\"']?[+~]?(?:model|train|dataset|optimizer|ddp|checkpoint|scheduler|"
    r"mixed_precision)"
    r"\.\w+="
)


# Only flags (and their values), one per line, no command: "--seq-length 8192\n--num-layers 32"
_FLAG_LIST = re.compile(
    r"\A(?:[ \t]*(?:--[A-Za-z][\w-]*(?:[ \t=][^\n\\]*)?)?[ \t]*\n)*"
    r"[ \t]*--[A-Za-z][\w-]*(?:[ \t=][^\n\\]*)?\s*\Z"
)


def sniff(text: str, path: str) -> int:
    lower = path.lower()
    tells = len(set(_FLAG_TELLS.findall(text)))
    if lower.endswith((".yaml", ".yml")):
        if re.search(r"^MODEL_ARGS(_\d+)?:\s*$", text, re.M) and re.search(
            r"^\s+--[a-z]", text, re.M
        ):
            return 95
        return 0
    if lower.endswith((".json", ".toml")):
        return 0
    script = lower.endswith((".sh", ".bash", ".slurm", ".sbatch")) or text.startswith("#!")
    program = re.search(r"\bpretrain_[a-z0-9_]+\.py\b", text) is not None
    if len(_HYDRA_SECTION_KEYS.findall(text)) >= 2 and tells < 2:
        return 30  # Megatron-Bridge's entry points take `model.x=...` overrides, not flags
    if script and (program or tells):
        return 90 if program else 70
    if tells >= 2:
        return 60
    return 0


# ----------------------------------------------------------------------- reading


@dataclass
class Arg:
    """One flag as given: its values (as text), the line of the flag, the key as written."""

    flag: str
    values: list[str]
    line: int
    value_lines: list[int]


def read(text: str, path: str) -> Reading:
    lower = path.lower()
    if lower.endswith((".yaml", ".yml")):
        reading = Reading(framework="megatron-lm", format=FORMAT_YAML)
        args = _yaml_args(text, path, reading)
        variables: dict[str, object] = {}
    else:
        if _FLAG_LIST.match(text):
            # arguments pasted one per line without backslashes: one argument list (line
            # numbers kept by continuing each line)
            text = re.sub(r"[ \t]*\n(?=[ \t]*--[A-Za-z])", " \\\n", text)
        script = parse_script(text, path)
        is_script = "\n" in text.strip() or text.startswith("#!")
        reading = Reading(
            framework="megatron-lm", format=FORMAT_SCRIPT if is_script else FORMAT_ARGS
        )
        reading.warnings += script.warnings
        fields: list[Field]
        if script.launches:
            launch = script.launches[0]
            if len(script.launches) > 1:
                reading.warnings.append(
                    f"{path}: {len(script.launches)} training commands (lines "
                    + ", ".join(str(x.line) for x in script.launches)
                    + f"): the first, line {launch.line}, is read"
                )
            fields = launch.args
            if launch.world_size:
                reading.set("world_size", launch.world_size, _world_size_origin(launch, path))
            if launch.gpus_per_node:
                count, line, key = launch.gpus_per_node
                reading.set("gpus_per_node", count, Origin(FROM_FILE, f"{path}:{line}", key))
            elif (gap := sbatch_unsized(script.sbatch)) is not None:
                reading.warnings.append(f"{path}: {gap}: {WORLD_UNKNOWN}")
        else:
            fields, names = _flags_in_variables(script.variables)
            if not fields:
                raise ConfigError(f"{path}: no Megatron-LM training command or flags found")
            reading.warnings.append(
                f"{path}: no training command found; flags read from the variables "
                + ", ".join(names)
            )
            if (sized := sbatch_world_size(script.sbatch)) is not None:
                # the command runs in a string the script hands to srun (bash -c "$CMD" in an
                # sbatch heredoc): the job's size is its #SBATCH header's
                world, line, key = sized
                reading.set("world_size", world, Origin(FROM_FILE, f"{path}:{line}", key))
            elif (gap := sbatch_unsized(script.sbatch)) is not None:
                reading.warnings.append(f"{path}: {gap}: {WORLD_UNKNOWN}")
        args = _args_from_fields(fields, path, reading)
        variables = script.variables
        for flag, line in script.undecided_flags.items():
            known = VALUE_FLAGS.get(flag) or BOOL_FLAGS.get(flag)
            if known is not None:
                reading.unread_settings.setdefault(
                    known[0], f"{path}:{line} {flag} sets it in a branch the script does not decide"
                )
    _interpret(args, path, reading, variables)
    return reading


def _megatron_deepspeed(get, setv, path: str, reading: Reading, where: str = MDS_WHERE) -> None:
    """Megatron-DeepSpeed's own readings of its flags: --checkpoint-activations is full
    recompute of groups of --checkpoint-num-layers (default 1) layers, every layer's input kept
    (ParallelTransformer._checkpointed_forward: uniform); --partition-activations splits the
    kept inputs over tensor parallelism (Megatron's distribute_saved_activations); attention
    is its local, unfused one unless a --use-flash-attn* flag is given. (One expert is a dense
    MLP there, --num-experts 1 its default: read with the MoE flags.) Megatron-LM v1 read its
    flags the same way: `where` names which of the two the script is for."""
    reading.format = "Megatron-DeepSpeed launch script"
    reading.set(  # its transformer is Megatron's local one (no Transformer Engine path)
        "transformer_impl", "local", Origin(FROM_DEFAULT, where, note="no Transformer Engine")
    )
    if a := get("--checkpoint-activations"):
        note = f"{where}: full recompute, every --checkpoint-num-layers layers (uniform)"
        reading.set("recompute_granularity", "full", _origin(path, a, note))
        reading.set("recompute_method", "uniform", _origin(path, a, note))
        n = get("--checkpoint-num-layers")
        if n is None or setv("recompute_num_layers", n, _int) is None:
            reading.set(
                "recompute_num_layers",
                1,
                Origin(FROM_DEFAULT, where, "--checkpoint-num-layers"),
            )
        if a := get("--partition-activations"):
            note = "Megatron-DeepSpeed: the checkpointed inputs split over tensor parallelism"
            reading.set("distribute_saved_activations", True, _origin(path, a, note))
    if a := get("--num-key-value-heads"):  # its GQA flag (arguments.py; Megatron-LM's differ)
        setv("num_query_groups", a, _int, "Megatron-DeepSpeed's --num-key-value-heads")
    if a := get("--checkpoint-in-cpu"):
        reading.warnings.append(
            f"{path}:{a.line}: --checkpoint-in-cpu: DeepSpeed keeps the checkpointed layer "
            "inputs in host memory; not modelled (the estimate keeps them on the GPU)"
        )
    flash = next((get(f) for f in MDS_FLAGS if f.startswith("--use-flash-attn") and get(f)), None)
    if flash is not None:
        reading.set("attention_backend", "flash", _origin(path, flash, "flash-attn"))
    else:
        reading.set(
            "attention_backend",
            "unfused",
            Origin(FROM_DEFAULT, where, note="its local attention: no --use-flash-attn*"),
        )


WORLD_UNKNOWN = "the world size is not known; give --dp (the world size over TP x PP x CP)"


def _world_size_origin(launch: Launch, path: str) -> Origin:
    """Read from the script, or, where the node or GPU count is the default of an environment
    variable the script does not set (`NNODES=${SLURM_NNODES:-"1"}`), assumed: the user's
    environment is never read, and the default is only what the script falls back to."""
    where = f"{path}:{launch.world_size_line}"
    if not launch.world_size_rests_on:
        return Origin(FROM_FILE, where, launch.world_size_key)
    envs = " or ".join(dict.fromkeys(r.env for r in launch.world_size_rests_on))
    defaults = "; ".join(r.describe() for r in launch.world_size_rests_on)
    # the scheduler sets these at launch; recompute-kit never reads the environment
    key = f"--dp (at launch {envs} sets it; the environment is not read)"
    return Origin(FROM_ASSUMED, where, key, f"{defaults}; {launch.world_size_key}")


def _flags_in_variables(variables: dict[str, object]) -> tuple[list[Field], list[str]]:
    fields: list[Field] = []
    names: list[str] = []
    for name, value in variables.items():
        if not isinstance(value, list) or not value:
            continue
        if isinstance(value[0], Field):
            vf: list[Field] = value  # type: ignore[assignment]
        else:
            text = "".join(t for t, _ in value)  # type: ignore[misc]
            line = value[0][1]  # type: ignore[index]
            vf, pos = [], 0
            for seg_text, seg_line in value:  # type: ignore[misc]
                for m in re.finditer(r"\S+", seg_text):
                    vf.append(Field(m.group(0), seg_line))
                pos += len(seg_text)
            del text, line
        words = [w for f in vf for w in f.text.split()]
        if any(_FLAG_TELLS.match(w) for w in words):
            names.append(name)
            for f in vf:
                for w in f.text.split():
                    fields.append(Field(w, f.line))
    return fields, names


def _is_flag(text: str) -> bool:
    return text.startswith("--") and len(text) > 2


# A redirection left among the words of a command run from a string (`run_cmd="... &> log"`,
# then `eval $run_cmd`): it and its target are no flag values
_REDIRECTION = re.compile(r"\d*(?:>>?|<)(?:&\d*)?|&>>?|\d*>&\d+")


def _args_from_fields(fields: list[Field], path: str, reading: Reading) -> list[Arg]:
    args: list[Arg] = []
    redirected = False
    for f in fields:
        # Array elements written as one string ("--fp8-format hybrid") are split by the
        # unquoted expansion already; a quoted one reaches here whole: split it too.
        words = [f.text] if not _is_flag(f.text) or " " not in f.text else f.text.split()
        for w in words:
            if redirected or _REDIRECTION.fullmatch(w):
                # `&> log` / `> log` take the next word; `2>&1` stands alone
                redirected = not redirected and not re.search(r"&\d+$", w)
                continue
            if _is_flag(w):
                if "=" in w:
                    flag, value = w.split("=", 1)
                    args.append(Arg(flag, [value], f.line, [f.line]))
                else:
                    args.append(Arg(w, [], f.line, []))
            elif args:
                args[-1].values.append(w)
                args[-1].value_lines.append(f.line)
    return args


def _yaml_args(text: str, path: str, reading: Reading) -> list[Arg]:
    try:
        doc = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(
            f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("MODEL_ARGS"), dict):
        raise ConfigError(f"{path}: no MODEL_ARGS mapping (a Megatron-LM model_config.yaml)")
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.value == "MODEL_ARGS" and isinstance(value_node, yaml.MappingNode):
                for k, _v in value_node.value:
                    lines[str(k.value)] = k.start_mark.line + 1
    extra = sorted(k for k in doc if re.fullmatch(r"MODEL_ARGS_\d+", str(k)))
    if extra:
        reading.warnings.append(
            f"{path}: {', '.join(extra)} (the arguments of later runs of the test) are not read"
        )
    args: list[Arg] = []
    for key, value in doc["MODEL_ARGS"].items():
        key = str(key)
        line = lines.get(key, 0)
        if not key.startswith("--"):
            reading.unused[key] = value
            continue
        if value is True:
            args.append(Arg(key, [], line, []))
        elif value is False or value is None:
            reading.unused[key] = value  # the test harness drops it: the flag is not given
        else:
            s = str(value)
            # `_run_training.sh`: a value in [ ] is a list of words; anything else one word.
            listed = re.fullmatch(r"\[[^\]]+\]", s.strip())
            values = s.strip()[1:-1].split() if listed else [s]
            args.append(Arg(key, values, line, [line] * len(values)))
    return args


# ----------------------------------------------------------------------- interpreting


def _origin(path: str, arg: Arg, note: str = "") -> Origin:
    return Origin(FROM_FILE, f"{path}:{arg.line}", arg.flag, note)


def _interpret(
    args: list[Arg], path: str, reading: Reading, variables: dict[str, object] | None = None
) -> None:
    """`variables`: the script's, to say why a flag's value is unknown ($2, unset)."""
    last: dict[str, Arg] = {}
    for arg in args:
        last[arg.flag] = arg  # argparse: the last one wins

    def value_of(arg: Arg) -> str | None:
        """The single value of a flag, or None (warned) when missing or unresolved."""
        if not arg.values:
            reading.warnings.append(f"{path}:{arg.line}: {arg.flag} has no value: not read")
            return None
        names = [n for v in arg.values for n in unresolved_names(v)]
        if names:
            name = names[0]
            shown_name = name if name.startswith("$") else f"${name}"
            why = unset_because(name, variables or {})
            reading.warnings.append(
                f"{path}:{arg.line}: {arg.flag} is given {shown_name}, {why}: the flag is not read"
            )
            known = VALUE_FLAGS.get(arg.flag) or BOOL_FLAGS.get(arg.flag)
            if known is not None:
                reading.unread_settings.setdefault(
                    known[0], f"{path}:{arg.line} {arg.flag} is given {shown_name}, {why}"
                )
            return None
        return arg.values[0]

    def setv(field: str, arg: Arg, conv: Any, note: str = "") -> Any:
        raw = value_of(arg)
        if raw is None:
            return None
        try:
            value = conv(raw.strip().strip("'\""))
        except (ValueError, TypeError):
            raise ConfigError(
                f"{path}:{arg.line}: {arg.flag} {raw!r} is not a valid value"
            ) from None
        line_note = note
        if arg.value_lines and arg.value_lines[0] != arg.line:
            # (line 0: `set --`, the positional arguments the script was run with)
            said = (
                f"value set on line {arg.value_lines[0]}"
                if arg.value_lines[0]
                else ("value from the script's positional arguments")
            )
            line_note = "; ".join(x for x in (note, said) if x)
        reading.set(field, value, _origin(path, arg, line_note))
        return value

    # Microsoft's Megatron-DeepSpeed: a fork of Megatron-LM v2 that keeps the old recompute
    # flags (megatron/arguments.py "added back ... DeepSpeed still relies on" them)
    mds = any(f in last for f in DEEPSPEED_TELLS)
    v1 = any(f in last for f in V1_FLAGS)
    for flag, arg in last.items():
        if (mds or v1) and flag in MDS_FLAGS:
            continue  # read by _megatron_deepspeed
        if v1 and flag in V1_FLAGS:
            field, now = V1_FLAGS[flag]
            setv(field, arg, _int, f"{V1_WHERE}: now {now}; today's Megatron-LM refuses {flag}")
            continue
        if flag in VALUE_FLAGS:
            field, conv = VALUE_FLAGS[flag]
            setv(field, arg, conv)
        elif flag in BOOL_FLAGS:
            field, value = BOOL_FLAGS[flag]
            reading.set(field, value, _origin(path, arg))
        elif flag in SPECIAL_FLAGS:
            continue
        elif flag in RENAMED_FLAGS:
            reading.unused[flag] = [shown(v) for v in arg.values] or True
            reading.warnings.append(
                f"{path}:{arg.line}: {flag} is no longer a Megatron-LM flag: the run stops at "
                f"argument parsing; it is now {RENAMED_FLAGS[flag]} (not read)"
            )
        else:
            values = [shown(v) for v in arg.values]
            reading.unused[flag] = values[0] if len(values) == 1 else (values or True)

    _special(last, path, reading, value_of, setv)


def _special(last: dict[str, Arg], path: str, reading: Reading, value_of: Any, setv: Any) -> None:
    get = last.get
    mds = any(f in last for f in DEEPSPEED_TELLS)
    # GQA trap
    gqa = get("--group-query-attention")
    groups = get("--num-query-groups")
    if gqa:
        if groups:
            setv("num_query_groups", groups, _int)
        else:
            reading.set(
                "num_query_groups", 1, _origin(path, gqa, "--num-query-groups defaults to 1")
            )
    elif groups:
        reading.warnings.append(
            f"{path}:{groups.line}: --num-query-groups without --group-query-attention is "
            "ignored by Megatron-LM (the model is MHA)"
        )
        reading.unused["--num-query-groups"] = groups.values[0] if groups.values else True

    # Vocabulary: --vocab-size counts only with the tokenizers that take it.
    vocab, tok = get("--vocab-size"), get("--tokenizer-type")
    tok_type = value_of(tok) if tok else None
    if tok:
        reading.unused["--tokenizer-type"] = tok_type
    if vocab:
        if tok_type in (None, "NullTokenizer", "TikTokenizer", "NullMultimodalTokenizer"):
            setv("vocab_size", vocab, _int)
        else:
            reading.warnings.append(
                f"{path}:{vocab.line}: --vocab-size is not used with --tokenizer-type "
                f"{tok_type}: the tokenizer's own vocabulary size is (not in this file)"
            )
            reading.unused["--vocab-size"] = vocab.values[0] if vocab.values else None

    if tok and tok_type in _TOKENIZER_VOCAB and "vocab_size" not in reading:
        # still an assumption (the tokenizer.model file is not read), but the tokenizer type's:
        # said with the line that names it
        assume_tokenizer_vocab(
            reading,
            tok_type,
            f"{path}:{tok.line} --tokenizer-type {tok_type}",
            "the tokenizer.model --tokenizer-model names",
        )
        reading.unused.pop("--tokenizer-type", None)

    vocab_file = get("--vocab-file")
    named = str(value_of(vocab_file) or "") if vocab_file else ""
    if not tok and get("--merge-file") and named and "vocab_size" not in reading:
        # BPE files (a vocab and a merges file) with no --tokenizer-type: GPT2BPETokenizer
        # (Megatron-LM's default type before it had to be given; its CI's GPT tests still pass
        # only these two), GPT-2's 50257 tokens unless the file (not read) holds others
        assume_tokenizer_vocab(
            reading,
            "GPT2BPETokenizer",
            f"{path}:{vocab_file.line} --vocab-file {named} (with --merge-file)",
            "--tokenizer-type and the --vocab-file it reads",
        )

    tok_model = get("--tokenizer-model")
    tok_id = value_of(tok_model) if tok_model else None
    if tok_type == "HuggingFaceTokenizer" and tok_id and _HF_ID.fullmatch(tok_id):
        reading.tokenizer, reading.tokenizer_origin = tok_id, _origin(path, tok_model)

    if (padded := get("--padded-vocab-size")) and "vocab_size" not in reading:
        # no flag of Megatron-LM's parser (its argument dump prints padded_vocab_size): pastes
        # carry it, and it is the size the embedding and logits have
        setv("vocab_size", padded, _int)
        reading.warnings.append(
            f"{path}:{padded.line}: --padded-vocab-size is no Megatron-LM flag (its argument "
            "dump prints it): taken as the vocabulary size"
        )

    if a := get("--normalization"):
        setv("normalization", a, _normalization)
    if a := get("--position-embedding-type"):
        setv("position_embedding_type", a, _str)
    if (a := get("--no-position-embedding")) and "position_embedding_type" not in reading:
        # arguments.py: --no-position-embedding is deprecated and raises unless rope
        reading.warnings.append(
            f"{path}:{a.line}: --no-position-embedding without --position-embedding-type rope "
            "is rejected by Megatron-LM"
        )
    elif a:
        reading.unused["--no-position-embedding"] = True
    if a := get("--attention-backend"):
        setv("attention_backend", a, _backend, _backend_note(a))
        spec = get("--spec")
        if _backend_note(a) and not (spec and spec.values and spec.values[0] == "local"):
            reading.warnings.append(
                f"{path}:{a.line}: --attention-backend local without --spec local: Megatron-LM "
                "refuses it ('--attention-backend local is only supported with --spec local', "
                "arguments.py validate_args)"
            )
    for flag, words in NOT_MODELLED_FLAGS.items():
        if a := get(flag):
            reading.warnings.append(f"{path}:{a.line}: {flag}: {words}")
    hybrid = get("--hybrid-layer-pattern") or get("--hybrid-override-pattern")
    spec = get("--spec")
    if hybrid or (spec and re.search(r"mamba|hybrid", " ".join(spec.values), re.I)):
        a = hybrid or spec
        reading.not_modelled.append(
            f"{path}:{a.line} {a.flag}: a hybrid model with Mamba layers (Megatron's "
            "hybrid/Mamba stack)"
        )
    v1 = any(f in last for f in V1_FLAGS)
    if mds or v1:  # (v1 read its flags as Megatron-DeepSpeed, its fork, still does)
        _megatron_deepspeed(get, setv, path, reading, V1_WHERE if v1 else MDS_WHERE)
    if v1:
        reading.format = f"launch script for {V1_WHERE}"
        reading.warnings.append(
            f"{path}: written for {V1_WHERE}: its old flags are read as their successors "
            "(--model-parallel-size as tensor parallelism, --batch-size as the micro-batch, "
            "--checkpoint-activations as full recompute); today's Megatron-LM refuses them"
        )
    elif not mds and (a := get("--use-flash-attn")):
        reading.unused["--use-flash-attn"] = True
        reading.warnings.append(
            f"{path}:{a.line}: --use-flash-attn has no effect in Megatron-LM's GPT model: "
            "the backend is --attention-backend"
        )
    if a := get("--fp8-format"):
        setv("fp8", a, _fp8)
    if a := get("--num-experts"):
        n = value_of(a)
        if n is not None:
            try:
                experts = int(n)
            except ValueError:
                raise ConfigError(
                    f"{path}:{a.line}: --num-experts {n!r} is not an integer"
                ) from None
            if mds and experts == 1:  # Megatron-DeepSpeed's dense default: the MLP itself
                reading.set("num_moe_experts", None, _origin(path, a, "1: a dense MLP"))
            else:
                reading.set("num_moe_experts", experts or None, _origin(path, a))
    if a := get("--moe-layer-freq"):
        raw = value_of(a)
        if raw is not None:
            try:
                freq = moe_layer_freq(raw)
            except ValueError as exc:
                raise ConfigError(f"{path}:{a.line}: --moe-layer-freq {raw!r}: {exc}") from None
            reading.set("moe_layer_freq", freq, _origin(path, a))
    if a := get("--moe-aux-loss-coeff"):
        setv("moe_aux_loss_coeff", a, _float, "first value" if len(a.values) > 1 else "")

    # Recompute
    if a := get("--recompute-granularity"):
        setv("recompute_granularity", a, _str)
    if a := get("--recompute-activations"):
        note = "--recompute-activations sets selective" if get("--recompute-granularity") else ""
        reading.set("recompute_granularity", "selective", _origin(path, a, note))
    for flag, field in (
        ("--recompute-modules", "recompute_modules"),
        ("--offload-modules", "offload_modules"),
        ("--cuda-graph-scope", "cuda_graph_scope"),
    ):
        if a := get(flag):
            names = [n for v in a.values for n in unresolved_names(v)]
            if names:
                reading.warnings.append(
                    f"{path}:{a.line}: {flag} is given ${names[0]}, which the script does not "
                    "set: the flag is not read"
                )
                continue
            items = [x for v in a.values for x in re.split(r"[\s,]+", v.strip("[]'\"")) if x]
            reading.set(field, items, _origin(path, a))
    if a := get("--cpu-offloading-num-layers"):
        n = setv("cpu_offloading_num_layers", a, _int)
        if n is not None:
            reading.set("cpu_offloading", n > 0, _origin(path, a, "> 0 turns cpu_offloading on"))
    if (a := get("--cpu-offloading")) and "cpu_offloading" not in reading:
        reading.set("cpu_offloading", True, _origin(path, a))

    # Virtual pipeline
    vpp_n = get("--num-layers-per-virtual-pipeline-stage")
    vpp_stages = get("--num-virtual-stages-per-pipeline-rank")
    layout = get("--pipeline-model-parallel-layout")
    if layout:
        raw = value_of(layout)
        if raw is not None:
            reading.set("pipeline_model_parallel_layout", raw, _origin(path, layout))
            pp = reading.get("pipeline_model_parallel_size", 1)
            try:
                stages = len(expand_layout(raw))
            except ConfigError as exc:
                raise ConfigError(f"{path}:{layout.line}: {exc}") from None
            if stages % pp:
                raise ConfigError(
                    f"{path}:{layout.line}: --pipeline-model-parallel-layout has {stages} stages, "
                    f"not a multiple of the pipeline size {pp}"
                )
            vpp = stages // pp
            reading.set(
                "virtual_pipeline_model_parallel_size",
                vpp if vpp > 1 else None,
                _origin(path, layout, f"{stages} stages / PP {pp}"),
            )
    elif vpp_stages:
        n = setv("virtual_pipeline_model_parallel_size", vpp_stages, _int)
        if n == 1:
            reading.set(
                "virtual_pipeline_model_parallel_size", None, _origin(path, vpp_stages, "1 -> None")
            )
    elif vpp_n:
        raw = value_of(vpp_n)
        if raw is not None:
            reading.unused["--num-layers-per-virtual-pipeline-stage"] = int(raw)
            _derive_vpp(reading, path, vpp_n.line)

    if a := get("--data-parallel-sharding-strategy"):
        raw = value_of(a)
        reading.unused["--data-parallel-sharding-strategy"] = raw
    for flag in ("--no-bias-gelu-fusion", "--no-bias-swiglu-fusion"):
        if flag in last:
            reading.unused[flag] = True


def _derive_vpp(reading: Reading, path: str, line: int) -> bool:
    """VPP from --num-layers-per-virtual-pipeline-stage, once num_layers is known."""
    per = reading.unused.get("--num-layers-per-virtual-pipeline-stage")
    layers = reading.get("num_layers")
    if not per or layers is None or "virtual_pipeline_model_parallel_size" in reading:
        return False
    pp = reading.get("pipeline_model_parallel_size", 1)
    layers += bool(reading.get("account_for_embedding_in_pipeline_split"))
    layers += bool(reading.get("account_for_loss_in_pipeline_split"))
    if layers % pp or (layers // pp) % per:
        raise ConfigError(
            f"{path}:{line}: --num-layers-per-virtual-pipeline-stage {per} does not divide "
            f"the {layers // pp if not layers % pp else layers} layers per pipeline stage"
        )
    vpp = layers // pp // per
    how = f"num_layers {layers} / PP {pp} / --num-layers-per-virtual-pipeline-stage {per}" + (
        " (1 -> None)" if vpp == 1 else ""
    )
    if line:
        reading.set(
            "virtual_pipeline_model_parallel_size",
            vpp if vpp > 1 else None,
            Origin(FROM_FILE, f"{path}:{line}", "--num-layers-per-virtual-pipeline-stage", how),
        )
    else:
        reading.derive("virtual_pipeline_model_parallel_size", vpp if vpp > 1 else None, how)
    return True


def _normalization(v: str) -> str:
    table = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
    if v.lower() not in table:
        raise ValueError(v)
    return table[v.lower()]


def _backend(v: str) -> str:
    v = v.split(".")[-1].lower()  # AttnBackend.flash
    if v == "local":
        return "unfused"
    if v not in ("flash", "fused", "unfused", "auto"):
        raise ValueError(v)
    return v


def _backend_note(arg: Arg) -> str:
    if arg.values and arg.values[0].split(".")[-1].lower() == "local":
        return "local: Megatron-Core's own (unfused) attention"
    return ""


def _fp8(v: str) -> str | None:
    v = v.lower()
    if v in ("e4m3", "hybrid"):
        return v
    if v in ("none", "false", ""):
        return None
    raise ValueError(v)


# ----------------------------------------------------------------------- list expressions

_MAX_LIST = 100_000


def moe_layer_freq(text: str) -> int | list[int]:
    """Megatron-LM's `--moe-layer-freq`: an int, or a list expression of int lists with `+`
    and `*` (`"([0]*3+[1]*58)"`), evaluated without `eval`."""
    text = str(text).strip().strip("'\"")
    if "[" not in text:
        try:
            return int(text)
        except ValueError:
            raise ValueError("not an integer or a list expression") from None
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError("not a list expression") from None
    value = _list_expr(tree.body)
    if not isinstance(value, list):
        raise ValueError("not a list")
    if any(x not in (0, 1) for x in value):
        raise ValueError("entries must be 0 or 1")
    return value


def _list_expr(node: ast.AST) -> int | list[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        out = []
        for elt in node.elts:
            v = _list_expr(elt)
            if not isinstance(v, int):
                raise ValueError("only lists of integers")
            out.append(v)
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _list_expr(node.left), _list_expr(node.right)
        if isinstance(node.op, ast.Add):
            if type(left) is not type(right):
                raise ValueError("+ of a list and an integer")
            out = left + right  # type: ignore[operator]
        else:
            if isinstance(left, list) and isinstance(right, list):
                raise ValueError("* of two lists")
            size = (len(left) if isinstance(left, list) else left) * (
                len(right) if isinstance(right, list) else right
            )
            if isinstance(size, int) and size > _MAX_LIST:
                raise ValueError("too long")
            out = left * right  # type: ignore[operator]
        if isinstance(out, list) and len(out) > _MAX_LIST:
            raise ValueError("too long")
        return out
    raise ValueError("only int lists, + and *")


# ----------------------------------------------------------------------- defaults


def apply_defaults(reading: Reading) -> None:
    """Megatron-LM's effective argument defaults and derived values (arguments.py,
    `core_transformer_config_from_args`) for keys nothing set. Shape keys are not filled."""
    d = reading.default
    v = reading.get

    def derive(key: str, value: Any, how: str) -> None:
        reading.derive(key, value, how)

    h, heads = v("hidden_size"), v("num_attention_heads")
    d("normalization", "LayerNorm", DEFAULT_WHERE)
    d("swiglu", False, DEFAULT_WHERE, "gelu MLP")
    d("add_bias_linear", True, DEFAULT_WHERE)
    d(
        "share_embeddings_and_output_weights",
        True,
        DEFAULT_WHERE,
        "tied unless --untie-embeddings-and-output-weights",
    )
    d("position_embedding_type", "learned_absolute", DEFAULT_WHERE)
    d("qk_layernorm", False, DEFAULT_WHERE)
    if v("transformer_impl") == "local":
        # the local layer spec's core attention is Megatron's own DotProductAttention (softmax
        # over [b, a, s, s] scores kept for backward) whatever --attention-backend's auto picks
        # for Transformer Engine (gpt_layer_specs.py get_gpt_layer_local_spec)
        derive(
            "attention_backend",
            "unfused",
            "transformer_impl local: the local spec's DotProductAttention (unfused)",
        )
    d("attention_backend", "auto", DEFAULT_WHERE)
    d("bf16", False, DEFAULT_WHERE, "fp32 parameters unless --bf16 / --fp16")
    d("fp16", False, DEFAULT_WHERE)
    d("fp8", None, DEFAULT_WHERE)
    d(
        "grad_reduce_in_fp32",
        v("bf16") is True,
        DEFAULT_WHERE,
        "accumulate_allreduce_grads_in_fp32: on for --bf16 unless --grad-reduce-in-bf16, "
        "off otherwise",
    )
    d("use_precision_aware_optimizer", False, DEFAULT_WHERE)
    d("store_param_remainders", True, "Megatron-Core's OptimizerConfig default (no flag)")
    for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        d(key, "fp32", DEFAULT_WHERE)
    d("moe_token_dispatcher_type", "allgather", DEFAULT_WHERE)
    d("num_moe_experts", None, DEFAULT_WHERE)
    d("multi_latent_attention", False, DEFAULT_WHERE)
    for key in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    ):
        d(key, 1, DEFAULT_WHERE)
    if "--num-layers-per-virtual-pipeline-stage" in reading.unused:
        _derive_vpp(reading, "", 0)
    d("virtual_pipeline_model_parallel_size", None, DEFAULT_WHERE)
    d("sequence_parallel", False, DEFAULT_WHERE)
    d("use_distributed_optimizer", False, DEFAULT_WHERE)
    d("recompute_granularity", None, DEFAULT_WHERE)
    d("cpu_offloading", False, DEFAULT_WHERE, "on when --cpu-offloading-num-layers > 0")
    d("fine_grained_activation_offloading", False, DEFAULT_WHERE)
    _zero_stage(reading)

    # Derived shapes (arguments.py validate_args)
    if h is not None and heads:
        derive("kv_channels", h // heads, "hidden_size / num_attention_heads (Megatron-LM)")
    if h is not None and "ffn_hidden_size" not in reading:
        if v("swiglu"):
            derive(
                "ffn_hidden_size",
                int((4 * h * 2 / 3) / 64) * 64,
                "int(4h * 2/3 / 64) * 64 with --swiglu (Megatron-LM)",
            )
        else:
            derive("ffn_hidden_size", 4 * h, "4 * hidden_size (Megatron-LM)")
    if heads and "num_query_groups" not in reading:
        derive(
            "num_query_groups",
            heads,
            "MHA: no --group-query-attention, so num_query_groups = num_attention_heads",
        )

    # Sequence parallelism is turned off at TP=1 (arguments.py), with a warning.
    if v("sequence_parallel") and v("tensor_model_parallel_size", 1) == 1:
        written = reading.origins["sequence_parallel"]
        reading.set(
            "sequence_parallel",
            False,
            # (the flag the script passes kept: a plan at TP > 1 need not add it again)
            Origin("derived", "Megatron-LM turns sequence parallelism off at TP=1", written.key),
        )
        reading.warnings.append(
            "sequence_parallel is turned off: Megatron-LM disables it when "
            "tensor_model_parallel_size is 1"
        )

    # Data parallelism: WORLD_SIZE // (TP * PP * CP)
    world = v("world_size")
    if world and "data_parallel_size" not in reading:
        tp = v("tensor_model_parallel_size", 1)
        pp = v("pipeline_model_parallel_size", 1)
        cp = v("context_parallel_size", 1)
        model = tp * pp * cp
        if world % model:
            reading.warnings.append(
                f"world_size {world} is not divisible by TP*PP*CP = {tp}*{pp}*{cp} = {model}: "
                "Megatron-LM would refuse to start; data_parallel_size is not derived"
            )
        else:
            derive("data_parallel_size", world // model, f"world_size {world} / (TP*PP*CP {model})")

    # Fusions Megatron-LM turns on (differ from Megatron-Core's dataclass defaults)
    d("masked_softmax_fusion", True, DEFAULT_WHERE, "--no-masked-softmax-fusion turns it off")
    if v("swiglu"):
        fused = "--no-bias-swiglu-fusion" not in reading.unused
        derive("bias_activation_fusion", fused, "bias_swiglu_fusion with --swiglu (Megatron-LM)")
    else:
        fused = "--no-bias-gelu-fusion" not in reading.unused and v("add_bias_linear", True)
        derive(
            "bias_activation_fusion",
            bool(fused),
            "bias_gelu_fusion, off with --disable-bias-linear (Megatron-LM)",
        )
    if v("position_embedding_type") == "rope":
        d("apply_rope_fusion", True, DEFAULT_WHERE, "on with rope unless --no-rope-fusion")
    elif v("position_embedding_type") is not None:
        derive("apply_rope_fusion", False, "no rope: no rope fusion (Megatron-LM)")
    d("attention_softmax_in_fp32", False, DEFAULT_WHERE)
    d("make_vocab_size_divisible_by", 128, DEFAULT_WHERE)
    # the default since core_r0.6.0; before it `local` (a 2023 checkout keeps the s x s
    # attention scores where this estimate has a fused kernel): said in the note, and aloud
    # where the attention path is not set either (a skill trial's 2023 GPT-2 script was
    # planned at 18.6 GiB with fused attention; it ran local and needed 32.7)
    unset = all(
        reading.origins.get(key) is None or reading.origins[key].kind == FROM_DEFAULT
        for key in ("transformer_impl", "attention_backend")
    )
    if unset and v("seq_length") and v("num_attention_heads"):
        reading.warnings.append(
            "--transformer-impl not set: the estimate takes Megatron-LM's default since "
            "core_r0.6.0, transformer_engine (fused attention); a checkout before it runs "
            "local, unfused attention, which keeps the s x s scores of every layer (estimate "
            "--attention unfused sizes it): --transformer-impl, or the run's log, says which"
        )
    d(
        "transformer_impl",
        "transformer_engine",
        DEFAULT_WHERE,
        "the default since Megatron-LM core_r0.6.0; an older checkout's is local (unfused "
        "attention): its log's argument dump or --transformer-impl says which",
    )

    # MoE
    if v("num_moe_experts"):
        d("moe_router_topk", 2, DEFAULT_WHERE)
        d("moe_layer_freq", 1, DEFAULT_WHERE)
        d("moe_shared_expert_intermediate_size", None, DEFAULT_WHERE)
        d("moe_grouped_gemm", False, DEFAULT_WHERE)
        if v("ffn_hidden_size") is not None:
            derive("moe_ffn_hidden_size", v("ffn_hidden_size"), "ffn_hidden_size (Megatron-LM)")
    # MLA (Megatron-LM's argument defaults, not MLATransformerConfig's)
    if v("multi_latent_attention"):
        d("q_lora_rank", None, DEFAULT_WHERE)
        d("kv_lora_rank", 32, DEFAULT_WHERE)
        d("qk_head_dim", 128, DEFAULT_WHERE)
        d("qk_pos_emb_head_dim", 64, DEFAULT_WHERE)
        d("v_head_dim", 128, DEFAULT_WHERE)
    # Recompute
    if v("recompute_granularity"):
        d("recompute_method", None, DEFAULT_WHERE)
        if v("recompute_granularity") == "full":
            # arguments.py had `--recompute-num-layers` default=1 until the flags were generated
            # from TransformerConfig (None, which Megatron-Core then rejects with full)
            d("recompute_num_layers", 1, "Megatron-LM's default before core_v0.16", "default=1")
        d("recompute_num_layers", None, DEFAULT_WHERE)
        d("recompute_modules", ["core_attn"], MCORE_WHERE, "None -> ['core_attn']")
    assert all(isinstance(k, str) for k in (*MOE_KEYS, *MLA_KEYS, *RECOMPUTE_KEYS))


def _zero_stage(reading: Reading) -> None:
    """Megatron-LM has no ZeRO stage: optimizer sharding is --use-distributed-optimizer; with
    Megatron-FSDP the sharding strategy (default optim_grads_params) gives the stage."""
    if "zero_stage" in reading:
        return
    if reading.get("use_megatron_fsdp"):
        strategy = reading.unused.get("--data-parallel-sharding-strategy") or "optim_grads_params"
        stage = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(
            str(strategy)
        )
        if stage is not None:
            reading.derive(
                "zero_stage", stage, f"Megatron-FSDP --data-parallel-sharding-strategy {strategy}"
            )
            # used, so not left among the unused flags (it is, without Megatron-FSDP)
            reading.unused.pop("--data-parallel-sharding-strategy", None)
            return
    reading.default(
        "zero_stage",
        0,
        DEFAULT_WHERE,
        "no ZeRO stage in Megatron-LM; optimizer sharding is use_distributed_optimizer",
    )
