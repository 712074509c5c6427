"""Megatron-LM's printed argument dump as a config (`recompute-kit read FILE`, `--config FILE`)."""

from __future__ import annotations

from pathlib import Path

from recompute_kit.sources import megatron_dump
from recompute_kit.sources.formats import best_format, read_file_text
from recompute_kit.sources.resolve import resolve

DATA = Path(__file__).parents[1] / "data"


def _read(path: Path):
    return read_file_text(path.read_text(), str(path))


def _origin(reading, key: str) -> tuple[str, str]:
    origin = reading.origins[key]
    return origin.kind, origin.key


def test_issue60_v1_cut_dump_reads_old_names_and_says_what_is_missing():
    # Megatron-LM v1 (issue #60): the dump is cut after `exit_interval`
    path = DATA / "read" / "mlm_issue60_args_cut.log"
    assert best_format(path.read_text(), str(path)) is megatron_dump
    r = _read(path)
    assert (r.framework, r.format) == ("megatron-lm", megatron_dump.FORMAT)
    # checkpoint_activations: every layer recomputed, in chunks of checkpoint_num_layers
    assert r.get("recompute_granularity") == "full"
    assert r.get("recompute_method") == "uniform"
    assert r.get("recompute_num_layers") == 1
    assert _origin(r, "recompute_num_layers") == ("file", "checkpoint_num_layers")
    assert r.get("distribute_saved_activations") is True
    # v1's batch_size is the batch per model instance; its model-parallel size is TP
    assert r.get("micro_batch_size") == 8
    assert (r.get("world_size"), r.get("tensor_model_parallel_size")) == (16, 2)
    # `using torch.float16 for parameters ...`: the --fp16 run
    assert (r.get("fp16"), r.get("bf16")) == (True, False)
    assert r.get("attention_dropout") == 0.1
    old = next(w for w in r.warnings if "old argument names" in w)
    assert "checkpoint_activations" in old and "distribute_checkpointed_activations" in old
    cut = next(w for w in r.warnings if "before its `end of arguments`" in w)
    assert "`exit_interval`" in cut
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
        assert name in cut
    resolved = resolve([str(path)], require_shape=False)
    assert resolved.reading.get("data_parallel_size") == 8  # 16 GPUs / TP 2
    assert resolved.reading.origins["data_parallel_size"].kind == "derived"


def test_issue92_quoted_header_and_query_key_layer_scaling():
    path = DATA / "read" / "mlm_issue92_args_cut.log"
    r = _read(path)
    assert r.format == megatron_dump.FORMAT
    assert r.get("data_parallel_size") == 1  # printed, as Megatron derived it
    assert _origin(r, "data_parallel_size") == ("file", "data_parallel_size")
    # apply_query_key_layer_scaling True: the softmax runs in fp32 (the dump prints False)
    assert r.get("attention_softmax_in_fp32") is True
    assert r.get("bias_activation_fusion") is True  # bias_gelu_fusion, no swiglu
    assert r.get("recompute_granularity") == "full"
    assert r.unused["data_path"] == ["/data/quxiaoru/Dataset/rev_gen/elec5/nei/graph_text_document"]
    assert any("stops at line 22 (`data_path`)" in w for w in r.warnings)


def test_issue495_part_of_a_dump_without_its_header():
    path = DATA / "read" / "mlm_issue495_args_part.log"
    r = _read(path)
    assert r.format == megatron_dump.FORMAT
    assert (r.get("hidden_size"), r.get("kv_channels"), r.get("hidden_dropout")) == (5120, 128, 0.1)
    assert "num_query_groups" not in r  # group_query_attention False: MHA
    assert any("no `---- arguments ----` line" in w for w in r.warnings)


def test_complete_dump_with_world_line_has_no_cut_warning():
    # reproduced with Megatron-LM core_v0.14.0's arguments.py (tests/data/rules/README.md)
    path = DATA / "rules" / "ex-args-local-v014-full.txt"
    r = _read(path)
    assert (r.get("recompute_granularity"), r.get("recompute_method")) == ("full", "uniform")
    assert r.get("recompute_num_layers") == 2
    assert r.get("world_size") == 8
    sizes = [r.get(k) for k in ("data_parallel_size", "tensor_model_parallel_size")]
    assert [*sizes, r.get("pipeline_model_parallel_size")] == [2, 2, 2]
    assert r.get("bf16") is True and r.get("grad_reduce_in_fp32") is True
    assert not any("end of arguments" in w or "old argument names" in w for w in r.warnings)


# --- a whole dump reads as the script it was printed for --------------------------------------

