"""Signals in pasted text that no format parser reads whole: traceback frames with the source
line under each (the log parser keeps file, line and function only), square [N, N] tensors of
attention masks and scores, logits with a vocabulary-sized dimension, and GPU or model sizes
stated in prose ("A100-80Gx8", "8x B200 178 GB", "GPT-30B model", "16B模型").

Plain text matching over the lines of a short paste; every key is present only when found.
"""

from __future__ import annotations

import re
from typing import Any

from .text import parse_size

GIB = 2**30

# `File "/x/site-packages/deepspeed/runtime/zero/stage3.py", line 12, in step`
_FRAME_RE = re.compile(r'File "(.+?)", line (\d+)(?:, in ([\w<>.]+))?')
# A square [N, N] (or [..., N, N], "N x N", "N^2") with N a sequence length, not a small matrix
_SQUARE_RE = re.compile(r"(?<![\d.])(\d{4,7})\s*(?:,|x|×|\*)\s*(\d{4,7})(?![\d.])")
_SQUARED_RE = re.compile(r"(?<![\d.])(\d{4,7})\s*(?:\^\s*2|\*\*\s*2|²)")
_SQUARE_WORDS = ("mask", "score", "attention", "attn", "materiali", "softmax", "matrix")
# q @ k^T written out: the full score matrix of eager attention
_SCORE_MATMUL_RE = re.compile(
    r"\b(?:q|query|queries|xq)\w*\s*@\s*(?:k|key|keys|xk)\w*\.(?:transpose|mT|T\b)"
    r"|(?:matmul|bmm|einsum)\s*\(\s*(?:q|query|xq)\w*\s*,\s*(?:k|key|xk)\w*\.transpose"
    # the softmax over the scores eager attention keeps (HF's eager_attention_forward, timm's
    # attn.softmax) and Megatron's unfused core attention (baddbmm of query and key)
    r"|\b(?:attn|attention|scores?)\w*\s*=\s*[\w.]*softmax\(\s*(?:attn|attention|scores?)\w*"
    r"|\b(?:attn|attention|scores?)\w*\.softmax\(|baddbmm\([^)\n]*query",
    re.I,
)
# a vocabulary-sized dimension: 30k-300k entries (LLM vocabularies), not a hidden size
_VOCAB_DIM_RE = re.compile(r"(?<![\d.])(\d{2,3})[,_]?(\d{3})(?![\d.])")
# "A100-80G", "H100 80GB", "RTX 3090 24GB", "8×B200 / 178 GB", "A100-80Gx8", "A100 (40Gb)"
_GPU_NAME = (
    r"(?:[ABHL]\d{2,3}S?|H20|V100|P100|T4|A6000|A40|RTX\s?\d{4}(?:\s?Ti)?|\d{4}(?:\s?Ti)?|"
    r"MI\d{3}X?|Gaudi\d?)"
)
_GPU_RE = re.compile(
    rf"(?:(\d{{1,2}})\s*[x×]\s*)?{_GPU_NAME}(?:[-\s]*(?:SXM\d?|PCIe|NVL))?"
    # the size right after the name, or after "with": "A100 (40Gb)", "A6000 with 48 GB"
    r"(?:[-\s/(]*|\s+with\s+(?:an?\s+|only\s+)?)"
    r"(\d{2,3}(?:\.\d+)?)\s*G(?:i?[Bb])?(?![A-Za-wyz0-9])(?:\s*[x×]\s*(\d{1,2})\b)?",
)
# GPUs named without a size whose memory is not an A100/H100's 80 GB (Blackwell, AMD Instinct,
# Gaudi): a default reading must not take 80 GB for them
_UNSIZED_GPU_RE = re.compile(r"\b(?:G?B[123]00A?|MI\d{3}X?|Gaudi\s?\d)\b")
_GPU_SIZE_RE = re.compile(
    r"(?<![\d.])(\d{2,3})\s*G(?:i?B)?\s*(?:GPU|VRAM|显存|显卡|card|of (?:GPU|VRAM))", re.I
)
# "GPT-30B model", "Llama-2-70B", "16B模型", "a 13B model", "7b parameters"
_MODEL_RE = re.compile(
    # (a CJK character may touch the name: "lora微调baichuan2-7b-base")
    r"(?<![\w./-])[A-Za-z][\w.]*-(?:[\w.]*-)*?(?:(\d+)x)?(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])"
    r"|(?<![A-Za-z0-9_./-])(\d+(?:\.\d+)?)\s?[bB]\s*(?:models?|模型|parameters|params|参数|LLM)"
    # a size used as the model's name after an article or size word: "the little 1.3b",
    # "a 7B", "this 13b" (not "256b" inside a word or a unit's figure)
    r"|(?<![\w.])(?i:the|a|an|this|that|my|our|little|small|tiny|smaller|big|bigger|large)"
    r"\s+(?i:(?:little|small|tiny|big|large)\s+)?(\d+(?:\.\d+)?)[bB](?![\w.])"
    r"(?!\s*(?i:bits?|bytes?|tokens?|vectors?|keys?|hash))"
    # a model family's name, a space, then its size: "llama3 70b", "Qwen2.5 7B"
    r"|(?<![A-Za-z])(?i:llama[\d.]*|qwen[\d.]*|mistral|mixtral|baichuan\d?|gemma\d?|falcon"
    r"|bloomz?|vicuna|chatglm\d?|internlm\d?|deepseek|yi|opt|gpt-?j|pythia)\s+"
    r"(\d+(?:\.\d+)?)[bB](?![\w.])",
)
# The same names with ASCII boundaries: a CJK character may touch the name ("lora微调baichuan2-
# 7b-base"); read only where the paste states how the states are kept (settings_prose.py)
MODEL_ASCII_RE = re.compile(_MODEL_RE.pattern, re.A)
# An allocation's size stated in words with no OOM message: "will try to allocate 720gb",
# "an allocation of 1.2 TB", "allocating ~400 GB for the mask"
_ALLOC_PROSE_RE = re.compile(
    r"\b(?:(?:try|tries|trying|tried|attempts?|attempting|wants?|needs?) to allocate"
    r"|allocat(?:es|ing|ed)|allocations? of)\s+(?:about\s+|around\s+|~\s*|over\s+)?"
    r"(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b",
    re.I,
)
# Words of a run that is not full mixed-precision training: inference / serving, adapters,
# quantized weights, sharded or offloaded states (16 bytes per parameter would not hold)
_NOT_FULL_TRAINING_RE = re.compile(
    r"\b(?:vllm|sglang|inference|infer|generat(?:e|ion|ing)|serv(?:e|ing)|kv[ _-]?cache"
    r"|predict(?:ion)?|lora|qlora|peft|adapters?|quantiz\w*|[48][ -]?bit|int[48]|gptq|awq"
    r"|zero[ _-]?(?:stage)?[ _-]?[123]|stage[ _-]?[123]|fsdp|offload\w*|8bit|sgd|adafactor)\b",
    re.I | re.A,  # "使用lora微调": a CJK character next to the word still leaves a boundary
)
# A way of keeping the states named only to say it is not used: "without any PEFT and
# Quantization", "w/o LoRA", "no ZeRO or offload" (the clause up to a comma or full stop)
_NEGATED_RE = re.compile(r"\b(?:without|w/o|no)\b[^.,;:!?\n]{0,40}", re.I)
# Words of training the model's weights: "finetune", "fine-tuning", "sft", "微调", "训练"
_TRAINING_RE = re.compile(
    r"\b(?:fine[ -]?tun\w*|train(?:s|ing|ed)?|pre-?train\w*|sft)\b|微调|训练", re.I
)
# The weights said not to fit at load time: "is 48 GB not enough to load the model?", "too
# small to load the model", "the model does not fit on the GPU"
_LOAD_FIT_RE = re.compile(
    r"\b(?:not enough|too (?:small|little)|insufficient|run(?:s|ning)? out of \w+)\b"
    r"[^.\n]{0,20}\bto (?:load|fit)\s+(?:the |a |my |this )?(?:\w+[ -])?model"
    r"|\bmodel\b[^.\n]{0,20}\b(?:does(?:n't| not)|won't|will not|can't|cannot) fit\b",
    re.I,
)
# processes of earlier runs still alive and holding the GPU: "a bunch of instances of my
# deepspeed scripts", "I had to kill -9 each one", "zombie processes", "残留进程"
_LEFTOVER_RE = re.compile(
    r"\b(?:instances|copies)\s+of\s+(?:my|the|our|this)\b[^.\n]{0,40}?\b(?:scripts?|jobs?|runs?"
    r"|programs?|processes)\b"
    r"|\bkill(?:ed|ing)?\b(?:\s+-9)?[^.\n]{0,40}?\b(?:process(?:es)?|pids?|each one|them all)\b"
    r"|\b(?:zombie|defunct|orphan(?:ed)?|leftover|lingering|stale)\s+(?:python\s+)?process"
    r"|僵尸进程|残留(?:的)?进程|进程(?:没有|未)(?:退出|结束)",
    re.I,
)
# Megatron's own source paths or entry points named in the paste (a snapshot's or a log's
# lines, not a traceback's frames): "Megatron-LM/megatron/core/transformer/mlp.py:344"
_MEGATRON_PATH_RE = re.compile(
    r"megatron/(?:core|training|legacy)/|\bpretrain_(?:gpt|mamba|t5|bert)\.py\b|megatron\.core\.",
    re.I,
)
# frozen inputs under a (reentrant) checkpoint, in words: "when freezing the first layers ...
# and using gradient-checkpointing, all gradient calculation will be disabled"
_FROZEN_RE = re.compile(r"\bfreez(?:e|es|ing)\b|\bfrozen\b|requires_grad\s*=\s*False", re.I)
_CKPT_WORD_RE = re.compile(r"(?:gradient|activation)[\s_-]checkpointing|\bcheckpoint\(", re.I)
_NO_GRAD_WORDS_RE = re.compile(
    r"requires_grad\s*==?\s*False|(?:gradients?|grads?)\s+(?:will\s+be|are|is|were)\s+None"
    r"|gradient\s+calculation\s+(?:will\s+be\s+|is\s+)?disabled|does not require grad"
    r"|no\s+grad(?:ient)?s?\s+(?:flow|are computed)",
    re.I,
)
# The GPU taken by something else, in words, with or without an OOM: "a GPU that was consumed
# already", "GPU 0 is already occupied", "the card is used by another process"
_GPU_TAKEN_RE = re.compile(
    r"\b(?:GPUs?|cards?|devices?)\b(?:(?!memory|\bvram\b)[^.]){0,30}?"
    r"(?:\balready\s+(?:being\s+)?(?:occupied|consumed|in use|used|taken|busy)\b"
    r"|\b(?:occupied|consumed|taken|busy|in use)\s+already\b"
    r"|\b(?:occupied|consumed|used|taken|in use)\s+by\s+(?:an?\s+)?(?:another|other|different"
    r"|second|someone|a colleague|other users?)\b)",
    re.I,
)


