"""Collecting everything: all the parsers over the given paths, merged into one `Evidence`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from ...sources.fragments import NO_KEYS, parse_config_with_notes
from ..symptoms import quotes as symptom_quotes
from .cjk import translate_cjk
from .code import MAX_SNIPPET_BYTES, scan_snippets
from .experiments import parse_experiments
from .known_lines import scan_known_lines
from .logs import _LogParser, parse_log, parse_log_file
from .memory_stats import parse_memory_stats
from .pasted import parse_pasted_settings
from .schema import MAX_TEXT_BYTES, Evidence, EvidenceError
from .snapshots import _load_snapshot_bytes, load_snapshot
from .text import clean_line, config_artefact_text, strip_comments
from .unwrap import unwrap
from .versions import scan_versions

# --------------------------------------------------------------------------------------------
# Collecting everything
# --------------------------------------------------------------------------------------------


def _read_text(path: str, what: str, stdin_text: str | None) -> str:
    if path == "-":
        if stdin_text is None:
            raise EvidenceError(f"cannot read {what} from stdin: nothing was given")
        return stdin_text
    try:
        with open(path, "rb") as fh:
            blob = fh.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise EvidenceError(f"cannot read {what} '{path}': {exc.strerror or exc}") from None
    if len(blob) > MAX_TEXT_BYTES:
        raise EvidenceError(f"cannot read {what} '{path}': larger than {MAX_TEXT_BYTES} bytes")
    return blob.decode("utf-8", errors="replace")


MAX_TABLE_SCAN_BYTES = 2 << 20  # pasted tables live in short logs, not in 100 MB ones


def _short_log_text(log: str, stdin_text: str | None) -> str:
    """The whole text of a short log ("" for one over MAX_TABLE_SCAN_BYTES): pasted tables and
    snippets live in short logs, not in 100 MB ones."""
    if log == "-":
        text = stdin_text or ""
        return text if len(text) <= MAX_TABLE_SCAN_BYTES else ""
    try:
        if Path(log).stat().st_size > MAX_TABLE_SCAN_BYTES:
            return ""  # (not read to find out: a 100 MB log is streamed once, by the parser)
        with open(log, "rb") as fh:
            blob = fh.read(MAX_TABLE_SCAN_BYTES + 1)
    except OSError:
        return ""
    if len(blob) > MAX_TABLE_SCAN_BYTES:
        return ""
    return blob.decode("utf-8", errors="replace")


def _tables_in_log(text: str) -> list[dict]:
    """Experiment rows from Markdown tables pasted into a (short) log: issue threads paste the
    ablation table next to the error."""
    if "|---" not in text and "| ---" not in text and "|:--" not in text:
        return []
    # rank / timestamp / quote prefixes off, as every other parser reads the lines
    return parse_experiments("\n".join(clean_line(x) for x in text.splitlines()), "log.md")


def _snippets(text: str, source: str) -> Evidence:
    """Facts from pasted code, prose and tables (evidence/code.py); JSON config sections
    pasted into a log become config keys (a given config file overrides them)."""
    facts = {**scan_snippets(text), **scan_versions(text)} if len(text) <= MAX_SNIPPET_BYTES else {}
    known = scan_known_lines(text) if len(text) <= MAX_SNIPPET_BYTES else {}
    if known:
        facts["known_lines"] = known
    if source == "log" and len(text) <= MAX_SNIPPET_BYTES:
        said = symptom_quotes(text)  # what the user says is wrong (doctor/symptoms.py)
        if said:
            facts["symptoms"] = list(said)
            facts["symptom_lines"] = said
    part = Evidence()
    if facts:
        part.facts = {source: facts}
        if source == "log":
            # recompute flags of a command line pasted into the log, then config sections
            part.config = {**facts.get("recompute_flags", {}), **facts.get("json_config", {})}
    return part


def _scan_env(text: str) -> dict[str, str]:
    parser = _LogParser()
    for line in text.splitlines():
        if "ALLOC_CONF" in line:
            parser._env(line)
    return parser.ev.env


# The parallel layout Megatron prints (its argument dump, its `using world size` line): what
# the run ran with, where a launch script leaves the world to the scheduler's environment.
PRINTED_LAYOUT_KEYS = (
    "world_size",
    "data_parallel_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


def _read_config_files(
    paths: list[str], overrides: dict | None = None, model: str | None = None
) -> Evidence:
    """The config files through the shared reader, as every command reads them: its values
    (what the files and the named model say, with the framework's semantics) win over the
    paste reader's for the keys both know; what it cannot read is a note, never an error."""
    from ...config import ConfigError
    from ...sources.resolve import resolve

    notes = []
    try:
        resolved = resolve(paths, model=model, require_shape=False, overrides=overrides or None)
    except ConfigError as exc:
        if not (model and paths):
            return Evidence(notes=[f"config: {exc}"])
        # the model named beside the files could not be had: the files are still read
        notes.append(f"config: --model {model} not applied: {exc}")
        try:
            resolved = resolve(paths, require_shape=False, overrides=overrides or None)
        except ConfigError as again:
            return Evidence(notes=[*notes, f"config: {again}"])
    reading = resolved.reading
    said = {
        key: value
        for key, value in reading.values.items()
        if reading.origins[key].kind in ("file", "model")
    }
    evidence = Evidence(config=said, read=resolved.to_json(), notes=notes)
    # what the reader decided (its defaults too) for the keys it knows (collect: a recipe's)
    evidence.facts["reader_values"] = dict(reading.values)
    return evidence



def _unwrapped(text: str) -> str:
    """`text` with its hard-wrapped lines joined back (evidence/unwrap.py); where most lines
    carry a prefix (`[rank3]: `, a logger's stamp, quote markers) the wrap is found without
    them, and a prefix every line shares is put back on each joined line (the rank it says)."""
    lines = text.splitlines()
    cleaned = [clean_line(line) for line in lines]
    pairs = [(a, b) for a, b in zip(lines, cleaned, strict=True) if a.strip() and a.strip() != b]
    nonblank = sum(1 for line in lines if line.strip())
    if not nonblank or len(pairs) * 2 <= nonblank:
        return unwrap(text)
    stripped = "\n".join(cleaned)
    joined = unwrap(stripped)
    if joined == stripped:
        return unwrap(text)  # nothing wrapped: the paste as it is, prefixes and all
    prefixes = {a[: a.find(b)] if b and b in a else None for a, b in pairs}
    shared = next(iter(prefixes)) if len(prefixes) == 1 else None
    return "\n".join(f"{shared}{line}" for line in joined.splitlines()) if shared else joined


def collect(
    logs: Iterable[str] = (),
    config: str | list[str] | None = None,
    experiments: str | None = None,
    memory_stats: str | None = None,
    snapshot: str | None = None,
    stdin_text: str | None = None,
    overrides: dict | None = None,
    model: str | None = None,
) -> Evidence:
    """All the evidence from the given paths ("-" reads `stdin_text`), merged in this order:
    logs, config (YAML/JSON or a plain-text command line), experiments, memory stats, snapshot.
    `overrides` (Megatron keys: the command line's --dp, --tp, ...) win over the config files
    (and `model`, a model id or preset, gives the shape where they give none),
    and the parallel layout the log prints (Megatron's arguments) wins over what the files
    leave to the launcher.

    Raises EvidenceError with one line (`cannot read log 'x': No such file or directory`) when
    a file cannot be read, and for unsafe or corrupt snapshots. Unparsable content is noted."""
    evidence = Evidence()
    for log in logs:
        # a short log is read whole, its hard-wrapped lines joined back (evidence/unwrap.py),
        # Chinese descriptions given their English wording alongside (evidence/cjk.py)
        text = _short_log_text(log, stdin_text)
        flat = translate_cjk(_unwrapped(text)) if text else text
        if log == "-" or flat != text:
            part = parse_log(flat if flat != text else _read_text(log, "log", stdin_text))
            part.sources.append("log:<stdin>" if log == "-" else f"log:{log}")
            text = flat
        else:
            part = parse_log_file(log)
        part.experiments += _tables_in_log(text)
        pasted = parse_pasted_settings(text) if text else {}
        if pasted:  # what the log parser (and later an explicit --config) read wins
            part.config = {**pasted, **part.config}
        part = _snippets(text, "log").merge(part)  # the log's own config keys win
        evidence = evidence.merge(part)
    from ...sources.nemo_rl_overrides import is_override
    from ...sources.resolve import file_of, is_launch_command, script_call

    configs = [config] if isinstance(config, str) else list(config or [])
    # keys a scan of a Python recipe's text found: it reads every function of the file, the
    # shared reader the one that runs (its reading, defaults too, replaces the scan's)
    scanned: set[str] = set()
    for one in configs:
        if is_override(one):  # `FILE key=value`: the shared reader applies it to the file
            continue
        called = script_call(one) if one != "-" else None  # 'run.sh ARGS': the script's text
        name = str(called.script) if called else file_of(one)  # recipe.py::function: recipe.py
        # a launch command given as one input is its own text
        command = one != "-" and is_launch_command(one)
        text = one if command else _read_text(name, "config", stdin_text)
        flat, notes = parse_config_with_notes(text, "" if one == "-" else one)
        label = "<stdin>" if one == "-" else one
        # what the file states, without comments (documentation, not evidence)
        stated = config_artefact_text(text)
        env = _scan_env(strip_comments(text))
        if called is None and one != "-" and not command:
            # a file whose command runs a script (`CONFIG=x ./run_train.sh ...`): the
            # environment that script sets is the run's too (run_train.sh's
            # PYTORCH_ALLOC_CONF="expandable_segments:True")
            runs = script_call(one, text)
            if runs is not None:
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    env = {**_scan_env(strip_comments(runs.text())), **env}
        if file_of(one).endswith(".py"):
            scanned.update(flat)
        part = Evidence(config=flat, env=env, sources=[f"config:{label}"])
        part.notes = [f"config {label}: {n}" for n in notes if not n.startswith("read as")]
        part.facts = _snippets(stated, "config").facts
        evidence = evidence.merge(part)
    # (an empty file was said above; the shared reader reads the others)
    files = [
        c
        for c in configs
        if is_override(c)
        or script_call(c)
        or (c != "-" and (is_launch_command(c) or Path(file_of(c)).stat().st_size))
    ]
    # a log that prints Megatron's arguments prints the settings the run ran with: read after
    # the config files, it wins over their defaults (the attention path, TE or not); with no
    # config file it is the config (a skill trial's log-only doctor missed the vocabulary the
    # dump prints and read the OOM in the loss as the logits' fault)
    files += [log for log in logs if _prints_the_arguments(log)]
    if files or model:  # (a model id alone gives the shape: a prose paste names its model)
        layout = _layout(evidence, overrides)
        read = _read_config_files(files, layout, model)
        decided = read.facts.pop("reader_values", {})
        for key in scanned & set(decided):
            evidence.config[key] = decided[key]  # the reader's reading of the same files
        # a file the shared reader read (a launch command naming the YAML it runs) is no
        # input problem, whatever the paste reader found in it
        taken = {
            f"config {i.get('path')}: {NO_KEYS}" for i in (read.read or {}).get("inputs") or []
        }
        evidence.notes = [n for n in evidence.notes if n not in taken]
        evidence = evidence.merge(read)
    if experiments is not None:
        text = _read_text(experiments, "experiments", stdin_text)
        label = "<stdin>" if experiments == "-" else experiments
        rows = parse_experiments(text, "" if experiments == "-" else experiments)
        part = Evidence(experiments=rows, sources=[f"experiments:{label}"])
        if not rows:
            part.notes.append(f"experiments {label}: no result rows found")
        evidence = evidence.merge(part)
    if memory_stats is not None:
        text = _read_text(memory_stats, "memory stats", stdin_text)
        label = "<stdin>" if memory_stats == "-" else memory_stats
        stats = parse_memory_stats(text)
        part = Evidence(memory_stats=stats, sources=[f"memory_stats:{label}"])
        if stats is None:
            part.notes.append(f"memory stats {label}: not a torch.cuda.memory_stats() dump")
        evidence = evidence.merge(part)
    if snapshot is not None:
        if snapshot == "-":
            text = _read_text(snapshot, "snapshot", stdin_text)
            summary = _load_snapshot_bytes(text.encode("utf-8"), "<stdin>")
        else:
            summary = load_snapshot(snapshot)
        label = "<stdin>" if snapshot == "-" else snapshot
        evidence = evidence.merge(Evidence(snapshot=summary, sources=[f"snapshot:{label}"]))
    return evidence


_DUMP_READ_BYTES = 20 * 2**20  # a longer log gives its printed layout only (_layout)


def _prints_the_arguments(log: str) -> bool:
    """A log file (not stdin, not too long to read twice) with Megatron-LM's arguments dump."""
    from ...sources import megatron_dump

    if log == "-" or not Path(log).is_file() or Path(log).stat().st_size > _DUMP_READ_BYTES:
        return False
    from ...sources.resolve import LOG_HEAD_BYTES  # (what the reader reads of a long log)

    with open(log, encoding="utf-8", errors="replace") as handle:
        head = handle.read(LOG_HEAD_BYTES)
    return megatron_dump.sniff(head, log) >= 85


def _layout(evidence: Evidence, overrides: dict | None) -> dict:
    """The overrides for the config files: the log's printed layout, then the command line's."""
    printed = evidence.facts.get("args_dump") or {}
    layout = {k: printed[k] for k in PRINTED_LAYOUT_KEYS if isinstance(printed.get(k), int)}
    if layout:
        said = ", ".join(f"{k} {v}" for k, v in layout.items())
        evidence.notes.append(f"the log prints the layout Megatron ran with ({said}): it is used")
    return {**layout, **(overrides or {})}
