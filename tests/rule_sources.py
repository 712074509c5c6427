"""Where each text in tests/data/rules/ comes from: file name (without .txt) -> URL, with a note
where the text was joined or cut. `test_rules.py` checks that every data file has an entry;
`rule_helpers.text` refuses a file without one. New rounds of pastes add one
`SOURCES.update({...})` block each, at the end. The blocks name the collection round that
added them (round "fresh_memory", ...); the tests themselves are grouped by rule module
(tests/test_rules_<module>.py, tests/test_known_problems.py for the known-problems table).
"""

TC = "https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/core/transformer/transformer_config.py#L1884-L2030"
LOCAL = "reproduced with the public torch.utils.checkpoint on CPU (real-formats.md)"

# file name (without .txt) -> where the text comes from
SOURCES = {
    "oom-pt-pr99699": "https://github.com/pytorch/pytorch/pull/99699",
    "oom-pt-16417-title": "https://github.com/pytorch/pytorch/issues/16417",
    "oom-pt-16417-comment": "https://github.com/pytorch/pytorch/issues/16417",
    "oom-unilm-137": "https://github.com/microsoft/unilm/issues/137",
    "oom-mlm-525": "https://github.com/NVIDIA/Megatron-LM/issues/525",
    "oom-msswift-9191": "https://github.com/modelscope/ms-swift/issues/9191",
    "pt-71616": "https://github.com/pytorch/pytorch/issues/71616",
    "pt-175431": "https://github.com/pytorch/pytorch/issues/175431",
    "pt-35901": "https://github.com/pytorch/pytorch/issues/35901",
    "pt-111363": "https://github.com/pytorch/pytorch/issues/111363",
    "pt-pr13751": "https://github.com/pytorch/pytorch/pull/13751",
    "returnn-1469": "https://github.com/rwth-i6/returnn/issues/1469",
    "zerosearch-11": "https://github.com/Alibaba-NLP/ZeroSearch/issues/11",
    "trl-4237": "https://github.com/huggingface/trl/issues/4237",
    "vllm-10637": "https://github.com/vllm-project/vllm/issues/10637",
    "dots-ocr-196": "https://github.com/studio-dots-ai/dots.ocr/issues/196",
    "therock-1054": "https://github.com/ROCm/TheRock/issues/1054",
    "mlm-92": "https://github.com/NVIDIA/Megatron-LM/issues/92",
    "mlm-60": "https://github.com/NVIDIA/Megatron-LM/issues/60",
    "trl-pr2776": "https://github.com/huggingface/trl/pull/2776",
    "msswift-6149": "https://github.com/modelscope/ms-swift/issues/6149",
    "mlm-2294-error": "https://github.com/NVIDIA/Megatron-LM/issues/2294",
    "mlm-2294-config": "https://github.com/NVIDIA/Megatron-LM/issues/2294",
    "ppuu-21": "https://github.com/Atcold/pytorch-PPUU/issues/21",
    "chatglm-tuning-56": "https://github.com/mymusise/ChatGLM-Tuning/issues/56",
    "transformers-17464": "https://github.com/huggingface/transformers/issues/17464",
    "roformer-39": "https://github.com/JunnYu/RoFormer_pytorch/issues/39",
    "nemo-speech-14241": "https://github.com/NVIDIA-NeMo/Speech/issues/14241 (title)",
    "bnb-182": "https://github.com/bitsandbytes-foundation/bitsandbytes/issues/182",
    "unsloth-18": "https://github.com/OEvortex/unsloth/issues/18",
    "mbridge-2684": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/2684 "
    "(megatron-recompute.md section 5, row 25)",
    "mbridge-skill-cuda-graph": "Megatron-Bridge perf-activation-recompute skill / seed 001; "
    "assert message of megatron-recompute.md section 1, rule 30",
    "mlm-rule17-delayed-scaling": "megatron-recompute.md section 1, rule 17 (ValueError)",
    "mlm-rule20-fine-grained-offloading": "megatron-recompute.md section 1, rule 20 (assert)",
    "mlm-rule27-distribute-saved": "megatron-recompute.md section 1, rule 27 (arguments.py assert)",
    "mlm-rule29-cuda-graphs": "megatron-recompute.md section 1, rule 29 (ValueError)",
    "ex-args-local-v014-full": "real-formats.md ex-args-local-v014-full (Megatron-LM core_v0.14)",
    "ex-nemo-14850": "https://github.com/NVIDIA-NeMo/Speech/issues/14850",
    "ex-mlm-pr5662": "https://github.com/NVIDIA/Megatron-LM/pull/5662",
    "seed-001-perf-activation-recompute": "../shared/seeds/001_ef50205b3ce230ec.txt",
    **{f"ckpt-local-{n}": LOCAL for n in ("grad-reentrant", "no-input-grad", "ddp")},
    **{f"ckpt-local-{n}": LOCAL for n in ("use-reentrant-missing", "metadata", "kwargs-reentrant")},
    **{
        f"tc-measured-{n}": TC
        for n in (
            "full-no-method",
            "full-no-num-layers",
            "full-bad-method",
            "bad-granularity",
            "selective-with-num-layers",
            "selective-bad-module",
            "moe-act-without-grouped-gemm",
            "mla-up-proj-without-mla",
            "shared-experts-with-overlap",
            "cpu-offload-with-recompute",
            "distribute-saved-with-sp",
            "moe-layer-recompute-with-full",
        )
    },
    "i12-automodel-1975": "https://github.com/NVIDIA-NeMo/Automodel/pull/1975",
    "i12-automodel-2634": "https://github.com/NVIDIA-NeMo/Automodel/pull/2634",
    "i12-automodel-2635": "https://github.com/NVIDIA-NeMo/Automodel/pull/2635",
    "i12-nemorl-3280": "https://github.com/NVIDIA-NeMo/RL/pull/3280",
    "i12-nemorl-3280-config": "https://github.com/NVIDIA-NeMo/RL/pull/3280",
    "i12-rocm-megatron-85": "https://github.com/ROCm/Megatron-LM/pull/85",
    "i12-rocm-megatron-85-config": "https://github.com/ROCm/Megatron-LM/pull/85",
    "i12-te-3284": "https://github.com/NVIDIA/TransformerEngine/pull/3284",
    "i12-cosmosrl-388": "https://github.com/nvidia-cosmos/cosmos-rl/pull/388",
    "i12-diffusers-12776": "https://github.com/huggingface/diffusers/issues/12776",
    "i12-ds-5704": "https://github.com/deepspeedai/DeepSpeed/issues/5704",
    "i12-imgcap-57": "https://github.com/sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning/issues/57",
    "i12-mamba-909": "https://github.com/state-spaces/mamba/pull/909",
    "i12-modalities-361": "https://github.com/Modalities/modalities/issues/361",
    "i12-piccolo-8": "https://github.com/OpenSenseNova/piccolo-embedding/issues/8",
    "i12-pt-35901": "https://github.com/pytorch/pytorch/issues/35901",
    "i12-pt-49481": "https://github.com/pytorch/pytorch/issues/49481",
    "i12-internlm-326": "https://github.com/InternLM/InternLM-XComposer/issues/326",
    "i12-pytorch-40863": "https://github.com/pytorch/pytorch/issues/40863",
    "i12-llamafactory-1158": "https://github.com/hiyouga/LlamaFactory/issues/1158",
    "i12-llamafactory-1158-config": "https://github.com/hiyouga/LlamaFactory/issues/1158",
    "i12-nemorl-2871": "https://github.com/NVIDIA-NeMo/RL/issues/2871",
    "i12-slime-1486": "https://github.com/THUDM/slime/pull/1486",
    "i12-torchtitan-1117": "https://github.com/pytorch/torchtitan/issues/1117",
    "i12-unslothzoo-1001": "https://github.com/unslothai/unsloth-zoo/pull/1001",
    "i12-megatron-2754": "https://github.com/NVIDIA/Megatron-LM/pull/2754",
    "i12-llamafactory-1916": "https://github.com/hiyouga/LlamaFactory/issues/1916",
    "i12-mbridge-skill-expandable": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/9e12bbd5c6a27a19e6d4d92479ddcb02f7020457/skills/nemo-mbridge-perf-memory-tuning/SKILL.md",
    "i12-llamafactory-1221": "https://github.com/hiyouga/LlamaFactory/issues/1221",
    "i12-shannon-6": "https://github.com/ShannonAI/Self_Explaining_Structures_Improve_NLP_Models/issues/6",
    "i12-sglang-29838-npu": "https://github.com/sgl-project/sglang/issues/29838",
    # issue 13 (checkpoint / recompute / config): development corpus cases' pasted text
    "i13-diffusers-9850": "https://github.com/huggingface/diffusers/issues/9850",
    "i13-thunder-2116": "https://github.com/Lightning-AI/lightning-thunder/issues/2116",
    "i13-thunder-2116-config": "https://github.com/Lightning-AI/lightning-thunder/issues/2116",
    "i13-pt-71124": "https://github.com/pytorch/pytorch/issues/71124",
    "i13-olmocore-828": "https://github.com/allenai/OLMo-core/pull/828",
    "i13-olmocore-828-config": "https://github.com/allenai/OLMo-core/pull/828",
    "i13-ds-988": "https://github.com/deepspeedai/DeepSpeed/issues/988",
    "i13-openclip-573": "https://github.com/mlfoundations/open_clip/issues/573",
    "i13-openclip-573-config": "https://github.com/mlfoundations/open_clip/issues/573",
    "i13-dmd2-52": "https://github.com/tianweiy/DMD2/issues/52",
    "i13-nemo-speech-12517": "https://github.com/NVIDIA-NeMo/Speech/pull/12517",
    "i13-lightning-20329": "https://github.com/Lightning-AI/pytorch-lightning/issues/20329",
    "i13-pt-123548": "https://github.com/pytorch/pytorch/issues/123548",
    "i13-pt-128478": "https://github.com/pytorch/pytorch/issues/128478",
    "i13-llavallama3-4": "https://github.com/Victorwz/LLaVA-Llama-3/issues/4",
    "i13-unsloth-91": "https://github.com/unslothai/unsloth/issues/91",
    "i13-open-instruct-838": "https://github.com/allenai/open-instruct/pull/838",
    "i13-dsexamples-332": "https://github.com/deepspeedai/DeepSpeedExamples/issues/332",
    "i13-dsexamples-332-config": "https://github.com/deepspeedai/DeepSpeedExamples/issues/332",
    "i13-hf-47254": "https://github.com/huggingface/transformers/issues/47254",
    "i13-pt-171355": "https://github.com/pytorch/pytorch/issues/171355",
    "i13-hf-15959": "https://github.com/huggingface/transformers/issues/15959",
    "i13-megatron-pr6311": "https://github.com/NVIDIA/Megatron-LM/pull/6311",
    "ckpt-local-debug-topk": "torch.utils.checkpoint debug=True, reproduced on CPU (torch 2.13.0): "
    "a function that runs topk only in the recompute",
    "nemo-megatron-gpt-config-ac": "https://github.com/NVIDIA/NeMo/blob/main/examples/nlp/"
    "language_modeling/conf/megatron_gpt_config.yaml (Activation Checkpointing block)",
    "mlm-args-dump-recompute-none": "https://github.com/hwang2006/large-scale-lm-tutorials/blob/"
    "main/docs/06_tensor_parallelism.md (Megatron-LM argument dump of a gpt2_345m run)",
    # issue 13 (memory categories): dev corpus cases' text, and one IPEX message
    "i13-llamafactory-2379": "https://github.com/hiyouga/LlamaFactory/issues/2379",
    "i13-llamafactory-2379-config": "https://github.com/hiyouga/LlamaFactory/issues/2379",
    "i13-llamafactory-5977": "https://github.com/hiyouga/LlamaFactory/issues/5977",
    "i13-automodel-3907": "https://github.com/NVIDIA-NeMo/Automodel/issues/3907",
    "i13-talking-head-36": "https://github.com/pkhungurn/talking-head-anime-demo/issues/36",
    "i13-cbdnet-7": "https://github.com/IDKiro/CBDNet-pytorch/issues/7",
    "i13-llamafactory-922": "https://github.com/hiyouga/LlamaFactory/issues/922",
    "ipex-629": "https://github.com/intel/intel-extension-for-pytorch/issues/629",
    # default readings (RK170/RK171): dev corpus cases' pasted text
    "i17-automodel-2585": "https://github.com/NVIDIA-NeMo/Automodel/pull/2585",
    "i17-automodel-2585-config": "https://github.com/NVIDIA-NeMo/Automodel/pull/2585",
    "i17-improved-diffusion-3": "https://github.com/openai/improved-diffusion/issues/3",
    "i17-llama2-accessory-26": "https://github.com/Alpha-VLLM/LLaMA2-Accessory/issues/26",
    "i17-slime-1450-config": "https://github.com/THUDM/slime/issues/1450",
    "i17-mistral-116928-summary": "https://github.com/pytorch/pytorch/issues/116928",
    # prose reports next to an OOM (RK190/RK191): dev corpus cases' pasted text
    "i19-verl-5364": "https://github.com/verl-project/verl/pull/5364",
    "i19-skyrl-1768": "https://github.com/NovaSky-AI/SkyRL/pull/1768",
    # generic memory findings in the paste's knobs; shell variables that hold flags
    "i22-mlm-pretrain-gpt-distributed": "https://github.com/NVIDIA/Megatron-LM/blob/"
    "9e72d571f49296d7002889cc19692d97a5b0f92e/examples/pretrain_gpt_distributed.sh",
    "i22-ccf-ner-6": "https://github.com/BaberMuyu/2020CCF-NER/issues/6",
    "i22-ccf-ner-6-config": "https://github.com/BaberMuyu/2020CCF-NER/issues/6",
    "i22-pt-107667": "https://github.com/pytorch/pytorch/issues/107667",
    "i22-pt-28113": "https://github.com/pytorch/pytorch/issues/28113",
    "i22-pt-37250": "https://github.com/pytorch/pytorch/issues/37250 (beyondguo's comment)",
    # general readings (RK260-RK265) and default readings from prose: dev corpus cases' text
    "i26-hf-46822": "https://github.com/huggingface/transformers/issues/46822",
    "i26-hf-28499": "https://github.com/huggingface/transformers/issues/28499",
    "i26-attngym-32": "https://github.com/meta-pytorch/attention-gym/issues/32",
    "i26-pt-133206": "https://github.com/pytorch/pytorch/issues/133206",
    "i26-trl-3678": "https://github.com/huggingface/trl/issues/3678",
    "i26-pt-71616-report": "https://github.com/pytorch/pytorch/issues/71616",
    "i26-pt-85447": "https://github.com/pytorch/pytorch/pull/85447",
    "i26-openrlhf-384": "https://github.com/OpenRLHF/OpenRLHF/issues/384",
    "i26-openrlhf-392": "https://github.com/OpenRLHF/OpenRLHF/issues/392",
    "i26-openrlhf-392-config": "https://github.com/OpenRLHF/OpenRLHF/issues/392",
    # fresh pastes for the memory families (round "fresh_memory"): threads that are
    # neither corpus cases nor the rules' own sources
    "fm-colossalai-3509-optimizer-step": "https://github.com/hpcaitech/ColossalAI/issues/3509",
    "fm-semseg-60-eval-no-grad": "https://github.com/hszhao/semseg/issues/60",
    "fm-loop-57-eval": "https://github.com/facebookarchive/loop/issues/57",
    "fm-skorch-218-validation": "https://github.com/skorch-dev/skorch/issues/218",
    "fm-pt-1840-loss-accumulated": "https://github.com/pytorch/pytorch/issues/1840",
    "fm-llmtrainer-2-other-processes": "https://github.com/qibin0506/llm_trainer/issues/2",
    "fm-tracking-57-gpus-held": "https://github.com/phil-bergmann/tracking_wo_bnw/issues/57 "
    "(description and the reporter's gpustat / nvidia-smi comment)",
    "fm-dgp-16-another-code": "https://github.com/yinboc/DGP/issues/16 (description and the "
    "reporter's first comment)",
    "fm-mmdet-3020-gpu0-busy": "https://github.com/open-mmlab/mmdetection/issues/3020",
    "fm-qwenvl-26-load-oom": "https://github.com/QwenLM/Qwen-VL/issues/26 (lwh9346's comment)",
    "fm-internlm-79-device-map-cuda": "https://github.com/InternLM/InternLM/issues/79",
    "fm-qwenomni-240-request-over-gpu": "https://github.com/QwenLM/Qwen2.5-Omni/issues/240",
    "slime-1767-float-conversion-oom": "https://github.com/THUDM/slime/issues/1767 (the "
    "reporter's traceback end and OOM line)",
    "lf-4559-load-traceback-cut": "https://github.com/hiyouga/LlamaFactory/issues/4559 (the "
    "reporter's output, cut in the issue before its exception line)",
}

