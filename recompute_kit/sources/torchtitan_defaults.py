"""torchtitan's own defaults for what a TOML job config leaves out (v0.2.2's
`torchtitan/config/job_config.py`, its model code and optimizer), and how selective_ac_option's
every-k-th-block checkpointing reads in Megatron terms. `torchtitan.py` reads the file.

A value no torchtitan key or code decides is not labelled here: resolve gives it recompute-kit's
Megatron-Core default, said as an assumption (`UNSET_DEFAULT`).
"""

from __future__ import annotations

import dataclasses

from .reading import MODEL_PARALLEL_SIZES, Reading

TT_COMMIT = "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce"  # tag v0.2.2
TT_BLOB = f"https://github.com/pytorch/torchtitan/blob/{TT_COMMIT}"
JOB_CONFIG = "torchtitan/config/job_config.py @ v0.2.2"
# a config registry's (sources/torchtitan_registry.py): the same defaults, in main's dataclasses
REGISTRY_CONFIG = "torchtitan/config/configs.py @ main b5bcd76"
REGISTRY_FORMAT = "torchtitan config registry"
# what a registry of several configs read without ::NAME says (resolve.py waits for a launch
# among the inputs to name it)
REGISTRY_UNNAMED = "name one"
OPTIMIZER = f"{TT_BLOB}/torchtitan/components/optimizer.py"
PARALLELIZE = f"{TT_BLOB}/torchtitan/models/llama3/infra/parallelize.py"
# the same sources on main (b5bcd76), for a config registry's reading
MAIN_BLOB = "https://github.com/pytorch/torchtitan/blob/b5bcd76c6"
_SOURCES = {
    "optimizer": (OPTIMIZER, f"{MAIN_BLOB}/torchtitan/components/optimizer/optimizer.py"),
    "parallelize": (PARALLELIZE, f"{MAIN_BLOB}/torchtitan/models/llama3/parallelize.py"),
    "dispatcher": (
        "torchtitan/distributed/expert_parallel.py (torchtitan 0.2.2)",
        f"{MAIN_BLOB}/torchtitan/models/common/token_dispatcher.py",
    ),
    "model": (
        f"{TT_BLOB}/torchtitan/models/llama3/model/model.py",
        f"{MAIN_BLOB}/torchtitan/models/common/embedding.py",
    ),
    "moe": (
        f"{TT_BLOB}/torchtitan/models/moe/moe.py",
        f"{MAIN_BLOB}/torchtitan/models/common/moe.py",
    ),
}


def _source(what: str, registry: bool) -> str:
    """Where torchtitan decides `what`: the TOML releases' file, or main's for a registry."""
    return _SOURCES[what][1 if registry else 0]
# [training] dtype = "bfloat16": no fp32 anywhere (torchtitan.py's origin note says so)
PURE_BF16 = "pure bf16: params, grads and optimizer states in bf16, no fp32 master copy"
# What resolve labels a field no torchtitan key or code decides (Megatron-Core's default).
UNSET_DEFAULT = (
    "assumed by recompute-kit: Megatron-Core's TransformerConfig default (no torchtitan key "
    "sets it)"
)


def op_sac_modules(moe: bool) -> list[str]:
    """torchtitan's per-op selective AC in Megatron's modules. Dense blocks: the norms
    (memory/torchtitan.py counts the rest as torchtitan keeps it). MoE blocks: the whole MoE
    layer recomputed, as Megatron's `moe`: the experts' grouped GEMMs (torch._grouped_mm) are
    in neither torchtitan's save list (distributed/activation_checkpoint.py) nor functorch's
    compute-intensive ops, so they and the activation between them run again. (Read as
    norms + moe_act until a trial: torchtitan's deepseek_v3_16b.toml at local_batch_size 4,
    which its maintainers ship as safe on 80 GB H100s (pytorch/torchtitan#1792), was
    estimated at 105 GiB; as `moe`, 71.)"""
    return ["layernorm", "moe"] if moe else ["layernorm"]


