"""Chinese descriptions around an English error, given the English words the parsers read.

Users of LLaMA-Factory, ms-swift, verl, Megatron-LM, ChatGLM, Qwen, OpenRLHF and PaddlePaddle
write their issues in Chinese around the pasted English error: "训练的时候显存一直在增长",
"采用recompute_grad 训练速度大约慢20%左右", "显存会一直增加到爆了". The parsers and rules read
English wording ("out of memory", "slower", "recompute", "memory keeps growing", "after
upgrading to"), so such a description loses that evidence. `translate_cjk` adds, under every
line that holds one of the common Chinese technical phrasings, one line with their English
wording; the original text stays as it was (a parser that reads the Chinese still sees it) and
a text without CJK characters comes back unchanged (the same object).

The phrase list was derived from real issue threads (tests/rule_sources.py, round "fresh_cjk"):
memory running out (显存不足 / 爆显存 / 显存溢出 / OOM了 / 显存...爆了), slowdowns (变慢 / 速度慢 /
慢20% / 吞吐下降), recomputation (重计算 / 重算 / 激活值重计算) and gradient checkpointing
(梯度检查点), leaks and growth (显存泄漏 / 显存一直增长 / 持续上涨), loading (加载模型时),
upgrades (升级到 X / 升级后, 之前版本正常), the vocabulary (词表) and GPU counts (8卡 / 单卡 /
两张A100).
"""

from __future__ import annotations

import re
from collections.abc import Callable

_CJK_RE = re.compile(r"[\u3400-\u9fff]")
PREFIX = "(in English) "  # the added line; no "key:" shape, no "[...]" rank-marker shape

_HYPOTHETICAL_RE = re.compile(r"如果|假如|要是|若是?|是否|能否|会不会")
_NUMERALS = {"一": 1, "单": 1, "两": 2, "二": 2, "三": 3, "四": 4, "六": 6, "八": 8, "十六": 16}
_MEM = r"(?:显存|显卡内存|GPU\s*内存|内存)"
_UP = r"(?:增长|增加|上涨|上升|变大|升高|增大|占满|飙升|涨)"

Phrase = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _fixed(english: str) -> Callable[[re.Match[str]], str]:
    return lambda _m: english


def _gpus(m: re.Match[str]) -> str:
    count = m.group("n") or m.group("n2") or ""
    n = int(count) if count.isdigit() else _NUMERALS.get(count, 0)
    if not n:
        return ""
    return "1 GPU" if n == 1 else f"{n} GPUs"


def _upgrade(m: re.Match[str]) -> str:
    release = (m.group("rel") or "").strip()
    return f"after upgrading to {release}" if release else "after upgrading"


