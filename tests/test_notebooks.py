"""Both notebooks run with papermill on small parameters; bad parameters stop in the first cells
with one clear message; the committed notebooks carry no outputs."""

import json
from pathlib import Path

import pytest

papermill = pytest.importorskip("papermill", reason="the notebooks extra is not installed")
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def run(name: str, tmp_path: Path, **params):
    out = tmp_path / name
    return papermill.execute_notebook(
        str(NOTEBOOKS / name),
        str(out),
        parameters=params,
        progress_bar=False,
        log_output=False,
        cwd=str(tmp_path),
    )


def output_types(nb) -> list[str]:
    """The MIME types of every display output of an executed notebook."""
    return [
        mime
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        for out in cell["outputs"]
        for mime in out.get("data", {})
    ]


def test_oom_notebook_writes_a_report(tmp_path):
    out_dir = tmp_path / "oom"
    nb = run("oom_diagnosis.ipynb", tmp_path, out_dir=str(out_dir), run_verification=True)
    shown = output_types(nb)
    # figures displayed inline (as well as saved), tables rendered as Markdown
    assert shown.count("image/png") == 2 and shown.count("text/markdown") >= 5
    report = json.loads((out_dir / "report.json").read_text())
    assert report["model"] == "llama3-8b"
    assert report["evidence"]["oom"][0]["total_bytes"] == pytest.approx(23.65 * 2**30, abs=1)
    assert report["findings"] and report["summary"]
    # the preset's default module list is no setting of the run's (the demo's report led with
    # RK025, "recompute_modules set while granularity is unset")
    assert "RK025" not in {f["rule"] for f in report["findings"]}
    assert report["plan"]["best"]["fits"] is True
    assert report["plan"]["rendered"].startswith("# recompute-kit:")
    assert {r["recompute"] for r in report["verification"]} >= {"none"}
    # two timed steps judge no speed (a skill trial: a spurious "Perf regression")
    judged = {"faster", "slower", "Perf regression", "within noise"}
    assert not {r["result"] for r in report["verification"]} & judged
    md = (out_dir / "report.md").read_text()
    assert md.startswith("# OOM diagnosis")
    # the file the user opens leads with the verdict (a skill trial: report.md hid it), shows
    # where the memory goes and the plots it wrote
    assert md.index("verdict: ") < md.index("## [")
    assert f"verdict: {report['verdict']['verdict']}" in md
    if report["verdict"]["verdict"] == "needs_evidence":
        assert "collect, to decide:" in md
    assert "| act:logits and loss |" in md
    assert report["plots"] and all((out_dir / png).is_file() for png in report["plots"])
    assert "![breakdown_current](breakdown_current.png)" in md
    # the proxy's plots apart, said to be the small model's (a re-trial read its "recommended:
    # none" as advice for the 8B run)
    proxy = md.split("## The proxy's check (tiny-gpt", 1)[1]
    assert "not this model's numbers" in proxy and "![tiny-gpt: " in proxy
    assert "verify-" not in md.split("## The proxy's check", 1)[0]
    assert (out_dir / "breakdown_current.png").stat().st_size > 1000


