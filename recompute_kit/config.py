"""Configuration: model shape, parallel sizes and recompute settings, with Megatron-Core's names.

A `Config` bundles three dataclasses:

* `ModelConfig`     - the architecture and the training shape (seq_length, micro_batch_size, dtype);
* `ParallelConfig`  - TP/PP/VPP/CP/EP/DP sizes and sequence parallelism;
* `RecomputeConfig` - recompute_granularity/method/num_layers/modules and activation offloading.

`Config.validate()` applies Megatron-Core's `TransformerConfig.__post_init__` rules for these
fields, in Megatron's order and with Megatron's own messages (typos included), as `ValueError`.
`strict=True` adds the rules that only Megatron-LM's command line enforces.

Recompute spec strings (`none`, `selective`, `selective:mlp,layernorm`, `full:uniform:2`, ...) are
the short form used by the CLI and the notebooks; `parse_spec` and `format_spec` convert both ways.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# The modules Megatron-Core accepts in recompute_modules (v0.14 to v0.19); the first seven are
# the ones recompute-kit's layers implement.
RECOMPUTE_MODULES = (
    "core_attn",
    "mlp",
    "layernorm",
    "moe",
    "moe_act",
    "shared_experts",
    "mla_up_proj",
)
# Normal checkpoint (saves the inputs) vs output-discarding checkpoint (frees the output too).
NORMAL_CHECKPOINT_MODULES = ("core_attn", "mlp", "moe", "shared_experts")
OUTPUT_DISCARDING_MODULES = ("layernorm", "moe_act", "mla_up_proj")

OFFLOAD_MODULES = (
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "expert_fc1",
    "moe_act",
)
ATTENTION_BACKENDS = ("unfused", "flash", "fused", "auto")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")


class ConfigError(ValueError):
    """A configuration or spec that recompute-kit (or Megatron) rejects. The message is one line."""


@dataclass
class ModelConfig:
    """Architecture and training shape (Megatron-Core field names)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int | None = None  # None: MHA (= num_attention_heads)
    kv_channels: int | None = None  # per-head dim; None: hidden_size // num_attention_heads
    ffn_hidden_size: int | None = None  # None: 4 * hidden_size
    seq_length: int = 32
    micro_batch_size: int = 2
    vocab_size: int = 128
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    normalization: str = "LayerNorm"
    swiglu: bool = False
    add_bias_linear: bool = True  # Megatron's default: biases on every linear layer
    # Megatron-Core's TransformerConfig defaults (Megatron-LM's command line turns both
    # fusions on): they decide what the activation and the unfused softmax keep.
    bias_activation_fusion: bool = False
    masked_softmax_fusion: bool = False
    attention_softmax_in_fp32: bool = True
    # "transformer_engine" fuses the dense layers' norms into the next linear (TE's
    # LayerNormLinear); "local" runs torch norms (RMSNorm keeps its normalized output too).
    transformer_impl: str = "transformer_engine"
    position_embedding_type: str = "learned_absolute"  # Megatron's default; "rope", "none"
    apply_rope_fusion: bool = False  # TransformerConfig's default (Megatron-LM's is on)
    share_embeddings_and_output_weights: bool = False
    qk_layernorm: bool = False
    make_vocab_size_divisible_by: int = 128  # Megatron-LM pads the vocabulary to this x TP
    attention_backend: str = "unfused"
    bf16: bool = False
    fp16: bool = False
    # Mixture of experts
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # None: ffn_hidden_size
    moe_layer_freq: int | list[int] = 1  # N: every N-th layer is MoE; list: 1 = MoE, 0 = dense
    moe_router_score_function: str = "softmax"  # "softmax" | "sigmoid"
    moe_aux_loss_coeff: float = 0.0  # load-balancing loss weight
    moe_shared_expert_intermediate_size: int | None = None
    moe_grouped_gemm: bool = False
    moe_shared_expert_overlap: bool = False
    # Multi-latent attention
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # Low precision and CUDA graphs (validated against recompute; not executed by the layers)
    fp8: str | None = None
    fp8_recipe: str = "tensorwise"
    cuda_graph_impl: str = "none"
    cuda_graph_scope: list[str] = field(default_factory=list)

    @property
    def kv_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def moe_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size

    def is_moe_layer(self, index: int) -> bool:
        """Megatron's moe_layer_freq: an int N puts MoE on layers 0, N, 2N, ...; a list gives
        one 0/1 flag per layer."""
        if not self.num_moe_experts:
            return False
        if isinstance(self.moe_layer_freq, list):
            return bool(self.moe_layer_freq[index])
        return index % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))


