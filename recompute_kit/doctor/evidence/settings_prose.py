"""Training settings stated in prose and on command lines rather than in a config file: the
ZeRO stage ("ZeRO stage: 2", "zero2", `ds_z2_config.json`, `--zero_stage 3`), CPU offload
("with CPU offload", `offload_optimizer=True`, `--adam_offload`), adapters (`--use_lora`,
`--finetuning_type lora`, "QLoRA", `load_in_4bit`), gradient checkpointing flags and words
("I enable gradient_checkpointing"), the micro-batch and sequence-length flags and words
("batch=1, seq_len=1024"), flash attention in use ("with flash-attn 2"), and the GPUs ("2x
A100 40GB", "4 A100 GPUs (40g each)", "4张A100").

`scan_settings(lines)` returns {"settings_prose": {key: value, ..., "lines": [...]}} with only
the keys found; a setting named in a question or as something to try next ("would you
recommend switching to ZeRO-3?", "instead of ZeRO-3") or negated ("without LoRA") is not one in
use.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from .signals import MODEL_ASCII_RE

GIB = 2**30
# a source line, not prose: `if self.cpu_offloading and ...:`
_CODE_RE = re.compile(r"\bself\.|==|\bdef |\bimport |\breturn\b|^\s*(?:if|for|elif) .*:\s*$")

# A clause that proposes or asks rather than states: the setting in it is not the one in use
_HYPOTHETICAL_RE = re.compile(
    r"\b(?:switch(?:ing|ed)? to|instead of|rather than|recommend\w*|should i|shall i|"
    r"could i|can i|would (?:it|you|i)|try(?:ing)? (?:to use )?(?:using )?|move to|"
    r"upgrade to|without|w/o|not using|no|not supported|unsupported|disabl\w*)\b[^.,;!\n]{0,50}$"
    # Chinese "cannot use" / "not supported" / "instead of": 用不了 / 不能用 / 无法使用 / 不支持
    r"|(?:用不了|不能用|无法使用|没法用|不支持|而不是)[^.,;!\n，。；]{0,50}$",
    re.I,
)
# An adapter merged into the weights is a plain model now: "lora合并的模型", "merged LoRA"
_MERGED_RE = re.compile(r"合并|merged?\b", re.I)
# RLHF / preference training: the algorithm (script or trainer names it) and the models it
# holds: PPO trains an actor and a critic next to a frozen reference and reward model
_RLHF_RE = re.compile(
    r"train_(ppo|grpo|dpo|rloo|remax|kto|reinforce)\w*|\b(ppo|grpo|dpo|rloo|kto)(?:_?trainer)?\b"
    r"|\b(rlhf)\b",
    re.I,
)
_ROLE_RE = re.compile(
    r"(?<![A-Za-z])(actor|critic|value[_ ]model|ref(?:erence)?(?:[_ ]model)?|reward(?:[_ ]model)?)"
    r"(?![a-z])",
    re.I,
)
_COLOCATE_RE = re.compile(r"--colocate_(\w+)|\bcolocate[_ ]?(all|actor_ref|critic_reward)", re.I)
_ZERO_RE = re.compile(
    r"(?<![A-Za-z])(?:zero|ds_z|deep[\s_-]?speed[\s_-]*(?:zero[\s_-]*)?stage)[\s_-]*(?:stage)?"
    r"[\s_:=-]*([0-3])(?!\d|\.\d)",
    re.I | re.A,
)
_OFFLOAD_OPT_RE = re.compile(
    r"\b(?:cpu[\s_-]*offload\w*|offload\w*\s+(?:\w+\s+)?(?:to|on)\s+(?:the\s+)?cpu"
    r"|offload_optimizer(?:_device)?|optimizer[\s_-]*(?:state\s+)?offload\w*|adam_offload"
    r"|zero[\s_-]*offload)\b(?:\s*[=:]\s*(true|false|none|cpu|nvme|gpu)\b)?",
    re.I | re.A,
)
_OFFLOAD_PARAM_RE = re.compile(
    r"\b(?:offload_param(?:eter)?s?(?:_device)?|param(?:eter)?s?[\s_-]*offload\w*)\b"
    r"(?:\s*[=:]\s*(true|false|none|cpu|nvme|gpu)\b)?",
    re.I | re.A,
)
_ADAPTER_RE = re.compile(
    r"--use_lora\b|--use_peft\b|--lora_r\b|--lora_rank\b|--finetuning_type[\s=]+q?lora\b"
    r"|--(?:train_)?type[\s=]+q?lora\b|\bq?lora\b|\bpeft\b|load_in_[48]bit"
    # DeepSpeed-Chat's and other scripts' own names: lora_dim=128, only_optimize_lora
    r"|\b(?:\w+_)?lora_(?:dim|r|rank|alpha|module_name)\b|\bonly_optimize_lora\b"
    # in code: PEFT's own calls and the names a script gives its adapter config
    r"|get_peft_model\s*\(|LoraConfig\s*\(|\blora_(?:cfg|config)\b|finetune_adapter",
    re.I | re.A,
)
_QUANT_RE = re.compile(
    r"\bqlora\b|load_in_4bit|\b4[\s-]?bit\b|\bnf4\b|--quantization_bit[\s=]+4|--bits[\s=]+4"
    r"|(?P<eight>load_in_8bit|\b8[\s-]?bit\b|--quantization_bit[\s=]+8|--bits[\s=]+8)",
    re.I | re.A,
)
_CKPT_RE = re.compile(
    r"--(?:gradient_checkpointing(?:_enable)?|grad_checkpoint\w*|recompute_activations?"
    r"|use_gradient_checkpointing|activation_checkpointing)\b(?:[\s=]+(\w+))?",
    re.I | re.A,
)
_MICRO_RE = re.compile(
    r"--(?:per_device_train_batch_size|micro[_-]batch[_-]size|micro_train_batch_size"
    r"|train_micro_batch_size_per_gpu|per_gpu_train_batch_size|batch_size)[\s=]+(\d+)"
    r"|\bmicro[\s_-]?batch(?:[\s_-]?size)?\s*(?:[:=]|of|is)?\s*(\d+)\b",
    re.I | re.A,
)
_SEQ_RE = re.compile(
    r"--(?:max_seq_length|max_seq_len|cutoff_len|seq_length|seq-length|max_length"
    r"|model_max_length|max_len|max_source_length|block_size)[\s=]+(\d+)",
    re.I,
)
# the same in the reporter's words: "batch=1, seq_len=1024", "micro batch size: 2"
_PROSE_BATCH_RE = re.compile(
    r"(?<![\w-])(?:bs|(?:per[_ -]device[_ ]|micro[_ ]?)?batch(?:[_ -]?size)?)\s*[=:]\s*(\d+)\b",
    re.I,
)
_PROSE_SEQ_RE = re.compile(
    r"(?<![\w-])(?:max[_ ])?seq(?:uence)?[_ ]?len(?:gth)?\s*[=:]\s*(\d+)\b"
    # in a sentence: "with 4096 sequence length", "a sequence length of 8192"
    r"|(?<![\w.-])(\d{3,6})[- ](?:token[- ])?(?:sequence|seq|context)[_ -]?len(?:gth)?\b"
    r"|\b(?:sequence|seq|context)[_ -]?len(?:gth)?\s+(?:of\s+)?(\d{3,6})\b",
    re.I,
)
# "and batch size of 1", "a micro batch size of 2"
_PROSE_BATCH_OF_RE = re.compile(r"\b(?:micro[_ ]?)?batch[_ -]?size\s+of\s+(\d{1,4})\b", re.I)
# model parallelism stated: "PP4 DP2 EP1 TP1", "TP=8", "--pipeline-model-parallel-size 4",
# "tensor_parallel_size: 2", "each rank will hold 5B"
_MODEL_PARALLEL_RE = re.compile(
    r"(?<![A-Za-z])(?:PP|TP|VPP|EP)\s*[=:]?\s*(\d{1,3})(?![\w.])"
    r"|--?(?:pipeline|tensor|expert)[-_](?:model[-_])?parallel[-_]size[\s=:]+(\d{1,3})"
    r"|(?:pipeline|tensor|expert)_(?:model_)?parallel(?:_size)?\s*[:=]\s*(\d{1,3})"
)
_PER_RANK_RE = re.compile(r"\beach\s+(?:rank|gpu|stage)\s+(?:will\s+)?holds?\b", re.I)
# every weight trained, in words: "full fine-tuning", "full-parameter finetune", "full FT"
_FULL_FT_RE = re.compile(
    r"\bfull[- ](?:param(?:eter)?s?[- ])?(?:fine[- ]?tun(?:e|ed|ing)|training|ft|sft)\b", re.I
)
# flash attention in use: "using flash-attn", "with flash-attn 2", "flash_attention_2"
_FLASH_SAID_RE = re.compile(
    r"\bflash[-_ ]?attn(?:[-_ ]?2)?\b|\bflash[-_ ]attention(?:[-_ ]?2)?\b", re.I
)
# checkpointing turned on in words: "I enable gradient_checkpointing in the training_args"
_CKPT_SAID_RE = re.compile(
    r"\b(?:enabl(?:e|ed|ing)|turn(?:ed)? on|us(?:e|ed|ing)|with)\s+(?:the\s+)?"
    r"(?:gradient|activation)[_ ]checkpointing\b"
    # "..., gradient checkpointing on", "activation checkpointing: enabled"
    r"|\b(?:gradient|activation)[_ ]checkpointing\s*(?:[:=]\s*|is\s+)?(?:on|enabled)\b",
    re.I,
)
_GPU_NAME = (
    r"(?:[ABHL]\d{2,3}S?|H20|V100|P100|T4|A\d{4}|A40|(?:RTX\s?)?[2-5]0[6-9]0(?:\s?Ti)?"
    r"|MI\d{3}X?)"
)
# "2× NVIDIA A100", "8 x 3090", "4张A100", "2 16G A4000", "4 A100 GPUs"
_GPU_COUNT_RE = re.compile(
    rf"(?<![A-Za-z0-9_.])(\d{{1,2}})\s*(?:[x×*]\s*|张\s*|块\s*|pcs\s+|cards?\s+of\s+)?"
    rf"(?:NVIDIA\s+|Nvidia\s+|GeForce\s+|Tesla\s+)?(?:\d{{2,3}}\s*G[Bb]?\s+)?{_GPU_NAME}(?![\w])"
    r"|(?<![A-Za-z0-9_.])(\d{1,2})\s+(?:\w+\s+)?GPUs\b|(?<![A-Za-z0-9_.])(\d{1,2})\s*(?:张|块)(?:卡|显卡|GPU)",
    re.I,
)
# the size on the same line as a GPU: "(40GB each)", "40g each", "16G A4000", "A100 80GB"
_GPU_SIZE_RE = re.compile(r"(?<![\w.])(\d{2,3})\s*G(?:i?B|b)?(?![\w])", re.I)
# GPUs sold with one memory size only: the size when the paste names the card alone ("8张T4")
_ONE_SIZE = {
    "t4": 16,
    "a10": 24,
    "a10g": 24,
    "l4": 24,
    "3090": 24,
    "4090": 24,
    "a5000": 24,
    "a6000": 48,
    "l40": 48,
    "l40s": 48,
    "a40": 48,
    "h100": 80,
    "h800": 80,
    "2080ti": 11,
}
_CARD_RE = re.compile(
    r"(?<![A-Za-z0-9])(?:RTX\s?)?(T4|A10G?|L4|L40S?|A40|A[56]000|H[18]00|[34]090|2080\s?Ti)"
    r"(?![A-Za-z0-9])",
    re.I,
)
_GPU_WORD_RE = re.compile(rf"{_GPU_NAME}|\bGPUs?\b|显卡|\bcards?\b", re.I)


def _stated(line: str, start: int) -> bool:
    """The setting at `start` is stated as in use: not negated, proposed or asked about."""
    before = line[:start]
    if _HYPOTHETICAL_RE.search(before):
        return False
    clause_end = re.search(r"[.;!\n]", line[start:])
    clause = line[start : start + clause_end.start()] if clause_end else line[start:]
    return "?" not in clause


def _flag_value(word: str | None) -> bool:
    return (word or "true").lower() not in ("false", "none", "0", "no", "off")


def scan_settings(lines: list[str]) -> dict[str, Any]:
    """The settings stated in the paste's prose and command lines (see the module doc)."""
    found: dict[str, Any] = {}
    quoted: list[str] = []

    def put(key: str, value: Any, line: str) -> None:
        if key not in found:
            found[key] = value
            q = " ".join(line.split())[:200]
            if q not in quoted and len(quoted) < 8:
                quoted.append(q)

    for line in lines:
        if len(line) > 2000 or _CODE_RE.search(line) or line.lstrip()[:1] in "'\"|":
            # source code, a quoted message string or a table row: not the user's settings
            continue
        if "model" not in found and (m := MODEL_ASCII_RE.search(line)):
            experts, size = m.group(1), m.group(2)
            params = float(size or m.group(3) or m.group(4) or m.group(5)) * 1e9
            if 0.1e9 <= params * (int(experts) if experts else 1) <= 2000e9:
                found["model"] = {
                    "params": params * (int(experts) if experts else 1),
                    "name": m.group(0).strip(),
                }
        for m in _ZERO_RE.finditer(line):
            if _stated(line, m.start()):
                put("zero_stage", int(m.group(1)), line)
                break
        for m in _OFFLOAD_OPT_RE.finditer(line):
            if _stated(line, m.start()):
                put("offload_optimizer", _flag_value(m.group(1)), line)
                break
        for m in _OFFLOAD_PARAM_RE.finditer(line):
            if _stated(line, m.start()):
                if _flag_value(m.group(1)):  # a later "offload_parameters=True" wins
                    found.pop("offload_param", None)
                put("offload_param", _flag_value(m.group(1)), line)
        for m in _ADAPTER_RE.finditer(line):
            if _stated(line, m.start()) and not _MERGED_RE.search(line[m.start() : m.end() + 12]):
                put("adapters", True, line)
                break
        for m in _QUANT_RE.finditer(line):
            if _stated(line, m.start()) and (_ADAPTER_RE.search(line) or "load_in" in m.group(0)):
                put("quant_bits", 8 if m.group("eight") else 4, line)
                break
        if m := _CKPT_RE.search(line):
            put("gradient_checkpointing", _flag_value(m.group(1)), line)
        if (m := _MICRO_RE.search(line)) and _stated(line, m.start()):
            put("micro_batch", int(m.group(1) or m.group(2)), line)
        if m := _SEQ_RE.search(line):
            put("seq_len", int(m.group(1)), line)
        if (m := _PROSE_BATCH_RE.search(line)) and _stated(line, m.start()):
            put("micro_batch", int(m.group(1)), line)
        if (m := _PROSE_SEQ_RE.search(line)) and _stated(line, m.start()):
            put("seq_len", int(next(g for g in m.groups() if g)), line)
        if (m := _PROSE_BATCH_OF_RE.search(line)) and _stated(line, m.start()):
            put("micro_batch", int(m.group(1)), line)
        for m in _MODEL_PARALLEL_RE.finditer(line):
            if int(m.group(1) or m.group(2) or m.group(3)) > 1 and _stated(line, m.start()):
                put("model_parallel", True, line)
                break
        if _PER_RANK_RE.search(line):
            put("model_parallel", True, line)
        if "openrlhf" in line.lower():  # its module path or name: --flash_attn is its switch
            put("trainer", "openrlhf", line)
        if (m := _FULL_FT_RE.search(line)) and _stated(line, m.start()):
            put("full_finetune", True, line)
        if (m := _FLASH_SAID_RE.search(line)) and _stated(line, m.start()):
            put("attention", "flash", line)
        if (m := _CKPT_SAID_RE.search(line)) and _stated(line, m.start()):
            put("gradient_checkpointing", True, line)
        if (m := _GPU_COUNT_RE.search(line)) and _stated(line, m.start()):
            count = int(m.group(1) or m.group(2) or m.group(3))
            if 1 <= count <= 64:
                put("gpu_count", count, line)
        if (
            _GPU_WORD_RE.search(line)
            and "gpu_bytes" not in found
            and not re.search(r"allocate|capacity|free|reserved", line, re.I)
        ):
            for m in _GPU_SIZE_RE.finditer(line):
                size = int(m.group(1))
                if 8 <= size <= 300 and _stated(line, m.start()):
                    put("gpu_bytes", size * GIB, line)
                    break
    if rlhf := _rlhf(lines):
        found["rlhf"] = rlhf
    if device0 := _device0(lines):
        found["device0"] = device0
    if "gpu_bytes" not in found:
        for line in lines:
            if (m := _CARD_RE.search(line)) and _stated(line, m.start()):
                size = _ONE_SIZE[m.group(1).lower().replace(" ", "")]
                put("gpu_bytes", size * GIB, line)
                break
    extra = _notices(lines)
    if not found:
        return extra
    found["lines"] = quoted
    return {"settings_prose": found, **extra}