# The Hugging Face TrainingArguments' own printout (repr, one field a line): the Trainer runs
# without DeepSpeed whatever the launcher or an Accelerate YAML say
_TRAINER_NO_DEEPSPEED_RE = re.compile(r"^\s*deepspeed=None,?\s*$")
# DeepSpeed ZeRO-3's warning when the caching allocator had to free its cache and retry a
# cudaMalloc (stage3.py, `num_alloc_retries` grew): "2 pytorch allocator cache flushes since
# last step. this happens when there is high memory pressure ..."
_ALLOC_FLUSH_RE = re.compile(r"(?:(\d+) )?pytorch allocator cache flushes since last step", re.I)
_SIZE_RE = re.compile(r"\d+(?:\.\d+)?\s*[KMGT]i?B\b", re.I)
_SHAPE4_RE = re.compile(r"\[\d+,\s*\d+,\s*\d+,\s*\d+\]")
# Communication queued on side streams ("overlapping NCCL communications ... on separate
# streams", record_stream): the allocator holds such blocks until those streams' events complete
_COMM_WORDS = (
    "nccl",
    "communicat",
    "comms",
    "all_reduce",
    "allreduce",
    "all-reduce",
    "allgather",
    "all_gather",
    "all-gather",
    "reduce_scatter",
    "record_stream",
)
# memory PyTorch still counts after everything was freed ("after we deleted the model and
# garbage collection, still torch.cuda.memory_allocated() returns non-zero")
_FREED_RE = re.compile(
    r"\bdel(?:eted?|eting|ete)?\b|garbage[ -]collect|gc\.collect|empty_cache", re.I
)
_STILL_RE = re.compile(r"non-?zero|not (?:zero|0)\b|still|remains?|stays?|leaks?|leaking", re.I)
_COUNTER_RE = re.compile(r"memory_allocated|memory_reserved|allocated memory", re.I)
# the output layer's log-softmax / cross-entropy named as where the memory runs out
_LOSS_OOM_RE = re.compile(
    r"(?:log_?softmax|log-softmax|cross_?entropy|cross-entropy)\W.*(?:out of memory|\boom\b)"
    r"|(?:out of memory|\boom\b).*(?:log_?softmax|log-softmax|cross_?entropy|cross-entropy)",
    re.I,
)
# allocator fragmentation said in words, not PyTorch's own tip in the OOM message
_FRAG_RE = re.compile(r"fragment(?:ation|ed)\b", re.I)
_FRAG_TIP_RE = re.compile(r"to avoid fragmentation|if reserved", re.I)
_FRAG_NOT_RE = re.compile(r"\bnot (?:a |due to |caused by )?(?:memory )?fragment", re.I)
# memory the CUDA context / driver takes that PyTorch's counters leave out
_CONTEXT_RE = re.compile(
    r"cuda (?:context|driver|runtime|overhead)|(?:cuda|driver) (?:memory )?overhead"
    r"|overall cuda allocation",
    re.I,
)
_UNCOUNTED_RE = re.compile(
    r"not counted|isn't counted|doesn't count|does not count|not (?:shown|included) in"
    r"|overhead|nvidia-smi|used gpu memory|memory cache in pytorch",
    re.I,
)