@dataclass
class ParallelConfig:
    """Parallel sizes. The reference layers run on one device; these feed the per-rank model."""

    data_parallel_size: int = 1
    use_distributed_optimizer: bool = False
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: = tensor_model_parallel_size
    sequence_parallel: bool = False
    # Uneven pipeline stages (Megatron-LM: --decoder-first/last-pipeline-num-layers), or the
    # embedding / loss counted as a layer of the first / last stage.
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    @property
    def etp(self) -> int:
        """Expert tensor parallelism (Megatron's default: the tensor-parallel size)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size


@dataclass
class RecomputeConfig:
    """Activation recomputation and offloading settings (Megatron-Core semantics)."""

    recompute_granularity: str | None = None  # None | "selective" | "full"
    recompute_method: str | None = None  # None | "uniform" | "block"
    recompute_num_layers: int | None = None
    recompute_modules: list[str] | None = None  # None -> ["core_attn"]; [] is the no-op control
    distribute_saved_activations: bool = False
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    fine_grained_activation_offloading: bool = False
    offload_modules: list[str] = field(default_factory=list)
    # Deprecated Megatron flag: validation turns it into selective recompute of "moe".
    moe_layer_recompute: bool = False

    @property
    def modules(self) -> list[str]:
        """The modules recomputed by selective granularity (Megatron's default when None)."""
        return ["core_attn"] if self.recompute_modules is None else list(self.recompute_modules)

    def selects(self, module: str) -> bool:
        """Whether selective recompute applies to `module` (only with granularity 'selective')."""
        return self.recompute_granularity == "selective" and module in self.modules

    @property
    def spec(self) -> str:
        return format_spec(self)


@dataclass
class Config:
    """Everything recompute-kit needs to know about one training setup."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    # What was assumed because a source (a config file) left it out; said in every output.
    assumptions: list[str] = field(default_factory=list, compare=False)

    def replace(self, **flat: Any) -> Config:
        """A copy with some flat Megatron keys changed (`replace(seq_length=4096)`)."""
        new = Config(
            dataclasses.replace(self.model),
            dataclasses.replace(self.parallel),
            dataclasses.replace(self.recompute),
            list(self.assumptions),
        )
        for key, value in flat.items():
            section = _SECTION_OF_KEY.get(key)
            if section is None:
                raise ConfigError(f"unknown config key {key!r}{_did_you_mean(key)}")
            setattr(getattr(new, section), key, value)
        return new

    def with_recompute(self, recompute: RecomputeConfig | str) -> Config:
        """A copy whose recompute settings are replaced (a spec string or a RecomputeConfig)."""
        rc = parse_spec(recompute) if isinstance(recompute, str) else recompute
        # Offloading settings belong to the setup, not to the spec: keep them.
        rc = dataclasses.replace(
            rc,
            distribute_saved_activations=self.recompute.distribute_saved_activations,
            cpu_offloading=self.recompute.cpu_offloading,
            cpu_offloading_num_layers=self.recompute.cpu_offloading_num_layers,
            fine_grained_activation_offloading=self.recompute.fine_grained_activation_offloading,
            offload_modules=list(self.recompute.offload_modules),
        )
        return Config(self.model, self.parallel, rc, list(self.assumptions))

    def to_flat(self) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        for section in (self.model, self.parallel, self.recompute):
            flat.update(dataclasses.asdict(section))
        return flat

    def validate(self, strict: bool = False) -> list[str]:
        """Raise `ConfigError` on the first rule broken; return warnings. Normalises in place
        (`recompute_modules=None` becomes `["core_attn"]`, as in Megatron)."""
        return validate(self, strict=strict)


_SECTION_OF_KEY: dict[str, str] = {
    f.name: section
    for section, cls in (
        ("model", ModelConfig),
        ("parallel", ParallelConfig),
        ("recompute", RecomputeConfig),
    )
    for f in fields(cls)
}
CONFIG_KEYS = tuple(_SECTION_OF_KEY)


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key, CONFIG_KEYS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# --------------------------------------------------------------------------------------------
# Validation: Megatron-Core TransformerConfig rules, Megatron's messages verbatim.
# Numbers refer to the rule list in shared/reference/megatron-recompute.md section 1.2.
# Checked against Megatron-Core 0.16.1 (tests/test_validation_parity.py); rules 14 (gdn_norm_out)
# and 22 (offloading inside a recomputed MoE) follow the newer v0.19.
# --------------------------------------------------------------------------------------------


def validate(cfg: Config, strict: bool = False) -> list[str]:
    m, p, r = cfg.model, cfg.parallel, cfg.recompute
    warnings: list[str] = []
    _check_types(cfg)
    _check_parallel_sizes(m, p)

    # Rules 1-3: layer-level CPU offloading.
    if r.cpu_offloading and (
        r.cpu_offloading_num_layers < 0 or r.cpu_offloading_num_layers >= m.num_layers
    ):
        raise ConfigError(f"CPU offloading can be done only for layers less than {m.num_layers}")
    if r.cpu_offloading and p.pipeline_model_parallel_size > 1:
        raise ConfigError(
            "Currently there is no support for Pipeline parallelism with CPU offloading"
        )
    if r.cpu_offloading and r.recompute_granularity is not None:
        raise ConfigError("CPU offloading does not work when activation recomputation is enabled")

    # Rules 4-9: granularity, method, num_layers.
    g = r.recompute_granularity
    if g is not None:
        if g not in ("full", "selective"):
            raise ConfigError(
                f'When using recompute_granuarlity: {g} must be "full"or "selective".'
            )
        if r.recompute_method is not None:
            if r.recompute_method not in ("block", "uniform"):
                raise ConfigError(
                    f'recompute_method: {r.recompute_method} must be "block" or "uniform".'
                )
        elif g != "selective":
            raise ConfigError(
                f'Using recompute_granularity: {g} so recompute_method must be "block" or "uniform"'
            )
        if g != "selective" and r.recompute_num_layers is None:
            raise ConfigError(
                f"When using recompute_granularity: {g} "
                "recompute_num_layers must be between "
                "1 and num_layers_per_pipeline_rank: "
                f"{m.num_layers // p.pipeline_model_parallel_size}"
            )
        if g == "selective" and r.recompute_num_layers is not None:
            raise ConfigError(
                f"When using recompute_granularity: {g} recompute_num_layers must be None."
            )
        if r.distribute_saved_activations and p.sequence_parallel:
            raise ConfigError(
                f"distribute_saved_activations: {r.distribute_saved_activations} must be "
                f"false when sequence parallel is enabled: {p.sequence_parallel}"
            )

    # Rule 10: the default module list.
    if r.recompute_modules is None:
        r.recompute_modules = ["core_attn"]

    # Rules 11-17: selective modules.
    if g == "selective":
        allowed = {*RECOMPUTE_MODULES, "gdn_norm_out"}
        invalid = set(r.recompute_modules) - allowed
        if r.recompute_modules and invalid:
            raise ConfigError(
                f"Invalid choices for recompute_modules: {invalid}. Allowed modules are: {allowed}"
            )
        mods = r.recompute_modules
        if "moe_act" in mods and not m.moe_grouped_gemm:
            raise ConfigError(
                "moe_act in recompute_modules is only supported with moe_grouped_gemm."
            )
        if "mla_up_proj" in mods and not m.multi_latent_attention:
            raise ConfigError(
                "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
            )
        if "gdn_norm_out" in mods:  # recompute-kit has no gated-delta-net attention
            raise ConfigError(
                "gdn_norm_out in recompute_modules is only supported with "
                "experimental_attention_variant='gdn' or 'gdn2'."
            )
        if "core_attn" in mods:
            warnings.append(
                "If you are using transformer_engine as the transformer implementation, "
                "the core_attn is from transformer_engine and may be the fused version. "
                "For fused attention, you have no need to set 'core_attn' to recompute. "
                "Please check that the core_attn recompute is really needed."
            )
        if (
            "shared_experts" in mods
            and m.moe_shared_expert_intermediate_size is not None
            and m.moe_shared_expert_overlap
        ):
            raise ConfigError(
                "shared_experts recompute cannot work with --moe-shared-expert-overlap."
            )
        if m.fp8 and ("moe_act" in mods or "layernorm" in mods) and m.fp8_recipe == "delayed":
            # Megatron also requires transformer-engine>=2.6.0dev0 here; the kit has no TE.
            raise ConfigError(
                "Delayed scaling does not support moe_act and layernorm recompute for fp8."
            )

    # Rule 18: the deprecated MoE flag. It comes after the module checks, so a name it adds is
    # never checked (Megatron's order).
    if r.moe_layer_recompute:
        warnings.append(
            "--moe-layer-recompute is deprecated. "
            "Use --recompute-granularity selective --recompute-modules moe_layer instead."
        )
        if g == "full":
            raise ConfigError("Do not set --moe-layer-recompute with full recompute granularity. ")
        r.recompute_granularity = g = "selective"
        if "moe" not in r.recompute_modules:
            r.recompute_modules.append("moe")

    # Rules 20-22: fine-grained activation offloading.
    if r.fine_grained_activation_offloading:
        if r.cpu_offloading:
            raise ConfigError(
                "fine_grained_activation_offloading cannot be enabled with cpu_offloading."
            )
        if not r.offload_modules:
            # Megatron: a bare `assert len(self.offload_modules) > 0`.
            raise ConfigError(
                "fine_grained_activation_offloading needs a non-empty offload_modules, "
                f"choose from {list(OFFLOAD_MODULES)}"
            )
        allowed_offload = set(OFFLOAD_MODULES)
        invalid = set(r.offload_modules) - allowed_offload
        if invalid:
            raise ConfigError(
                f"Invalid choices for offload_modules: {invalid}. "
                f"Allowed modules are: {allowed_offload}"
            )
        if "attn_proj" in r.offload_modules and "core_attn" not in r.offload_modules:
            raise ConfigError(
                "attn_proj cannot be set to offload_modules alone without core_attn because "
                "the input of attn_proj is the output of core_attn, which is needed in "
                "core_attn.backward()."
            )
        offload_inside_moe = [x for x in r.offload_modules if x in ("moe_act", "expert_fc1")]
        if g == "selective" and "moe" in r.recompute_modules and offload_inside_moe:
            raise ConfigError(
                f"Cannot offload {offload_inside_moe} while recomputing the entire MoE layer. "
                "'moe' in recompute_modules wraps the full MoE forward in a checkpoint, so "
                "offloading activations inside it is redundant and will cause errors. Either "
                "remove 'moe' from --recompute-modules or remove "
                f"{offload_inside_moe} from --offload-modules."
            )

    _check_cuda_graphs(m, r)

    # Rules 26-28: only Megatron-LM's argument parser enforces these.
    if strict:
        if r.distribute_saved_activations:
            if p.tensor_model_parallel_size <= 1:
                raise ConfigError(
                    "can distribute recomputed activations only across tensor model parallel groups"
                )
            if g != "full":
                raise ConfigError(
                    "distributed recompute activations is only application to full recompute "
                    "granularity"
                )
            if r.recompute_method is None:
                raise ConfigError(
                    "for distributed recompute activations to work you need to use a recompute "
                    "method "
                )
        if g == "selective" and r.recompute_method is not None:
            raise ConfigError(
                "recompute method is not yet supported for selective recomputing granularity"
            )

    if m.num_moe_experts is not None and m.add_bias_linear and cfg.parallel.etp != 1:
        raise ConfigError("Bias in Moe is only supported when ETP==1")

    # Not a Megatron rule, but the layers must be able to run the config.
    _check_shapes(m)
    if g == "full" and r.recompute_num_layers is not None and r.recompute_num_layers < 1:
        raise ConfigError(
            f"recompute_num_layers must be at least 1 for full recompute, got "
            f"{r.recompute_num_layers}"
        )
    return warnings


def _check_types(cfg: Config) -> None:
    """Reject values of the wrong type with a one-line message naming the key."""
    for section in (cfg.model, cfg.parallel, cfg.recompute):
        for f in fields(section):
            value = getattr(section, f.name)
            expected = f.type if isinstance(f.type, str) else str(f.type)
            if expected == "int | list[int]":  # moe_layer_freq: checked with the MoE shapes
                continue
            if value is None:
                if "None" not in expected:
                    raise ConfigError(f"{f.name} must not be null")
                continue
            if expected.startswith("int") and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise ConfigError(f"{f.name} must be an integer, got {value!r}")
            if expected.startswith("float") and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise ConfigError(f"{f.name} must be a number, got {value!r}")
            if expected == "bool" and not isinstance(value, bool):
                raise ConfigError(f"{f.name} must be true or false, got {value!r}")
            if expected.startswith("str") and not isinstance(value, str):
                raise ConfigError(f"{f.name} must be a string, got {value!r}")
            if expected.startswith("list") and not isinstance(value, list):
                raise ConfigError(f"{f.name} must be a list, got {value!r}")


def _check_parallel_sizes(m: ModelConfig, p: ParallelConfig) -> None:
    """The rules Megatron checks before any recompute rule (ModelParallelConfig first)."""
    if p.sequence_parallel and p.tensor_model_parallel_size <= 1:
        raise ConfigError("Cannot use sequence parallelism without tensor parallelism")
    if m.fp16 and m.bf16:
        raise ConfigError(f"Only one of self.fp16: {m.fp16} and self.bf16 {m.bf16} should be True.")
    tp = p.tensor_model_parallel_size
    if tp >= 1 and m.num_attention_heads % tp:
        raise ConfigError(
            f"num_attention_heads ({m.num_attention_heads}) must be a multiple of "
            f"tensor_model_parallel_size ({tp})."
        )
    if tp >= 1 and m.kv_groups >= 1 and m.kv_groups % tp and tp % m.kv_groups:
        raise ConfigError(
            f"num_query_groups ({m.kv_groups}) must be a multiple or divisor of "
            f"tensor_model_parallel_size ({tp})."
        )
    if p.expert_model_parallel_size > 1 and m.num_moe_experts is None:
        raise ConfigError("num_moe_experts must be non None to use expert-parallel.")


CUDA_GRAPH_SCOPES = (
    "full_iteration",
    "attn",
    "mlp",
    "moe",
    "moe_router",
    "moe_preprocess",
    "mamba",
)


def _check_cuda_graphs(m: ModelConfig, r: RecomputeConfig) -> None:
    """Megatron-Core 0.16.1's cuda_graph_impl/cuda_graph_scope rules, recompute and offloading
    included. The kit has no capacity factor or input jitter: Megatron's defaults (None) apply."""
    scope = list(m.cuda_graph_scope)
    if "full" in scope:  # the deprecated spelling of "the whole layer" (an empty list)
        if scope != ["full"]:
            raise ConfigError("full scope cannot be used with other scopes.")
        scope = []
    unknown = [s for s in scope if s not in CUDA_GRAPH_SCOPES]
    if unknown:
        # Megatron: a bare KeyError from CudaGraphScope[name].
        raise ConfigError(
            f"unknown cuda_graph_scope {unknown[0]!r}; choose from {list(CUDA_GRAPH_SCOPES)}"
        )
    impl = m.cuda_graph_impl
    if impl == "none":
        return
    if impl not in ("transformer_engine", "local"):
        raise ConfigError(f"Invalid cuda graph implementation: {impl}")
    if r.cpu_offloading:
        raise ConfigError("CUDA graphs not supported with CPU offloading.")
    if impl == "local" and ("moe_router" in scope or "moe_preprocess" in scope):
        scope += [s for s in ("moe_router", "moe_preprocess") if s not in scope]
    if impl == "transformer_engine" and "full_iteration" in scope:
        raise ConfigError(
            "To use full iteration cuda graph, please use "
            "cuda_graph_impl=local instead of cuda_graph_impl=transformer_engine."
        )
    if "moe" in scope and "moe_router" in scope:
        raise ConfigError("cuda_graph_scope must not contain both moe and moe_router.")
    if "moe_preprocess" in scope and "moe_router" not in scope:
        raise ConfigError("moe_preprocess cuda graph is only supported with moe_router cuda graph.")
    if m.num_moe_experts is None or m.num_moe_experts <= 1:
        if "moe" in scope or "moe_router" in scope:
            raise ConfigError("moe cuda graph is only supported for MoE.")
    else:
        freq = m.moe_layer_freq
        if (freq == 1 or (isinstance(freq, list) and 0 not in freq)) and "mlp" in scope:
            raise ConfigError(
                "mlp cuda graph is only supported for dense layers, but not found in the model."
            )
        if "moe" in scope:
            raise ConfigError("moe cuda graph is only supported with drop-padding MoE.")
    g, mods = r.recompute_granularity, r.recompute_modules or []
    if not g:
        return
    if g != "selective":
        if scope != ["full_iteration"]:
            raise ConfigError("full recompute is only supported with full iteration CUDA graph.")
        return
    # A recompute region must lie wholly inside or outside a graph, and a graphed recompute
    # cannot draw random numbers (dropout).
    if impl == "transformer_engine" and "moe" in mods and "moe_router" in scope:
        raise ConfigError("moe recompute is not supported with moe_router CUDA graph with: ")
    whole = not scope or "full_iteration" in scope
    if m.attention_dropout != 0.0 and "core_attn" in mods and (whole or "attn" in scope):
        raise ConfigError(
            "attention dropout is not supported with graphed attention recomputation."
        )
    if m.hidden_dropout != 0.0 and (
        ("mlp" in mods and (whole or "mlp" in scope))
        or ("moe" in mods and (whole or "moe" in scope))
    ):
        raise ConfigError("hidden dropout is not supported with graphed MLP/MoE recomputation.")


def _check_shapes(m: ModelConfig) -> None:
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "seq_length",
        "micro_batch_size",
        "vocab_size",
    ):
        if getattr(m, key) < 1:
            raise ConfigError(f"{key} must be positive, got {getattr(m, key)}")
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError(
            f"hidden_size ({m.hidden_size}) must be divisible by num_attention_heads "
            f"({m.num_attention_heads})"
        )
    if m.num_attention_heads % m.kv_groups:
        raise ConfigError(
            f"num_attention_heads ({m.num_attention_heads}) must be divisible by "
            f"num_query_groups ({m.kv_groups})"
        )
    if m.normalization not in NORMALIZATIONS:
        raise ConfigError(
            f"normalization must be one of {list(NORMALIZATIONS)}, got {m.normalization!r}"
        )
    if m.attention_backend not in ATTENTION_BACKENDS:
        raise ConfigError(
            f"attention_backend must be one of {list(ATTENTION_BACKENDS)}, got "
            f"{m.attention_backend!r}"
        )
    for key in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= getattr(m, key) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {getattr(m, key)}")
    if m.num_moe_experts:
        if not 1 <= m.moe_router_topk <= m.num_moe_experts:
            raise ConfigError(
                f"moe_router_topk ({m.moe_router_topk}) must be between 1 and num_moe_experts "
                f"({m.num_moe_experts})"
            )
        if m.moe_router_score_function not in ("softmax", "sigmoid"):
            raise ConfigError(
                "moe_router_score_function must be 'softmax' or 'sigmoid', got "
                f"{m.moe_router_score_function!r}"
            )
        freq = m.moe_layer_freq
        if isinstance(freq, list):
            if len(freq) != m.num_layers or any(x not in (0, 1) for x in freq):
                raise ConfigError(
                    f"moe_layer_freq as a list needs one 0/1 entry per layer ({m.num_layers}), "
                    f"got {freq}"
                )
        elif isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
            raise ConfigError(
                f"moe_layer_freq must be a positive integer or a 0/1 list, got {freq!r}"
            )
    if m.multi_latent_attention:
        for key in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            if getattr(m, key) < 1:
                raise ConfigError(f"{key} must be positive for multi_latent_attention")
        if m.qk_pos_emb_head_dim % 2:
            raise ConfigError(
                f"qk_pos_emb_head_dim ({m.qk_pos_emb_head_dim}) must be even (rotary pairs)"
            )


