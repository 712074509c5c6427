"""The rule catalog itself, and the default readings when no specific rule fires (RK170,
RK171, RK190, RK191). Texts and sources: tests/rule_helpers.py."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from rule_helpers import (
    COVERED,
    DATA,
    SOURCES,
    cites,
    covers,
    get,
    ids,
    run,
    text,
    top,
)

from recompute_kit.doctor.evidence import (
    parse_config,
)
from recompute_kit.doctor.rules import (
    CATEGORIES,
    EXPANDABLE,
    RULES,
    catalog_markdown,
)

# =============================================================================================
# The catalog itself
# =============================================================================================


def test_rule_ids_are_unique_and_well_formed():
    found = [r.id for r in RULES]
    assert len(found) == len(set(found)), "duplicate rule ids"
    assert all(re.fullmatch(r"RK\d{3}", i) for i in found)
    assert found == sorted(found), "rules are listed in id order"
    assert len(RULES) >= 49


def test_rule_categories_and_docs_are_valid():
    assert len(CATEGORIES) == len(set(CATEGORIES))
    for r in RULES:
        assert r.category in CATEGORIES, (r.id, r.category)
        for part in (r.title, r.symptom, r.cause, r.confirm, r.fix):
            assert part.strip(), (r.id, "empty documentation")
        assert isinstance(r.config_patch, dict)
        assert set(r.supersedes) <= {x.id for x in RULES}, (r.id, r.supersedes)
        assert r.id not in r.supersedes
        doc = r.doc()
        assert doc["rule"] == r.id and doc["category"] == r.category


def test_catalog_markdown_lists_every_rule_in_a_well_formed_table():
    md = catalog_markdown()
    lines = md.splitlines()
    header = "| id | category | symptom | cause | confirm | fix |"
    start = lines.index(header)
    assert lines[start + 1] == "|---|---|---|---|---|---|"
    rows = [line for line in lines[start + 2 :] if line.startswith("| RK")]
    assert len(rows) == len(RULES)
    assert f"{len(RULES)} rules." in md
    for r, row in zip(RULES, rows, strict=True):
        assert row.startswith(f"| {r.id} | {r.category} | **")
        assert row.endswith(" |")
        # six cells: split on unescaped pipes only
        cells = re.split(r"(?<!\\)\|", row)[1:-1]
        assert len(cells) == 6, (r.id, cells)
        assert "\n" not in row
    # a pipe inside a cell is escaped, not a column break
    assert all(r.id in md for r in RULES)


def test_every_rule_has_a_named_test():
    # The tests live in several files: import them all (already imported ones are reused), so
    # that a run of this file alone sees every `covers`.
    for path in sorted(Path(__file__).parent.glob("test_rules_*.py")):
        importlib.import_module(path.stem)
    missing = sorted({r.id for r in RULES} - set(COVERED))
    assert not missing, f"rules without a test: {missing}"
    unknown = sorted(set(COVERED) - {r.id for r in RULES})
    assert not unknown, f"tests name unknown rules: {unknown}"


def test_sources_exist_for_every_data_file():
    files = {p.stem for p in DATA.glob("*.txt")}
    assert files == set(SOURCES), files ^ set(SOURCES)


# =============================================================================================
# RK170-RK171: default readings when no specific rule fires. Texts are tests/data/rules/i17-*
# (and two i13 ones), verbatim from dev corpus cases (URLs in SOURCES); "[... cut by corpus ...]"
# marks where the case's author cut the thread's text.
# =============================================================================================


@covers("RK170")
def test_rk170_llamafactory_command_halves_the_batch_and_keeps_the_global_one():
    # https://github.com/hiyouga/LlamaFactory/issues/922: only the launch command is pasted;
    # maintainer: one over-long sample blew up the GPU, reduce the batch size.
    d = run(text("i13-llamafactory-922"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory" and len(d.findings) == 1
    assert f.config_patch == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
    assert f.evidence.startswith("Default reading")
    cites(f, "per_device_train_batch_size = 4", "gradient_accumulation_steps = 4", "LoRA")
    cites(f, "LlamaFactory's default: on")  # checkpointing absent: on in LlamaFactory
    assert f.fix.startswith("Activation memory, cheapest change first: 1. ")
    assert "2. cap the tokens per sample (cutoff_len" in f.fix


@covers("RK170")
def test_rk170_checkpointing_switched_off_in_the_config_under_its_own_key():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/2585: "CUDA OOM" in a results table, and a
    # config with distributed.activation_checkpointing false; the merged fix turns it on.
    d = run(text("i17-automodel-2585"), config=text("i17-automodel-2585-config"))
    f = top(d)
    assert f.rule == "RK170" and f.category == "activation_memory"
    assert f.config_patch == {"distributed.activation_checkpointing": True}
    cites(f, "CUDA OOM", "(off)")
    # the table's header names the switch (comparing on with off): not a state of the run
    d = run(text("i17-automodel-2585"))
    assert top(d).config_patch == {"activation_checkpointing": True}
    assert "CUDA OOM" in top(d).evidence


@covers("RK170")
def test_rk170_plain_argparse_flags_batch_first_and_checkpointing_absent_is_off():
    # https://github.com/openai/improved-diffusion/issues/3: TRAIN_FLAGS="--lr 1e-4
    # --batch_size 4"; maintainer: try --microbatch or --use-checkpoint.
    d = run(text("i17-improved-diffusion-3"))
    f = top(d)
    assert f.rule == "RK170" and f.config_patch == {"batch_size": 2}
    cites(f, "batch_size = 4", "gradient checkpointing: not in the paste (off")
    assert "global batch halves unless the script accumulates" in f.fix
    assert "2. activation (gradient) checkpointing" in f.fix


@covers("RK170")
def test_rk170_names_the_sequence_caps_the_paste_sets():
    # https://github.com/THUDM/slime/issues/1450: the rollout length caps; the OOM came from a
    # sample longer than rollout_max_context_len that SFT rollout did not truncate.
    d = run(config=text("i17-slime-1450-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK170"
    cites(f, "rollout_max_context_len = 8192", "no OOM message pasted")
    assert "rollout_max_context_len 8192 -> 4096" in f.fix and f.config_patch


@covers("RK171")
def test_rk171_full_fine_tune_at_batch_1_with_zero3_offloads_the_optimizer():
    # https://github.com/hiyouga/LlamaFactory/issues/5977: full fine-tuning of Llama-3-8B with
    # ds_z3_config.json OOMs on 3090s, ds_z3_offload_config.json runs (maintainer: normal).
    d = run(text("i13-llamafactory-5977"))
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory" and len(d.findings) == 1
    assert f.config_patch == {"deepspeed": "examples/deepspeed/ds_z3_offload_config.json"}
    cites(f, "~8.0B parameters", "per_device_train_batch_size = 1", "ZeRO stage 3")
    cites(f, "119.21 GiB", "does not count the GPUs")
    assert "finetuning_type: lora" in f.fix and "recompute cannot free" in f.fix


@covers("RK171")
def test_rk171_model_size_unnamed_but_batch_1_and_checkpointing_on():
    # https://github.com/Alpha-VLLM/LLaMA2-Accessory/issues/26: --batch_size 1 --checkpointing
    # --model_parallel_size 2 on 2 GPUs; maintainer: optimizer states of a full fine-tune need
    # more GPUs, or parameter-efficient tuning.
    d = run(text("i17-llama2-accessory-26"))
    f = top(d)
    assert f.rule == "RK171" and f.category == "model_state_memory"
    assert f.config_patch == {"model_parallel_size": 4, "nproc_per_node": 4}
    cites(f, "batch_size = 1", "checkpointing = True (on)", "full training assumed")
    assert "LoRA" in f.fix


def test_default_readings_only_when_nothing_else_fires():
    # https://github.com/NVIDIA-NeMo/Automodel/pull/1975: a real OOM message makes RK087 fire;
    # with LlamaFactory#922's command added the default readings stay silent.
    d = run(text("i12-automodel-1975") + "\n" + text("i13-llamafactory-922"))
    assert d.findings and not {"RK170", "RK171"} & set(ids(d))
    # https://github.com/pytorch/pytorch/issues/116928: a memory summary saying
    # "CUDA OOMs: 0" is no OOM, and it has no training knobs: no RK170/RK171; its peak is read
    # by the memory-figures default reading RK265 alone
    assert ids(run(text("i17-mistral-116928-summary"))) == ["RK265"]
    # real-formats.md oom-pt-16417-title: 9.28 GiB free yet OOM: no knob reading either; the
    # driver reading (RK421) alone
    assert ids(run(text("oom-pt-16417-title"))) == ["RK421"]


@covers("RK170", "RK171")
def test_batch_1_with_checkpointing_disabled_is_still_an_activation_reading():
    # https://github.com/hiyouga/LlamaFactory/issues/5977's YAML with LlamaFactory's switch
    # disable_gradient_checkpointing set: activations still have room, so RK170 (not RK171)
    # and the first step is the framework's own key.
    d = run(text("i13-llamafactory-5977"), config="disable_gradient_checkpointing: true\n")
    f = top(d)
    assert f.rule == "RK170" and "RK171" not in ids(d)
    assert f.config_patch == {"disable_gradient_checkpointing": False}
    cites(f, "disable_gradient_checkpointing = True (off)")


# =============================================================================================
# RK190-RK191: what a report states in prose next to an OOM. Texts are tests/data/rules/i19-*,
# verbatim from dev corpus cases (URLs in SOURCES).
# =============================================================================================


@covers("RK190")
def test_rk190_pr_places_the_oom_at_the_first_optimizer_step():
    # https://github.com/verl-project/verl/pull/5364: "Baseline can OOM at the first optimizer
    # step due to Adam lazy state init"; the PR streams optimizer states per layer.
    d = run(text("i19-verl-5364"))
    f = top(d)
    assert f.rule == "RK190" and f.category == "model_state_memory"
    assert f.config_patch == {"zero_optimization": {"stage": 3}}
    cites(f, "first optimizer step")
    assert "optimizer_offload" in f.fix and "Recompute cannot free them" in f.fix
    # a Megatron command names its own key
    d = run(text("i19-verl-5364"), config="tensor_model_parallel_size: 2\n")
    assert top(d).config_patch == {"use_distributed_optimizer": True}
    # an OOM line that names no optimizer is not this rule's
    assert "RK190" not in ids(run("Baseline can OOM at step 2 of the rollout\n"))


@covers("RK191")
def test_rk191_pr_quantifies_reserved_but_unallocated_memory():
    # https://github.com/NovaSky-AI/SkyRL/pull/1768: "the baseline OOMs at step 2 (~20 GiB
    # reserved-but-unallocated); the trainer flag makes all 5 steps pass" (expandable_segments).
    d = run(text("i19-skyrl-1768"))
    f = top(d)
    assert f.rule == "RK191" and f.category == "fragmentation"
    assert f.config_patch == EXPANDABLE
    cites(f, "20 GiB reserved but unallocated")
    # under a GiB stranded is no diagnosis; PyTorch's own wording is RK001's, not this rule's
    assert "RK191" not in ids(run("the run OOMs (~300 MiB reserved-but-unallocated)\n"))


# Generic memory findings (RK087, RK005, RK004, RK102) in the paste's own knobs
# (rules/knob_advice.py); launch scripts whose flags sit in shell variables.
# =============================================================================================


def test_megatron_example_script_flags_in_quoted_shell_variables():
    # NVIDIA/Megatron-LM examples/pretrain_gpt_distributed.sh, verbatim (SOURCES): every flag
    # sits in a quoted, backslash-continued variable (GPT_ARGS="..."), expanded on the torchrun
    # line as $GPT_ARGS; GPUS_PER_NODE=8 is expanded inside DISTRIBUTED_ARGS.
    script = text("i22-mlm-pretrain-gpt-distributed")
    for flat in (parse_config(script, "pretrain_gpt_distributed.sh"), run(script).evidence.config):
        assert flat["micro_batch_size"] == 8 and flat["global_batch_size"] == 64
        assert flat["num_layers"] == 24 and flat["seq_length"] == 1024 and flat["fp16"] is True
        assert flat["nproc_per_node"] == 8 and flat["split"] == "949,50,1"
    # The default reading then names the script's own knob with its value.
    f = top(run(config=script, config_name="pretrain_gpt_distributed.sh"))
    assert f.rule == "RK170" and "micro_batch_size = 8" in f.evidence
    assert f.config_patch == {"micro_batch_size": 4}


def test_shell_variable_with_flags_on_its_first_line_is_read_where_expanded():
    # The same script's GPT_ARGS block as users paste it with the first flag on the opening
    # line (the quote, then --num-layers): read where the launch line expands $GPT_ARGS, a
    # flag before it not taking "$GPT_ARGS" as its value.
    script = text("i22-mlm-pretrain-gpt-distributed")
    block = script[script.index("GPT_ARGS=") : script.index("DATA_ARGS=")]
    block = block.replace('GPT_ARGS="\n    --num-layers', 'GPT_ARGS="--num-layers')
    pasted = block + "torchrun pretrain_gpt.py --use-distributed-optimizer $GPT_ARGS\n"
    for flat in (parse_config(pasted, "run.sh"), run(pasted).evidence.config):
        assert flat["num_layers"] == 24 and flat["micro_batch_size"] == 8
        assert flat["use_distributed_optimizer"] is True


@covers("RK087")
def test_rk087_names_the_scripts_knobs_and_patches_them():
    # A real training OOM (https://github.com/NVIDIA-NeMo/Automodel/pull/1975: 4.34 GiB
    # request, 2.59 GiB free) with the Megatron-LM example script as the config: the finding
    # names micro_batch_size = 8, patches it and Megatron's own recompute key, and relates
    # the change to the request.
    d = run(
        text("i12-automodel-1975"),
        config=text("i22-mlm-pretrain-gpt-distributed"),
        config_name="pretrain_gpt_distributed.sh",
    )
    f = get(d, "RK087")
    assert f.config_patch == {"micro_batch_size": 4, "recompute_granularity": "selective"}
    cites(f, "micro_batch_size = 8", "seq_length = 1024", "1.75 GiB", "2.17 GiB")
    assert "micro_batch_size 8 -> 4" in f.fix and "selective" in f.fix
    assert "halve micro_batch_size" in f.fix  # the rule's own fix text is kept


@covers("RK102")
def test_rk102_halves_the_pasted_batch_and_says_what_it_frees():
    # https://github.com/BaberMuyu/2020CCF-NER/issues/6 (dev corpus case): a 294 MiB request
    # with 61.62 MiB free on a 7.79 GiB GPU, batch_size 16; the author: lower batch_size.
    d = run(text("i22-ccf-ner-6"), config=text("i22-ccf-ner-6-config"))
    f = get(d, "RK102")
    # 617.88 MiB "cached" (split blocks) is twice the request but under 10% of the GPU: not
    # fragmentation worth the name, so the small-GPU reading leads and RK001 follows
    assert top(d).rule == "RK102" and ids(d).index("RK001") > 0
    assert f.config_patch == {"batch_size": 8}  # a plain script: no checkpoint key to set
    cites(f, "batch_size = 16", "232.38 MiB", "147.00 MiB", "6.27 GiB")
    assert "batch_size 16 -> 8" in f.fix and "larger GPU" in f.fix