# A memory figure per step: "step 3: allocated 12.4 GB", "Epoch 2 ... memory used: 10.1GiB"
_STEP_RE = re.compile(r"\b(?:step|iter(?:ation)?|epoch|batch|cycle|round)\s*[:#=]?\s*(\d+)", re.I)
_MEM_WORD_RE = re.compile(r"alloc|reserved|memory|\bmem\b|cached|usage|\bused\b", re.I)
# Megatron-style report lines with no step on them: "memory (MB) | allocated: 20.4 | ..."
_REPORT_RE = re.compile(r"memory \((MB|GB|MiB|GiB)\)\s*\|\s*allocated:\s*(\d+(?:\.\d+)?)", re.I)
_SERIES_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(GiB|GB|MiB|MB)\b", re.I)
# torchtitan's step line, "memory: 47.65GiB(50.16%)": the step's max reserved memory and its
# share of the device (components/metrics.py: max_reserved_gib, max_reserved_pct)
_TITAN_MEMORY_RE = re.compile(r"\bmemory:\s*(\d+(?:\.\d+)?)\s*GiB\s*\((\d+(?:\.\d+)?)%\)")


# A vision workload (detection, segmentation, image models): the config keys that set images
# per batch and image size in detectron2 / mmdetection / YOLO-style trainers, with the value
# ("SOLVER.IMS_PER_BATCH: 16", "cfg.INPUT.MIN_SIZE_TRAIN = (800,)", "samples_per_gpu=2"),
# tolerant of a key wrapped with spaces ("IMS_ PER_ Batch: 32")
_VISION_KEY_RE = re.compile(
    r"((?:SOLVER\.)?IMS_\s?PER_\s?BATCH|(?:INPUT\.)?M(?:IN|AX)_SIZE_TRAIN|samples_per_gpu"
    r"|imgs_per_gpu|img_scale|imgsz|img_size|image_size)['\"]?\s*[:=]\s*[(\[]?\s*(\d+)",
    re.I,
)
# the task or model family in words: detectors, segmenters, their frameworks and outputs
_VISION_WORD_RE = re.compile(
    r"\b(?:detectron2|mmdet\w*|mmseg\w*|yolo\w*|(?:faster|mask|cascade)[\s_-]?r-?cnn|retinanet"
    r"|rf-?detr\w*|object detection|detector|(?:instance|semantic|panoptic)[\s_-]segmentation"
    r"|segmentation|bbox(?:es)?|bounding box(?:es)?|mask iou|train_net\.py)\b",
    re.I,
)