# fresh public pastes for the recompute families (checkpoint API, recompute that differs or
# does not act, validation, framework bugs, overhead): round "fresh_recompute"
SOURCES.update(
    {
        "fr-ddp-ready-twice-focalnet": "https://github.com/microsoft/FocalNet/issues/4",
        "fr-ddp-ready-twice-longformer": "https://github.com/allenai/longformer/issues/63",
        "fr-ddp-ready-twice-ibot": "https://github.com/bytedance/ibot/issues/30",
        "fr-noreqgrad-pysemseg": "https://github.com/petko-nikolov/pysemseg/issues/5",
        "fr-noreqgrad-memonger": "https://github.com/Lyken17/pytorch-memonger/issues/4",
        "fr-lora-grads-none-mslora": "https://github.com/microsoft/LoRA/issues/120",
        "fr-noreqgrad-qwenvl": "https://github.com/2U1/Qwen-VL-Series-Finetune/issues/56",
        "fr-zero3-metadata-openrlhf": "https://github.com/OpenRLHF/OpenRLHF/issues/569",
        "fr-zero3-metadata-minicpmv": "https://github.com/OpenBMB/MiniCPM-V/issues/651",
        "fr-metadata-cp-trl": "https://github.com/huggingface/trl/issues/4314",
        "fr-metadata-vader": "https://github.com/mihirp1998/VADER/issues/9",
        "fr-backward-twice-encoding": "https://github.com/zhanghang1989/PyTorch-Encoding/issues/76",
        "fr-backward-twice-animateanyone": "https://github.com/MooreThreads/Moore-AnimateAnyone/"
        "issues/126",
        "fr-kwargs-use-reentrant-memotr": "https://github.com/MCG-NJU/MeMOTR/issues/15",
        "fr-use-reentrant-old-kohya": "https://github.com/bmaltais/kohya_ss/issues/2481",
        # the paste of the PR's description from its metadata lines on (CheckpointError cut)
        "ds-8148-zero3-empty-recompute-header-cut": "https://github.com/deepspeedai/DeepSpeed/pull/8148",
        "fr-reduced-twice-weight-sharing-ds": "https://github.com/deepspeedai/DeepSpeed/issues/2103",
        "fr-eval-mode-ppo-trl": "https://github.com/huggingface/trl/issues/1066",
        "fr-rng-dropout-pidm": "https://github.com/ankanbhunia/PIDM/pull/66",
    }
)


