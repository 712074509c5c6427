"""The doctor on the real-case corpus (tests/corpus/cases/*.yaml; see recompute_kit.doctor.corpus).

Each case is a public issue or forum thread: its URL, the text pasted there (run as the log), the
config when the thread has one, the maintainers' diagnosis as a category and the settings a
correct fix names. The split into development and held-out cases is fixed by a hash of the URL;
rules are written against the development cases only.

The table (per split and category: top-1 category accuracy, and "the top finding's fix names the
right setting") is printed (`pytest -s`) and written as JSON to the test's tmp dir. The floors are
the values measured when the test was written, rounded down to 5 points; raise them as the rules
improve. `benchmarks/doctor_corpus.py` prints the same table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus_scoring import format_table, load_cases, score, split_of, table

from recompute_kit.doctor.rules import CATEGORIES

CASES = Path(__file__).parent / "corpus" / "cases"

# Measured on 2026-11-23 on 163 cases after the default readings RK170/RK171 (dev 75/94 =
# 79.8% top-1, 77/94 = 81.9% fix; held-out 25/69 = 36.2% top-1, 25/69 = 36.2% fix), rounded
# down to 5 points. Before them: dev 68/94 and 70/94, held-out 24/69 and 23/69; before the
# memory-category rules: dev 46/94 and 48/94, held-out 21/69 and 19/69; before issue 12's
# rules: dev 13/94 and 10/94, held-out 14/69 and 11/69.
# The corpus then grew by 18 cases (d_*: 11 dev, 7 held-out) and rules RK190/RK191 were written
# against the new dev ones: on 181 cases dev 79/105 = 75.2% top-1, 82/105 = 78.1% fix; held-out
# 26/76 = 34.2%, 26/76 = 34.2% (old cases unchanged: dev 75/94, 77/94; held-out 25/69, 25/69).
# The dev fix floor and both held-out floors are lowered to those values rounded down to 5
# points: the corpus changed, not the rules. With RK220 and the knob-based advice merged: dev
# 81/105 = 77.1% top-1, 84/105 = 80.0% fix; held-out 26/76 = 34.2%, 26/76 = 34.2%.
# The corpus then grew by 22 cases (e_*: 14 dev, 8 held-out) weighted to framework bugs,
# logits, model states and recompute overhead; before any rule for them: dev 82/119 = 68.9%,
# 86/119 = 72.3%; held-out 26/84 = 31.0%, 27/84 = 32.1%. Rules RK230-RK236 (rules/measured.py)
# were written against the new dev cases: dev 92/119 = 77.3% top-1, 96/119 = 80.7% fix;
# held-out 26/84 = 31.0%, 28/84 = 33.3%. The floors stand (the corpus changed, the measured
# values stay above them).
# With the general readings RK260-RK266, sizes stated in prose and the ranking fixes (branch
# docgen): dev 91/105 = 86.7% top-1, 94/105 = 89.5% fix; held-out 27/76 = 35.5%, 28/76 =
# 36.8% (held-out scored once, at the end).
# Both merged (203 cases): dev 101/119 = 84.9% top-1, 105/119 = 88.2% fix; held-out 27/84 =
# 32.1%, 30/84 = 35.7%.
# The corpus then grew by 12 cases (f_*: 4 dev, 8 held-out; no rule written for them): on 215
# cases dev 104/123 = 84.6%, 108/123 = 87.8%; held-out 29/92 = 31.5%, 32/92 = 34.8% (the held-out
# fix floor back to 0.30: the corpus changed, not the rules).
# After the rounds that checked rules on fresh real pastes (rounds "fresh_*") and
# the robustness to cut pastes: dev 104/123 = 84.6%, 109/123 = 88.6%; held-out 33/92 = 35.9%,
# 34/92 = 37.0%.
# The corpus then grew by an unbiased sample of 26 cases (g_*, h_*, i_*: taken in search order,
# not chosen by category; 16 dev, 10 held-out; no rule written for them): on 241 cases dev
# 108/139 = 77.7%, 112/139 = 80.6%; held-out 39/102 = 38.2%, 35/102 = 34.3% (dev floors and the
# held-out fix floor lowered by 5 points: the corpus changed, not the rules).
# After the genuine-pressure / activation-memory boundary (RK630-RK632, round "pressure"):
# dev 113/139 = 81.3%, 116/139 = 83.5%; held-out 39/102, 35/102.
# r6api (RK650-RK653: rejected input told from a library bug, checkpoint API readings): dev
# 113/139 = 81.3%, 117/139 = 84.2%; held-out 39/102, 35/102 (unchanged).
# r8state (RK670 Gemini placement, RK671 tokenizer length warning, RK672 use_reentrant warning
# alone): on 263 cases dev 123/148 = 83.1%, 125/148 = 84.5%; held-out 42/115, 37/115 (unchanged).
# r8press (RK660 host RAM, RK661 selective recompute that OOMs, RK262 loss buffers): dev
# 125/148 = 84.5%, 126/148 = 85.1%; held-out 42/115, 37/115 (unchanged).
# All three with r8api (RK680/RK681, RK600 tables) on 263 cases: dev 129/148 = 87.2%, 132/148 =
# 89.2%; held-out 42/115 = 36.5%, 37/115 = 32.2%.
# A third unbiased sample of 16 cases (m_*, n_*, o_*; 6 dev, 10 held-out; no rule for them): on
# 279 cases dev 132/154 = 85.7%, 136/154 = 88.3%; held-out 48/125 = 38.4%, 41/125 = 32.8%.
# A fourth unbiased sample of 21 cases (p_*, q_*, r_*; 16 dev, 5 held-out; no rule for them; one
# crashed the metadata reader, fixed): on 300 cases dev 140/170 = 82.4%, 144/170 = 84.7%;
# held-out 49/130 = 37.7%, 41/130 = 31.5% (dev floors back to 0.80: the corpus changed).
# r10a (RK690, RK691, "upgrading X from A to B" read by RK600): dev 143/170 = 84.1%,
# 146/170 = 85.9%; held-out unchanged (dev floors raised).
# r10b (RK700 memory budget and speed, RK701 another kernel in the recompute, RK702 a
# reentrant checkpoint's output cycle): dev 142/170 = 83.5%, 147/170 = 86.5%.
# Both merged: dev 145/170 = 85.3%, 149/170 = 87.6%; held-out 49/130 = 37.7%, 41/130 = 31.5%.
# Round s (14 fresh cases sampled in search order, scored before any rule was written for them:
# 4/14 right before and after the stated-symptom readings; 9 dev, 5 held-out): dev 149/179 =
# 83.2%, 154/179 = 86.0%; held-out 51/135 = 37.8%, 44/135 = 32.6%.
# Regression floors of the rules on the corpus as it stands: a fresh round of real cases
# (round t_, sampled in search order) lowers what the same rules score, and sets them anew.
# Round u_ (20 fresh cases, 12 dev / 8 held-out, 9 of them framework bugs): 4/20 right as
# collected (dev 1/12, held-out 3/8); after RK812 (FP8 said not to lower memory), RK813
# (sharding said to raise it) and RK814 (Unsloth's pinned-memory OOM, a known-problem row):
# dev 6/12. Dev 159/197 = 80.7%, 165/197 = 83.8%; held-out 56/147 = 38.1%, 47/147 = 32.0%.
# Round v_ (9 fresh cases, 3 dev / 6 held-out, every one thin): 2/9 right as collected, all 9
# `needs_evidence`, 8 with a collect item that decides them. Dev 160/200 = 80.0%, 167/200 =
# 83.5%; held-out 57/153 = 37.3%, 48/153 = 31.4% (dev floors lowered for the grown corpus).
# Round x_ (40 fresh cases, 25 dev / 15 held-out, 11 decidable): 9/40 right as collected
# (dev 7/25, held-out 2/15; decidable 4/11), all 29 thin ones `needs_evidence`, 28 with a
# collect item that decides them. Dev 166/225 = 73.8%, 177/225 = 78.7%; held-out 59/168 =
# 35.1%, 51/168 = 30.4% (dev floors lowered for the grown corpus).
# Round y_ (23 fresh cases: forums and other repositories, 15 dev / 8 held-out, 4 decidable):
# 5/23 right as collected (dev 3/15, held-out 2/8; decidable 2/4), all 19 thin ones
# `needs_evidence`, 18 with a collect item that decides them. Dev 173/240 = 72.1%, 180/240 =
# 75.0%; held-out 63/176 = 35.8%, 55/176 = 31.3% (dev floors lowered for the grown corpus).
# Round z_ (44 fresh cases: Megatron family, DeepSpeed, HF and forums, 27 dev / 17 held-out, 6
# decidable): 9/44 right as collected (dev 2/27, held-out 7/17; decidable 3/6), all 38 thin
# ones `needs_evidence`, 35 with a collect item that decides them. Dev 179/267 = 67.0%,
# 185/267 = 69.3%; held-out 70/193 = 36.3%, 60/193 = 31.1% (dev floors lowered for the grown
# corpus).
# Round w_ (41 fresh cases: the Megatron family, DeepSpeed, verl, OpenRLHF, TE, HF, LLaMA-Factory,
# Unsloth; 21 dev / 20 held-out; labelled by the rule that an OOM message decides only the cause
# its numbers show and cut frames decide nothing: 2 decidable): 12/41 right as collected (dev
# 5/21, held-out 7/20; decidable 1/2), all 39 thin ones `needs_evidence`, 37 with a collect item
# that decides them. Dev 185/288 = 64.2%, 186/288 = 64.6%; held-out 78/213 = 36.6%, 61/213 =
# 28.6% (floors lowered for the grown corpus).
# Round ac (40 fresh cases: training frameworks' issues and smaller projects, 28 dev / 12
# held-out, 10 decidable): 20/40 right as collected (dev 13/28, held-out 7/12; decidable 5/10),
# all 30 thin ones `needs_evidence` with a collect item that decides them. Dev 212/336 = 63.1%,
# 198/336 = 58.9%; held-out 85/233 = 36.5%, 64/233 = 27.5% (dev fix floor lowered for the
# grown corpus).
# Round ad (38 fresh cases, deciding evidence asked for: the training frameworks' issues and
# research repositories, 20 dev / 18 held-out, 8 decidable by the label rule): 7/38 right as
# collected (dev 4/20, held-out 3/18; decidable 2/8), all 30 thin ones `needs_evidence` with a
# collect item that decides them. Dev 217/356 = 61.0%, 199/356 = 55.9%; held-out 88/251 =
# 35.1%, 68/251 = 27.1% (dev floors lowered for the grown corpus).
# Round ae (37 fresh cases: the training frameworks' issues, Hugging Face projects, forums and
# blogs, 26 dev / 11 held-out, 4 decidable by the label rule): 6/37 right as collected (dev
# 5/26, held-out 1/11; decidable 1/4), all 33 thin ones `needs_evidence`, 31 with a collect item
# that decides them. Dev 223/382 = 58.4%, 206/382 = 53.9%; held-out 89/262 = 34.0%, 69/262 =
# 26.3% (floors lowered for the grown corpus).
# Round af (33 fresh cases, deciding evidence asked for: the training frameworks' issues,
# Hugging Face projects and other research repositories, 17 dev / 16 held-out, 5 decidable by
# the label rule): 14/33 right as collected (dev 7/17, held-out 7/16; decidable 4/5), all 28
# thin ones `needs_evidence`, 27 with a collect item that decides them. Dev 231/399 = 57.9%,
# 208/399 = 52.1%; held-out 97/278 = 34.9%, 71/278 = 25.5% (fix floors lowered for the grown
# corpus).
# Round ag (23 fresh cases: the training frameworks' issues, PyTorch, Hugging Face projects and
# other research repositories, 12 dev / 11 held-out, 1 decidable by the label rule): 7/23 right
# as collected (dev 3/12, held-out 4/11; decidable 0/1), all 22 thin ones `needs_evidence` with
# a collect item that decides them. Dev 235/411 = 57.2%, 208/411 = 50.6%; held-out 101/289 =
# 34.9%, 72/289 = 24.9% (fix floors lowered for the grown corpus).
# Round ah (16 fresh cases, deciding evidence asked for: Megatron-based stacks, fine-tuning
# stacks, PyTorch / DeepSpeed and vision repositories, 11 dev / 5 held-out, 3 decidable by the
# label rule): 11/16 right as collected (dev 8/11, held-out 3/5; decidable 3/3), all 13 thin
# ones `needs_evidence` with a collect item that decides them. Dev 244/422 = 57.8%, 214/422 =
# 50.7%; held-out 104/294 = 35.4%, 73/294 = 24.8%.
FLOORS = {
    ("dev", "category_ok"): 0.57,
    ("dev", "fix_ok"): 0.50,
    ("held_out", "category_ok"): 0.33,
    ("held_out", "fix_ok"): 0.24,
}
MIN_CASES = 716


@pytest.fixture(scope="module")
def results():
    return score(CASES)


def test_corpus_cases_are_valid():
    cases = load_cases(CASES)
    assert len(cases) >= MIN_CASES, f"only {len(cases)} cases in {CASES}"
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    for case in cases:
        assert case["expected_category"] in CATEGORIES, case["id"]
        assert str(case["source"]).startswith("http"), case["id"]
        assert isinstance(case["fix_names"], list) and case["fix_names"], case["id"]
    splits = {split_of(c["source"]) for c in cases}
    assert splits == {"dev", "held_out"}


def test_split_is_the_fixed_hash():
    # int(sha256(url)[:8], 16) % 5 in (0, 1) is held out; fixed before any rule was written.
    url = "https://github.com/NVIDIA/Megatron-LM/pull/3562"
    import hashlib

    bucket = int(hashlib.sha256(url.encode()).hexdigest()[:8], 16) % 5
    assert split_of(url) == ("held_out" if bucket in (0, 1) else "dev")


def test_no_case_crashes(results):
    crashed = [f"{r.id}: {r.error}" for r in results if r.error]
    assert not crashed, crashed


def test_corpus_scores(results, tmp_path):
    summary = table(results)
    print()
    print(format_table(summary))
    (tmp_path / "doctor_corpus.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    for (split, metric), floor in FLOORS.items():
        row = summary[split]["all"]
        measured = row[metric] / row["n"]
        assert measured >= floor, f"{split} {metric}: {measured:.1%} < floor {floor:.0%}"


# Rules written from one development thread each (an audit against overfitting): on every
# other development case they may fire only where that case's category is their own. A rule
# that fires on an unrelated paste (PyTorch's internal checkpoint assert read as a script's
# option clash, say) is matching words, not its phenomenon. Held-out cases are not looked at.
ONE_THREAD_RULES = frozenset(
    [f"RK{n}" for n in range(140, 161)]
    + ["RK190", "RK191", "RK220", "RK233", "RK235", "RK236"]
    + ["RK700", "RK701", "RK702"]
)
# The same phenomenon under another label: Megatron-LM#2294 is uniform recompute with 24 layers
# and recompute_num_layers 7, labelled a framework bug (the clamp came in PR #3562); RK152 reads
# it as the configuration that triggers that bug, which its own text says.
SAME_PHENOMENON = {("q_megatron_2294_uniform_recompute_index_out_of_range", "RK152")}


def test_one_thread_rules_stay_silent_on_other_categories():
    import tempfile

    from recompute_kit.doctor.engine import diagnose
    from recompute_kit.doctor.evidence import collect

    wrong = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in load_cases(CASES):
            if split_of(case["source"]) != "dev":
                continue
            log = Path(tmp) / "case.log"
            log.write_text(str(case["artefacts"]), encoding="utf-8")
            config = None
            if case.get("config"):
                config = Path(tmp) / "case.config"
                config.write_text(str(case["config"]), encoding="utf-8")
            d = diagnose(collect(logs=[str(log)], config=str(config) if config else None))
            wrong += [
                f"{case['id']}: {f.rule} ({f.category})"
                for f in d.findings
                if f.rule in ONE_THREAD_RULES
                and f.category != case["expected_category"]
                and (case["id"], f.rule) not in SAME_PHENOMENON
            ]
    assert not wrong, wrong


def test_table_counts_top3_and_confidence_bands():
    from corpus_scoring import CaseResult

    def case(ok, top3, confidence):
        got = "fragmentation" if ok else ("activation_memory" if confidence else None)
        return CaseResult("x", "u", "dev", "fragmentation", got, "RK001", ok, ok, top3, confidence)

    summary = table([case(True, True, 1.0), case(False, True, 0.49), case(False, False, None)])
    assert summary["dev"]["all"] == {
        "n": 3,
        "category_ok": 1,
        "fix_ok": 1,
        "in_top3": 2,
        "silent": 1,
    }
    bands = summary["dev_by_confidence"]
    assert bands["0.85-1.00"] == {"n": 1, "category_ok": 1}
    assert bands["0.00-0.50"] == {"n": 1, "category_ok": 0}
    assert sum(b["n"] for b in bands.values()) == 2  # a silent case has no confidence
    assert "top-3" in format_table(summary)
