"""Pasted code, prose and small tables: the facts about activation checkpointing they state.

Issue threads paste a few lines of Python (`block.gradient_checkpointing = True`,
`block.eval()`, `checkpoint(b, x)` under `autocast(dtype=torch.bfloat16)`), a JSON fragment of
a DeepSpeed config, an `assert` that forbids two options together, what a script printed
(`Output dtype: torch.float16`, `gradient_checkpointing: 6.4G`), a library's notice that it
falls back to a slower path, or a table of runs with checkpointing on and off. `scan_snippets`
reads these from short texts (a log of a few MiB at most, or a config) into a dict of facts,
each fact with the line that states it (for the findings to quote). Only plain text matching:
nothing is executed or imported.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...sources.fragments import PROSE_WORDS, _from_mapping
from ...sources.values import _canonical_key, _convert_value
from .code_calls import scan_calls
from .measured import scan_measured
from .settings_prose import scan_settings
from .signals import scan_signals
from .text import clean_line, parse_size
from .usage import scan_usage

MAX_SNIPPET_BYTES = 2 << 20  # pasted snippets live in short texts, not in 100 MB logs

# Checkpointing switched on / off, as code, YAML, JSON or a command-line flag writes it.
# "list index out of range", "List out of range", "index 24 is out of range"
_OUT_OF_RANGE_RE = re.compile(r"\b(?:list|index)\b[^.\n]{0,20}?\bout\s+of\s+range", re.I)
_ON_RE = re.compile(
    r"(?:\b(?:gradient_checkpointing|activation_checkpointing|checkpoint_activations|"
    r"grad_checkpointing|use_gradient_checkpointing|enable_gradient_checkpointing|"
    r"gradient_checkpoint)['\"]?\s*[:=]\s*(?:True|true|1)\b"
    r"|\.gradient_checkpointing_enable\s*\("
    r"|\.set_grad_checkpointing\s*\(\s*(?:True|enable\s*=\s*True)?\s*\)"
    r"|--(?:gradient|grad|activation)[-_]checkpointing(?:\s*=\s*(?:True|true|1))?(?=\s|$|\\)"
    r"|--checkpoint[-_]activations(?:\s*=\s*(?:True|true|1))?(?=\s|$|\\))"
)
# ... or said in prose: "fine-tune X with gradient_checkpointing", "checkpointing is enabled"
# ("is never enabled" / "without gradient checkpointing" are not: no word may stand between)
_PROSE_ON_RE = re.compile(
    r"\b(?:with|using|enabled?|enabling|turned\s+on)\s+(?:the\s+)?(?:gradient|activation)"
    r"[ _-]?checkpointing\b|\b(?:gradient|activation)[ _-]?checkpointing\s+(?:is|was)\s+"
    r"(?:enabled|on|turned\s+on)\b",
    re.I,
)
_OFF_RE = re.compile(
    r"\b(?:gradient_checkpointing|activation_checkpointing|checkpoint_activations|"
    r"grad_checkpointing)['\"]?\s*[:=]\s*(?:False|false|0|None|null)\b"
    r"|\.gradient_checkpointing_disable\s*\("
)
_EVAL_RE = re.compile(r"\.eval\(\s*\)|\.train\(\s*(?:False|mode\s*=\s*False)\s*\)")
_TRAIN_RE = re.compile(r"\.train\(\s*(?:True|mode\s*=\s*True)?\s*\)")
_NO_GRAD_RE = re.compile(r"torch\.no_grad\(\)|torch\.inference_mode\(|@torch\.no_grad|no_grad\(\)")
_CALL_RE = re.compile(
    r"(?<![\w])(?:torch\.utils\.checkpoint\.|checkpoint\.|te\.|tensor_parallel\.|deepspeed\."
    r"checkpointing\.)?checkpoint(?:_sequential)?\s*\("
)
_REENTRANT_RE = re.compile(r"use_reentrant['\"]?\s*[:=]\s*(True|False|true|false)")
_RNG_RE = re.compile(r"preserve_rng_state\s*[:=]\s*(True|False|true|false)")
_AUTOCAST_RE = re.compile(r"autocast\s*\(([^)\n]*)")
_DTYPE_RE = re.compile(r"torch\.(bfloat16|float16|half|float32|float)\b")
_PRINTED_DTYPE_RE = re.compile(r"dtype\s*[:=]?\s*torch\.(bfloat16|float16|float32)\b", re.I)
_DROPOUT_RE = re.compile(
    r"\b([\w.]*dropout[\w.]*)['\"]?\s*[:=]\s*['\"]?(0?\.\d+|[01](?:\.\d+)?)\b", re.I
)
_ASSERT_RE = re.compile(r"^\s*#?\s*assert\b(.*)$")
# A check quoted from the source with its message, its condition and message possibly on two
# lines: `assert args.num_layers % pp == 0, \` / `'num_layers must be divisible by ...'`
_QUOTED_CHECK_RE = re.compile(
    r"\bassert\s[^\n]*?,\s*(?:\\\s*\n\s*)?[rf]?(['\"])([^'\"\n]{10,200})\1"
)
# "no_gradient_checkpointing: 6.4G", "with gradient checkpointing = 11.2 GB"
_LABELLED_SIZE_RE = re.compile(
    r"^\s*([A-Za-z_ -]*checkpoint[A-Za-z_ -]*?)\s*[:=]\s*([\d.]+)\s*([KMGT]i?B?)\b", re.I
)
# A library says it falls back to another path (a verb) that costs memory or speed (a cost),
# in its own voice: no first person (a user's "I use X instead of Y, memory usage grows" is
# prose), and the looser verbs ("will use", "instead of") only on a line with a logger prefix
# ("Unsloth: ...", "WARNING ...", "UserWarning: ...").
_FALLBACK_VERBS = ("falling back to", "fall back to", "fallback to", "falls back to")
_PREFIXED_VERBS = ("will use ", "instead of", "using ")
_FALLBACK_COSTS = ("increase in memory", "more memory", "slower", "memory usage")
_FIRST_PERSON_RE = re.compile(r"\b(?:I|I'm|I've|my|we|we're|our|me)\b")
_NOTICE_PREFIX_RE = re.compile(
    r"^\s*(?:\[?[A-Z][\w.-]{1,30}\]?:\s|\[?(?:WARNING|WARN|INFO|NOTICE)\b|\w*Warning:)"
)
_JSON_SECTION_RE = re.compile(r'^\s*"([A-Za-z_][\w]*)"\s*:\s*\{\s*$')
_TABLE_SEP_RE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)+\|?\s*$")
_AC_HEADER_RE = re.compile(
    r"^(?:ac|gc|activation[ _-]?checkpointing|gradient[ _-]?checkpointing|checkpointing|"
    r"grad[ _-]?ckpt|recompute)$",
    re.I,
)
_LOSS_HEADER_RE = re.compile(r"\b(?:loss|ce|ppl|perplexity)\b", re.I)
_OP_RE = re.compile(r"torch\._ops\.(\w+)\.(\w+)")
_DEBUG_FORWARD = "Operations executed during the original forward"
_DEBUG_RECOMPUTE = "Operations executed during recomputation"
_NONDETERMINISM = "Detected non-determinism while running activation checkpointing"
# Megatron-LM's recompute flags on a command line pasted into a log.
_RECOMPUTE_FLAG_RE = re.compile(
    r"--(recompute-granularity|recompute-method|recompute-num-layers|recompute-modules|"
    r"recompute-activations)(?:[ =]+([A-Za-z_0-9]+(?:[ ,]+(?!-)[A-Za-z_]+)*))?"
)
# YAML lines of recompute keys pasted into a log (NeMo 1.x / Megatron-Bridge model configs).
_YAML_RECOMPUTE_RE = re.compile(
    r"^\s*(activations_checkpoint_(?:granularity|method|num_layers)|recompute_(?:granularity|"
    r"method|num_layers|modules))\s*:\s*([^#]*?)\s*(?:#.*)?$"
)
# Prose placing an OOM at the first step ("OOMs at the first training step", "on iteration 1"):
# Adam's moments are made at the first optimizer step, so they did not exist yet
_FIRST_STEP_RE = re.compile(
    r"\b(?:first (?:training |train |optimizer |forward |backward )?(?:step|iteration|batch)"
    r"|(?:step|iteration) (?:0|1)\b)",
    re.I,
)
# A job on several GPUs, as a paste says it: "resume on multiple gpu", "8 GPUs", "[rank3]",
# torchrun / DDP (the launcher or its frames)
_SEVERAL_GPUS_RE = re.compile(
    r"multi[- ]?gpus?\b|multiple gpus?\b|\b(?:[2-9]|[1-9]\d+) ?(?:x ?)?(?:gpus|cards)\b|"
    r"\[rank[1-9]\d*\]|\bworld_size\b|nproc_per_node|torchrun|DistributedDataParallel|"
    r"多卡|多张",
    re.I,
)
# An OOM in any wording a person or a tool writes it: "CUDA OOM", "OOM'd", "out of memory",
# "OutOfMemoryError", "RESOURCE_EXHAUSTED", "显存不足" / "爆显存" (Chinese threads).
_OOM_WORDS_RE = re.compile(
    # "OOM" after a word in any script ("报错oom"), never inside an English word ("zoom")
    r"(?<![A-Za-z0-9_])OOM(?:s|ed|'d)?(?![A-Za-z])|out[ _-]?of[ _-]?memory|OutOfMemory|"
    r"RESOURCE_EXHAUSTED|"
    r"显存不足|爆显存|内存不足|显存溢出",
    re.I,
)
# A person reports that gradients are lost: "all gradients will be 'None'", "grad is None",
# "lora_A and B will not be updated", "layer1's parameters can't be optimized", "layers not
# trained" (PyTorch's own warning, "Gradients will be None", is not a report).
_GRADS_LOST_RE = re.compile(
    r"\bgrad(?:ient)?s?\b[^.;]{0,40}?\b(?:is|are|will be|become|becomes|was|were|stay|stays)"
    r"\s+['\"`]?None\b"
    r"|\b(?:param(?:eter)?s?|weights?|lora\w*|adapters?|layers?)\b[^.;]{0,60}?\b(?:can't|cannot|"
    r"can not|won't|will not|are not|aren't|is not|isn't|not|never)\s+(?:be\s+|being\s+|get\s+)?"
    r"(?:optimi[sz]ed|updated|trained|learn(?:ed|ing)?)\b",
    re.I,
)
# torch.utils.checkpoint's CheckpointError lists "saved metadata: {'shape': torch.Size([..]),
# 'dtype': torch.X ...}" then "recomputed metadata: {...}" per tensor position.
_META_RE = re.compile(
    r"(saved|recomputed) metadata:\s*\{'shape':\s*torch\.Size\(\[([^\]]*)\]\),\s*'dtype':"
    r"\s*torch\.(\w+)|(saved|recomputed) metadata:\s*\{'shape':\s*torch\.Size\(\[([^\]]*)\]\),"
    r"\s*'dty\w*$"  # a paste cut inside the dtype
)
# Prose saying turning checkpointing / recompute on leaves the memory as it was: "does not
# change the memory usage", "these values remain the same as when it is turned off".
_SAME_MEMORY_RE = re.compile(
    r"(?:does(?: ?n[o']t)|did(?: ?n[o']t)|do(?: ?n[o']t))\s+(?:change|reduce|lower|affect|save)\b"
    r"[^.;]{0,30}?\b(?:memory|usage|vram|peak)|\b(?:remains?|stays?|is|are)\s+(?:exactly\s+)?"
    r"(?:the\s+same|unchanged|identical)|\bno (?:effect|difference|change)\b[^.;]{0,30}?"
    r"\b(?:memory|usage|vram|peak)",
    re.I,
)
# Prose saying the recompute does not get the forward's RNG state back (dropout then draws
# other masks): "without restoring the RNG state", "does not preserve the rng state",
# "sees a different random mask".
_RNG_PROSE_RE = re.compile(
    r"\b(?:without|not|never|n't|no)\b[^.;]{0,40}?\b(?:restor|preserv|reset|sav)\w*\b[^.;]{0,30}?"
    r"\b(?:rng|random (?:number )?(?:generator )?state|seed)|different random masks?",
    re.I,
)
# A person reports that checkpointing does not act ("the gradient checkpointing function is
# not being invoked", "checkpointing is skipped") and, in the text, the module's eval / training
# mode ("set to evaluation mode", "checks whether it is in training mode", "self.training").
_CKPT_INACTIVE_RE = re.compile(
    r"checkpoint\w*\b[^.;]{0,60}?\b(?:is not|isn't|was not|wasn't|are not|aren't|not being|"
    r"never|does not|doesn't|did not|didn't|not)\s+(?:being\s+|get\s+|gets\s+|take\s+)?"
    r"(?:invoked|applied|used|called|triggered|run|active|activated|enabled|effect|taking effect|"
    r"working|work|engaged?)\b"
    r"|\b(?:skips?|skipped|bypass(?:es|ed)?)\s+(?:the\s+)?(?:gradient\s+|activation\s+)?checkpoint",
    re.I,
)
# A trainer that runs the evaluation loop itself, under torch.no_grad: PyTorch Lightning's
# progress bars (`v_num=16`, "Validating:", "Validation DataLoader 0") and packages, the
# Hugging Face Trainer's evaluation frames
_MANAGED_EVAL_RE = re.compile(
    r"\bv_num=\d|^\s*Validating:|Validation DataLoader \d|\bpytorch_lightning\b|"
    r"\blightning/pytorch/|transformers/trainer\.py\S*\s+in\s+(?:evaluate|evaluation_loop|"
    r"prediction_step|predict)"
    r"|(?i:\bllama-?factory\b)"  # its evaluation is the Trainer's own loop
)
_EVAL_PROSE_RE = re.compile(
    r"\beval(?:uation)?[ _-]mode\b|\.eval\(\)|\bself\.training\b|\b(?:in|into)\s+training\s+mode\b",
    re.I,
)
# Prose that places the memory problem in validation / evaluation ("out of memory occurs after
# validation", "a sharp jump in GPU memory usage in validation step"), and prose that says the
# memory grows step after step ("the memory grows until OOM", "continuous rising of gpu memory")
_VALIDATION_PROSE_RE = re.compile(
    r"\b(?:in|during|after|at|upon|on|when|while|start of|the) (?:the |each |every )?"
    r"(?:validation|evaluation|eval|val|test)\b(?! or| and|/)"
    r"|(?<![A-Za-z])(?:validation|evaluation|eval|val)[ _](?:steps?|phase|loop|stage|batch|epoch)"
    r"|\bwhen (?:validating|evaluating)|\b(?:validate|evaluate)\(\)"
    r"|(?:验证|评估|评测)(?:时|阶段|之后|后|过程)",  # at / in / after evaluation, in Chinese
    re.I,
)
# Another job on the same GPU, in words: "I run another code on GPU0", "there is already a
# training in GPU 0", "someone else's process occupies the card"
# Prose naming the release that last worked: "it works on deepspeed==0.5.10", "worked fine
# with transformers 4.35", "was ok in peft v0.6.0"
_WORKED_RE = re.compile(
    r"\b(?:works?|worked|working|was fine|ran fine|was ok)\b[^.\n]{0,40}?\b(?:on|in|with|under)\s+"
    r"([A-Za-z][\w.-]*?)\s*(?:==|=|\s)\s*v?(\d+\.\d+(?:\.\w+)?)\b",
    re.I,
)
# Prose saying features work one at a time but fail together: "both work when you use them
# individually", "any two of the following three options", "each works alone"
_COMBINED_RE = re.compile(
    r"\b(?:work|works|working|fine)\b[^.\n]{0,60}\b(?:individually|separately|alone|on (?:its|"
    r"their) own|one at a time)\b|\bany two of\b[^.\n]{0,60}\b(?:options|features|settings)\b",
    re.I,
)
_OTHER_JOB_RE = re.compile(
    r"\b(?:another|other|second|a different|someone else'?s?|already an?|already)\s+"
    r"(?:\w+\s+){0,2}?(?:process(?:es)?|jobs?|programs?|codes?|scripts?|trainings?|"
    r"experiments?|users?|models?|tasks?)\b[^.]{0,40}?\b(?:on|in|using|uses|occup\w*|"
    r"holds?|takes?|running on)\s+(?:the\s+)?(?:same\s+)?(?:GPU|card|device|cuda)",
    re.I,
)
_MEMORY_WORD_RE = re.compile(r"memory|\bVRAM\b|\bOOM\b|显存", re.I)
_GROWTH_RE = re.compile(
    r"(?:memory|\bVRAM\b|显存)\W+(?:\w+\W+){0,6}?(?:grows?|growing|increas(?:e|es|ed|ing)"
    r"|ris(?:es|ing)|climb(?:s|ing)?|accumulat(?:es|ing)|go(?:es)? up|keeps? (?:going up|growing))"
    r"|(?:grow(?:s|ing|th)?|increas(?:e|es|ing)|ris(?:e|es|ing)|accumulation) (?:\w+ ){0,3}(?:of )?"
    r"(?:the )?(?:GPU |CUDA )?(?:memory|VRAM)",
    re.I,
)
# a leak named: "leaks GPU memory per training micro-batch", "a memory leak" (over steps by
# the word itself)
_LEAK_RE = re.compile(r"\bleak(?:s|ed|ing)?\s+(?:\w+\s+){0,2}?memory\b|\bmemory\s+leak", re.I)
_NEGATED_RE = re.compile(r"\b(?:no|not|without|never)\s+(?:\w+\s+)?$", re.I)
# what keeps each step's tensors, said: outputs or losses kept with their autograd graphs
_GRAPH_KEPT_RE = re.compile(
    r"grad_fn|autograd graphs?|without\s+(?:a\s+)?\.?detach"
    r"|retain(?:s|ed|ing)?\s+(?:the\s+)?(?:autograd\s+|computation(?:al)?\s+)?graphs?",
    re.I,
)
# ...that does so over steps, not once: "until OOM", "every iteration", "continuous", "keeps"
_OVER_STEPS_RE = re.compile(
    r"\buntil\b|\bevery\b|\beach\b|\bper (?:step|iter|epoch|batch)|continu|keeps?\b|steadily"
    r"|gradually|unlimit|over time|constantly|after (?:some|several|many|a few|\d+) "
    r"(?:iter|step|epoch|batch)",
    re.I,
)
# Per-GPU usage rows: gpustat's "[3] Tesla V100-SXM2-16GB | 34'C,   0 % |     0 / 16130 MB |"
# and nvidia-smi's device row "|  15836MiB / 16130MiB |"; and an empty process list.
_GPUSTAT_ROW_RE = re.compile(
    r"^\s*\[(\d{1,2})\][^|]{1,80}\|[^|]{0,40}\|\s*(\d+)\s*/\s*(\d+)\s*MB\s*\|"
)
_SMI_DEVICE_ROW_RE = re.compile(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|")
_NO_PROCESSES_RE = re.compile(
    r"no running processes found|\bno (?:\w+ )?process(?:es)? (?:on|are|were|is|running|listed)"
    r"|shows? (?:that )?no process|can'?t see any process|without any process",
    re.I,
)
# Lines that load a model's weights, and prose that places the failure at such a line ("The
# error happens when executing `model = ...`", "OOM when loading the model")
_LOAD_CALL_RE = re.compile(r"from_pretrained\(|load_state_dict\(|torch\.load\(|load_checkpoint\(")
_LOAD_PROSE_RE = re.compile(
    r"(?:happens?|occurs?|raised|thrown|appears?)\b[^.\n]{0,30}\b(?:when|while|on|at)\s+"
    r"(?:executing|running|calling|loading)\b"
    r"|\bwhen (?:I )?(?:try(?:ing)? to )?load(?:ing)? (?:the |a |my )?model"
    # "it throws `out of memory error` while loading the model" (the error named, then when)
    r"|(?:out of memory|\bOOM\b)[^.\n]{0,40}\b(?:when|while|during)\s+(?:I\s+)?"
    r"(?:load(?:ing)?|try(?:ing)? to load)\s+(?:the |a |my |this )?(?:\w+[ -])?model",
    re.I,
)
_NO_OOM_RE = re.compile(r"\bOOMs?\s*[:=]\s*0\b|\bno (?:more )?OOM|without (?:an? )?OOM", re.I)
_ON_WORDS = frozenset({"on", "true", "yes", "enabled", "1", "full"})
_OFF_WORDS = frozenset({"off", "false", "no", "disabled", "0", "none"})


def _quote(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= 160 else line[:157] + "..."


def _is_code(line: str) -> bool:
    """A line of Python (or YAML/JSON) rather than program output."""
    s = line.strip()
    return bool(
        re.match(r"(?:#|import |from |def |class |with |for |if |return |assert |@)", s)
        or re.match(r"[\w.\[\]'\"]+\s*(?:=|\+=)\s*\S", s)
        or re.match(r"[\w.]+\(.*\)\s*$", s)
    )


def _is_notice(line: str, lower: str) -> bool:
    """A library's own notice that it falls back to a costlier path (see _FALLBACK_VERBS)."""
    if not any(w in lower for w in _FALLBACK_COSTS) or _is_code(line):
        return False
    if _FIRST_PERSON_RE.search(line):
        return False
    prefixed = bool(_NOTICE_PREFIX_RE.match(line))
    return any(w in lower for w in _FALLBACK_VERBS) or (
        prefixed and any(w in lower for w in _PREFIXED_VERBS)
    )


