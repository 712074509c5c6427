"""What inputs say: values under Megatron-Core's field names, each with where it came from.

A format reader (one module per artefact format) turns one file into a `Reading`: only what
the file itself says, each value with an `Origin` naming the file, line and key as written.
`resolve.py` then merges several readings, adds the model's shape from the registry, the
framework's own defaults and the derived values (each with its own origin), and says aloud
what is still assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import CONFIG_KEYS

# Values a reading may carry beyond the Config's fields: how the job is launched and sharded.
# (optimizer_offload / param_offload are Config fields now: ParallelConfig.)
EXTRA_KEYS = (
    "world_size",  # GPUs in the job (nodes x GPUs per node): DP is derived from it
    # Hugging Face Trainer's gradient_accumulation_steps: with the micro-batch and DP it gives
    # the global batch (the Trainer does not name the global batch itself)
    "gradient_accumulation_steps",
    "use_megatron_fsdp",
    "mtp_num_layers",
    "megatron_core_version",
    # an inference engine sharing the trainer's GPUs (NeMo-RL's colocated vLLM generation):
    # whether it is colocated and the GPU memory share it sizes its KV cache from
    "inference_colocated",
    "inference_gpu_memory_utilization",
    # the per-rank batch before a pipeline splits it into micro-batches (torchtitan's
    # [training] local_batch_size): with the data-parallel size it gives the global batch
    "local_batch_size",
    # TP communication overlapped with GEMMs (Megatron-LM --tp-comm-overlap): the step-time
    # model's exposed TP collectives (plan/step_time.py)
    "tp_comm_overlap",
)
KNOWN_KEYS = frozenset(CONFIG_KEYS) | frozenset(EXTRA_KEYS)

# Origin kinds, from most to least specific.
FROM_FILE = "file"  # the input says it (file:line, key as written)
FROM_MODEL = "model"  # the model's public config (registry entry or a Hugging Face config.json)
FROM_DEFAULT = "default"  # the framework's documented default for a key the input leaves out
FROM_DERIVED = "derived"  # computed from other values by the framework's rule (DP = world / ...)
FROM_ARGUMENT = "argument"  # a command-line override of recompute-kit itself (--tp 4)
FROM_ASSUMED = "assumed"  # nothing says it: recompute-kit assumed it, and says which key sets it
ORIGIN_KINDS = (FROM_FILE, FROM_MODEL, FROM_DEFAULT, FROM_DERIVED, FROM_ARGUMENT, FROM_ASSUMED)


@dataclass(frozen=True)
class Origin:
    """Where one value came from. `where` is a place (`train.sh:12`, `Megatron-LM's argument
    default`, `meta-llama/Llama-3.1-8B config.json`); `key` the key or flag as written there
    (`--tensor-model-parallel-size`, `model.encoder_seq_length`) or, for an assumption, the key
    that would set it."""

    kind: str
    where: str = ""
    key: str = ""
    note: str = ""  # why, when the value is not the one written (`fast-swiglu: a GLU with silu`)

    def __post_init__(self) -> None:
        if self.kind not in ORIGIN_KINDS:
            raise ValueError(f"unknown origin kind {self.kind!r}")

    def to_json(self) -> dict[str, str]:
        out = {"from": self.kind}
        for name in ("where", "key", "note"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        return out

    def describe(self) -> str:
        """`train.sh:12 --tensor-model-parallel-size`, `default: Megatron-LM's argument default`."""
        place = " ".join(p for p in (self.where, self.key) if p)
        text = place if self.kind == FROM_FILE else f"{self.kind}: {place}" if place else self.kind
        return f"{text} ({self.note})" if self.note else text


@dataclass
class Reading:
    """Values under Megatron-Core field names (`KNOWN_KEYS`), each with its `Origin`.

    `framework` names whose semantics and defaults apply (`megatron-lm`, `megatron-bridge`,
    `nemo1`, `nemo-rl`, `torchtitan`, `hf-trainer`, `megatron-core`, `hf-config`);
    `model_name` a model the input names for its shape (a Hugging Face id, a Bridge provider,
    a torchtitan `name/flavor`), looked up in the registry by `resolve`."""

    framework: str | None = None
    format: str = ""  # the format the file was read as, in words ("Megatron-LM launch script")
    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, Origin] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    model_name: str | None = None
    model_name_origin: Origin | None = None
    # Keys the input sets that recompute-kit does not use, as written (reported, not dropped).
    unused: dict[str, Any] = field(default_factory=dict)
    # A Hugging Face id whose tokenizer the run uses (`--tokenizer-model`, NeMo's
    # `tokenizer.type`): its model's config gives the vocabulary when nothing else does.
    tokenizer: str | None = None
    tokenizer_origin: Origin | None = None
    # other files this input read itself (the DeepSpeed JSON a Trainer command names): given
    # as inputs too, they are not read again (resolve._drop_inputs_read_within)
    read_within: list[str] = field(default_factory=list)
    # fields the input writes where they cannot be read (field -> where and why: a branch it
    # does not decide, a value it does not resolve): a default in their place is an assumption
    unread_settings: dict[str, str] = field(default_factory=dict)
    # layers of the model the estimator does not model (Mamba, linear attention), in words
    # with where they are read: no estimate is made of such a model (resolve)
    not_modelled: list[str] = field(default_factory=list)

    def set(self, key: str, value: Any, origin: Origin, overwrite: bool = True) -> None:
        """Record `key = value` from `origin`. overwrite=False keeps a value already set."""
        if key not in KNOWN_KEYS:
            raise KeyError(f"{key!r} is not a Megatron-Core field recompute-kit knows")
        if not overwrite and key in self.values:
            return
        self.values[key] = value
        self.origins[key] = origin

    def default(self, key: str, value: Any, where: str, note: str = "") -> None:
        """A framework default for a key nothing set."""
        self.set(key, value, Origin(FROM_DEFAULT, where, note=note), overwrite=False)

    def derive(self, key: str, value: Any, how: str) -> None:
        """A value the framework computes from others, for a key nothing set."""
        self.set(key, value, Origin(FROM_DERIVED, how), overwrite=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def to_json(self) -> dict[str, Any]:
        return {
            "framework": self.framework,
            "format": self.format,
            "model_name": self.model_name,
            "config": _jsonable(self.values),
            "sources": {k: o.to_json() for k, o in self.origins.items()},
            "warnings": list(self.warnings),
            "unused": _jsonable(self.unused),
        }


def _jsonable(value: Any) -> Any:
    """JSON data: a value a reader could not resolve (a variable, an expression) as its text."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