# ColossalAI Gemini's placement policy, as a setting: "PLACEMENT_POLICY = 'auto'",
# GeminiDDP(..., placement_policy="cuda"), GeminiPlugin(placement_policy='static')
_GEMINI_RE = re.compile(r"\bgemini", re.I)
_PLACEMENT_RE = re.compile(
    r"placement[_ ]?policy\W{0,3}\s*[=:]\s*['\"]?(auto|cuda|cpu|static|const)\b", re.I
)
# transformers' tokenizer warning (tokenization_utils_base.py), printed when a text is
# tokenized whole, before any truncation to the training length
_TOKEN_OVERFLOW_RE = re.compile(
    r"Token indices sequence length is longer than the specified maximum sequence length"
    r"(?: for this model)?\s*\((\d+) > (\d+)\)"
)


def _notices(lines: list[str]) -> dict[str, Any]:
    """{"gemini_placement": {"policy", "line"}} when the paste uses ColossalAI Gemini with a
    stated placement policy; {"token_overflow": {"length", "max", "line"}} for the
    tokenizer's sequence-length warning."""
    found: dict[str, Any] = {}
    if families := _model_families(lines):
        found["model_families"] = families
    gemini = any(_GEMINI_RE.search(line) for line in lines if len(line) < 4000)
    for line in lines:
        if len(line) > 4000:
            continue
        if gemini and "gemini_placement" not in found and (m := _PLACEMENT_RE.search(line)):
            found["gemini_placement"] = {
                "policy": m.group(1).lower(),
                "line": " ".join(line[max(0, m.start() - 60) : m.end() + 40].split()),
            }
        if "token_overflow" not in found and (
            m := _TOKEN_OVERFLOW_RE.search(" ".join(line.split()))
        ):
            found["token_overflow"] = {
                "length": int(m.group(1)),
                "max": int(m.group(2)),
                "line": " ".join(line.split())[:220],
            }
    if "token_overflow" not in found:  # a paste that hard-wrapped the warning
        joined = " ".join(" ".join(line.split()) for line in lines if len(line) < 4000)
        if m := _TOKEN_OVERFLOW_RE.search(joined):
            found["token_overflow"] = {
                "length": int(m.group(1)),
                "max": int(m.group(2)),
                "line": joined[m.start() : m.end() + 80],
            }
    return found


