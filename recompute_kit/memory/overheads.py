"""Memory on a training GPU that is neither activations nor model states, as named terms with
stated defaults: the estimate's `total_bytes` leaves them out, `total_with_overheads_bytes` adds
them (memory/estimate.py).

* CUDA context: ~300-500 MiB per process and device with lazy module loading (CUDA >= 11.7,
  `CUDA_MODULE_LOADING=LAZY`, the CUDA C++ Programming Guide's "Lazy Loading"), over 1 GiB
  before it; the doctor's rules use the same figure (doctor/rules/outside_allocator.py). Default
  512 MiB, the top of that range (cuBLAS / cuDNN workspaces come on top of it).
* NCCL buffers: NCCL allocates per communicator and channel (NCCL_BUFFSIZE 4 MiB per channel
  and protocol; "the memory usage is linearly tied to the number of channels",
  https://github.com/NVIDIA/nccl/issues/986). Measured outside PyTorch on 8 x H100: 1.06 GB
  with the communicators of a collective set up, 4.34 GB once an all-to-all has connected
  every peer pair (https://github.com/NVIDIA/nccl/issues/1685; one allreduce communicator
  ~1.6 GB in https://github.com/NVIDIA/nccl/issues/864). Default 1 GiB on a rank of a
  multi-GPU job, 3 GiB more with expert parallelism (the dispatcher's all-to-all or
  all-gather over EP connects every peer); none on one GPU.
* MoE routing imbalance: the estimate sizes the experts' token copies with balanced routing
  (T x k per rank). A factor f (a measured max/mean of tokens per rank, or Megatron's
  moe_expert_capacity_factor, the most a token-dropping run lets an expert take: exactly that
  with moe_pad_expert_input_to_capacity, and below 1.0 where the factor is) scales those saved
  copies and the expert activations by f: (f - 1) x those bytes. Default: a measured factor
  (`moe_routing_imbalance`, `--moe-imbalance`), else the capacity factor where the config sets
  one, else 1.0 (balanced; said in the assumptions, since dropless
  routing has no bound).
* Dispatcher buffers: Megatron's default allgather dispatcher gathers the hidden states of the
  expert-tensor x expert-parallel group (T x ETP x EP rows of h) before it keeps this rank's
  picks; that buffer (and its gradient's in backward) lives during one MoE layer at a time, on
  top of what the layer saves. None without EP x ETP > 1 (nothing to gather). The alltoall and
  flex (DeepEP / HybridEP) dispatchers (`moe_token_dispatcher_type`) exchange only the routed
  tokens through their own communication buffers; those are not modelled (said in the
  assumptions), so their term is 0.
* ZeRO buffers: DeepSpeed's ZeRO keeps a gradient bucket of `reduce_bucket_size` elements in
  the 16-bit dtype (contiguous_gradients, DeepSpeed's default): stages 1 and 2 allocate it at
  each backward, twice with overlap_comm (deepspeed/runtime/zero/stage_1_and_2.py, backward:
  "double buffers ... when overlap_comm is enabled"), stage 3 once for the run
  (stage3.py, `__ipg_bucket_flat_buffer`), and stage 3 gathers up to
  `stage3_prefetch_bucket_size` parameters ahead of the module in hand. DeepSpeed's defaults
  are 5e8 and 5e7 elements; the Hugging Face Trainer fills "auto" with hidden^2 and
  0.9 x hidden^2. The bucket's contiguous_gradients=false variant is not modelled.
* Gathered parameters: a ZeRO-3 / FSDP run gathers a unit's parameters (and computes its
  unsharded gradients) during forward and backward; a PyTorch AMP run (fp32 weights) holds
  autocast's 16-bit copy of each weight through forward and backward
  (model_states.ModelStates.gathered_params).
"""

from __future__ import annotations

from ..config import Config, ConfigError

