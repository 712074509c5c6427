"""Accelerate's FSDP configs. tests/sources/corpus/accelerate/trl_fsdp2.yaml is TRL's
examples/accelerate_configs/fsdp2.yaml, verbatim (https://github.com/huggingface/trl, f2cd577):
`distributed_type: FSDP`, `fsdp_version: 2`, `fsdp_reshard_after_forward: true`, no
fsdp_sharding_strategy (FSDP2 has none). A skill trial found it read as plain DDP (zero_stage 0:
every rank holding all of Qwen2.5-7B's states, "480% of the GPU"), TRL's `trl/scripts/sft.py`
not recognised as a training script, and the fixes written in DeepSpeed's keys."""

from __future__ import annotations

from pathlib import Path

from recompute_kit.sources.resolve import resolve

FSDP2 = Path(__file__).parent / "corpus" / "accelerate" / "trl_fsdp2.yaml"
# TRL's SFT command as its docs give it, under this config (the trial's launch.sh)
LAUNCH = (
    "accelerate launch --config_file fsdp2.yaml trl/scripts/sft.py \\\n"
    "    --model_name_or_path Qwen/Qwen2.5-7B \\\n"
    "    --dataset_name trl-lib/Capybara \\\n"
    "    --per_device_train_batch_size 2 \\\n"
    "    --gradient_accumulation_steps 8 \\\n"
    "    --max_length 4096 \\\n"
    "    --gradient_checkpointing \\\n"
    "    --bf16 \\\n"
    "    --learning_rate 2e-5\n"
)


def test_fsdp2_reshard_after_forward_is_full_sharding():
    r = resolve([str(FSDP2)], require_shape=False).reading
    assert r.get("zero_stage") == 3 and r.get("use_torch_fsdp2") is True
    assert "reshard_after_forward" in r.origins["zero_stage"].describe()
    assert r.get("param_offload") is False


def test_trls_sft_script_is_a_training_command_and_its_fix_is_in_fsdp_config_keys(tmp_path):
    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    launch = tmp_path / "launch.sh"
    launch.write_text(LAUNCH)
    r = resolve([str(launch), str(FSDP2)], overrides={"data_parallel_size": 4})
    assert r.reading.get("micro_batch_size") == 2 and r.reading.get("seq_length") == 4096
    weights = r.config.parallel
    assert weights.zero_stage == 3  # the 7B states sharded over the 4 ranks, not held whole
    d = diagnose(
        collect(config=[str(launch), str(FSDP2)], overrides={"data_parallel_size": 4}),
        gpu_memory_gb=23.64,
    )
    patches = [f.config_patch or {} for f in d.findings if f.category == "model_state_memory"]
    assert {"fsdp_config.fsdp_offload_params": True} in patches
    assert not any("zero_optimization" in p for p in patches)
    # and no DeepSpeed advice beside it for the same offload ("Patch left out: optimizer_offload
    # (... set through deepspeed zero_optimization...)", a second trial)
    dropped = [x["key"] for f in d.findings for x in (f.patch_check or {}).get("dropped", [])]
    assert "optimizer_offload" not in dropped and "param_offload" not in dropped


def test_trls_use_peft_is_a_frozen_base(tmp_path):
    # TRL's ModelConfig --use_peft (with --lora_r): LoRA adapters on the frozen model
    launch = tmp_path / "launch.sh"
    launch.write_text(
        LAUNCH.replace("--learning_rate 2e-5", "--learning_rate 2e-5 --use_peft --lora_r 16")
    )
    r = resolve([str(launch), str(FSDP2)], overrides={"data_parallel_size": 4})
    assert r.reading.get("frozen_base") is True
    assert (
        r.reading.origins["frozen_base"]
        .describe()
        .endswith(
            "--use_peft (TRL: LoRA adapters on frozen base weights; the adapters' own states "
            "(rank x targets) not counted)"
        )
    )


