"""Tests of the rules in recompute_kit/doctor/rules/checkpoint_api.py, one or more per rule, on
verbatim real text (tests/data/rules/, each file's URL in tests/rule_sources.py and in a
comment by the test). Texts, sources and the helpers: tests/rule_helpers.py."""

from __future__ import annotations

import pytest
from rule_helpers import (
    LLAMA3_8B_SELECTIVE,
    LLAMA3_70B_MLM_1031,
    MIXTRAL_8X7B_MLP,
    cites,
    covers,
    get,
    ids,
    intended_patch,
    run,
    spec_patch,
    text,
    top,
)

from recompute_kit.doctor.engine import diagnose
from recompute_kit.doctor.evidence import (
    ErrorEvent,
    Evidence,
)

# =============================================================================================
# RK050-RK064: Megatron's validation messages
# =============================================================================================

VALIDATION_CASES = [
    # (rule, data file, expected patch or None) - the tc-measured-* blocks are Megatron's
    # messages measured on core_v0.14.0 and main (real-formats.md, TransformerConfig).
    ("RK050", "tc-measured-full-no-method", spec_patch("full", "uniform", 1)),
    ("RK051", "tc-measured-full-no-num-layers", spec_patch("full", "uniform", 1)),
    ("RK052", "tc-measured-selective-with-num-layers", None),
    ("RK053", "tc-measured-full-bad-method", None),
    ("RK053", "tc-measured-bad-granularity", None),
    ("RK054", "tc-measured-selective-bad-module", None),
    ("RK055", "tc-measured-moe-act-without-grouped-gemm", {"moe_grouped_gemm": True}),
    ("RK056", "tc-measured-mla-up-proj-without-mla", None),
    ("RK057", "tc-measured-shared-experts-with-overlap", {"moe_shared_expert_overlap": False}),
    ("RK058", "mlm-rule17-delayed-scaling", {"fp8_recipe": "tensorwise"}),
    ("RK059", "tc-measured-cpu-offload-with-recompute", {"cpu_offloading": False}),
    ("RK060", "tc-measured-distribute-saved-with-sp", {"distribute_saved_activations": False}),
    ("RK060", "mlm-rule27-distribute-saved", {"distribute_saved_activations": False}),
    ("RK061", "mlm-rule20-fine-grained-offloading", None),
    ("RK062", "mlm-rule29-cuda-graphs", {"cuda_graph_impl": "none"}),
    ("RK062", "mbridge-skill-cuda-graph", {"cuda_graph_impl": "none"}),
    (
        "RK063",
        "tc-measured-moe-layer-recompute-with-full",
        spec_patch("selective", None, None, ["moe"]),
    ),
]


CONFIG_CASES = [
    # (rule, config text, name, quoted message) - configs Megatron would reject, caught
    # before a run by the kit's own validation (Megatron's messages).
    (
        "RK050",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  recompute_granularity: full\n  recompute_num_layers: 1\n",
        "bridge.yaml",
        'recompute_method must be "block" or "uniform"',
    ),
    (
        "RK055",
        "model.num_layers=32 model.hidden_size=4096 model.num_attention_heads=32 "
        "model.num_moe_experts=8 model.moe_router_topk=2 model.recompute_granularity=selective "
        "model.recompute_modules=[moe_act,layernorm]",
        "overrides.txt",
        "only supported with moe_grouped_gemm",
    ),
    (
        "RK058",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  num_moe_experts: 64\n  moe_grouped_gemm: true\n  fp8: hybrid\n  fp8_recipe: delayed\n"
        "  recompute_granularity: selective\n  recompute_modules: [moe_act, layernorm]\n",
        "fp8.yaml",
        "Delayed scaling does not support",
    ),
    (
        "RK059",
        "torchrun pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
        "--cpu-offloading-num-layers 8 --recompute-activations",
        "train.sh",
        "CPU offloading does not work when activation recomputation is enabled",
    ),
    (
        "RK061",
        "model:\n  num_layers: 32\n  hidden_size: 4096\n  num_attention_heads: 32\n"
        "  cpu_offloading: true\n  cpu_offloading_num_layers: 4\n"
        "  fine_grained_activation_offloading: true\n  offload_modules: [core_attn]\n",
        "offload.yaml",
        "cannot be enabled with cpu_offloading",
    ),
]


