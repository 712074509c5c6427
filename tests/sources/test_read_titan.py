"""The torchtitan TOML and HF Trainer / TRL / LLaMA-Factory / DeepSpeed readers, on the real
artefacts of tests/sources/corpus/{torchtitan,hf_trainer} and on focused cases."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from recompute_kit.config import ConfigError
from recompute_kit.sources import hf_trainer, torchtitan

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

CORPUS = {
    "torchtitan": (torchtitan, sorted((HERE / "corpus" / "torchtitan").glob("*.toml"))),
    "hf_trainer": (
        hf_trainer,
        sorted(
            p
            for p in (HERE / "corpus" / "hf_trainer").iterdir()
            if p.suffix in (".yaml", ".json")
            and not p.name.endswith(".expect.yaml")
            and not p.name.startswith("accelerate_")  # (sources/accelerate.py reads those)
        ),
    ),
}
CASES = [(module, path) for module, paths in CORPUS.values() for path in paths]


def _expect(path: Path) -> dict:
    return yaml.safe_load(path.with_name(path.stem + ".expect.yaml").read_text())


def _read(module, path: Path):
    text = path.read_text()
    assert module.sniff(text, str(path)) >= 80
    reading = module.read(text, str(path))
    module.apply_defaults(reading)
    return reading


# -- torchtitan -------------------------------------------------------------------------------

BASE = """
[model]
name = "llama3"
flavor = "{flavor}"
[training]
local_batch_size = 2
seq_len = 4096
{training}
[parallelism]
{parallelism}
[activation_checkpoint]
{ac}
"""


def _tt(flavor="8B", training="", parallelism="", ac='mode = "full"', world=None):
    text = BASE.format(flavor=flavor, training=training, parallelism=parallelism, ac=ac)
    reading = torchtitan.read(text, "job.toml")
    if world:
        from recompute_kit.sources.reading import Origin

        reading.set("world_size", world, Origin("argument", "--world-size"))
    torchtitan.apply_defaults(reading)
    return reading


def test_titan_every_kth_block_is_block_recompute_of_the_same_count():
    # https://github.com/pytorch/torchtitan/blob/73a0e6979dd10b6b1904098eb3c8f62c18ab87ce/torchtitan/distributed/activation_checkpoint.py#L37-L40
    # a block is fully checkpointed iff its 1-based count % ac_freq == 0
    r = _tt("debugmodel", ac='mode = "selective"\nselective_ac_option = "3"')
    assert r.get("recompute_granularity") == "full"
    assert (r.get("recompute_method"), r.get("recompute_num_layers")) == ("block", 2)  # 6 // 3
    assert any("every 3rd block" in w for w in r.warnings)
    r = _tt("debugmodel", ac='mode = "selective"\nselective_ac_option = "1"')
    assert (r.get("recompute_method"), r.get("recompute_num_layers")) == ("uniform", 1)


def test_titan_default_ac_is_every_second_block_from_the_model_layers():
    # job_config.py: mode "selective", selective_ac_option "2"
    r = torchtitan.read('[model]\nname = "llama3"\nflavor = "70B"\n', "job.toml")
    r.set("num_layers", 80, torchtitan.Origin("model", "meta-llama/Llama-3.1-70B"))
    torchtitan.apply_defaults(r)
    assert r.get("recompute_granularity") == "full"
    assert (r.get("recompute_method"), r.get("recompute_num_layers")) == ("block", 40)
    assert r.origins["recompute_granularity"].kind == "default"


def test_titan_op_sac_is_selective_with_a_warning():
    r = _tt(ac='mode = "selective"\nselective_ac_option = "op"')
    assert r.get("recompute_granularity") == "selective"
    assert r.get("recompute_modules") == ["layernorm"]
    assert any("per-op selective AC" in w for w in r.warnings)


def test_titan_memory_budget_is_not_expressible():
    r = _tt(ac='mode = "memory_budget"')
    assert "recompute_granularity" not in r
    assert any("memory_budget" in w for w in r.warnings)


def test_titan_fsdp_shard_degree_gives_zero3_and_dp():
    r = _tt(parallelism="data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4")
    assert r.get("data_parallel_size") == 8 and r.get("zero_stage") == 3
    assert any("HSDP" in w for w in r.warnings)
    r = _tt(parallelism="data_parallel_shard_degree = 1\ndata_parallel_replicate_degree = 8")
    assert r.get("zero_stage") == 0


def test_titan_shard_minus_one_uses_the_world_size_when_known():
    r = _tt(parallelism="tensor_parallel_degree = 8", world=64)
    assert r.get("data_parallel_size") == 8 and r.get("zero_stage") == 3
    assert r.get("sequence_parallel") is True  # TP always shards the norms' sequence
    r = _tt(parallelism="tensor_parallel_degree = 8")
    assert "data_parallel_size" not in r and "zero_stage" not in r
    assert r.get("param_precision") == "amp"  # torchtitan keeps fp32 parameters


def test_titan_default_shard_with_dp_from_the_command_line_is_fsdp2(tmp_path):
    # dp_shard -1 (the default) shards over every data-parallel rank: recompute-kit's --dp 8
    # decides the world the TOML leaves open, and FSDP2 follows from it.
    from recompute_kit.sources.resolve import resolve

    toml = HERE / "corpus" / "torchtitan" / "llama3_8b.toml"
    resolved = resolve([str(toml)], overrides={"data_parallel_size": 8})
    p = resolved.config.parallel
    assert (p.zero_stage, p.use_torch_fsdp2, p.param_precision) == (3, True, "amp")
    alone = resolve([str(toml)])
    assert any(a.startswith("zero_stage = 0") for a in alone.config.assumptions)


def test_titan_precision_and_fp8():
    r = _tt(training='dtype = "bfloat16"')
    assert r.get("bf16") is True and any("fp32 master" in w for w in r.warnings)
    r = _tt(training='mixed_precision_param = "float32"')
    assert r.get("bf16") is False
    text = BASE.format(flavor="8B", training="", parallelism="", ac='mode = "none"')
    text = text.replace('flavor = "8B"', 'flavor = "8B"\nconverters = ["quantize.linear.float8"]')
    text += '[quantize.linear.float8]\nrecipe_name = "rowwise"\n'
    r = torchtitan.read(text, "job.toml")
    assert r.get("fp8") == "e4m3" and r.get("recompute_granularity") is None


def test_titan_pipeline_microbatch_and_old_batch_key():
    r = _tt(parallelism="pipeline_parallel_degree = 4\npipeline_parallel_microbatch_size = 2")
    assert r.get("micro_batch_size") == 2
    r = torchtitan.read('[model]\nflavor = "8B"\n[training]\nbatch_size = 3\n', "old.toml")
    assert r.get("micro_batch_size") == 3 and r.model_name == "meta-llama/Llama-3.1-8B"


def test_titan_unknown_flavor_and_bad_toml_are_one_line_errors():
    with pytest.raises(ConfigError, match="HF_TWINS") as err:
        torchtitan.read('[model]\nname = "llama4"\nflavor = "400bx999e"\n', "x.toml")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="not valid TOML"):
        torchtitan.read("[model\nname = 1", "x.toml")
    with pytest.raises(ConfigError, match="tensor_parallel_degree"):
        _tt(parallelism='tensor_parallel_degree = "8"')


def test_titan_sniff():
    assert torchtitan.sniff('[project]\nname = "x"\n', "pyproject.toml") == 0
    assert torchtitan.sniff("a: 1\n", "x.yaml") == 0


# -- HF Trainer / TRL / LLaMA-Factory / DeepSpeed ---------------------------------------------


def _hf(text, path="train.yaml"):
    r = hf_trainer.read(text, path)
    hf_trainer.apply_defaults(r)
    return r


def test_deepspeed_auto_is_not_set_by_the_file():
    # https://github.com/hiyouga/LLaMA-Factory/blob/ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30/examples/deepspeed/ds_z3_config.json
    r = hf_trainer.read(
        '{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},'
        ' "fp16": {"enabled": false}, "zero_optimization": {"stage": 1,'
        ' "offload_optimizer": {"device": "none"}}}',
        "ds.json",
    )
    assert "micro_batch_size" not in r and "bf16" not in r
    assert r.get("fp16") is False and r.get("zero_stage") == 1
    assert r.get("optimizer_offload") is False
    assert r.origins["zero_stage"].where == "ds.json:1"


def test_deepspeed_activation_checkpointing_is_only_noted():
    r = _hf('{"zero_optimization": {"stage": 2}, "activation_checkpointing": {}}', "ds.json")
    assert r.get("recompute_granularity") is None
    assert any("DeepSpeed's own" in w for w in r.warnings)


def test_llamafactory_checkpointing_is_on_unless_disabled():
    # LF model_args.py: disable_gradient_checkpointing False -> checkpointing on
    r = _hf("model_name_or_path: Qwen/Qwen3-8B\ncutoff_len: 4096\n")
    assert r.get("recompute_granularity") == "full" and r.get("recompute_num_layers") == 1
    assert r.get("seq_length") == 4096
    # LF's default finetuning_type is lora: the base is frozen (counted as such, said so)
    assert r.get("frozen_base") is True and "lora" in r.origins["frozen_base"].describe()
    r = _hf(
        "model_name_or_path: Qwen/Qwen3-8B\ncutoff_len: 4096\n"
        "disable_gradient_checkpointing: true\n"
    )
    assert r.get("recompute_granularity") is None


def test_hf_trainer_and_trl_defaults_differ():
    plain = _hf("model_name_or_path: m/x\nper_device_train_batch_size: 2\noutput_dir: o\n")
    assert plain.format == hf_trainer.FORMAT_HF
    assert plain.get("recompute_granularity") is None and plain.get("bf16") is False
    assert "seq_length" not in plain
    trl = _hf("model_name_or_path: m/x\nper_device_train_batch_size: 2\npacking: true\n")
    assert trl.format == hf_trainer.FORMAT_TRL
    assert trl.get("recompute_granularity") == "full" and trl.get("bf16") is True
    assert trl.get("seq_length") == 1024


def test_precision_of_the_weights_follows_the_trainer():
    # Without DeepSpeed the Trainer's bf16 is torch.autocast over fp32 weights; DeepSpeed keeps
    # 16-bit weights and an fp32 master copy; LLaMA-Factory's pure_bf16 keeps no master copy.
    amp = _hf("model_name_or_path: m/x\nbf16: true\nper_device_train_batch_size: 1\n")
    assert amp.get("param_precision") == "amp"
    assert amp.origins["param_precision"].kind == "default"
    fp32 = _hf("model_name_or_path: m/x\nper_device_train_batch_size: 1\n")
    assert "param_precision" not in fp32  # fp32 training: every mode holds 4 + 4 + 8 B
    ds = _hf('{"zero_optimization": {"stage": 2}, "bf16": {"enabled": true}}', "ds.json")
    assert ds.get("param_precision") == "fp32_master"
    # pure_bf16: true as in https://github.com/hiyouga/LLaMA-Factory/blob/
    # ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30/examples/extras/galore/llama3_full_sft.yaml
    pure = _hf("model_name_or_path: m/x\ncutoff_len: 8\npure_bf16: true\n")
    assert pure.get("param_precision") == "pure" and pure.get("bf16") is True
    named = _hf("model_name_or_path: m/x\nbf16: true\ndeepspeed: ds_z3.json\n")
    assert named.get("param_precision") == "fp32_master"  # the JSON is named, not beside it


def test_a_16_bit_model_trains_in_16_bit_unless_deepspeed_keeps_a_master_copy():
    # alignment-handbook zephyr-7b-beta SFT recipe (torch_dtype: bfloat16, line 4): the Trainer
    # alone keeps bf16 weights, gradients and AdamW states; DeepSpeed keeps an fp32 master copy
    # (a skill trial saw a warning say the first while the numbers counted the second).
    from recompute_kit.sources.resolve import resolve

    recipe = HERE / "corpus" / "hf_trainer" / "zephyr-7b-beta_sft_config_full.yaml"
    ds = HERE / "corpus" / "hf_trainer" / "ds_z3_config.json"
    model = {"data_parallel_size": 8}
    alone = resolve([str(recipe)], model="mistralai/Mistral-7B-v0.3", overrides=model)
    assert alone.config.parallel.param_precision == "pure"
    assert alone.reading.origins["param_precision"].key == "torch_dtype"
    both = resolve([str(recipe), str(ds)], model="mistralai/Mistral-7B-v0.3", overrides=model)
    assert both.config.parallel.param_precision == "fp32_master"


def test_attention_backends():
    r = _hf("model_name_or_path: m/x\ncutoff_len: 8\nflash_attn: disabled\n")
    assert r.get("attention_backend") == "unfused"
    r = _hf("model_name_or_path: m/x\nattn_implementation: eager\nmax_length: 8\n")
    assert r.get("attention_backend") == "unfused"


def test_missing_deepspeed_json_leaves_zero_unknown(tmp_path):
    path = tmp_path / "sft.yaml"
    text = "model_name_or_path: m/x\ncutoff_len: 8\ndeepspeed: nowhere/ds.json\n"
    r = _hf(text, str(path))
    assert "zero_stage" not in r and any("not found" in w for w in r.warnings)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    r = _hf(text, str(path))
    assert r.get("zero_stage") == 2


def test_bad_yaml_and_unsafe_tags_are_config_errors():
    with pytest.raises(ConfigError, match="not valid YAML"):
        hf_trainer.read("a: !!python/object/apply:os.system ['true']\n", "x.yaml")
    with pytest.raises(ConfigError, match="per_device_train_batch_size"):
        hf_trainer.read("per_device_train_batch_size: two\noutput_dir: o\n", "x.yaml")
    with pytest.raises(ConfigError):
        hf_trainer.read('{"zero_optimization": {"stage": 5}}', "ds.json")


def test_hf_sniff():
    assert hf_trainer.sniff('{"architectures": ["LlamaForCausalLM"]}', "config.json") == 0
    assert hf_trainer.sniff('{"zero_optimization": {"stage": 3}}', "ds.json") >= 80


def test_hf_and_torchtitan_runs_use_their_own_loss():
    """Hugging Face's ForCausalLMLoss and torchtitan's cross_entropy_loss upcast the logits to
    fp32 (memory/estimate.py loss_bytes): the readers say whose loss runs."""
    for module, name in ((torchtitan, "torchtitan"), (hf_trainer, "hf")):
        _, paths = CORPUS[module.__name__.rsplit(".", 1)[1]]
        assert _read(module, paths[0]).get("loss_implementation") == name


def test_llama4_flavor_has_its_vocabulary_and_sigmoid_routing():
    # A skill trial: Llama 4 Scout was planned with an assumed 32000-token vocabulary (its
    # tokenizer has 202048) and refused by the softmax top-1 rule (Llama 4 routes by sigmoid).
    from recompute_kit.sources.resolve import resolve

    toml = HERE / "corpus" / "torchtitan" / "blind_llama4_17bx16e.toml"
    resolved = resolve([str(toml)], overrides={"data_parallel_size": 8})
    m = resolved.config.model
    assert m.vocab_size == 202048 and m.moe_router_score_function == "sigmoid"
    assert not any(a.startswith("vocab_size") for a in resolved.config.assumptions)
    resolved.config.validate()  # no "--moe-router-pre-softmax when topk is 1"
    # TOML-era torchtitan (<= 0.2.2): 17bx16e keeps model/args.py's attn_type "sdpa" (only
    # the _irope flavors set "flex"), so context parallelism is allowed (a skill trial saw the
    # CP lever refused by plan while diagnose proposed it)
    from recompute_kit.sources.torchtitan import context_parallel_refused

    note = resolved.reading.origins["attention_backend"].note
    assert "'sdpa'" in note and context_parallel_refused("torchtitan", note) is None
    irope = toml.read_text().replace('flavor = "17bx16e"', 'flavor = "17bx16e_irope"')
    assert irope != toml.read_text()
    flex = torchtitan.read(irope, "irope.toml").origins["attention_backend"].note
    assert context_parallel_refused("torchtitan", flex)


def test_an_accelerate_config_beside_the_recipe_shards_the_run(tmp_path):
    # alignment-handbook's accelerate configs (tests/sources/corpus/hf_trainer/accelerate_*.yaml)
    # are how its recipes get ZeRO-3 / FSDP; a skill trial could not read them.
    from recompute_kit.config import ConfigError
    from recompute_kit.sources.resolve import resolve

    corpus = HERE / "corpus" / "hf_trainer"
    recipe = str(corpus / "zephyr-7b-beta_sft_config_full.yaml")
    model = "mistralai/Mistral-7B-v0.3"
    read = resolve([recipe, str(corpus / "accelerate_fsdp.yaml")], model=model)
    fsdp = read.config.parallel
    # the recipe loads bfloat16, but Accelerate upcasts FSDP's trainable flat parameters to fp32
    # under mixed_precision bf16 (accelerate >= 0.30, accelerator.py prepare_model: a skill
    # trial counted 8 B/param where the run holds 16)
    assert (fsdp.zero_stage, fsdp.data_parallel_size, fsdp.param_precision) == (3, 8, "amp")
    assert "upcasts" in read.reading.origins["param_precision"].where
    from recompute_kit.sources import hf_trainer

    alone = hf_trainer.read(Path(recipe).read_text(), recipe)
    assert "torch_dtype" not in alone.unused  # the recipe's dtype is read, so not "unused"
    # the FSDP keys the estimate does not use are said, the prefetch as not counted
    assert read.reading.unused["fsdp_config.fsdp_backward_prefetch"] == "BACKWARD_PRE"
    assert any("fsdp_forward_prefetch True" in w for w in read.reading.warnings)
    ds = resolve([recipe, str(corpus / "accelerate_deepspeed_zero3.yaml")], model=model)
    p = ds.config.parallel
    assert (p.zero_stage, p.optimizer_offload, p.param_offload) == (3, True, True)
    assert p.param_precision == "fp32_master"  # DeepSpeed keeps its fp32 master copy
    bad = tmp_path / "accel.yaml"
    bad.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 8\n"
        "fsdp_config:\n  fsdp_sharding_strategy: SOMETHING\nmixed_precision: bf16\n"
    )
    with pytest.raises(ConfigError, match="fsdp_sharding_strategy 'SOMETHING' is not known"):
        resolve([str(bad)], model=model)


def test_titan_default_shard_follows_an_assumed_data_parallel_size():
    # torchtitan's deepseek_v3_16b.toml: EP 8 and dp_shard -1, the world left to the launcher.
    # The smallest DP the expert layout allows (8) is assumed; dp_shard -1 shards over it, so
    # the ZeRO stage assumed is FSDP2's 3 (was 0: 8 data-parallel ranks holding whole states).
    from recompute_kit.sources.resolve import resolve

    resolved = resolve([str(HERE / "corpus" / "torchtitan" / "deepseek_v3_16b.toml")])
    p = resolved.config.parallel
    assert (p.data_parallel_size, p.zero_stage, p.use_torch_fsdp2) == (8, 3, True)
    said = [a for a in resolved.config.assumptions if a.startswith("zero_stage = 3")]
    assert said and "data_parallel_shard_degree" in said[0]


def test_titan_assumed_data_parallel_names_the_world_that_decides_it():
    # a skill trial: "set [parallelism] data_parallel_shard_degree" for a file that sets it to
    # -1 (the rest of the world): the launcher's world size is what is missing
    from recompute_kit.sources.resolve import resolve

    resolved = resolve([str(HERE / "corpus" / "torchtitan" / "llama3_70b.toml")])
    [said] = [a for a in resolved.config.assumptions if a.startswith("data_parallel_size = ")]
    assert "NGPU" in said and "--dp" in said and "-1 fills" in said


# -- a skill trial on torchtitan's llama3_8b.toml (mode "none", selective_ac_option "op") -----

AC_NONE = HERE.parent / "data" / "read" / "torchtitan_llama3_8b_ac_none.toml"  # README: URL


def test_titan_selective_ac_option_is_read_and_reported_under_every_mode():
    # it decides what is recomputed, so it is read (was listed "unused" under mode none) and
    # its value said where the recompute setting is
    reading = _read(torchtitan, AC_NONE)
    assert "activation_checkpoint.selective_ac_option" not in reading.unused
    origin = reading.origins["recompute_granularity"]
    assert reading.get("recompute_granularity") is None
    assert "selective_ac_option 'op' is ignored under mode 'none'" in origin.note
    r = _tt(ac='mode = "selective"\nselective_ac_option = "op"')
    assert "'op'" in r.origins["recompute_granularity"].note
    r = _tt(ac='mode = "selective"\nselective_ac_option = "4"')
    assert "'4'" in r.origins["recompute_method"].note


def test_titan_selective_ac_option_without_mode_is_the_default_selective_mode():
    # job_config.py: mode defaults to "selective", so a given option decides (was: every 2nd
    # block, the option's own default, whatever it said)
    r = _tt(ac='selective_ac_option = "op"')
    assert r.get("recompute_granularity") == "selective"
    assert r.get("recompute_modules") == ["layernorm"]


def test_titan_assumed_data_parallel_is_a_warning_naming_what_sets_it():
    from recompute_kit.sources.resolve import resolve

    warnings = resolve([str(AC_NONE)]).warnings
    [said] = [w for w in warnings if w.startswith("assumed: data_parallel_size = 1")]
    assert "--dp" in said and "NGPU" in said
    given = resolve([str(AC_NONE)], overrides={"data_parallel_size": 8})
    assert not [w for w in given.warnings if "data_parallel_size" in w]
    assert (given.reading.get("data_parallel_size"), given.reading.get("zero_stage")) == (8, 3)


def test_titan_defaults_are_torchtitans_and_the_rest_an_assumption():
    from recompute_kit.sources.resolve import resolve

    origins = resolve([str(AC_NONE)]).reading.origins
    for key, origin in origins.items():
        if "Megatron" in origin.describe():  # only a value no torchtitan key sets
            assert origin.where.startswith("assumed by recompute-kit"), key
    reduce = origins["grad_reduce_in_fp32"].describe()
    assert "mixed_precision_reduce" in reduce and "torchtitan" in reduce
    for key in ("main_params_dtype", "exp_avg_dtype", "use_precision_aware_optimizer"):
        assert "torch.optim" in origins[key].where, key
    assert "fully_shard" in origins["use_torch_fsdp2"].note
    assert origins["recompute_modules"].key == "[activation_checkpoint] mode"


def test_the_global_batch_left_to_torchtitan_is_local_times_data_parallel():
    # torchtitan's global_batch_size -1 (its default) is local_batch_size x the data-parallel
    # degree: a skill trial's levers assumed 512 (eight accumulation steps) for the 70B TOML
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "corpus" / "torchtitan" / "llama3_70b.toml"
    r = resolve([str(toml)], overrides={"data_parallel_size": 8})
    assert r.reading.get("global_batch_size") == 8 * r.reading.get("local_batch_size")
    assert r.reading.origins["global_batch_size"].kind == "derived"
    assumed = resolve([str(toml)])  # the world not given: no global batch made from a guess
    assert "global_batch_size" not in assumed.reading


def test_torchtitan_moe_dispatch_and_dropout_are_torchtitans():
    # a skill trial: torchtitan's deepseek_v3_16b.toml was given Megatron-Core's defaults
    # (attention_dropout 0.1, the allgather dispatcher, whose buffers then counted); torchtitan's
    # models have no dropout and its EP dispatcher is an all-to-all of the routed tokens
    from recompute_kit.sources.resolve import resolve

    toml = Path(__file__).parent / "corpus" / "torchtitan" / "deepseek_v3_16b.toml"
    r = resolve([str(toml)], overrides={"data_parallel_size": 32})
    assert r.config.model.attention_dropout == 0.0
    assert r.config.model.moe_token_dispatcher_type == "alltoall"
    from recompute_kit.memory.estimate import estimate

    assert estimate(r.config).dispatcher_buffers_bytes == 0


def test_titan_float8_is_current_scaling_and_op_sac_is_planned(tmp_path):
    # torchtitan's llama3_405b.toml (v0.1.0, tests/sources/corpus/torchtitan/, the preset for
    # 128 H100s: converters = ["float8"], full AC) switched to op-level SAC. torchao scales
    # dynamically; read as Megatron's default "delayed" recipe, Megatron's refusal of layernorm
    # recompute under delayed FP8 crashed `plan` and `estimate` on the file ("Delayed scaling
    # does not support moe_act and layernorm recompute for fp8"), and `plan` never offered op
    # SAC. Each candidate now also says its setting in torchtitan's keys.
    from recompute_kit.plan import plan
    from recompute_kit.sources.resolve import resolve

    src = Path(__file__).parent / "corpus" / "torchtitan" / "llama3_405b_v0.1.0.toml"
    text = src.read_text().replace(
        'mode = "full"', 'mode = "selective"\nselective_ac_option = "op"'
    )
    toml = tmp_path / "llama3_405b_op.toml"
    toml.write_text(text)
    resolved = resolve([str(toml)], overrides={"data_parallel_size": 16})
    assert resolved.reading.get("fp8_recipe") == "tensorwise"
    result = plan(resolved.config, 79.1, fmt="torchtitan")
    op = next(c for c in result.candidates if c.estimate.recompute == "selective:layernorm")
    assert op.settings == (
        '[activation_checkpoint]; mode = "selective"; selective_ac_option = "op"'
    )
    assert result.best.settings == '[activation_checkpoint]; mode = "full"'


def test_titan_2024_toml_keeps_its_degrees_under_training_and_experimental(tmp_path):
    # torchtitan's train_configs/llama3_8b.toml at 7c3a1fa (October 2024, the version of
    # https://github.com/pytorch/torchtitan/issues/620; tests/sources/corpus/torchtitan/
    # llama3_8b_2024-10.toml, with that thread's `mode = 'full'`): the data-parallel and tensor
    # degrees sit under [training], the pipeline degree under [experimental]. They were listed
    # as unused, with no warning, and TP 2 there was read as TP 1.
    from recompute_kit.sources.resolve import resolve

    src = Path(__file__).parent / "corpus" / "torchtitan" / "llama3_8b_2024-10.toml"
    toml = tmp_path / "llama3_8b.toml"
    toml.write_text(
        src.read_text().replace("tensor_parallel_degree = 1", "tensor_parallel_degree = 2")
    )
    r = resolve([str(toml)], overrides={"data_parallel_size": 2}).reading
    assert r.get("tensor_model_parallel_size") == 2
    assert (
        r.origins["tensor_model_parallel_size"]
        .describe()
        .endswith("[training] tensor_parallel_degree")
    )
    assert r.get("zero_stage") == 3  # data_parallel_shard_degree -1 over DP 2: FSDP2
    assert any("before its [parallelism] section" in w for w in r.warnings)


def test_titan_launch_script_gives_the_gpus_and_the_toml_it_names(tmp_path):
    # torchtitan's run_llama_train.sh at 7c3a1fa (tests/sources/corpus/torchtitan/, the
    # launcher of https://github.com/pytorch/torchtitan/issues/620): `NGPU=${NGPU:-"8"}`,
    # `torchrun --nproc_per_node=${NGPU} ... --job.config_file ${CONFIG_FILE}`. It was refused
    # ("not a training config"), aborting a `read TOML SCRIPT` call.
    import shutil

    from recompute_kit.sources.resolve import resolve

    corpus = Path(__file__).parent / "corpus" / "torchtitan"
    script = tmp_path / "run_llama_train.sh"
    shutil.copy(corpus / "run_llama_train_2024-10.sh", script)
    toml = corpus / "llama3_8b_2024-10.toml"
    r = resolve([str(toml), str(script)]).reading
    world = r.origins["world_size"]
    assert r.get("world_size") == 8 and world.kind == "assumed" and "NGPU" in world.note
    assert any("debug_model.toml" in w and "not found" in w for w in r.warnings)
    # the TOML the script names (its CONFIG_FILE default), beside it: read through the script
    (tmp_path / "train_configs").mkdir()
    shutil.copy(toml, tmp_path / "train_configs" / "debug_model.toml")
    alone = resolve([str(script)])
    assert alone.reading.get("num_layers") == 32 and alone.reading.get("world_size") == 8
    assert str(tmp_path / "train_configs" / "debug_model.toml") in {i["path"] for i in alone.inputs}


def test_llamafactory_zero3_gathers_a_moe_block_whole():
    # A skill trial: LLaMA-Factory's qwen3_full_sft.yaml + ds_z3_config.json (corpus, verbatim)
    # on Qwen3-30B-A3B. LLaMA-Factory makes each MoE block a ZeRO-3 leaf (model/model_utils/
    # moe.py add_z3_leaf_module: Qwen3MoeSparseMoeBlock), so DeepSpeed gathers the router and
    # all 128 experts of a layer at once: 604M parameters, not the embedding's 311M.
    from recompute_kit.memory.model_states import model_states
    from recompute_kit.sources.resolve import resolve

    corpus = HERE / "corpus" / "hf_trainer"
    files = [str(corpus / "qwen3_full_sft.yaml"), str(corpus / "ds_z3_config.json")]
    cfg = resolve(files, model="Qwen/Qwen3-30B-A3B", overrides={"data_parallel_size": 16}).config
    assert cfg.parallel.zero3_moe_leaf
    block = 128 * 3 * 2048 * 768 + 128 * 2048  # experts (gate, up, down) and the router
    assert model_states(cfg).gathered_params == 2 * 2 * block  # bf16 params and grads
    assert model_states(cfg.replace(zero3_moe_leaf=False)).gathered_params < 2 * 2 * block


def test_torchtitan_expert_tensor_parallelism_is_tp_or_one():
    # A skill trial estimated torchtitan's DeepSeek-V3 at TP 2, EP 32, expert TP 4, which
    # torchtitan refuses at start-up (parallel_dims.py: "Currently we only support ETP=TP or
    # ETP=1"); Megatron-Core allows it, so the rule is torchtitan's alone.
    from recompute_kit.config import ConfigError
    from recompute_kit.sources.resolve import resolve

    toml = HERE / "corpus" / "torchtitan" / "blind_deepseek_v3_671b.toml"
    base = {"data_parallel_size": 128, "tensor_model_parallel_size": 2}
    base["expert_model_parallel_size"] = 32
    for etp in (1, 2):
        over = {**base, "expert_tensor_parallel_size": etp}
        resolve([str(toml)], overrides=over).config.validate()
    bad = resolve([str(toml)], overrides={**base, "expert_tensor_parallel_size": 4}).config
    with pytest.raises(ConfigError, match="ETP=TP or ETP=1"):
        bad.validate()
    bad.replace(loss_implementation="megatron").validate()  # (Megatron-Core allows it)


def test_a_hugging_face_run_refuses_selective_module_recompute():
    # A skill trial: `validate --recompute selective:moe` on a LLaMA-Factory run said valid and
    # `estimate` priced it; transformers' gradient_checkpointing wraps whole decoder layers.
    from recompute_kit.config import ConfigError
    from recompute_kit.sources.resolve import resolve

    corpus = HERE / "corpus" / "hf_trainer"
    files = [str(corpus / "qwen3_full_sft.yaml"), str(corpus / "ds_z3_config.json")]
    cfg = resolve(files, model="Qwen/Qwen3-30B-A3B", overrides={"data_parallel_size": 16}).config
    cfg.with_recompute("full:uniform:1").validate()
    with pytest.raises(ConfigError, match="checkpoints whole decoder layers"):
        cfg.with_recompute("selective:moe").validate()


def test_op_sac_on_moe_blocks_matches_what_torchtitan_ships(tmp_path):
    # torchtitan's deepseek_v3_16b.toml (per-op SAC, EP 8, seq 4096) OOMed on 8 x H100 80GB at
    # local_batch_size 8 (https://github.com/pytorch/torchtitan/issues/1789); the maintainers
    # shipped local_batch_size 4 as "safe for 80GB H100" (pull 1792, the corpus file here).
    # Read as Megatron's norms + moe_act, the kit put batch 4 at 105 GiB; the experts'
    # grouped GEMMs are outside the save list, so the whole MoE layer is recomputed.
    from recompute_kit.memory.estimate import estimate
    from recompute_kit.sources.resolve import resolve

    src = Path(__file__).parent / "corpus" / "torchtitan" / "deepseek_v3_16b.toml"
    r = resolve([str(src)], overrides={"data_parallel_size": 8})
    assert r.reading.get("recompute_modules") == ["layernorm", "moe"]
    gpu = 79.1 * 2**30
    assert estimate(r.config).total_with_overheads_bytes < gpu
    eight = tmp_path / "deepseek_v3_16b_lbs8.toml"
    eight.write_text(src.read_text().replace("local_batch_size = 4", "local_batch_size = 8"))
    r8 = resolve([str(eight)], overrides={"data_parallel_size": 8})
    assert estimate(r8.config).total_with_overheads_bytes > gpu