# Activation checkpointing said to be off or declined in words: "I don't want to use Gradient
# Checkpoint", "without gradient checkpointing", "gradient checkpointing is disabled / off"
_CKPT_OFF_RE = re.compile(
    r"(?:\b(?:don'?t|do not|doesn'?t|not|never|without|w/o|no)\b[^.;:!?\n]{0,30}"
    r"\b(?:gradient|activation)[\s_-]?checkpoint"
    r"|\b(?:gradient|activation)[\s_-]?checkpoint\w*\s*(?:is\s+|was\s+)?"
    r"(?:off|disabled|false)\b)",
    re.I,
)


# Host (CPU) RAM exhausted, not a GPU's memory: the kernel's OOM killer ("Killed", "Out of
# memory: Killed process 123", "oom-kill"), errno 12 ("Cannot allocate memory"), a DataLoader
# worker or a Ray task killed for memory, a process killed by SIGKILL (-9) under torchrun
_HOST_KILL_RE = re.compile(
    r"^\W*(?:\S+:\s*)?Killed(?:\s+\S*python\S*.*)?\s*$|oom[-_ ]?kill(?:er|ed)?\b"
    r"|Out of memory: Kill(?:ed)? process|Cannot allocate memory|\bENOMEM\b"
    r"|DataLoader worker \(pid[^)]*\) is killed by signal"
    r"|running low on memory|memory monitor|ray\S* OutOfMemoryError"
    r"|exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)|\bSIGKILL\b",
    re.I,
)
# The machine's memory named in words ("96g memory and got OOM", "host RAM", "CPU memory",
# "系统内存"; 内存 is RAM where 显存 is a GPU's memory), never VRAM or GPU memory
_HOST_WORD_RE = re.compile(
    r"\b(?:host|cpu|system|node)[\s_-]?(?:memory|ram|mem)\b|(?<![vV])\bRAM\b|内存|\bswap\b"
    r"|\bRSS\b|\d+\s*[GT]i?B?\s+(?:of\s+)?(?:host\s+|cpu\s+|system\s+)?(?:memory|ram)\b"
    r"(?!\s*(?:per\s+)?(?:gpu|card|each))",
    re.I,
)
# (a card named: "每张卡只占用了13G内存" is each GPU's 13G, not the host's; 卡住 / 卡死 is "stuck")
_GPU_MEMORY_WORD_RE = re.compile(
    r"gpu|cuda|vram|显存|显卡|device memory|hbm|\bcards?\b"
    r"|[每单双两\d一二三四五六七八]\s*[张块]?\s*卡(?![住死顿])|卡(?:上|里)",
    re.I,
)
# a Ray / multiprocessing worker's row in a process table: "40126  11.20  ray::WorkerDict..."
_PROC_ROW_RE = re.compile(r"^\s*\d{2,7}\s+(\d+(?:\.\d+)?)\s+(?:ray::|python|\S*worker)", re.I)