# fresh public pastes for the Megatron families (validation messages, argument checks,
# measured recompute cost): round "fresh_megatron"
SOURCES.update(
    {
        "fg-uniform-remainder-mlm1807": "https://github.com/NVIDIA/Megatron-LM/issues/1807",
        "fg-recompute-on-off-table-mlm6429": "https://github.com/NVIDIA/Megatron-LM/pull/6429",
        "fg-pp-divisible-swift5737": "https://github.com/modelscope/ms-swift/issues/5737",
        "fg-pp-divisible-bionemo784": "https://github.com/NVIDIA-BioNeMo/bionemo-recipes/"
        "issues/784",
        "fg-pp-divisible-mbridge5884": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5884",
        "fg-ep-tp-sp-launcher309": "https://github.com/NVIDIA/NeMo-Framework-Launcher/pull/309",
    }
)
# fresh pastes that carry little, for the default readings: round "fresh_defaults"
SOURCES.update(
    {
        "fd-cvrecipes-561-4gb": "https://github.com/microsoft/computervision-recipes/issues/561",
        "fd-cylinder3d-109-backward": "https://github.com/xinge008/Cylinder3D/issues/109",
        "fd-fastflow-4-12gb": "https://github.com/RistoranteRist/FastFlow/issues/4",
        "fd-dlas-56-batch188": "https://github.com/152334H/DL-Art-School/issues/56",
        "fd-tianchi-9-2gb": "https://github.com/herbert-chen/tianchi_lvcai/issues/9",
        "fd-effce-9-logits-zeros-like": "https://github.com/mgmalek/efficient_cross_entropy/issues/9",
        "fd-openrlhf-698-adam-offload": "https://github.com/OpenRLHF/OpenRLHF/issues/698",
        "fd-litllama-286-micro-batch": "https://github.com/Lightning-AI/lit-llama/issues/286",
        "fd-simpletuner-543-tensor-not-tuple": "https://github.com/bghira/SimpleTuner/issues/543",
        "fd-kohya-697-element0": "https://github.com/kohya-ss/sd-scripts/issues/697",
        "fd-taggui-188-expandable": "https://github.com/jhc13/taggui/issues/188",
    }
)

