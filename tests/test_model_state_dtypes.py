"""Megatron's gradient and optimizer-state dtypes (memory/model_states.megatron_state_bytes) and
the MoE dispatcher term by dispatcher type (memory/overheads.py). The rules are Megatron-Core
0.16.1's: distributed/distributed_data_parallel.py (`torch.float if grad_reduce_in_fp32 else
param.dtype`), optimizer/optimizer_config.py (use_precision_aware_optimizer_no_fp8_or_ds_fp8),
optimizer/distrib_optimizer.py (`init_shard(torch.int16)` for store_param_remainders)."""

from __future__ import annotations

import dataclasses

import pytest

from recompute_kit.config import Config, ConfigError, ModelConfig, ParallelConfig
from recompute_kit.memory.estimate import estimate
from recompute_kit.memory.model_states import megatron_state_bytes, model_states


def _cfg(fp8: str | None = None, recipe: str = "tensorwise", **parallel) -> Config:
    m = ModelConfig(
        num_layers=2, hidden_size=256, num_attention_heads=4, vocab_size=1024, bf16=True
    )
    m = dataclasses.replace(m, fp8=fp8, fp8_recipe=recipe)
    return Config(m, ParallelConfig(**parallel))


@pytest.mark.parametrize(
    ("parallel", "fp8", "recipe", "want"),
    [
        ({}, None, "tensorwise", (4, 12)),  # Megatron-LM's bf16 default: fp32 grads, Adam fp32
        ({"grad_reduce_in_fp32": False}, None, "tensorwise", (2, 12)),  # --grad-reduce-in-bf16
        # precision-aware, bf16, TE holds the master copy as int16 remainders: 2 + 4 + 4
        ({"use_precision_aware_optimizer": True}, None, "tensorwise", (4, 10)),
        ({"use_precision_aware_optimizer": True}, "hybrid", "delayed", (4, 10)),
        (
            {"use_precision_aware_optimizer": True, "store_param_remainders": False},
            None,
            "tensorwise",
            (4, 12),
        ),
        # blockwise fp8 with fp32 main params: the distributed optimizer's own fp32 copy
        (
            {
                "use_precision_aware_optimizer": True,
                "grad_reduce_in_fp32": False,
                "exp_avg_dtype": "bf16",
                "exp_avg_sq_dtype": "bf16",
            },
            "hybrid",
            "blockwise",
            (2, 8),
        ),
        (
            {"use_precision_aware_optimizer": True, "main_params_dtype": "fp16"},
            None,
            "tensorwise",
            (4, 10),
        ),
        (
            {
                "use_precision_aware_optimizer": True,
                "exp_avg_dtype": "fp8",
                "exp_avg_sq_dtype": "fp8",
            },
            None,
            "tensorwise",
            (4, 4),
        ),
        # without the precision-aware optimizer the dtypes are fp32 (OptimizerConfig asserts)
        ({"exp_avg_dtype": "bf16"}, None, "tensorwise", (4, 12)),
    ],
)
def test_megatron_state_bytes(parallel, fp8, recipe, want):
    assert megatron_state_bytes(_cfg(fp8, recipe, **parallel)) == want


def test_grad_dtype_changes_megatron_and_megatron_fsdp_modes_only():
    base = dict(data_parallel_size=4, use_distributed_optimizer=True)
    fp32 = model_states(_cfg(**base))
    bf16 = model_states(_cfg(grad_reduce_in_fp32=False, **base))
    assert bf16.grads * 2 == fp32.grads and bf16.weights == fp32.weights
    fsdp = dict(base, zero_stage=2)
    assert model_states(_cfg(grad_reduce_in_fp32=False, **fsdp)).grads * 2 == (
        model_states(_cfg(**fsdp)).grads
    )
    # DeepSpeed's 16-bit gradients and FSDP2's fp32 ones do not follow the Megatron field
    zero = dict(data_parallel_size=4, zero_stage=2)
    assert model_states(_cfg(grad_reduce_in_fp32=True, **zero)) == model_states(
        _cfg(grad_reduce_in_fp32=False, **zero)
    )
    fsdp2 = dict(data_parallel_size=4, zero_stage=3, use_torch_fsdp2=True)
    assert model_states(_cfg(grad_reduce_in_fp32=True, **fsdp2)) == model_states(
        _cfg(grad_reduce_in_fp32=False, **fsdp2)
    )


def test_fsdp2_over_bf16_parameters_keeps_16_bit_states():
    # NeMo Automodel with model.torch_dtype bfloat16 and torch.optim (no fp32 master copy):
    # FSDP2 shards the bf16 parameters, gradients and Adam moments as they are: 2 + 2 + 4 B
    fsdp2 = dict(data_parallel_size=4, zero_stage=3, use_torch_fsdp2=True)
    fp32 = model_states(_cfg(**fsdp2))
    pure = model_states(_cfg(param_precision="pure", **fsdp2))
    assert (pure.weights * 2, pure.grads * 2, pure.optimizer * 2) == (
        fp32.weights,
        fp32.grads,
        fp32.optimizer,
    )


def test_unknown_dtype_is_one_line():
    cfg = _cfg(use_precision_aware_optimizer=True, exp_avg_dtype="int4")
    with pytest.raises(ConfigError, match="exp_avg_dtype 'int4' is not one of"):
        model_states(cfg)


def _moe(dispatcher: str) -> Config:
    m = ModelConfig(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        ffn_hidden_size=512,
        vocab_size=1024,
        seq_length=128,
        micro_batch_size=1,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=256,
        bf16=True,
        moe_token_dispatcher_type=dispatcher,
    )
    return Config(m, ParallelConfig(data_parallel_size=2, expert_model_parallel_size=2))


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_dispatcher_buffer_term_is_allgathers_only(dispatcher):
    gathered = estimate(_moe("allgather"))
    assert gathered.dispatcher_buffers_bytes == 2 * 128 * 2 * 256
    assert any("allgather dispatcher" in s for s in gathered.overhead_assumptions)
    other = estimate(_moe(dispatcher))
    assert other.dispatcher_buffers_bytes == 0
    said = [s for s in other.overhead_assumptions if "dispatcher" in s]
    assert said == [
        f"{dispatcher} dispatcher (moe_token_dispatcher_type): its communication buffers "
        "are not modelled"
    ]


def test_fsdp2_under_pipeline_parallelism_keeps_the_stage_gathered():
    # torchtitan's fsdp_reshard_after_forward "default" is `not pp_enabled`
    # (torchtitan/distributed/fsdp.py) and NeMo Automodel does the same: with PP the stage's
    # parameters stay gathered (16-bit) from forward to backward, not one unit at a time
    from recompute_kit.memory.model_states import (
        _rank_parameters,
        padded_vocab_size,
        rank_parameters,
    )

    base = dict(data_parallel_size=4, zero_stage=3, use_torch_fsdp2=True)
    cfg = _cfg(pipeline_model_parallel_size=2, **base)
    piped = model_states(cfg)
    params = rank_parameters(cfg)
    m = cfg.model
    unit = max(_rank_parameters(cfg, 0)["largest_layer"], padded_vocab_size(m, 1) * m.hidden_size)
    # the stage's 16-bit parameters, and one unit's gradients (bf16: 2 B each)
    assert piped.gathered_params == round(2 * (params["dense"] + params["expert"]) + 2 * unit)
    # without PP: one unit's parameters and gradients, as before
    assert model_states(_cfg(**base)).gathered_params == round(2 * 2 * unit)
