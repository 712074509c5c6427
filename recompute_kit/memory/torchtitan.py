"""What a torchtitan run keeps for backward, per rank: its Llama-3 dense block under its own
tensor-parallel plan and activation-checkpointing modes (torchtitan v0.2.2, the version the
reader reads, `sources/torchtitan.py`).

Sources, at tag v0.2.2:
* the block: `torchtitan/models/llama3/model/model.py` (`nn.RMSNorm`; wq/wk/wv; RoPE through a
  complex multiply whose only saved operand is the frequency table; SDPA, causal; wo;
  `w2(silu(w1(x)) * w3(x))`), no biases, no dropout;
* the TP plan: `torchtitan/models/llama3/infra/parallelize.py` `apply_tp`: SequenceParallel on
  both norms, then `PrepareModuleInput(Shard(1) -> Replicate())` before the attention and the
  feed-forward. The all-gathered, full-sequence norm output is what wq/wk/wv (and w1/w3) save,
  on every TP rank: b x s x h, not Megatron's b x s/t x h (Megatron re-gathers in backward).
  wo and w2 are RowwiseParallel with a reduce-scatter to Shard(1). TP always implies SP.
  The output head is ColwiseParallel with `input_layouts=Shard(1)`: it too saves the gathered
  final-norm output;
* the AC modes: `torchtitan/distributed/activation_checkpoint.py`. `full` and `selective` with
  a digit k wrap whole blocks in `checkpoint_wrapper` (every block / every k-th): such a block
  keeps its input only, which the estimator's full-recompute chunks already count. `selective`
  `op` wraps each block in selective AC whose policy MUST_SAVEs the outputs of the ops in
  parallelize.py's `_op_sac_save_list` (aten.mm, the SDPA kernels, reduce_scatter_tensor,
  aten.max, flex/varlen attention, compiled code) except every second aten.mm of the block's
  forward (a per-forward counter: the 2nd, 4th, ... mm are recomputed). The checkpoint keeps
  the block's input besides those cached outputs; everything else is recomputed. The cache
  keeps each output whether backward needs it or not (w2's output, for one).
* FSDP2 shards parameters, gradients and optimizer states (memory/model_states.py); it does
  not touch activations.

The reader maps torchtitan's modes to Megatron's settings (none -> no recompute; full ->
full:uniform:1; every k-th block -> full:block:N; "op" -> selective), so the granularity names
the mode here: "selective" is always the per-op policy (torchtitan has no per-module choice).

Assumptions, said aloud: the SDPA kernel is flash/cuDNN/efficient attention (`attn_type`
"sdpa" on CUDA), which saves q, k, v, its output (in [b, s, heads, d] memory, which wo reads
without a copy) and an fp32 logsumexp per head and row; its RNG seed/offset tensors are a few
bytes and not counted. RMSNorm is torch's composite `rms_norm` (what CPU runs and the
estimator assumes for torch norms elsewhere): an fp32 copy of its input, the fp32 normalized
input and fp32 1/rms per row; a fused CUDA rms_norm, where torch dispatches to it, keeps less.
Checked on CPU against torchtitan's own modules in tests/test_torchtitan_activations.py.
Dense Llama-3-style blocks and Qwen3's (q/k norms: `qwen3_extra_bytes`); MoE and MLA blocks
keep Megatron's accounting.
"""

from __future__ import annotations

from ..config import ModelConfig, ParallelConfig, RecomputeConfig

TT_VERSION = "v0.2.2"
STAT_BYTES = 4  # fp32
INDEX_BYTES = 8  # int64
MASK_BYTES = 1  # bool
LSE_BYTES = 4  # flash attention's fp32 logsumexp


def applies(m: ModelConfig, moe_layer: bool) -> bool:
    """Whether this module models the layer: a dense Llama-3 block, or Qwen3's (the same with
    q/k norms: torchtitan's dense models with qk_layernorm are its qwen3 family)."""
    return not (moe_layer or m.multi_latent_attention)


