"""torchtitan's config registries (main since 2026-02, pytorch/torchtitan#2386), read from the
verbatim files of tests/sources/corpus/torchtitan_checkout (torchtitan b5bcd76c6, see its
README): the registry function, its launch command with overrides, the chunked loss and the
registry form of the plan's settings. Expected values come from the files and torchtitan's
semantics (configs.py TrainingConfig: tokens per micro-batch / max_context_length sequences)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recompute_kit.config import ConfigError, parse_spec
from recompute_kit.export import format_for, render
from recompute_kit.sources.resolve import resolve

CHECKOUT = Path(__file__).parent / "corpus" / "torchtitan_checkout"
MODELS = CHECKOUT / "torchtitan" / "models"
LLAMA3 = MODELS / "llama3" / "config_registry.py"


def _read(*inputs: str, dp: int | None = None):
    return resolve(list(inputs), overrides={"data_parallel_size": dp} if dp else None)


def test_llama3_70b_registry_function():
    # llama3_70b(): model_registry("70B"), 8 * 8192 tokens of 8192, TP 8, FullAC, chunked loss
    r = _read(f"{LLAMA3}::llama3_70b", dp=4)
    c = r.reading
    assert r.reading.model_name == "meta-llama/Llama-3.1-70B"
    assert (c.get("seq_length"), c.get("micro_batch_size")) == (8192, 8)
    assert c.get("tensor_model_parallel_size") == 8
    assert c.get("world_size") is None or c.get("world_size") == 32
    assert (c.get("recompute_granularity"), c.get("recompute_method")) == ("full", "uniform")
    assert c.get("recompute_num_layers") == 1
    assert c.get("zero_stage") == 3  # dp_shard -1 over DP 4: FSDP2
    assert c.get("fused_linear_cross_entropy") is True
    assert c.get("fused_linear_cross_entropy_impl") == "torchtitan_chunked"
    assert c.get("fused_linear_cross_entropy_chunks") == 8
    micro = c.origins["micro_batch_size"]
    assert micro.key == "training.num_tokens_per_microbatch_per_dp_rank"
    assert micro.where.endswith("config_registry.py:286")
    assert "65536 tokens / max_context_length 8192" in micro.note


def test_llama3_8b_default_policy_is_per_op_selective():
    c = _read(f"{LLAMA3}::llama3_8b", dp=8).reading
    assert (c.get("seq_length"), c.get("micro_batch_size")) == (8192, 1)
    assert c.get("recompute_granularity") == "selective"  # SelectiveAC.Config(): per-op SAC


def test_float8_converter_default_recipe_is_rowwise():
    # llama3_405b(): Float8LinearConverter.Config(filter_fqns=["lm_head"]); main's default
    # recipe_name is "rowwise" (components/quantization/float8.py)
    c = _read(f"{LLAMA3}::llama3_405b", dp=8).reading
    assert c.get("fp8") == "e4m3"
    assert c.get("micro_batch_size") == 2


def test_a_registry_left_default_says_the_default_policy():
    # gpt_oss_20b() sets FullAC; deepseek_v3_671b() SelectiveAC, EP 2, 4 x 4096 tokens
    c = _read(f"{MODELS / 'deepseek_v3' / 'config_registry.py'}::deepseek_v3_671b", dp=8).reading
    assert c.model_name == "deepseek-ai/DeepSeek-V3"
    assert (c.get("seq_length"), c.get("micro_batch_size")) == (4096, 4)
    assert c.get("expert_model_parallel_size") == 2
    assert c.get("recompute_granularity") == "selective"
    g = _read(f"{MODELS / 'gpt_oss' / 'config_registry.py'}::gpt_oss_20b", dp=8).reading
    assert g.model_name == "openai/gpt-oss-20b"
    assert g.get("recompute_granularity") == "full"


def test_launch_command_with_overrides(monkeypatch):
    # torchtitan's parser applies `--section.key value` over the function's config: a shorter
    # context keeps the tokens per micro-batch, so the micro-batch holds more sequences
    monkeypatch.chdir(CHECKOUT)
    command = (
        "torchrun --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_70b "
        "--parallelism.tensor_parallel_degree 4 --training.max_context_length=4096"
    )
    c = _read(command).reading
    assert c.get("tensor_model_parallel_size") == 4
    assert (c.get("seq_length"), c.get("micro_batch_size")) == (4096, 16)
    assert c.get("world_size") == 8 and c.get("data_parallel_size") == 2
    assert c.origins["tensor_model_parallel_size"].where == "the command line"
    assert c.origins["tensor_model_parallel_size"].key == "--parallelism.tensor_parallel_degree"


def test_toml_era_training_keys_on_a_registry_launch_are_said_not_applied(monkeypatch):
    # A skill trial wrote `--training.local_batch_size 4 --training.seq_len 8192` (the TOML
    # era's keys) for a registry launch: they were dropped without a word; torchtitan's parser
    # refuses them (torchtitan/config/configs.py: TrainingConfig has the token budgets)
    monkeypatch.chdir(CHECKOUT)
    command = (
        "torchrun --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_8b "
        "--training.local_batch_size 4 --training.seq_len 8192"
    )
    r = _read(command).reading
    said = [w for w in r.warnings if "TOML-era key" in w]
    assert len(said) == 2 and "training.max_context_length" in said[1]
    assert "not applied" in said[0] and "num_tokens_per_microbatch_per_dp_rank" in said[0]
    # a flag torchtitan's parser does not take (its AC policy is a subcommand) is said too
    r = _read(command.replace("--training.seq_len 8192", "--activation_checkpoint none")).reading
    assert any(w.startswith("--activation_checkpoint: not an override") for w in r.warnings)
    assert r.get("recompute_granularity") == "selective"  # the function's, unchanged


def test_a_registry_given_beside_the_launch_that_names_its_config(tmp_path):
    # A skill trial passed the registry file and the launch (which names --config): "name
    # one" was refused; the launch's --config says which. Alone, the file still asks.
    (tmp_path / "torchtitan").symlink_to(CHECKOUT / "torchtitan")  # the command's checkout
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "torchrun --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_8b\n"
    )
    r = _read(str(LLAMA3), str(launch)).reading
    assert "llama3_8b()" in r.format and r.get("num_layers") == 32
    other = tmp_path / "other.yaml"  # another input that names no registry config
    other.write_text("num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\n")
    with pytest.raises(ConfigError, match="name one"):
        _read(str(LLAMA3), str(other))


def test_run_train_sh_beside_the_command_that_runs_it_is_read_once(tmp_path):
    # A skill trial passed launch.sh (`CONFIG=llama3_8b ./run_train.sh ...`) and run_train.sh:
    # the script was read again on its own defaults (llama3_debugmodel) and won the merge
    for name in ("torchtitan", "run_train.sh"):
        (tmp_path / name).symlink_to(CHECKOUT / name)
    launch = tmp_path / "launch.sh"
    launch.write_text("NGPU=8 MODULE=llama3 CONFIG=llama3_8b ./run_train.sh\n")
    r = _read(str(launch), str(tmp_path / "run_train.sh")).reading
    assert r.get("num_layers") == 32 and not any("conflict" in w for w in r.warnings)


def test_run_train_sh_reads_the_default_config(monkeypatch):
    # MODULE=${MODULE:-"llama3"} CONFIG=${CONFIG:-"llama3_debugmodel"}: the environment's
    # defaults, said as such
    monkeypatch.chdir(CHECKOUT)
    r = _read("run_train.sh")
    assert "llama3_debugmodel()" in r.reading.format
    assert r.reading.get("num_layers") == 6
    assert any("CONFIG = llama3_debugmodel" in w for w in r.warnings)


def test_registry_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"name one.*llama3_70b"):
        _read(str(LLAMA3))
    with pytest.raises(ConfigError, match="no config 'llama3_7b'"):
        _read(f"{LLAMA3}::llama3_7b")
    with pytest.raises(ConfigError, match="LoRAConverter: not modelled"):
        _read(f"{LLAMA3}::llama3_debugmodel_float8_emulate_lora")


def test_a_module_without_a_checkout_says_what_to_give(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"no model shape \(model_registry\(flavor\)"):
        _read("python -m torchtitan.train --module llama3 --config llama3_70b", dp=1)
    r = resolve(
        ["python -m torchtitan.train --module llama3 --config llama3_70b"], require_shape=False
    )
    assert any("torchtitan/models/llama3/config_registry.py::llama3_70b" in w for w in r.warnings)


def test_plan_settings_are_written_for_the_registry():
    c = _read(f"{LLAMA3}::llama3_70b", dp=4).reading
    fmt = format_for(c.framework, c.format)
    assert fmt == "torchtitan-registry"
    from recompute_kit.export_layout import SEQUENCE_TOKENS

    layout = {"micro_batch_size": 2, SEQUENCE_TOKENS: 8192}
    out = render(parse_spec("full:uniform:1"), fmt, layout=layout)
    assert "config.activation_checkpoint = FullAC.Config()" in out
    # in tokens, as numbers: the function's own max_context_length may not be the run's (a
    # trial: `2 * config.training.max_context_length` read 4096 inside the function)
    assert "config.training.num_tokens_per_microbatch_per_dp_rank = 16384" in out
    assert "--training.num_tokens_per_microbatch_per_dp_rank 16384" in out
    assert "activation-checkpoint:full" in out
    assert "config.activation_checkpoint = None" in render(parse_spec("none"), fmt)


def test_chunked_loss_keeps_no_full_logits():
    # ChunkedLossWrapper (components/loss.py): the summed gradient of the hidden states, cast
    # to bf16 (loss.py:711, saved :792), and the int64 labels kept; while the chunks run, the
    # fp32 accumulator, the bf16 chunk copies and one chunk's logits through torch's
    # cross_entropy (1/8 of the tokens). (A skill trial read loss.py: the kit had kept fp32.)
    from recompute_kit.memory.estimate import estimate

    cfg = _read(f"{LLAMA3}::llama3_8b", dp=8).config
    m = cfg.model
    tokens, h, v = m.seq_length * m.micro_batch_size, m.hidden_size, m.vocab_size
    chunked = estimate(cfg)
    assert chunked.loss_saved_bytes == 2 * tokens * h + 8 * tokens
    chunk = tokens * v // 8
    assert chunked.loss_transient_bytes == 4 * tokens * h + 4 * chunk + max(6 * chunk, 8 * chunk)
    full = estimate(cfg.replace(fused_linear_cross_entropy=False))
    assert full.loss_saved_bytes > 4 * tokens * v  # the fp32 log-softmax of every token
    assert chunked.total_bytes < full.total_bytes


def test_env_prefixed_launches_and_nnodes(monkeypatch):
    # a skill trial: `NGPU=8 torchrun --nnodes 8 ...` was refused as a key=value override and
    # --nnodes was dropped (world 8, not 64); run_train.sh's documented launch sets CONFIG=...
    monkeypatch.chdir(CHECKOUT)
    c = _read(
        "NGPU=8 torchrun --nnodes 8 --nproc_per_node 8 -m torchtitan.train --module llama3 "
        "--config llama3_70b --training.max_context_length 32768 "
        "--training.num_tokens_per_microbatch_per_dp_rank 32768"
    ).reading
    assert c.get("world_size") == 64 and c.get("data_parallel_size") == 8
    assert (c.get("seq_length"), c.get("micro_batch_size")) == (32768, 1)
    assert c.origins["world_size"].key == "--nproc_per_node x --nnodes"
    r = _read("CONFIG=llama3_70b NGPU=4 ./run_train.sh --parallelism.tensor_parallel_degree 4")
    assert "llama3_70b()" in r.reading.format
    assert r.reading.get("tensor_model_parallel_size") == 4
    assert r.reading.get("world_size") == 4


def test_a_launch_command_too_long_for_a_file_name_is_read(monkeypatch):
    # `Path(item).exists()` raised ENAMETOOLONG on a long quoted command (a trial's crash)
    monkeypatch.chdir(CHECKOUT)
    long = " ".join(f"--metrics.tag_{k} x{'y' * 40}" for k in range(8))
    command = (
        "torchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train --module llama3 "
        f"--config llama3_70b --parallelism.context_parallel_degree 2 {long}"
    )
    assert len(command) > 255
    assert _read(command).reading.get("context_parallel_size") == 2


OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this "
    "process has 78.08 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by "
    "PyTorch, and 1.30 GiB is reserved by PyTorch but unallocated.\n"
)


def _doctor(tmp_path, config: str):
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    log = tmp_path / "oom.txt"
    log.write_text(OOM)
    return diagnose(collect(logs=[str(log)], config=config), None)


def test_doctor_on_a_registry_launch_writes_tokens_and_knows_the_chunked_loss(
    tmp_path, monkeypatch
):
    # a skill trial: diagnose refused a quoted launch command; patched the micro-batch as
    # "training.num_tokens_per_microbatch_per_dp_rank = 4" (sequences, not tokens); and
    # advised a fused loss to a run whose ChunkedLossWrapper already chunks it
    monkeypatch.chdir(CHECKOUT)
    d = _doctor(
        tmp_path,
        "torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b "
        "--training.num_tokens_per_microbatch_per_dp_rank 131072",
    )
    f = next(f for f in d.findings if f.rule == "RK012")
    assert "already runs in chunks" in f.fix and "num_chunks" in f.fix
    tokens = f.patch_keys.get("training.num_tokens_per_microbatch_per_dp_rank")
    assert tokens is not None and tokens % 8192 == 0  # whole sequences of 8192, in tokens
    for g in d.findings:
        assert "micro_batch_size" not in (g.patch_keys or {})


def test_doctor_never_repatches_the_one_selective_policy(tmp_path):
    # llama3_8b() runs SelectiveAC (read as recompute_modules [layernorm]): "only layernorm is
    # recomputed" (RK022) is not said, and no patch writes SelectiveAC.Config() again
    d = _doctor(tmp_path, f"{LLAMA3}::llama3_8b")
    assert "RK022" not in [f.rule for f in d.findings]
    for f in d.findings:
        assert (f.patch_keys or {}).get("activation_checkpoint") != "SelectiveAC.Config()"


def test_plan_offers_only_the_policies_the_registry_has():
    # a skill trial: the plan picked full:block:4 for a registry run, which torchtitan main
    # cannot express (SelectiveAC, FullAC, MemoryBudgetAC or None); MoE per-op SAC is counted
    # as the reader reads it (norms and the whole MoE layer)
    from recompute_kit.plan.search import candidates

    cfg = _read(f"{MODELS / 'qwen3' / 'config_registry.py'}::qwen3_30b_a3b", dp=8).config
    got = {rc.spec for rc, _ in candidates(cfg, fmt="torchtitan-registry")}
    assert got == {"none", "selective:layernorm,moe", "full:uniform:1"}
    toml = {rc.spec for rc, _ in candidates(cfg, fmt="torchtitan")}
    assert any(spec.startswith("full:block:") for spec in toml)


def test_the_policy_chosen_on_the_command_line(monkeypatch):
    # tyro's subcommand `activation-checkpoint:full` (activation_checkpoint.py's
    # ActivationCheckpointingConfig) was dropped by the reader (a skill trial)
    monkeypatch.chdir(CHECKOUT)
    base = "torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b"
    assert _read(base).reading.get("recompute_granularity") == "selective"
    assert _read(f"{base} activation-checkpoint:full").reading.get("recompute_granularity") == (
        "full"
    )
    assert _read(f"{base} activation-checkpoint:none").reading.get("recompute_granularity") is None


def test_the_doctor_reads_the_environment_the_launched_script_sets(tmp_path):
    # A skill trial: launch.sh runs run_train.sh, which launches with
    # PYTORCH_ALLOC_CONF="expandable_segments:True"; the doctor still asked for "the same step
    # with expandable_segments" (it read only launch.sh's own text)
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    for name in ("torchtitan", "run_train.sh"):
        (tmp_path / name).symlink_to(CHECKOUT / name)
    launch = tmp_path / "launch.sh"
    launch.write_text("NGPU=8 MODULE=llama3 CONFIG=llama3_8b ./run_train.sh\n")
    evidence = collect(config=[str(launch)])
    assert evidence.env.get("PYTORCH_ALLOC_CONF") == "expandable_segments:True"
    assert "expandable" not in [c["id"] for c in diagnose(evidence).verdict.collect]


def test_a_full_layer_count_is_no_registry_setting(tmp_path, capsys):
    # A skill trial: `estimate --recompute full:block:16` on a registry launch was estimated
    # without a word; the registry's FullAC.Config has no layer count
    # (torchtitan/distributed/activation_checkpoint.py)
    from recompute_kit.cli import main

    (tmp_path / "torchtitan").symlink_to(CHECKOUT / "torchtitan")
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "torchrun --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_8b\n"
    )
    assert main(["estimate", "--config", str(launch), "--recompute", "none", "full:block:16"]) == 0
    assert "full:block:16: torchtitan's config registry has FullAC" in capsys.readouterr().err
    assert main(["validate", str(launch), "--recompute", "full:block:16"]) == 1
    assert main(["validate", str(launch), "--recompute", "full:uniform:1"]) == 0


def test_kimi_moonlight_registry_reads_its_shape_its_muon_and_refuses_cp(capsys):
    # A skill trial: kimi_k2_7/config_registry.py was refused ("folder 'kimi_k2_7' is none of
    # ..."). moonlight_16b_a3b(): model_registry("moonlight-16B-A3B", attn_backend="flex"),
    # 4 x 4096 tokens, EP 8, FullAC, the chunked loss, and _dist_muon_optimizer (DistMuon for
    # the matrices beside AdamW); torchtitan/models/kimi_k2_7/__init__.py
    # _moonlight_16b_a3b_config: dim 2048, 27 layers (1 dense), MLA without q-LoRA, 64
    # experts of 1408 + 2 shared, top-6, vocab 163840; parallelize.py refuses CP.
    from recompute_kit.cli import main

    kimi = f"{MODELS / 'kimi_k2_7' / 'config_registry.py'}::moonlight_16b_a3b"
    r = _read(kimi, dp=8)
    c = r.config
    m = c.model
    assert (m.num_layers, m.hidden_size, m.vocab_size) == (27, 2048, 163840)
    assert m.multi_latent_attention and m.q_lora_rank is None and m.kv_lora_rank == 512
    assert (m.num_moe_experts, m.moe_router_topk, m.moe_ffn_hidden_size) == (64, 6, 1408)
    assert m.moe_shared_expert_intermediate_size == 2816
    assert (m.seq_length, m.micro_batch_size) == (4096, 4)
    assert c.parallel.expert_model_parallel_size == 8
    assert any(w.startswith("optimizer DistMuon: ") for w in r.reading.warnings)
    argv = ["plan", "--config", kimi, "--dp", "8", "--gpu", "h100-80gb", "--levers", "--json"]
    assert main(argv) in (0, 1)
    import json

    doc = json.loads(capsys.readouterr().out)
    assert not any(row["context_parallel_size"] > 1 for row in doc["levers"]["rows"])
    assert any("kimi_k2_7 models refuse it" in n for n in doc["levers"]["notes"])