MIB = 2**20
GIB = 2**30
CUDA_CONTEXT_BYTES = 512 * MIB
NCCL_BYTES = 1 * GIB
NCCL_EXPERT_PARALLEL_BYTES = 3 * GIB
MOE_IMBALANCE = 1.0


def overhead_terms(
    config: Config,
    sharding: str,
    gathered_params: int,
    expert_activation_bytes: float,
    gathered_tokens: float,
    moe_stage: bool,
    dtype_bytes: int,
    moe_imbalance: float | None = None,
) -> dict:
    """The named terms for one pipeline stage, and what each assumes.

    `expert_activation_bytes`: what the stage keeps of the experts' token copies and expert
    activations at the schedule's peak (all micro-batches in flight); `gathered_tokens`: the
    token rows the allgather dispatcher gathers for one MoE layer (T x ETP x EP)."""
    p, m = config.parallel, config.model
    capacity = m.moe_expert_capacity_factor
    if moe_imbalance is None:
        moe_imbalance = m.moe_routing_imbalance
    if moe_imbalance is None:
        moe_imbalance = capacity if capacity is not None else MOE_IMBALANCE
    elif moe_imbalance < 1.0:
        raise ConfigError(
            "the MoE routing imbalance factor (--moe-imbalance) is at least 1.0, "
            f"got {moe_imbalance}"
        )
    ranks = (
        p.data_parallel_size
        * p.tensor_model_parallel_size
        * p.pipeline_model_parallel_size
        * p.context_parallel_size
    )
    ep_group = p.expert_model_parallel_size * p.etp
    nccl = 0 if ranks == 1 else NCCL_BYTES
    if moe_stage and p.expert_model_parallel_size > 1:
        nccl += NCCL_EXPERT_PARALLEL_BYTES
    imbalance = round((moe_imbalance - 1.0) * expert_activation_bytes) if moe_stage else 0
    allgather = m.moe_token_dispatcher_type == "allgather"
    dispatcher = (
        round(dtype_bytes * gathered_tokens * config.model.hidden_size)
        if moe_stage and ep_group > 1 and allgather
        else 0
    )
    zero_buffers = _zero_buffer_bytes(config, sharding, dtype_bytes)
    terms = {
        "cuda_context_bytes": CUDA_CONTEXT_BYTES,
        "nccl_buffers_bytes": nccl,
        "moe_imbalance_factor": moe_imbalance,
        "moe_imbalance_bytes": imbalance,
        "dispatcher_buffers_bytes": dispatcher,
        "gathered_params_bytes": gathered_params,
        "zero_buffers_bytes": zero_buffers,
    }
    said = [
        f"CUDA context {CUDA_CONTEXT_BYTES // MIB} MiB per process (lazy module loading)",
        (
            f"NCCL buffers {nccl / GIB:g} GiB (1 GiB per multi-GPU rank, +3 GiB with EP > 1; "
            "NVIDIA/nccl#1685 measured)"
            if nccl
            else "no NCCL buffers (one GPU)"
        ),
    ]
    if moe_stage:
        if capacity is not None and moe_imbalance == capacity:
            bound = "exactly" if m.moe_pad_expert_input_to_capacity else "at most"
            said.append(
                f"MoE expert capacity: each expert takes {bound} {capacity:g} x its balanced "
                "share of tokens (moe_expert_capacity_factor"
                + (", moe_pad_expert_input_to_capacity)" if bound == "exactly" else ")")
            )
        else:
            balanced = (
                " (balanced routing, forced: moe_router_force_load_balancing, a benchmark mode)"
                if m.moe_router_force_load_balancing
                else " (balanced routing; dropless: no bound, set moe_expert_capacity_factor "
                "or pass a measured factor)"
            )
            said.append(
                f"MoE routing imbalance factor {moe_imbalance:g}"
                + (balanced if moe_imbalance == 1.0 else "")
            )
        if dispatcher:
            said.append("allgather dispatcher: one MoE layer's gathered hidden states")
        elif not allgather and ep_group > 1:
            said.append(
                f"{m.moe_token_dispatcher_type} dispatcher (moe_token_dispatcher_type): its "
                "communication buffers are not modelled"
            )
    if (
        gathered_params
        and p.zero_stage >= 3
        and sharding == "fsdp2"
        and p.pipeline_model_parallel_size > 1
    ):
        said.append(
            "fsdp2 under pipeline parallelism: the stage's 16-bit params stay gathered from "
            "forward to backward (no reshard after forward: torchtitan's and Automodel's "
            "default with PP), and one unit's gradients"
        )
    elif gathered_params and p.zero_stage >= 3 and sharding != "megatron":
        said.append(f"{sharding} stage 3: the largest gathered unit's params and grads")
    elif gathered_params:
        said.append("autocast's 16-bit copies of this rank's fp32 weights (param_precision amp)")
    if zero_buffers:
        said.append(_zero_buffer_words(config, zero_buffers))
    if (
        sharding == "zero"
        and p.zero_stage >= 1
        and (m.bf16 or m.fp16)
        and not p.frozen_base
        and not p.optimizer_offload
    ):
        # the estimate's optimizer_step_bytes (memory/estimate.py)
        adam = (
            "and torch's foreach AdamW temporary of one moment's size (adam_step_temporary: "
            "optim adamw_torch)"
            if p.adam_step_temporary
            else "(no foreach AdamW temporary: a fused optimizer; optim adamw_torch would add "
            "one moment's size)"
        )
        said.append(
            f"DeepSpeed ZeRO's optimizer step: an fp32 copy of this rank's gradient partition "
            f"(4 B per parameter / DP) {adam}, after backward freed the activations: counted "
            "in the total where it exceeds the activations' peak"
        )
    if p.frozen_base and p.sequence_parallel and p.tensor_model_parallel_size > 1 and not (
        p.lora_input_regather
    ):
        said.append(
            "LoRA under sequence parallelism: the adapters on linear_qkv and linear_fc1 (LoRA's "
            "default targets) keep their all-gathered input, counted in the activations; "
            "Megatron-Bridge's peft.sequence_parallel_input_regather=true keeps the local "
            "shard instead (peft/lora.py)"
        )
    terms["overhead_assumptions"] = said
    terms["overhead_bytes"] = (
        CUDA_CONTEXT_BYTES + nccl + imbalance + dispatcher + gathered_params + zero_buffers
    )
    return terms


