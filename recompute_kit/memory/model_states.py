"""Weights, gradients and optimizer states per rank: parameter counts by kind, their split over
TP/PP/EP/ETP and the data-parallel sharding of gradients and Adam states, in four sharding modes
(`SHARDING_MODES`; Megatron's layout checked against Megatron-Core's own modules in
tests/test_megatron_parity.py, DeepSpeed's against its own estimator in
tests/test_model_states_sharding.py).

Bytes per parameter (16-bit mixed precision; fp32 training in brackets), Adam:

=============== ============ ============ ===================== =================================
mode            weights      gradients    optimizer             sharded over DP x CP at
=============== ============ ============ ===================== =================================
megatron        2 [4]        4 [4] fp32   12 [8] fp32 master    optimizer with the distributed
                             (2 without   + m + v (fewer with   optimizer (zero_stage 0)
                             grad_reduce_ the precision-aware
                             in_fp32)     optimizer's dtypes)
megatron_fsdp   2 [4]        as megatron  as megatron           zero_stage 1 optimizer, 2 + grads,
                                                                3 + weights
zero            2 [4]        2 [4] 16-bit 12 [8]                the same (DeepSpeed ZeRO 1/2/3)
fsdp2           4 fp32       4 fp32       8 m + v (no master)   the same (zero_stage 3 in
                                                                torchtitan / NeMo-RL DTensor)
=============== ============ ============ ===================== =================================

* megatron: Megatron-Core's DDP keeps fp32 main gradients with `grad_reduce_in_fp32` (the
  param-and-grad buffer; Megatron-LM's bf16 default), else 16-bit ones, and its optimizer an
  fp32 master copy plus Adam's m and v (megatron/core/optimizer/distrib_optimizer.py), or,
  with `use_precision_aware_optimizer`, those in `main_params_dtype`, `exp_avg_dtype` and
  `exp_avg_sq_dtype` (`megatron_state_bytes`).
* megatron_fsdp: Megatron-FSDP (`--use-megatron-fsdp`, data_parallel_sharding_strategy optim /
  optim_grads / optim_grads_params = zero_stage 1/2/3) runs Megatron's DistributedOptimizer
  (Megatron-LM megatron/training/arguments.py turns use_distributed_optimizer on for
  Megatron-FSDP v1), so it keeps Megatron's dtypes; zero_stage 1 equals the distributed optimizer.
* zero: DeepSpeed ZeRO (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py at 0.19.8): 16-bit
  params and gradients, fp32 master params + m + v = 12 B in the optimizer (the ZeRO paper's
  2 + 2 + 12 = 16 B/param). offload_optimizer puts the optimizer states (and, from stage 2, the
  gradient partition) on the host; offload_param (stage 3 only) the parameters. Two transient
  terms complete DeepSpeed's own `estimate_zero{2,3}_model_states_mem_needs` (`ModelStates`):
  the fp32 gradient partition built for the optimizer step (4 B/param / DP; "4_grads_32bit" in
  stage_1_and_2.py) and, at stage 3, the gathered largest layer (4 B/param: "2 bytes fp16
  params are gathered and 2 bytes fp16 grads are computed", docs/code-docs/source/memory.rst).
  DeepSpeed publishes no stage-1 estimator: stage 1 keeps whole 16-bit gradients. At stage 3
  without offload its estimator counts 18 B/param / N where these terms make 20 (16-bit params
  and grads, 12 B optimizer, the step's 4 B fp32 grads): it leaves one gradient copy out; the
  persistent 16 B / N is the ZeRO paper's, and the step's transient is not in the estimate.
* fsdp2: PyTorch FSDP2 `fully_shard` with torchtitan's MixedPrecisionPolicy (param_dtype bf16 for
  compute, reduce_dtype fp32): the sharded parameters stay fp32 (the bf16 copy is gathered per
  unit and freed), gradients are reduced to fp32 shards and Adam keeps m and v (no master copy:
  the parameters are fp32). CPUOffloadPolicy (torchtitan enable_cpu_offload) moves parameters,
  gradients and optimizer states to the host. Chosen by `use_torch_fsdp2` (the reader sets it
  for torchtitan, NeMo-RL's DTensor policy and Megatron-Bridge / Megatron-LM's FSDP2 flags); at
  stage 3 it totals 16 B/param / DP like `zero`, with another split.

`param_precision` (ParallelConfig) changes the 16-bit rows: "amp" (PyTorch autocast over fp32
weights: the Hugging Face Trainer's bf16 / fp16 without DeepSpeed, FSDP1's mixed precision)
keeps 4 B weights, 4 B gradients and 8 B Adam moments, no master copy, plus autocast's 16-bit
copy of every weight it casts (cached for the forward and saved by the matmuls for backward:
2 B/param of the unsharded weights, a transient term); "pure" (LLaMA-Factory `pure_bf16`:
16-bit weights and a torch optimizer whose states take the parameters' dtype) keeps
2 + 2 + 4 B.

Dense parameters shard over DP x CP, expert parameters over the expert-data-parallel ranks
(TP x CP x DP / (ETP x EP)) in every mode. Optimizer offload takes the optimizer states off the
GPU in every mode (Megatron's optimizer_cpu_offload with offload fraction 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..config import Config, ConfigError, ModelConfig
from .layout import pipeline_layout
from .mtp import mtp_layer_is_moe, mtp_location


def parameter_counts(m: ModelConfig) -> dict[str, int]:
    """Parameters of the reference model by part (whole model, no parallelism)."""
    h, a = m.hidden_size, m.num_attention_heads
    norm = 2 * h if m.normalization == "LayerNorm" else h
    width = 2 if m.swiglu else 1
    bias = 1 if m.add_bias_linear else 0

    def mlp(ffn: int) -> int:
        return h * ffn * width + bias * ffn * width + ffn * h + bias * h

    if m.multi_latent_attention:
        dq, dv = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        attention = (m.kv_lora_rank + m.qk_pos_emb_head_dim) * h  # kv down
        attention += m.kv_lora_rank * a * (m.qk_head_dim + dv) + m.kv_lora_rank  # kv up + norm
        if m.q_lora_rank:
            attention += h * m.q_lora_rank + m.q_lora_rank * a * dq + m.q_lora_rank
        else:
            attention += h * a * dq
        attention += a * dv * h  # output projection
    else:
        d, g = m.head_dim, m.kv_groups
        attention = h * (a + 2 * g) * d + bias * (a + 2 * g) * d + a * d * h + bias * h
    dense_layer = 2 * norm + attention + mlp(m.ffn_size)
    experts = 0
    moe_layer = 2 * norm + attention
    if m.num_moe_experts:
        e, f = m.num_moe_experts, m.moe_ffn_size
        experts = e * (h * f * width + f * h)
        moe_layer += e * h  # router
        if m.moe_shared_expert_intermediate_size:
            moe_layer += mlp(m.moe_shared_expert_intermediate_size)
    n_moe = m.num_moe_layers
    return {
        "embedding": m.vocab_size * h + m.seq_length * h,
        "layers": dense_layer * (m.num_layers - n_moe) + moe_layer * n_moe,
        "experts": experts * n_moe,
        "head": norm + h * m.vocab_size,
    }


def padded_vocab_size(m: ModelConfig, t: int) -> int:
    """Megatron-LM pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP."""
    multiple = m.make_vocab_size_divisible_by * t
    return -(-m.vocab_size // multiple) * multiple


def rank_parameters(config: Config, stage: int = 0) -> dict[str, float]:
    """Parameters one rank of `stage` holds in Megatron-Core: `dense` (sharded over TP, some
    replicated) and `expert` (sharded over EP and expert-TP)."""
    parts = _rank_parameters(config, stage)
    return {"dense": parts["dense"], "expert": parts["expert"]}


def _rank_parameters(config: Config, stage: int) -> dict[str, float]:
    """rank_parameters, and `largest_layer`: the most one transformer layer of the stage holds
    on the rank (dense + expert; the unit FSDP gathers).

    TP shards the column-parallel layers (QKV, fc1) with their biases and the row-parallel ones
    (proj, fc2) without theirs; norms, row-parallel biases, the learned position embedding and
    the router are replicated on every TP rank. The vocabulary is padded (padded_vocab_size)."""
    m, p = config.model, config.parallel
    t, ep, etp = p.tensor_model_parallel_size, p.expert_model_parallel_size, p.etp
    h, a = m.hidden_size, m.num_attention_heads
    norm = 2 * h if m.normalization == "LayerNorm" else h
    width = 2 if m.swiglu else 1
    bias = 1 if m.add_bias_linear else 0

    def mlp(ffn: int, shards: int) -> float:  # column fc1 (+ bias), row fc2; fc2's bias whole
        return (h * ffn * width + bias * ffn * width + ffn * h) / shards + bias * h

    if m.multi_latent_attention:
        # TE's spec replicates the down projections (TELinear, "duplicated") and fuses the
        # latent norms (qk_layernorm) into the up projections; the local spec shards the down
        # projections like any column-parallel linear and builds the norms on their own.
        down = t if m.transformer_impl == "local" else 1
        latent_norm = (2 if m.normalization == "LayerNorm" else 1) if m.qk_layernorm else 0
        dq, dv = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        attention = (m.kv_lora_rank + m.qk_pos_emb_head_dim) * h / down
        attention += latent_norm * m.kv_lora_rank
        attention += m.kv_lora_rank * a * (m.qk_head_dim + dv) / t  # kv up (column)
        if m.q_lora_rank:
            attention += h * m.q_lora_rank / down + latent_norm * m.q_lora_rank
            attention += m.q_lora_rank * a * dq / t
        else:
            attention += h * a * dq / t
        attention += a * dv * h / t + bias * h
    else:
        d, g = m.head_dim, m.kv_groups
        qkv = (a + 2 * g) * d
        attention = (h * qkv + bias * qkv + a * d * h) / t + bias * h
        if m.qk_layernorm:
            attention += 2 * d * (2 if m.normalization == "LayerNorm" else 1)
    layout = pipeline_layout(m, p)
    layers = [n for chunk in layout[stage] for n in chunk]
    mtp = mtp_location(m, p)
    mtp_here = mtp is not None and mtp[0] == stage and m.loss_implementation == "megatron"
    kinds = [m.is_moe_layer(n) for n in layers]
    if mtp_here:  # each MTP layer holds one transformer layer (memory/mtp.py)
        kinds += [mtp_layer_is_moe(m, layout[stage][mtp[1]])] * m.mtp_num_layers
    dense = expert = 0.0
    largest_layer = 0.0
    for moe_layer in kinds:
        layer_dense, layer_expert = 2 * norm + attention, 0.0
        if not moe_layer:
            layer_dense += mlp(m.ffn_size, t)
        else:
            layer_dense += m.num_moe_experts * h  # the router, replicated
            if m.moe_shared_expert_intermediate_size:
                layer_dense += mlp(m.moe_shared_expert_intermediate_size, t)
            f = m.moe_ffn_size
            per_expert = (h * f * width + bias * f * width + f * h) / etp + bias * h
            layer_expert = per_expert * m.num_moe_experts / ep
        dense += layer_dense
        expert += layer_expert
        largest_layer = max(largest_layer, layer_dense + layer_expert)
    in_layers = dense  # (the dense parameters of the transformer layers, before the edges)
    vocab = padded_vocab_size(m, t)
    if mtp_here:
        # enorm, hnorm and the final norm; eh_proj [2h -> h], column-parallel, no bias
        dense += m.mtp_num_layers * (3 * norm + 2 * h * h / t)
    if stage == 0 or mtp_here:  # the MTP stage keeps its own copy of the embedding
        dense += vocab * h / t
        if m.position_embedding_type == "learned_absolute":
            dense += m.seq_length * h  # replicated on every TP rank
    if stage == len(layout) - 1:
        dense += norm
        if not (m.share_embeddings_and_output_weights and stage == 0):
            dense += vocab * h / t
    return {
        "dense": dense,
        "expert": expert,
        "largest_layer": largest_layer,
        "in_layers": in_layers,
    }


SHARDING_MODES = ("megatron", "megatron_fsdp", "zero", "fsdp2")
# Bytes a parameter of a quantized frozen base: bitsandbytes' NF4 / FP4, half a byte and one
# fp32 absmax per block of 64 (4 / 64; double quantization, LLaMA-Factory's default, stores
# the absmax in fewer bits: an upper bound there), and LLM.int8, a byte (its per-row scales
# not counted)
QUANTIZED_BASE_BYTES = {4: 0.5 + 4 / 64, 8: 1.0}
PARAM_PRECISIONS = ("fp32_master", "amp", "pure")


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes on one rank. `weights`, `grads` and `optimizer` persist through the
    step (what `model_state_bytes` returns); the two transient terms do not:
    `step_fp32_grads` lives only in DeepSpeed's optimizer step (after the activations are
    freed) and `gathered_params` is the unsharded working set of a stage-3 mode during forward
    and backward (an overhead term of the estimate)."""

    mode: str
    weights: int
    grads: int
    optimizer: int
    step_fp32_grads: int = 0
    gathered_params: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def shard_groups(config: Config) -> tuple[int, int]:
    """The ranks that shard the dense and the expert model states: DP x CP, and the expert
    data-parallel group, TP x DP x CP / (expert TP x EP) (Megatron's expert-DP)."""
    p = config.parallel
    dp_cp = p.data_parallel_size * p.context_parallel_size
    edp = max(p.tensor_model_parallel_size * dp_cp // (p.etp * p.expert_model_parallel_size), 1)
    return dp_cp, edp


def sharding_mode(config: Config) -> str:
    """The sharding mode the Config says: `megatron` without a ZeRO stage (the distributed
    optimizer or none), `megatron_fsdp` with a stage and Megatron's distributed optimizer,
    `fsdp2` where the reader saw PyTorch FSDP2 (torchtitan, NeMo-RL's DTensor policy,
    Megatron-Bridge's use_torch_fsdp2), `zero` with a stage otherwise (DeepSpeed ZeRO)."""
    p = config.parallel
    if not p.zero_stage:
        return "megatron"
    if p.use_torch_fsdp2:
        return "fsdp2"
    return "megatron_fsdp" if p.use_distributed_optimizer else "zero"


def adam_moment_share(config: Config) -> float:
    """The share of the optimizer states that is Adam's two moments (the rest is the fp32
    master copy): all of it where the weights themselves are fp32 (fp32 training, FSDP2,
    autocast's "amp"), two thirds with 16-bit weights and an fp32 master copy (12 B/param)."""
    m, p = config.model, config.parallel
    fp32_weights = not (m.bf16 or m.fp16) or sharding_mode(config) == "fsdp2"
    return 1.0 if fp32_weights or p.param_precision in ("amp", "pure") else 2 / 3


def _largest_module(m: ModelConfig, t: int) -> float:
    """The most parameters one module holds directly in a Hugging Face model (DeepSpeed's
    `model_to_params`: `m.parameters(recurse=False)` of every module): the embedding or output
    head, one attention projection, one MLP or expert projection (gate, up and down are
    separate Linears there), divided by TP."""
    h = m.hidden_size
    sizes = [m.vocab_size * h, h * m.ffn_size]
    if m.multi_latent_attention:
        dq = m.qk_head_dim + m.qk_pos_emb_head_dim
        sizes += [h * m.num_attention_heads * dq, m.kv_lora_rank * m.num_attention_heads * dq]
    else:
        sizes.append(h * m.num_attention_heads * m.head_dim)
    if m.num_moe_experts:
        sizes.append(h * m.moe_ffn_size)
    return max(sizes) / t


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def _dtype_bytes(name: str, key: str) -> int:
    if name not in DTYPE_BYTES:
        raise ConfigError(f"{key} {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def megatron_state_bytes(config: Config) -> tuple[int, int]:
    """(gradient, optimizer) bytes per parameter of a 16-bit Megatron run (modes "megatron" and
    "megatron_fsdp"), from Megatron-Core 0.16.1's own rules:

    * gradients: DistributedDataParallel allocates the main-gradient buffer in fp32 when
      `grad_reduce_in_fp32`, else in the parameter's dtype (distributed_data_parallel.py:
      `torch.float if grad_reduce_in_fp32 else param.dtype`).
    * optimizer: Adam's exp_avg and exp_avg_sq and the master copy. Without the
      precision-aware optimizer all are fp32 (OptimizerConfig asserts it). With it
      (`use_precision_aware_optimizer`) the moments take `exp_avg_dtype` / `exp_avg_sq_dtype`;
      the master copy is TE FusedAdam's in `main_params_dtype` unless an fp8 recipe other than
      "delayed" runs with fp32 main params and no CPU offload, where the distributed optimizer
      keeps its own fp32 copy (OptimizerConfig.use_precision_aware_optimizer_no_fp8_or_ds_fp8).
      TE's copy of a bf16 run with fp32 main params and `store_param_remainders` is the int16
      remainder, 2 B (distrib_optimizer.py: `init_shard(torch.int16)`)."""
    m, p = config.model, config.parallel
    grad_b = 4 if p.grad_reduce_in_fp32 else 2
    if not p.use_precision_aware_optimizer:
        return grad_b, 12
    main = _dtype_bytes(p.main_params_dtype, "main_params_dtype")
    moments = _dtype_bytes(p.exp_avg_dtype, "exp_avg_dtype")
    moments += _dtype_bytes(p.exp_avg_sq_dtype, "exp_avg_sq_dtype")
    te_master = (
        p.main_params_dtype != "fp32"
        or not m.fp8
        or m.fp8_recipe == "delayed"
        or p.optimizer_offload
    )
    if te_master and main == 4 and m.bf16 and p.store_param_remainders:
        main = 2
    return grad_b, main + moments


def model_states(
    config: Config, stage: int = 0, engine: str = "megatron", sharding: str | None = None
) -> ModelStates:
    """Model states on one rank of `stage` under `sharding` (None: `sharding_mode(config)`),
    byte counts as in the module docstring."""
    m, p = config.model, config.parallel
    mode = sharding or sharding_mode(config)
    if mode not in SHARDING_MODES:
        raise ValueError(f"unknown sharding mode {mode!r} (one of {', '.join(SHARDING_MODES)})")
    if engine == "reference":
        counts = parameter_counts(m)
        t, pp, ep = (
            p.tensor_model_parallel_size,
            p.pipeline_model_parallel_size,
            p.expert_model_parallel_size,
        )
        dense = counts["layers"] / (t * pp) + counts["embedding"] / t
        dense += counts["head"] / t if pp == 1 else 0.0
        params = {
            "dense": dense,
            "expert": counts["experts"] / (ep * pp),
            "largest_layer": (counts["layers"] / t + counts["experts"] / ep) / m.num_layers,
            "in_layers": counts["layers"] / (t * pp),
        }
    else:
        params = _rank_parameters(config, stage)
    half = m.bf16 or m.fp16
    precision = p.param_precision
    if precision not in PARAM_PRECISIONS:
        raise ConfigError(
            f"param_precision {precision!r} is not one of {', '.join(PARAM_PRECISIONS)}"
        )
    if precision == "pure" and half:
        # 16-bit parameters, gradients and Adam moments in every mode (FSDP2 shards bf16
        # parameters as they are: NeMo Automodel with torch_dtype bfloat16 and torch.optim)
        weight_b, grad_b, optim_b = 2, 2, 4
    elif mode == "fsdp2" or precision == "amp" or not half:
        weight_b, grad_b, optim_b = 4, 4, 8
    elif precision == "pure":
        weight_b, grad_b, optim_b = 2, 2, 4
    elif mode == "zero":
        weight_b, grad_b, optim_b = 2, 2, 12
    else:
        weight_b, grad_b, optim_b = 2, *megatron_state_bytes(config)
    level = (1 if p.use_distributed_optimizer else 0) if mode == "megatron" else p.zero_stage
    dp_cp, edp = shard_groups(config)

    def held(bytes_per_param: int, sharded: bool) -> float:
        if not sharded:
            return bytes_per_param * (params["dense"] + params["expert"])
        return bytes_per_param * (params["dense"] / dp_cp + params["expert"] / edp)

    if p.frozen_base:  # adapters on a frozen base: 16-bit weights alone (the adapters aside)
        weight_b, grad_b, optim_b = (2 if half else 4), 0, 0
    weights = held(weight_b, level >= 3)
    if p.frozen_base and p.base_weight_bits in QUANTIZED_BASE_BYTES:
        # the layers' linear weights quantized (their norms, a few h a layer, counted so too);
        # bitsandbytes stores 4-bit weights in the 16-bit storage dtype FSDP shards
        quantized = params["in_layers"] + params["expert"]
        saved = (weight_b - QUANTIZED_BASE_BYTES[p.base_weight_bits]) * quantized
        weights -= saved / dp_cp if level >= 3 else saved
    if p.reference_model:  # (config/model.py): its weights in the compute dtype
        weights += held(2 if half else 4, level >= 3 and mode in ("zero", "fsdp2"))
    grads = held(grad_b, level >= 2)
    optimizer = held(optim_b, level >= 1)
    step = held(4, level >= 1) if mode == "zero" and half and not p.frozen_base else 0.0
    if p.optimizer_offload:
        optimizer = step = 0.0
        if mode in ("zero", "fsdp2") and level >= 2:
            grads = 0.0  # the gradient partition is copied to the host's fp32 buffers
    if p.param_offload and level >= 3 and mode in ("zero", "fsdp2"):
        weights = 0.0
        if mode == "fsdp2":
            grads = 0.0  # CPUOffloadPolicy: gradients go to the host with the parameters
    gathered = 0.0
    if precision == "amp" and half and level < 3 and not p.frozen_base:
        # autocast caches a 16-bit copy of every weight it casts for the whole forward, and
        # the matmuls save those copies for backward: all of this rank's weights at the peak
        gathered = 2 * (params["dense"] + params["expert"])
    if level >= 3 and mode != "megatron":
        if mode == "zero":
            unit = _largest_module(m, p.tensor_model_parallel_size)
            if p.zero3_moe_leaf and m.num_moe_experts:
                # the whole MoE block at once: router, every expert, the shared expert
                h = m.hidden_size
                block = m.num_moe_experts * (3 if m.swiglu else 2) * h * m.moe_ffn_size
                shared = m.moe_shared_expert_intermediate_size or 0
                block += m.num_moe_experts * h + 3 * h * shared
                unit = max(unit, block / p.tensor_model_parallel_size)
        else:  # FSDP units: a transformer layer, or the embedding / output head
            vocab = padded_vocab_size(m, p.tensor_model_parallel_size)
            unit = max(
                params["largest_layer"], vocab * m.hidden_size / p.tensor_model_parallel_size
            )
        # the unit's params gathered in the compute dtype and its gradients before the
        # reduce-scatter: 2 + 2 B in 16-bit (DeepSpeed's largest_layer_memory factor)
        width = 2 if half else 4
        gathered = 2 * width * unit
        if mode == "fsdp2" and p.pipeline_model_parallel_size > 1:
            # under PP, FSDP2 does not reshard after forward (torchtitan's "default" policy,
            # torchtitan/distributed/fsdp.py: `return not pp_enabled`; NeMo Automodel the
            # same): the stage's parameters stay gathered between forward and backward
            gathered = width * (params["dense"] + params["expert"]) + width * unit
    return ModelStates(
        mode, round(weights), round(grads), round(optimizer), round(step), round(gathered)
    )


def model_state_bytes(
    config: Config, stage: int = 0, engine: str = "megatron", sharding: str | None = None
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes on one rank of `stage`: the persistent
    terms of `model_states` (the module docstring gives the bytes of each sharding mode).

    Megatron (zero_stage 0) as always: 16-bit weights, fp32 main gradients, Adam with an fp32
    master copy and two moments (12 B/param); in fp32 4 B weights, 4 B gradients, 8 B moments.
    The distributed optimizer shards the optimizer states of dense parameters over the
    data-parallel ranks (context-parallel ones included: DP x CP) and those of expert
    parameters over the expert-data-parallel ranks (TP x CP x DP / (ETP x EP)).
    `engine="reference"` counts the kit's own layers: every parameter divided by TP, no vocab
    padding (their parameter count is checked against the layers)."""
    s = model_states(config, stage, engine, sharding)
    return s.weights, s.grads, s.optimizer