# Memory said to run out in words an OOM regex misses: "exhausted memory at iteration 7"
_EXHAUSTED_RE = re.compile(
    r"\bexhaust(?:s|ed|ing)?\s+(?:\w+\s+){0,2}memory\b|\bmemory\s+(?:was\s+|is\s+|got\s+)?exhausted",
    re.I,
)
# Selective recompute said to run out of memory: "a selective-recompute run exhausted memory",
# "with recompute_granularity=selective we still OOM"
_SELECTIVE_RE = re.compile(
    r"selective[\s_/-]+(?:[\w/]+[\s_-]+){0,3}?recomput\w*|recompute[\s_-]granularity\W{0,3}selective",
    re.I,
)
# The whole model put on a device before anything shards it: `self.module.to(self.device)`,
# `model.cuda()`, or said in words ("requires the model to totally reside inside the GPU",
# "loads the entire model on each GPU")
_WHOLE_MOVE_RE = re.compile(
    r"\b(?:self\.)?(?:module|model)\.(?:to\(\s*(?:self\.)?(?:device|local_rank|rank|"
    r"torch\.cuda\.current_device\(\)|['\"]cuda)|cuda\(\))"
    r"|\b(?:entire|whole|full|complete)\s+model\b[^.\n]{0,40}\b(?:on|in|inside|onto|into)\s+"
    r"(?:the\s+|each\s+|every\s+|one\s+)?(?:gpu|device|card)"
    r"|\bmodel\s+to\s+(?:totally|fully|entirely|wholly)\s+(?:reside|fit|live|sit)",
    re.I,
)
# Sharding of model states named: ZeRO-3 / stage 3, FSDP, parameter offload
_SHARDING_RE = re.compile(
    r"zero[\s_-]*(?:\(?\s*)?(?:stage)?[\s_-]*3|stage[\s_-]*3|\bfsdp|fully_shard|"
    r"\boffload",
    re.I,
)
_OOM_WORD_RE = re.compile(r"(?<![A-Za-z])OOM|out of memory|ran out|does(?:n't| not) fit", re.I)
# a loss / output layer buffer of vocabulary size: "the native FP32 vocabulary-sized buffer"
_VOCAB_LOSS_RE = re.compile(
    # (prose: "vocab-sized logits"; never an option's name: --extra-vocab-size, padded-vocab-size)
    r"(?<![\w-])vocab\w*[\s-]+(?:sized?|dim\w*)"
    r"|(?:cross[\s_-]?entropy|lm[\s_]head|language head)\W.*vocab",
    re.I,
)