@functools.lru_cache(maxsize=1)
def _family_vocabularies() -> dict[str, list[int]]:
    """Model family word (qwen, llama, gemma, deepseek, gpt-oss, ...) -> the vocabulary sizes
    of the registry's models of that family (sources/models: their config.json files)."""
    from ...sources.registry import list_models, model_config

    found: dict[str, set[int]] = {}
    for model_id, _ in list_models():
        name = model_id.split("/")[-1].lower().removeprefix("meta-")
        family = "gpt-oss" if name.startswith("gpt-oss") else re.match(r"[a-z]*", name).group(0)
        vocab = (model_config(model_id) or {}).get("vocab_size")
        if len(family) >= 3 and isinstance(vocab, int):
            found.setdefault(family, set()).add(vocab)
    return {family: sorted(v) for family, v in found.items()}


def _model_families(lines: list[str]) -> dict[str, list[int]]:
    """The model families the paste names (a model id, a path, a test name: `Qwen2.5-7B`,
    `llm_performance_grpo_qwen3_30ba3b`), each with its vocabulary sizes."""
    families = _family_vocabularies()
    text = "\n".join(line for line in lines if len(line) < 4000).lower()
    return {
        family: vocabs
        for family, vocabs in families.items()
        if re.search(rf"(?<![a-z]){re.escape(family)}", text)
    }


