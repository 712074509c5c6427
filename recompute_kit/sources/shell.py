"""Reading bash launch scripts without running them.

A small, quoting-aware lexer and a symbolic interpreter for the subset of bash that training
launch scripts use: literal variable assignments (`A=1`, `A=${B:-8}`, `export A=...`), bash
arrays (`ARGS=( --x 1 )`, `ARGS+=(...)`, `"${ARGS[@]}"`), integer `$((...))`, `if [[ ... ]]`
with conditions decidable from the script's own literals, line continuations and comments.
Nothing is executed: command substitutions, positional parameters and variables the script
does not assign are *unresolved* (carried as a marker naming the variable), loops and
functions are skipped with a warning; a `case` of literal patterns is read as the `if` / `elif`
chain it is (`case "$SIZE" in "8B") ...;; *) ...;; esac`), so a script's literal choice decides it.

bashlex (PyPI 0.18) rejects bash arrays, `$((...))` and `[[ ... ]]` (ParsingError /
NotImplementedError), which every Megatron-LM example uses, so the words are lexed here.
`split_args` (shlex) splits a plain argument list.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import operator
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, ClassVar

# An unresolved value inside expanded text: \x00NAME\x00 (never in a script's own text).
_MARK = "\x00"
_MARK_RE = re.compile("\x00([^\x00]*)\x00")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_ARRAY_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=\(")
_OPS = ("&&", "||", ";;", ";", "&", "|")
_KEYWORDS_OPEN_SKIP = {"while", "until", "for", "select", "case"}
_MAX_STEPS = 200_000
# `<Specify path>`, `<PATH TO CHECKPOINTS DIRECTORY>`: placeholders of example scripts.
_PLACEHOLDER_RE = re.compile(r"<[A-Za-z][^<>\n]*>")
# Flags of the Hugging Face Trainer family (TrainingArguments, TRL's and LLaMA-Factory's model
# and data arguments): a script given them trains
_TRAINER_TELLS = frozenset(
    {
        "--per_device_train_batch_size",
        "--gradient_accumulation_steps",
        "--model_name_or_path",
        "--gradient_checkpointing",
        "--deepspeed",
        "--max_length",
        "--max_seq_length",
        "--num_train_epochs",
        "--learning_rate",
    }
)
def _trl_config_arg(texts: list[str], program: int) -> bool:
    """`scripts/sft.py --config recipe.yaml`: TrlParser's --config (alignment-handbook's and
    TRL's documented launch), its training arguments in that YAML. Not NeMo-RL's
    `examples/run_*.py --config` (its own reader)."""
    if texts[program].rsplit("/", 1)[-1].startswith("run_"):
        return False
    args = texts[program + 1 :]
    for k, t in enumerate(args):
        value = t.split("=", 1)[1] if t.startswith("--config=") else None
        if t == "--config" and k + 1 < len(args):
            value = args[k + 1]
        if value and value.endswith((".yaml", ".yml")):
            return True
    return False


_MEGATRON_TELLS = (
    "--num-layers",
    "--tensor-model-parallel-size",
    "--hidden-size",
    "--recompute-",  # the recompute flags alone (a paste of what a user added to a script)
)
_LAUNCHER_OPTS = {
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "standalone",
    "max_restarts",
    "redirects",
    "tee",
    "log_dir",
    "local_addr",
    "monitor_interval",
    "no_python",
    "module",
}  # a guard against pathological input, not a limit in practice


_FLAG_WORD = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def unresolved(name: str) -> str:
    return f"{_MARK}{name}{_MARK}"


def shown(text: str) -> str:
    """Text as a person reads it: an unresolved value as `${NAME}` (as the script wrote it)."""
    return _MARK_RE.sub(lambda m: "${" + m.group(1) + "}", text)


def unresolved_names(text: str) -> list[str]:
    """The unresolved variables inside an expanded text (empty: fully resolved)."""
    return _MARK_RE.findall(text)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def unset_because(name: str, variables: dict[str, object], depth: int = 0) -> str:
    """Why the unresolved `name` has no value here, in words: the script's positional argument
    (`TOKENIZER_MODEL=$2` -> "the script's 2nd argument"), a command's output, or a variable the
    script never sets (the environment is never read)."""
    if name.startswith("$") and name[1:].isdigit():
        return f"the script's {_ordinal(int(name[1:]))} argument, unknown here"
    if name.startswith("$("):
        return f"the output of {name}, not run here"
    value = variables.get(name)
    if not isinstance(value, list) or not value or _is_fields(value) or depth > 8:
        return "which the script does not set"
    inner = _MARK_RE.fullmatch(_segs_text(value))
    if inner is None or inner.group(1) == name:
        return "which the script does not set"
    source, line = inner.group(1), value[0][1]  # type: ignore[index]
    shown_source = source if source.startswith("$") else f"${source}"
    return f"set on line {line} to {shown_source}, " + unset_because(source, variables, depth + 1)


class ShellError(ValueError):
    """The script cannot be lexed (an unterminated quote or expansion)."""


# ---------------------------------------------------------------------------- lexing


@dataclass
class Part:
    kind: str  # "lit" | "param" | "arith" | "cmd"
    text: str
    quoted: bool
    line: int


@dataclass
class Word:
    parts: list[Part]
    line: int

    @property
    def raw(self) -> str:
        return "".join(p.text if p.kind == "lit" else "$" for p in self.parts)


@dataclass
class Tok:
    kind: str  # "word" | "op" | "nl" | "arr" (NAME=( start) | "arrend"
    line: int
    word: Word | None = None
    op: str = ""
    name: str = ""
    append: bool = False


class _Lexer:
    def __init__(self, text: str, first_line: int = 1) -> None:
        self.s = text
        self.i = 0
        self.line = first_line
        self.toks: list[Tok] = []

    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def _adv(self, n: int = 1) -> str:
        out = self.s[self.i : self.i + n]
        self.line += out.count("\n")
        self.i += n
        return out

    def lex(self) -> list[Tok]:
        array_depth = 0
        while self.i < len(self.s):
            c = self._peek()
            if c == "\\" and self._peek(1) == "\n":
                self._adv(2)
            elif c in " \t\r":
                self._adv()
            elif c == "\n":
                if not array_depth:
                    self.toks.append(Tok("nl", self.line))
                self._adv()
            elif c == "#":
                while self.i < len(self.s) and self._peek() != "\n":
                    self._adv()
            elif array_depth and c == ")":
                self._adv()
                array_depth -= 1
                self.toks.append(Tok("arrend", self.line))
            elif c in ";&|":
                two = self.s[self.i : self.i + 2]
                op = two if two in _OPS else c
                if two in ("&>", "|&"):
                    op = two
                self._adv(len(op))
                self.toks.append(Tok("op", self.line, op=op))
            elif c in "()":
                self._adv()
                self.toks.append(Tok("op", self.line, op=c))
            elif c == "<" and _PLACEHOLDER_RE.match(self.s, self.i):
                self.toks.append(Tok("word", self.line, word=self._word()))
            elif c in "<>" or (c.isdigit() and self._peek(1) in ("<", ">")):
                self._redirect()
            else:
                m = _ARRAY_ASSIGN_RE.match(self.s, self.i)
                if m and not array_depth:
                    line = self.line
                    self._adv(m.end() - self.i)
                    self.toks.append(Tok("arr", line, name=m.group(1), append=bool(m.group(2))))
                    array_depth = 1
                else:
                    self.toks.append(Tok("word", self.line, word=self._word()))
        if array_depth:
            raise ShellError(f"line {self.line}: an array '(' is not closed")
        self.toks.append(Tok("nl", self.line))
        return self.toks

    def _redirect(self) -> None:
        """`> file`, `2>&1`, `<<< word`, `<<EOF` (a here-document's body is skipped)."""
        line = self.line
        m = re.compile(r"\d*(<<<|<<-?|>>|>&|<&|&>|>|<)&?-?\d*").match(self.s, self.i)
        op = m.group(0) if m else self._peek()
        self._adv(len(op))
        while self._peek() in (" ", "\t"):
            self._adv()
        at_word = self.i < len(self.s) and self._peek() not in "\n;&|()"
        target = self._word() if at_word else None
        if op.lstrip("0123456789") == "<<<" and target is not None:
            # a here-string is the input `read` splits (`read -r A B <<< "$CONFIG"`)
            self.toks.append(Tok("op", line, op="herestring"))
            self.toks.append(Tok("word", line, word=target))
            return
        self.toks.append(Tok("op", line, op="redir"))
        if op.lstrip("0123456789").startswith("<<") and not op.endswith("<<<") and target:
            delim = "".join(p.text for p in target.parts).strip()
            nl = self.s.find("\n", self.i)
            if nl < 0:
                return
            end = re.compile(rf"^\t*{re.escape(delim)}\s*$", re.M).search(self.s, nl + 1)
            stop = end.end() if end else len(self.s)
            self.toks.append(Tok("nl", self.line))
            self._adv(stop - self.i)

    def _word(self) -> Word:
        start_line = self.line
        parts: list[Part] = []
        while self.i < len(self.s):
            c = self._peek()
            m = _PLACEHOLDER_RE.match(self.s, self.i) if c == "<" else None
            if m:  # `<Specify path>` in an example script: a value to fill in, not a redirect
                parts.append(Part("lit", unresolved(m.group(0)), True, self.line))
                self._adv(m.end() - self.i)
                continue
            if c in " \t\r\n;&|()<>":
                break
            if c == "\\":
                if self._peek(1) == "\n":
                    self._adv(2)
                    continue
                self._adv()
                parts.append(Part("lit", self._adv(), True, self.line))
            elif c == "'":
                line = self.line
                end = self.s.find("'", self.i + 1)
                if end < 0:
                    raise ShellError(f"line {line}: a ' quote is not closed")
                self._adv()
                parts.append(Part("lit", self._adv(end - self.i), True, line))
                self._adv()
            elif c == '"':
                self._adv()
                self._double_quoted(parts)
            elif c == "$" or c == "`":
                parts.append(self._dollar(quoted=False))
            else:
                parts.append(Part("lit", self._adv(), False, self.line))
        return Word(_merge_lits(parts), start_line)

    def _double_quoted(self, parts: list[Part]) -> None:
        start = self.line
        while True:
            if self.i >= len(self.s):
                raise ShellError(f'line {start}: a " quote is not closed')
            c = self._peek()
            if c == '"':
                self._adv()
                return
            if c == "\\" and self._peek(1) in ('"', "\\", "$", "`", "\n"):
                self._adv()
                ch = self._adv()
                if ch != "\n":
                    parts.append(Part("lit", ch, True, self.line))
            elif c in "$`":
                parts.append(self._dollar(quoted=True))
            else:
                parts.append(Part("lit", self._adv(), True, self.line))

    def _dollar(self, quoted: bool) -> Part:
        line = self.line
        if self._peek() == "`":
            end = self.s.find("`", self.i + 1)
            if end < 0:
                raise ShellError(f"line {line}: a ` quote is not closed")
            self._adv()
            text = self._adv(end - self.i)
            self._adv()
            return Part("cmd", text, quoted, line)
        nxt = self._peek(1)
        if self.s.startswith("$((", self.i):
            self._adv(3)
            return Part("arith", self._balanced("(", ")", line, close_twice=True), quoted, line)
        if nxt == "(":
            self._adv(2)
            return Part("cmd", self._balanced("(", ")", line), quoted, line)
        if nxt == "{":
            self._adv(2)
            return Part("param", self._balanced("{", "}", line), quoted, line)
        m = _NAME_RE.match(self.s, self.i + 1)
        if m:
            self._adv(1)
            return Part("param", self._adv(m.end() - m.start()), quoted, line)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self._adv(1)
            return Part("param", self._adv(), quoted, line)
        self._adv()
        return Part("lit", "$", quoted, line)

    def _balanced(self, open_: str, close: str, line: int, close_twice: bool = False) -> str:
        depth, start = 1, self.i
        quote = ""
        while self.i < len(self.s):
            c = self._peek()
            if quote:
                if c == "\\" and quote == '"':
                    self._adv()
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c == "\\":
                self._adv()
            elif c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    text = self.s[start : self.i]
                    self._adv()
                    if close_twice:
                        if self._peek() != close:
                            raise ShellError(f"line {line}: $(( is not closed by ))")
                        self._adv()
                    return text
            self._adv()
        raise ShellError(f"line {line}: '{open_}' is not closed")


def _merge_lits(parts: list[Part]) -> list[Part]:
    out: list[Part] = []
    for p in parts:
        if (
            out
            and p.kind == "lit"
            and out[-1].kind == "lit"
            and out[-1].quoted == p.quoted
            and out[-1].line == p.line
        ):
            out[-1] = Part("lit", out[-1].text + p.text, p.quoted, out[-1].line)
        else:
            out.append(p)
    return out


# ---------------------------------------------------------------------------- values

# A scalar value: segments of (text, line) so that a word split later keeps its source line.
Segs = list[tuple[str, int]]


@dataclass(frozen=True)
class EnvDefault:
    """A value that rests on the default of an environment variable the script does not set
    (`NNODES=${SLURM_NNODES:-"1"}`): `via` the script's variable that took it (NNODES)."""

    env: str
    default: str
    line: int
    via: str = ""

    def describe(self) -> str:
        said = f"${{{self.env}:-{self.default}}} (line {self.line})"
        head = f"{self.via} = {self.default}: " if self.via else f"{self.default}: "
        return f"{head}the default of {said}"


@dataclass
class Field:
    """One word of a command after expansion, with the line it was written on."""

    text: str
    line: int
    # the environment defaults the word's value rests on (the environment is never read)
    rests_on: tuple[EnvDefault, ...] = ()

    @property
    def unresolved(self) -> list[str]:
        return unresolved_names(self.text)


@dataclass
class Launch:
    """The training command found in a script: its arguments and how it is launched."""

    args: list[Field]
    line: int
    launcher: list[Field] = field(default_factory=list)  # words before the training program
    program: str = ""
    world_size: int | None = None
    world_size_line: int = 0
    world_size_key: str = ""
    world_size_rests_on: tuple[EnvDefault, ...] = ()  # environment defaults it rests on
    gpus_per_node: tuple[int, int, str] | None = None  # (count, line, key) of a node's ranks


@dataclass
class Script:
    launches: list[Launch]
    variables: dict[str, object]
    warnings: list[str]
    sbatch: dict[str, tuple[str, int]]  # #SBATCH --nodes=... lines
    # the flags written in branches of an `if` the script does not decide (flag -> line):
    # what they set is not read, so a default in their place is an assumption
    undecided_flags: dict[str, int] = field(default_factory=dict)


class _Arith:
    _OPS: ClassVar[dict[type, Any]] = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv,  # bash: integer division
        ast.Mod: operator.mod,
    }

    @classmethod
    def eval(cls, expr: str) -> int:
        tree = ast.parse(expr.strip(), mode="eval")
        return cls._node(tree.body)

    @classmethod
    def _node(cls, node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = cls._node(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in cls._OPS:
            left, right = cls._node(node.left), cls._node(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            if isinstance(node.op, ast.Mult) and abs(left) * abs(right) > 10**18:
                raise ValueError("too large")
            return cls._OPS[type(node.op)](left, right)
        raise ValueError("not an integer expression")


class _Interp:
    def __init__(self, path: str) -> None:
        self.path = path
        self.vars: dict[str, Segs | list[Field]] = {}
        self.warnings: list[str] = []
        self.launches: list[Launch] = []
        self.steps = 0
        self.passes_args_line = 0
        self.argv: list[str] | None = None  # the positional parameters, where `set --` gives them
        self.undecided_flags: dict[str, int] = {}
        self.set_only_in_untaken: set[str] = set()
        # the environment defaults each variable's value rests on, and those the expansion in
        # progress has taken (collected word by word)
        self.rests_on: dict[str, tuple[EnvDefault, ...]] = {}
        self._taken: list[EnvDefault] = []
        self._field_rests: list[tuple[EnvDefault, ...]] = []

    # -- expansion
    def _param(self, expr: str, line: int, quoted: bool) -> Segs | list[Field]:
        """The value of ${expr}: segments, or a list of fields for `NAME[@]`."""
        m = re.match(r"^(#?)([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?$!-])(\[[^\]]*\])?(.*)$", expr, re.S)
        if not m:
            return [(unresolved("${" + expr + "}"), line)]
        length, name, index, rest = m.groups()
        value = self.vars.get(name)
        if name in "@*" and not index:
            if self.argv is not None:  # `set -- ...`: the arguments the script was given
                return [Field(a, line) for a in self.argv]
            if not self.passes_args_line:
                self.passes_args_line = line
            return []
        if index in ("[@]", "[*]"):
            if isinstance(value, list):
                return list(value)
            if value is None:
                return [(unresolved(name), line)]
            return [Field(_segs_text(value), line)]
        if index and index not in ("[0]",):
            return [(unresolved(f"{name}{index}"), line)]
        if _is_fields(value):  # $ARR is its first element
            value = [(value[0].text, value[0].line)] if value else []
        if length:
            if value is None or any(unresolved_names(t) for t, _ in value):
                return [(unresolved(name), line)]
            return [(str(len(_segs_text(value))), line)]
        op_m = re.match(r"^(:?[-=+?])(.*)$", rest, re.S)
        if rest and not op_m:
            # ${X%pat}, ${X/a/b}, ${X:1:2}: not followed
            return [(unresolved(name), line)]
        if op_m:
            op, word = op_m.groups()
            empty = value is None or (op.startswith(":") and _segs_text(value) == "")
            if op.endswith(("-", "=")):
                if empty:
                    out = self._expand_text(word, line)
                    if value is None and not _MARK_RE.search(_segs_text(out)):
                        self._taken.append(EnvDefault(name, shown(_segs_text(out)), line))
                    if op.endswith("=") and name.isidentifier():
                        self.vars[name] = out
                    return out
            elif op.endswith("+"):
                return [] if empty else self._expand_text(word, line)
            elif op.endswith("?") and empty:
                return [(unresolved(name), line)]
        if value is None and name in self.set_only_in_untaken:
            return []  # assigned only in a branch the script does not take: unset, empty
        if value is None:
            return [(unresolved("$" + name if name[0].isdigit() else name), line)]
        self._taken += self.rests_on.get(name, ())
        # A value that is wholly one unresolved marker is named after this variable.
        text = _segs_text(value)
        if _MARK_RE.fullmatch(text):
            return [(unresolved(name), line)]
        return list(value)

    def _expand_text(self, text: str, line: int) -> Segs:
        """A `${X:-word}` default: its own quotes and expansions, not word-split."""
        try:
            toks = _Lexer(f'"{_escape_dq(text)}"' if '"' not in text else text, line).lex()
        except ShellError:
            return [(text, line)]
        segs: Segs = []
        for tok in toks:
            if tok.kind == "word" and tok.word:
                if segs:
                    segs.append((" ", tok.line))
                segs.extend(self.expand_segs(tok.word))
        return segs

    def _arith(self, expr: str, line: int) -> Segs:
        names: list[str] = []

        def sub(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2) or m.group(3)
            value = self.vars.get(name)
            self._taken += self.rests_on.get(name, ())
            text = _segs_text(value) if isinstance(value, list) and not _is_fields(value) else None
            if text is None or not re.fullmatch(r"\s*-?\d+\s*", text):
                names.append(name)
                return "0"
            return f"({text.strip()})"

        expr2 = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\b", sub, expr)
        if names:
            return [(unresolved(names[0]), line)]
        try:
            return [(str(_Arith.eval(expr2)), line)]
        except (ValueError, SyntaxError, RecursionError):
            return [(unresolved(f"$(({expr}))"), line)]

    def expand(self, word: Word, split: bool = True) -> list[Field]:
        out: list[Field] = []
        fields = self._expand(word, split)
        for segs, rests_on in zip(fields, self._field_rests, strict=True):
            line = next((ln for t, ln in segs if t.strip()), segs[0][1] if segs else word.line)
            out.append(Field("".join(t for t, _ in segs), line, rests_on))
        return out

    def expand_segs(self, word: Word) -> Segs:
        """A word expanded without splitting (an assignment's value), lines kept."""
        fields = self._expand(word, split=False)
        return fields[0] if fields else []

    def _expand(self, word: Word, split: bool) -> list[Segs]:
        """The word's fields; `self._field_rests` gets the environment defaults each rests on."""
        fields: list[Segs] = []
        rests: list[list[EnvDefault]] = []
        cur: Segs = []
        cur_rests: list[EnvDefault] = []
        cur_quoted = False
        started = False

        def flush() -> None:
            nonlocal cur, cur_quoted, started, cur_rests
            if started and (cur or cur_quoted):
                fields.append(cur)
                rests.append(cur_rests)
            cur, cur_quoted, started, cur_rests = [], False, False, []

        def add_split(segs: Segs, taken: tuple[EnvDefault, ...]) -> None:
            nonlocal started
            for text, line in segs:
                pieces = re.split(r"([ \t\n]+)", text)
                for piece in pieces:
                    if not piece:
                        continue
                    if piece.isspace():
                        flush()
                    else:
                        cur.append((piece, line))
                        cur_rests.extend(taken)
                        started = True

        for part in word.parts:
            if part.kind == "lit":
                cur.append((part.text, part.line))
                started = True
                cur_quoted = cur_quoted or part.quoted
                continue
            mark = len(self._taken)
            if part.kind == "param":
                value = self._param(part.text, part.line, part.quoted)
            elif part.kind == "arith":
                value = self._arith(part.text, part.line)
            else:
                value = [(unresolved(f"$({part.text.strip()[:40]})"), part.line)]
            taken = tuple(self._taken[mark:])
            if (not value and "[@]" in part.text) or ("[*]" in part.text and not value):
                continue  # an empty array: no word at all
            if value and _is_fields(value):  # an array's elements
                elems: list[Field] = value  # type: ignore[assignment]
                self._taken += [r for elem in elems for r in elem.rests_on]
                for k, elem in enumerate(elems):
                    if k:
                        if part.quoted or not split:
                            flush() if split else cur.append((" ", elem.line))
                        else:
                            flush()
                    if part.quoted or not split:
                        cur.append((elem.text, elem.line))
                        cur_rests.extend(elem.rests_on)
                        started = True
                        cur_quoted = cur_quoted or part.quoted
                    else:
                        add_split([(elem.text, elem.line)], elem.rests_on)
                if part.quoted:
                    started = True
                continue
            segs: Segs = value  # type: ignore[assignment]
            if part.quoted or not split:
                cur.extend(segs)
                cur_rests.extend(taken)
                started = True
                cur_quoted = cur_quoted or part.quoted
            else:
                add_split(segs, taken)
        if not split:
            started = True
        flush()
        self._field_rests = [tuple(dict.fromkeys(r)) for r in rests]
        return fields

    def expand_words(self, words: list[Word]) -> list[Field]:
        out: list[Field] = []
        for w in words:
            out.extend(self.expand(w))
        return out

    # -- statements
    def run(self, toks: list[Tok]) -> None:
        self._run_commands(_commands(toks))

    def _run_commands(self, commands: list[_Cmd], depth: int = 0) -> None:
        frames: list[list] = []  # [kind, active(True/False/None), any_taken, line]

        def active() -> bool:
            return all(f[1] is True for f in frames)

        i = 0
        while i < len(commands):
            self.steps += 1
            if self.steps > _MAX_STEPS:
                raise ShellError("the script is too long to read")
            cmd = commands[i]
            words = cmd.words
            first = _literal(words[0]) if words else None
            if first in ("if", "elif"):
                # The condition: this command (less the keyword) and any chained by && / ||
                cond = [(cmd.conn, words[1:])]
                j = i + 1
                while j < len(commands) and _literal_first(commands[j]) != "then":
                    cond.append((commands[j].conn, commands[j].words))
                    j += 1
                if first == "if":
                    value = self._condition(cond) if active() else False
                    frames.append(["if", value, value is True, cmd.line])
                    if value is None and active_parent(frames):
                        self.warnings.append(
                            f"{self.path}:{cmd.line}: an `if` whose condition the script does "
                            "not decide: its branches are not read"
                        )
                elif frames and frames[-1][0] == "if":
                    frame = frames[-1]
                    if frame[2] or frame[1] is None:
                        frame[1] = False if frame[2] else None
                    else:
                        value = self._condition(cond) if active_parent(frames) else False
                        frame[1] = value
                        frame[2] = value is True
                i = j
                if j < len(commands):
                    commands[j] = _Cmd(
                        commands[j].words[1:], commands[j].line, ";", commands[j].redirs
                    )
                continue
            if first == "else" and frames and frames[-1][0] == "if":
                frame = frames[-1]
                frame[1] = None if frame[1] is None else (not frame[2])
                commands[i] = _Cmd(words[1:], cmd.line, ";", cmd.redirs)
                continue
            if first == "fi" and frames and frames[-1][0] == "if":
                frames.pop()
                commands[i] = _Cmd(words[1:], cmd.line, ";", cmd.redirs)
                continue
            if first == "for" and active() and depth < 4:
                end = _skip_block(commands, i, "for", "done")
                if self._for_once(cmd, commands[i + 1 : end], depth):
                    i = end
                    continue
            if first in _KEYWORDS_OPEN_SKIP:
                end = "esac" if first == "case" else "done"
                if active():
                    self.warnings.append(
                        f"{self.path}:{cmd.line}: a `{first}` block is not followed (the script "
                        "is read, not run)"
                    )
                i = _skip_block(commands, i, first, end)
                continue
            if first == "function" or (
                len(words) >= 1 and i + 1 < len(commands) and cmd.opens_function
            ):
                i = _skip_braces(commands, i)
                continue
            if first in ("{", "}", "then", "do", "done", "esac", "fi", "else"):
                commands[i] = _Cmd(words[1:], cmd.line, ";", cmd.redirs)
                if not words[1:]:
                    i += 1
                continue
            if active() and cmd.conn != "||":
                self._simple(cmd)
            elif any(f[1] is None for f in frames) and not any(f[1] is False for f in frames):
                for w in words:
                    for flag in _FLAG_WORD.findall(w.raw if isinstance(w, Word) else ""):
                        self.undecided_flags.setdefault(flag, cmd.line)
            elif not any(f[1] is None for f in frames):
                # a branch the script decides against: the variables it assigns stay unset
                # there, so they expand to nothing (`${offload_option}` after `if [ $X !=
                # false ]` with X false), not to a value the environment might give
                for w in words:
                    m = _assign_match(w) if not isinstance(w, _ArrayWord) else None
                    name = m[0] if m else (w.name if isinstance(w, _ArrayWord) else None)
                    if name:
                        self.set_only_in_untaken.add(name)
            i += 1

    def _for_once(self, cmd: _Cmd, body: list[_Cmd], depth: int) -> bool:
        """`for NAME in WORDS; do ...; done` over literal values: the body read once, with the
        first value (Megatron-Bridge's slurm scripts loop over parallel layouts:
        `for CONFIG in "${PARALLELISM_CONFIGS[@]}"`); False where the values are not known."""
        words = cmd.words
        if len(words) < 3 or _literal(words[2]) != "in" or _literal(words[1]) is None:
            return False
        name = _literal(words[1])
        items = [w for w in words[3:] if _literal(w) != "do"]
        values = [f.text for f in self.expand_words(items)]
        if not values or any(_MARK in v for v in values):  # a value the script does not give
            return False
        if len(values) > 1:
            self.warnings.append(
                f"{self.path}:{cmd.line}: a `for` loop over {len(values)} values is read once, "
                f"with its first: {name}={values[0]}"
            )
        self.vars[name] = [(values[0], cmd.line)]
        self._run_commands([c for c in body if c.words], depth + 1)
        return True

    def _read(self, rest: list, cmd: _Cmd, assigns: list) -> None:
        """`IFS=',' read -r A B C <<< "$CONFIG"`: the here-string split on IFS into the names
        (the last takes the rest); without a here-string the names stay unset."""
        names = [x for x in (_literal(w) for w in rest[1:]) if x and not x.startswith("-")]
        if cmd.herestring is None or not names:
            return
        text = "".join(f.text for f in self.expand_words([cmd.herestring]))
        ifs = " \t\n"
        for name, _append, value_word, _items, _line in assigns:
            if name == "IFS" and value_word is not None:
                ifs = "".join(f.text for f in self.expand_words([value_word])) or ifs
        parts = re.split("[" + re.escape(ifs) + "]", text, maxsplit=len(names) - 1)
        for k, name in enumerate(names):
            self.vars[name] = [(parts[k] if k < len(parts) else "", cmd.line)]

    def _condition(self, cond: list[tuple[str, list[Word]]]) -> bool | None:
        result: bool | None = None
        for k, (conn, words) in enumerate(cond):
            value = self._test(words)
            if k == 0:
                result = value
            elif conn == "&&":
                result = _and(result, value)
            elif conn == "||":
                result = _or(result, value)
            else:
                result = value
        return result

    def _test(self, words: list[Word]) -> bool | None:
        lits = [_literal(w) for w in words]
        negate = False
        if lits and lits[0] == "!":
            negate, words, lits = True, words[1:], lits[1:]
        if not lits or lits[0] not in ("[[", "[", "test"):
            return None
        body = words[1:]
        if lits[0] in ("[[", "[") and body and _literal(body[-1]) in ("]]", "]"):
            body = body[:-1]
        vals: list[str] = []
        for w in body:
            f = self.expand(w, split=False)
            vals.append(f[0].text if f else "")
        res: bool | None
        if len(vals) == 2 and vals[0] in ("-z", "-n"):
            names = unresolved_names(vals[1])
            if names and not self._unset_knob(vals[1], names, words[0].line):
                return None
            empty = bool(names) or vals[1] == ""
            res = empty == (vals[0] == "-z")
        elif len(vals) == 3 and vals[1] in ("==", "=", "!="):
            if unresolved_names(vals[0]) or unresolved_names(vals[2]):
                return None
            same = vals[0] == vals[2]
            if lits[0] == "[[" and _GLOB.search(vals[2]) and not _quoted(body[2]):
                same = fnmatch.fnmatchcase(vals[0], vals[2])  # `[[ $x == pat* ]]`: a glob
            res = same == (vals[1] != "!=")
        elif len(vals) == 3 and vals[1] in ("-eq", "-ne", "-gt", "-lt", "-ge", "-le"):
            try:
                a, b = int(vals[0]), int(vals[2])
            except ValueError:
                return None
            res = {
                "-eq": a == b,
                "-ne": a != b,
                "-gt": a > b,
                "-lt": a < b,
                "-ge": a >= b,
                "-le": a <= b,
            }[vals[1]]
        elif len(vals) == 1:
            if unresolved_names(vals[0]):
                return None
            res = vals[0] != ""
        else:
            return None
        return (not res) if negate else res

    def _unset_knob(self, value: str, names: list[str], line: int) -> bool:
        """`[ -z ${X} ]` on a variable the script never sets: a knob the environment may set
        (`if [ -z ${MP_AC_LAYERS} ]; then MP_AC_LAYERS=1; fi`, a ${X:-default} written as an
        `if`). Taken as unset, like the default of ${X:-...}, and said: the environment is
        never read."""
        name = names[0]
        if len(names) != 1 or value != unresolved(name) or not name.isidentifier():
            return False
        if name in self.vars:
            return False  # set by the script to something it cannot resolve: undecided
        self.warnings.append(
            f"{self.path}:{line}: {name} is not set by the script: taken as unset, as the "
            "`if` on it assumes by default (the environment is not read; set it in the script "
            "to read another value)"
        )
        return True

    def _simple(self, cmd: _Cmd) -> None:
        words = list(cmd.words)
        if not words:
            return
        # Leading assignments (alone: shell variables; before a command: its environment).
        k = 0
        assigns: list[tuple[str, bool, Word | None, list[Word] | None, int]] = []
        while k < len(words):
            w = words[k]
            if isinstance(w, _ArrayWord):
                assigns.append((w.name, w.append, None, w.items, w.line))
                k += 1
                continue
            m = _assign_match(w)
            if not m:
                break
            assigns.append((m[0], m[1], m[2], None, w.line))
            k += 1
        rest = words[k:]
        first = _literal(rest[0]) if rest else None
        if first in ("export", "declare", "local", "readonly", "typeset"):
            for w in rest[1:]:
                if isinstance(w, _ArrayWord):
                    assigns.append((w.name, w.append, None, w.items, w.line))
                    continue
                m = _assign_match(w)
                if m:
                    assigns.append((m[0], m[1], m[2], None, w.line))
            rest = []
        if not rest:
            for name, append, value_word, items, _line in assigns:
                self._assign(name, append, value_word, items)
            return
        if first == "set" and len(rest) > 1 and _literal(rest[1]) == "--":
            # the script's positional parameters ($1, $2, ..., $#, $@): what it was run with
            self.argv = [f.text for f in self.expand_words(rest[2:])]
            for k, arg in enumerate(self.argv, 1):  # (line 0: given, not written here)
                self.vars[str(k)] = [(arg, 0)]
            self.vars["#"] = [(str(len(self.argv)), 0)]
            return
        if first == "unset":
            for w in rest[1:]:
                self.vars.pop(_literal(w) or "", None)
                self.rests_on.pop(_literal(w) or "", None)
            return
        if first == "read":
            self._read(rest, cmd, assigns)
            return
        if first in ("source", "."):
            self.warnings.append(
                f"{self.path}:{cmd.line}: `{first}` of another file: its variables are not read"
            )
            return
        fields = self.expand_words(rest)
        self._maybe_launch(fields, cmd.line)

    def _assign(
        self, name: str, append: bool, value_word: Word | None, items: list[Word] | None
    ) -> None:
        if items is not None:
            new = self.expand_words(items)
            old = self.vars.get(name)
            if append and isinstance(old, list) and _is_fields(old):
                self.vars[name] = [*old, *new]
            elif append and old:
                self.vars[name] = [Field(_segs_text(old), old[0][1]), *new]  # type: ignore[index]
            else:
                self.vars[name] = new
            return
        mark = len(self._taken)
        segs: Segs = self.expand_segs(value_word) if value_word is not None else []
        taken = tuple(
            dict.fromkeys(
                r if r.via else dataclasses.replace(r, via=name) for r in self._taken[mark:]
            )
        )
        del self._taken[mark:]
        old = self.vars.get(name)
        if append and old is not None:
            if _is_fields(old):
                line = value_word.line if value_word is not None else 0
                self.vars[name] = [*old, Field(_segs_text(segs), line, taken)]  # type: ignore[misc]
                return
            segs = list(old) + segs  # type: ignore[arg-type]
            taken = (*self.rests_on.get(name, ()), *taken)
        self.vars[name] = segs
        self.rests_on[name] = taken

    def _maybe_launch(self, fields: list[Field], line: int) -> None:
        """Record a command that runs a training program (pretrain_*.py, train*.py, or any
        command given Megatron flags); `sh -c "..."` is read inside. `echo $CMD` prints the
        command, it does not run it (`eval $CMD` does)."""
        texts = [f.text for f in fields]
        if texts and texts[0] in ("echo", "printf"):
            return
        for k, t in enumerate(texts):
            if t == "-c" and k + 1 < len(fields) and k >= 1:
                base = texts[k - 1].rsplit("/", 1)[-1]
                if base in ("sh", "bash", "zsh"):
                    inner = _Interp(self.path)
                    inner.vars = self.vars
                    inner.launches = []
                    try:
                        inner.run(
                            _Lexer(
                                fields[k + 1].text.replace(_MARK, "\x01"), fields[k + 1].line
                            ).lex()
                        )
                    except ShellError:
                        return
                    for launch in inner.launches:
                        for f in launch.args + launch.launcher:
                            f.text = f.text.replace("\x01", _MARK)
                            f.line = fields[k + 1].line if f.line < fields[k + 1].line else f.line
                        launch.launcher = fields[: k - 1] + launch.launcher
                        self.launches.append(launch)
                    self.warnings += inner.warnings
                    if inner.passes_args_line and not self.passes_args_line:
                        self.passes_args_line = inner.passes_args_line
                    return
        program = None
        for k, t in enumerate(texts):
            base = t.rsplit("/", 1)[-1]
            if base.endswith(".py") and (base.startswith(("pretrain", "train")) or "train" in base):
                program = k
                break
            # `python -m torchtitan.train`, `torchrun ... -m torchtitan.train`: a module run
            if t == "-m" and k + 1 < len(texts) and "train" in texts[k + 1].rsplit(".", 1)[-1]:
                program = k + 1
                break
        if program is None:
            # any script given a trainer's flags (TRL's scripts/sft.py, finetune.py): the
            # flags say it trains, whatever it is called
            first_py = next(
                (k for k, t in enumerate(texts) if t.rsplit("/", 1)[-1].endswith(".py")), None
            )
            if first_py is not None and (
                any(t.split("=", 1)[0] in _TRAINER_TELLS for t in texts[first_py + 1 :])
                or _trl_config_arg(texts, first_py)
            ):
                program = first_py
        if program is None:
            if not any(t.startswith(_MEGATRON_TELLS) for t in texts):
                return
            # A command given Megatron flags without a training program (an argument list):
            # its arguments start at the first flag that is not the launcher's.
            first = next(
                (
                    k
                    for k, t in enumerate(texts)
                    if t.startswith("--")
                    and t.lstrip("-").split("=")[0].replace("-", "_") not in _LAUNCHER_OPTS
                ),
                len(texts),
            )
            self.launches.append(
                Launch(args=fields[first:], line=line, launcher=fields[:first], program="")
            )
            return
        self.launches.append(
            Launch(
                args=fields[program + 1 :],
                line=line,
                launcher=fields[:program],
                program=texts[program] if program < len(texts) else "",
            )
        )


def active_parent(frames: list[list]) -> bool:
    return all(f[1] is True for f in frames[:-1])


def _and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _escape_dq(text: str) -> str:
    return text.replace("\\", "\\\\")


def _segs_text(value: object) -> str:
    if isinstance(value, list):
        if _is_fields(value):
            return " ".join(f.text for f in value)  # type: ignore[union-attr]
        return "".join(t for t, _ in value)  # type: ignore[misc]
    return ""


def _is_fields(value: object) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], Field)


def _quoted(word: Word) -> bool:
    """Any part of the word written inside quotes (a quoted pattern is no glob)."""
    return any(part.quoted for part in getattr(word, "parts", ()))


def _literal(word: Word | _ArrayWord | None) -> str | None:
    if not isinstance(word, Word):
        return None
    if all(p.kind == "lit" for p in word.parts):
        return "".join(p.text for p in word.parts)
    return None


def _literal_first(cmd: _Cmd) -> str | None:
    return _literal(cmd.words[0]) if cmd.words else None


def _assign_match(word: Word | _ArrayWord) -> tuple[str, bool, Word] | None:
    if not isinstance(word, Word) or not word.parts or word.parts[0].kind != "lit":
        return None
    head = word.parts[0]
    if head.quoted:
        return None
    m = _ASSIGN_RE.match(head.text)
    if not m:
        return None
    rest_text = head.text[m.end() :]
    parts = ([Part("lit", rest_text, False, head.line)] if rest_text else []) + word.parts[1:]
    return m.group(1), bool(m.group(2)), Word(parts, word.line)


@dataclass
class _ArrayWord:
    name: str
    append: bool
    items: list[Word]
    line: int


@dataclass
class _Cmd:
    words: list
    line: int
    conn: str  # the operator before this command: ";", "&&", "||", "|", "&"
    redirs: int = 0
    opens_function: bool = False
    herestring: Any = None  # the word after `<<<`


def _commands(toks: list[Tok]) -> list[_Cmd]:
    cmds: list[_Cmd] = []
    words: list = []
    line = 0
    conn = ";"
    i = 0
    fn = False
    herestring = None
    while i < len(toks):
        t = toks[i]
        if t.kind == "word":
            if not words:
                line = t.line
            words.append(t.word)
        elif t.kind == "arr":
            items: list[Word] = []
            i += 1
            while i < len(toks) and toks[i].kind != "arrend":
                if toks[i].kind == "word" and toks[i].word is not None:
                    items.append(toks[i].word)  # type: ignore[arg-type]
                i += 1
            if not words:
                line = t.line
            words.append(_ArrayWord(t.name, t.append, items, t.line))
        elif t.kind == "op" and t.op == "redir":
            pass
        elif t.kind == "op" and t.op == "herestring":
            herestring = toks[i + 1].word if i + 1 < len(toks) else None
            i += 1
        elif t.kind == "op" and t.op == "(" and i + 1 < len(toks) and toks[i + 1].op == ")":
            fn = True  # name() { ...
            i += 1
        elif t.kind == "op" and t.op in ("(", ")"):
            pass  # subshells: read as if inline
        else:
            if words:
                cmds.append(_Cmd(words, line, conn, opens_function=fn, herestring=herestring))
            words, fn, herestring = [], False, None
            conn = t.op if t.kind == "op" else ";"
        i += 1
    if words:
        cmds.append(_Cmd(words, line, conn, opens_function=fn, herestring=herestring))
    return cmds


_GLOB = re.compile(r"[*?\[]")


def _case_as_if(toks: list[Tok]) -> list[Tok]:
    """Each `case WORD in p1|p2) ... ;; *) ... ;; esac` whose patterns are literals (or the
    last one `*`) as `if [ WORD == p1 ] || [ WORD == p2 ]; then ...; elif ...; else ...; fi`:
    the interpreter decides it as it decides an `if` (or says it does not); a glob pattern
    (`openmathinstruct2*)`) is matched as bash matches it. A `case` nested in another stays as
    it is (skipped, with a warning)."""
    out: list[Tok] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        at_start = not out or out[-1].kind == "nl" or (out[-1].kind == "op" and out[-1].op != ")")
        if t.kind == "word" and at_start and _literal(t.word) == "case":
            rewritten, end = _rewrite_case(toks, i)
            if rewritten is not None:
                out.extend(rewritten)
                i = end
                continue
        out.append(t)
        i += 1
    return out


def _rewrite_case(toks: list[Tok], i: int) -> tuple[list[Tok] | None, int]:
    if i + 2 >= len(toks) or _literal(toks[i + 2].word) != "in":
        return None, i
    subject = toks[i + 1].word

    def word(text: str, at: int) -> Tok:
        return Tok("word", at, Word([Part("lit", text, False, at)], at))

    def op(text: str, at: int) -> Tok:
        return Tok("op", at, op=text)

    out: list[Tok] = []
    j, arm = i + 3, 0
    while j < len(toks):
        while j < len(toks) and toks[j].kind == "nl":
            j += 1
        if j < len(toks) and toks[j].kind == "word" and _literal(toks[j].word) == "esac":
            if arm == 0:
                return None, i
            out += [op(";", toks[j].line), word("fi", toks[j].line)]
            return out, j + 1
        patterns = []  # p1 | p2 )
        while j < len(toks) and not (toks[j].kind == "op" and toks[j].op == ")"):
            if toks[j].kind == "word":
                patterns.append(toks[j].word)
            elif not (toks[j].kind == "op" and toks[j].op in ("|", "(")):
                return None, i
            j += 1
        texts = [_literal(p) for p in patterns]
        if not patterns or j >= len(toks) or any(x is None for x in texts):
            return None, i
        at = toks[j].line
        if texts == ["*"]:
            head = [op(";", at), word("else", at)] if arm else None
            if head is None:  # `*)` first: always taken
                head = [word("if", at), word("true", at), op(";", at), word("then", at)]
        else:  # `[[ WORD == pattern ]]`: bash matches an unquoted right side as a glob
            head = [op(";", at)] if arm else []
            head.append(word("elif" if arm else "if", at))
            for k, pattern in enumerate(patterns):
                if k:
                    head.append(op("||", at))
                head += [word("[[", at), Tok("word", at, subject), word("==", at)]
                head += [Tok("word", at, pattern), word("]]", at)]
            head += [op(";", at), word("then", at)]
        out += head
        arm += 1
        j += 1
        body_start = j
        while j < len(toks) and not (toks[j].kind == "op" and toks[j].op == ";;"):
            if toks[j].kind == "word" and _literal(toks[j].word) in ("case", "esac"):
                if _literal(toks[j].word) == "case":
                    return None, i  # nested: left to the skip
                break  # the last arm may end without `;;`
            j += 1
        out += toks[body_start:j]
        if j < len(toks) and toks[j].kind == "op" and toks[j].op == ";;":
            j += 1
    return None, i  # no `esac`


def _skip_block(commands: list[_Cmd], i: int, open_kw: str, close_kw: str) -> int:
    depth = 0
    while i < len(commands):
        for w in commands[i].words:
            lit = _literal(w)
            if lit in _KEYWORDS_OPEN_SKIP:
                depth += 1
            elif lit in ("done", "esac"):
                depth -= 1
                if depth == 0:
                    return i + 1
        i += 1
    return i


def _skip_braces(commands: list[_Cmd], i: int) -> int:
    depth = 0
    seen = False
    while i < len(commands):
        for w in commands[i].words:
            lit = _literal(w)
            if lit == "{":
                depth += 1
                seen = True
            elif lit == "}":
                depth -= 1
                if seen and depth == 0:
                    return i + 1
        i += 1
    return i


_SBATCH_RE = re.compile(r"^\s*#SBATCH\s+(.*)$", re.M)


def _sbatch(text: str) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for m in _SBATCH_RE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        try:
            words = shlex.split(m.group(1), comments=True)
        except ValueError:
            words = m.group(1).split()
        k = 0
        while k < len(words):
            w = words[k]
            if w.startswith("-"):
                if "=" in w:
                    key, val = w.split("=", 1)
                    out[key] = (val, line)
                elif k + 1 < len(words) and not words[k + 1].startswith("-"):
                    out[w] = (words[k + 1], line)
                    k += 1
            k += 1
    return out


def sbatch_world_size(sbatch: dict[str, tuple[str, int]]) -> tuple[int, int, str] | None:
    """The ranks an #SBATCH header asks for (one per task: --ntasks, else --nodes x
    --ntasks-per-node), with its line and keys; None when it does not say."""
    tasks = sbatch.get("--ntasks") or sbatch.get("-n")
    if tasks and (n := _int(tasks[0])):
        return n, tasks[1], "#SBATCH --ntasks"
    nodes = sbatch.get("--nodes") or sbatch.get("-N")
    per_node = sbatch.get("--ntasks-per-node")
    if nodes and per_node and (a := _int(nodes[0])) and (b := _int(per_node[0])):
        return a * b, per_node[1], "#SBATCH --nodes x --ntasks-per-node"
    return None


def sbatch_unsized(sbatch: dict[str, tuple[str, int]]) -> str | None:
    """What an #SBATCH header that names its nodes but not a number of tasks per node leaves
    out (`--ntasks-per-node=your_own_tasks_per_node`), in words; None when nothing is missing."""
    nodes = sbatch.get("--nodes") or sbatch.get("-N")
    if not nodes or sbatch_world_size(sbatch) is not None:
        return None
    per_node = [
        f"{key}={sbatch[key][0]} (line {sbatch[key][1]})"
        for key in ("--ntasks-per-node", "--gpus-per-node", "--gres")
        if key in sbatch
    ]
    return (
        f"#SBATCH --nodes={nodes[0]} (line {nodes[1]}) is read, but no number of tasks per "
        f"node: " + (", ".join(per_node) + " is not one" if per_node else "none is given")
    )


def parse_script(text: str, path: str) -> Script:
    """The training launches in a bash script, with its variables expanded symbolically."""
    interp = _Interp(path)
    try:
        toks = _case_as_if(_Lexer(text).lex())
        interp.run(toks)
    except ShellError as exc:
        from ..config import ConfigError

        raise ConfigError(f"{path}: cannot read the script: {exc}") from None
    except RecursionError:
        from ..config import ConfigError

        raise ConfigError(f"{path}: cannot read the script: too deeply nested") from None
    sbatch = _sbatch(text)
    for launch in interp.launches:
        _world_size(launch, sbatch)
    if interp.passes_args_line and interp.launches:
        interp.warnings.append(
            f"{path}:{interp.passes_args_line}: the command also gets the script's own "
            "arguments ($@): flags given there are not seen"
        )
    return Script(
        interp.launches, dict(interp.vars), interp.warnings, sbatch, interp.undecided_flags
    )


def _int(text: str) -> int | None:
    return int(text) if re.fullmatch(r"\d+", text.strip()) else None


def _opt(words: list[Field], names: tuple[str, ...]) -> tuple[str, int, str] | None:
    """The value of a launcher option (`--nnodes 2`, `--nnodes=2`), its line and name."""
    found = _opt_field(words, names)
    return (found[0].text, found[0].line, found[1]) if found else None


def _opt_field(words: list[Field], names: tuple[str, ...]) -> tuple[Field, str] | None:
    """The value of a launcher option as its field (with what it rests on), and the name."""
    found = None
    for k, f in enumerate(words):
        for name in names:
            if f.text == name and k + 1 < len(words):
                value = words[k + 1]
                found = (Field(value.text, f.line, value.rests_on), name)
            elif f.text.startswith(name + "="):
                found = (Field(f.text[len(name) + 1 :], f.line, f.rests_on), name)
    return found


def _launcher_world_size(launch: Launch, words: list[Field], texts: list[str]) -> None:
    """The deepspeed launcher's GPUs (`--num_gpus N` x `--num_nodes M`, or the devices of
    `--include host:0,1,2,3`) and `accelerate launch --num_processes N` (every process of the
    job; a --hostfile or an accelerate config file is not followed)."""
    if "accelerate" in texts:
        found = _opt(words, ("--num_processes", "--num-processes"))
        if found and (n := _int(found[0])):
            launch.world_size, launch.world_size_line, launch.world_size_key = n, *found[1:]
        return
    gpus = _opt(words, ("--num_gpus", "--num-gpus"))
    nodes = _opt(words, ("--num_nodes", "--num-nodes"))
    include = _opt(words, ("--include", "-i"))
    if gpus and (n := _int(gpus[0])):
        m = _int(nodes[0]) if nodes else 1
        if m:
            launch.world_size, launch.world_size_line = n * m, gpus[1]
            launch.world_size_key = " x ".join(x[2] for x in (gpus, nodes) if x)
    elif include and ":" in include[0]:
        # "localhost:4,5,6,7" or "worker-0:0,1@worker-1:0,1": the devices listed
        hosts = [h.split(":", 1)[1] for h in include[0].split("@") if ":" in h]
        launch.world_size = sum(len([d for d in h.split(",") if d]) for h in hosts)
        launch.world_size_line, launch.world_size_key = include[1], include[2]


def _world_size(launch: Launch, sbatch: dict[str, tuple[str, int]]) -> None:
    """GPUs in the job: torchrun / torch.distributed.launch nproc-per-node x nnodes, or srun /
    #SBATCH tasks (each task one rank)."""
    words = launch.launcher
    texts = [f.text.rsplit("/", 1)[-1] for f in words]
    torch_launch = any(
        t in ("torchrun", "torch.distributed.run", "torch.distributed.launch") for t in texts
    )
    if torch_launch:
        nproc = _opt(words, ("--nproc_per_node", "--nproc-per-node"))
        nnodes = _opt(words, ("--nnodes",))
        if not (nproc or nnodes) and any(f.unresolved for f in words):
            # `torchrun $DISTRIBUTED_ARGS`: the sizes are in a variable the script leaves
            # unset, not torchrun's default of one process
            return
        nproc_v = _int(nproc[0]) if nproc else 1
        nnodes_v = _int(nnodes[0]) if nnodes else 1
        if nproc and nproc_v:
            launch.gpus_per_node = (nproc_v, nproc[1], nproc[2])
        if nproc_v is not None and nnodes_v is not None:
            launch.world_size = nproc_v * nnodes_v
            launch.world_size_rests_on = tuple(
                dict.fromkeys(
                    r
                    for found in (nproc, nnodes)
                    if found
                    for r in _opt_field(words, (found[2],))[0].rests_on  # type: ignore[index]
                )
            )
            where = nproc or nnodes
            launch.world_size_line = where[1] if where else launch.line
            launch.world_size_key = " x ".join(x[2] for x in (nproc, nnodes) if x) or "torchrun"
        return
    if "deepspeed" in texts or "accelerate" in texts:
        _launcher_world_size(launch, words, texts)
        return
    # srun (and #SBATCH): one rank per task
    tasks = _opt(words, ("--ntasks", "-n"))
    per_node = _opt(words, ("--ntasks-per-node",))
    nodes = _opt(words, ("--nodes", "-N"))
    if "srun" not in texts and not (sbatch and "python" in " ".join(texts)):
        return

    def pick(found: tuple[str, int, str] | None, keys: tuple[str, ...]):
        if found:
            return found
        for key in keys:
            if key in sbatch:
                return (sbatch[key][0], sbatch[key][1], "#SBATCH " + key)
        return None

    tasks = pick(tasks, ("--ntasks", "-n"))
    per_node = pick(per_node, ("--ntasks-per-node",))
    nodes = pick(nodes, ("--nodes", "-N"))
    if per_node and (count := _int(per_node[0])):
        launch.gpus_per_node = (count, per_node[1], per_node[2])
    if tasks and _int(tasks[0]):
        launch.world_size, launch.world_size_line, launch.world_size_key = (
            _int(tasks[0]),
            tasks[1],
            tasks[2],
        )
    elif per_node and _int(per_node[0]):
        n = _int(nodes[0]) if nodes else 1
        if n:
            launch.world_size = n * _int(per_node[0])  # type: ignore[operator]
            launch.world_size_line = per_node[1]
            launch.world_size_key = " x ".join(x[2] for x in (nodes, per_node) if x)


def split_args(text: str) -> list[str]:
    """A plain argument list (no variables), split as the shell would."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()