# fresh public pastes by category (framework bugs, overhead, no effect, recompute that
# differs): round "fresh_categories_a"
SOURCES.update(
    {
        "fa-nd-kvcache-qwen2-pt155171": "https://github.com/pytorch/pytorch/issues/155171",
        "fa-nd-dropout-rng-guideddiff167": "https://github.com/openai/guided-diffusion/issues/167",
        "fa-nd-fsdp2-dtype-pt159359": "https://github.com/pytorch/pytorch/issues/159359",
        "fa-fb-crossencoder-gc-st3330": "https://github.com/huggingface/sentence-transformers/"
        "issues/3330",
        "fa-fb-unsloth-backward-twice-3543": "https://github.com/unslothai/unsloth/issues/3543",
        "fa-fb-tabpfn-pop-empty-1138": "https://github.com/PriorLabs/TabPFN/pull/1138",
        "fa-ne-critic-gc-verl26": "https://github.com/verl-project/verl/issues/26",
    }
)


# fresh public pastes by memory category (model states, fragmentation, logits, one allocation
# larger than the GPU, other processes, memory outside PyTorch):
# round "fresh_categories_b"
SOURCES.update(
    {
        "fb-ds-3208-1p3b-adam-14gb": "https://github.com/deepspeedai/DeepSpeed/issues/3208",
        "fb-ds-237-zero2-init-optimizer-states": "https://github.com/deepspeedai/DeepSpeed/issues/237",
        "fb-vllm-pr41268-split-remainder": "https://github.com/vllm-project/vllm/pull/41268",
        "fb-torchtune-2830-reserved-growing": "https://github.com/meta-pytorch/torchtune/issues/2830",
        "fb-fairseq-50-log-softmax-vocab": "https://github.com/facebookresearch/fairseq/issues/50",
        "fb-automodel-pr2336-masked-ce": "https://github.com/NVIDIA-NeMo/Automodel/pull/2336",
        "fb-neurolens-2-grid-sampler-55gib": "https://github.com/wxian3/NeuroLens/issues/2",
        "fb-opensora-70-mask-720gb": "https://github.com/hpcaitech/Open-Sora/issues/70",
        "fb-horovod-2719-other-users": "https://github.com/horovod/horovod/issues/2719",
        "fb-sglang-465-gpu-consumed": "https://github.com/sgl-project/sglang/issues/465",
        "fb-pt-28394-cuda-overhead": "https://github.com/pytorch/pytorch/issues/28394",
        "fb-maskrcnn-182-driver-memory": "https://github.com/facebookresearch/maskrcnn-benchmark/issues/182",
    }
)

