"""The reader on the corpus of real artefacts (tests/sources/corpus/): every expected value
read right or said as an assumption, every memory-relevant value accounted for, and a file
with no model shape refused with one line naming what to add."""

from __future__ import annotations

import pytest
from reader_corpus import cases, score

from recompute_kit.config import ConfigError
from recompute_kit.sources import formats
from recompute_kit.sources.reading import (
    ARCHITECTURE_KEYS,
    MEMORY_KEYS,
    ORIGIN_KINDS,
    SHAPE_KEYS,
)
from recompute_kit.sources.resolve import resolve

CASES = cases()


def test_the_corpus_has_four_files_per_format_and_both_splits():
    per_dir: dict[str, int] = {}
    for case in CASES:
        per_dir[case.path.parent.name] = per_dir.get(case.path.parent.name, 0) + 1
    assert len(CASES) >= 40
    assert all(n >= 4 for n in per_dir.values()), per_dir
    assert {c.split for c in CASES} == {"development", "held-out"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_expected_value_is_read(case):
    result = score(case)
    assert result.error is None and not result.wrong, result.error or result.wrong


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_memory_value_has_an_origin(case):
    resolved = resolve(case.inputs, model=case.expect.get("model"), require_shape=False)
    origins = resolved.reading.origins
    missing = [k for k in MEMORY_KEYS if k not in origins]
    if resolved.config is None:  # no model: its shape and architecture are never assumed
        missing = [k for k in missing if k not in SHAPE_KEYS and k not in ARCHITECTURE_KEYS]
    assert not missing, missing
    assert all(o.kind in ORIGIN_KINDS for o in origins.values())
    if resolved.config is None:  # no shape: the commands that need one refuse it in one line
        with pytest.raises(ConfigError, match=r"no model shape|config\.json") as info:
            resolve(case.inputs, model=case.expect.get("model"))
        assert "\n" not in str(info.value)
    for key in SHAPE_KEYS:  # the shape is read or refused, never a default
        assert key not in origins or origins[key].kind in ("file", "model", "argument"), key


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_file_is_read_as_its_framework(case):
    module = formats.best_format(case.path.read_text(), str(case.path))
    reading = module.read(case.path.read_text(), str(case.path))
    assert reading.framework == case.expect["framework"]
    unlined = [
        key for key, o in reading.origins.items()
        if o.kind == "file" and not o.where.rsplit(":", 1)[-1].isdigit()
    ]
    assert not unlined, f"values read without their line: {unlined}"
