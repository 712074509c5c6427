"""The memory model against measurement and against the paper.

* Real CPU runs of every runnable preset x every valid spec: the estimator's saved bytes match
  the measurement per role and per layer within 1%, its peak within 5%.
* Shape-only (meta device) runs of llama3-70b, mixtral-8x7b and deepseek-v3 x the main specs:
  same tolerances.
* Configured like Korthikanti et al. (GPT-3 175B, unfused attention, dropout, 16-bit), the
  per-layer estimate is the paper's Table 2 formula (plus the fp32 LayerNorm statistics the
  paper leaves out) for no parallelism, TP, TP+SP, selective and full recompute.
"""

import pytest

from recompute_kit.config import ConfigError, all_specs
from recompute_kit.memory.estimate import estimate, layer_activation_bytes
from recompute_kit.memory.measure import measure, measure_fake
from recompute_kit.presets import get_preset

RUNNABLE = ["tiny-gpt", "tiny-moe", "tiny-mla"]
GRID = [(name, spec) for name in RUNNABLE for spec in all_specs(get_preset(name).config())]


def close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(b), 1.0)


@pytest.mark.parametrize("name,spec", GRID, ids=[f"{n}-{s}" for n, s in GRID])
def test_estimate_matches_real_measurement(name, spec):
    cfg = get_preset(name).config().with_recompute(spec)
    measured = measure(cfg, device="cpu", dtype="fp32")
    est = estimate(cfg, dtype_bytes=4, engine="reference")  # the kit's own layers
    assert close(est.activation_bytes, measured.activation_bytes, 0.01)
    assert close(est.per_layer_activation_bytes, measured.per_layer_activation_bytes, 0.01)
    for role in set(measured.modules) | set(est.modules):
        assert close(est.modules.get(role, 0), measured.modules.get(role, 0), 0.01), role
    assert close(est.peak_activation_bytes, measured.peak_activation_bytes, 0.05)


def test_estimate_matches_each_layer_of_a_mixed_model():
    cfg = get_preset("tiny-moe").config().with_recompute("selective:moe_act,layernorm")
    measured = measure(cfg)
    m = cfg.model
    expected = [
        sum(
            layer_activation_bytes(
                m, cfg.recompute, cfg.parallel, 4, m.is_moe_layer(i), engine="reference"
            ).values()
        )
        for i in range(m.num_layers)
    ]
    assert measured.layers == pytest.approx(expected, rel=1e-9)
    assert measured.layers[0] != measured.layers[1]  # dense and MoE layers differ


FAKE_SPECS = {
    "llama3-70b": [
        "none",
        "selective",
        "selective:mlp,layernorm",
        "full:uniform:1",
        "full:uniform:2",
        "full:block:4",
    ],
    "mixtral-8x7b": ["none", "selective:moe_act,layernorm", "selective:moe", "full:uniform:1"],
    "deepseek-v3": [
        "none",
        "selective:mla_up_proj,moe_act,layernorm",
        "selective:moe",
        "full:uniform:1",
    ],
}
FAKE_GRID = [(n, s) for n, specs in FAKE_SPECS.items() for s in specs]


@pytest.mark.parametrize("name,spec", FAKE_GRID, ids=[f"{n}-{s}" for n, s in FAKE_GRID])
def test_estimate_matches_shape_only_measurement_of_full_size_models(name, spec):
    # One rank holding the whole model: the fake run has no parallelism.
    cfg = (
        get_preset(name)
        .config()
        .replace(
            tensor_model_parallel_size=1,
            pipeline_model_parallel_size=1,
            expert_model_parallel_size=1,
            sequence_parallel=False,
        )
        .with_recompute(spec)
    )
    measured = measure_fake(cfg)
    est = estimate(cfg, engine="reference")
    assert measured.device == "meta" and measured.scaled_from_layers <= 2
    assert close(est.activation_bytes, measured.activation_bytes, 0.01)
    assert close(est.peak_activation_bytes, measured.peak_activation_bytes, 0.05)


# ---- the paper's Table 2 ----------------------------------------------------------------------