def scan_signals(lines: list[str]) -> dict[str, Any]:
    """Facts, each present only when found: `frame_code` (["file:line in func", "source
    line"] pairs, innermost last), `square_dims` ([(N, line)]: an [N, N] tensor named with a
    mask / score / attention word), `score_matmul` (lines computing q @ k^T), `logits_lines`
    (lines naming logits with a vocabulary-sized number or the word vocab), `gpu_prose`
    ({"bytes", "count", "line"}), `gpu_unsized` (a GPU named whose size is not assumed: B300,
    MI300X), `model_prose` ({"params", "name"}), `side_stream_lines`
    (communication on side streams), `residual_lines` (a memory counter still non-zero after
    del / gc; `residual_bytes`: the largest size on those lines), `cublas_workspace_lines`,
    `shape_lines` (lines printing 4-d shapes), `device_bytes` (the device's memory, from
    torchtitan's "memory: X GiB(Y%)"), `memory_series` ([(step, bytes, "allocated" |
    "reserved", line)]: a memory figure on a line that numbers its step),
    `fragmentation_prose` (allocator fragmentation named in words, PyTorch's tip excluded),
    `context_prose` (memory of the CUDA context / driver said to be outside PyTorch's
    counters), `alloc_prose_bytes` / `alloc_prose_line` (the largest allocation stated in
    words, "will try to allocate 720gb"), `gpu_taken_prose` (lines saying the GPU is already
    occupied / used by another process), `leftover_prose` (lines saying processes of earlier
    runs are still alive: instances of the script, killed processes, zombies),
    `frozen_ckpt_prose` (lines saying frozen inputs under checkpointing lose their gradients),
    `megatron_paths` (lines naming Megatron's source paths or entry points),
    `training_prose` (lines naming training or fine-tuning), `load_fit_prose` (lines saying
    the model does not fit when loaded),
    `not_full_training` (lines naming inference / serving, adapters, quantization, ZeRO /
    FSDP / offload or a non-Adam optimizer), `vision_keys` ({key: first value} of images per
    batch / image size keys of detection and segmentation trainers), `vision_lines` (lines
    naming such a key or a detection / segmentation task, framework or model family),
    `ckpt_off_prose` (lines saying activation checkpointing is off or not wanted),
    `trainer_deepspeed_none` (the TrainingArguments printout's `deepspeed=None` line),
    `allocator_flushes` ([(count or None, line)]: DeepSpeed's "N pytorch allocator cache
    flushes since last step" warnings),
    `host_kill_lines` (the OS killed a process for host RAM), `host_memory_lines` (host RAM
    named in words), `host_rows` (per-process host memory sizes of a process table, GB),
    `whole_move_lines` (the whole model moved to a device, in code or words),
    `sharding_prose` (ZeRO-3 / FSDP / offload named), `exhausted_prose` (memory said to be
    exhausted in words), `selective_oom_prose` (such a
    line naming selective recompute)."""
    facts: dict[str, Any] = {}
    frames: list[list[str]] = []
    for i, line in enumerate(lines):
        low = line.lower()
        if 'File "' in line and (m := _FRAME_RE.search(line)):
            code = ""
            if i + 1 < len(lines) and not _FRAME_RE.search(lines[i + 1]):
                code = lines[i + 1].strip()[:200]
            where = f"{m.group(1)}:{m.group(2)}" + (f" in {m.group(3)}" if m.group(3) else "")
            if len(frames) < 200:
                frames.append([where, code])
        if any(w in low for w in _SQUARE_WORDS):
            for m in _SQUARE_RE.finditer(line):
                if m.group(1) == m.group(2) and int(m.group(1)) >= 4096:
                    facts.setdefault("square_dims", []).append((int(m.group(1)), _q(line)))
            for m in _SQUARED_RE.finditer(line):
                if int(m.group(1)) >= 4096:
                    facts.setdefault("square_dims", []).append((int(m.group(1)), _q(line)))
        if ("@" in line or any(w in low for w in ("matmul", "bmm", "einsum", "softmax"))) and (
            _SCORE_MATMUL_RE.search(line)
        ):
            facts.setdefault("score_matmul", []).append(_q(line))
        if len(facts.get("shape_lines", [])) < 8 and _SHAPE4_RE.search(line):
            facts.setdefault("shape_lines", []).append(_q(line))
        if (report := _REPORT_RE.search(line)) and not _STEP_RE.search(line):
            value = parse_size(f"{report.group(2)} {report.group(1)}")
            if value and len(facts.get("memory_series", [])) < 200:
                order = len(facts.get("memory_series", []))  # printed once per step, in order
                facts.setdefault("memory_series", []).append((order, value, "allocated", _q(line)))
        elif (step := _STEP_RE.search(line)) and _MEM_WORD_RE.search(line):
            size = _SERIES_SIZE_RE.search(line, step.end()) or _SERIES_SIZE_RE.search(line)
            titan = _TITAN_MEMORY_RE.search(line)
            if size is not None and len(facts.get("memory_series", [])) < 200:
                kind = "reserved" if re.search(r"reserved|cached", line, re.I) else "allocated"
                if re.search(r"alloc", line, re.I):
                    kind = "allocated"
                if titan:
                    kind, size = "reserved", titan
                    share = float(titan.group(2))
                    if share > 1:  # the device's memory, as torchtitan measured it
                        device = float(titan.group(1)) * GIB * 100 / share
                        facts["device_bytes"] = int(device)
                value = parse_size(size.group(0)) if not titan else int(float(titan.group(1)) * GIB)
                if value:
                    facts.setdefault("memory_series", []).append(
                        (int(step.group(1)), value, kind, _q(line))
                    )
        if "stream" in low and any(w in low for w in _COMM_WORDS):
            facts.setdefault("side_stream_lines", []).append(_q(line))
        if _COUNTER_RE.search(line) and _FREED_RE.search(line) and _STILL_RE.search(line):
            facts.setdefault("residual_lines", []).append(_q(line))
            sizes = [parse_size(m.group(0)) or 0 for m in _SIZE_RE.finditer(line)]
            facts["residual_bytes"] = max([facts.get("residual_bytes", 0), *sizes])
        if "cublas" in low and "workspace" in low:
            facts.setdefault("cublas_workspace_lines", []).append(_q(line))
        if _TRAINER_NO_DEEPSPEED_RE.search(line):
            facts.setdefault("trainer_deepspeed_none", _q(line))
        if (flush := _ALLOC_FLUSH_RE.search(line)) and "#" not in line[: flush.start()]:
            facts.setdefault("allocator_flushes", []).append(
                (int(flush.group(1)) if flush.group(1) else None, _q(line))
            )
        if (
            ("logit" in low and (_vocab_dim(line) or "vocab" in low))
            or _LOSS_OOM_RE.search(line)
            or ("vocab" in low and _VOCAB_LOSS_RE.search(line))
        ):
            facts.setdefault("logits_lines", []).append(_q(line))
        if (
            _FRAG_RE.search(line)
            and not _FRAG_TIP_RE.search(line)
            and not _FRAG_NOT_RE.search(line)
        ):
            facts.setdefault("fragmentation_prose", []).append(_q(line))
        if _CONTEXT_RE.search(line) and _UNCOUNTED_RE.search(line):
            facts.setdefault("context_prose", []).append(_q(line))
        if "gpu_prose" not in facts and (gpu := _gpu(line)) is not None:
            facts["gpu_prose"] = gpu
        if "gpu_unsized" not in facts and (m := _UNSIZED_GPU_RE.search(line)):
            facts["gpu_unsized"] = m.group(0)
        if "model_prose" not in facts and (m := _MODEL_RE.search(line)):
            experts, size = m.group(1), m.group(2)
            bare = m.group(3) or m.group(4) or m.group(5)
            params = float(size or bare) * 1e9 * (int(experts) if experts else 1)
            if 0.1e9 <= params <= 2000e9:
                facts["model_prose"] = {"params": params, "name": m.group(0).strip()}
        if "allocat" in low and (m := _ALLOC_PROSE_RE.search(line)):
            size = parse_size(f"{m.group(1)} {m.group(2)}")
            if size and size > facts.get("alloc_prose_bytes", 0):
                facts["alloc_prose_bytes"], facts["alloc_prose_line"] = size, _q(line)
        kept = _NEGATED_RE.sub(" ", line)
        if _NOT_FULL_TRAINING_RE.search(kept) and len(facts.get("not_full_training", [])) < 8:
            facts.setdefault("not_full_training", []).append(_q(line))
        if _LOAD_FIT_RE.search(line):
            facts.setdefault("load_fit_prose", []).append(_q(line))
        if _TRAINING_RE.search(line) and len(facts.get("training_prose", [])) < 4:
            facts.setdefault("training_prose", []).append(_q(line))
        if _GPU_TAKEN_RE.search(line):
            facts.setdefault("gpu_taken_prose", []).append(_q(line))
        if _MEGATRON_PATH_RE.search(line):
            facts.setdefault("megatron_paths", []).append(_q(line))
        if _FROZEN_RE.search(line) and _CKPT_WORD_RE.search(line) and _NO_GRAD_WORDS_RE.search(
            line
        ):
            facts.setdefault("frozen_ckpt_prose", []).append(_q(line))
        if (m := _LEFTOVER_RE.search(line)) and "?" not in line[m.start() :]:
            facts.setdefault("leftover_prose", []).append(_q(line))
        if _CKPT_OFF_RE.search(line):
            facts.setdefault("ckpt_off_prose", []).append(_q(line))
        if _WHOLE_MOVE_RE.search(line) and len(facts.get("whole_move_lines", [])) < 4:
            facts.setdefault("whole_move_lines", []).append(_q(line))
        if _SHARDING_RE.search(line) and len(facts.get("sharding_prose", [])) < 4:
            facts.setdefault("sharding_prose", []).append(_q(line))
        if _EXHAUSTED_RE.search(line):
            facts.setdefault("exhausted_prose", []).append(_q(line))
        if _SELECTIVE_RE.search(line) and (_EXHAUSTED_RE.search(line) or _OOM_WORD_RE.search(line)):
            facts.setdefault("selective_oom_prose", []).append(_q(line))
        if _HOST_KILL_RE.search(line) and len(facts.get("host_kill_lines", [])) < 4:
            facts.setdefault("host_kill_lines", []).append(_q(line))
        if (
            _HOST_WORD_RE.search(bare := _GPU_RE.sub(" ", line))  # "A100 80GB memory": a GPU's
            and not _GPU_MEMORY_WORD_RE.search(_HOST_WORD_RE.sub(" ", bare))
            and len(facts.get("host_memory_lines", [])) < 4
        ):
            facts.setdefault("host_memory_lines", []).append(_q(line))
        if (row := _PROC_ROW_RE.search(line)) and len(facts.get("host_rows", [])) < 64:
            facts.setdefault("host_rows", []).append(float(row.group(1)))
        for m in _VISION_KEY_RE.finditer(line):
            key = re.sub(r"\s+", "", m.group(1))
            facts.setdefault("vision_keys", {}).setdefault(key, int(m.group(2)))
        if len(facts.get("vision_lines", [])) < 4 and (
            _VISION_KEY_RE.search(line) or _VISION_WORD_RE.search(line)
        ):
            facts.setdefault("vision_lines", []).append(_q(line))
    if frames:
        facts["frame_code"] = frames
    if misorder := _ckpt_arg_misorder("\n".join(lines)):
        facts["ckpt_arg_misorder"] = misorder
    return facts