def scan_snippets(text: str) -> dict[str, Any]:
    """Facts about checkpointing in pasted code, prose and tables (see the module doc).

    Keys, each present only when found: `checkpointing_on` / `checkpointing_off` / `eval` /
    `train` / `no_grad` / `no_grad_code` (no_grad in a code line) / `checkpoint_call` /
    `asserts` / `notices` (lists of quoted lines),
    `eval_after_train` (bool), `use_reentrant`, `preserve_rng_state` (bools), `autocast_dtypes`,
    `printed_dtypes` (dtype names), `dropout` ({key: value > 0}),
    `labelled_sizes` ([(label, bytes)]), `json_config` (flat keys of JSON sections),
    `rng_not_restored` (prose: the recompute does not get the forward's RNG state back),
    `dropout_named` (the word dropout appears), `same_memory_prose` (prose: memory the same
    with checkpointing / recompute turned on), `ac_loss` ({"on": mean, "off": mean,
    "column": header}), `mentions` (lines naming gradient
    / activation checkpointing), `debug_ops` ({"forward": [...], "recompute": [...]}: the op
    lists of torch.utils.checkpoint's debug mode, "aten.topk"), `recompute_metadata` (its
    "saved metadata: {'shape': ...}" / "recomputed metadata: ..." lines, header cut or not),
    `recompute_flags` (Megatron-LM flags on a pasted command line, flat keys),
    `num_layers_lines` (lines naming recompute_num_layers: the uniform loop's source),
    `out_of_range_lines` (lines reporting an index / list out of range, in prose too),
    `oom_mentions` (lines that say out of memory in any wording: "CUDA OOM",
    "OutOfMemoryError", "显存不足"), `first_step_prose` (those placing it at the first step),
    `several_gpus` (lines saying the job runs on several GPUs: "multi-GPU", "[rank3]", torchrun),
    `grads_lost` (prose lines reporting gradients None or parameters not updated / trained),
    `quoted_checks` (the messages of `assert cond, 'message'` lines quoted from a source),
    `metadata_pairs` ([(saved shape, dtype, recomputed shape, dtype)] of a CheckpointError,
    wherever the paste puts them), `ckpt_inactive` /
    `eval_prose` (prose: checkpointing not invoked / skipped; the module's eval or training
    mode named), `memory_prose` (prose lines naming memory, VRAM or an OOM), `eval_memory_prose`
    (prose placing memory or an OOM in
    validation / evaluation), `memory_growth_prose` (prose saying memory grows over steps,
    or a leak), `graph_kept_prose` (prose saying tensors are kept with their autograd graphs),
    `other_job_prose` (prose saying another process / job runs on the same GPU), `gpu_rows`
    ([(gpu, used, total)] from gpustat / nvidia-smi device rows), `no_processes_listed` (an
    empty process list), `load_lines` (lines calling from_pretrained / load_state_dict /
    torch.load), `load_prose` (prose placing the failure at a line it runs or at the load),
    `worked_release` ((library, version, line): prose naming the release that worked),
    `combined_prose` (prose: features that work one at a time fail together), `kwarg_lines`
    (code lines passing one keyword argument of a call, "segments=len(functions) + 1,"),
    `plain_inputs` (code binding a tensor built without requires_grad, "x = torch.randn(4)"),
    `grad_probe` (code looking at a gradient state, "print(z.requires_grad)"),
    `trainer_resets_gc` ([enable call, trainer argument]: kwargs the trainer overrides),
    `assert_failed` ([assert line, the message it printed]: an AssertionError without head),
    `grad_mismatch` (lines saying two runs' gradients differ: "x.grad match: False") and
    `grad_mismatch_words` (the recompute / random words those lines carry)."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_SNIPPET_BYTES:
        return {}
    facts: dict[str, Any] = {}
    lines = [clean_line(raw) for raw in text.splitlines()]
    saved_meta: tuple[str, str] | None = None
    last_eval = last_train = -1

    def add(key: str, line: str) -> None:
        bucket = facts.setdefault(key, [])
        if len(bucket) < 8:
            bucket.append(_quote(line))

    for i, line in enumerate(lines):
        if not line.strip():
            continue
        lower = line.lower()
        if "checkpoint" in lower:
            if re.search(r"(?:gradient|activation|grad)[ _-]?checkpoint", lower):
                add("mentions", line)
            if _ON_RE.search(line) or _PROSE_ON_RE.search(line):
                add("checkpointing_on", line)
            if _OFF_RE.search(line):
                add("checkpointing_off", line)
            if _CALL_RE.search(line) and _is_code(line) and "File " not in line:
                add("checkpoint_call", line)
        if ".eval(" in line or ".train(" in line:
            if _EVAL_RE.search(line):
                add("eval", line)
                last_eval = i
            elif _TRAIN_RE.search(line):
                add("train", line)
                last_train = i
        if ("no_grad" in line or "inference_mode" in line) and _NO_GRAD_RE.search(line):
            add("no_grad", line)
            if _is_code(line) or re.match(r"\s*\w+(?:\.\w+)*\s*=", line):
                add("no_grad_code", line)  # in code, not a sentence that suggests it
        if (
            "use_reentrant" in line
            and (m := _REENTRANT_RE.search(line))
            and len(set(_REENTRANT_RE.findall(line))) == 1  # not a warning naming both
        ):
            facts["use_reentrant"] = m.group(1).lower() == "true"
        if "preserve_rng_state" in line and (m := _RNG_RE.search(line)):
            facts["preserve_rng_state"] = m.group(1).lower() == "true"
        if "autocast" in line and (m := _AUTOCAST_RE.search(line)):
            dtypes = _DTYPE_RE.findall(m.group(1))
            facts.setdefault("autocast_dtypes", [])
            facts["autocast_dtypes"] += [d for d in dtypes if d not in facts["autocast_dtypes"]]
            add("autocast", line)
        if "dtype" in lower and not _is_code(line):
            for d in _PRINTED_DTYPE_RE.findall(line):
                printed = facts.setdefault("printed_dtypes", [])
                if d not in printed:
                    printed.append(d)
        if (
            ("rng" in lower or "random" in lower or "seed" in lower)
            and not _is_code(line)
            and _RNG_PROSE_RE.search(line)
        ):
            add("rng_not_restored", line)
        if (
            ("checkpoint" in lower or "recompute" in lower)
            and not _is_code(line)
            and _SAME_MEMORY_RE.search(line)
        ):
            add("same_memory_prose", line)
        if "dropout" in lower:
            facts["dropout_named"] = True
            for key, value in _DROPOUT_RE.findall(line):
                number = float(value)
                if 0 < number < 1:
                    facts.setdefault("dropout", {})[key] = number
        if "assert" in line and (m := _ASSERT_RE.match(line)) and "checkpoint" in lower:
            add("asserts", m.group(1).strip())
        if "checkpoint" in lower and (m := _LABELLED_SIZE_RE.match(line)):
            unit = m.group(3) if m.group(3)[-1:] in "bB" else m.group(3) + "B"
            size = parse_size(m.group(2), unit)
            if size:
                facts.setdefault("labelled_sizes", []).append((m.group(1).strip(), size))
        if _is_notice(line, lower):
            add("notices", line)
        if "--recompute-" in line:
            for flag, value in _RECOMPUTE_FLAG_RE.findall(line):
                if value and value.split()[0].lower().rstrip(",.;:") in PROSE_WORDS:
                    continue  # "... use --recompute-granularity and --recompute-method": words
                key = _canonical_key(flag)
                flags = facts.setdefault("recompute_flags", {})
                if key == "recompute_activations":
                    flags.setdefault("recompute_granularity", "selective")
                elif key == "recompute_modules":
                    flags[key] = [v for v in re.split(r"[\s,]+", value) if v]
                elif value:
                    flags[key] = int(value) if value.isdigit() else value
        if "recompute_num_layers" in line and "--" not in line:
            add("num_layers_lines", line)  # a source line of the uniform chunk loop, a key
        if _OUT_OF_RANGE_RE.search(line):
            add("out_of_range_lines", line.strip())  # "list index out of range" in any words
        if (
            ("grad" in lower or "updated" in lower or "optimi" in lower or "train" in lower)
            and "none of the inputs" not in lower
            and not _is_code(line)
            and _GRADS_LOST_RE.search(line)
        ):
            add("grads_lost", line)
        if "checkpoint" in lower and not _is_code(line) and _CKPT_INACTIVE_RE.search(line):
            add("ckpt_inactive", line)
        if ("mode" in lower or "training" in lower or ".eval(" in line) and (
            _EVAL_PROSE_RE.search(line) and not _is_code(line)
        ):
            add("eval_prose", line)
        if "metadata" in line and (m := _META_RE.search(line)):
            kind = m.group(1) or m.group(4)
            # a scalar's shape is torch.Size([]): an empty group, not a missing one
            raw_shape = m.group(2) if m.group(2) is not None else m.group(5)
            shape, dtype = " ".join(raw_shape.split()), m.group(3) or ""
            if kind == "saved":
                saved_meta = (shape, dtype)
            elif saved_meta is not None:
                facts.setdefault("metadata_pairs", []).append((*saved_meta, shape, dtype))
                saved_meta = None
        if _SEVERAL_GPUS_RE.search(line):
            add("several_gpus", line.strip())
        if _OOM_WORDS_RE.search(line) and not _NO_OOM_RE.search(line):
            add("oom_mentions", line)
            if not _is_code(line) and _FIRST_STEP_RE.search(line):
                add("first_step_prose", line.strip())
        if _MANAGED_EVAL_RE.search(line):
            add("managed_eval_loop", line.strip())
        if not _is_code(line) and 'File "' not in line and _MEMORY_WORD_RE.search(line):
            add("memory_prose", line)
            if _VALIDATION_PROSE_RE.search(line):
                add("eval_memory_prose", line)
            leak = _LEAK_RE.search(line)
            if leak and _NEGATED_RE.search(line[: leak.start()]):
                leak = None  # "so there will be no memory leak"
            if (_GROWTH_RE.search(line) and _OVER_STEPS_RE.search(line)) or leak:
                add("memory_growth_prose", line)
            if _GRAPH_KEPT_RE.search(line):
                add("graph_kept_prose", line)
        if not _is_code(line) and (m := _WORKED_RE.search(line)):
            facts.setdefault("worked_release", (m.group(1).lower(), m.group(2), _quote(line)))
        if not _is_code(line) and _COMBINED_RE.search(line):
            add("combined_prose", line)
        if not _is_code(line) and _OTHER_JOB_RE.search(line):
            add("other_job_prose", line)
        row = _GPUSTAT_ROW_RE.match(line) or _SMI_DEVICE_ROW_RE.search(line)
        if row is not None and len(facts.get("gpu_rows", [])) < 16:
            rows = facts.setdefault("gpu_rows", [])
            gpu = int(row.group(1)) if row.re is _GPUSTAT_ROW_RE else len(rows)
            used, total = (int(row.group(row.re.groups - 1)), int(row.group(row.re.groups)))
            if total > 0 and used <= total:
                rows.append((gpu, used * 2**20, total * 2**20))
        if _NO_PROCESSES_RE.search(line):
            add("no_processes_listed", line)
        if "(" in line and _LOAD_CALL_RE.search(line) and 'File "' not in line:
            add("load_lines", line)
        if not _is_code(line) and _LOAD_PROSE_RE.search(line):
            add("load_prose", line)
    facts.update(scan_usage(lines))  # nvidia-smi vs PyTorch sizes (evidence/usage.py)
    facts.update(scan_measured(lines))  # tables and report lines (evidence/measured.py)
    facts.update(scan_signals(lines))  # frames' source lines, [N, N], GPU sizes in prose
    facts.update(scan_settings(lines))  # ZeRO stage, offload, adapters said in prose / flags
    ops = _debug_ops(lines)
    if ops:
        facts["debug_ops"] = ops
    # torch.utils.checkpoint's per-tensor report, also where the CheckpointError line is cut
    metadata = [ln for ln in lines if "metadata: {'shape'" in ln]
    if metadata:
        facts["recompute_metadata"] = metadata[:40]
    if last_eval >= 0:
        facts["eval_after_train"] = last_eval > last_train
    config = _json_sections(lines)
    config.update(_yaml_recompute_keys(lines))
    if config:
        facts["json_config"] = config
    ac = _ac_loss_table(lines)
    if ac:
        facts["ac_loss"] = ac
    facts.update(scan_calls(lines, _is_code, _quote))  # calls, asserts (code_calls.py)
    # (on the lines as read: a rank or logger prefix, quoting, cut away)
    cleaned = "\n".join(clean_line(line) for line in text.splitlines())
    checks = [m.group(2) for m in _QUOTED_CHECK_RE.finditer(cleaned)]
    if checks:
        facts["quoted_checks"] = checks
    return facts


def _json_sections(lines: list[str]) -> dict[str, Any]:
    """Flat keys of `"name": { ... }` JSON fragments pasted without their enclosing object
    (a DeepSpeed config's activation_checkpointing or zero_optimization section)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(lines):
        m = _JSON_SECTION_RE.match(lines[i])
        if m is None:
            i += 1
            continue
        depth, body = 0, []
        j = i
        while j < len(lines) and j - i < 400:
            body.append(lines[j])
            depth += lines[j].count("{") - lines[j].count("}")
            j += 1
            if depth <= 0:
                break
        blob = "{" + "\n".join(body).rstrip().rstrip(",") + "}"
        try:
            data = json.loads(blob)
        except ValueError:
            data = None
        if isinstance(data, dict):
            out.update(_from_mapping(data))
        i = j
    return out


def _yaml_recompute_keys(lines: list[str]) -> dict[str, Any]:
    """Recompute keys from YAML lines pasted into a log, NeMo 1.x's activations_checkpoint_*
    keys winning as NeMo reads them (fragments._from_mapping)."""
    found: dict[str, Any] = {}
    for line in lines:
        if "checkpoint" not in line and "recompute" not in line:
            continue
        m = _YAML_RECOMPUTE_RE.match(line)
        if m is not None and m.group(1) not in found:
            found[m.group(1)] = _convert_value(m.group(2)) if m.group(2) else None
    return _from_mapping(found) if found else {}


def _debug_ops(lines: list[str]) -> dict[str, list[str]] | None:
    """The op lists torch.utils.checkpoint's debug mode prints for the forward and the
    recompute ("aten.topk"), detach calls left out (the checkpoint adds those itself)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if _DEBUG_FORWARD in line:
            current = out.setdefault("forward", [])
            continue
        if _DEBUG_RECOMPUTE in line:
            current = out.setdefault("recompute", [])
            continue
        if current is None:
            continue
        if line.startswith(("+---", "+~~~")) or _NONDETERMINISM in line:
            current = None
            continue
        m = _OP_RE.search(line)
        if m is not None and m.group(2) != "detach" and len(current) < 20_000:
            current.append(f"{m.group(1)}.{m.group(2)}")
    return out if out.get("forward") and "recompute" in out else None


def _cells(line: str) -> list[str]:
    cells = [c.strip().strip("*`").strip() for c in line.strip().strip("|").split("|")]
    return cells


def _number(cell: str) -> float | None:
    m = re.search(r"[-+]?\d+(?:\.\d+)?", cell.replace(",", ""))
    return float(m.group(0)) if m else None


def _ac_loss_table(lines: list[str]) -> dict[str, Any] | None:
    """A Markdown table with a checkpointing on/off column and a loss column: the mean loss
    of the runs with checkpointing on and off."""
    for i in range(len(lines) - 1):
        if "|" not in lines[i] or not _TABLE_SEP_RE.match(lines[i + 1]):
            continue
        header = _cells(lines[i])
        ac = next((k for k, h in enumerate(header) if _AC_HEADER_RE.match(h)), None)
        loss = next((k for k, h in enumerate(header) if _LOSS_HEADER_RE.search(h)), None)
        if ac is None or loss is None:
            continue
        groups: dict[str, list[float]] = {"on": [], "off": []}
        for row in lines[i + 2 :]:
            if not row.strip().startswith("|"):
                break
            cells = _cells(row)
            if max(ac, loss) >= len(cells):
                continue
            state = cells[ac].lower()
            value = _number(cells[loss])
            side = "on" if state in _ON_WORDS else "off" if state in _OFF_WORDS else None
            if side and value is not None:
                groups[side].append(value)
        if groups["on"] and groups["off"]:
            return {
                "on": sum(groups["on"]) / len(groups["on"]),
                "off": sum(groups["off"]) / len(groups["off"]),
                "column": header[loss],
            }
    return None
