"""The config dataclasses (`ModelConfig`, `ParallelConfig`, `RecomputeConfig`, `Config`) and
the module lists Megatron-Core accepts."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field, fields
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
GPUS_PER_NODE = 8  # the NVLink domain of a DGX / HGX node, where nothing says otherwise
ATTENTION_BACKENDS = ("unfused", "flash", "fused", "auto")
CROSS_ENTROPY_FUSION_IMPLS = ("native", "te")
LOSS_IMPLEMENTATIONS = ("megatron", "hf", "torchtitan")
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
    # The loss. Megatron-Core's TransformerConfig fields (Megatron-LM: --cross-entropy-loss-fusion,
    # --cross-entropy-fusion-impl): the unfused and the native fused vocab-parallel
    # cross-entropy keep an fp32 softmax of the logits; TE's keeps the logits in their own
    # dtype. `loss_implementation` is the framework whose loss runs: "megatron", or "hf" /
    # "torchtitan" (torch's cross_entropy on logits upcast to fp32); the readers set it.
    cross_entropy_loss_fusion: bool = False
    cross_entropy_fusion_impl: str = "native"  # "native" | "te"
    loss_implementation: str = "megatron"  # "megatron" | "hf" | "torchtitan"
    # A fused linear cross-entropy outside Megatron (Liger's LigerFusedLinearCrossEntropyLoss:
    # Hugging Face Trainer use_liger_kernel, LLaMA-Factory enable_liger_kernel): the loss is
    # computed from the hidden states in chunks of tokens, so the full logits never exist.
    fused_linear_cross_entropy: bool = False
    # whose: "liger" (gradients computed in the forward and kept), "trl_chunked_nll" (TRL's
    # SFT loss_type chunked_nll: 256-token chunks under checkpoint, the weight cast to fp32) or
    # "torchtitan_chunked" (torchtitan's ChunkedLossWrapper: the tokens in
    # `fused_linear_cross_entropy_chunks` chunks, each chunk's backward run at once)
    fused_linear_cross_entropy_impl: str = "liger"
    fused_linear_cross_entropy_chunks: int = 8
    bf16: bool = False
    fp16: bool = False
    # Mixture of experts
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None  # None: ffn_hidden_size
    moe_layer_freq: int | list[int] = 1  # N: every N-th layer is MoE; list: 1 = MoE, 0 = dense
    moe_router_score_function: str = "softmax"  # "softmax" | "sigmoid"
    # Megatron refuses top-1 softmax routing unless the softmax comes before the top-k (or
    # the router is sinkhorn): a softmax over one expert has no gradient.
    moe_router_pre_softmax: bool = False
    moe_router_load_balancing_type: str = "aux_loss"  # Megatron's default; "sinkhorn", "none", ...
    moe_aux_loss_coeff: float = 0.0  # load-balancing loss weight
    moe_shared_expert_intermediate_size: int | None = None
    moe_grouped_gemm: bool = False
    # Transformer Engine's fused permute / unpermute (--moe-permute-fusion): no unfused
    # unpermute, whose intermediates full recompute holds late before PR #5197 (versions.py)
    moe_permute_fusion: bool = False
    # Token dropping: an expert takes at most factor x its balanced share of tokens (None:
    # dropless); padding fills every expert to that capacity (memory/overheads.py).
    moe_expert_capacity_factor: float | None = None
    moe_pad_expert_input_to_capacity: bool = False
    # recompute-kit's own key: a measured routing imbalance (max / mean tokens per expert rank)
    # that sizes the experts' token copies of a dropless run (memory/overheads.py)
    moe_routing_imbalance: float | None = None
    # the router forced to balanced routing (Megatron's benchmark mode): imbalance 1 by design
    moe_router_force_load_balancing: bool = False
    # Layers the estimator does not model (Mamba, linear attention), in words with where they
    # are read: the run is validated and measured, never sized (memory/estimate.py refuses)
    not_modelled: str = ""
    moe_shared_expert_overlap: bool = False
    # the EP all-to-all overlapped with another micro-batch's compute (Megatron-Core's
    # overlap_moe_expert_parallel_comm; Megatron-Bridge's comm_overlap section sets it): it
    # refuses full recompute and a recompute method (config/validation.py)
    overlap_moe_expert_parallel_comm: bool = False
    # Multi-token prediction (Megatron-Core's mtp_num_layers; HF num_nextn_predict_layers):
    # MTP layers after the decoder, on the stage that holds the loss (memory/mtp.py).
    mtp_num_layers: int | None = None
    # Multi-latent attention
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    # Low precision and CUDA graphs (validated against recompute; not executed by the layers)
    fp8: str | None = None
    fp8_recipe: str = "delayed"  # Megatron-Core TransformerConfig's default
    # The MoE token dispatcher ("allgather", Megatron's default; "alltoall"; "flex"): it decides
    # the dispatcher's buffers (memory/overheads.py models allgather's only).
    moe_token_dispatcher_type: str = "allgather"
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
    # Samples a step takes across data parallelism (None: not known). With the micro-batch and
    # DP it gives the step's micro-batches, which bound what a pipeline stage holds in flight.
    global_batch_size: int | None = None
    use_distributed_optimizer: bool = False
    # DeepSpeed ZeRO / FSDP sharding of model states over DP: 0 none, 1 optimizer states,
    # 2 + gradients, 3 + parameters (FSDP2's and Megatron-FSDP's full sharding is 3).
    zero_stage: int = 0
    use_torch_fsdp2: bool = False  # PyTorch FSDP2 does the sharding (fp32 shards, see memory)
    # Where the 16-bit copy lives (memory/model_states.py): "fp32_master" 16-bit weights and an
    # fp32 master copy in the optimizer (Megatron, DeepSpeed); "amp" fp32 weights autocast to
    # 16-bit (PyTorch AMP: Hugging Face Trainer without DeepSpeed); "pure" 16-bit weights,
    # gradients and optimizer states, no master copy (LLaMA-Factory pure_bf16).
    param_precision: str = "fp32_master"
    # Model states on the host: the optimizer's (DeepSpeed offload_optimizer, Megatron's
    # optimizer_cpu_offload, FSDP's CPU offload) and the parameters' (DeepSpeed offload_param,
    # ZeRO-3 only; FSDP2 CPUOffloadPolicy). memory/model_states.py counts what stays on the GPU.
    optimizer_offload: bool = False
    param_offload: bool = False
    # Parameter-efficient fine-tuning (LoRA and other adapters): the base weights are frozen,
    # held in the 16-bit compute dtype with no gradients and no optimizer states; the adapters'
    # own states (rank x the targeted layers: well under 1% of a model) are not counted.
    frozen_base: bool = False
    # A frozen base loaded quantized (QLoRA: bitsandbytes' 4-bit, LLM.int8's 8-bit): the bits of
    # its transformer layers' weights (None: the compute dtype's); embeddings, the output layer
    # and the adapters stay in 16 bits (transformers' integrations/bitsandbytes.py
    # get_keys_to_not_convert keeps the output layer unquantized)
    base_weight_bits: int | None = None
    # A frozen reference model beside the policy on the GPU (TRL's DPOTrainer without PEFT or
    # precompute_ref_log_probs): its 16-bit weights, sharded as the policy's under ZeRO-3,
    # whole below it (trl/models/utils.py prepare_deepspeed: stage 0 for a stage < 3)
    reference_model: bool = False
    # Megatron-Bridge LoRA's sequence_parallel_input_regather: under SP the adapters keep their
    # input's local shard and gather it again in backward (False: the whole sequence is kept)
    lora_input_regather: bool = False
    # DPO: the run's batch keys count preference pairs, and each micro-batch holds the chosen
    # and the rejected sequence of each (micro_batch_size here counts sequences: even)
    preference_pairs: bool = False
    # DeepSpeed ZeRO-3 leaf modules: the MoE block gathered whole (LLaMA-Factory's
    # add_z3_leaf_module for its MoE model types), not expert by expert
    zero3_moe_leaf: bool = False
    # DeepSpeed ZeRO's gradient bucket (zero_optimization.reduce_bucket_size, elements; None:
    # not a DeepSpeed run) and its double buffering (overlap_comm; None: DeepSpeed's default,
    # on at stage 3 only); stage 3 also gathers stage3_prefetch_bucket_size parameters ahead.
    zero_reduce_bucket_size: int | None = None
    zero_overlap_comm: bool | None = None
    zero_prefetch_bucket_size: int | None = None
    # torch's foreach AdamW (the Trainer's optim adamw_torch) allocates a temporary of one
    # moment's size in its step (_multi_tensor_adamw: exp_avg_sq_sqrt); fused kernels
    # (adamw_torch_fused, transformers' default with torch >= 2.8; DeepSpeed's FusedAdam) do not
    adam_step_temporary: bool = False
    # Megatron's gradient and optimizer dtypes (memory/model_states.py, "megatron" and
    # "megatron_fsdp" modes). DistributedDataParallelConfig.grad_reduce_in_fp32: main gradients
    # in fp32, else in the parameters' dtype (Megatron-Core's default False; Megatron-LM turns it
    # on for --bf16 unless --grad-reduce-in-bf16 or --main-grads-dtype bf16, the default here).
    grad_reduce_in_fp32: bool = True
    # OptimizerConfig's precision-aware optimizer (TE FusedAdam, distributed optimizer only):
    # the master copy and Adam's moments in these dtypes ("fp32", "bf16", "fp16", "fp8");
    # without it all three are fp32. store_param_remainders keeps a bf16 run's fp32 master
    # copy as the 16 bits bf16 leaves out (int16) where TE's FusedAdam holds the master copy.
    use_precision_aware_optimizer: bool = False
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    store_param_remainders: bool = True
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    # The GPUs of a node, where the inputs say (NeMo-RL's cluster.gpus_per_node, torchrun's
    # --nproc_per_node, #SBATCH --ntasks-per-node); None: GPUS_PER_NODE. Tensor and context
    # parallel groups beyond it run over the network.
    gpus_per_node: int | None = None
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: = tensor_model_parallel_size
    sequence_parallel: bool = False
    # Uneven pipeline stages (Megatron-LM: --decoder-first/last-pipeline-num-layers), or the
    # embedding / loss counted as a layer of the first / last stage.
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    # Megatron-Core's explicit layout of layers over (virtual) pipeline stages, e.g.
    # "Et|(tt|)*30mL" (config/pipeline_layout.py); it decides the VPP size too.
    pipeline_model_parallel_layout: str | None = None
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
        from .specs import format_spec  # (imports this module)

        return format_spec(self)


@dataclass
class Config:
    """Everything recompute-kit needs to know about one training setup."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    # What was assumed because a source (a config file) left it out; said in every output.
    assumptions: list[str] = field(default_factory=list, compare=False)
    # The Megatron-Core version the run uses ("0.13", "core_r0.13.0"), when an input or a flag
    # says it; None: unknown, and version-dependent checks assume the strictest.
    megatron_core_version: str | None = field(default=None, compare=False)

    def replace(self, **flat: Any) -> Config:
        """A copy with some flat Megatron keys changed (`replace(seq_length=4096)`)."""
        new = Config(
            dataclasses.replace(self.model),
            dataclasses.replace(self.parallel),
            dataclasses.replace(self.recompute),
            list(self.assumptions),
            self.megatron_core_version,
        )
        for key, value in flat.items():
            section = _SECTION_OF_KEY.get(key)
            if section is None:
                raise ConfigError(f"unknown config key {key!r}{_did_you_mean(key)}")
            setattr(getattr(new, section), key, value)
        return new

    def with_recompute(self, recompute: RecomputeConfig | str) -> Config:
        """A copy whose recompute settings are replaced (a spec string or a RecomputeConfig)."""
        from .specs import parse_spec  # (imports this module)

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
        return Config(
            self.model, self.parallel, rc, list(self.assumptions), self.megatron_core_version
        )

    def to_flat(self) -> dict[str, Any]:
        flat: dict[str, Any] = {}
        for section in (self.model, self.parallel, self.recompute):
            flat.update(dataclasses.asdict(section))
        return flat

    def validate(self, strict: bool = False, modules_given: bool = True) -> list[str]:
        """Raise `ConfigError` on the first rule broken; return warnings. Normalises in place
        (`recompute_modules=None` becomes `["core_attn"]`, as in Megatron). `modules_given`:
        False when recompute_modules is Megatron's default, not the input's (then a full
        recompute is not warned about ignoring it)."""
        from .validation import validate  # (imports this module)

        return validate(self, strict=strict, modules_given=modules_given)


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
