"""Fresh real pastes written in Chinese around (or instead of) the English error, and the
normalisation that gives their Chinese phrasings the English wording the parsers read
(recompute_kit/doctor/evidence/cjk.py). Every doctor test names its thread's URL and what the
thread gave as the cause or remedy; none of these threads is a corpus case."""

from __future__ import annotations

import pytest
from rule_helpers import covers, run, text, top

from recompute_kit.doctor.evidence.cjk import PREFIX, english_for, translate_cjk

# ---- the mapping ----------------------------------------------------------------------------


def test_english_text_comes_back_unchanged():
    log = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.14 GiB.\n"
        "training is 20% slower with recompute\n"
    )
    assert translate_cjk(log) is log
    assert translate_cjk("") == ""


def test_chinese_without_known_phrases_comes_back_unchanged():
    log = "请问这个是什么原因？谢谢！\n"
    assert translate_cjk(log) is log


def test_original_chinese_stays_and_the_english_follows_its_line():
    log = "为什么我在训练的时候显存会一直增加到爆了\nRuntimeError: boom\n"
    out = translate_cjk(log)
    lines = out.splitlines()
    assert lines[0] == "为什么我在训练的时候显存会一直增加到爆了"  # kept verbatim, first
    assert lines[1] == f"{PREFIX}memory keeps growing. out of memory."
    assert lines[2] == "RuntimeError: boom"
    assert out.endswith("\n")
    assert all(line in out.splitlines() for line in log.splitlines())


def test_no_trailing_newline_is_added():
    assert translate_cjk("训练变慢") == f"训练变慢\n{PREFIX}slower."


@pytest.mark.parametrize(
    ("chinese", "english"),
    [
        ("显存不足", "out of memory"),
        ("直接爆显存了", "out of memory"),
        ("显存溢出", "out of memory"),
        ("跑了两步就OOM了", "out of memory"),
        ("开启后训练变慢", "slower"),
        ("速度慢", "slower"),
        ("吞吐下降明显", "slower"),
        ("训练速度大约慢20%左右", "20% slower"),
        ("开启重计算", "activation recompute"),
        ("激活值重计算", "activation recompute"),
        ("梯度检查点", "gradient checkpointing"),
        ("显存泄漏", "memory leak"),
        ("疑似显存泄露", "memory leak"),
        ("显存一直增长", "memory keeps growing"),
        ("训练过程中显存占用持续上涨", "memory keeps growing"),
        ("加载模型时报错", "while loading the model"),
        ("升级到2.1后", "after upgrading to 2.1"),
        ("升级后", "after upgrading"),
        ("更新到0.3.0版本后", "after upgrading to 0.3.0"),
        ("之前版本正常", "it worked fine in the previous version"),
        ("我之前使用的是0.2.0版本", "it worked fine in 0.2.0"),
        ("扩充词表", "vocabulary"),
        ("8卡训练", "8 GPUs"),
        ("单卡训练", "1 GPU"),
        ("两张A100", "2 GPUs"),
        ("报错", "error"),
    ],
)
def test_phrase(chinese, english):
    assert english in english_for(chinese)


def test_a_hypothetical_is_not_evidence():
    # https://github.com/IEIT-Yuan/Yuan-2.0/issues/18: "如果显存不够" (if memory is short)
    assert "out of memory" not in english_for("如果显存不够，是不是可以使用selective的模式")
    assert "out of memory" in english_for("显存不够，训练直接退出")


def test_a_phrase_said_twice_is_given_once():
    assert english_for("显存不足，显存不足") == ["out of memory"]


# ---- memory that keeps growing: a leak --------------------------------------------------------