def test_the_notebook_command_says_a_bad_parameter_in_one_line_and_leaves_nothing(
    tmp_path, capsys, monkeypatch
):
    """`recompute-kit notebook` (SKILL.md's batch run): papermill's CLI printed a traceback and
    left the failed notebook behind (a skill trial)."""
    from recompute_kit.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "oom.ipynb"
    code = main(["notebook", "oom", str(out), "-p", "model", "llama9", "-p", "out_dir", "o"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "unknown model 'llama9'" in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no notebook, no report folder
    code = main(["notebook", "oom", str(out), "-p", "modle", "llama3-8b"])
    assert code == 1 and "has no parameter modle" in capsys.readouterr().err
    # every missing input at once, before a kernel starts (a trial fixed them one rerun each);
    # a Hydra override is not a file, and error_log may be the pasted error text itself
    code = main(
        ["notebook", "oom", str(out), "-y",
         "{config_path: [nope.sh, 'model.seq_length=8'], error_log: nope.log, out_dir: o}"]
    )
    assert code == 1 and capsys.readouterr().err.strip().splitlines() == [
        "recompute-kit: error: not found: nope.sh, nope.log"
    ]
    from recompute_kit.reports import missing_inputs

    assert missing_inputs(None, "RuntimeError: CUDA out of memory. Tried to allocate") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_oom_notebook_reads_the_files_users_train_with(tmp_path):
    """config_path takes the real files as they are (a NeMo-RL YAML naming its model), read
    through the shared reader; the summary of what was read is shown."""
    corpus = Path(__file__).resolve().parent / "sources" / "corpus" / "nemo_rl"
    out_dir = tmp_path / "oom"
    # only config_path and the budget: no default may be written over the file's values (a
    # skill trial: the notebook's example layout replaced a torchtitan TOML's seq_len and TP)
    nb = run(
        "oom_diagnosis.ipynb",
        tmp_path,
        config_path=[str(corpus / "grpo_math_8B_megatron.yaml")],
        gpu_memory_gb=79.1,
        run_verification=False,
        out_dir=str(out_dir),
    )
    shown = "".join(
        "".join(out.get("data", {}).get("text/markdown", ""))
        for cell in nb["cells"]
        for out in cell.get("outputs", [])
    )
    assert "read: " in shown and "framework nemo-rl" in shown
    assert "example" not in shown.split("read: ")[0]
    report = json.loads((out_dir / "report.json").read_text())
    assert report["findings"] and report["verdict"]["verdict"]
    # no error_log given: no OOM at all, never the example's (a skill trial: the example's
    # pytorch#16417 message, 23.65 GiB, was diagnosed as the user's run)
    assert report["evidence"]["oom"] == []
    from recompute_kit.sources.resolve import resolve

    read = resolve([str(corpus / "grpo_math_8B_megatron.yaml")]).config
    for key in ("seq_length", "tensor_model_parallel_size", "sequence_parallel"):
        assert report["config"][key] == read.to_flat()[key], key
    # patches in NeMo-RL's keys, the plan rendered in them (never Megatron-Bridge's cfg.model)
    assert all(f["patch_framework"] in (None, "nemo-rl") for f in report["findings"])
    rendered = report["plan"].get("rendered", "")
    assert "cfg.model." not in rendered


def test_ablation_notebook_writes_a_report(tmp_path):
    out_dir = tmp_path / "abl"
    nb = run(
        "recompute_ablation.ipynb",
        tmp_path,
        model="tiny-moe",
        out_dir=str(out_dir),
        steps=2,
        seq_length=None,  # the preset's own small shape: fast
        micro_batch_size=None,
        # papermill -y passes YAML lists: a multi-module spec stays one spec
        recompute_specs=["none", "selective:moe,shared_experts", "full:uniform:1"],
        memory_budget_gb=None,
    )
    shown = output_types(nb)
    assert shown.count("image/png") == 3 and shown.count("text/markdown") >= 3
    summary = next(
        "".join(out["data"]["text/markdown"])
        for cell in nb["cells"]
        for out in cell.get("outputs", [])
        if "| recompute | TFLOP/s/GPU |" in "".join(out.get("data", {}).get("text/markdown", ""))
    )
    assert "Recommended:" in summary
    report = json.loads((out_dir / "report.json").read_text())
    specs = ["none", "selective:moe,shared_experts", "full:uniform:1"]
    assert [r["recompute"] for r in report["rows"]] == specs
    assert report["recommended"] in set(specs)
    assert set(report["measured_modules"]["none"]) >= {"router", "experts", "moe_act"}
    for png in ("pareto.png", "modules.png", "overhead.png"):
        assert (out_dir / png).stat().st_size > 1000


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("oom_diagnosis.ipynb", {"model": "llama9"}, "unknown model 'llama9'"),
        (
            "oom_diagnosis.ipynb",
            {"recompute": "selective:attention"},
            "unknown recompute module 'attention'",
        ),
        ("oom_diagnosis.ipynb", {"gpu_memory_gb": -4}, "gpu_memory_gb must be positive"),
        (
            "recompute_ablation.ipynb",
            {"recompute_specs": "full:uniform"},
            "malformed full recompute spec",
        ),
        ("recompute_ablation.ipynb", {"model": "nope"}, "unknown model 'nope'"),
        ("recompute_ablation.ipynb", {"model": "llama3-70b"}, "'llama3-70b' is not a runnable"),
        ("recompute_ablation.ipynb", {"steps": "abc"}, "parameter steps must be int, got 'abc'"),
        ("oom_diagnosis.ipynb", {"tp": 2.5}, "parameter tp must be int or None, got 2.5"),
    ],
)
def test_bad_parameters_fail_in_the_first_cells(tmp_path, name, params, message):
    with pytest.raises(papermill.PapermillExecutionError) as exc:
        run(name, tmp_path, out_dir=str(tmp_path / "out"), **params)
    assert message in str(exc.value)
    # 1: parameters, 2: the parameters papermill injects, 3: the parameter check
    assert exc.value.exec_count <= 3
    assert exc.value.ename == "ConfigError"
    # one line, not a traceback through the library
    assert exc.value.traceback == [f"ConfigError: {exc.value.evalue}"]
    assert "\n" not in exc.value.evalue


def test_unwritable_out_dir_fails_first(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(papermill.PapermillExecutionError) as exc:
        run("recompute_ablation.ipynb", tmp_path, out_dir=str(blocker / "sub"))
    assert "cannot write to output directory" in str(exc.value) and exc.value.exec_count <= 3


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None
    params = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_help_notebook_lists_every_parameter_with_its_type(path):
    """`papermill --help-notebook` reads these: every parameter, none of "Unknown type"."""
    params = papermill.inspect_notebook(str(path))
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    names = [
        line.split(":")[0]
        for line in "".join(cell["source"]).splitlines()
        if line and line[0].isalpha() and not line.startswith(("from ", "import "))
    ]
    assert list(params) == names
    for p in params.values():
        assert p["inferred_type_name"] not in ("None", ""), p
        assert p["help"], p
    if path.name == "oom_diagnosis.ipynb":
        assert "error_log" in params