# fresh public pastes of framework bugs on recompute / offload / sharding paths:
# round "fresh_bugs"
SOURCES.update(
    {
        "fx-ds-1499-dp-process-group": "https://github.com/deepspeedai/DeepSpeed/issues/1499",
        "fx-neox-474-dp-process-group-eval": "https://github.com/EleutherAI/gpt-neox/issues/474",
        "fx-ds-7830-z3-gc-next-functions": "https://github.com/deepspeedai/DeepSpeed/issues/7830",
        "fx-ds-1057-ckpt-py38": "https://github.com/deepspeedai/DeepSpeed/issues/1057",
        "fx-neox-62-pp-ckpt-zero2-keyerror": "https://github.com/EleutherAI/gpt-neox/issues/62",
        "fx-ds-1903-z3-fetch-regression": "https://github.com/deepspeedai/DeepSpeed/issues/1903",
    }
)
# fresh public pastes for model states and genuine memory pressure (weights, gradients and
# optimizer states that do not fit; a job that needs more memory than the GPU has):
# round "fresh_states"
SOURCES.update(
    {
        "fs-hf13329-gptj6b-a100-40g": "https://github.com/huggingface/transformers/issues/13329",
        "fs-happytr287-gptj-a100": "https://github.com/EricFillion/happy-transformer/issues/287",
        "fs-lf713-baichuan13b-full-ddp": "https://github.com/hiyouga/LlamaFactory/issues/713",
        "fs-lf94-baichuan7b-a100-80g": "https://github.com/hiyouga/LlamaFactory/issues/94",
        "fs-finetunellms23-gptj6b": "https://github.com/mallorbc/Finetune_LLMs/issues/23",
        "fs-opera36-llava-a6000-48gb": "https://github.com/shikiw/OPERA/issues/36",
        "fs-lf811-baichuan13b-8xa800": "https://github.com/hiyouga/LlamaFactory/issues/811",
    }
)

# fresh public pastes for logits memory (an OOM in the loss / lm_head / fp32 logits of a large
# vocabulary) and recompute overhead (step times with and without checkpointing):
# round "fresh_logits_overhead"
SOURCES.update(
    {
        "fl-automodel-2609-logits-float-48gib": "https://github.com/NVIDIA-NeMo/Automodel/pull/2609",
        "fl-automodel-2603-masked-ce-vlm": "https://github.com/NVIDIA-NeMo/Automodel/pull/2603",
        "fl-unsloth-4330-qwen35-vocab": "https://github.com/unslothai/unsloth/pull/4330",
        "fl-llamafactory-10367-ce-frames": "https://github.com/hiyouga/LlamaFactory/issues/10367",
        "fl-simpletuner-1184-interval": "https://github.com/bghira/SimpleTuner/pull/1184",
        "fl-fastvideo-1410-attn-recompute": "https://github.com/hao-ai-lab/FastVideo/pull/1410",
        "fl-qwenimage-69-slowdown": "https://github.com/QwenLM/Qwen-Image/issues/69",
    }
)

# fresh public pastes for model states / genuine pressure / allocations larger than the
# device (second round): round "fresh_states2"
SOURCES.update(
    {
        "fq-dllm9-8b-zero2-2xa100-40g": "https://github.com/ZHZisZZ/dllm/issues/9",
        "fq-cookbook413-llama7b-full-a100-80g": "https://github.com/meta-llama/llama-cookbook/issues/413",
        "fq-litllama397-7b-deepspeed-offload": "https://github.com/Lightning-AI/lit-llama/issues/397",
        "fq-mellama9-13b-load-24gb": "https://github.com/BIDS-Xu-Lab/Me-LLaMA/issues/9",
        "fq-longnet19-305gib-seq-len": "https://github.com/kyegomez/LongNet/issues/19",
        "fq-str2str4-a40-protein-525": "https://github.com/lujiarui/Str2Str/issues/4",
        "fq-lmflow213-llama7b-2x16g": "https://github.com/OptimalScale/LMFlow/issues/213",
    }
)

# freshlo2: more fresh pastes for logits memory and recompute overhead:
# round "fresh_logits2"
SOURCES.update(
    {
        "fz-msswift-6966-logits-float-49g": "https://github.com/modelscope/ms-swift/issues/6966",
        "fz-longva-19-chunked-ce": "https://github.com/EvolvingLMMs-Lab/LongVA/pull/19",
        "fz-advprompter-1-llama3-vocab-chunks": "https://github.com/facebookresearch/advprompter/issues/1",
        "fz-pytorch-124480-linear-ce": "https://github.com/pytorch/pytorch/issues/124480",
        "fz-liger-47-ce-oom-test": "https://github.com/linkedin/Liger-Kernel/pull/47",
        "fz-openinstruct-777-logits-refs": "https://github.com/allenai/open-instruct/pull/777",
        "fz-fastdit-11-ckpt-slow": "https://github.com/chuanyangjin/fast-DiT/issues/11",
        "fz-gradckpt-55-speed-mode": "https://github.com/cybertronai/gradient-checkpointing/issues/55",
        "fz-modalities-13-throughput-drop": "https://github.com/Modalities/modalities/issues/13",
        "fz-reallm-594-ckpt-10pct": "https://github.com/ReaLLMASIC/ReaLLM-Forge/pull/594",
    }
)

# fresh public pastes for other processes, memory outside PyTorch and fragmentation:
# round "fresh_outside"
SOURCES.update(
    {
        "fo-pt-3477-gpu0-full-other-process": "https://github.com/pytorch/pytorch/issues/3477",
        "fo-pt-67971-last-gb-context": "https://github.com/pytorch/pytorch/issues/67971",
        "fo-kaito-976-vllm-expandable": "https://github.com/kaito-project/kaito/issues/976",
        "fo-mygirlgpt-11-non-pytorch-4gb": "https://github.com/Synthintel0/MyGirlGPT/issues/11",
        "fo-one2345-25-held-elsewhere": "https://github.com/One-2-3-45/One-2-3-45/issues/25",
    }
)

# fresh public pastes of framework bugs, second round (leaks that grow step after step, a
# release that worked and the next that fails, features failing only together):
# round "fresh_bugs2"
SOURCES.update(
    {
        "fy-pt-166790-conv3d-cudnn-workspace-after-upgrade": "https://github.com/pytorch/pytorch/issues/166790",
        "fy-pl-16435-fsdp-ckpt-worked-until-177": "https://github.com/Lightning-AI/pytorch-lightning/issues/16435",
        "fy-pt-3610-master-memory-grows-per-iteration": "https://github.com/pytorch/pytorch/issues/3610",
        "fy-pt-3824-double-backward-memory-grows": "https://github.com/pytorch/pytorch/issues/3824",
        "fy-hamgnn-105-ckpt-cyclic-reference-leak": "https://github.com/QuantumLab-ZY/HamGNN/issues/105",
        "fy-fairseq-3353-fsdp-checkpoint-activations": "https://github.com/facebookresearch/fairseq/issues/3353",
        "fy-pt-15774-host-memory-grows-after-upgrade": "https://github.com/pytorch/pytorch/issues/15774",
    }
)

