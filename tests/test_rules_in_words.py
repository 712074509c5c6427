"""Tests of the rules in recompute_kit/doctor/rules/in_words.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top


@covers("RK501")
def test_fb_allocation_larger_than_any_gpu_stated_in_words():
    # https://github.com/hpcaitech/Open-Sora/issues/70: expand_mask_4d "will try to allocate
    # 720gb" at ~200k sequence length: a dense 4-d mask no GPU holds
    f = top(run(text("fb-opensora-70-mask-720gb")))
    assert f.rule == "RK501" and f.category == "allocation_exceeds_device"
    assert f.config_patch == {"attn_implementation": "flash_attention_2"}


def test_fb_allocation_in_words_that_fits_a_gpu_is_not_rk501():
    d = run("When the sequence length ~ 8k this will try to allocate 40gb.")
    assert "RK501" not in [f.rule for f in d.findings]


@covers("RK640")
def test_r6s_ppo_four_models_colocated_by_torchrun():
    # https://github.com/OpenRLHF/OpenRLHF/issues/277: PPO of a 13B model with torchrun on 4
    # GPUs, ZeRO-2; the maintainer: "use Ray: train_ppo_ray.py"
    d = run(
        text("r6s-openrlhf277-ppo13b-prose"),
        config=text("r6s-openrlhf277-ppo13b-cmd"),
        config_name="run.sh",
    )
    f = top(d)
    assert f.rule == "RK640" and f.category == "model_state_memory"
    assert "4 models" in f.evidence and "4 GPU(s)" in f.evidence and "ZeRO stage 2" in f.evidence
    # actor and critic: 13e9 x (2 + 14/4) bytes; reference and reward: 13e9 x 2 bytes
    assert "actor 66.59 GiB" in f.evidence and "ref 24.21 GiB" in f.evidence
    assert "181.61 GiB" in f.evidence
    assert f.config_patch["zero_stage"] == 3 and f.config_patch["adam_offload"] is True
    assert "train_ppo_ray" in f.fix + str(f.config_patch)


def test_r6s_ppo_through_ray_launcher_is_not_colocated():
    # the same run launched with the Ray script places each model on GPUs of its own
    cmd = text("r6s-openrlhf277-ppo13b-cmd").replace("train_ppo.py", "train_ppo_ray.py")
    d = run(text("r6s-openrlhf277-ppo13b-prose"), config=cmd, config_name="run.sh")
    assert "RK640" not in ids(d)


def test_r6s_ppo_small_model_fits():
    # a 1B actor: four models fit on an 80 GB GPU, no OOM said: not this rule
    cmd = text("r6s-openrlhf277-ppo13b-cmd").replace("codellama_13b", "codellama_1b")
    prose = text("r6s-openrlhf277-ppo13b-prose").replace("codellama-13b", "codellama-1b")
    assert "RK640" not in ids(run(prose, config=cmd, config_name="run.sh"))


def test_rk640_openrlhf_placement_is_not_advised_for_a_nemo_rl_config():
    # NeMo-RL places its policy / reference itself: a GRPO config of it with an OOM must not get
    # OpenRLHF's --actor_num_gpus_per_node advice (a skill trial found it did).
    from pathlib import Path

    corpus = Path(__file__).parent / "sources" / "corpus" / "nemo_rl"
    name = "dpo-llama3.1-8b-instruct-4n8g-megatrontp2pp2-quick.yaml"
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a "
        "total capacity of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
        "this process has 78.08 GiB memory in use. Of the allocated memory 74.12 GiB is "
        "allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but unallocated.\n"
    )
    d = run(oom, config=(corpus / name).read_text(), config_name=name)
    assert "RK640" not in ids(d)
    assert not any("--actor_num_gpus_per_node" in f.fix for f in d.findings)


@covers("RK640")
def test_rk640_not_for_a_framework_that_places_its_models_seen_in_the_frames():
    # NeMo-RL DPO on gpt-oss-120b (https://github.com/NVIDIA-NeMo/RL/issues/2859): the frames
    # are NeMo-RL's Megatron worker; OpenRLHF's per-GPU model count and launcher do not apply
    assert "RK640" not in ids(run(text("nemorl-2859-dpo-float16-to-fp32")))
