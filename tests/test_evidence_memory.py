"""memory_stats(), snapshots and `collect()` over several sources."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from evidence_texts import (
    ARGS_LOCAL_V014_FULL,
    DATA,
    MLM_756_ITERS,
    MLM_756_MEMORY,
    OOM_GEN1,
    OOM_GEN6,
    SEED_BRIDGE_COMMAND,
    SEED_EXPERIMENT_TABLE,
    GiB,
    MiB,
)

from recompute_kit.doctor.evidence import (
    ErrorEvent,
    Evidence,
    EvidenceError,
    Iteration,
    collect,
    load_snapshot,
    parse_log,
    parse_memory_stats,
    summarize_snapshot,
)

# =============================================================================================
# memory_stats and snapshots
# =============================================================================================


def test_memory_stats_real_json_and_repr():
    # json.dumps / print of torch.cuda.memory_stats() on an H100 (make_gpu_samples.py)
    for name in ("memory_stats.json", "memory_stats_repr.txt"):
        stats = parse_memory_stats((DATA / name).read_text())
        assert stats is not None, name
        assert stats["reserved_bytes.all.current"] == 83886080
        assert stats["inactive_split_bytes.all.current"] == 7337984
        assert stats["num_ooms"] == 3 and stats["num_alloc_retries"] == 3
        assert stats["fragmentation"] == 7337984 / 83886080
        assert stats["reserved_unallocated_bytes"] == 83886080 - 76548096


def test_memory_stats_nested_and_garbage():
    stats = json.loads((DATA / "memory_stats.json").read_text())
    nested = {
        "allocated_bytes": {"all": {"current": stats["allocated_bytes.all.current"]}},
        "reserved_bytes": {"all": {"current": stats["reserved_bytes.all.current"]}},
    }
    parsed = parse_memory_stats(json.dumps({"memory_stats": nested}))
    assert parsed["allocated_bytes.all.current"] == 76548096
    for garbage in ("", "{}", "[1, 2]", '{"a": 1}', "not a dict", OOM_GEN1):
        assert parse_memory_stats(garbage) is None


def test_snapshot_real_pickle():
    # torch.cuda.memory._dump_snapshot() on an H100 (make_gpu_samples.py)
    summary = load_snapshot(DATA / "cuda_snapshot.pickle")
    assert summary["segments"] == 4
    assert summary["total_reserved_bytes"] == 83886080  # = memory_stats reserved_bytes
    assert summary["total_allocated_bytes"] == 76548096  # = memory_stats allocated_bytes
    assert summary["inactive_split_bytes"] == 7337984  # = memory_stats inactive_split_bytes
    assert summary["largest_free_block_bytes"] == 5 << 20
    assert summary["fragmentation"] == 7337984 / 83886080
    assert summary["oom_trace_entries"] == 3


def _snapshot_dict() -> dict:
    """A dict shaped like torch.cuda.memory._snapshot() (fields as in section 6.2)."""
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    return {
        "segments": [
            {
                "address": 1 << 32,
                "total_size": 20 * MiB,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "allocated_size": 12 * MiB,
                "active_size": 12 * MiB,
                "blocks": [
                    {
                        "size": 8 * MiB,
                        "requested_size": 8 * MiB - 100,
                        "address": 1 << 32,
                        "state": "active_allocated",
                        "frames": frames,
                    },
                    {
                        "size": 6 * MiB,
                        "requested_size": 0,
                        "address": (1 << 32) + 8 * MiB,
                        "state": "inactive",
                        "frames": [],
                    },
                    {
                        "size": 4 * MiB,
                        "requested_size": 4 * MiB,
                        "address": (1 << 32) + 14 * MiB,
                        "state": "active_awaiting_free",
                        "frames": frames,
                    },
                    {
                        "size": 2 * MiB,
                        "requested_size": 0,
                        "address": (1 << 32) + 18 * MiB,
                        "state": "inactive",
                        "frames": [],
                    },
                ],
            },
            {
                "address": 1 << 34,
                "total_size": 2 * MiB,
                "stream": 0,
                "segment_type": "small",
                "segment_pool_id": (0, 0),
                "allocated_size": 0,
                "active_size": 0,
                "blocks": [
                    {
                        "size": 2 * MiB,
                        "requested_size": 0,
                        "address": 1 << 34,
                        "state": "inactive",
                        "frames": [],
                    }
                ],
            },
        ],
        "device_traces": [
            [
                {
                    "action": "alloc",
                    "addr": 1 << 32,
                    "size": 8 * MiB,
                    "stream": 0,
                    "frames": frames,
                },
                {
                    "action": "oom",
                    "addr": 0,
                    "size": 64 * GiB,
                    "stream": 0,
                    "frames": frames,
                    "device_free": 3 * MiB,
                },
            ]
        ],
    }


def test_snapshot_built_dict_pickle_and_json(tmp_path):
    data = _snapshot_dict()
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data))
    summary = load_snapshot(path)
    assert summary["segments"] == 2
    assert summary["total_reserved_bytes"] == 22 * MiB
    assert summary["total_allocated_bytes"] == 12 * MiB  # active_allocated + awaiting free
    assert summary["largest_free_block_bytes"] == 6 * MiB
    assert summary["inactive_split_bytes"] == 8 * MiB  # free blocks beside active ones only
    assert summary["fragmentation"] == 8 / 22
    assert summary["oom_trace_entries"] == 1 and summary["trace_entries"] == 2
    # the same snapshot saved as JSON (tuples become lists)
    json_path = tmp_path / "snap.json"
    json_path.write_text(json.dumps(data))
    assert load_snapshot(json_path) == summary
    assert summarize_snapshot(data["segments"])["total_reserved_bytes"] == 22 * MiB


class _Evil:
    """Unpickling this would run a shell command that creates a file."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.target}",))