# fresh public pastes for checkpoint API misuse, recompute that differs, recompute that does
# not act and recompute argument checks (second round): round "fresh_recompute2"
SOURCES.update(
    {
        "fn-ckpt-metadata-sam3lora": "https://github.com/Sompote/SAM3_LoRA/issues/10",
        "fn-ddp-ready-twice-peft313": "https://github.com/huggingface/peft/issues/313",
        "fn-ddp-ready-twice-swift3171": "https://github.com/modelscope/ms-swift/issues/3171",
        "fn-ddp-ready-twice-unsloth-fork6": "https://github.com/OEvortex/unsloth/issues/6",
        "fn-noreqgrad-hf26377": "https://github.com/huggingface/transformers/issues/26377",
        "fn-noreqgrad-chatglm-pipe101": "https://github.com/liucongg/ChatGLM-Finetuning/issues/101",
    }
)

# fresh public pastes written in Chinese around (or instead of) the English error, read through
# evidence/cjk.py: round "fresh_cjk"
SOURCES.update(
    {
        "fh-udtransnet-21-grows-until-oom": "https://github.com/McGregorWwww/UDTransNet/issues/21",
        "fh-unet-4-keeps-growing": "https://github.com/laisimiao/Unet/issues/4",
        "fh-simple-faster-rcnn-252-grows-oom": "https://github.com/chenyuntc/simple-faster-rcnn-pytorch/issues/252",
        "fh-piccolo-10-leak-until-oom": "https://github.com/OpenSenseNova/piccolo-embedding/issues/10",
        "fh-bert4keras-368-recompute-slower": "https://github.com/bojone/bert4keras/issues/368",
        "fh-yuan2-18-recompute-cost": "https://github.com/IEIT-Yuan/Yuan-2.0/issues/18",
        "fh-mmocr-541-oom-after-update": "https://github.com/open-mmlab/mmocr/issues/541",
        "fh-multidiffusion-156-oom-after-update": "https://github.com/pkuliyi2015/multidiffusion-upscaler-for-automatic1111/issues/156",
        "fh-swift-2282-full-oom": "https://github.com/modelscope/ms-swift/issues/2282",
    }
)

# precision audit (round "precision"): the dev corpus case's paste, verbatim
SOURCES.update(
    {
        "fa-prec-opixray-5-slack-below-request": "https://github.com/OPIXray-author/OPIXray/issues/5",
    }
)

# fresh public pastes of model states with the settings said in prose and on command lines
# (ZeRO stage, offload, adapters, GPUs): round "fresh_settings"
SOURCES.update(
    {
        "fk-fastchat1193-vicuna7b-4xv100-zero3": "https://github.com/lm-sys/FastChat/issues/1193",
        "fk-llamafactory260-baichuan7b-8xv100-zero2": (
            "https://github.com/hiyouga/LlamaFactory/issues/260 "
            "(description and the reporter's second comment)"
        ),
        "fk-baichuan2-162-lora-3xv100-16g": "https://github.com/baichuan-inc/Baichuan2/issues/162",
        "fk-llamafactory3880-qlora-70b-8xt4-zero3": "https://github.com/hiyouga/LlamaFactory/issues/3880",
    }
)

# the boundary between genuine pressure (a vision workload too big for the GPU) and activation
# memory (checkpointing declined, eager attention scores): round "pressure"; the
# dev corpus cases' pastes, verbatim
SOURCES.update(
    {
        "r6p-detectron2-433-instances": "https://github.com/facebookresearch/detectron2/issues/433",
        "r6p-yolof-14-ims-per-batch": "https://github.com/chensnathan/YOLOF/issues/14",
        "r6p-rfdetr-1084-validation-mask-iou": "https://github.com/roboflow/rf-detr/issues/1084",
        "r6p-lora-easy-178-8gb-no-ckpt": (
            "https://github.com/derrian-distro/LoRA_Easy_Training_Scripts/issues/178"
        ),
        "r6p-unsloth-3363-eager-scores": "https://github.com/unslothai/unsloth/issues/3363",
        "r6p-unsloth-1418-batch": "https://github.com/unslothai/unsloth/issues/1418",
        "r6p-pt-133206-flex-uncompiled": "https://github.com/pytorch/pytorch/issues/133206",
    }
)

# several models of an RLHF run per GPU; ranks on GPU 0: round "states3"
SOURCES.update(
    {
        "r6s-openrlhf277-ppo13b-prose": "https://github.com/OpenRLHF/OpenRLHF/issues/277",
        "r6s-openrlhf277-ppo13b-cmd": "https://github.com/OpenRLHF/OpenRLHF/issues/277",
        "r6s-pt135279-ranks-device0": "https://github.com/pytorch/pytorch/issues/135279",
    }
)

# user-input rejections told from library bugs (RK650, RK420): round "api3"
SOURCES.update(
    {
        "r6a-pt152752-ckpt-seq-segments": "https://github.com/pytorch/pytorch/issues/152752",
        "r6a-fairseq1191-max-tokens": "https://github.com/facebookresearch/fairseq/issues/1191",
        "r6a-pt7617-ckpt-inputs-no-grad": "https://github.com/pytorch/pytorch/issues/7617",
        "r6a-xpuops4691-compiled-grad-rng": "https://github.com/intel/torch-xpu-ops/issues/4691",
        "r6a-hf26221-trainer-resets-gc-kwargs": (
            "https://github.com/huggingface/transformers/issues/26221"
        ),
    }
)

SOURCES.update(
    {
        "r8a-thunder1368-saved-tensors": "https://github.com/Lightning-AI/lightning-thunder/issues/1368",
        "r8a-thunder1379-backward-trace": "https://github.com/Lightning-AI/lightning-thunder/issues/1379",
        "r8a-lightning16435-fsdp-wrapper": "https://github.com/Lightning-AI/pytorch-lightning/issues/16435",
        "r8a-autoresearch588-release-table": "https://github.com/karpathy/autoresearch/pull/588",
    }
)

