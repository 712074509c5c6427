"""The agent skill (SKILL.md at the root, skill/): spec-valid, installable with the real `skills`
CLI, small once installed, runnable from the installed copy, and its generated reference and
evals in order.

The install tests need Node's npx and the npm registry (skills@1.5.18, the newest that runs on
Node 18/20); they skip, saying so, when npx is missing or the registry cannot be reached, and
fail on any other problem. The spec validator is `agentskills` from PyPI's skills-ref
(`pip install skills-ref`); without it that one test skips, the stdlib frontmatter checks still
run.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SKILL_NAME = "recompute-kit"
SKILLS_CLI = "skills@1.5.18"  # newer releases need Node >= 22.20
TROUBLESHOOTING = REPO / "skill" / "references" / "troubleshooting.md"
EVALS = REPO / "skill" / "evals" / "evals.json"
SCRIPTS = REPO / "skill" / "scripts"
FRAG_LOG = "skill/evals/files/oom_fragmentation_megatron_60.log"

# What must never be copied into an installed skill: environments, outputs, caches.
FORBIDDEN = {
    ".venv",
    "runs",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".ipynb_checkpoints",
    "build",
    "dist",
}
# Measured 2026-11-23: the installed copy is 2,124,751 bytes (the kit's source, tests with the
# real-case corpus, notebooks, benchmarks and the skill; 1,124,104 bytes the day before); the
# bound leaves room to grow and still catches a venv (> 1 GB) or a run folder copied along.
MAX_INSTALLED_BYTES = 8 * 2**20

NETWORK_ERRORS = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
    r"network|socket hang up|request to https?://\S+ failed|getaddrinfo",
    re.IGNORECASE,
)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def frontmatter(path: Path) -> tuple[dict, str]:
    text = path.read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.DOTALL)
    assert match, f"{path} has no YAML frontmatter"
    return yaml.safe_load(match.group(1)), match.group(2)


def tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def forbidden_in(root: Path) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_dir() and (p.name in FORBIDDEN or p.name.endswith(".egg-info")):
            found.append(str(p.relative_to(root)))
    return sorted(found)


def npm_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DISABLE_TELEMETRY="1",
        DO_NOT_TRACK="1",
        npm_config_update_notifier="false",
        npm_config_fund="false",
        npm_config_audit="false",
        NO_COLOR="1",
        FORCE_COLOR="0",
    )
    for key in ("RECOMPUTE_KIT_PYTHON", "RECOMPUTE_KIT_VENV"):
        env.pop(key, None)
    return env


def run(cmd: list[str], cwd: Path | None = None, env=None, timeout=180, check=True, **kw):
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    return proc


def skills_add(source: str, project: Path, agent: str) -> subprocess.CompletedProcess:
    project.mkdir(parents=True, exist_ok=True)
    return run(
        ["npx", "-y", SKILLS_CLI, "add", source, "-y", "-a", agent],
        cwd=project,
        env=npm_env(),
        timeout=240,
    )


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The repository as a clone would have it: tracked and untracked-but-not-ignored files
    (read with `git ls-files`, which changes nothing), in a folder named after the skill."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listed = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO
    ).stdout
    dest = tmp_path_factory.mktemp("src") / SKILL_NAME
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def npx_ready() -> None:
    """Skip (saying why) when npx is missing or the npm registry is unreachable."""
    if shutil.which("npx") is None or shutil.which("npm") is None:
        pytest.skip("Node's npx/npm is not installed: cannot run the skills CLI")
    try:
        proc = subprocess.run(
            [
                "npm",
                "view",
                SKILLS_CLI,
                "version",
                "--fetch-retries=1",
                "--fetch-retry-mintimeout=1000",
                "--fetch-retry-maxtimeout=5000",
                "--fetch-timeout=30000",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env=npm_env(),
            cwd=Path.home(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("the npm registry did not answer within 90 s (npm view skills@1.5.18)")
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if NETWORK_ERRORS.search(ln)]
        if lines:
            pytest.skip(f"the npm registry is unreachable (npm view {SKILLS_CLI}): {lines[0]}")
        pytest.fail(f"npm view {SKILLS_CLI} failed (not a network error):\n{proc.stderr}")
    assert proc.stdout.strip() == SKILLS_CLI.split("@")[1]


@pytest.fixture(scope="module")
def installed(checkout, npx_ready, tmp_path_factory) -> dict[str, Path]:
    """The skill installed by the real CLI for Claude Code and for Codex, from a checkout."""
    root = tmp_path_factory.mktemp("projects")
    out = {}
    for agent, where in (("claude-code", ".claude/skills"), ("codex", ".agents/skills")):
        project = root / agent
        skills_add(str(checkout), project, agent)
        out[agent] = project / where / SKILL_NAME
        lock = json.loads((project / "skills-lock.json").read_text())
        assert SKILL_NAME in lock["skills"]
        ARRIVED[agent] = snapshot(out[agent])
    ARRIVED["checkout"] = snapshot(checkout)
    return out


# What each install put on disk, taken before any test runs code from the installed copy
# (running its scripts writes __pycache__ there unless PYTHONDONTWRITEBYTECODE is set).
ARRIVED: dict[str, dict[str, Any]] = {}


def snapshot(root: Path) -> dict[str, Any]:
    return {
        "forbidden": forbidden_in(root),
        "size": tree_size(root),
        "files": {p.relative_to(root) for p in root.rglob("*") if p.is_file()},
    }


# ---------------------------------------------------------------------------------------------
# (a) The Agent Skills spec
# ---------------------------------------------------------------------------------------------


def test_frontmatter_follows_the_spec():
    meta, _ = frontmatter(REPO / "SKILL.md")
    # Portable fields only (agentskills.io spec; Claude-Code-only keys like when_to_use fail).
    assert set(meta) <= {"name", "description", "license", "compatibility", "metadata"}
    assert meta["name"] == SKILL_NAME
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", meta["name"]) and len(meta["name"]) <= 64
    desc = meta["description"]
    assert 0 < len(desc) <= 1024 and "<" not in desc and ">" not in desc
    assert "Use it when" in desc and "Do not use it" in desc  # positive and negative triggers
    for word in ("OOM", "moe_act", "mla_up_proj", "expandable_segments", "inference"):
        assert word in desc
    assert len(meta["compatibility"]) <= 500
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta["metadata"].items())
    assert len((REPO / "SKILL.md").read_text().splitlines()) < 500


def test_skill_md_names_only_files_and_commands_that_exist():
    _, body = frontmatter(REPO / "SKILL.md")
    paths = set(re.findall(r"skill/(?:references|scripts)/[\w.-]+\.(?:md|py)", body))
    assert len(paths) >= 8
    for rel in paths:
        assert (REPO / rel).is_file(), rel
    for ref in ("modules.md", "key-mapping.md", "moe-mla.md", "troubleshooting.md"):
        assert f"skill/references/{ref}" in paths
    for nb in re.findall(r"notebooks/[\w.-]+\.ipynb", body):
        assert (REPO / nb).is_file(), nb
    subcommands = set(re.findall(r"rk\.py ([a-z]+)", body))
    assert subcommands <= cli_subcommands(), subcommands


def cli_subcommands() -> set[str]:
    from recompute_kit.cli.parser import build_parser

    action = next(a for a in build_parser()._actions if a.dest == "command")
    return set(action.choices)


def test_rk_py_passes_every_cli_subcommand():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import rk
    finally:
        sys.path.remove(str(SCRIPTS))
    assert set(rk.SUBCOMMANDS) == cli_subcommands()


def quick_reference() -> list[str]:
    """The commands of SKILL.md's quick-reference table, in order."""
    _, body = frontmatter(REPO / "SKILL.md")
    table = body.split("## 2. Quick reference", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\|[^|]+\| `([^`]+)`", table, re.MULTILINE)


def test_quick_reference_commands_work(tmp_path):
    """Every script row runs as written, from a user's project holding the files it names
    (train.log, cfg.yaml, results.md, train.sh, verify.json: real texts from the evals and
    tests/data); rows that need --json print JSON. The papermill rows are checked for parameter
    names (papermill only warns about unknown ones); tests/test_notebooks.py runs the notebooks."""
    files = REPO / "skill/evals/files"
    shutil.copy(files / "qwen3_30b_a3b_16k_oom.log", tmp_path / "train.log")
    shutil.copy(files / "qwen3_30b_a3b_16k.yaml", tmp_path / "cfg.yaml")
    shutil.copy(files / "llama3_70b_recompute_experiments.md", tmp_path / "results.md")
    megatron_log = REPO / "tests/data/rules/ex-mlm-pr5662.txt"  # real Megatron-LM log lines
    (tmp_path / "train.sh").write_text(f"cat {shlex.quote(str(megatron_log))}\n")
    env = {**npm_env(), "RECOMPUTE_KIT_PYTHON": sys.executable}
    verify = [
        sys.executable,
        str(SCRIPTS / "rk.py"),
        "verify",
        "--model",
        "tiny-moe",
        "--recompute",
        "selective:moe_act",
        "selective:moe",
        "--json",
    ]
    (tmp_path / "verify.json").write_text(run(verify, env=env).stdout)

    commands = quick_reference()
    scripts = [c for c in commands if c.startswith("python3 skill/scripts/")]
    assert len(scripts) >= 12
    for command in scripts:
        argv = shlex.split(command)
        argv[0] = sys.executable
        argv[1] = str(REPO / argv[1])
        proc = run(argv, cwd=tmp_path, env=env, timeout=120)
        if "--json" in argv or Path(argv[1]).name in ("plan.py", "diagnose.py", "judge.py"):
            doc = json.loads(proc.stdout)
            assert doc.get("ok", True), (command, doc)
        else:
            assert proc.stdout.strip(), command
    assert (tmp_path / "runs/abl/results.jsonl").is_file()

    notebooks = [c for c in commands if "rk.py notebook " in c]
    assert len(notebooks) == 2
    names = {"oom": "oom_diagnosis.ipynb", "ablation": "recompute_ablation.ipynb"}
    for command in notebooks:
        nb = REPO / "notebooks" / names[re.search(r"rk\.py notebook (\w+)", command).group(1)]
        cell = next(
            "".join(c["source"])
            for c in json.loads(nb.read_text())["cells"]
            if "parameters" in c.get("metadata", {}).get("tags", [])
        )
        known = set(re.findall(r"^(\w+)\s*(?::[^=\n]+)?=", cell, re.MULTILINE))  # typed too
        args = command.split(" notebook ", 1)[1]
        params = set(re.findall(r" -p (\w+)", args))
        params |= set(re.findall(r" -y \"\{(\w+):", args))  # a YAML list parameter
        assert params and params <= known, (nb.name, params - known)


def test_agentskills_validate_passes(checkout):
    exe = shutil.which(
        "agentskills", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    if exe is None:
        pytest.skip("skills-ref is not installed (pip install skills-ref): no agentskills CLI")
    proc = run([exe, "validate", str(checkout)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Valid skill" in proc.stdout


# ---------------------------------------------------------------------------------------------
# (b), (c) The real skills CLI installs it; the installed copy works and is small
# ---------------------------------------------------------------------------------------------


def test_bootstrap_installs_every_dependency_the_kit_declares(tmp_path):
    # A skill trial's venv had torch and PyYAML only (the kit goes in with --no-deps): NeMo-RL's
    # ${mul:...} went unresolved without OmegaConf. The bootstrap's list is pyproject's.
    import importlib.util
    import re

    import tomllib

    script = REPO / "skill/scripts/bootstrap.py"
    spec = importlib.util.spec_from_file_location("bootstrap", script)
    boot = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script.parent))  # its _kit helper
    try:
        spec.loader.exec_module(boot)
    finally:
        sys.path.remove(str(script.parent))
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {d.split(";")[0].strip() for d in declared if not d.startswith("torch")}
    assert wanted == set(boot.RUNTIME_PACKAGES.values())
    probed = re.search(r'need = \[(.*?)\]', boot.PROBE).group(1)
    assert {m.strip(' "') for m in probed.split(",")} | {"tomli"} == set(boot.RUNTIME_PACKAGES)
    here = {"torch": "2.13.0", "recompute_kit": str(REPO / "recompute_kit/__init__.py")}
    assert boot.usable({**here, "missing": []}, notebooks=False)
    assert not boot.usable({**here, "missing": ["omegaconf"]}, notebooks=False)
    assert boot.problems({**here, "missing": ["omegaconf"]}, False) == [
        "not importable: omegaconf"
    ]


def test_installed_copy_runs_bootstrap_and_diagnose(installed):
    for agent, skill in installed.items():
        assert (skill / "SKILL.md").is_file(), agent
        assert (skill / "pyproject.toml").is_file() and (skill / "recompute_kit").is_dir()
        for script in ("bootstrap.py", "diagnose.py", "plan.py", "rk.py", "judge.py"):
            assert (skill / "skill" / "scripts" / script).is_file(), (agent, script)
    skill = installed["claude-code"]
    # Reuse this interpreter's torch instead of creating a venv and downloading one.
    env = {**npm_env(), "RECOMPUTE_KIT_PYTHON": sys.executable}
    boot = run([sys.executable, str(skill / "skill/scripts/bootstrap.py")], env=env)
    info = json.loads(boot.stdout)
    assert info["status"] == "ready", info
    assert Path(info["recompute_kit"]).resolve().is_relative_to(skill.resolve())
    # The agent's view: its own python3, the installed scripts, the user's project as cwd.
    for agent, skill in installed.items():
        diag = run(
            [
                sys.executable,
                str(skill / "skill/scripts/diagnose.py"),
                "--log",
                str(skill / FRAG_LOG),
            ],
            env=env,
            cwd=skill.parents[2],
        )
        doc = json.loads(diag.stdout)
        assert doc["ok"] and doc["top"]["category"] == "fragmentation", (agent, doc["summary"])
        assert doc["top"]["config_patch"]["env"]["PYTORCH_CUDA_ALLOC_CONF"] == (
            "expandable_segments:True"
        )
        assert doc["evidence"]["oom"][0]["total_bytes"] > 30 * 2**30


def test_installed_copy_is_small(installed):
    for agent in installed:
        arrived = ARRIVED[agent]
        assert not arrived["forbidden"], (agent, arrived["forbidden"])
        assert arrived["size"] <= MAX_INSTALLED_BYTES, f"{agent}: {arrived['size']} bytes installed"
        # Every file of the checkout arrives (the CLI drops only .git, __pycache__,
        # __pypackages__ and files named metadata.json).
        ours = ARRIVED["checkout"]["files"]
        assert ours == arrived["files"], sorted(ours ^ arrived["files"])[:20]


def test_git_sources_leave_ignored_folders_behind(checkout, npx_ready, tmp_path):
    """The skills CLI has no ignore file: a plain local path copies everything but .git,
    __pycache__ and __pypackages__. A git source (owner/repo, a git URL, file://CHECKOUT)
    is cloned, so only committed files arrive: this is how a dev checkout must be installed."""
    repo = tmp_path / SKILL_NAME
    shutil.copytree(checkout, repo)
    git = [
        "git",
        "-c",
        "user.name=test",
        "-c",
        "user.email=test@example.com",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "core.hooksPath=/dev/null",
    ]
    run([*git, "init", "-q"], cwd=repo)
    run([*git, "add", "-A"], cwd=repo)
    run([*git, "commit", "-q", "-m", "snapshot"], cwd=repo)
    for junk in (".venv/bin", "runs/demo", "recompute_kit/__pycache__", ".pytest_cache"):
        (repo / junk).mkdir(parents=True, exist_ok=True)
        (repo / junk / "junk.bin").write_bytes(b"\0" * 1024)

    via_git = skills_add(f"file://{repo}", tmp_path / "p-git", "claude-code")
    skill = tmp_path / "p-git/.claude/skills" / SKILL_NAME
    assert (skill / "SKILL.md").is_file(), via_git.stdout[-2000:]
    assert not forbidden_in(skill), forbidden_in(skill)

    skills_add(str(repo), tmp_path / "p-path", "claude-code")
    plain = tmp_path / "p-path/.claude/skills" / SKILL_NAME
    assert not (plain / "recompute_kit/__pycache__").exists()  # the CLI's fixed exclusions
    assert (plain / ".venv/bin/junk.bin").exists()  # ... but nothing from .gitignore


# ---------------------------------------------------------------------------------------------
# (d) troubleshooting.md is generated
# ---------------------------------------------------------------------------------------------


def test_troubleshooting_md_matches_the_rule_catalog():
    from recompute_kit.cli import main

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["rules", "--markdown"]) == 0
    expected = buf.getvalue()
    actual = TROUBLESHOOTING.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    actual.splitlines(True),
                    expected.splitlines(True),
                    "committed",
                    "recompute-kit rules --markdown",
                )
            )[:40]
        )
        pytest.fail(
            "skill/references/troubleshooting.md differs from the rule catalog. It is generated, "
            "never edited by hand; regenerate it with:\n"
            "    .venv/bin/recompute-kit rules --markdown > skill/references/troubleshooting.md\n"
            f"{diff}"
        )


# ---------------------------------------------------------------------------------------------
# (e) evals
# ---------------------------------------------------------------------------------------------


def test_evals_are_well_formed():
    doc = json.loads(EVALS.read_text(encoding="utf-8"))
    assert doc["skill_name"] == SKILL_NAME
    evals = doc["evals"]
    assert len(evals) >= 12
    ids = [e["id"] for e in evals]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids)
    names = {e["name"] for e in evals}
    assert {"oom-fragmentation", "moe-oom-moe-act-then-moe", "mlp-throughput-regression"} <= names
    assert any(e["should_trigger"] is False for e in evals)  # negative triggers
    sources = (REPO / "skill/evals/files/SOURCES.md").read_text(encoding="utf-8")
    used = set()
    for e in evals:
        assert isinstance(e["prompt"], str) and len(e["prompt"]) > 20, e["id"]
        assert isinstance(e["expected_output"], str) and e["expected_output"], e["id"]
        assert e["expectations"] and all(isinstance(x, str) and x for x in e["expectations"])
        for rel in e["files"]:
            assert (REPO / rel).is_file(), (e["id"], rel)
            used.add(Path(rel).name)
        for script in e.get("expected_scripts", []):
            assert (REPO / script).is_file(), (e["id"], script)
    for f in (REPO / "skill/evals/files").iterdir():
        if f.name != "SOURCES.md":
            assert f"`{f.name}`" in sources or f.stem in sources, f"{f.name}: no source noted"
            assert f.name in used, f"{f.name} is not used by any eval"


# ---------------------------------------------------------------------------------------------
# Scripts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", ["bootstrap.py", "diagnose.py", "plan.py", "rk.py", "judge.py"])
def test_scripts_have_help(script):
    proc = run([sys.executable, str(SCRIPTS / script), "--help"], timeout=60)
    assert "usage" in proc.stdout.lower() or (script == "rk.py" and "SUBCOMMAND" in proc.stdout)


def test_bootstrap_dry_run_plans_a_cpu_torch(tmp_path):
    """An interpreter without torch: bootstrap plans a venv with the CPU build (or, on a GPU
    machine, stops and asks instead of downloading a CUDA build)."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    if run([str(base), "-c", "import torch"], check=False).returncode == 0:
        pytest.skip(f"{base} has torch: no torch-less interpreter to test with")
    env = {**npm_env(), "RECOMPUTE_KIT_VENV": str(tmp_path / "venv")}
    proc = run([str(base), str(SCRIPTS / "bootstrap.py"), "--dry-run"], env=env, check=False)
    doc = json.loads(proc.stdout)
    assert not (tmp_path / "venv").exists()
    if doc["status"] == "action_required":
        assert proc.returncode == 1 and "GPU" in doc["error"]
        return
    assert proc.returncode == 0 and doc["status"] == "dry_run", doc
    actions = " ".join(doc["actions"])
    assert "--system-site-packages" in actions and "torch==2.13.0" in actions
    assert "cu1" not in actions  # never a CUDA wheel without the user's say-so


def test_plan_script_picks_moe_for_the_moe_eval():
    cfg = REPO / "skill/evals/files/qwen3_30b_a3b_16k.yaml"
    proc = run(
        [
            sys.executable,
            str(SCRIPTS / "plan.py"),
            "--config",
            str(cfg),
            "--gpu-memory-gb",
            "80",
            "--top",
            "3",
        ],
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert doc["fits"] and doc["best"]["recompute"] == "selective:moe"
    assert "layernorm,moe_act" in doc["explanation"]  # the cheaper MoE boundary misses
    assert doc["rendered"].startswith("# recompute-kit: selective:moe")


def test_judge_applies_the_contract(tmp_path):
    sweep = REPO / "skill/evals/files/h100_gpt_scaled_sweep.jsonl"
    args = [
        sys.executable,
        str(SCRIPTS / "judge.py"),
        str(sweep),
        "--budget-gib",
        "12",
        "--golden",
        "none",
    ]
    doc = json.loads(run(args).stdout)
    verdicts = {c["recompute"]: c["verdict"] for c in doc["candidates"]}
    assert verdicts["none"] == "fail"  # 12.01 GiB reserved > 10.8 usable
    assert verdicts["selective:mlp"] == "incomplete"  # fits, -7%, loss not yet shown
    # 'none' does not fit: no regression is called against it (issue #21 item 6); the settings
    # that fit are compared with the fastest of them, 'selective:mlp' (-13.8% from one value
    # each: the run-to-run noise is not measured, so the check stays open)
    assert doc["baseline"]["feasible"] is False
    assert doc["baseline"]["reference"] == "selective:mlp"
    assert verdicts["full:uniform:1"] == "incomplete"
    assert doc["recommended"] is None
    verify = tmp_path / "verify.json"
    verify.write_text(
        json.dumps(
            {"results": [{"recompute": "selective:mlp", "loss_match": True, "grads_match": True}]}
        )
    )
    doc = json.loads(run([*args, "--verify", str(verify)]).stdout)
    assert doc["recommended"] == "selective:mlp"


def test_plan_script_takes_a_gpu_name_and_reports_margins_and_stages():
    # A skill trial: plan.py insisted on --gpu-memory-gb and dropped the headroom, error band
    # and binding stage that `plan` reports.
    cfg = REPO / "skill/evals/files/qwen3_30b_a3b_16k.yaml"
    proc = run(
        [sys.executable, str(SCRIPTS / "plan.py"), "--config", str(cfg), "--gpu", "h100-80gb"],
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["budget_gib"] == 79.1
    assert doc["best"]["headroom_gib"] is not None and doc["best"]["error_band_gib"] > 0
    assert doc["binding_stage"] and len(doc["stage_total_gib"]) >= 1
    assert isinstance(doc["warnings"], list)  # the reader's warnings reach the user


def test_diagnose_leads_with_the_verdict_and_passes_the_layout(tmp_path):
    # diagnose.py's condensed document carries the doctor's verdict and what to collect, and
    # --dp reaches the doctor (Megatron-LM's examples/mixtral script leaves the world to
    # SLURM_NNODES: 8 GPUs unset, too few for its EP 8 x PP 4: 32 assumed, the least it takes)
    env = {**os.environ, "RECOMPUTE_KIT_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    script = REPO / "tests/sources/corpus/megatron_lm/blind_mixtral_8x7b_distributed.sh"
    argv = [sys.executable, str(REPO / "skill/scripts/diagnose.py"), "--log"]
    argv += [str(REPO / FRAG_LOG), "--config", str(script), "--full"]
    alone = json.loads(run(argv, env=env, cwd=tmp_path).stdout)
    assert alone["verdict"] in ("diagnosed", "needs_evidence", "out_of_scope")
    assert alone["verdict_why"] and alone["verdict"] == alone["doctor"]["verdict"]
    assert [c["id"] for c in alone["collect"]] == [c["id"] for c in alone["doctor"]["collect"]]
    assert all("patch_keys" in f and "patch_framework" in f for f in alone["findings"])
    # the kit's commands as the agent runs them (recompute-kit is not on its PATH)
    said = json.dumps([alone["findings"], alone["collect"]])
    # (at rk.py's path from the working folder: the agent runs from its project, not the skill)
    assert "recompute-kit " not in said and f"python3 {REPO / 'skill/scripts/rk.py'} " in said
    dp16 = json.loads(run([*argv, "--dp", "16"], env=env, cwd=tmp_path).stdout)
    read = dp16["doctor"]["evidence"]["read"]["config"]
    assert (read["data_parallel_size"], read["world_size"]) == (16, 64)
    assert alone["doctor"]["evidence"]["read"]["config"]["world_size"] == 32  # assumed: the least
    # the on/off layout switches plan.py takes pass too (a trial: --sp was refused)
    sys.path.insert(0, str(SCRIPTS))
    try:
        from diagnose import doctor_args, parse_args
    finally:
        sys.path.remove(str(SCRIPTS))
    sp = doctor_args(parse_args(["--config", str(script), "--sp", "--no-distributed-optimizer"]))
    assert sp[-2:] == ["--sp", "--no-distributed-optimizer"]


def test_diagnose_says_which_inputs_it_could_not_read(tmp_path):
    # a skill trial: a --model the kit cannot have was said only deep in evidence.notes
    env = {**os.environ, "RECOMPUTE_KIT_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    script = REPO / "tests/sources/corpus/megatron_lm/blind_mixtral_8x7b_distributed.sh"
    argv = [sys.executable, str(REPO / "skill/scripts/diagnose.py"), "--log", str(REPO / FRAG_LOG)]
    unknown = [*argv, "--config", str(script), "--model", "not-a-model"]
    doc = json.loads(run(unknown, env=env, cwd=tmp_path).stdout)
    assert any("--model not-a-model not applied" in n for n in doc["input_problems"])
    clean = json.loads(run([*argv, "--config", str(script)], env=env, cwd=tmp_path).stdout)
    assert clean["input_problems"] == []