# The values a per-rank memory estimate depends on. After resolving, each has an origin:
# read, the model's config, the framework's default, derived, or an assumption said aloud.
SHAPE_KEYS = ("num_layers", "hidden_size", "num_attention_heads")
# What a model's config.json decides (not the training run): never assumed without a model.
ARCHITECTURE_KEYS = frozenset(
    {
        "num_query_groups",
        "kv_channels",
        "ffn_hidden_size",
        "vocab_size",
        "normalization",
        "swiglu",
        "add_bias_linear",
        "share_embeddings_and_output_weights",
        "position_embedding_type",
        "qk_layernorm",
        "num_moe_experts",
        "multi_latent_attention",
    }
)
# The model-parallel degrees (1 where a framework's file leaves one out), in Megatron's order.
MODEL_PARALLEL_SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
# What a reader says of a model name that is no Hugging Face id (a path, a placeholder); the
# resolver says where the shape came from instead when --model gives it
SHAPE_NOT_FROM_NAME = "the model's shape is not known from it"

MEMORY_KEYS = (
    *SHAPE_KEYS,
    "num_query_groups",
    "kv_channels",
    "ffn_hidden_size",
    "vocab_size",
    "seq_length",
    "micro_batch_size",
    "normalization",
    "swiglu",
    "add_bias_linear",
    "share_embeddings_and_output_weights",
    "position_embedding_type",
    "qk_layernorm",
    "attention_backend",
    "bf16",
    "fp16",
    "fp8",
    "num_moe_experts",
    "multi_latent_attention",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "sequence_parallel",
    "data_parallel_size",
    "use_distributed_optimizer",
    "zero_stage",
    "recompute_granularity",
    "cpu_offloading",
    "fine_grained_activation_offloading",
)
# Needed only when the model has experts / MLA / recompute (checked when those are on).
MOE_KEYS = (
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_layer_freq",
    "moe_shared_expert_intermediate_size",
    "moe_grouped_gemm",
)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
RECOMPUTE_KEYS = ("recompute_method", "recompute_num_layers", "recompute_modules")


# recompute-kit's command-line overrides (`--tp 4`: argparse dest -> Megatron key); the
# reader names a value they set by its flag.
OVERRIDE_FLAGS = {
    "seq_length": "seq_length",
    "micro_batch_size": "micro_batch_size",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "dp": "data_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "first_stage_layers": "num_layers_in_first_pipeline_stage",
    "last_stage_layers": "num_layers_in_last_pipeline_stage",
    "sp": "sequence_parallel",
    "distributed_optimizer": "use_distributed_optimizer",
    "account_for_embedding": "account_for_embedding_in_pipeline_split",
    "account_for_loss": "account_for_loss_in_pipeline_split",
    "attention": "attention_backend",
    "moe_imbalance": "moe_routing_imbalance",
    "moe_grouped_gemm": "moe_grouped_gemm",
}