def flavor_source(name: str) -> str:
    return f"{TT_BLOB}/torchtitan/models/{name}/__init__.py"


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def layer_ac(k: int, n_layers: int | None, pp: int) -> tuple[str, int | None, str]:
    """torchtitan's selective_ac_option k (a block is fully checkpointed iff its 1-based count
    % k == 0, `distributed/activation_checkpoint.py`) in Megatron terms: (method, num_layers,
    note)."""
    if k <= 1:
        return "uniform", 1, "every block fully checkpointed"
    per_stage = None if n_layers is None else (n_layers // pp) // k
    return (
        "block",
        per_stage,
        f"torchtitan checkpoints every {_ordinal(k)} block; Megatron's block method "
        "checkpoints the same number of layers, the first ones of each stage",
    )


def apply_defaults(reading: Reading) -> None:
    registry = REGISTRY_FORMAT in (reading.format or "")
    where = f"torchtitan's default ({REGISTRY_CONFIG if registry else JOB_CONFIG})"
    d = reading.default
    pp = reading.get("pipeline_model_parallel_size", 1) or 1
    d("seq_length", 2048, where, "[training] seq_len")
    d(
        "micro_batch_size",
        1 if pp > 1 else 8,
        where,
        "pipeline_parallel_microbatch_size" if pp > 1 else "[training] local_batch_size",
    )
    d("bf16", True, where, "mixed_precision_param bfloat16: fp32 params, bf16 compute")
    d("fp16", False, where, "torchtitan has no fp16 training")
    d("fp8", None, where, "no float8 converter")
    d("attention_backend", "flash", where, "attn_type sdpa")
    # torchtitan's models have no dropout, and its expert parallelism exchanges the routed
    # tokens (the TOML releases' torchtitan/distributed/expert_parallel.py, ExpertParallel's
    # all_to_all_single), Megatron's alltoall dispatcher's traffic, not an allgather
    models = "torchtitan's models (no dropout layers)"
    d("attention_dropout", 0.0, models)
    d("hidden_dropout", 0.0, models)
    if reading.get("num_moe_experts"):
        d(
            "moe_token_dispatcher_type",
            "alltoall",
            _source("dispatcher", registry),
            "ExpertParallel: all_to_all_single of the routed tokens",
        )
    d(
        "transformer_impl",
        "local",
        where,
        "torch nn modules (RMSNorm, Linear), no Transformer Engine",
    )
    d(
        "loss_implementation",
        "torchtitan",
        where,
        "cross_entropy_loss: torch cross_entropy on logits upcast to fp32",
    )
    for key in MODEL_PARALLEL_SIZES:
        d(key, 1, where)
    if pp == 1:
        d("virtual_pipeline_model_parallel_size", None, where, "no pipeline")
    tp = reading.get("tensor_model_parallel_size")
    cp = reading.get("context_parallel_size")
    reading.derive(
        "sequence_parallel",
        tp > 1,
        "torchtitan applies SequenceParallel to the norms whenever TP > 1 "
        + (
            "(parallelism.enable_sequence_parallel, default True)"
            if registry
            else "(no TOML key before its 2026 refactor)"
        ),
    )
    world = reading.get("world_size")
    if world and "data_parallel_size" not in reading:
        if world % (tp * pp * cp):
            reading.warnings.append(
                f"world size {world} is not a multiple of TP x PP x CP = {tp * pp * cp}"
            )
        else:
            dp = world // (tp * pp * cp)
            reading.derive(
                "data_parallel_size", dp, "WORLD_SIZE / (TP x PP x CP) (shard -1 = the rest)"
            )
    dp = reading.get("data_parallel_size")
    if dp and "zero_stage" not in reading:  # data_parallel_shard_degree -1: every DP rank
        how = "FSDP2 shards over dp_shard x cp when > 1 (dp_shard -1: the data-parallel ranks)"
        reading.derive("zero_stage", 3 if dp * cp > 1 else 0, how)
        if dp * cp > 1:
            reading.derive("use_torch_fsdp2", True, how)
    d(
        "param_precision",
        "amp",
        where,
        "fp32 parameters; bf16 compute through FSDP2's MixedPrecisionPolicy or autocast",
    )
    d("use_distributed_optimizer", False, where, "FSDP2 sharding is zero_stage")
    d("cpu_offloading", False, where)
    d("fine_grained_activation_offloading", False, where)
    d("optimizer_offload", False, where, "[training] enable_cpu_offload")
    d("param_offload", False, where, "[training] enable_cpu_offload")
    explicit_mode = reading.unused.get("activation_checkpoint.mode")
    if "recompute_granularity" not in reading and explicit_mode is None and registry:
        # Trainer.Config's activation_checkpoint: SelectiveAC.Config(), per-op SAC
        d("recompute_granularity", "selective", where, "SelectiveAC.Config(): per-op SAC")
        moe = bool(reading.get("num_moe_experts"))
        d(
            "recompute_modules",
            op_sac_modules(moe),
            where,
            "ops outside the save list: norms; on MoE blocks the experts' grouped GEMMs too",
        )
    if "recompute_granularity" not in reading and explicit_mode is None:
        # [activation_checkpoint] mode "selective", selective_ac_option "2"
        method, layers, note = layer_ac(2, reading.get("num_layers"), pp)
        d(
            "recompute_granularity",
            "full",
            where,
            f"mode selective, selective_ac_option '2': {note}",
        )
        d("recompute_method", method, where, note)
        if layers is not None:
            reading.derive("recompute_num_layers", layers, f"num_layers / PP / 2 ({note})")
    granularity = reading.get("recompute_granularity", "unset")
    if granularity is None:
        d("recompute_method", None, where, "no activation checkpointing")
        d("recompute_num_layers", None, where, "no activation checkpointing")
    elif granularity == "selective":
        d("recompute_method", None, where, "selective")
        d("recompute_num_layers", None, where, "selective")
    _states_and_gradients(reading, registry)
    _no_per_op_modules(reading)
    d(
        "make_vocab_size_divisible_by",
        1,
        "torchtitan's model (nn.Embedding(vocab_size, dim) and the output Linear, "
        f"{_source('model', registry)})",
        "the flavor's vocab_size rows, unpadded",
    )
    if reading.get("num_moe_experts"):
        d(
            "moe_grouped_gemm",
            True,
            "torchtitan's default (MoEArgs.use_grouped_mm, "
            f"{_source('moe', registry)})",
        )


def _states_and_gradients(reading: Reading, registry: bool = False) -> None:
    """What torchtitan decides about gradients and optimizer states: the FSDP2 reduction dtype
    ([training] mixed_precision_reduce, "float32" its only and default value), FSDP2 only when
    dp_shard x cp > 1, and torch.optim's states in the parameters' dtype (fp32 unless
    [training] dtype = bfloat16, where they are bf16 and the kit's fp32 is no torchtitan
    default: left to resolve's label, beside torchtitan.py's warning)."""
    config = REGISTRY_CONFIG if registry else JOB_CONFIG
    key = "training.mixed_precision_reduce" if registry else "[training] mixed_precision_reduce"
    reduce_where = f"torchtitan's default ({key}, {config})"
    reading.default(
        "grad_reduce_in_fp32",
        True,
        reduce_where,
        "'float32': FSDP2 MixedPrecisionPolicy reduce_dtype; without FSDP the gradients are "
        "the fp32 parameters' own",
    )
    reading.default(
        "use_torch_fsdp2",
        False,
        f"torchtitan's parallelize ({_source('parallelize', registry)})",
        "fully_shard only when data_parallel_shard_degree x context_parallel_degree > 1",
    )
    bf16 = reading.origins.get("bf16")
    if bf16 is not None and bf16.note == PURE_BF16:
        return
    optimizer = _source("optimizer", registry)
    key = "optimizer=" if registry else "[optimizer] name"
    where = f"torchtitan's optimizer ({key}, AdamW by default: torch.optim, {optimizer})"
    reading.default("use_precision_aware_optimizer", False, where, "plain torch.optim")
    for key in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        reading.default(
            key, "fp32", where, "the parameters' dtype: fp32 ([training] dtype float32)"
        )


def _no_per_op_modules(reading: Reading) -> None:
    """Without per-op selective AC nothing is recomputed module by module: the mode that says
    so (none, full, every k-th block) is the source of recompute_modules None."""
    granularity = reading.origins.get("recompute_granularity")
    if granularity is None or reading.get("recompute_granularity") == "selective":
        return
    reading.set(
        "recompute_modules",
        None,
        dataclasses.replace(granularity, note="no per-op selective AC"),
        overwrite=False,
    )