# --------------------------------------------------------------------------------------------
# Spec strings (SPEC_HELP below lists the forms)
# --------------------------------------------------------------------------------------------

SPEC_HELP = (
    "none | selective | selective:MOD[,MOD...] | selective: | full:uniform:N | full:block:N "
    f"(MOD in {', '.join(RECOMPUTE_MODULES)})"
)


def full_recompute_chunks(
    rc: RecomputeConfig, num_layers: int, training: bool = True
) -> list[tuple[int, int, bool]]:
    """Split the layers [0, num_layers) of one TransformerBlock into (start, end, checkpointed)
    runs, as Megatron's full recompute does (each virtual-pipeline chunk is its own block).

    uniform, N: chunks of N layers, each one checkpoint (the last chunk is clamped).
    block, N:   the first N layers checkpointed one by one, the rest run normally.
    """
    if not (training and rc.recompute_granularity == "full"):
        return [(0, num_layers, False)]
    n = rc.recompute_num_layers or 1
    if rc.recompute_method == "uniform":
        return [(i, min(i + n, num_layers), True) for i in range(0, num_layers, n)]
    if rc.recompute_method == "block":
        chunks = [(i, i + 1, True) for i in range(min(n, num_layers))]
        if n < num_layers:
            chunks.append((n, num_layers, False))
        return chunks
    raise ConfigError("Invalid activation recompute method.")