def test_the_launchers_unsaid_gpu_count_is_not_asked_for_once_given(tmp_path):
    # A skill trial: "the launcher's GPU count is not on the command line ... give --dp" stayed
    # after --dp 4 was given and the Accelerate config's num_processes was read.
    launch = tmp_path / "launch.sh"
    launch.write_text(LAUNCH)
    alone = resolve([str(launch)], require_shape=False).reading
    assert any("GPU count is not on the command line" in w for w in alone.warnings)
    for inputs, dp in (([str(launch), str(FSDP2)], None), ([str(launch)], 4)):
        over = {"data_parallel_size": dp} if dp else {}
        r = resolve(inputs, overrides=over, require_shape=False).reading
        assert not any("GPU count is not on the command line" in w for w in r.warnings)


def test_a_copy_of_trl_s_sft_script_and_dtype_bfloat16_under_fsdp2_mixed_precision(tmp_path):
    """A skill trial ran TRL's sft.py as a local copy with `--dtype bfloat16 --bf16` under
    Accelerate's FSDP2: the copy was not known as TRL's (the loss counted as full fp32 logits,
    where SFTConfig's default is chunked_nll), and `--dtype` (TRL 1.x's name for torch_dtype)
    gave 16-bit states, where Accelerate upcasts a 16-bit model's trainable parameters to fp32
    under mixed precision (accelerate utils/fsdp_utils.py fsdp2_prepare_model)."""
    import shutil

    script = Path(__file__).parents[1] / "data/launch/trl_fsdp2/trl/scripts/sft.py"
    shutil.copy(script, tmp_path / "sft.py")
    launch = tmp_path / "launch.sh"
    launch.write_text(
        "accelerate launch --config_file fsdp2.yaml --num_processes 32 sft.py \\\n"
        "    --model_name_or_path meta-llama/Llama-3.1-70B --dataset_name trl-lib/Capybara \\\n"
        "    --dtype bfloat16 --bf16 --per_device_train_batch_size 2 \\\n"
        "    --gradient_checkpointing --max_length 8192\n"
    )
    r = resolve([str(launch), str(FSDP2)], require_shape=False).reading
    assert "SFT script" in r.format
    assert r.get("fused_linear_cross_entropy") is True  # TRL's chunked_nll, assumed and said
    assert r.get("param_precision") == "amp" and "upcasts" in r.origins["param_precision"].where
    assert not [w for w in r.warnings if "torch_dtype is ModelConfig's dtype" in w]
    # the name TRL had before 0.23 (gone from 0.27): read, and said
    launch.write_text(launch.read_text().replace("--dtype", "--torch_dtype"))
    old = resolve([str(launch), str(FSDP2)], require_shape=False).reading
    assert old.get("param_precision") == "amp"
    assert [w for w in old.warnings if "torch_dtype is ModelConfig's dtype from trl 0.23" in w]


def test_the_handbook_s_launch_with_trlparser_s_config_flag(tmp_path):
    """alignment-handbook's README launch: `accelerate launch --config_file
    recipes/accelerate_configs/fsdp.yaml scripts/sft.py --config recipes/.../config_full.yaml`
    (https://github.com/huggingface/alignment-handbook/blob/925acdfe4b2b4e38c3dabd1851bc418f0b656351/README.md,
    TrlParser's --config). A re-trial got "no training command found"."""
    import shutil

    corpus = Path(__file__).parent / "corpus" / "hf_trainer"
    (tmp_path / "recipes/accelerate_configs").mkdir(parents=True)
    (tmp_path / "recipes/zephyr-7b-beta/sft").mkdir(parents=True)
    shutil.copy(corpus / "accelerate_fsdp.yaml", tmp_path / "recipes/accelerate_configs/fsdp.yaml")
    recipe = tmp_path / "recipes/zephyr-7b-beta/sft/config_full.yaml"
    shutil.copy(corpus / "zephyr-7b-beta_sft_config_full.yaml", recipe)
    for flag in ("--config recipes", "--config=recipes"):
        launch = tmp_path / "launch.sh"
        launch.write_text(
            "ACCELERATE_LOG_LEVEL=info accelerate launch --config_file "
            f"recipes/accelerate_configs/fsdp.yaml scripts/sft.py {flag}/zephyr-7b-beta/sft/"
            "config_full.yaml\n"
        )
        r = resolve([str(launch)], require_shape=False).reading
        assert r.model_name == "mistralai/Mistral-7B-v0.1", flag
        assert r.get("micro_batch_size") == 16 and r.get("recompute_granularity") == "full"
        assert r.get("zero_stage") == 3 and r.get("world_size") == 8
