"""What the user says is wrong ranks the findings: a small table, symptom -> the categories that
explain it.

A paste often states its symptom in prose ("recompute has no effect", "it got slower since the
upgrade", "validation error", "the grads are None"). The rules read the artefacts; this table
reads the sentence, and the engine puts the findings whose category explains the stated symptom
ahead of the others (their order among themselves, by confidence, is kept). A finding outside
the symptom's categories still shows, after them: the artefacts may say something else too.

Where no finding explains a stated symptom, the engine asks the rules that read it
(rules/stated.py): the symptom's likeliest cause, as a possible one, and what would decide it.

Only plain phrases are matched (English and Chinese), case-insensitive; nothing here fires a
finding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import Finding


@dataclass(frozen=True)
class Symptom:
    id: str
    pattern: re.Pattern[str]
    categories: tuple[str, ...]  # the categories that explain it, the likeliest first
    # where the line alone is not enough: what the paste must also say somewhere (each one)
    context: tuple[re.Pattern[str], ...] = ()
    in_messages: bool = False  # a tool's own error line states it too (a validation error)


_CKPT = (
    r"(?:recompute|recomputation|re-computation|activation[ -_]?checkpointing|gradient[ -_]?"
    r"checkpointing|gradient_checkpointing|activation[ -_]?recompute|checkpointing|"
    r"(?:gradient|activation)[ -_]checkpoint\b|"
    r"\bckpt\b|梯度检查点|重计算|激活重计算|梯度检查)"
)
CHECKPOINTING_WORDS = _CKPT  # what the stated readings ask of a sentence too
_NEG = r"(?:has|had|have|makes?|made|with|shows?|showed)\s+(?:no|zero|little)"
# a memory figure that did not move: "memory does not decrease", "same memory", 显存没有减少
_MEM_SAME = (
    r"(?:memory|vram|显存|内存)[^.\n]{0,30}?(?:does(?:n'?t| not)|did(?:n'?t| not)|not|never|"
    r"no|barely|hardly)\s+(?:\w+\s+){0,2}(?:decrease|drop|reduce|change|go(?:es)? down|"
    r"lower|move|improve)|(?:memory|vram|peak)[^.\n]{0,20}?\b(?:is|was|are|were|stays?|"
    r"stayed|remains?|remained)\s+(?:still\s+|exactly\s+)?(?:the\s+)?same|"
    r"显存[^。\n]{0,12}?(?:没有|没|并未|未|不)(?:减少|降低|下降|变化|变)|"
    r"(?:没有|没|不)(?:起作用|效果|用)|无效"
)
_OOM_OR_SLOW = re.compile(r"out of memory|\bOOM\b|OutOfMemory|显存|slower|变慢", re.I)
SYMPTOMS: tuple[Symptom, ...] = (
    Symptom(
        "recompute_no_effect",
        re.compile(
            _CKPT
            + r"[^.\n。]{0,60}?(?:"
            + _NEG
            + r"\s+(?:effect|difference|impact)|(?:does(?:n'?t| not)|can(?:not|'t))\s+"
            r"(?:\w+\s+){0,2}(?:work|reduce|help|change|save|lower|take effect)|is\s+ignored|"
            r"(?:has|had)\s+no\s+effect|not\s+(?:taking|take)\s+effect|"
            r"does\s+nothing|no\s+memory\s+sav|never\s+(?:\w+\s+){0,2}(?:enabled|applied|called|"
            r"passed|used|reach\w*)|(?:silently\s+)?inert\b|"
            + _MEM_SAME
            + r")|(?:memory|vram|peak)[^.\n]{0,20}?\b(?:is|was|stays?|remains?)\s+(?:still\s+)?"
            r"(?:the\s+)?same\b[^.\n]{0,40}?"
            + _CKPT
            # "silently disabled activation checkpointing even if enabled in the config"
            + r"|\bsilently\s+(?:disabled?|disabling|skip(?:ped|s)?|ignor(?:ed|es)|dropp(?:ed|s)|"
            r"turn(?:ed|s)\s+off)\s+(?:the\s+)?(?:\w+\s+)?"
            + _CKPT
            + r"|"
            + _CKPT
            + r"\s+(?:is\s+|was\s+|gets?\s+|got\s+)?silently\s+(?:disabled|"
            r"skipped|ignored|dropped|turned\s+off)",
            re.I,
        ),
        ("recompute_no_effect", "invalid_config", "framework_bug"),
    ),
    Symptom(  # "no improvement" / "the same as before" in a paste about checkpointing
        "recompute_no_effect",
        re.compile(
            r"\b(?:not|n't|no|never|without)\s+(?:\w+\s+){0,3}?(?:improvement|difference|"
            r"saving|reduction|change)s?\b|\bsame\s+(?:\w+\s+){0,3}?as\s+(?:before|without)\b",
            re.I,
        ),
        ("recompute_no_effect", "invalid_config", "framework_bug"),
        context=(re.compile(_CKPT, re.I),),
    ),
    Symptom(
        "slower",
        re.compile(
            # "training seems to have become slower": a change over time, said on its own
            r"\b(?:become|became|becomes|got|gotten|getting|grown)\s+(?:\w+\s+)?slower\b|"
            r"\b(?:slower|slow(?:ed|s)?\s+down|slowdown|takes?\s+(?:much\s+)?longer|"
            r"regress(?:ed|ion)\s+in\s+(?:speed|throughput)|(?:throughput|tokens?/s|"
            r"samples?/s|it/s|tflops|mfu)\s+(?:\w+\s+){0,2}(?:dropped|drops|decreased|fell|"
            r"went down|is lower|lower))\b[^.\n]{0,60}?\b(?:since|after|when|with|once|by)\b|"
            + _CKPT
            + r"[^.\n。]{0,40}?(?:\bslow|overhead)|"
            # the change first, the drop after: "after enabling recompute the TFLOPs dropped"
            + _CKPT
            + r"[^.\n。]{0,60}?(?:\b(?:throughput|tflops|mfu|tokens?/s|samples?/s|it/s)\b"
            r"[^.\n]{0,30}?\b(?:dropped|drops|decreased|fell|went\s+down|is\s+lower)\b|"
            r"\b(?:(?:step|iteration)\s+time|time\s+per\s+(?:step|iteration))\b[^.\n]{0,30}?"
            r"\b(?:went\s+up|rose|increased|doubled|is\s+higher)\b)|"
            r"(?:变慢|速度(?:慢|下降|降低)|慢了很多|慢了)",
            re.I,
        ),
        ("recompute_overhead", "framework_bug"),
    ),
    Symptom(
        "validation_error",
        re.compile(r"\b(?:validation\s+error|ValidationError|failed\s+validation)\b", re.I),
        ("invalid_config",),
        in_messages=True,
    ),
    Symptom(
        "grads_none",
        re.compile(
            r"\b(?:grads?|gradients?|\.grad)\s+(?:are|is|were|was|=+|becomes?|became|all|"
            r"are\s+all|were\s+all|remain|stay|will\s+be)\s*(?:all\s+)?['\"`]?None\b"
            r"|\b(?:weights?|parameters?|params|adapters?|lora\w*)\s+(?:\w+\s+){0,2}(?:are\s+|is\s+)?"
            r"(?:not|never)\s+(?:being\s+)?updat|\bprevents?\s+(?:\w+\s+){0,3}updates\b"
            r"|\bgrad(?:ient)?s?\s*=\s*None\b|\bno\s+grad(?:ient)?s?\s+(?:for|flow)|"
            r"\bNone\s+grad(?:ient)?s?\b|梯度(?:为|是)?\s*(?:None|空)",
            re.I,
        ),
        ("checkpoint_api_misuse", "framework_bug"),
    ),
    Symptom(
        "diverges_with_recompute",
        re.compile(
            r"\b(?:loss|grad(?:ient)?s?|outputs?|results?)\b[^.\n]{0,40}?\b(?:nan|inf|diverg\w*|"
            r"differ\w*|mismatch\w*|not (?:the )?same|not deterministic)\b[^.\n]{0,60}?"
            + _CKPT
            + r"|"
            + _CKPT
            + r"[^.\n]{0,60}?\b(?:loss|grad(?:ient)?s?|outputs?)\b[^.\n]{0,40}?\b(?:nan|inf|"
            r"diverg\w*|differ\w*|mismatch\w*)\b",
            re.I,
        ),
        ("nondeterministic_recompute", "framework_bug", "checkpoint_api_misuse"),
    ),
    Symptom(
        "hangs_with_recompute",
        re.compile(
            r"\b(?:hangs?|hanging|hung|stuck|deadlocks?|freez\w*)\b[^.\n]{0,60}?"
            + _CKPT
            + r"|"
            + _CKPT
            + r"[^.\n]{0,60}?\b(?:hangs?|hanging|hung|stuck|deadlocks?|freez\w*)\b",
            re.I,
        ),
        ("framework_bug", "checkpoint_api_misuse"),
    ),
    Symptom(
        "memory_grows",
        re.compile(
            r"\b(?:memory|ram|vram|consumption|usage)\s+(?:\w+\s+){0,3}?(?:(?:keeps?|gradually|"
            r"slowly|steadily|continually|continuously|constantly|seems)\s+(?:and\s+)?)+"
            r"(?:\w+\s+)?(?:grow\w*|increas\w*|climb\w*|creep\w*|ris(?:e|es|ing))|"
            r"\bmemory\s+(?:\w+\s+){0,2}(?:grow\w*|increas\w*|climb\w*|creep\w*)"
            r"\s+(?:\w+\s+){0,2}(?:every|each|per|over|after|with each)\s+(?:\w+\s+)?"
            r"(?:step|iteration|iter|epoch|batch)|\bmemory\s+leak|"
            # the OOM comes only after training ran a while: memory that grows (or a later
            # batch that is larger)
            r"\b(?:oom|out of memory|problem|error|crash\w*)\s+(?:\w+\s+){0,2}?"
            r"(?:occur\w*|happen\w*|appear\w*|comes?|starts?)\s+(?:only\s+)?after\s+"
            r"(?:some|several|a few|many|\d+)\s+(?:epochs?|iterations?|steps?|batches)|"
            r"\bafter\s+(?:some|several|a few|many|\d+)\s+(?:epochs?|iterations?|steps?)"
            r"[^.\n]{0,40}?\b(?:oom|out of memory)\b",
            re.I,
        ),
        ("framework_bug", "fragmentation"),
    ),
    Symptom(
        "oom_loading_or_saving",
        re.compile(
            r"\b(?:oom|out of memory)\b[^.\n]{0,40}?\b(?:when|while|during|at|on)\s+"
            r"(?:\w+\s+){0,2}(?:load\w*|resum\w*|sav\w*|export\w*|convert\w*)\b|"
            r"(?:保存|加载|读取|载入|导出)[^。\n]{0,12}?(?:OOM|显存不足|爆显存|out of memory)",
            re.I,
        ),
        ("model_state_memory", "framework_bug"),
    ),
    Symptom(  # "with gradient_checkpointing it raises an error"
        "error_with_recompute",
        re.compile(
            _CKPT + r"[^.\n]{0,60}?\b(?:raises?|raised|throws?|threw|gives?|gave|got|hits?|fails?|"
            r"failed|crash\w*)\b[^.\n]{0,20}?\b(?:an?\s+)?(?:error|exception|traceback)|"
            # ("an error ... with X": a logger's "ERROR - ... with gradient checkpointing" is not)
            r"\b(?:an?|the|this|same)\s+(?:error|exception)\b[^.\n]{0,40}?\b(?:with|when\s+"
            r"(?:using|enabling|I\s+enable|turning\s+on))\s+(?:the\s+)?" + _CKPT,
            re.I,
        ),
        ("framework_bug", "checkpoint_api_misuse"),
    ),
    Symptom(  # "reducing the batch size didn't help", "even with batch size 1"
        "batch_no_help",
        re.compile(
            r"\b(?:reduc\w*|lower\w*|decreas\w*|smaller|halv\w*|chang\w*)\s+(?:the\s+)?"
            r"(?:\w+\s+)?(?:\w+_)?batch[ _-]?size\b[^.\n]{0,60}?\b(?:didn'?t|did\s+not|doesn'?t|"
            r"does\s+not|won'?t|not|no)\s+(?:\w+\s+)?(?:help|work|fix|solve|change|matter|"
            r"difference)|\beven\s+(?:with|at|using)\s+(?:a\s+)?"
            r"(?:(?:micro[ _-]?)?batch[ _-]?size|bs|batch)\s*(?:of\s*|=\s*)?1\b|"
            r"(?<![A-Za-z])batch[ _-]?size\b[^\n]{0,80}?\b\d+\s*"
            r"(?:->|→|to)\s*\d+\b[^\n]{0,60}?\b(?:still|same)\b",
            re.I,
        ),
        ("model_state_memory", "genuine_pressure"),
        context=(_OOM_OR_SLOW,),
    ),
    Symptom(  # "after the update it runs out of memory", "升级后爆显存"
        "after_update",
        re.compile(
            r"\b(?:after|since)\s+(?:the\s+|an?\s+|my\s+)?(?:\w+\s+){0,2}?(?:update|upgrade|"
            r"upgrading|updating|new\s+version|new\s+release)\b|(?:更新|升级)(?:了)?(?:后|之后|以后)|"
            # "After #1904 got merged, main is running into OOM": a change landed, same config
            r"\b(?:after|since)\s+(?:PR\s*|pull\s+request\s+)?#\d+\s+(?:\w+\s+)?merged\b|"
            r"\b(?:after|since)\s+(?:merging|pulling|rebasing\s+on)\s+(?:the\s+)?(?:latest|"
            r"main|master|#\d+)|"
            # "All FSDP jobs start to have OOM": jobs that ran now fail, the config unchanged
            r"\b(?:all|every|our|the)\s+(?:\w+\s+){0,3}?(?:jobs?|runs?|recipes?|tests?)\s+"
            r"(?:start(?:ed)?|began|begin)\s+to\s+(?:have|hit|get|see|run\s+into|fail)|"
            # a change over time with the run unchanged: "Yesterday ... 1 hour 30 mins. Today
            # ... 3 hours", "possibly from this commit"
            r"\byesterday\b[^\n]{0,300}?\btoday\b|"
            r"\b(?:from|by|since|after|in)\s+(?:this|that|the\s+(?:latest|last|recent)|a\s+"
            r"recent)\s+commit\b|\bcommit\s+[0-9a-f]{7,40}\b",
            re.I,
        ),
        ("framework_bug",),
        context=(_OOM_OR_SLOW,),
    ),
    Symptom(  # "the activation memory increases significantly", "50G of activation memory"
        "activations_grow",
        re.compile(
            r"\bactivation(?:s|\s+values?)?(?:'s)?\s+memory\b[^.\n]{0,40}?\b(?:increas\w*|"
            r"grow\w*|huge|large|big|high|dominat\w*|significant\w*|too\s+much|explod\w*|"
            r"\d+(?:\.\d+)?\s*G(?:i?B)?\b)|\b\d+(?:\.\d+)?\s*G(?:i?B)?\s+of\s+activation|"
            r"激活(?:值)?(?:的)?显存[^。\n]{0,12}?(?:增加|很大|太大|占用)",
            re.I,
        ),
        ("activation_memory",),
    ),
    Symptom(  # "using Megatron-FSDP + EP consumes more GPU memory than using EP alone"
        "sharding_raises_memory",
        re.compile(
            r"\b(?:m-?fsdp\d?|fsdp\d?|zero[- _]?[1-3]?|deepspeed|sharding|sharded|"
            r"distributed[ _]optimizer)\b[^.\n]{0,80}?\b(?:consumes?|uses?|takes?|needs?|"
            r"requires?|occupies|has)\s+(?:much\s+|even\s+|significantly\s+)?(?:more|higher)\s+"
            r"(?:gpu\s+|peak\s+)?(?:memory|vram)|\b(?:more|higher)\s+(?:gpu\s+)?(?:memory|vram)"
            r"[^.\n]{0,40}?\b(?:with|after\s+enabling|when\s+(?:using|enabling))\s+"
            r"(?:m-?fsdp\d?|fsdp\d?|zero[- _]?[1-3]?|the\s+distributed\s+optimizer)\b",
            re.I,
        ),
        ("framework_bug", "model_state_memory"),
    ),
    Symptom(  # "FP8 ... same memory usage as bf16", "still shows memory usage of 14GB"
        "fp8_memory_not_lower",
        re.compile(
            r"(?:memory|vram|footprint)[^.\n]{0,50}?(?:same\s+as|as\s+(?:bf16|fp16|bfloat16)|"
            r"not\s+(?:be\s+)?(?:halved|reduced|lower)|prohibitive|no\s+(?:reduction|saving))|"
            r"\bstill\s+(?:shows?|uses?|takes?|needs?)\s+(?:\w+\s+){0,3}?memory|"
            r"(?:same|similar)\s+(?:memory|vram)[^.\n]{0,30}?(?:bf16|fp16|bfloat16)|"
            r"\b(?:expected|any)\s+(?:memory\s+)?(?:benefits?|savings?|reduction)|"
            # "peak memory, it does not decrease that much", "memory didn't go down"
            r"(?:memory|peak|vram)[^.\n]{0,40}?\b(?:does\s*n[o']?t|did\s*n[o']?t|not|never)\s+"
            r"(?:\w+\s+){0,2}?(?:decreas\w*|drop\w*|go\s+down|reduc\w*|shrink\w*|lower\w*)|"
            # "enabling fp8 ... is worse than not enabling fp8", "fp8 uses more memory"
            r"\b(?:fp8|float8)\b[^.\n]{0,80}?\b(?:worse|more\s+(?:gpu\s+)?memory|"
            r"higher\s+(?:peak\s+)?memory)\b",
            re.I,
        ),
        ("model_state_memory",),
        context=(re.compile(r"\bfp8\b|float8|transformer[ _-]?engine", re.I),),
    ),
    Symptom(  # "LoRA works, full fine-tuning runs out of memory"
        "full_fails_lora_works",
        re.compile(
            r"(?<![A-Za-z])(?:q?lora|peft|adapter)(?![A-Za-z])[^.\n]{0,40}?(?:\bworks?\b|\bfine\b|"
            r"\bok\b|正常|没问题|"
            r"可以|能跑)",
            re.I,
        ),
        ("model_state_memory",),
        context=(re.compile(r"(?<![A-Za-z])full(?![A-Za-z])|全参|全量", re.I), _OOM_OR_SLOW),
    ),
)


# Not the user's report: a code comment (a Markdown heading, "## 1. ...", is prose), a negation
# ("# not a real memory leak"), a tool's own warning or exception line (torch's "None of the
# inputs have requires_grad=True. Gradients will be None", "RuntimeError: Expected to mark a
# variable ready only once ...")
_NOT_SAID = re.compile(
    r"^\s*(?:no change|modified|action needed)\s{2,}\S*/|"  # `conda init` on a login shell
    r"^\s*(?:#(?!#)|//)|\bnot\s+(?:a\s+)?(?:real\s+|true\s+)?memory\s+leak|Warning\b|\bwarn\(|"
    r"None of the inputs have requires_grad|^[>\s]*[\w.]*(?:Error|Exception)\b:",
    re.I,
)


def quotes(text: str) -> dict[str, str]:
    """Per stated symptom (in table order), the first line that states it, trimmed, for a
    finding's evidence; code comments and negations are skipped."""
    out: dict[str, str] = {}
    every = text.splitlines()
    said = [x for x in every if not _NOT_SAID.search(x)]
    for s in SYMPTOMS:
        lines = every if s.in_messages else said
        if s.id in out or not all(any(c.search(x) for x in lines) for c in s.context):
            continue
        line = next((x for x in lines if s.pattern.search(x)), None)
        if line is not None:
            out[s.id] = line.strip()[:200]
    return out


def stated(text: str) -> list[str]:
    """The ids of the symptoms the text states, in table order."""
    return list(quotes(text))


def explaining(symptom_ids: list[str]) -> tuple[str, ...]:
    """The categories that explain the stated symptoms, likeliest first, without repeats."""
    out: list[str] = []
    for s in SYMPTOMS:
        if s.id in symptom_ids:
            out += [c for c in s.categories if c not in out]
    return tuple(out)


def rank(findings: list[Finding], symptom_ids: list[str]) -> list[Finding]:
    """The findings that explain a stated symptom first (by confidence among themselves), then
    the others in the order they came."""
    cats = explaining(symptom_ids)
    if not cats:
        return findings
    first = [f for f in findings if f.category in cats]
    return first + [f for f in findings if f.category not in cats]