GPT3 = get_preset("gpt3-175b").config().replace(pipeline_model_parallel_size=1)
M = GPT3.model
s, b, h, a = M.seq_length, M.micro_batch_size, M.hidden_size, M.num_attention_heads
sbh = s * b * h
LN_STATS = 2 * 2 * 4 * b * s  # two LayerNorms x (mean + rstd) x fp32, per token; not in the paper


def per_layer(t: int, sp: bool, spec: str) -> float:
    cfg = GPT3.replace(tensor_model_parallel_size=t, sequence_parallel=sp).with_recompute(spec)
    return estimate(cfg).per_layer_activation_bytes


def test_paper_setup_is_the_paper():
    assert (M.hidden_size, M.num_attention_heads, M.num_layers, M.seq_length) == (
        12288,
        96,
        96,
        2048,
    )
    assert M.attention_backend == "unfused" and M.bf16 and M.hidden_dropout > 0
    assert 5 * a * s / h == 80  # the paper: "for GPT-3 175B, 5as/h = 80"


@pytest.mark.parametrize("t", [1, 2, 8])
def test_table2_tensor_parallel(t):
    expected = sbh * (10 + 24 / t + 5 * a * s / (h * t)) + LN_STATS
    assert per_layer(t, False, "none") == pytest.approx(expected, rel=1e-12)
    if t == 1:  # no parallelism: sbh(34 + 5as/h)
        assert per_layer(1, False, "none") == pytest.approx(sbh * (34 + 5 * a * s / h) + LN_STATS)


@pytest.mark.parametrize("t", [2, 8])
def test_table2_tensor_and_sequence_parallel(t):
    expected = sbh * (34 / t + 5 * a * s / (h * t)) + LN_STATS / t
    assert per_layer(t, True, "none") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [1, 8])
def test_table2_selective_recompute(t):
    assert per_layer(t, False, "selective") == pytest.approx(
        sbh * (10 + 24 / t) + LN_STATS, rel=1e-12
    )
    assert per_layer(t, True, "selective") == pytest.approx(sbh * 34 / t + LN_STATS / t, rel=1e-12)


def test_table2_full_recompute():
    assert per_layer(1, False, "full:uniform:1") == pytest.approx(2 * sbh, rel=1e-12)
    assert per_layer(8, True, "full:uniform:1") == pytest.approx(2 * sbh / 8, rel=1e-12)


def test_selective_saves_70_percent_for_gpt3_as_the_paper_says():
    full, selective = per_layer(8, True, "none"), per_layer(8, True, "selective")
    assert 1 - selective / full == pytest.approx(80 / 114, abs=0.002)  # 5as/h / (34 + 5as/h)


def test_pipeline_first_stage_holds_all_layers_worth():
    # 1F1B: the first stage keeps p micro-batches of L/p layers = L layers (Eq. 5), and with
    # interleaving x (1 + (p-1)/(p*m)).
    base = GPT3.replace(tensor_model_parallel_size=8, sequence_parallel=True)
    one = estimate(base.with_recompute("selective"))
    pp = estimate(base.replace(pipeline_model_parallel_size=8).with_recompute("selective"))
    layers = M.num_layers
    assert pp.per_layer_activation_bytes == pytest.approx(one.per_layer_activation_bytes)
    assert pp.activation_bytes == pytest.approx(
        pp.per_layer_activation_bytes * layers + estimate_embedding(base) * 8, rel=1e-9
    )
    vpp = estimate(
        base.replace(
            pipeline_model_parallel_size=8, virtual_pipeline_model_parallel_size=3
        ).with_recompute("selective")
    )
    # the layers x (1 + 7/24); the embedding is the first chunk's, which at the stage's peak
    # holds forwards 0-7 and 24-31 (Megatron's order: groups of pp=8 per chunk; 30 warm-up
    # forwards, then forward 30 and backward 0 (chunk 2), forward 31 (chunk 0) ...): 16
    layers_part = pp.per_layer_activation_bytes * layers * (1 + 7 / 24)
    assert vpp.activation_bytes == pytest.approx(
        layers_part + estimate_embedding(base) * 16, rel=1e-9
    )


def estimate_embedding(cfg) -> float:
    from recompute_kit.memory.estimate import edge_bytes

    return edge_bytes(cfg.model, cfg.parallel, 2)["embedding"]


# ---- model states -----------------------------------------------------------------------------


