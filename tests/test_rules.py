"""The rule catalog itself, and the default readings when no specific rule fires (RK170,
RK171, RK190, RK191). Texts and sources: tests/rule_helpers.py."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from rule_helpers import (
    COVERED,
    DATA,
    SOURCES,
    run,
    text,
)

from recompute_kit.doctor.evidence import (
    parse_config,
)
from recompute_kit.doctor.rules import (
    CATEGORIES,
    RULES,
    catalog_markdown,
)

# =============================================================================================
# The catalog itself
# =============================================================================================


def test_rule_ids_are_unique_and_well_formed():
    found = [r.id for r in RULES]
    assert len(found) == len(set(found)), "duplicate rule ids"
    assert all(re.fullmatch(r"RK\d{3}", i) for i in found)
    assert found == sorted(found), "rules are listed in id order"
    assert len(RULES) >= 49


def test_rule_categories_and_docs_are_valid():
    assert len(CATEGORIES) == len(set(CATEGORIES))
    for r in RULES:
        assert r.category in CATEGORIES, (r.id, r.category)
        for part in (r.title, r.symptom, r.cause, r.confirm, r.fix):
            assert part.strip(), (r.id, "empty documentation")
        assert isinstance(r.config_patch, dict)
        assert set(r.supersedes) <= {x.id for x in RULES}, (r.id, r.supersedes)
        assert r.id not in r.supersedes
        doc = r.doc()
        assert doc["rule"] == r.id and doc["category"] == r.category


def test_catalog_markdown_lists_every_rule_in_a_well_formed_table():
    md = catalog_markdown()
    lines = md.splitlines()
    header = "| id | category | symptom | cause | confirm | fix |"
    start = lines.index(header)
    assert lines[start + 1] == "|---|---|---|---|---|---|"
    rows = [line for line in lines[start + 2 :] if line.startswith("| RK")]
    assert len(rows) == len(RULES)
    assert f"{len(RULES)} rules." in md
    for r, row in zip(RULES, rows, strict=True):
        assert row.startswith(f"| {r.id} | {r.category} | **")
        assert row.endswith(" |")
        # six cells: split on unescaped pipes only
        cells = re.split(r"(?<!\\)\|", row)[1:-1]
        assert len(cells) == 6, (r.id, cells)
        assert "\n" not in row
    # a pipe inside a cell is escaped, not a column break
    assert all(r.id in md for r in RULES)


def test_every_rule_has_a_named_test():
    # The tests live in several files: import them all (already imported ones are reused), so
    # that a run of this file alone sees every `covers`.
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        if not path.stem.startswith(("test_rules_", "test_known_problems")):
            continue
        importlib.import_module(path.stem)
    missing = sorted({r.id for r in RULES} - set(COVERED))
    assert not missing, f"rules without a test: {missing}"
    unknown = sorted(set(COVERED) - {r.id for r in RULES})
    assert not unknown, f"tests name unknown rules: {unknown}"


def test_sources_exist_for_every_data_file():
    files = {p.stem for p in DATA.glob("*.txt")}
    assert files == set(SOURCES), files ^ set(SOURCES)


def test_shell_variable_with_flags_on_its_first_line_is_read_where_expanded():
    # The same script's GPT_ARGS block as users paste it with the first flag on the opening
    # line (the quote, then --num-layers): read where the launch line expands $GPT_ARGS, a
    # flag before it not taking "$GPT_ARGS" as its value.
    script = text("i22-mlm-pretrain-gpt-distributed")
    block = script[script.index("GPT_ARGS=") : script.index("DATA_ARGS=")]
    block = block.replace('GPT_ARGS="\n    --num-layers', 'GPT_ARGS="--num-layers')
    pasted = block + "torchrun pretrain_gpt.py --use-distributed-optimizer $GPT_ARGS\n"
    for flat in (parse_config(pasted, "run.sh"), run(pasted).evidence.config):
        assert flat["num_layers"] == 24 and flat["micro_batch_size"] == 8
        assert flat["use_distributed_optimizer"] is True