def parse_spec(spec: str) -> RecomputeConfig:
    """Parse a recompute spec string into a RecomputeConfig (raises ConfigError on bad input)."""
    text = spec.strip()
    head, _, rest = text.partition(":")
    if text == "none":
        return RecomputeConfig()
    if head == "selective":
        if ":" not in text:
            return RecomputeConfig("selective", recompute_modules=["core_attn"])
        items = [mod.strip() for mod in rest.split(",")]
        if rest.strip() and not all(items):  # `selective:` alone is the empty control
            raise ConfigError(f"empty module name in spec {spec!r} (a doubled or trailing comma)")
        modules = [mod for mod in items if mod]
        unknown = [mod for mod in modules if mod not in RECOMPUTE_MODULES]
        if unknown:
            raise ConfigError(
                f"unknown recompute module {unknown[0]!r} in spec {spec!r}; "
                f"choose from {', '.join(RECOMPUTE_MODULES)}"
            )
        return RecomputeConfig("selective", recompute_modules=list(dict.fromkeys(modules)))
    if head == "full":
        method, _, num = rest.partition(":")
        if method not in ("uniform", "block") or not num.isdigit() or int(num) < 1:
            raise ConfigError(
                f"malformed full recompute spec {spec!r}; expected full:uniform:N or "
                "full:block:N with N >= 1"
            )
        return RecomputeConfig("full", recompute_method=method, recompute_num_layers=int(num))
    raise ConfigError(f"malformed recompute spec {spec!r}; expected {SPEC_HELP}")


