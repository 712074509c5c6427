"""RK640 (several models of an RLHF run on every GPU) and RK645 (ranks creating CUDA contexts
on GPU 0), on verbatim real pastes (sources in rule_helpers.SOURCES)."""

from __future__ import annotations

from rule_helpers import covers, ids, run, text, top


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


@covers("RK645")
def test_r6s_ranks_context_on_device0():
    # https://github.com/pytorch/pytorch/issues/135279: "Each non-0 rank is occupying ~ 1GB
    # memory on GPU 0." with torch.cuda.set_device commented out
    d = run(text("r6s-pt135279-ranks-device0"))
    f = top(d)
    assert f.rule == "RK645" and f.category == "other_processes"
    assert "non-0 rank" in f.evidence and "commented out" in f.evidence
    assert "set_device" in f.fix and "CUDA_VISIBLE_DEVICES" in f.fix
    assert "LOCAL_RANK" in f.config_patch["code"]


def test_r6s_set_device_called_without_symptom_is_silent():
    code = text("r6s-pt135279-ranks-device0").split("\n", 2)[2].replace("#torch", "torch")
    assert "RK645" not in ids(run(code))