def _rlhf(lines: list[str]) -> dict[str, Any] | None:
    """An RLHF / preference-training run: {"algo": "ppo" | "grpo" | "dpo" | ... | "rlhf",
    "roles": the model roles named (actor, critic, ref, reward), "colocate": the colocation
    flags, "ray": launched through a Ray script (models placed on GPUs of their own)}."""
    algo, roles, colocate, ray = None, set(), [], False
    for line in lines:
        if len(line) > 2000:
            continue
        for m in _RLHF_RE.finditer(line):
            algo = algo or (m.group(1) or m.group(2) or m.group(3)).lower()
            if m.group(1) and "_ray" in line[m.start() : m.end() + 8].lower():
                ray = True
        for m in _ROLE_RE.finditer(line):
            word = m.group(1).lower()
            roles.add(
                "critic"
                if word.startswith(("critic", "value"))
                else "ref"
                if word.startswith("ref")
                else word.split("_")[0].split()[0]
            )
        colocate += [(m.group(1) or m.group(2)).lower() for m in _COLOCATE_RE.finditer(line)]
    if algo is None and len(roles) < 2:
        return None
    return {"algo": algo or "rlhf", "roles": sorted(roles), "colocate": colocate, "ray": ray}


# Ranks other than 0 holding memory on GPU 0: "Each non-0 rank is occupying ~1GB memory on GPU
# 0", "every process creates a context on cuda:0", "all ranks allocate memory on device 0"
_PROCS = r"(?:ranks?|process(?:es)?|workers?|scripts?|jobs?)"
_GPU0 = r"(?:GPU\s*(?:#|:)?\s*0|cuda:0|device\s*(?:id\s*)?0|rank\s*0'?s\s+GPU)"
_DEVICE0_RE = re.compile(
    rf"\b(?:non-?0|non-?zero|other|every|each|all)\b[^.\n]{{0,30}}\b{_PROCS}"
    rf"\b[^.\n]{{0,60}}\b{_GPU0}\b"
    # the other order: "GPU 0 always occupies a lot of memory for each script"
    rf"|\b{_GPU0}\b[^.\n]{{0,60}}\b(?:every|each|all)\b[^.\n]{{0,20}}\b{_PROCS}\b",
    re.I,
)


def _device0(lines: list[str]) -> dict[str, Any] | None:
    """Ranks that touch GPU 0 before (or without) selecting their own: said in words, or a
    process group initialised with torch.cuda.set_device missing or commented out.
    {"said": the line or None, "set_device": "missing" | "commented" | "called" | None}."""
    said, init, set_device = None, False, None
    for line in lines:
        if said is None and len(line) < 400 and _DEVICE0_RE.search(line):
            said = " ".join(line.split())[:200]
        if "init_process_group" in line:
            init = True
        if "set_device" in line:
            called = line.split("#", 1)[0]
            state = "called" if "set_device" in called else "commented"
            set_device = "called" if "called" in (state, set_device) else state
    if init and set_device is None:
        set_device = "missing"
    if said is None and set_device not in ("missing", "commented"):
        return None
    return {"said": said, "set_device": set_device if init else None}