SCRIPT = """#!/bin/bash
torchrun --nproc-per-node 8 pretrain_gpt.py \\
  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\
  --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu \\
  --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \\
  --untie-embeddings-and-output-weights --seq-length 8192 --micro-batch-size 1 \\
  --tensor-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer --bf16 \\
  --recompute-granularity selective --recompute-modules core_attn mlp \\
  --attention-backend flash --tokenizer-type NullTokenizer --vocab-size 128256
"""

# What Megatron-LM's _print_args prints for that command (the resolved values), in its format
# (real-formats.md fmt-mlm-print-args-main: '  {} {} {}'.format(arg, '.' * (48 - len(arg)),
# value), sorted by the line lower-cased).
PRINTED = {
    "num_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "group_query_attention": True,
    "num_query_groups": 8,
    "ffn_hidden_size": 14336,
    "kv_channels": 128,
    "swiglu": True,
    "normalization": "RMSNorm",
    "position_embedding_type": "rope",
    "add_bias_linear": False,
    "untie_embeddings_and_output_weights": True,
    "seq_length": 8192,
    "encoder_seq_length": 8192,
    "micro_batch_size": 1,
    "tensor_model_parallel_size": 4,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "data_parallel_size": 2,
    "world_size": 8,
    "sequence_parallel": True,
    "use_distributed_optimizer": True,
    "bf16": True,
    "fp16": False,
    "recompute_granularity": "selective",
    "recompute_modules": ["core_attn", "mlp"],
    "recompute_method": None,
    "recompute_num_layers": None,
    "attention_backend": "AttnBackend.flash",
    "tokenizer_type": "NullTokenizer",
    "vocab_size": 128256,
    "padded_vocab_size": 128256,
    "virtual_pipeline_model_parallel_size": None,
    "num_experts": None,
    "fp8": None,
    "accumulate_allreduce_grads_in_fp32": True,
    "bias_swiglu_fusion": True,
    "bias_gelu_fusion": False,
    "masked_softmax_fusion": True,
    "apply_rope_fusion": True,
    "rank": 0,
}


def _dump(args: dict, end: bool = True) -> str:
    lines = [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()]
    out = ["------------------------ arguments ------------------------"]
    out += sorted(lines, key=lambda x: x.lower())
    if end:
        out.append("-------------------- end of arguments ---------------------")
    return "\n".join(out) + "\n"


def test_a_whole_dump_gives_the_config_of_its_script(tmp_path):
    script, dump = tmp_path / "train.sh", tmp_path / "train.log"
    script.write_text(SCRIPT)
    dump.write_text("[rank0]: " + _dump(PRINTED).replace("\n  ", "\n[rank0]:   "))
    from_script = resolve([str(script)])
    from_dump = resolve([str(dump)])
    assert from_dump.reading.format == megatron_dump.FORMAT
    # (the launcher's --nproc_per_node, a node's GPUs, is the script's alone: no argument)
    flat = {k: v for k, v in from_script.config.to_flat().items() if k != "gpus_per_node"}
    assert from_dump.config.to_flat() == {**flat, "gpus_per_node": None}
    assert not [w for w in from_dump.warnings if "dump" in w]
    assert all(
        o.kind == "file"
        for k, o in from_dump.reading.origins.items()
        if k in ("num_query_groups", "data_parallel_size", "recompute_modules", "vocab_size")
    )


def test_two_dumps_read_the_first(tmp_path):
    first = dict(PRINTED, micro_batch_size=2)
    text = _dump(first) + "restarting\n" + _dump(PRINTED)
    r = read_file_text(text, "two.log")
    assert r.get("micro_batch_size") == 2
    assert any("2 argument dumps" in w for w in r.warnings)


def test_deepspeed_config_print_is_not_a_megatron_dump():
    # DeepSpeed's engine prints its config with dots too (OpenRLHF issue #841, verbatim lines)
    text = (
        "[2025-03-07 23:55:15,356] [INFO] [config.py:1003:print]   optimizer_legacy_fusion "
        "...... False\n"
        "[2025-03-07 23:55:15,356] [INFO] [config.py:1003:print]   optimizer_name "
        "............... None\n"
        "[2025-03-07 23:55:15,356] [INFO] [config.py:1003:print]   optimizer_params "
        "............. None\n"
    )
    assert megatron_dump.sniff(text, "ds.log") == 0


MLM525 = Path(__file__).parents[1] / "data" / "launch" / "mlm525"