def applicable_modules(config: Config) -> list[str]:
    """The recompute modules that act on this model (and pass Megatron's validation)."""
    m = config.model
    modules = ["core_attn", "layernorm"]
    if m.num_moe_layers < m.num_layers:
        modules.append("mlp")
    if m.num_moe_layers:
        modules.append("moe")
        if m.moe_grouped_gemm:
            modules.append("moe_act")
        if m.moe_shared_expert_intermediate_size and not m.moe_shared_expert_overlap:
            modules.append("shared_experts")
    if m.multi_latent_attention:
        modules.append("mla_up_proj")
    return [mod for mod in RECOMPUTE_MODULES if mod in modules]


def all_specs(config: Config) -> list[str]:
    """The specs worth checking on this model: none, the empty selective control, every module
    alone, every pair, all of them together, and full uniform/block for every N from 1 to
    num_layers. (With three modules or fewer that is every subset.)"""
    modules = applicable_modules(config)
    specs = ["none", "selective:"]
    sizes = sorted({1, 2, len(modules)} & set(range(1, len(modules) + 1)))
    for r in sizes:
        specs += ["selective:" + ",".join(c) for c in itertools.combinations(modules, r)]
    specs = [format_spec(parse_spec(spec)) for spec in specs]  # canonical: selective:core_attn
    for method in ("uniform", "block"):
        specs += [f"full:{method}:{n}" for n in range(1, config.model.num_layers + 1)]
    return specs