def test_snapshot_refuses_any_global_and_runs_nothing(tmp_path):
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": _Evil(target)}))
    with pytest.raises(EvidenceError) as info:
        load_snapshot(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"refusing to load snapshot '{path}': it references os.system")
    assert "plain containers" in message
    assert not target.exists()
    # builtins.eval through a protocol-0 pickle (GLOBAL opcode)
    path.write_bytes(b"cbuiltins\neval\n(S'1+1'\ntR.")
    with pytest.raises(EvidenceError, match=r"references builtins\.eval"):
        load_snapshot(path)
    # a class instance (even a harmless one) is not a snapshot either
    path.write_bytes(pickle.dumps({"segments": [], "p": Path("x")}))
    with pytest.raises(EvidenceError, match="refusing to load snapshot"):
        load_snapshot(path)


def test_snapshot_corrupt_truncated_missing(tmp_path):
    blob = (DATA / "cuda_snapshot.pickle").read_bytes()
    path = tmp_path / "cut.pickle"
    for cut in (1, 10, len(blob) // 2, len(blob) - 1):
        path.write_bytes(blob[:cut])
        with pytest.raises(EvidenceError) as info:
            load_snapshot(path)
        assert "\n" not in str(info.value) and "snapshot" in str(info.value)
    path.write_bytes(b"\x00garbage\xff" * 10)
    with pytest.raises(EvidenceError):
        load_snapshot(path)
    path.write_bytes(pickle.dumps([1, 2, 3]))  # plain, but not a snapshot
    assert load_snapshot(path)["segments"] == 0
    path.write_bytes(pickle.dumps("just a string"))
    with pytest.raises(EvidenceError, match="not a memory snapshot"):
        load_snapshot(path)
    for broken in ("{broken json", "[" * 100_000):
        path.write_text(broken)
        with pytest.raises(EvidenceError, match="not valid JSON"):
            load_snapshot(path)
    with pytest.raises(
        EvidenceError, match=r"^cannot read snapshot '.*nope\.pickle': No such file"
    ):
        load_snapshot(tmp_path / "nope.pickle")


# =============================================================================================
# collect()
# =============================================================================================


def test_collect_everything(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(ARGS_LOCAL_V014_FULL + MLM_756_MEMORY + OOM_GEN6)
    config = tmp_path / "run.sh"
    config.write_text("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True " + SEED_BRIDGE_COMMAND)
    experiments = tmp_path / "results.md"
    experiments.write_text(SEED_EXPERIMENT_TABLE)
    evidence = collect(
        logs=[str(log), "-"],
        config=str(config),
        experiments=str(experiments),
        memory_stats=str(DATA / "memory_stats.json"),
        snapshot=str(DATA / "cuda_snapshot.pickle"),
        stdin_text=MLM_756_ITERS,
    )
    assert isinstance(evidence, Evidence)
    assert len(evidence.oom) == 1 and evidence.oom[0].rank == 97
    assert [i.iteration for i in evidence.iterations] == [2, 3, 71, 72, 73]
    # the log's argument dump, then the config file (later keys win)
    assert evidence.config["recompute_granularity"] == "selective"
    assert evidence.config["recompute_modules"] == ["core_attn", "layernorm"]
    assert evidence.config["world_size"] == 8
    assert evidence.env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert len(evidence.experiments) == 4
    assert evidence.memory_stats["num_ooms"] == 3
    assert evidence.snapshot["segments"] == 4
    assert evidence.sources == [
        f"log:{log}",
        "log:<stdin>",
        f"config:{config}",
        f"experiments:{experiments}",
        f"memory_stats:{DATA / 'memory_stats.json'}",
        f"snapshot:{DATA / 'cuda_snapshot.pickle'}",
    ]
    json.dumps(evidence.to_json())  # JSON-ready


def test_collect_errors_are_one_line(tmp_path):
    with pytest.raises(EvidenceError) as info:
        collect(logs=["x"])
    assert str(info.value) == "cannot read log 'x': No such file or directory"
    with pytest.raises(EvidenceError, match=r"^cannot read config '.*': Is a directory$"):
        collect(config=str(tmp_path))
    with pytest.raises(EvidenceError, match=r"cannot read experiments 'missing\.csv'"):
        collect(experiments="missing.csv")
    with pytest.raises(EvidenceError, match="from stdin"):
        collect(config="-")
    empty = tmp_path / "empty.json"
    empty.write_text("")
    evidence = collect(memory_stats=str(empty), config=str(empty))
    assert evidence.memory_stats is None and evidence.config == {}
    assert len(evidence.notes) == 2


def test_evidence_merge_and_json():
    a = parse_log(OOM_GEN1)
    b = parse_log(MLM_756_ITERS)
    merged = a.merge(b)
    assert len(merged.oom) == 1 and len(merged.iterations) == 3
    assert isinstance(merged.errors[0], ErrorEvent) and isinstance(merged.iterations[0], Iteration)
    assert json.loads(json.dumps(merged.to_json()))["oom"][0]["generation"] == "gen1_cached"