def test_local_transformer_is_unfused_attention_and_the_printed_vocab_is_read():
    # https://github.com/NVIDIA/Megatron-LM/issues/525 (tests/data/launch/mlm525):
    # a 2023 Megatron-LM prints transformer_impl local and use_flash_attn False, and no
    # attention_backend (the flag came later). The local layer spec's core attention is
    # Megatron's unfused DotProductAttention: read as the default `auto` (a fused kernel), the
    # estimate dropped the [b, a, s, s] scores (18 GiB for a run that OOMed on 32 GB). The
    # built tokenizer's size, "> padded vocab (size: 50257) ...", is read from the log, and the
    # script alone (gpt2-vocab.json with --merge-file) assumes GPT-2's 50257, not 32000.
    both = resolve([str(MLM525 / "gpt2_755.sh"), str(MLM525 / "terminal.txt")]).reading
    assert both.get("attention_backend") == "unfused"
    assert both.origins["attention_backend"].kind == "derived"
    assert both.get("vocab_size") == 50257
    assert both.origins["vocab_size"].where.endswith("terminal.txt:286")
    script = resolve([str(MLM525 / "gpt2_755.sh")], require_shape=False).reading
    assert script.get("vocab_size") == 50257 and script.origins["vocab_size"].kind == "assumed"


def test_bpe_vocab_and_merge_files_without_a_tokenizer_type_are_gpt2_s_vocabulary():
    """Megatron-LM's CI GPT configs pass --vocab-file .../bpe/vocab.json and --merge-file, no
    --tokenizer-type: GPT2BPETokenizer, 50257 tokens (assumed: the file is not read). A skill
    trial saw 32000 "nothing says it" and estimates 0.6 GiB under the measured peak."""
    path = DATA / "read" / "mlm_ci_gpt3_dist_optimizer_model_config.yaml"
    reading = resolve([str(path)], require_shape=False).reading
    assert reading.get("vocab_size") == 50257
    origin = reading.origins["vocab_size"]
    assert origin.kind == "assumed" and "--vocab-file" in origin.where
    assert "GPT2BPETokenizer" in origin.note


def test_two_whole_configs_of_one_kind_are_said_to_be_merged_as_one_run():
    """A skill trial gave judge.py --config both arms of Megatron-LM's CI ablation (the
    distributed-optimizer control, the full-recompute arm): they were merged into a run
    neither arm is, silently."""
    control = DATA / "read" / "mlm_ci_gpt3_dist_optimizer_model_config.yaml"
    arm = Path(__file__).parent / "corpus/megatron_lm/blind_ft_gpt3_uniform_full_recompute.yaml"
    both = resolve([str(control), str(arm)], require_shape=False).reading
    assert any("2 inputs each write a whole model" in w for w in both.warnings)
    alone = resolve([str(arm)], require_shape=False).reading
    assert not any("write a whole model" in w for w in alone.warnings)


def test_a_long_log_is_read_as_its_head(tmp_path, monkeypatch):
    # The doctor reads a log that prints Megatron's arguments as its config; the reader takes
    # the head (the dump and the start-up lines) of a long one, not the hours of iterations
    import recompute_kit.sources.resolve as resolve_module

    terminal = DATA / "launch" / "mlm525" / "terminal.txt"  # NVIDIA/Megatron-LM#525
    head = terminal.read_text()
    monkeypatch.setattr(resolve_module, "LOG_HEAD_BYTES", len(head.encode()) + 4096)
    long_log = tmp_path / "train.log"
    line = " iteration        1/  500000 | elapsed time per iteration (ms): 812.4 |\n"
    long_log.write_text(head + line * 2000 + "\x00 binary tail the reader never sees\n")
    short = resolve([str(terminal)], require_shape=False).reading
    whole = resolve([str(long_log)], require_shape=False).reading
    assert whole.format == short.format == megatron_dump.FORMAT
    assert whole.values == short.values


def test_a_script_that_does_not_set_the_transformer_impl_says_the_default_aloud():
    # NVIDIA/Megatron-LM#525's 2023 script sets neither --transformer-impl nor an attention
    # backend: the estimate takes today's default (TE, fused attention) and says so; the run's
    # own log (transformer_impl local) settles it and silences the warning
    mlm525 = DATA / "launch" / "mlm525"
    alone = resolve([str(mlm525 / "gpt2_755.sh")], require_shape=False)
    (said,) = [w for w in alone.warnings if "--transformer-impl not set" in w]
    assert "core_r0.6.0" in said and "--attention unfused" in said
    both = resolve([str(mlm525 / "gpt2_755.sh"), str(mlm525 / "terminal.txt")])
    assert not any("--transformer-impl not set" in w for w in both.warnings)
    assert both.reading.get("transformer_impl") == "local"