def qwen3_extra_bytes(m: ModelConfig, p: ParallelConfig, dtype_bytes: int) -> float:
    """What torchtitan's Qwen3 block keeps beyond the Llama-3 one without AC
    (`torchtitan/models/qwen3/model/model.py`): its q_norm / k_norm (torch's composite
    rms_norm over head_dim: the fp32 input, the fp32 normalized input, fp32 1/rms per row of
    each head), and RoPE's cos and sin, cast to the activation dtype in every forward
    ([1, s, 1, head_dim] each; rotate_half's multiplies save them, not q or k)."""
    tokens, t, q, kv = _sizes(m, p)
    heads, kv_heads = m.num_attention_heads // t, max(m.kv_groups // t, 1)
    norms = 2 * STAT_BYTES * tokens * (q + kv) + STAT_BYTES * tokens * (heads + kv_heads)
    rope = 2 * dtype_bytes * (m.seq_length // p.context_parallel_size) * m.head_dim
    return norms + rope


def _sizes(m: ModelConfig, p: ParallelConfig) -> tuple[int, int, int, int]:
    """(tokens on this rank before TP's sequence split, tp, query width / tp, kv width / tp)."""
    t = p.tensor_model_parallel_size
    tokens = m.micro_batch_size * m.seq_length // p.context_parallel_size
    q = m.num_attention_heads * m.head_dim // t
    kv = m.kv_groups * m.head_dim // t
    return tokens, t, q, kv


def rms_norm_bytes(m: ModelConfig, rows: float) -> float:
    """torch's composite rms_norm: the fp32 (upcast) input, the fp32 normalized input that
    the weight multiplies, and fp32 1/rms per row (measured: 8 h + 4 bytes a row)."""
    return 2 * STAT_BYTES * rows * m.hidden_size + STAT_BYTES * rows


def block_bytes(
    m: ModelConfig, rc: RecomputeConfig, p: ParallelConfig, dtype_bytes: int
) -> dict[str, float]:
    """Bytes one dense block keeps for backward on one rank for one micro-batch, per role
    (Megatron's role names), without the full-checkpoint case (the caller's chunks)."""
    if rc.recompute_granularity == "selective":
        return op_sac_block_bytes(m, p, dtype_bytes)
    B = dtype_bytes
    tokens, t, q, kv = _sizes(m, p)
    h, f = m.hidden_size, m.ffn_size // t
    gathered = B * tokens * h  # PrepareModuleInput's Replicate(): the full sequence
    heads = m.num_attention_heads // t
    return {
        "layernorm": 2 * rms_norm_bytes(m, tokens / t),  # SequenceParallel: s/t rows
        # the input of wq, wk and wv (one tensor); Qwen3's q/k norms and RoPE tables
        "qkv": gathered + (qwen3_extra_bytes(m, p, B) if m.qk_layernorm else 0.0),
        # SDPA: q and k after RoPE, v, the output (wo's input too) and the logsumexp
        "core_attn": B * tokens * (2 * q + 2 * kv) + LSE_BYTES * tokens * heads,
        # w1/w3's input, silu's input (w1 out), silu(w1 out) and w3 out (the product's
        # operands), the product (w2's input)
        "mlp": gathered + 4 * B * tokens * f,
    }


def forward_mms(m: ModelConfig, p: ParallelConfig, dtype_bytes: int) -> list[tuple[str, float]]:
    """The block's aten.mm calls in forward order with their output bytes on one rank. wo and
    w2 output partial sums over the full sequence before the reduce-scatter."""
    B = dtype_bytes
    tokens, t, q, kv = _sizes(m, p)
    h, f = m.hidden_size, m.ffn_size // t
    return [
        ("qkv", B * tokens * q),  # wq
        ("qkv", B * tokens * kv),  # wk
        ("qkv", B * tokens * kv),  # wv
        ("proj", B * tokens * h),  # wo
        ("mlp", B * tokens * f),  # w1
        ("mlp", B * tokens * f),  # w3 (evaluated after silu(w1 x))
        ("mlp", B * tokens * h),  # w2
    ]


def op_sac_block_bytes(m: ModelConfig, p: ParallelConfig, dtype_bytes: int) -> dict[str, float]:
    """selective_ac_option "op": the block's input plus the cached outputs of the save list's
    ops, every second mm excepted."""
    B = dtype_bytes
    tokens, t, q, _ = _sizes(m, p)
    h = m.hidden_size
    heads = m.num_attention_heads // t
    roles = {"residual": B * tokens * h / t, "qkv": 0.0, "core_attn": 0.0, "proj": 0.0}
    roles["mlp"] = 0.0
    for count, (role, nbytes) in enumerate(forward_mms(m, p, dtype_bytes), start=1):
        if count % 2:
            roles[role] += nbytes
    roles["core_attn"] += B * tokens * q + LSE_BYTES * tokens * heads  # SDPA's output, lse
    if t > 1:  # the reduce-scatters after wo and w2 (Shard(1) outputs)
        roles["proj"] += B * tokens * h / t
        roles["mlp"] += B * tokens * h / t
    return roles


def edge_bytes(m: ModelConfig, p: ParallelConfig, dtype_bytes: int, loss: float) -> dict:
    """The embedding, final norm, output head and loss of a torchtitan model on one rank.
    Embedding: nn.Embedding keeps the int64 token ids; vocab-sharded (RowwiseParallel, TP > 1)
    DTensor's masked lookup also keeps its shifted ids and out-of-range mask (from the plan,
    not measured). The final norm runs SequenceParallel; the output head saves the gathered
    full-sequence norm output. `loss`: loss_bytes' saved bytes (torch cross_entropy on fp32
    logits, vocab-sharded under loss_parallel)."""
    tokens, t, _, _ = _sizes(m, p)
    ids = INDEX_BYTES * tokens
    if t > 1:
        ids += (INDEX_BYTES + MASK_BYTES) * tokens
    return {
        "embedding": ids,
        "final_norm": rms_norm_bytes(m, tokens / t),
        "output": dtype_bytes * tokens * m.hidden_size,
        "loss": loss,
    }