def format_spec(rc: RecomputeConfig) -> str:
    """The canonical spec string of a RecomputeConfig (`selective:core_attn` prints `selective`)."""
    if rc.recompute_granularity is None:
        return "none"
    if rc.recompute_granularity == "full":
        return f"full:{rc.recompute_method}:{rc.recompute_num_layers}"
    modules = rc.modules
    if modules == ["core_attn"]:
        return "selective"
    return "selective:" + ",".join(modules)


# --------------------------------------------------------------------------------------------
# Config files: YAML or JSON, flat or nested under `model:` (Megatron-Bridge style).
# --------------------------------------------------------------------------------------------


# Names Megatron-Core's TransformerConfig, Megatron-Bridge and Megatron-LM's flags use for a
# kit key, with the conversion of the value.
ALIASES: dict[str, tuple[str, Any]] = {
    "gated_linear_unit": ("swiglu", bool),
    "padded_vocab_size": ("vocab_size", int),
    "decoder_first_pipeline_num_layers": ("num_layers_in_first_pipeline_stage", int),
    "decoder_last_pipeline_num_layers": ("num_layers_in_last_pipeline_stage", int),
    "disable_bias_linear": ("add_bias_linear", lambda v: not v),
    "untie_embeddings_and_output_weights": ("share_embeddings_and_output_weights", lambda v: not v),
    "no_bias_swiglu_fusion": ("bias_activation_fusion", lambda v: not v),
    "no_bias_gelu_fusion": ("bias_activation_fusion", lambda v: not v),
    "no_masked_softmax_fusion": ("masked_softmax_fusion", lambda v: not v),
    "no_rope_fusion": ("apply_rope_fusion", lambda v: not v),
    "tensor_parallel_size": ("tensor_model_parallel_size", int),
    "pipeline_parallel_size": ("pipeline_model_parallel_size", int),
    "expert_parallel_size": ("expert_model_parallel_size", int),
}
# Keys read but not kept: what they tell is folded into other keys.
_INFORMATIVE = {"activation_func", "world_size", "nproc_per_node", "nnodes", "num_gpus"}
_NORMALIZATIONS = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}