# =============================================================================================
# RK070-RK077: PyTorch / Hugging Face checkpoint API
# =============================================================================================

SELECTIVE_DEFAULT = {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}


CHECKPOINT_CASES = [
    ("RK070", "ckpt-local-grad-reentrant", "checkpoint_api_misuse", {"use_reentrant": False}),
    ("RK071", "ckpt-local-no-input-grad", "checkpoint_api_misuse", {"use_reentrant": False}),
    # The warning alone (no error): usually harmless (frozen blocks, no_grad), RK099 says so.
    (
        "RK099",
        "bnb-182",
        "informational",
        {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    ),
    # the use_reentrant warning alone (PyTorch >= 2.4 wording): informational, RK672 (RK072
    # reads it only beside a failure)
    (
        "RK672",
        "ckpt-local-use-reentrant-missing",
        "informational",
        {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    ),
    ("RK073", "ckpt-local-kwargs-reentrant", "checkpoint_api_misuse", {"use_reentrant": False}),
    ("RK074", "ckpt-local-ddp", "checkpoint_api_misuse", {"use_reentrant": False}),
    (
        "RK075",
        "ckpt-local-metadata",
        "nondeterministic_recompute",
        {"code": "torch.utils.checkpoint.set_checkpoint_debug_enabled(True)"},
    ),
    (
        "RK077",
        "chatglm-tuning-56",
        "invalid_config",
        {"command": "pip install -U transformers"},
    ),
    (
        "RK077",
        "transformers-17464",
        "invalid_config",
        {"command": "pip install -U transformers"},
    ),
    ("RK081", "roformer-39", "framework_bug", SELECTIVE_DEFAULT),
    ("RK081", "nemo-speech-14241", "framework_bug", SELECTIVE_DEFAULT),
    (
        "RK082",
        "mbridge-2684",
        "invalid_config",
        {"cpu_offloading_activations": True, "cpu_offloading_weights": False},
    ),
]


# =============================================================================================
# nondeterministic_recompute
# =============================================================================================


@covers("RK075")
def test_fresh_cat_recompute_doubles_the_sequence_length_kv_cache():
    # https://github.com/pytorch/pytorch/issues/155171: saved [1, 12, 171, 128], recomputed
    # [1, 12, 342, 128] (the paste is cut inside the dtype); the maintainer: the forward updates
    # global state (past_key_value.update), so the recompute runs differently.
    f = top(run(text("fa-nd-kvcache-qwen2-pt155171")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "use_cache=False" in f.fix and f.config_patch == {"use_cache": False}
    assert "171" in f.evidence and "342" in f.evidence


def test_fresh_cat_halved_length_is_not_a_kv_cache():
    # Mutation of the paste above: a recompute with half the length (context parallel
    # sharding, not a cache) must not read as a KV cache.
    halved = text("fa-nd-kvcache-qwen2-pt155171").replace("342", "85")
    f = top(run(halved))
    assert f.rule == "RK075" and "use_cache" not in str(f.config_patch)


@covers("RK075")
def test_fresh_cat_fsdp2_recompute_in_float32():
    # https://github.com/pytorch/pytorch/issues/159359 (fixed by pytorch#182580: FSDP2 casts
    # the forward inputs in the recompute): saved bfloat16, recomputed float32 under FSDPv2.
    f = top(run(text("fa-nd-fsdp2-dtype-pt159359")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "Upgrade torch" in f.fix and "fully_shard" in f.fix
    assert "torch>=2.13" in f.config_patch["command"]


def test_fresh_cat_dtype_mismatch_without_fsdp2_is_autocast():
    plain = text("fa-nd-fsdp2-dtype-pt159359").replace("FSDPv2", "DDP")
    f = top(run(plain))
    assert f.rule == "RK075" and f.config_patch == {"use_reentrant": False}


def test_fresh_cat_backward_twice_with_a_checkpoint_frame_stays_rk093():
    # The same error with the user's checkpointed blocks in the traceback is RK093's.
    log = (
        'File "train.py", line 5, in forward\n    x = checkpoint(self.block, x)\n'
        'File "/x/torch/utils/checkpoint.py", line 1, in backward\n'
        "RuntimeError: Trying to backward through the graph a second time (or directly access "
        "saved tensors after they have already been freed)."
    )
    assert top(run(log)).rule == "RK093"


# =============================================================================================
# RK074: DDP marks a parameter ready twice under the reentrant checkpoint
# =============================================================================================


@covers("RK074")
def test_fresh_rk074_ddp_ready_twice_with_parameter_name():
    # https://github.com/microsoft/FocalNet/issues/4 (torch 1.10 wording, names the parameter)
    f = top(run(text("fr-ddp-ready-twice-focalnet")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"
    assert "_set_static_graph" in f.fix and f.config_patch == {"use_reentrant": False}


@covers("RK074")
def test_fresh_rk074_ddp_ready_twice_older_wording():
    # https://github.com/allenai/longformer/issues/63 (older wording: "DDP does not support
    # such use cases yet. 3) Incorrect unused parameter detection ...")
    f = top(run(text("fr-ddp-ready-twice-longformer")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"


@covers("RK074")
def test_fresh_rk074_ddp_ready_twice_after_reentrant_frames():
    # https://github.com/bytedance/ibot/issues/30 (frames of checkpoint.py's backward first)
    f = top(run(text("fr-ddp-ready-twice-ibot")))
    assert f.rule == "RK074" and "use_reentrant=False" in f.fix


# =============================================================================================
# RK099 / RK149: 'None of the inputs have requires_grad=True' harmless vs gradients lost
# =============================================================================================


@covers("RK099")
def test_fresh_rk099_warning_at_inference_is_harmless():
    # https://github.com/petko-nikolov/pysemseg/issues/5 (inference under no_grad and eval)
    f = top(run(text("fr-noreqgrad-pysemseg")))
    assert f.rule == "RK099" and f.category == "informational"


@covers("RK099")
def test_fresh_rk099_warning_with_a_frozen_tower():
    # https://github.com/2U1/Qwen-VL-Series-Finetune/issues/56 (frozen vision tower)
    f = top(run(text("fr-noreqgrad-qwenvl")))
    assert f.rule == "RK099" and "RK149" not in ids(run(text("fr-noreqgrad-qwenvl")))


@covers("RK149")
def test_fresh_rk149_warning_and_parameters_not_optimized():
    # https://github.com/Lyken17/pytorch-memonger/issues/4: the warning, and the reporter sees
    # that layer1's parameters "can't be optimized" (inputs without requires_grad).
    f = top(run(text("fr-noreqgrad-memonger")))
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert "use_reentrant=False" in f.fix and "enable_input_require_grads" in f.fix
    assert "can't be optimized" in f.evidence


@covers("RK149")
def test_fresh_rk149_lora_gradients_none_with_checkpointing():
    # https://github.com/microsoft/LoRA/issues/120: no warning pasted, only the report that
    # with gradient checkpointing the LoRA gradients are 'None' and lora_A/B never update.
    f = top(run(text("fr-lora-grads-none-mslora")))
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert "enable_input_require_grads" in f.fix and f.config_patch == {"use_reentrant": False}


def test_fresh_rk149_not_without_checkpointing_named():
    # A report of None gradients that names no checkpointing is not this rule's.
    report = "all gradients will be 'None', so lora_A and B will not be updated"
    assert "RK149" not in ids(run(report))


@covers("RK075")
def test_fresh_rk075_shifted_shapes_are_not_moe_routing():
    # https://github.com/mihirp1998/VADER/issues/9 (LoRA video diffusion, no MoE): the paste puts
    # two pairs before the exception line and one after; the shapes at the same positions have
    # other ranks (another op sequence), so one pair whose leading dimension moved (4 -> 128)
    # is not token routing.
    f = top(run(text("fr-metadata-vader")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "router" not in str(f.config_patch)
    assert "set_checkpoint_debug_enabled" in f.fix


@covers("RK075")
def test_fresh_rk075_sequence_dimension_halved():
    # https://github.com/huggingface/trl/issues/4314 (LoRA + FSDP2 context parallel)
    f = top(run(text("fr-metadata-cp-trl")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"


# =============================================================================================
# RK093: backward through the graph twice; RK073: keyword arguments; RK156: old notice
# =============================================================================================


@covers("RK093")
def test_fresh_rk093_retain_graph_through_reentrant_checkpoint():
    # https://github.com/zhanghang1989/PyTorch-Encoding/issues/76 (PyTorch 0.4, the message cut
    # at "freed"; the frames run through checkpoint.py's backward)
    f = top(run(text("fr-backward-twice-encoding")))
    assert f.rule == "RK093" and f.category == "checkpoint_api_misuse"
    assert "use_reentrant=False" in f.fix


@covers("RK093")
def test_fresh_rk093_reported_in_prose_with_checkpointing_yaml_key():
    # https://github.com/MooreThreads/Moore-AnimateAnyone/issues/126 (prose: with
    # "gradient_checkpointing: True" the error appears once a second UNet trains too)
    f = top(run(text("fr-backward-twice-animateanyone")))
    assert f.rule == "RK093" and f.category == "checkpoint_api_misuse"


@covers("RK073")
def test_fresh_rk073_use_reentrant_rejected_by_an_old_pytorch():
    # https://github.com/MCG-NJU/MeMOTR/issues/15: the error quoted as inline code
    # (`ValueError: Unexpected keyword arguments: use_reentrant`) after
    # `checkpoint(self.backbone, frame, use_reentrant=False)`: the installed checkpoint has no
    # use_reentrant parameter (PyTorch < 1.11), so the remedy is not use_reentrant=False.
    f = top(run(text("fr-kwargs-use-reentrant-memotr")))
    assert f.rule == "RK073" and f.category == "checkpoint_api_misuse"
    assert "Upgrade PyTorch" in f.fix and "1.11" in f.config_patch["command"]


def test_fresh_rk073_other_keywords_keep_the_non_reentrant_remedy():
    # the same ValueError naming the function's own keyword (attention_mask): use_reentrant=False
    f = top(run("ValueError: Unexpected keyword arguments: attention_mask"))
    assert f.rule == "RK073" and f.config_patch == {"use_reentrant": False}


def test_fresh_inline_code_line_is_read_without_its_backticks():
    # the parser change behind the MeMOTR#15 test: a whole line quoted as inline code
    from recompute_kit.doctor.evidence.text import clean_line

    assert clean_line("`ValueError: Unexpected keyword arguments: use_reentrant`") == (
        "ValueError: Unexpected keyword arguments: use_reentrant"
    )
    assert clean_line("```") == "```"
    assert clean_line("`a` and `b`") == "`a` and `b`"


# =============================================================================================
# RK074: DDP marks a parameter ready twice under the reentrant checkpoint
# =============================================================================================


@covers("RK074")
def test_fresh2_rk074_ready_twice_with_hf_gradient_checkpointing_enable():
    # https://github.com/huggingface/peft/issues/313 (accelerate launch, the message quoted as
    # a blockquote, cut mid-sentence; the fix the thread settled on: non-reentrant checkpoint)
    f = top(run(text("fn-ddp-ready-twice-peft313")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"
    assert "use_reentrant=False" in f.fix and f.config_patch == {"use_reentrant": False}


@covers("RK074")
def test_fresh2_rk074_ready_twice_rank_prefixed_only_the_message():
    # https://github.com/modelscope/ms-swift/issues/3171 (GRPO under DDP; maintainer: pass
    # --gradient_checkpointing_kwargs '{"use_reentrant": false}' or use DeepSpeed)
    f = top(run(text("fn-ddp-ready-twice-swift3171")))
    assert f.rule == "RK074" and "use_reentrant=False" in f.fix


@covers("RK074")
def test_fresh2_rk074_ready_twice_through_a_custom_checkpoint_backward():
    # https://github.com/OEvortex/unsloth/issues/6 (unsloth_zoo's own checkpoint function in
    # the frames, the message cut off at the end)
    f = top(run(text("fn-ddp-ready-twice-unsloth-fork6")))
    assert f.rule == "RK074" and f.category == "checkpoint_api_misuse"


# =============================================================================================
# RK071: outputs without grad_fn from a reentrant checkpoint whose inputs need no gradient
# =============================================================================================


@covers("RK071")
def test_fresh2_rk071_element0_with_the_warning_and_use_cache():
    # https://github.com/huggingface/transformers/issues/26377: the issue title carries the
    # error line (first line of the file), the body the 'None of the inputs have
    # requires_grad=True' warnings and use_cache notices; the remedy in the HF threads is
    # model.enable_input_require_grads() or use_reentrant=False
    f = top(run(text("fn-noreqgrad-hf26377")))
    assert f.rule == "RK071" and f.category == "checkpoint_api_misuse"
    assert "enable_input_require_grads" in f.fix and "use_reentrant=False" in f.fix


@covers("RK071")
def test_fresh2_rk071_element_index_other_than_zero():
    # https://github.com/liucongg/ChatGLM-Finetuning/issues/101 (title: "element 0 or 1 of
    # tensors does not require grad", with DeepSpeed's activation_checkpoint_interval=1)
    f = top(run(text("fn-noreqgrad-chatglm-pipe101")))
    assert f.rule == "RK071" and f.category == "checkpoint_api_misuse"


@covers("RK071")
def test_fresh2_rk071_any_element_index_mutation_guard():
    # the error names whichever output came out without grad_fn: element 1, 2, ...
    log = "RuntimeError: element 1 of tensors does not require grad and does not have a grad_fn"
    assert top(run(log)).rule == "RK071"
    # and not from unrelated text that only shares words
    assert "RK071" not in ids(run("RuntimeError: element of the batch does not require padding"))


# =============================================================================================
# RK075: recomputed tensors differ from the forward's
# =============================================================================================


@covers("RK075")
def test_fresh2_rk075_metadata_differs_in_dtype_and_shape():
    # https://github.com/Sompote/SAM3_LoRA/issues/10 (PyTorch 2.4-era frames, dtypes and shapes
    # shifted position by position; open issue: the fix the error itself points to is
    # checkpoint debug mode to find the op that differs)
    f = top(run(text("fn-ckpt-metadata-sam3lora")))
    assert f.rule == "RK075" and f.category == "nondeterministic_recompute"
    assert "set_checkpoint_debug_enabled" in f.fix


@covers("RK093")
def test_rk093_backward_twice():
    f = top(run(text("i12-diffusers-12776")))
    assert f.rule == "RK093" and "use_reentrant" in str(f.config_patch)


@covers("RK095")
def test_rk095_saved_tensors_unpacked_twice():
    f = top(run(text("i12-mamba-909")))
    assert f.rule == "RK095" and "saved_tensors" in f.fix


@covers("RK099")
def test_rk099_requires_grad_warning_alone_is_informational():
    f = top(run(text("i12-internlm-326")))
    assert f.rule == "RK099" and f.category == "informational"
    assert "RK071" not in ids(run(text("i12-internlm-326")))


@covers("RK075")
@covers("RK078")
def test_rk078_gradient_checkpointing_func_missing_is_the_flag_set_by_hand():
    # https://github.com/huggingface/transformers/issues/30544
    f = top(run(text("transformers-30544-gradient-checkpointing-func")))
    assert f.rule == "RK078" and f.category == "checkpoint_api_misuse"
    assert "gradient_checkpointing_enable()" in f.fix


def test_rk075_moe_router_metadata_mismatch_names_the_router():
    f = top(run(text("i12-automodel-2635")))
    assert f.rule == "RK075" and "router" in f.fix.lower()
    assert f.config_patch


def test_rk075_compile_metadata_mismatch_names_compile():
    f = top(run(text("i12-modalities-361")))
    # The artefact does not say torch.compile (the thread does): shapes change wholesale, so
    # the generic fix, which names compile first, not the autocast one.
    assert f.rule == "RK075" and "torch.compile" in f.fix and "autocast" not in f.fix


def test_rk075_token_count_change_gets_the_routing_fix():
    # torchtitan: only the leading dimension moved (965 -> 964 tokens): MoE routing.
    f = top(run(text("i12-torchtitan-1117")))
    assert f.rule == "RK075" and "router" in f.fix.lower()
    assert "token count" in f.evidence


def test_rk075_internal_assert_after_a_compile_recompile_limit():
    # Unsloth: torch.compile fell back to eager (a context line), then checkpoint's assert.
    f = top(run(text("i12-unslothzoo-1001")))
    assert f.rule == "RK075" and f.config_patch == {"compile": False}


@covers("RK148")
def test_rk148_traceback_cut_in_the_reentrant_backward_under_deepspeed():
    # DeepSpeed#988: the loss scaler's backward into torch/utils/checkpoint.py backward.
    f = top(run(text("i13-ds-988")))
    assert f.rule == "RK148" and f.category == "checkpoint_api_misuse"
    assert f.config_patch["zero_optimization"] == {"stage": 1}
    assert f.config_patch["gradient_checkpointing_kwargs"] == {"use_reentrant": False}


def test_rk148_not_without_a_hook_reducing_wrapper():
    # The tail of DeepSpeed#988's traceback, from torch/_tensor.py on (a paste that starts
    # below the DeepSpeed frames): the same cut backward through the reentrant checkpoint, but
    # nothing that reduces gradients from hooks; any error (an OOM in the recompute, a shape
    # error) could end it, so RK148 stays silent.
    tail = "\n".join(text("i13-ds-988").splitlines()[3:])
    assert "deepspeed" not in tail and "utils/checkpoint.py" in tail
    assert "RK148" not in ids(run(tail))


@covers("RK149")
def test_rk149_requires_grad_warning_in_full_training():
    # open_clip#573: the warning with a plain training command (--grad-checkpointing).
    d = run(text("i13-openclip-573"), config=text("i13-openclip-573-config"), config_name="run.sh")
    f = top(d)
    assert f.rule == "RK149" and f.category == "checkpoint_api_misuse"
    assert f.config_patch == {"use_reentrant": False} and "RK099" not in ids(d)
    # the same warning alone (InternLM-XComposer#326) stays informational
    assert top(run(text("i12-internlm-326"))).rule == "RK099"


def test_rk075_tensor_count_mismatch_names_the_gate():
    # pytorch#171355: 2634 tensors saved in the forward, 884 in the recompute.
    f = top(run(text("i13-pt-171355")))
    assert f.rule == "RK075" and "gate" in f.fix and "target_modules" in f.fix
    cites(f, "2634", "884")


def test_rk077_old_transformers_is_a_config_matter():
    # transformers#15959: "DebertaV2Model does not support gradient checkpointing!"
    f = top(run(text("i13-hf-15959")))
    assert f.rule == "RK077" and f.category == "invalid_config"
    assert "upgrade transformers" in f.fix.lower()


@pytest.mark.parametrize("rule_id, name, patch", VALIDATION_CASES)
@covers(*sorted({c[0] for c in VALIDATION_CASES}))
def test_megatron_validation_message(rule_id, name, patch):
    d = run(text(name))
    f = top(d)
    assert f.rule == rule_id and f.category == "invalid_config"
    assert f.raw_confidence == 0.95  # the rule's own; calibrated: test_doctor_verdict.py
    assert d.to_json()["verdict"] == "diagnosed"  # Megatron's own message decides
    # the evidence quotes Megatron's message
    message = next(e.message for e in d.evidence.errors)
    assert message[:60] in f.evidence
    if patch is not None:  # (entries the run already has are left out of config_patch)
        assert intended_patch(f) == patch


@pytest.mark.parametrize("rule_id, config, name, quoted", CONFIG_CASES)
@covers(*sorted({c[0] for c in CONFIG_CASES}))
def test_megatron_validation_of_a_config(rule_id, config, name, quoted):
    d = run(config=config, config_name=name)
    f = top(d)
    assert f.rule == rule_id and f.category == "invalid_config"
    assert f.raw_confidence == 0.9
    assert d.to_json()["verdict"] == "diagnosed"  # the kit ran Megatron's validation
    assert f.evidence.startswith("Megatron would reject this config")
    cites(f, quoted)


@covers("RK050")
def test_a_refused_config_beside_a_log_of_the_run_training_is_no_diagnosis():
    # The config as read is refused, but the log (Megatron-LM#5662's iteration line) shows the
    # run training: Megatron validates before the first step, so the run's config passed.
    config, name = CONFIG_CASES[0][1], CONFIG_CASES[0][2]
    d = run(text("ex-mlm-pr5662"), config=config, config_name=name)
    f = get(d, "RK050")
    assert f.raw_confidence == 0.5 and "training iteration" in f.evidence
    assert d.to_json()["verdict"] != "diagnosed" or top(d).rule != "RK050"


@covers("RK050", "RK051", "RK052", "RK053", "RK054", "RK055", "RK056", "RK057")
def test_validation_rules_silent_on_valid_configs():
    # Megatron-LM#1031's full/uniform/5 and the 8B selective launcher are valid.
    for cfg in (LLAMA3_70B_MLM_1031, LLAMA3_8B_SELECTIVE, MIXTRAL_8X7B_MLP):
        d = run(config=cfg, config_name="x.sh", gpu_memory_gb=80)
        assert not [f for f in d.findings if f.category == "invalid_config"], ids(d)


@pytest.mark.parametrize("rule_id, name, category, patch", CHECKPOINT_CASES)
@covers(*sorted({c[0] for c in CHECKPOINT_CASES}))
def test_message_rules(rule_id, name, category, patch):
    d = run(text(name))
    f = top(d)
    assert f.rule == rule_id and f.category == category
    assert f.config_patch == patch
    assert f.evidence.startswith('The log says: "')
    first = d.evidence.errors[0]
    assert first.message[:50] in f.evidence


@covers("RK070", "RK071", "RK072", "RK073", "RK074", "RK075", "RK077", "RK081", "RK082")
def test_message_rules_silent_on_an_oom():
    # None of the message rules fires on a plain OOM (real-formats.md oom-pt-16417-comment).
    d = run(text("oom-pt-16417-comment"))
    message_rules = {c[0] for c in CHECKPOINT_CASES} | {c[0] for c in VALIDATION_CASES}
    assert not message_rules & set(ids(d))


@covers("RK076")
def test_rk076_use_cache_warning_through_the_parser():
    # transformers logs this warning as a bare line (logger.warning_once); the parser knows it.
    # https://github.com/OEvortex/unsloth/issues/18: the warning behind a tqdm bar.
    assert "RK076" in ids(run(text("unsloth-18")))


@covers("RK076")
def test_rk076_use_cache_warning_as_an_event():
    # The same verbatim message (unsloth#18), handed over as the warning event it is.
    line = text("unsloth-18").strip()
    message = line[line.index("`use_cache") :]
    d = diagnose(Evidence(errors=[ErrorEvent("WARNING", message, kind="warning")]))
    f = top(d)
    assert f.rule == "RK076" and f.category == "informational"
    assert f.config_patch == {"use_cache": False}
    cites(f, "`use_cache=True` is incompatible with gradient checkpointing")


@covers("RK071")
def test_frozen_inputs_under_checkpointing_said_in_words():
    # https://github.com/huggingface/transformers/issues/21381 (the reporter's words, verbatim)
    said = (
        "When freezing the first layers of a model (e.g. including embeddings) *and* using "
        "gradient-checkpointing, **all** gradient calculation will be disabled, i.e. the output "
        "will have `requires_grad==False`.\n"
    )
    f = top(run(said))
    assert f.rule == "RK071" and f.category == "checkpoint_api_misuse"
    assert "enable_input_require_grads" in f.fix
    # freezing and checkpointing named without gradients lost: no such reading
    other = "I freeze the embeddings and use gradient checkpointing; the loss goes down.\n"
    assert all(g.rule != "RK071" for g in run(other).findings)