_PHRASES: list[Phrase] = [
    # memory running out
    (
        re.compile(
            r"显存(?:不足|不够|溢出|爆了|炸了|OOM)|爆显存|内存溢出|OOM\s*了"
            r"|" + _MEM + r"[^。！？\n]{0,12}?(?:爆了|爆掉|溢出|不够用)",
            re.I,
        ),
        _fixed("out of memory"),
    ),
    # leaks and memory that keeps growing over the steps
    (re.compile(r"(?:显存|内存)泄[漏露]"), _fixed("memory leak")),
    (
        re.compile(
            _MEM
            + r"[^。！？\n]{0,12}?(?:一直|持续|不断|逐渐|逐步|越来越|不停)[^。！？\n]{0,6}?"
            + _UP
            + r"|持续(?:性)?(?:上涨|增长|增加)"
        ),
        _fixed("memory keeps growing"),
    ),
    # slowdowns: "慢20%" keeps its number ("20% slower", which the measured parser reads)
    (
        re.compile(r"慢\s*了?\s*(?P<pct>\d+(?:\.\d+)?)\s*[%％]"),
        lambda m: f"{m.group('pct')}% slower",
    ),
    (
        re.compile(
            r"变慢|速度慢|训练慢|慢了很多|慢很多|(?:吞吐|吞吐量|速度)(?:明显)?(?:下降|降低)"
        ),
        _fixed("slower"),
    ),
    # the cost of recompute said as a trade: "增加了额外的计算量，相当于用时间换空间"
    (re.compile(r"(?:用)?时间换空间|额外的?计算(?:量|开销)"), _fixed("slower (extra compute)")),
    # recomputation and gradient checkpointing
    (re.compile(r"(?:激活值?|activation\s*)?重计算|重算"), _fixed("activation recompute")),
    (re.compile(r"梯度检查点|梯度检查"), _fixed("gradient checkpointing")),
    # loading, upgrades, the release that worked
    (re.compile(r"加载模型(?:时|的时候|过程中)"), _fixed("while loading the model")),
    (
        re.compile(
            r"(?:升级|更新)(?:到|至)(?:了)?\s*(?P<rel>v?\d+(?:\.\d+)+[A-Za-z0-9.+_-]*)?"
            r"|(?:升级|更新)(?:了)?(?:版本)?(?:以)?后"
        ),
        _upgrade,
    ),
    (
        re.compile(
            r"(?:之前|以前|原来)(?:使用|用)的?是?\s*v?(?P<rel>\d+(?:\.\d+)+[A-Za-z0-9.+_-]*)\s*版本?"
        ),
        lambda m: f"it worked fine in {m.group('rel')}",
    ),
    (
        re.compile(
            r"(?:之前|以前|旧|上一?个?)(?:的)?版本[^。！？\n]{0,8}?(?:正常|没问题|没有问题|可以)"
        ),
        _fixed("it worked fine in the previous version"),
    ),
    (re.compile(r"词表"), _fixed("vocabulary")),
    # the run's settings in words: "全参数微调", "序列长度是512", "batch_size为1"
    (re.compile(r"全(?:参数?|量)(?:微调|训练|fine-?tun\w*)"), _fixed("full fine-tuning")),
    (
        re.compile(
            r"(?:序列长度|最大长度|cutoff_len|max_length)\s*(?:是|为|设为|设置为|=|:|：)\s*(?P<n>\d+)"
        ),
        lambda m: f"seq_len={m.group('n')}",
    ),
    (
        re.compile(
            r"(?:batch[_ ]?size|bs|批大小|批次大小)\s*(?:是|为|设为|设置为)\s*(?P<n>\d+)", re.I
        ),
        lambda m: f"batch_size={m.group('n')}",
    ),
    (re.compile(r"报错|出错"), _fixed("error")),
    # another process holding the GPU: "发现有个VeCarRecoServer进程，把所有内存基本全吃了",
    # "显存被其他进程占用"
    (
        re.compile(
            r"(?:有|发现)(?:一)?个[^。！？\n]{0,40}?进程[^。！？\n]{0,20}?(?:吃|占)(?:了|满|掉|用|着)?"
            r"|被(?:别的|其他|其它|另一个|别人的?)?进程(?:占用|占满|占了|吃)"
        ),
        _fixed("the GPU is used by another process"),
    ),
    # GPU counts: "8卡", "单卡", "两张A100"
    (
        re.compile(
            r"(?P<n>\d+|单|两|二|四|八|十六)\s*(?:张|块)?\s*(?:卡|GPU|显卡)"
            r"|(?P<n2>\d+|两|二|四|八|十六)\s*(?:张|块)\s*(?:[A-Z]\d{2,4}|[A-Z]?\d{4}|H20)"
        ),
        _gpus,
    ),
]


def english_for(line: str) -> list[str]:
    """The English wordings of the Chinese phrases in one line, in order, without repeats."""
    found: list[tuple[int, str]] = []
    for pattern, english in _PHRASES:
        for m in pattern.finditer(line):
            if _HYPOTHETICAL_RE.search(line[max(0, m.start() - 4) : m.start()]):
                continue  # "如果显存不够" (if memory runs short) says nothing happened
            words = english(m)
            if words:
                found.append((m.start(), words))
    seen: list[str] = []
    for _start, words in sorted(found):
        if words not in seen:
            seen.append(words)
    return seen


def translate_cjk(text: str) -> str:
    """`text` with one "(in English) ..." line added under every line that holds a known
    Chinese phrasing; the original lines are kept as they were. A text without CJK
    characters, or with none of the phrasings, is returned unchanged."""
    if not _CJK_RE.search(text):
        return text
    out: list[str] = []
    changed = False
    for line in text.splitlines(keepends=True):
        out.append(line)
        if not _CJK_RE.search(line):
            continue
        words = english_for(line)
        if words:
            changed = True
            ending = "" if line.endswith("\n") else "\n"
            out.append(f"{ending}{PREFIX}{'. '.join(words)}.\n")
    if not changed:
        return text
    result = "".join(out)
    return result if text.endswith("\n") else result.rstrip("\n")
