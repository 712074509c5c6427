"""The estimator against real Megatron-Core (the engine users run), per rank and per layer.

`recompute_kit.engines.megatron` builds Megatron-Core's GPTModel (local layer spec, unfused
attention) for a kit config and layout, runs one training forward per rank in a gloo group on
this CPU and records the bytes autograd keeps in each transformer layer. The estimator must give
the same bytes within 1% per layer. Cells the estimator does not match yet are listed with the
measured cause as strict xfails, so the day one starts to pass, the suite says so.
"""

from __future__ import annotations

import pytest

from recompute_kit.config import all_specs, parse_spec
from recompute_kit.engines import megatron as engine
from recompute_kit.memory.estimate import layer_activation_bytes, model_state_bytes
from recompute_kit.presets import get_preset

pytestmark = pytest.mark.skipif(
    not engine.available(), reason="megatron-core is not installed (make setup installs it)"
)

TOLERANCE = 0.01
# GQA, LayerNorm, GeLU, dropout 0.1, unfused attention. Without biases: Megatron-Core's mlp
# recompute recurses with them (biases save nothing for backward).
GPT = get_preset("tiny-gpt").config().replace(add_bias_linear=False)
MOE = get_preset("tiny-moe").config().replace(add_bias_linear=False)


def estimated_per_layer(config, rank, dtype: str) -> list[int]:
    m, B = config.model, 2 if dtype == "bf16" else 4
    return [
        round(
            sum(
                layer_activation_bytes(
                    m, config.recompute, config.parallel, B, m.is_moe_layer(i)
                ).values()
            )
        )
        for i in rank.layer_numbers
    ]


def assert_parity(config, dtype: str = "fp32") -> None:
    for rank in engine.measure(config, dtype):
        estimated = estimated_per_layer(config, rank, dtype)
        for layer, measured, est in zip(
            rank.layer_numbers, rank.saved_per_layer, estimated, strict=True
        ):
            assert abs(est - measured) <= TOLERANCE * measured, (
                f"rank {rank.rank} layer {layer}: Megatron-Core saved {measured} B, "
                f"the estimate says {est} B; Megatron per role: {rank.roles_per_layer[0]}"
            )


# Measured on megatron-core 0.16.1 and not yet in the estimator (the next step of the parity
# work); each reason is what the per-tensor measurement shows.
CORE_ATTN_STORAGE = (
    "checkpointed core_attn keeps Megatron's q copy and the whole fused QKV output (k and v "
    "are views of it), not q, k and v alone"
)
FP32_SOFTMAX = (
    "bf16 unfused softmax without the fused kernel: Megatron keeps an fp32 copy of the "
    "probabilities (attention_softmax_in_fp32) that the estimator does not count"
)
SELECTIVE = [
    pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=CORE_ATTN_STORAGE))
    if parse_spec(s).selects("core_attn")
    else s
    for s in all_specs(GPT)
    if not s.startswith("full")
]


@pytest.mark.parametrize("spec", SELECTIVE)
def test_dense_fp32_every_selective_spec(spec):
    assert_parity(GPT.with_recompute(spec))


LAYOUTS = {
    "tp2": dict(tensor_model_parallel_size=2),
    "tp2-sp": dict(tensor_model_parallel_size=2, sequence_parallel=True),
    "pp2": dict(pipeline_model_parallel_size=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("spec", ["none", "selective:mlp,layernorm"])
def test_dense_fp32_layouts(layout, spec):
    """Several gloo processes, one per rank; every rank's layers are checked."""
    assert_parity(GPT.replace(**LAYOUTS[layout]).with_recompute(spec))


@pytest.mark.xfail(strict=True, reason=FP32_SOFTMAX)
def test_dense_bf16_none():
    assert_parity(GPT.with_recompute("none"), "bf16")


@pytest.mark.xfail(
    strict=True,
    reason="MoE layers: Megatron's local spec (SequentialMLP, allgather dispatcher, torch "
    "RMSNorm saving its normalized output) keeps other tensors than the kit's MoE layer",
)
def test_moe_fp32_none():
    assert_parity(MOE.with_recompute("none"))


@pytest.mark.parametrize("bias", [True, False])
def test_weights_per_rank_equal_megatron_at_tp1(bias):
    config = GPT.replace(add_bias_linear=bias).with_recompute("none")
    (rank,) = engine.measure(config)
    weights, _, _ = model_state_bytes(config)
    assert weights == 4 * rank.parameters  # fp32 weights, exactly


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="Megatron replicates the position embedding, the norms and the row-parallel "
    "biases on every TP rank; the estimator divides every parameter by TP",
)
def test_weights_per_rank_equal_megatron_at_tp2():
    config = GPT.replace(add_bias_linear=True, tensor_model_parallel_size=2)
    weights, _, _ = model_state_bytes(config)
    for rank in engine.measure(config.with_recompute("none")):
        assert weights == 4 * rank.parameters