def _zero_buffer_bytes(config: Config, sharding: str, dtype_bytes: int) -> int:
    """DeepSpeed ZeRO's gradient bucket(s) and stage 3's prefetched parameters (module
    docstring); 0 for any other sharding or where the bucket size is not known."""
    p = config.parallel
    if sharding != "zero" or p.zero_stage < 1 or p.zero_reduce_bucket_size is None:
        return 0
    stage3 = p.zero_stage >= 3
    overlap = p.zero_overlap_comm if p.zero_overlap_comm is not None else stage3
    buckets = 1 if stage3 or not overlap else 2
    prefetch = (p.zero_prefetch_bucket_size or 0) if stage3 else 0
    return dtype_bytes * (buckets * p.zero_reduce_bucket_size + prefetch)


def _zero_buffer_words(config: Config, total: int) -> str:
    p = config.parallel
    stage3 = p.zero_stage >= 3
    overlap = p.zero_overlap_comm if p.zero_overlap_comm is not None else stage3
    words = f"ZeRO buffers {total / GIB:.2f} GiB: reduce_bucket_size {p.zero_reduce_bucket_size:,}"
    if not stage3 and overlap:
        words += " x 2 (overlap_comm double-buffers it)"
    if stage3 and p.zero_prefetch_bucket_size:
        words += f" + stage3_prefetch_bucket_size {p.zero_prefetch_bucket_size:,}"
    return words + " elements, 16-bit"