@covers("RK266")
def test_fresh_cjk_memory_grows_until_it_bursts():
    # https://github.com/McGregorWwww/UDTransNet/issues/21: "显存会一直增加到爆了" (memory keeps
    # growing until it bursts); the fix given in the thread: loss_sum += loss.item(), not loss.
    # Before the normalisation: nothing fired.
    f = top(run(text("fh-udtransnet-21-grows-until-oom")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "loss.item()" in f.fix


def test_fresh_cjk_memory_keeps_growing_over_training():
    # https://github.com/laisimiao/Unet/issues/4: "显存持续增长" (memory keeps growing); the
    # maintainer: "看看是不是有什么tensor一直没有消掉" (some tensor is never released).
    # Before: nothing fired.
    f = top(run(text("fh-unet-4-keeps-growing")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "gc.collect()" in f.fix and "loss.item()" in f.fix


def test_fresh_cjk_memory_grows_with_loss_item_already_checked():
    # https://github.com/chenyuntc/simple-faster-rcnn-pytorch/issues/252: "out of memory
    # 训练的时候显存一直在增长" (memory keeps growing while training); the thread looks for what
    # keeps references (the tqdm wrapping order, the eval loop, pin_memory).
    # Before: RK170 (activation memory).
    f = top(run(text("fh-simple-faster-rcnn-252-grows-oom")))
    assert f.rule == "RK266" and f.category == "framework_bug"
    assert "gc.collect()" in f.fix


@pytest.mark.xfail(strict=True, reason="growth from longer samples reads as a leak")
def test_fresh_cjk_memory_grows_with_longer_samples_is_not_a_leak():
    # https://github.com/OpenSenseNova/piccolo-embedding/issues/10: memory grows over hours to
    # an OOM; the maintainer: not a leak, the later samples are longer (activation memory
    # grows with the input length). Before: RK170 (activation memory, right by chance);
    # after: RK266 (a leak): the paste gives no input lengths to tell the two apart.
    f = top(run(text("fh-piccolo-10-leak-until-oom")))
    assert f.category == "activation_memory"


# ---- recompute's cost, said in Chinese ------------------------------------------------------


@covers("RK560")
def test_fresh_cjk_recompute_about_twenty_percent_slower():
    # https://github.com/bojone/bert4keras/issues/368: "采用recompute_grad 训练速度大约慢20%左右"
    # (about 20% slower with recompute_grad). Before: nothing fired.
    f = top(run(text("fh-bert4keras-368-recompute-slower")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "20" in f.evidence
    assert "selective" in f.fix or "fewer layers" in f.fix


def test_fresh_cjk_recompute_trades_time_for_memory():
    # https://github.com/IEIT-Yuan/Yuan-2.0/issues/18: "激活值重计算 ... 增加了额外的计算量，相当于
    # 用时间换空间" (recompute adds compute: time for memory); the maintainers: no recompute
    # where memory suffices, otherwise choose its granularity (full vs selective) by memory.
    # Before: nothing fired.
    f = top(run(text("fh-yuan2-18-recompute-cost")))
    assert f.rule == "RK560" and f.category == "recompute_overhead"
    assert "Recompute less" in f.fix and "selective" in f.fix


# ---- a release that worked and the next that fails --------------------------------------------


@covers("RK600")
def test_fresh_cjk_oom_after_updating_to_the_next_release():
    # https://github.com/open-mmlab/mmocr/issues/541: "我之前使用的是0.2.0版本 ... 昨天更新到0.3.0
    # 版本后 ... 在测试时报错 : RuntimeError: CUDA out of memory" (0.2.0 worked; after updating
    # to 0.3.0 the test OOMs, the code unchanged). Before: RK102 (genuine pressure).
    f = top(run(text("fh-mmocr-541-oom-after-update")))
    assert f.rule == "RK600" and f.category == "framework_bug"
    assert "0.2.0" in f.fix and "0.3.0" in f.evidence
    assert f.config_patch == {"command": "pip install <the library>==0.2.0"}


@pytest.mark.xfail(strict=True, reason="an update with no release named gives no regression")
def test_fresh_cjk_oom_after_an_update_without_versions():
    # https://github.com/pkuliyi2015/multidiffusion-upscaler-for-automatic1111/issues/156:
    # "更新后，每次运行到98％-99％，稳定爆显存" (after the update it runs out of memory at 98-99%
    # every time); the author fixed it ("感谢作者修复"). Read: "after upgrading. out of memory.";
    # the regression rules need the two releases. Before and after: RK170.
    f = top(run(text("fh-multidiffusion-156-oom-after-update")))
    assert f.category == "framework_bug"


@pytest.mark.xfail(strict=True, reason="'lora works, full fails' is not read as model states")
def test_fresh_cjk_full_finetune_does_not_fit_one_gpu():
    # https://github.com/modelscope/ms-swift/issues/2282: "sft_type为lora的时候是正常的，
    # 改成full后报 ... CUDA out of memory" on one 80 GiB A800; the maintainer:
    # "单卡80GB 跑不起来的 要2卡" (one 80 GB GPU cannot run it, it needs 2 GPUs): model
    # states. Before and after: RK005.
    f = top(run(text("fh-swift-2282-full-oom")))
    assert f.category == "model_state_memory"