def test_model_state_bytes_follow_megatron_mixed_precision():
    cfg = (
        get_preset("llama3-70b")
        .config()
        .replace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    )
    est = estimate(cfg)
    params = est.weights_bytes / 2
    assert 70.0e9 < params < 71.5e9  # Llama-3 70B (+ our learned positions: 8192 x 8192)
    assert est.grads_bytes == pytest.approx(4 * params, rel=1e-9)
    assert est.optimizer_bytes == pytest.approx(12 * params, rel=1e-9)
    sharded = estimate(cfg.replace(data_parallel_size=8, use_distributed_optimizer=True))
    assert sharded.optimizer_bytes == pytest.approx(12 * params / 8, rel=1e-9)


def test_parameter_count_matches_the_built_model():
    import torch

    from recompute_kit.layers import GPTModel
    from recompute_kit.memory.model_states import parameter_counts

    for name in RUNNABLE:
        cfg = get_preset(name).config()
        with torch.device("meta"):
            model = GPTModel(cfg)
        assert sum(parameter_counts(cfg.model).values()) == sum(
            p.numel() for p in model.parameters()
        ), name


def test_pipeline_layout_string_places_layers_per_virtual_stage():
    """Megatron-Core's pipeline_model_parallel_layout (DeepSeek-V3's Bridge recipe writes
    `Et|(tt|)*30mL`): virtual stage k is chunk k // PP of rank k % PP; 61 layers on PP8 x VPP4
    leave 7 on rank 0 (1 + 2 + 2 + 2), 6 on rank 7 (2 + 2 + 2 + 0) and 8 on the others."""
    from recompute_kit.config import Config
    from recompute_kit.memory.layout import layers_per_stage, pipeline_layout

    cfg = Config().replace(
        num_layers=61,
        pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=4,
        pipeline_model_parallel_layout="Et|(tt|)*30mL",
    )
    assert layers_per_stage(cfg.model, cfg.parallel) == [7, 8, 8, 8, 8, 8, 8, 6]
    layout = pipeline_layout(cfg.model, cfg.parallel)
    assert layout[0][0] == [0] and layout[1][0] == [1, 2] and layout[7][3] == []
    assert layout[0][1] == [15, 16]  # virtual stage 8: after 1 + 7 x 2 layers
    short = cfg.replace(pipeline_model_parallel_layout="E|(tt|)*30mL")
    with pytest.raises(ConfigError, match="places 60 transformer layers, the model has 61"):
        layers_per_stage(short.model, short.parallel)


@pytest.mark.parametrize("ffn_over_h", [3, 4, 8])
@pytest.mark.parametrize("t", [2, 8])
def test_megatron_lm_theoretical_memory_formula(ffn_over_h, t):
    # Megatron-LM megatron/training/theoretical_memory_usage.py compute_activation_memory
    # (Table 2 with TP + SP and selective recompute, any FFN width): per layer
    # s*b*h*(18 + 4*ffn/h) / t bytes; the kit adds the norms' fp32 statistics it leaves out.
    cfg = GPT3.replace(
        ffn_hidden_size=ffn_over_h * h, tensor_model_parallel_size=t, sequence_parallel=True
    ).with_recompute("selective")
    formula = sbh * (18 + 4 * ffn_over_h) / t
    assert estimate(cfg).per_layer_activation_bytes == pytest.approx(
        formula + LN_STATS / t, rel=1e-12
    )


def test_a_stage_never_holds_more_micro_batches_than_the_step_has():
    # Megatron's 1F1B warm-up is min(pp - rank - 1, num_microbatches) (schedules.py): with 2
    # micro-batches a step (global 8 / (micro 2 x DP 2)) a 4-stage pipeline holds 2, 2, 2, 1,
    # not 4, 3, 2, 1 (a skill trial: Pai-Megatron-Patch's DeepSeek-V2-Lite launch, stage 0's
    # activations counted twice). Unknown global batch: the steady state, as before.
    from recompute_kit.config import ParallelConfig
    from recompute_kit.memory.layout import micro_batches_in_flight

    def pipeline(**kw):
        return ParallelConfig(pipeline_model_parallel_size=4, data_parallel_size=2, **kw)

    few, unknown, many = pipeline(global_batch_size=8), pipeline(), pipeline(global_batch_size=64)
    assert [micro_batches_in_flight(few, s, 2) for s in range(4)] == [2, 2, 2, 1]
    assert [micro_batches_in_flight(unknown, s, 2) for s in range(4)] == [4, 3, 2, 1]
    assert [micro_batches_in_flight(many, s, 2) for s in range(4)] == [4, 3, 2, 1]
    # interleaved: the chunks in flight are capped at the step's chunk-micro-batches too
    vpp = ParallelConfig(
        pipeline_model_parallel_size=4,
        virtual_pipeline_model_parallel_size=2,
        data_parallel_size=1,
        global_batch_size=4,
    )
    assert micro_batches_in_flight(vpp, 0, 1) == min(3 * 2 + 4 + 1, 4 * 2) / 2