# Gemini placement (RK670), tokenizer length warning (RK671): round "states4"
SOURCES.update(
    {
        "r8s-unsloth382-token-overflow": "https://github.com/unslothai/unsloth/issues/382",
        "r8s-colossalai2246-gemini-auto": "https://github.com/hpcaitech/ColossalAI/issues/2246",
        "r8s-qwen25omni257-token-overflow-oom": "https://github.com/QwenLM/Qwen2.5-Omni/issues/257",
    }
)

# host RAM, selective recompute that OOMs, vocabulary-sized loss buffers (RK660, RK661, RK262):
# round "pressure2"
SOURCES.update(
    {
        "r8p-verl224-rollout-host-ram": "https://github.com/verl-project/verl/issues/224",
        "r8p-mbridge5506-selective-oom": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5506",
        "r8p-mbridge5508-fp32-ce-buffer": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/5508",
        "r8p-trl3436-unshard-oom-cut": "https://github.com/huggingface/trl/issues/3436",
    }
)

# ZeRO-3 model moved whole before sharding (RK691), an upgrade "from A to B" regression
# (RK600), a recompute call passing an argument in another parameter's slot (RK690):
# round "sample4a"
SOURCES.update(
    {
        "r10a-deepspeed2497-module-to-device": "https://github.com/deepspeedai/DeepSpeed/issues/2497",
        "r10a-deepspeed7116-upgrade-from-to": "https://github.com/deepspeedai/DeepSpeed/issues/7116",
        "r10a-megatron355-ckpt-arg-slot": "https://github.com/NVIDIA/Megatron-LM/pull/355",
    }
)

# memory budget and speed (RK700), another kernel in the recompute (RK701), a reentrant
# checkpoint's output cycle (RK702): round "sample4b"
SOURCES.update(
    {
        "r10b-pt149258-memory-budget-speed": "https://github.com/pytorch/pytorch/issues/149258",
        "r10b-pt84413-reentrant-output-cycle": "https://github.com/pytorch/pytorch/issues/84413",
        "r10b-nemorl1676-cudnn-attention-metadata": "https://github.com/NVIDIA-NeMo/RL/pull/1676",
    }
)

# Round "stated": symptoms said in words only (the threads' titles or first sentences),
# for the readings of rules/stated.py
SOURCES.update(
    {
        "stated-lora-120-grads-none": "https://github.com/microsoft/LoRA/issues/120",
        "stated-cloneofsimo-26-no-updates": "https://github.com/cloneofsimo/lora/issues/26",
        "stated-guided-diffusion-167-diverge": "https://github.com/openai/guided-diffusion/issues/167",
        "stated-pt-77030-hangs": "https://github.com/pytorch/pytorch/issues/77030",
        "stated-llamafactory-6232-no-change": "https://github.com/hiyouga/LlamaFactory/issues/6232",
        "stated-pt-147449-cannot-reduce": "https://github.com/pytorch/pytorch/issues/147449",
        "stated-bagel-139-oom-saving": "https://github.com/ByteDance-Seed/Bagel/issues/139 (title)",
        "stated-ao-2445-slow": "https://github.com/pytorch/ao/issues/2445 (title)",
        "stated-homura-16-grows": "https://github.com/moskomule/homura/issues/16",
        "stated-guided-diffusion-167-title": "https://github.com/openai/guided-diffusion/issues/167",
        "stated-dingo-60-grows": "https://github.com/dingo-gw/dingo/issues/60",
        "stated-longllama-9-error": "https://github.com/CStanKonrad/long_llama/issues/9",
        "stated-ovdino-47-batch-no-help": "https://github.com/wanghao9610/OV-DINO/issues/47",
        # (cut where the stored copy ends)
        "msswift-2590-reentrant-warning-then-traceback": (
            "https://github.com/modelscope/ms-swift/issues/2590"
        ),
        "stated-antislop-3-never-enabled": "https://github.com/sam-paech/auto-antislop/issues/3",
        "npkit-37-nccl-calloc": "https://github.com/microsoft/NPKit/issues/37",
        "torchtitan-660-nccl-barrier-calloc": "https://github.com/pytorch/torchtitan/pull/660",
        "nemorl-2811-logprob-oom": "https://github.com/NVIDIA-NeMo/RL/issues/2811",
        "stated-unsloth-1111-slower-since-yesterday": "https://github.com/unslothai/unsloth/issues/1111",
        "bnb-758-attention-softmax-oom": "https://github.com/bitsandbytes-foundation/bitsandbytes/issues/758",
        "megatron-394-unrecognized-activations-checkpoint-method": "https://github.com/NVIDIA/Megatron-LM/issues/394",
        "stated-torchtitan-678-activation-memory": "https://github.com/pytorch/torchtitan/issues/678",
        "stated-te-1261-fp8-memory-not-halved": "https://github.com/NVIDIA/TransformerEngine/issues/1261",
        "stated-mlm-2772-mfsdp-more-memory": "https://github.com/NVIDIA/Megatron-LM/issues/2772",
        "kp-unsloth-1797-pinned-oom": "https://github.com/unslothai/unsloth/issues/1797",
        "lf-1936-trainer-deepspeed-none": "https://github.com/hiyouga/LLaMA-Factory/issues/1936",
        "stated-te-1764-fp8-same-memory-as-bf16": "https://github.com/NVIDIA/TransformerEngine/issues/1764",
        "nemo-rl-2702-colocated-oom-at-setup": "https://github.com/NVIDIA-NeMo/RL/issues/2702",
    }
)

# round "trials_s7" (skill trials, 2026-11-27)
SOURCES.update(
    {
        "ds-examples-186-allocator-flushes": (
            "https://github.com/deepspeedai/DeepSpeedExamples/issues/186 (the reporter's log, "
            "its first three lines)"
        ),
    }
)

# round "w": known problems collected from the frameworks' trackers (not corpus cases)
SOURCES.update(
    {
        "kp-w-kohya-1687-ddpoptimizer-higher-order-op": (
            "https://github.com/bmaltais/kohya_ss/issues/1687"
        ),
        "kp-w-hf-trainer-fsdp-ac-and-gc": (
            "https://github.com/huggingface/transformers/pull/25771 (the ValueError as "
            "transformers' Trainer raises it, src/transformers/trainer.py)"
        ),
        "kp-w-examples-1210-offload-to-cpu": "https://github.com/pytorch/examples/issues/1210",
    }
)