_FORWARD_DEF_RE = re.compile(r"\bdef\s+forward\s*\(\s*self\s*,([^)]*)\)", re.S)
_CKPT_CALL_RE = re.compile(
    r"\b(?:[\w.]*checkpoint(?:_fn|_function)?|CheckpointFunction\.apply)\s*\("
)
_IDENT_RE = re.compile(r"^(?:self\.)?([A-Za-z_]\w*)$")


def _call_args(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose "(" ends at `start` (nested parentheses kept)."""
    depth, cur, out = 1, "", []
    for ch in text[start : start + 4000]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                break
        if ch == "," and depth == 1:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _ckpt_arg_misorder(text: str) -> dict[str, Any] | None:
    """A checkpoint call that passes the forward's own parameters positionally, one of them
    in another parameter's slot (`def forward(self, x, mask, inference_params=None,
    rotary_pos_emb=None)` recomputed as `checkpoint(fn, flag, x, mask, rotary_pos_emb)`):
    {"passed", "slot", "line"}."""
    if "checkpoint" not in text or "def forward" not in text:
        return None
    for d in _FORWARD_DEF_RE.finditer(text):
        params = [
            re.split(r"[:=]", p, maxsplit=1)[0].strip().lstrip("*") for p in d.group(1).split(",")
        ]
        params = [p for p in params if p]
        if len(params) < 3:
            continue
        for c in _CKPT_CALL_RE.finditer(text):
            args = _call_args(text, c.end())
            names = [m.group(1) if (m := _IDENT_RE.match(a)) else "" for a in args]
            first = next((i for i, n in enumerate(names) if n == params[0]), None)
            if first is None:
                continue
            for j, name in enumerate(names[first:]):
                if j >= len(params) or "=" in args[first + j]:
                    break
                if name in params and name != params[j]:
                    line = " ".join(text[c.start() : c.start() + 300].split())
                    return {"passed": name, "slot": params[j], "line": line[:200]}
    return None


def _q(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= 200 else line[:197] + "..."


def _vocab_dim(line: str) -> int | None:
    for m in _VOCAB_DIM_RE.finditer(line):
        n = int(m.group(1) + m.group(2))
        if 30_000 <= n <= 300_000:
            return n
    return None


def _gpu(line: str) -> dict[str, Any] | None:
    m = _GPU_RE.search(line)
    if m is not None:
        size = float(m.group(2))
        count = m.group(1) or m.group(3)
        if 8 <= size <= 300:
            return {
                "bytes": int(size * GIB),
                "count": int(count) if count else None,
                "line": _q(line),
                "named": True,  # the size next to a card's name, not a bare "48GB显存"
            }
    m = _GPU_SIZE_RE.search(line)
    if m is not None and 8 <= int(m.group(1)) <= 300:
        return {"bytes": int(m.group(1)) * GIB, "count": None, "line": _q(line)}
    return None