# ---- the interleaved schedule, chunk by chunk -------------------------------------------------


class _P2P:  # what Megatron's get_pp_rank_microbatches asks of a p2p communicator
    def __init__(self, pp: int, rank: int, vpp: int) -> None:
        self.pp_group = type("G", (), {"size": lambda _: pp, "rank": lambda _: rank})()
        self.virtual_pipeline_model_parallel_size = vpp


@pytest.mark.parametrize("pp, vpp, step", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16), (4, 2, 6)])
def test_each_chunk_holds_what_megatrons_interleaved_order_leaves_it(pp, vpp, step):
    # Megatron's own order of work (schedules.py get_schedule_table, get_pp_rank_microbatches,
    # get_model_chunk_id: a backward runs on the mirror chunk), replayed with chunks of
    # different sizes; the kit's counts must give the same peak on every rank.
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    from recompute_kit.config import ParallelConfig
    from recompute_kit.memory.layout import chunk_micro_batches_at_peak

    p = ParallelConfig(
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        data_parallel_size=1,
        global_batch_size=step,
    )
    sizes = [3.0 + 2 * c for c in range(vpp)]
    sizes[-1] += 50.0  # a loss on the last chunk
    for rank in range(pp):
        table = [c for _, c in schedules.get_schedule_table(step, vpp, pp)]
        total, _, warmup, _ = schedules.get_pp_rank_microbatches(
            step, vpp, pp, p2p_communicator=_P2P(pp, rank, vpp)
        )
        held, peak = [0] * vpp, 0.0
        order = [("F", v) for v in range(warmup)]
        for k in range(total - warmup):
            order += [("F", warmup + k), ("B", k)]
        for kind, v in order:
            held[table[v] if kind == "F" else vpp - 1 - table[v]] += 1 if kind == "F" else -1
            peak = max(peak, sum(n * s for n, s in zip(held, sizes, strict=True)))
        counts = chunk_micro_batches_at_peak(p, rank, sizes)
        assert sum(n * s for n, s in zip(counts, sizes, strict=True)) == peak, rank


def test_the_last_stage_holds_one_micro_batchs_logits_under_interleaving():
    # A skill trial (Megatron-Bridge's GLM-5 H100 recipe, PP13 VPP2): the loss's fp32 logits were
    # counted for the stage's average 7 micro-batches in flight; the last chunk, which computes
    # the loss, runs each micro-batch's forward and backward back to back: one at a time.
    base = GPT3.replace(tensor_model_parallel_size=8, sequence_parallel=True)
    plain = estimate(base.replace(pipeline_model_parallel_size=8), stage=7)
    vpp = estimate(
        base.replace(pipeline_model_parallel_size=8, virtual_pipeline_model_parallel_size=3),
        stage=7,
    )
    assert plain.micro_batches_in_flight == 1
    assert vpp.micro_batches_in_flight == pytest.approx((2 * 8 + 1) / 3)
    assert vpp.loss_saved_bytes == plain.loss_saved_bytes > 0


