"""The parsers never raise (property-based, hostile inputs) and stream a 100 MB log."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from evidence_texts import (
    ARGS_LOCAL_V014_FULL,
    ARGS_NCCL_743,
    CKPT_METADATA,
    CKPT_USE_REENTRANT_MISSING,
    GPU_OOMS,
    MB_PR841,
    MLM_756_ITERS,
    MLM_756_MEMORY,
    NEMO_14850,
    OOM_CASES,
    OOM_GEN1,
    OOM_GEN4,
    OOM_GEN5,
    OOM_GEN6,
    OOM_MESSAGES,
    SEED_BRIDGE_COMMAND,
    SEED_EXPERIMENT_TABLE,
    SEED_PROVIDER_MODULES,
    TC_SELECTIVE_BAD_MODULE,
    GiB,
    MiB,
    all_parsers,
    check_oom,
    nbytes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recompute_kit.doctor.evidence import (
    Evidence,
    parse_config,
    parse_experiments,
    parse_log,
    parse_log_file,
    parse_oom,
)

# =============================================================================================
# Never raise: property-based
# =============================================================================================

REAL_LINES = [
    line
    for block in (
        OOM_GEN4,
        OOM_GEN6,
        MLM_756_ITERS,
        MLM_756_MEMORY,
        MB_PR841,
        NEMO_14850,
        ARGS_LOCAL_V014_FULL,
        CKPT_METADATA,
        TC_SELECTIVE_BAD_MODULE,
        GPU_OOMS["plain"]["traceback"],
        SEED_EXPERIMENT_TABLE,
        SEED_PROVIDER_MODULES,
        SEED_BRIDGE_COMMAND,
    )
    for line in block.splitlines()
]
NOISE = [
    "",
    "[rank3]: ",
    " 0: ",
    "\x1b[31m",
    "\x1b[0m",
    "Traceback (most recent call last):",
    '  File "x.py", line 1, in f',
    "\r",
    "\t",
    "---",
    "|",
    "{",
    "[",
    "=",
    "\\",
]
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_random_log = st.lists(
    st.one_of(
        st.sampled_from(REAL_LINES),
        st.sampled_from(REAL_LINES).map(lambda s: s[: len(s) // 2]),
        st.sampled_from(NOISE),
        st.text(max_size=80),
    ),
    max_size=40,
).map("\n".join)
_random_bytes = st.binary(max_size=2000).map(lambda b: b.decode("utf-8", errors="replace"))


@_SETTINGS
@given(st.text(max_size=3000))
def test_random_text_never_raises(text):
    all_parsers(text)


@_SETTINGS
@given(_random_bytes)
def test_random_bytes_never_raise(text):
    all_parsers(text)


@_SETTINGS
@given(_random_log)
def test_shuffled_real_lines_never_raise(text):
    all_parsers(text)
    json.dumps(parse_log(text).to_json())


def test_empty_input():
    all_parsers("")
    assert parse_log("") == Evidence()
    assert parse_oom("") == [] and parse_config("") == {} and parse_experiments("") == []


@pytest.mark.parametrize(
    "block",
    [
        OOM_GEN1,
        OOM_GEN4,
        OOM_GEN6,
        MB_PR841,
        ARGS_LOCAL_V014_FULL,
        CKPT_METADATA,
        SEED_PROVIDER_MODULES,
    ],
)
def test_truncations_at_every_position_never_raise(block):
    step = max(1, len(block) // 400)
    for cut in range(0, len(block) + 1, step):
        all_parsers(block[:cut])


def test_long_hostile_lines_stay_linear():
    """Long lines built to make careless regexes backtrack (runs of spaces before the end of
    a pattern, long words, repeated labels): all parsers stay fast."""
    n = 20_000
    hostile = [
        "  a ... v" + " " * n + "x",
        "[Rank 0]" + " " * n + "x memory (MB) | allocated: 1",
        "using world size " + "a" * n,
        "cfg.a = 1" + " " * n + "x",
        '  File "x' + " " * n + 'y", line 1, in f' + " " * n + "z",
        "x " + "a." * n + " Error",
        "a:" * n + "Error",
        "a:1: " * (n // 4) + "UserWarning: x",
        "CUDA out of memory. Tried to allocate " + "1 " * n,
        "iteration 1/2 |" + " elapsed time per iteration (ms):" * 600 + "x" * n,
        "iteration 1/ 2 |" + "a: b |" * (n // 4),
        "Tried to allocate " + "9" * n + " MiB",
        "a.b=" + "[" * n,
    ]
    start = time.process_time()  # CPU: immune to load
    for text in hostile:
        all_parsers(text)
    assert time.process_time() - start < 5.0


# =============================================================================================
# A 100 MB log, streamed
# =============================================================================================


def _write_big_log(path: Path, size: int) -> None:
    """Real lines repeated with noise (rank prefixes, ANSI, timestamps, NeMo lines, argument
    dumps, warnings), and one hard-wrapped OOM of rank 97 in the middle."""
    iters = MLM_756_ITERS.splitlines()
    unit: list[str] = []
    for i in range(20):
        for line in iters:
            unit.append(f"[rank{i % 8}]: \x1b[32m{line}\x1b[0m" if i % 4 == 0 else line)
    unit += MLM_756_MEMORY.splitlines() + NEMO_14850.splitlines() + ARGS_NCCL_743.splitlines()
    unit += CKPT_USE_REENTRANT_MISSING.splitlines()
    unit += [f"2025-01-01 12:00:0{i}.123 INFO step {i} done" for i in range(10)]
    chunk = ("\n".join(unit) + "\n").encode()
    oom = "\n".join("[rank97]: " + part for part in textwrap.wrap(OOM_MESSAGES["gen6"], 80))
    written = 0
    with path.open("wb") as fh:
        while written < size:
            fh.write(chunk)
            written += len(chunk)
            if written - len(chunk) < size // 2 <= written:
                fh.write(oom.encode() + b"\n")


def test_100mb_log_streams_fast(tmp_path):
    path = tmp_path / "big.log"
    _write_big_log(path, 100 * 2**20)
    assert path.stat().st_size >= 100 * 2**20
    # CPU time of this process: the parse is single-threaded, and a loaded machine stretches
    # wall time without changing the work done.
    start = time.process_time()
    evidence = parse_log_file(path)
    elapsed = time.process_time() - start
    print(f"parse_log_file: {path.stat().st_size / 2**20:.0f} MiB in {elapsed:.2f} s of CPU")
    assert elapsed < 10.0
    (oom,) = evidence.oom
    assert oom.rank == 97 and oom.requested_bytes == nbytes(48.00, MiB)
    assert oom.total_bytes == nbytes(139.81, GiB) and not oom.truncated
    assert len(evidence.iterations) > 200_000
    assert evidence.errors[0].count > 1000  # the repeated warning, counted once
    assert evidence.config["lr"] == 0.0001


def test_streamed_lines_across_tiny_chunks():
    import io

    from recompute_kit.doctor.evidence.text import _iter_file_lines

    # real lines (ex-nemo-14850 has trailing spaces, gen4 is hard-wrapped) with CRLF, CR,
    # multi-byte characters and a line longer than the limit, read 7 bytes at a time
    text = NEMO_14850.replace("\n", "\r\n") + "µ—✓\r" + OOM_GEN4 + "y" * 70_000 + "\nend"
    expected = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    expected = [line[: 1 << 16] for line in expected]
    for chunk_size in (2, 3, 7, 64):
        got = list(_iter_file_lines(io.BytesIO(text.encode()), chunk_size=chunk_size))
        assert got == expected, chunk_size


def test_log_file_gzip_crlf_and_long_lines(tmp_path):
    import gzip

    path = tmp_path / "train.log.gz"
    text = MLM_756_ITERS.replace("\n", "\r\n") + ("x" * 200_000) + "\n" + OOM_GEN5
    with gzip.open(path, "wt") as fh:
        fh.write(text)
    evidence = parse_log_file(path)
    assert [i.iteration for i in evidence.iterations] == [71, 72, 73]
    check_oom(evidence.oom[0], *OOM_CASES["gen5"][1:])
    assert evidence.sources == [f"log:{path}"]


def test_checkpoint_metadata_with_a_scalar_shape():
    # Verbatim lines from https://github.com/NVIDIA-NeMo/RL/pull/1676 (a 0-d tensor's shape is
    # torch.Size([]); the parser crashed on the empty shape).
    from recompute_kit.doctor.evidence.code import scan_snippets

    text = (
        "saved metadata: {'shape': torch.Size([]), 'dtype': torch.int64, 'device': "
        "device(type='cuda', index=0)}\n"
        "recomputed metadata: {'shape': torch.Size([2]), 'dtype': torch.uint64, 'device': "
        "device(type='cuda', index=0)}\n"
    )
    assert scan_snippets(text)["metadata_pairs"] == [("", "int64", "2", "uint64")]