# round "trial_gptoss": Megatron-LM's assert for layers that do not split over the stages
SOURCES.update(
    {
        "mlm-arguments-layers-over-pp": "https://github.com/NVIDIA/Megatron-LM/blob/"
        "d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/arguments.py#L998 "
        "(the assert's message, as an AssertionError prints it)",
    }
)

# round "trial 11": reports a skill trial collected (verbatim, the report only)
SOURCES.update(
    {
        "t11-transformers-28022": "https://github.com/huggingface/transformers/issues/28022",
        "t11-transformers-7926": "https://github.com/huggingface/transformers/issues/7926 "
        "(the report as far as the traceback's first frames)",
    }
)

# round "x": known problems collected from the frameworks' trackers (not corpus cases)
SOURCES.update(
    {
        "kp-x-hf-27596-set-gc-enable": "https://github.com/FlagAI-Open/FlagAI/issues/556",
        "kp-x-trl-3683-caching-incompatible-gc": "https://github.com/huggingface/trl/issues/3683",
        "kp-x-pt-122057-expandable-unsupported": "https://github.com/pytorch/pytorch/issues/122057",
        "kp-x-unsloth-1446-driver-error": "https://github.com/unslothai/unsloth/issues/1446",
        "kp-x-pt-142104-ca-reentrant": "https://github.com/pytorch/pytorch/issues/142104",
        "kp-x-pt-142862-sac-backward-extra": "https://github.com/pytorch/pytorch/issues/142862",
        "kp-x-pt-154306-cudagraph-ckpt": "https://github.com/pytorch/pytorch/issues/154306",
        "kp-x-ds-5662-invalidate-trace": "https://github.com/deepspeedai/DeepSpeed/issues/5662",
        "kp-x-unsloth-1613-requires-grad-hook": "https://github.com/unslothai/unsloth/issues/1613",
        "kp-x-unsloth-zoo-712-output-grads": "https://github.com/unslothai/unsloth-zoo/pull/712",
        "kp-x-titan-1631-flex-uncompiled": "https://github.com/pytorch/torchtitan/issues/1631",
        "kp-x-titan-1408-flex-sac": "https://github.com/pytorch/torchtitan/pull/1408",
        "kp-x-mlm-996-offload-context": "https://github.com/NVIDIA/Megatron-LM/pull/996",
        "kp-x-mlm-2582-fp8-param-gather-offload": "https://github.com/NVIDIA/Megatron-LM/issues/2582",
        "kp-x-mlm-5083-hybrid-opt-none": "https://github.com/NVIDIA/Megatron-LM/issues/5083",
        "kp-x-mlm-2758-cudagraph-grad": "https://github.com/NVIDIA/Megatron-LM/issues/2758",
        "kp-x-mlm-1708-te-offload-weights": "https://github.com/NVIDIA/Megatron-LM/issues/1708",
        "kp-x-nemorl-2279-nvte-offload-v1": (
            "https://github.com/NVIDIA-NeMo/RL/pull/2279 (the review comment quoting "
            "Megatron-Bridge config.py's error)"
        ),
        "kp-x-apex-1314-fused-wgrad": "https://github.com/NVIDIA/apex/issues/1314",
    }
)

# skill trial y2: a real paste no corpus case holds
SOURCES.update(
    {
        "nemorl-2859-dpo-float16-to-fp32": "https://github.com/NVIDIA-NeMo/RL/issues/2859",
    }
)
SOURCES.update(
    {
        "nemorl-362-dtensor-dpo-oom": "https://github.com/NVIDIA-NeMo/RL/issues/362",
        "nemorl-362-dtensor-dpo-cmd": "https://github.com/NVIDIA-NeMo/RL/issues/362 (the "
        "reporter's command)",
    }
)

# round "trial 24": reports a skill re-trial collected (verbatim, the report only)
SOURCES.update(
    {
        "t24-nemorl-2859-float16-to-fp32": "https://github.com/NVIDIA-NeMo/RL/issues/2859 "
        "(the report as the stored copy cuts it, inside its traceback)",
    }
)
SOURCES["t24-transformers-7158-evaluate-oom"] = (
    "https://github.com/huggingface/transformers/issues/7158 (its title as the first line, then "
    "the report as the stored copy cuts it, inside its traceback)"
)

# round ac (2026-11-28): fresh cases' verbatim pastes a rule was written for
SOURCES["transformers-30544-gradient-checkpointing-func"] = (
    "https://github.com/huggingface/transformers/issues/30544 (the traceback the report pastes)"
)
SOURCES["megatronllm-86-full-recompute-position-ids"] = (
    "https://github.com/epfLLM/Megatron-LLM/pull/86 (the PR's description)"
)
SOURCES["transformerlm-21-resume-multi-gpu"] = (
    "https://github.com/lopuhin/transformer-lm/issues/21 (the report, as the stored copy cuts "
    "its OOM line)"
)
SOURCES["megatronlm-381-quoted-pp-divisible-check"] = (
    "https://github.com/NVIDIA/Megatron-LM/issues/381"
)
# round ae (2026-11-28): a skill trial's pastes (the reporters' own text)
SOURCES["stated-te-712-fp8-peak-not-lower"] = (
    "https://github.com/NVIDIA/TransformerEngine/issues/712 (the report's opening paragraphs)"
)
SOURCES["stated-pt-18313-oom-after-epochs"] = (
    "https://github.com/pytorch/pytorch/issues/18313 (the traceback, the GPU and the reporter's "
    "follow-up)"
)
SOURCES["titan-808-float8-step-memory"] = (
    "https://github.com/pytorch/torchtitan/pull/808 (the PR description's three runs)"
)
SOURCES["verl-456-grpo-global-batch"] = (
    "https://github.com/verl-project/verl/issues/456 (the report and its launch script, cut as "
    "the reporter cut it)"
)
SOURCES["fairseq-2926-one-gpu-long-input"] = (
    "https://github.com/facebookresearch/fairseq/issues/2926 (the question as posted)"
)
