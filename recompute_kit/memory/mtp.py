"""Multi-token prediction (MTP): what its layers keep on the pipeline stage that holds them, as
Megatron-Core 0.16.1 runs them (`transformer/multi_token_prediction.py`, `GPTModel._postprocess`;
checked against the real engine in tests/test_megatron_parity.py).

Per MTP layer and micro-batch, on that stage:
* the shared embedding looks up the token ids rolled one place left (`roll_tensor`): what the
  first stage's lookup keeps, except that the rolled position ids are a whole [b, s] tensor;
* enorm (on that embedding) and hnorm (on the previous depth's hidden states) keep what a norm
  keeps; their concatenation [s, b, 2h] is the input eh_proj keeps;
* one transformer layer, with the selective recompute of the decoder's layers; with sequence
  parallelism its input is a view of eh_proj's gathered output, so what saves that input
  keeps the whole [s, b, h] (measured: the local spec's input norm);
* the MTP final norm keeps what a norm keeps;
* the output layer keeps its input: the main output layer and each MTP depth's read slices of
  one concatenation of the 1 + D hidden states, so the output's input grows by D copies;
* the loss keeps what the main loss keeps, plus Megatron-LM's fp32 loss mask rolled left, the
  per-token loss the auto-scaler (MTPLossAutoScaler) keeps and the token count.

Full recompute: MultiTokenPredictionLayer checkpoints eh_proj, its norms, the transformer layer
and the final norm as one unit only with recompute_method uniform (and asserts
recompute_num_layers == 1); the checkpoint keeps its inputs (the hidden states and the
embedding). With method block Megatron warns and runs the layer without recompute, and since
granularity is full, without selective recompute either. Outside training nothing is
checkpointed.

Only Megatron's engine builds MTP layers (Hugging Face's DeepSeek-V3 and torchtitan read
num_nextn_predict_layers but build none): other engines get no MTP term.
"""

from __future__ import annotations

from ..config import Config, ModelConfig, ParallelConfig, RecomputeConfig
from ..config.pipeline_layout import expand_layout

STAT_BYTES = 4  # fp32: the loss mask, the per-token MTP loss, the token count
INDEX_BYTES = 8  # int64 position ids


def mtp_location(m: ModelConfig, p: ParallelConfig) -> tuple[int, int] | None:
    """(pipeline rank, virtual chunk) of the MTP block, or None without MTP: where
    pipeline_model_parallel_layout puts its `m`, else the last stage's last chunk
    (`mtp_on_this_rank`, `get_mtp_num_layers_to_build`)."""
    if not m.mtp_num_layers:
        return None
    pp = p.pipeline_model_parallel_size
    if p.pipeline_model_parallel_layout:
        stages = expand_layout(p.pipeline_model_parallel_layout)
        for k, symbols in enumerate(stages):
            if "m" in symbols:
                return k % pp, k // pp
    vpp = (p.virtual_pipeline_model_parallel_size or 1) if pp > 1 else 1
    return pp - 1, vpp - 1


def mtp_layer_is_moe(m: ModelConfig, chunk_layers: list[int]) -> bool:
    """Megatron-LM builds each MTP layer from the spec of the last decoder layer of the chunk
    that holds MTP (gpt_builders: `get_gpt_mtp_block_spec(config, transformer_layer_spec)`,
    `spec.layer_specs[-1]`); a chunk without decoder layers gets a MoE layer's spec when the
    model has experts."""
    if chunk_layers:
        return m.is_moe_layer(chunk_layers[-1])
    return bool(m.num_moe_experts)


def mtp_activation_bytes(
    config: Config,
    dtype_bytes: int,
    edges: dict,
    moe_layer: bool,
    training: bool = True,
) -> dict[str, float]:
    """Bytes the MTP block keeps for backward on its stage, for one micro-batch, per part:
    `mtp_embedding`, `mtp_layers` (norms, eh_proj and the transformer layers, or the
    checkpoints' inputs under full recompute), `mtp_output`, `mtp_loss`. `edges` is
    estimate.edge_bytes for the same config and dtype (Megatron's engine)."""
    from .estimate import layer_activation_bytes  # estimate imports this module

    m, p, rc = config.model, config.parallel, config.recompute
    depth = m.mtp_num_layers or 0
    cp = p.context_parallel_size
    tokens = m.micro_batch_size * m.seq_length // cp
    hidden = edges["output"]  # one [s, b, h] tensor in the activation dtype (sequence-sharded)
    embedding = edges["embedding"]
    if m.position_embedding_type == "learned_absolute" and cp == 1:
        # the first stage keeps one broadcast row of position ids; the rolled copy is whole
        embedding += INDEX_BYTES * (tokens - m.seq_length)
    if training and rc.recompute_granularity == "full" and rc.recompute_method == "uniform":
        first = hidden
        if rc.distribute_saved_activations and not p.sequence_parallel:
            first /= p.tensor_model_parallel_size  # CheckpointFunction splits its first input
        layer = first + hidden  # the checkpoint's inputs: hidden states, embedding
    else:
        # block (or none): full granularity turns the layer's selective recompute off
        layer_rc = RecomputeConfig() if rc.recompute_granularity == "full" else rc
        roles = layer_activation_bytes(m, layer_rc, p, dtype_bytes, moe_layer, training)
        layer = 3 * edges["final_norm"] + 2 * hidden + sum(roles.values())
        # With SP the layer's input is a slice of eh_proj's gathered [s, b, h] output
        # (scatter_to_sequence_parallel_region returns a view): what saves it keeps all of it.
        layer += hidden * (p.tensor_model_parallel_size - 1) if p.sequence_parallel else 0.0
    loss = edges["loss"] + 2 * STAT_BYTES * tokens + STAT_BYTES
    return {
        "mtp_embedding": depth * embedding,
        "mtp_layers": depth * layer,
        "mtp_output": depth * hidden,
        "mtp_loss": depth * loss,
    }