# Megatron-Core's TransformerConfig defaults where the kit's differ (its small runnable models),
# used for a config read from a file; each memory-relevant key a file leaves out is listed.
MEGATRON_DEFAULTS = {
    "attention_backend": "auto",
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "normalization": "LayerNorm",
    "micro_batch_size": 1,
}
# Keys without which a per-rank estimate is a guess: named in the assumptions when missing.
_MEMORY_KEYS = {
    "vocab_size": 32000,
    "seq_length": 4096,
    "micro_batch_size": 1,
    "bf16": False,
    "attention_backend": "auto",
    "normalization": "LayerNorm",
    "swiglu": False,
    "add_bias_linear": True,
}


def config_from_dict(data: dict[str, Any], base: Config | None = None) -> tuple[Config, list[str]]:
    """Build a Config from a flat or section-nested mapping (Megatron-Bridge's `model:`,
    `train:`, `ddp:`, ...; Megatron-Core and Megatron-LM names). Returns (config, warnings):
    warnings name every key that was not used. Without `base`, missing keys take Megatron's
    defaults and every memory-relevant one is listed in `config.assumptions`."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"a config must be a mapping of keys to values, got {type(data).__name__}"
        )
    warnings: list[str] = []
    flat = dict(data)
    if isinstance(flat.get("model"), dict):
        # Megatron-Bridge keeps a few of our keys in other sections (train.micro_batch_size,
        # ddp.use_distributed_optimizer, dataset.seq_length): take those, report the rest.
        sections, flat = flat, dict(flat.pop("model"))
        for name, section in sections.items():
            if not isinstance(section, dict):
                warnings.append(f"ignored top-level key {name!r}")
                continue
            for key, value in section.items():
                if (key in _SECTION_OF_KEY or key in ALIASES) and key not in flat:
                    flat[key] = value
    assumptions: list[str] = []
    known: dict[str, Any] = {}
    for key, value in flat.items():
        if key in _SECTION_OF_KEY:
            known[key] = value
        elif key in ALIASES:
            target, convert = ALIASES[key]
            if value is not None:
                known.setdefault(target, convert(value))
        elif key not in _INFORMATIVE:
            warnings.append(f"unknown config key {key!r}{_did_you_mean(key)} (ignored)")
    if isinstance(known.get("normalization"), str):
        known["normalization"] = _NORMALIZATIONS.get(
            known["normalization"].lower(), known["normalization"]
        )
    if isinstance(known.get("attention_backend"), str):  # "AttnBackend.flash" -> "flash"
        known["attention_backend"] = known["attention_backend"].rsplit(".", 1)[-1]
    act = str(flat.get("activation_func") or "")
    if known.get("swiglu") and act and "silu" not in act:
        assumptions.append(f"gated_linear_unit with {act}: counted as SwiGLU (same memory)")
    _derive_data_parallel(flat, known, assumptions)
    if base is None:
        for key, default in _MEMORY_KEYS.items():
            if key not in known:
                known[key] = MEGATRON_DEFAULTS.get(key, default)
                assumptions.append(f"{key} not given: assumed {known[key]!r}")
        for key, default in MEGATRON_DEFAULTS.items():
            known.setdefault(key, default)
    cfg = (base or Config()).replace(**known)
    cfg.assumptions = [*(base.assumptions if base else []), *assumptions]
    return cfg, warnings


def _derive_data_parallel(flat: dict[str, Any], known: dict[str, Any], notes: list[str]) -> None:
    """DP from a launcher's world size (torchrun --nnodes x --nproc-per-node) when not given."""
    if "data_parallel_size" in known:
        return
    world = flat.get("world_size")
    if world is None and flat.get("nproc_per_node") is not None:
        world = int(flat["nproc_per_node"]) * int(flat.get("nnodes") or 1)
    if world is None:
        return
    model_parallel = (
        int(known.get("tensor_model_parallel_size") or 1)
        * int(known.get("pipeline_model_parallel_size") or 1)
        * int(known.get("context_parallel_size") or 1)
    )
    if int(world) % model_parallel:
        raise ConfigError(f"world size {world} is not divisible by TP x PP x CP = {model_parallel}")
    known["data_parallel_size"] = int(world) // model_parallel
    notes.append(
        f"data_parallel_size derived: world size {world} / (TP x PP x CP = {model_parallel})"
    )


def load_config(path: str | Path, base: Config | None = None) -> tuple[Config, list[str]]:
    """Read a YAML or JSON config file. Raises ConfigError with one line on any problem."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"config file {str(path)!r} is not valid YAML/JSON: {first}") from None
    if data is None:
        raise ConfigError(f"config file {str(path)!r} is empty")
    return config_from_dict(data, base)
