"""Both notebooks as a user sees them: a JupyterLab server on 127.0.0.1 (free port, token, temp
dir) and headless Chromium (Debian's `chromium`, driven by Playwright for Python) open each
notebook, run all cells and find the plots (img elements holding PNG data) and the rendered
tables on the page. A screenshot of each lands in the test's temp dir.

Skipped, with the reason, only where Chromium or Playwright is not installed (`.ci/run`
installs both).
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

papermill = pytest.importorskip("papermill", reason="the notebooks extra is not installed")
playwright = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
)
import nbformat  # noqa: E402  (after the skips: installed with papermill)
from papermill.iorw import load_notebook_node  # noqa: E402
from papermill.parameterize import parameterize_notebook  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(
        "Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True
    )

pytestmark = pytest.mark.slow
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
# Flags for a closed network and a container: no sandbox (root), no GPU, and no background
# traffic (its refused connections flood the log).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Small, fast parameters, injected as papermill would; the plots and tables are the same kind.
CASES = {
    "oom_diagnosis.ipynb": ({"out_dir": "out/oom", "run_verification": True}, 2),
    "recompute_ablation.ipynb": (
        {
            "out_dir": "out/ablation",
            "steps": 2,
            "seq_length": None,
            "micro_batch_size": None,
            "recompute_specs": "none,full:uniform:1",
            "memory_budget_gb": None,
        },
        3,
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, proc, what: str, limit: float = 180.0) -> None:
    """Poll for an event; fail at once if the server died, or after `limit` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    for name, (params, _) in CASES.items():
        # the committed notebook with the parameters injected as papermill does
        nb = load_notebook_node(str(NOTEBOOKS / name))
        nbformat.write(parameterize_notebook(nb, params), root / name)
    port, token = free_port(), os.urandom(16).hex()
    home = root / "home"
    env = {
        **os.environ,
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
    }
    # User settings: start the notebook's kernel without asking, and fetch no news (closed
    # network).
    settings = home / "settings"
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"autoStartDefaultKernel": True},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    log = (root / "jupyter.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",  # CI containers run as root
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(up, proc, "the server answered")
        yield base, token, root, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.parametrize("name", list(CASES))
def test_notebook_shows_its_plots_in_jupyterlab(lab, name, tmp_path):
    base, token, _, server = lab
    _, plots_expected = CASES[name]
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/{name}?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            # the kernel is up when the toolbar's status says Idle
            page.wait_for_selector(
                ".jp-NotebookPanel-toolbar :text('Kernel status: Idle')",
                state="attached",
                timeout=120_000,
            )
            with contextlib.suppress(playwright.Error):  # should the kernel dialog come, answer it
                page.locator(".jp-Dialog button", has_text="Select").first.click(timeout=10_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            pngs = "img[src^='data:image/png']"
            wait_until(
                lambda: page.locator(pngs).count() >= plots_expected
                or page.locator(".jp-OutputArea-output[data-mime-type$='error']").count() > 0,
                server,
                f"{plots_expected} plots on the page",
                limit=150,
            )
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            errors = page.locator(".jp-OutputArea-output[data-mime-type$='error']")
            assert errors.count() == 0, errors.first.inner_text()
            assert page.locator(pngs).count() == plots_expected
            # tables rendered from Markdown, not printed as pipe text
            assert page.locator(".jp-OutputArea-output.jp-RenderedMarkdown table").count() >= 1
        finally:
            page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            browser.close()
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000
