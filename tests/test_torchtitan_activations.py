"""torchtitan's activations (memory/torchtitan.py): estimate vs torchtitan's own modules.

The measured tests build torchtitan v0.2.2's Llama-3 TransformerBlock and wrap it with its own
AC code (`torchtitan.distributed.activation_checkpoint`, the save list of
`torchtitan.models.llama3.infra.parallelize`); they skip where torchtitan is not importable
(`pip install --target /tmp/titan-site --no-deps torchtitan==0.2.2` plus its imports, then
PYTHONPATH). Retained bytes are read with the kit's LiveTensorTracker: every storage made in
the forward and alive after it, the block's output excepted (the next block's input).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from recompute_kit.config import Config, ModelConfig, ParallelConfig, parse_spec
from recompute_kit.memory.estimate import estimate
from recompute_kit.memory.measure import LiveTensorTracker

TOML_70B = os.path.join(os.path.dirname(__file__), "sources/corpus/torchtitan/llama3_70b.toml")

# A small Llama-3 shape: GQA (8 heads, 2 KV heads), FFN 4h -> 2/3 -> multiple of 64 = 704.
DIM, HEADS, KV_HEADS, FFN, BATCH, SEQ = 256, 8, 2, 704, 2, 64


def _config(spec: str, layers: int) -> Config:
    model = ModelConfig(
        num_layers=layers,
        hidden_size=DIM,
        num_attention_heads=HEADS,
        num_query_groups=KV_HEADS,
        ffn_hidden_size=FFN,
        seq_length=SEQ,
        micro_batch_size=BATCH,
        vocab_size=512,
        normalization="RMSNorm",
        swiglu=True,
        add_bias_linear=False,
        position_embedding_type="rope",
        transformer_impl="local",
        attention_backend="flash",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        loss_implementation="torchtitan",  # what sources/torchtitan.py sets
    )
    return Config(model=model, parallel=ParallelConfig(), recompute=parse_spec(spec))


def _estimated_layers(spec: str, layers: int) -> float:
    e = estimate(_config(spec, layers))
    return e.per_layer_activation_bytes * layers


def test_torchtitan_run_is_not_sized_as_megatron():
    """Llama-3.1-70B from torchtitan's own 70B TOML at 16k, TP8 (SP): without AC, the
    PrepareModuleInput all-gathers make wq/wk/wv and w1/w3 save the full-sequence norm output
    on every rank (2 x b s h x 2 B); Megatron's SP saves the s/t shard. Before, the kit counted
    Megatron's 0.977 GiB per layer; torchtitan keeps 1.258 GiB."""
    from recompute_kit.sources.resolve import resolve

    cfg = resolve([TOML_70B], overrides={"seq_length": 16384, "micro_batch_size": 1}).config
    cfg = dataclasses.replace(cfg, recompute=parse_spec("none"))
    e = estimate(cfg)
    tokens, h = 16384, 8192
    assert e.modules["qkv"] == pytest.approx(
        2 * tokens * h, rel=1e-12
    )  # gathered: not divided by TP 8
    assert e.modules["mlp"] >= 2 * tokens * h
    # The same run counted as Megatron-Core would keep it (what the kit did before)
    as_megatron = dataclasses.replace(cfg.model, loss_implementation="megatron")
    megatron = estimate(dataclasses.replace(cfg, model=as_megatron))
    assert megatron.modules["qkv"] < 2 * tokens * h / 4
    assert e.per_layer_activation_bytes > megatron.per_layer_activation_bytes
    # gathered inputs 512 MiB, fp32 norms 256 MiB, q k v out 72 MiB, SwiGLU 448 MiB; plus the
    # logsumexp (8 local heads) and the norms' 1/rms rows
    small = 4 * tokens * 8 + 2 * 4 * tokens / 8
    assert e.per_layer_activation_bytes == pytest.approx(1288 * 2**20 + small, rel=1e-12)