def test_lora_under_sequence_parallelism_keeps_the_adapters_gathered_inputs():
    # A skill trial on Bridge's 70B LoRA recipe: with SP, the adapters on linear_qkv and
    # linear_fc1 gather the norm's output and LoRA-A keeps the whole sequence (Megatron-Bridge
    # peft/utils.py ParallelLinearAdapter.forward, sequence_parallel_input_regather False):
    # 2 x s x b x h x 2 B per dense layer (+40 GiB at 70B, 16k tokens), one under `mlp`
    # recompute (fc1's adapter is inside the checkpoint), nothing without SP.
    cfg = get_preset("llama3-8b").config().replace(
        tensor_model_parallel_size=8, sequence_parallel=True, data_parallel_size=1
    )
    m, rc, p = cfg.model, cfg.recompute, cfg.parallel
    full_seq = 2 * m.seq_length * m.micro_batch_size * m.hidden_size  # bf16

    def layer(parallel, recompute=rc):
        return sum(layer_activation_bytes(m, recompute, parallel, 2, moe_layer=False).values())

    lora = cfg.replace(frozen_base=True).parallel
    assert layer(lora) - layer(p) == 2 * full_seq
    mlp = cfg.with_recompute("selective:mlp").recompute
    assert layer(lora, mlp) - layer(p, mlp) == full_seq
    no_sp = cfg.replace(sequence_parallel=False)
    assert layer(no_sp.replace(frozen_base=True).parallel) == layer(no_sp.parallel)
    # peft.sequence_parallel_input_regather=true: the local shard kept, gathered in backward
    regather = cfg.replace(frozen_base=True, lora_input_regather=True).parallel
    assert layer(regather) - layer(p) == 2 * full_seq // 8


def test_trl_chunked_nll_holds_two_fp32_weight_copies_at_its_peak():
    # A skill trial on Gemma 3 27B (vocabulary 262208): TRL's chunked_nll was priced as Liger's
    # fused loss (a 16-bit weight gradient kept, one chunk's logits as the transient, growing
    # with the micro-batch). TRL's `_chunk` runs `h.float() @ w.float().t()` under
    # checkpoint in 256-token chunks (sft_trainer.py): backward holds the weight's fp32 copy
    # and that copy's fp32 gradient, and a chunk's logits do not grow with the batch.
    from recompute_kit.memory.estimate import loss_bytes

    cfg = get_preset("llama3-8b").config().replace(
        loss_implementation="hf",
        fused_linear_cross_entropy=True,
        fused_linear_cross_entropy_impl="trl_chunked_nll",
        data_parallel_size=1,
    )
    m, p = cfg.model, cfg.parallel
    v, h = m.vocab_size, m.hidden_size
    saved, transient = loss_bytes(m, p, 2)
    assert transient == 2 * 4 * v * h + 3 * 4 * 256 * v
    tokens = m.seq_length * m.micro_batch_size
    assert saved == 2 * tokens * h + 8 * tokens  # the hidden states and the int64 labels
    double = cfg.replace(micro_batch_size=2 * m.micro_batch_size).model
    assert loss_bytes(double, p, 2)[1] == transient  # the chunk is 256 tokens, whatever the batch
    liger = loss_bytes(cfg.replace(fused_linear_cross_entropy_impl="liger").model, p, 2)
    assert liger[1] < transient
    # and TRL's SFT script is read so (tests/data/launch/trl, its launch and Accelerate config)
    from pathlib import Path

    from recompute_kit.sources.resolve import resolve

    launch = Path(__file__).parent / "data" / "launch" / "trl" / "launch.sh"
    trl = resolve([str(launch)], model="Qwen/Qwen2.5-7B").config.model
    assert trl.fused_linear_cross_entropy
    assert trl.fused_linear_cross_entropy_impl == "trl_chunked_nll"


def test_the_report_breakdown_keeps_the_logits_and_loss_apart():
    """reports.memory_breakdown (the notebook's table and plot): the loss's saved bytes are their
    own row, not spread over the layers' roles (a skill trial: 'act:other' read 0 beside a
    1.96 GiB logits finding)."""
    from recompute_kit import reports

    cfg = get_preset("llama3-8b").config()
    e = estimate(cfg)
    parts = reports.memory_breakdown(cfg)
    assert parts["act:logits and loss"] == e.loss_saved_bytes > 0
    acts = sum(v for k, v in parts.items() if k.startswith("act:"))
    assert abs(acts - e.activation_bytes) <= len(parts)  # rounding only
    per_layer = sum(e.modules.values()) * cfg.model.num_layers * e.micro_batches_in_flight
    layers = acts - parts["act:logits and loss"] - parts["act:other (embedding, head)"]
    assert abs(layers - per_layer) <= len(parts)
