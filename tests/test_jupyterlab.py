"""A chapter opened from the repository in a real JupyterLab draws its stored charts.

The stored chart outputs are Vega-Lite bundles (see `book_chart_bundle` in the appendix), which
JupyterLab draws with its own Vega even in a notebook the reader has not trusted. The test starts
JupyterLab on a free local port (a known token, no browser, every request off the machine
blocked), opens one chapter in the Chromium or Chrome that tools/find_browser.py finds, waits
for the charts, and stops the server.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest

from the_annotated_transformer import VEGA_LITE_MIME

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "book/24_attention_visualization.ipynb"
TOKEN = "annotated-transformer-test"
# Every cell rendered at once (JupyterLab otherwise renders only the cells near the viewport).
NOTEBOOK_SETTINGS = {"windowingMode": "none"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Poll JupyterLab's status API until it answers, or fail when it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text().splitlines()[-5:]
            pytest.fail(f"jupyter lab exited with code {process.returncode}: {tail}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {timeout:.0f} s")


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    home = tmp_path_factory.mktemp("jupyter")
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps(NOTEBOOK_SETTINGS))
    port = free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
    }
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={ROOT}",
        f"--LabApp.user_settings_dir={home / 'settings'}",
        f"--LabApp.workspaces_dir={home / 'workspaces'}",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly", "--allow-root",  # root in containers and CI
    ]
    log_path = home / "jupyter.log"
    log = log_path.open("w")
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{base}/api/status?token={TOKEN}", process, log_path)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def stored_charts(path: Path) -> int:
    nb = nbformat.read(path, as_version=4)
    outputs = [out for cell in nb.cells for out in cell.get("outputs", [])]
    return sum(VEGA_LITE_MIME in out.get("data", {}) for out in outputs)


def test_jupyterlab_draws_the_stored_charts_of_a_chapter(jupyterlab, browser):
    charts = stored_charts(ROOT / CHAPTER)
    assert charts >= 1, f"{CHAPTER} stores no chart"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    outside = []

    def only_local(route):
        if urlparse(route.request.url).netloc == urlparse(jupyterlab).netloc:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(f"{jupyterlab}/lab/tree/{CHAPTER}?token={TOKEN}", wait_until="load")
    # JupyterLab's Vega renderer puts each chart, drawn, into a .jp-RenderedVegaCommon5 output.
    page.wait_for_function(
        """n => [...document.querySelectorAll('.jp-RenderedVegaCommon5')].filter(el => {
               const g = el.querySelector('svg, canvas');
               return g && g.getBoundingClientRect().width > 0
                      && g.getBoundingClientRect().height > 0;
           }).length === n""",
        arg=charts,
        timeout=60_000,
    )
    page.close()
    assert outside == [], f"requests that left the machine: {outside}"