def test_op_sac_keeps_every_second_mm_and_the_full_sequence_partial_sums():
    """The "op" policy at TP8: the odd-numbered mms (wq, wv, w1, w2) are cached, and w2's
    output is a partial sum over the full sequence (before the reduce-scatter)."""
    cfg = _config("selective:layernorm", 2)
    m = dataclasses.replace(cfg.model, seq_length=128, hidden_size=512, ffn_hidden_size=1024)
    p = ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True)
    e = estimate(dataclasses.replace(cfg, model=m, parallel=p))
    tokens, B = BATCH * 128, 2
    assert e.modules["mlp"] == B * tokens * (1024 // 2) + B * tokens * 512 + B * tokens * 512 / 2
    assert e.modules["proj"] == B * tokens * 512 / 2  # wo is recomputed; its reduce-scatter not
    assert e.modules["residual"] == B * tokens * 512 / 2  # the block's (sequence-sharded) input


# -- measured against torchtitan's own modules -------------------------------------------------


def _torchtitan():
    try:
        from torchtitan.distributed import activation_checkpoint as ac
        from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list
        from torchtitan.models.llama3.model import model as llama
        from torchtitan.models.llama3.model.args import TransformerModelArgs
    except Exception as exc:  # not installed, or one of its imports missing
        pytest.skip(f"torchtitan not importable: {exc}")
    return ac, _op_sac_save_list, llama, TransformerModelArgs


def _apply_ac(ac, model, mode: str, option: str, save_list, cpu_flash_as_cuda: bool = True):
    """torchtitan's own `apply_ac` on `model` (its `_layer_sac_count` reset, as in a fresh
    process); "none" leaves the model as it is."""
    if mode == "none":
        return
    from torchtitan.config.job_config import ActivationCheckpoint

    if cpu_flash_as_cuda:
        # On CPU SDPA runs _scaled_dot_product_flash_attention_for_cpu, which the save list
        # (written for CUDA's flash/efficient/cuDNN kernels) does not name: add it as the
        # stand-in for the CUDA flash kernel the list names.
        save_list = save_list | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    ac._layer_sac_count = 0
    ac.apply_ac(
        model,
        ActivationCheckpoint(mode=mode, selective_ac_option=option),
        op_sac_save_list=save_list,
    )


def _measure(mode: str, option: str, layers: int, cpu_flash_as_cuda: bool = True) -> int:
    """Bytes `layers` torchtitan blocks keep after the forward, wrapped by torchtitan's
    `apply_ac` (its `_layer_sac_count` reset, as in a fresh process)."""
    ac, save_list, llama, Args = _torchtitan()
    args = Args(
        dim=DIM,
        n_layers=layers,
        n_heads=HEADS,
        n_kv_heads=KV_HEADS,
        vocab_size=512,
        multiple_of=64,
        max_seq_len=SEQ,
    )
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict(
        {str(i): llama.TransformerBlock(i, args) for i in range(layers)}
    ).to(torch.bfloat16)
    # RoPE's table is a model buffer in torchtitan (model state, not an activation).
    model.register_buffer("freqs_cis", llama.precompute_freqs_cis(DIM // HEADS, SEQ))
    _apply_ac(ac, model, mode, option, save_list, cpu_flash_as_cuda)
    x0 = torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    tracker = LiveTensorTracker(exclude=model)

    def forward() -> torch.Tensor:
        with tracker:
            h = x0.clone()  # the first block's input, made inside the tracked forward
            for block in model.layers.values():
                h = block(h, model.freqs_cis, None)
            return h

    out = forward()
    retained = tracker.live_bytes - out.untyped_storage().nbytes()
    out.float().sum().backward()  # the policy's recompute runs and matches the forward
    return retained


MODES = [
    # (torchtitan mode, selective_ac_option, the reader's Megatron spec, layers)
    ("none", "op", "none", 1),
    ("full", "op", "full:uniform:1", 2),
    ("selective", "op", "selective:layernorm", 2),
    ("selective", "2", "full:block:2", 4),  # every 2nd block of 4: two checkpointed
]


@pytest.mark.parametrize("mode,option,spec,layers", MODES)
def test_estimate_equals_torchtitan_measured(mode, option, spec, layers):
    measured = _measure(mode, option, layers)
    assert _estimated_layers(spec, layers) == measured


def test_op_sac_on_cpu_recomputes_attention():
    """Without the CPU stand-in the policy recomputes CPU SDPA: the estimate (CUDA kernels)
    is then exactly SDPA's output and logsumexp higher."""
    measured = _measure("selective", "op", 1, cpu_flash_as_cuda=False)
    sdpa = 2 * BATCH * SEQ * DIM + 4 * BATCH * SEQ * HEADS
    assert _estimated_layers("selective:layernorm", 1) - measured == sdpa


def test_torchtitan_tp_must_divide_the_kv_heads():
    # a skill trial: Llama 3 70B (8 KV heads) at TP 16 was planned as fitting; torchtitan shards
    # wk / wv column-wise, so a TP rank holds whole KV heads (Megatron replicates them instead)
    import dataclasses

    from recompute_kit.config import ConfigError
    from recompute_kit.memory.estimate import estimate
    from recompute_kit.presets import get_preset

    cfg = get_preset("llama3-70b").config()
    titan = cfg.__class__(
        dataclasses.replace(cfg.model, loss_implementation="torchtitan"),
        dataclasses.replace(
            cfg.parallel, tensor_model_parallel_size=16, pipeline_model_parallel_size=1
        ),
        cfg.recompute,
    )
    with pytest.raises(ConfigError, match="tensor_parallel_degree 16 must divide"):
        estimate(titan)
    megatron = titan.__class__(
        dataclasses.replace(titan.model, loss_implementation="megatron"),
        titan.parallel,
        titan.recompute,
    )
    estimate(megatron)  # Megatron-Core replicates the 8 groups over TP 16


def test_torchtitan_op_sac_on_mla_and_moe_layers_recomputes_matmuls():
    # a skill trial: torchtitan's deepseek_v3_16b.toml (op-level SAC) was priced at 0% recompute
    # FLOPs although the policy re-runs about every second matmul; half the matmul FLOPs of
    # each block is the stated approximation
    from pathlib import Path

    from recompute_kit.memory.flops import layer_forward_flops, recompute_flops
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "sources" / "corpus" / "torchtitan" / "deepseek_v3_16b.toml"
    cfg = resolve([str(toml)], overrides={"data_parallel_size": 32}).config
    m = cfg.model
    matmuls = ("qkv", "mla_up_proj", "proj", "mlp", "router", "experts", "shared_experts")
    want = 0.0
    for layer in range(m.num_layers):
        flops = layer_forward_flops(m, moe_layer=m.is_moe_layer(layer))
        want += 0.5 * sum(flops.get(k, 0.0) for k in matmuls)
    assert cfg.recompute.recompute_granularity == "selective"
    assert recompute_flops(cfg) == pytest.approx(want)


# -- Qwen3: q/k norms and a rotate_half RoPE (torchtitan/models/qwen3/model/model.py) ----------
# head_dim 64 beside dim 256: Qwen3 sets head_dim on its own (q is 8 x 64 = 512 wide)
QWEN3_HEAD_DIM = 64
# torchtitan 0.2.2's Qwen3 TransformerBlock measured on CPU with _measure_qwen3 below (bytes
# kept after the forward): kept here so the estimate is checked where torchtitan is absent too
QWEN3_MEASURED = {
    ("none", "op", 1): 2385920,
    ("selective", "op", 2): 1220608,
    ("full", "op", 2): 131072,
}


def _qwen3_config(spec: str, layers: int) -> Config:
    cfg = _config(spec, layers)
    model = dataclasses.replace(cfg.model, kv_channels=QWEN3_HEAD_DIM, qk_layernorm=True)
    return dataclasses.replace(cfg, model=model)


def _measure_qwen3(mode: str, option: str, layers: int) -> int:
    ac, _, _, _ = _torchtitan()
    from torchtitan.models.qwen3.infra.parallelize import _op_sac_save_list
    from torchtitan.models.qwen3.model import model as qwen
    from torchtitan.models.qwen3.model.args import Qwen3ModelArgs

    args = Qwen3ModelArgs(
        dim=DIM,
        n_layers=layers,
        n_heads=HEADS,
        n_kv_heads=KV_HEADS,
        head_dim=QWEN3_HEAD_DIM,
        hidden_dim=FFN,
        vocab_size=512,
        max_seq_len=SEQ,
    )
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict(
        {str(i): qwen.TransformerBlock(i, args) for i in range(layers)}
    ).to(torch.bfloat16)
    model.register_buffer("rope_cache", qwen.precompute_rope_cache(QWEN3_HEAD_DIM, SEQ))
    _apply_ac(ac, model, mode, option, _op_sac_save_list)
    x0 = torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16, requires_grad=True)
    tracker = LiveTensorTracker(exclude=model)
    with tracker:
        h = x0.clone()
        for block in model.layers.values():
            h = block(h, model.rope_cache, None)
    retained = tracker.live_bytes - h.untyped_storage().nbytes()
    h.float().sum().backward()
    return retained


QWEN3_MODES = [("none", "op", "none", 1), ("selective", "op", "selective:layernorm", 2)]
QWEN3_MODES += [("full", "op", "full:uniform:1", 2)]


@pytest.mark.parametrize("mode,option,spec,layers", QWEN3_MODES)
def test_qwen3_estimate_equals_what_torchtitan_kept(mode, option, spec, layers):
    # A skill trial (torchtitan's qwen3_32b.toml): Qwen3's blocks fell back to Megatron's
    # accounting, so torchtitan's single selective mode came out different per module list
    estimated = estimate(_qwen3_config(spec, layers)).per_layer_activation_bytes * layers
    assert estimated == QWEN3_MEASURED[(mode, option, layers)]


@pytest.mark.parametrize("mode,option,spec,layers", QWEN3_MODES)
def test_qwen3_measured_again(mode, option, spec, layers):
    assert _measure_qwen3(mode, option, layers) == QWEN3_MEASURED[(mode, option, layers)]
